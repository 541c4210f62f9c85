//! Lease compare-and-set against the fake API (docs/behaviours.md 27-32).

use super::*;
use crate::controller::fake::{run_object, FakeApi};

fn stored(api: &FakeApi) -> StoredRun {
    StoredRun::from_object(api.run("ns", "r")).unwrap()
}

fn t(millis: i64) -> Time {
    Time::from_millis(1_800_000_000_000 + millis)
}

/// `read` as a replica sees it that has watched it unchanged for `millis` milliseconds (no
/// margin).
fn seen_for(read: Option<&Lease>, millis: u64) -> LeaseView {
    observed(read, millis, 0)
}

/// An absent Lease, as seen.
fn absent() -> LeaseView {
    view(None)
}

#[tokio::test]
async fn acquiring_an_absent_lease_creates_it_owned_by_the_run() {
    let api = FakeApi::with_run(run_object("ns", "r", 3));
    let me = HolderId::with_random_suffix("a");
    let held = acquire(&api, &stored(&api), None, &absent(), &me, t(0))
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
    acquire(&api, &stored(&api), None, &absent(), &old, t(0))
        .await
        .unwrap()
        .unwrap();
    let read = api.lease("ns", "r");
    let a = HolderId::with_random_suffix("a");
    let b = HolderId::with_random_suffix("b");
    let stale = seen_for(read.as_ref(), 5000);
    let won_a = acquire(&api, &stored(&api), read.as_ref(), &stale, &a, t(5000))
        .await
        .unwrap();
    let won_b = acquire(&api, &stored(&api), read.as_ref(), &stale, &b, t(5000))
        .await
        .unwrap();
    assert!(won_a.is_some());
    assert!(won_b.is_none());
    let spec = api.lease("ns", "r").unwrap().spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(a.as_str()));
    assert_eq!(spec.lease_transitions, Some(1));
    // Two creates of an absent lease: one wins too.
    let api = FakeApi::with_run(run_object("ns", "r", 3));
    assert!(acquire(&api, &stored(&api), None, &absent(), &a, t(0))
        .await
        .unwrap()
        .is_some());
    assert!(acquire(&api, &stored(&api), None, &absent(), &b, t(0))
        .await
        .unwrap()
        .is_none());
}

