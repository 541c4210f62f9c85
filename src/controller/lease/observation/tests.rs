//! Tests of [`super`].
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::*;

fn key() -> RunKey {
    RunKey {
        namespace: "ns".into(),
        name: "r".into(),
    }
}

fn lease(holder: &str, renew_millis: i64, version: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            resource_version: Some(version.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(
                jiff::Timestamp::from_millisecond(renew_millis).unwrap(),
            )),
            lease_duration_seconds: Some(2),
            ..LeaseSpec::default()
        }),
    }
}

#[test]
fn a_lease_of_agentrts_shape_is_kept_compactly_and_handed_out_exactly_as_seen() {
    let seen = LeaseObservations::default();
    let t0 = Instant::now();
    let mut ours = lease("a", 0, "1");
    ours.metadata.namespace = Some("ns".into());
    ours.metadata.name = Some("r".into());
    ours.metadata.uid = Some("lease-uid".into());
    ours.metadata.creation_timestamp = Some(Time(jiff::Timestamp::from_second(7).unwrap()));
    ours.metadata.labels = Some(crate::controller::lease::managed_by_labels());
    ours.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "agentrt.dev/v1alpha1".into(),
        kind: "AgentRun".into(),
        name: "r".into(),
        uid: "run-uid".into(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    if let Some(spec) = ours.spec.as_mut() {
        spec.acquire_time = spec.renew_time.clone();
        spec.lease_transitions = Some(3);
    }
    seen.watched(None, &watcher::Event::Init, t0);
    seen.watched(None, &watcher::Event::InitApply(ours.clone()), t0);
    seen.watched(None, &watcher::Event::InitDone, t0);
    assert!(matches!(seen.lock().seen[&key()].kept, Kept::Compact(_)));
    assert_eq!(
        *seen.cached(&key()).expect("listed").expect("a lease"),
        ours
    );
    // A Lease read live comes with managedFields: kept (and handed out) without them.
    let mut read_live = ours.clone();
    read_live.metadata.resource_version = Some("1a".into());
    let mut bare = read_live.clone();
    read_live.metadata.managed_fields = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry {
            manager: Some("agentrt".into()),
            ..Default::default()
        },
    ]);
    seen.observe(&key(), Some(&read_live), t0);
    assert!(matches!(seen.lock().seen[&key()].kept, Kept::Compact(_)));
    bare.metadata.managed_fields = None;
    assert_eq!(
        *seen.cached(&key()).expect("listed").expect("a lease"),
        bare
    );
    // Any other Lease (other labels or none, another owner, a field agentrt does not
    // write) is kept whole and handed out exactly as it was seen.
    let mut relabelled = ours.clone();
    relabelled.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
    let mut unlabelled = ours.clone();
    unlabelled.metadata.labels = None;
    let mut adopted = ours.clone();
    if let Some(owners) = adopted.metadata.owner_references.as_mut() {
        owners[0].name = "another".into();
    }
    let mut annotated = ours.clone();
    annotated.metadata.annotations = Some([("note".to_string(), "x".to_string())].into());
    let mut preferred = ours.clone();
    if let Some(spec) = preferred.spec.as_mut() {
        spec.preferred_holder = Some("b".into());
    }
    for (version, theirs) in [
        ("2", relabelled),
        ("3", unlabelled),
        ("4", adopted),
        ("5", annotated),
        ("6", preferred),
    ] {
        let mut theirs = theirs;
        theirs.metadata.resource_version = Some(version.into());
        seen.observe(&key(), Some(&theirs), t0);
        assert!(
            matches!(seen.lock().seen[&key()].kept, Kept::Whole(_)),
            "{theirs:?}"
        );
        assert_eq!(
            *seen.cached(&key()).expect("listed").expect("a lease"),
            theirs
        );
    }
}

#[test]
fn the_lease_watch_wakes_a_run_only_for_a_holder_new_to_this_replica() {
    let seen = LeaseObservations::default();
    let t0 = Instant::now();
    let named = |mut lease: Lease| {
        lease.metadata.namespace = Some("ns".into());
        lease.metadata.name = Some("r".into());
        lease
    };
    let apply = |lease: Lease| seen.watched(None, &watcher::Event::Apply(named(lease)), t0);
    assert!(apply(lease("a", 0, "1")), "a new Lease");
    assert!(!apply(lease("a", 1, "2")), "a renewal");
    assert!(apply(lease("b", 2, "3")), "a takeover");
    assert!(apply(lease("", 2, "4")), "a release");
    // A holder this replica already read live does not wake it again.
    seen.observe(&key(), Some(&named(lease("c", 3, "5"))), t0);
    assert!(!apply(lease("c", 3, "5")));
    assert!(!apply(lease("c", 4, "6")));
    // A relist of what is known wakes nothing; a deletion wakes nothing and forgets.
    seen.watched(None, &watcher::Event::Init, t0);
    assert!(!seen.watched(
        None,
        &watcher::Event::InitApply(named(lease("c", 4, "6"))),
        t0
    ));
    seen.watched(None, &watcher::Event::InitDone, t0);
    assert!(!seen.watched(None, &watcher::Event::Delete(named(lease("c", 4, "6"))), t0));
    assert!(
        apply(lease("c", 5, "7")),
        "a Lease made again after a deletion"
    );
}

