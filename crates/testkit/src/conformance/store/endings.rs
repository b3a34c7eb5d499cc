//! Store conformance cases of how steps and workflows end (K-7, K-8, K-10): skips, failures,
//! completion, cancellation, finalizers, releases and push-backs, fused writes, replays and
//! priority raises.

use super::*;
use crate::time::TestTime;
use kernel_core::transition::{Guard, Transition};
use kernel_core::WorkflowId;
use serde_json::json;

/// `on_failed = skip`.
pub async fn skip_step_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::skip_step(1, err(ErrorClass::Permanent), DurationMs::from_millis(7), T0.plus(7));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    check_write(store, "wf-1", &running("a"), &t, true).await;
}

/// Step failed for good: the workflow goes failing in the same write.
pub async fn step_failed_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::step_failed(1, err(ErrorClass::Permanent), DurationMs::from_millis(7), T0.plus(8));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    assert_eq!((after.status, after.claim_token.as_deref()), (WorkflowStatus::Failing, Some("a")));
}

/// `running → failing` under `Running`.
pub async fn failing_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::failing(T0.plus(9));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    check_write(store, "wf-1", &running("a"), &t, true).await;
}

/// `failing → failed` under `Failing`: a running instance with the right token misses.
pub async fn failed_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let mut f = claimed("wf-2", "a");
    f.status = WorkflowStatus::Failing;
    seed(store, f).await;
    let t = Transition::failed(T0.plus(10));
    check_write(store, "wf-1", &failing("a"), &t, false).await;
    check_write(store, "wf-2", &failing("b"), &t, false).await;
    let after = check_write(store, "wf-2", &failing("a"), &t, true).await;
    assert_eq!(
        (after.status, after.claim_token.clone(), after.finished_at),
        (WorkflowStatus::Failed, None, Some(T0.plus(10)))
    );
}

/// `running → completed` under `Running`.
pub async fn completed_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::completed(T0.plus(11));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    check_write(store, "wf-1", &running("a"), &t, true).await;
}

/// The activity reported cancellation: step skipped, workflow canceled, claim cleared.
pub async fn activity_canceled_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::activity_canceled(1, err(ErrorClass::Canceled), DurationMs::from_millis(3), T0.plus(12));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    check_write(store, "wf-1", &running("a"), &t, true).await;
}

/// A failure finalizer error releases the failing claim with a delay.
pub async fn finalizer_release_guard(store: &DynStore) {
    let mut f = claimed("wf-1", "a");
    f.status = WorkflowStatus::Failing;
    seed(store, f).await;
    let t = Transition::finalizer_release(T0.plus(13), DurationMs::from_millis(5_000)).unwrap();
    check_write(store, "wf-1", &failing("b"), &t, false).await;
    check_write(store, "wf-1", &failing("a"), &t, true).await;
}

/// A failed PrepareContext (K-2.3) under `Running`: the failure count is stored, read back
/// after every further write, carried by a `failing` write, and reset by replay.
pub async fn prepare_failures_round_trip(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::prepare_release(2, T0.plus(13), DurationMs::from_millis(5_000)).unwrap();
    check_write(store, "wf-1", &running("b"), &t, false).await;
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    assert_eq!(after.prepare_failures, 2);
    let claim = ClaimSpec {
        now: T0.plus(5_013),
        lease_ms: LEASE_MS,
        token: "c".to_string().into(),
        types: vec![TYPE.to_string()],
    };
    let claimed_again = store.claim(&"wf-1".into(), &claim).await.unwrap().expect("claimable after the delay");
    assert_eq!(claimed_again.prepare_failures, 2, "the count survives claims");
    let mut t = Transition::failing(T0.plus(5_014));
    t.prepare_failures = Some(3);
    let after = check_write(store, "wf-1", &running("c"), &t, true).await;
    assert_eq!((after.status, after.prepare_failures), (WorkflowStatus::Failing, 3));
    let t = Transition::failed(T0.plus(5_015));
    check_write(store, "wf-1", &failing("c"), &t, true).await;
    let t = Transition::replay(json!({"fencing_token": "f2"}), T0.plus(5_016));
    let after = check_write(store, "wf-1", &Guard::replay(&json!({"fencing_token": "f2"})), &t, true).await;
    assert_eq!(after.prepare_failures, 0, "replay resets the count");
}

/// A refused plain write's hand-back (K-6.4) under `Running`: the run's count is stored,
/// survives claims and further writes, and replay resets it.
pub async fn refused_writes_round_trip(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::refused_release(2, T0.plus(13), DurationMs::from_millis(5_000)).unwrap();
    check_write(store, "wf-1", &running("b"), &t, false).await;
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    assert_eq!((after.refused_writes, after.claimable_time), (2, Some(T0.plus(5_013))));
    let claim = ClaimSpec {
        now: T0.plus(5_013),
        lease_ms: LEASE_MS,
        token: "c".to_string().into(),
        types: vec![TYPE.to_string()],
    };
    let claimed_again = store.claim(&"wf-1".into(), &claim).await.unwrap().expect("claimable after the delay");
    assert_eq!(claimed_again.refused_writes, 2, "the count survives claims");
    let after = check_write(store, "wf-1", &running("c"), &Transition::failing(T0.plus(5_014)), true).await;
    assert_eq!(after.refused_writes, 2, "a write that does not set it leaves it");
    check_write(store, "wf-1", &failing("c"), &Transition::failed(T0.plus(5_015)), true).await;
    let t = Transition::replay(json!({"fencing_token": "f2"}), T0.plus(5_016));
    let after = check_write(store, "wf-1", &Guard::replay(&json!({"fencing_token": "f2"})), &t, true).await;
    assert_eq!(after.refused_writes, 0, "replay resets the count");
}

