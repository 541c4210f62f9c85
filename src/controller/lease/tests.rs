//! Lease compare-and-set against the fake API (BEHAVIOURS.md 27-32).

use super::*;
use crate::controller::fake::{run_object, FakeApi};

fn stored(api: &FakeApi) -> StoredRun {
    StoredRun::from_object(api.run("ns", "r")).unwrap()
}

fn t(millis: i64) -> Time {
    Time::from_millis(1_800_000_000_000 + millis)
}

#[tokio::test]
async fn acquiring_an_absent_lease_creates_it_owned_by_the_run() {
    let api = FakeApi::with_run(run_object("ns", "r", 3));
    let me = HolderId::with_random_suffix("a");
    let held = acquire(&api, &stored(&api), None, &me, t(0))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(held.duration_seconds, 3);
    let lease = api.lease("ns", "r").unwrap();
    let spec = lease.spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(me.as_str()));
    assert_eq!(spec.lease_duration_seconds, Some(3));
    let owner = &lease.metadata.owner_references.unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("AgentRun", "uid-r")
    );
    assert_eq!(
        view(api.lease("ns", "r").as_ref()).holder.as_deref(),
        Some(me.as_str())
    );
}

#[tokio::test]
async fn of_two_replicas_taking_over_one_lease_exactly_one_wins() {
    let api = FakeApi::with_run(run_object("ns", "r", 3));
    let old = HolderId::with_random_suffix("old");
    acquire(&api, &stored(&api), None, &old, t(0))
        .await
        .unwrap()
        .unwrap();
    let read = api.lease("ns", "r");
    let a = HolderId::with_random_suffix("a");
    let b = HolderId::with_random_suffix("b");
    let won_a = acquire(&api, &stored(&api), read.as_ref(), &a, t(5000))
        .await
        .unwrap();
    let won_b = acquire(&api, &stored(&api), read.as_ref(), &b, t(5000))
        .await
        .unwrap();
    assert!(won_a.is_some());
    assert!(won_b.is_none());
    let spec = api.lease("ns", "r").unwrap().spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(a.as_str()));
    assert_eq!(spec.lease_transitions, Some(1));
    // Two creates of an absent lease: one wins too.
    let api = FakeApi::with_run(run_object("ns", "r", 3));
    assert!(acquire(&api, &stored(&api), None, &a, t(0))
        .await
        .unwrap()
        .is_some());
    assert!(acquire(&api, &stored(&api), None, &b, t(0))
        .await
        .unwrap()
        .is_none());
}

#[tokio::test]
async fn a_renewal_that_finds_another_holder_reports_the_lease_lost() {
    let api = FakeApi::with_run(run_object("ns", "r", 3));
    let a = HolderId::with_random_suffix("a");
    let b = HolderId::with_random_suffix("b");
    let held = acquire(&api, &stored(&api), None, &a, t(0))
        .await
        .unwrap()
        .unwrap();
    let renewed = renew(&api, &held, &a, t(1000)).await.unwrap();
    let Renewal::Renewed(held) = renewed else {
        panic!("{renewed:?}")
    };
    assert_eq!(held.renewed_at, t(1000));
    let read = api.lease("ns", "r");
    acquire(&api, &stored(&api), read.as_ref(), &b, t(9000))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        renew(&api, &held, &a, t(2000)).await.unwrap(),
        Renewal::Lost {
            holder: Some(b.as_str().to_string())
        }
    );
    // Releasing a lease someone else holds changes nothing.
    release(&api, &held, &a).await.unwrap();
    assert_eq!(
        view(api.lease("ns", "r").as_ref()).holder.as_deref(),
        Some(b.as_str())
    );
}

#[tokio::test]
async fn releasing_clears_the_holder() {
    let api = FakeApi::with_run(run_object("ns", "r", 3));
    let a = HolderId::with_random_suffix("a");
    let held = acquire(&api, &stored(&api), None, &a, t(0))
        .await
        .unwrap()
        .unwrap();
    release(&api, &held, &a).await.unwrap();
    assert_eq!(view(api.lease("ns", "r").as_ref()).holder, None);
}

#[test]
fn the_wall_clock_check_keeps_a_skew_margin_before_expiry() {
    let held = HeldLease {
        lease: Lease::default(),
        renewed_at: t(0),
        duration_seconds: 3,
    };
    let margin = Duration::from_millis(500);
    assert!(held.may_start_side_effect(t(2000), margin));
    assert!(held.may_start_side_effect(t(2499), margin));
    assert!(!held.may_start_side_effect(t(2500), margin));
    assert!(!held.may_start_side_effect(t(10_000), margin));
}

#[tokio::test]
async fn a_live_lease_held_by_another_holder_is_never_taken() {
    let api = FakeApi::with_run(run_object("ns", "r", 3));
    let a = HolderId::with_random_suffix("a");
    let b = HolderId::with_random_suffix("b");
    acquire(&api, &stored(&api), None, &a, t(0))
        .await
        .unwrap()
        .unwrap();
    let read = api.lease("ns", "r");
    assert_eq!(held_by_another(read.as_ref(), &b, t(1000)), Some(t(3000)));
    assert!(acquire(&api, &stored(&api), read.as_ref(), &b, t(1000))
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        view(api.lease("ns", "r").as_ref()).holder.as_deref(),
        Some(a.as_str())
    );
    // Once expired by the taker's clock, it is taken.
    assert!(acquire(&api, &stored(&api), read.as_ref(), &b, t(3001))
        .await
        .unwrap()
        .is_some());
}