#[test]
fn a_lease_first_seen_has_been_seen_unchanged_for_nothing() {
    let seen = LeaseObservations::default();
    let t0 = Instant::now();
    // Its renewTime is long past; that says nothing about how long it has been unchanged.
    assert_eq!(seen.observe(&key(), Some(&lease("a", 0, "1")), t0), 0);
    assert_eq!(
        seen.observe(
            &key(),
            Some(&lease("a", 0, "1")),
            t0 + Duration::from_millis(1500)
        ),
        1500
    );
}

#[test]
fn a_renewal_or_a_new_holder_starts_the_observation_again() {
    let seen = LeaseObservations::default();
    let t0 = Instant::now();
    let at = |millis: u64| t0 + Duration::from_millis(millis);
    seen.observe(&key(), Some(&lease("a", 0, "1")), at(0));
    assert_eq!(
        seen.observe(&key(), Some(&lease("a", 700, "2")), at(700)),
        0
    );
    assert_eq!(
        seen.observe(&key(), Some(&lease("a", 700, "2")), at(1000)),
        300
    );
    assert_eq!(
        seen.observe(&key(), Some(&lease("b", 700, "3")), at(1100)),
        0
    );
    // A write that changed neither holder nor renewTime is still a new version.
    assert_eq!(
        seen.observe(&key(), Some(&lease("b", 700, "4")), at(1200)),
        0
    );
    assert_eq!(
        seen.observe(&key(), Some(&lease("b", 700, "4")), at(3200)),
        2000
    );
}

#[test]
fn an_absence_read_before_the_watch_delivered_the_lease_does_not_erase_it() {
    let seen = LeaseObservations::default();
    let t0 = Instant::now();
    let at = |millis: u64| t0 + Duration::from_millis(millis);
    let listed = |seen: &LeaseObservations| {
        seen.watched(Some("ns"), &watcher::Event::Init, at(0));
        seen.watched(Some("ns"), &watcher::Event::InitDone, at(0));
    };
    listed(&seen);
    // A reconcile reads the cache: no Lease. Another replica's create lands
    // and the watch delivers it at 20 ms; the reconcile records its absence at 30 ms.
    assert!(seen.cached(&key()).expect("listed").is_none());
    let mut theirs = lease("b", 0, "7");
    theirs.metadata.namespace = Some("ns".into());
    theirs.metadata.name = Some("r".into());
    seen.watched(Some("ns"), &watcher::Event::Apply(theirs), at(20));
    assert_eq!(
        seen.observe_read(&key(), None, at(30), LeaseRead::Cached),
        0
    );
    assert_eq!(
        seen.cached(&key())
            .expect("listed")
            .expect("the winner's Lease is kept")
            .metadata
            .resource_version
            .as_deref(),
        Some("7")
    );
    // A live read that began before the watch delivered it does not erase it either.
    assert_eq!(
        seen.observe_read(&key(), None, at(30), LeaseRead::Live(at(15))),
        0
    );
    assert!(seen.cached(&key()).expect("listed").is_some());
    // A Lease seen before a live read that finds it absent was deleted: forgotten.
    assert_eq!(
        seen.observe_read(&key(), None, at(50), LeaseRead::Live(at(40))),
        0
    );
    assert!(seen.cached(&key()).expect("listed").is_none());
}

#[test]
fn the_watch_feeds_the_same_observation_as_a_read() {
    let seen = LeaseObservations::default();
    let t0 = Instant::now();
    let mut watched = lease("a", 0, "1");
    watched.metadata.namespace = Some("ns".into());
    watched.metadata.name = Some("r".into());
    seen.watched(None, &watcher::Event::InitApply(watched.clone()), t0);
    assert_eq!(
        seen.observe(
            &key(),
            Some(&lease("a", 0, "1")),
            t0 + Duration::from_millis(800)
        ),
        800
    );
    seen.watched(None, &watcher::Event::Delete(watched), t0);
    assert!(seen.is_empty());
}