#[tokio::test]
async fn a_renewal_that_finds_another_holder_reports_the_lease_lost() {
    let api = FakeApi::with_run(run_object("ns", "r", 3));
    let a = HolderId::with_random_suffix("a");
    let b = HolderId::with_random_suffix("b");
    let held = acquire(&api, &stored(&api), None, &absent(), &a, t(0))
        .await
        .unwrap()
        .unwrap();
    let renewed = renew(&api, &held, &a, t(1000)).await.unwrap();
    let Renewal::Renewed(held) = renewed else {
        panic!("{renewed:?}")
    };
    assert_eq!(held.renewed_at, t(1000));
    let read = api.lease("ns", "r");
    let stale = seen_for(read.as_ref(), 9000);
    acquire(&api, &stored(&api), read.as_ref(), &stale, &b, t(9000))
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

/// A renewal that meets a 409 on every attempt while the Lease is still its holder's is a
/// renewal that failed (an error: the holder's monotonic clock decides), never a lost lease:
/// CI saw a busy replica report "another holder" naming itself and give a run up mid-call.
#[tokio::test]
async fn conflicts_on_a_lease_still_ours_are_a_failed_renewal_not_a_lost_lease() {
    let api = FakeApi::with_run(run_object("ns", "r", 3));
    let a = HolderId::with_random_suffix("a");
    let held = acquire(&api, &stored(&api), None, &absent(), &a, t(0))
        .await
        .unwrap()
        .unwrap();
    api.state.lock().unwrap().fail_lease_writes = (0..SWAP_ATTEMPTS)
        .map(|_| ApiError::Conflict("touched".into()))
        .collect();
    let renewed = renew(&api, &held, &a, t(1000)).await;
    assert!(
        matches!(renewed, Err(ApiError::Conflict(_))),
        "not lost: {renewed:?}"
    );
    // One conflict fewer: the last attempt, on the fresh version, renews.
    api.state.lock().unwrap().fail_lease_writes = (1..SWAP_ATTEMPTS)
        .map(|_| ApiError::Conflict("touched".into()))
        .collect();
    assert!(matches!(
        renew(&api, &held, &a, t(2000)).await,
        Ok(Renewal::Renewed(_))
    ));
}

#[tokio::test]
async fn releasing_clears_the_holder() {
    let api = FakeApi::with_run(run_object("ns", "r", 3));
    let a = HolderId::with_random_suffix("a");
    let held = acquire(&api, &stored(&api), None, &absent(), &a, t(0))
        .await
        .unwrap()
        .unwrap();
    release(&api, &held, &a).await.unwrap();
    assert_eq!(view(api.lease("ns", "r").as_ref()).holder, None);
}

#[test]
fn the_holders_own_check_keeps_a_skew_margin_before_expiry_on_its_monotonic_clock() {
    let sent_at = Instant::now();
    let held = HeldLease {
        lease: Lease::default(),
        // Its wall-clock renewTime plays no part.
        renewed_at: t(-3_600_000),
        sent_at,
        duration_seconds: 3,
    };
    let margin = Duration::from_millis(500);
    let at = |millis: u64| sent_at + Duration::from_millis(millis);
    assert!(held.may_start_side_effect(at(2000), margin));
    assert!(held.may_start_side_effect(at(2499), margin));
    assert!(!held.may_start_side_effect(at(2500), margin));
    assert!(!held.may_start_side_effect(at(10_000), margin));
    assert_eq!(
        held.remaining(at(1000), margin),
        Duration::from_millis(1500)
    );
}

#[tokio::test]
async fn a_live_lease_held_by_another_holder_is_never_taken() {
    let api = FakeApi::with_run(run_object("ns", "r", 3));
    let a = HolderId::with_random_suffix("a");
    let b = HolderId::with_random_suffix("b");
    acquire(&api, &stored(&api), None, &absent(), &a, t(0))
        .await
        .unwrap()
        .unwrap();
    let read = api.lease("ns", "r");
    // Seen unchanged for 1 s of a 3 s lease with a 500 ms margin: 2.5 s to go, whatever the
    // clocks say.
    let seen = observed(read.as_ref(), 1000, 500);
    assert_eq!(held_by_another(&seen, &b, 30), Some(2500));
    assert!(
        acquire(&api, &stored(&api), read.as_ref(), &seen, &b, t(3_600_000))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        view(api.lease("ns", "r").as_ref()).holder.as_deref(),
        Some(a.as_str())
    );
    // Its own holder may always write it.
    assert_eq!(held_by_another(&seen, &a, 30), None);
    // Once seen unchanged for the duration and the margin, it is taken.
    let stale = observed(read.as_ref(), 3500, 500);
    assert_eq!(held_by_another(&stale, &b, 30), None);
    assert!(
        acquire(&api, &stored(&api), read.as_ref(), &stale, &b, t(0))
            .await
            .unwrap()
            .is_some()
    );
}

/// A run `ns/r` whose absent Lease replica `a` acquired at t(0).
async fn held_by_a() -> (FakeApi, HolderId, HeldLease) {
    let api = FakeApi::with_run(run_object("ns", "r", 3));
    let me = HolderId::with_random_suffix("a");
    let held = acquire(&api, &stored(&api), None, &absent(), &me, t(0))
        .await
        .unwrap()
        .unwrap();
    (api, me, held)
}

#[tokio::test]
async fn an_ended_runs_lease_is_deleted_even_after_a_write_its_cell_did_not_see() {
    let (api, me, held) = held_by_a().await;
    let cell = LeaseCell::new(held.clone());
    // A renewal this replica made that the cell never kept: the cell's resourceVersion is old.
    renew(&api, &held, &me, t(1000)).await.unwrap();
    cell.delete_ended(&api, &me).await;
    assert!(
        api.lease("ns", "r").is_none(),
        "the ended run's Lease is left"
    );
    assert!(api.deleted_lease("ns", "r").is_some());
}

#[tokio::test]
async fn an_ended_runs_lease_another_holder_took_is_left() {
    let (api, me, held) = held_by_a().await;
    let cell = LeaseCell::new(held);
    let read = api.lease("ns", "r");
    let other = HolderId::with_random_suffix("b");
    acquire(
        &api,
        &stored(&api),
        read.as_ref(),
        &seen_for(read.as_ref(), 5000),
        &other,
        t(5000),
    )
    .await
    .unwrap()
    .unwrap();
    cell.delete_ended(&api, &me).await;
    let spec = api
        .lease("ns", "r")
        .expect("the taken Lease is left")
        .spec
        .unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(other.as_str()));
}