/// Release without progress (shutdown between waves).
pub async fn release_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::release(T0.plus(14));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    check_write(store, "wf-1", &running("a"), &t, true).await;
}

/// Fingerprint push-back under `Token` (K-4.3): no step touched, both fingerprints kept.
pub async fn fingerprint_push_back_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::fingerprint_push_back("fp-1", "fp-2", T0.plus(15), DurationMs::from_millis(3_600_000)).unwrap();
    check_write(store, "wf-1", &Guard::Token { token: "b".into() }, &t, false).await;
    let after = check_write(store, "wf-1", &Guard::Token { token: "a".into() }, &t, true).await;
    assert_eq!(after.steps, claimed("wf-1", "a").steps);
}

/// A fused write (K-7.1): complete step 1 + mark step 2 running, revision bumped once.
pub async fn fused_write_bumps_revision_once(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::complete_step(1, STEPS[1], json!("done"), DurationMs::from_millis(20), T0.plus(16), false)
        .fuse(Transition::mark_running(2, T0.plus(16)));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    assert_eq!(after.revision, claimed("wf-1", "a").revision + 1);
}

/// Replay under `Failed` (K-5): failed steps reset to pending, completed and skipped kept,
/// input replaced, `retry_count + 1`; a running instance misses.
pub async fn replay_guard(store: &DynStore) {
    seed(store, failed_instance("wf-1")).await;
    seed(store, claimed("wf-2", "a")).await;
    let t = Transition::replay(json!({"fencing_token": "f2"}), T0.plus(22));
    check_write(store, "wf-2", &Guard::Failed { unless_round: None }, &t, false).await;
    let after = check_write(store, "wf-1", &Guard::Failed { unless_round: None }, &t, true).await;
    assert_eq!(after.steps[1], Step::pending(STEPS[1]), "failed step reset");
    assert_eq!(after.steps[0], claimed("wf-1", "a").steps[0], "completed step kept");
    assert_eq!(after.steps[2].status, StepStatus::Skipped, "skipped step kept");
    assert_eq!((after.retry_count, after.status), (2, WorkflowStatus::Running));
    check_write(store, "wf-1", &Guard::Failed { unless_round: None }, &t, false).await;
}

/// Replay guard with a round (K-5): the failed instance of round f1 is never replayed by
/// a request of round f1; a request of another round replays it, and an instance without a
/// string round is replayed by any round.
pub async fn replay_guard_spares_the_failed_round(store: &DynStore) {
    seed(store, failed_instance("wf-1")).await;
    let mut no_round = failed_instance("wf-2");
    no_round.input = json!({"fencing_token": 7, "tenant": "t-1"});
    seed(store, no_round).await;
    let same = Guard::replay(&json!({"fencing_token": "f1"}));
    assert_eq!(same, Guard::Failed { unless_round: Some("f1".into()) });
    let t = Transition::replay(json!({"fencing_token": "f1", "again": true}), T0.plus(22));
    check_write(store, "wf-1", &same, &t, false).await;
    check_write(store, "wf-2", &same, &t, true).await;
    let next = Transition::replay(json!({"fencing_token": "f2"}), T0.plus(23));
    let after = check_write(store, "wf-1", &Guard::replay(&json!({"fencing_token": "f2"})), &next, true).await;
    assert_eq!((after.retry_count, after.input["fencing_token"].clone()), (2, json!("f2")));
}

/// Concurrent replays of one failed instance: exactly one applies.
pub async fn replay_race_one_winner(store: &DynStore) {
    seed(store, failed_instance("wf-1")).await;
    let t = Transition::replay(json!({"fencing_token": "f2"}), T0.plus(22));
    let id = WorkflowId::from("wf-1");
    let outcomes =
        futures::future::join_all((0..6).map(|_| store.apply(&id, &Guard::Failed { unless_round: None }, &t))).await;
    let applied = outcomes.into_iter().map(|o| o.expect("apply")).filter(WriteOutcome::applied).count();
    assert_eq!(applied, 1);
    assert_eq!(store.get(&"wf-1".into()).await.unwrap().unwrap().retry_count, 2);
}

/// Priority raise under `PriorityBelow` (promote-only): equal, lower and terminal miss.
pub async fn priority_raise_guard(store: &DynStore) {
    seed(store, instance("wf-1")).await;
    let mut done = instance("wf-2");
    done.status = WorkflowStatus::Canceled;
    seed(store, done).await;
    check_write(
        store,
        "wf-1",
        &Guard::PriorityBelow(Priority::P2),
        &Transition::priority_raise(Priority::P2, T0),
        false,
    )
    .await;
    check_write(
        store,
        "wf-1",
        &Guard::PriorityBelow(Priority::P3),
        &Transition::priority_raise(Priority::P3, T0),
        false,
    )
    .await;
    check_write(
        store,
        "wf-2",
        &Guard::PriorityBelow(Priority::P0),
        &Transition::priority_raise(Priority::P0, T0),
        false,
    )
    .await;
    let after = check_write(
        store,
        "wf-1",
        &Guard::PriorityBelow(Priority::P1),
        &Transition::priority_raise(Priority::P1, T0),
        true,
    )
    .await;
    assert_eq!(after.business_priority, Priority::P1);
}