#[test]
fn a_listed_watch_answers_reads_and_a_relist_forgets_what_it_did_not_list() {
    let seen = LeaseObservations::default();
    let t0 = Instant::now();
    let named = |name: &str| {
        let mut lease = lease("a", 0, "1");
        lease.metadata.namespace = Some("ns".into());
        lease.metadata.name = Some(name.into());
        lease
    };
    let other = RunKey {
        namespace: "ns".into(),
        name: "gone".into(),
    };
    // Not listed yet: read live.
    assert!(seen.cached(&key()).is_none());
    seen.watched(Some("ns"), &watcher::Event::Init, t0);
    seen.watched(Some("ns"), &watcher::Event::InitApply(named("r")), t0);
    seen.watched(Some("ns"), &watcher::Event::InitApply(named("gone")), t0);
    seen.watched(Some("ns"), &watcher::Event::InitDone, t0);
    let cached = seen.cached(&key()).expect("listed").expect("a lease");
    assert_eq!(cached.metadata.resource_version.as_deref(), Some("1"));
    assert!(
        seen.cached(&RunKey {
            namespace: "elsewhere".into(),
            name: "r".into()
        })
        .is_none(),
        "another namespace's watch has not listed"
    );
    // A relist reads live until done, then forgets the Lease it did not list again.
    seen.watched(Some("ns"), &watcher::Event::Init, t0);
    assert!(seen.cached(&key()).is_none());
    seen.watched(Some("ns"), &watcher::Event::InitApply(named("r")), t0);
    seen.watched(Some("ns"), &watcher::Event::InitDone, t0);
    assert!(seen.cached(&key()).expect("listed").is_some());
    assert_eq!(seen.cached(&other), Some(None), "gone while unwatched");
}

#[test]
fn an_absent_lease_is_forgotten() {
    let seen = LeaseObservations::default();
    let t0 = Instant::now();
    seen.observe(&key(), Some(&lease("a", 0, "1")), t0);
    assert_eq!(seen.len(), 1);
    assert_eq!(seen.observe(&key(), None, t0), 0);
    assert!(seen.is_empty());
    seen.observe(&key(), Some(&lease("a", 0, "1")), t0);
    seen.forget(&key());
    assert!(seen.is_empty());
    assert_eq!(
        seen.observe(
            &key(),
            Some(&lease("a", 0, "1")),
            t0 + Duration::from_secs(9)
        ),
        0,
        "seen again after being forgotten: first seen now"
    );
}

#[test]
fn a_presence_lease_makes_its_holder_a_peer_until_it_is_deleted_or_goes_stale() {
    use crate::controller::identity::HolderId;
    use crate::controller::lease::presence;
    let seen = LeaseObservations::default();
    let holder = HolderId::with_random_suffix("b");
    // A leftover renewed long ago by this replica's wall clock makes no peer.
    let mut leftover = presence::presence_lease(
        &HolderId::with_random_suffix("gone"),
        "ns",
        MicroTime(jiff::Timestamp::from_millisecond(0).unwrap()),
    );
    leftover.metadata.name = Some("agentrt-replica-gone".into());
    assert!(!seen.watched(
        Some("ns"),
        &watcher::Event::InitApply(leftover),
        Instant::now()
    ));
    assert!(seen
        .holders_seen(Instant::now(), Duration::from_secs(30))
        .is_empty());
    let mut announced = presence::presence_lease(&holder, "ns", MicroTime(jiff::Timestamp::now()));
    announced.metadata.resource_version = Some("7".into());
    let t0 = Instant::now();
    let within = Duration::from_secs(30);
    assert!(seen.holders_seen(t0, within).is_empty());
    assert!(!seen.watched(Some("ns"), &watcher::Event::Apply(announced.clone()), t0));
    assert_eq!(
        seen.holders_seen(t0, within),
        vec![holder.as_str().to_string()]
    );
    // Seen unchanged: stale only after the given time.
    assert!(seen
        .stale_presence(t0 + Duration::from_secs(5), Duration::from_secs(10))
        .is_empty());
    let stale = seen.stale_presence(t0 + Duration::from_secs(10), Duration::from_secs(10));
    assert_eq!(stale.len(), 2, "the leftover and this one");
    assert!(stale
        .iter()
        .any(|lease| lease.metadata.resource_version.as_deref() == Some("7")));
    // A run's Lease is never reported as a stale presence.
    seen.observe(&key(), Some(&lease("a", 0, "1")), t0);
    assert_eq!(
        seen.stale_presence(t0 + Duration::from_secs(60), Duration::from_secs(10))
            .len(),
        2
    );
    // Withdrawn: no peer at once.
    seen.watched(Some("ns"), &watcher::Event::Delete(announced), t0);
    assert_eq!(seen.holders_seen(t0, within), vec!["a".to_string()]);
}
