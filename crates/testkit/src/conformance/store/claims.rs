//! Store conformance cases of claims (K-6): the claim guard, claims of failing and due
//! instances, stale tokens, heartbeats, mark running, step completion and its revision.

use super::*;
use crate::time::TestTime;
use kernel_core::transition::{Guard, Patch, Transition};
use serde_json::json;

// --- claim (K-6.2) -----------------------------------------------------------------------

/// `Claimable`: misses when not due, type unregistered or status not claimable; the hit
/// sets lease and token without a revision bump; a second claim within the lease misses.
pub async fn claim_guard(store: &DynStore) {
    seed(store, instance("wf-1")).await;
    seed(store, waiting("wf-w", None, Some(T0.minus(10)))).await;
    assert_eq!(store.claim(&"wf-1".into(), &spec("a", T0.minus(1))).await.unwrap(), None, "not due");
    let mut other_type = spec("a", T0);
    other_type.types = vec!["other".into()];
    assert_eq!(store.claim(&"wf-1".into(), &other_type).await.unwrap(), None, "unregistered type");
    assert_eq!(store.claim(&"wf-w".into(), &spec("a", T0)).await.unwrap(), None, "waiting is not claimable");
    assert_eq!(store.claim(&"wf-missing".into(), &spec("a", T0)).await.unwrap(), None, "missing");
    let prior = store.get(&"wf-1".into()).await.unwrap().unwrap();
    let got = store.claim(&"wf-1".into(), &spec("a", T0)).await.unwrap().expect("due instance is claimed");
    let mut expected = prior.clone();
    Transition::claim(&"a".into(), T0, LEASE_MS).unwrap().apply_to(&mut expected);
    assert_eq!(got, expected, "claim returns the document after the update");
    assert_eq!(got.revision, prior.revision, "claim does not bump revision (K-2.2)");
    assert_eq!(store.get(&"wf-1".into()).await.unwrap(), Some(expected.clone()));
    assert_eq!(store.claim(&"wf-1".into(), &spec("b", T0.plus(1))).await.unwrap(), None, "leased");
    assert_eq!(store.get(&"wf-1".into()).await.unwrap(), Some(expected));
}

/// A failing instance is claimable (the failure finalizer must still run, K-8).
pub async fn claim_failing_instance(store: &DynStore) {
    let mut i = instance("wf-1");
    i.status = WorkflowStatus::Failing;
    seed(store, i).await;
    let got = store.claim(&"wf-1".into(), &spec("a", T0)).await.unwrap().expect("claimed");
    assert_eq!((got.status, got.claim_token.as_deref()), (WorkflowStatus::Failing, Some("a")));
}

/// `claim_any` claims some due instance, never a leased or waiting one.
pub async fn claim_any_takes_a_due_instance(store: &DynStore) {
    assert_eq!(store.claim_any(&spec("a", T0)).await.unwrap(), None, "empty store");
    seed(store, claimed("wf-leased", "x")).await;
    seed(store, waiting("wf-waiting", None, Some(T0.minus(1)))).await;
    assert_eq!(store.claim_any(&spec("a", T0)).await.unwrap(), None, "nothing claimable");
    seed(store, instance("wf-due")).await;
    let got = store.claim_any(&spec("a", T0)).await.unwrap().expect("claimed");
    assert_eq!((got.workflow_id.as_str(), got.claim_token.as_deref()), ("wf-due", Some("a")));
    assert_eq!(store.claim_any(&spec("b", T0)).await.unwrap(), None, "now leased");
}

/// After a re-claim by another worker, a write with the stale token misses (claim lost).
pub async fn stale_token_after_reclaim_is_missed(store: &DynStore) {
    seed(store, instance("wf-1")).await;
    store.claim(&"wf-1".into(), &spec("old", T0)).await.unwrap().expect("first claim");
    // The old worker stalls past its lease; another worker claims.
    store.claim(&"wf-1".into(), &spec("new", T0.plus(LEASE_MS))).await.unwrap().expect("re-claim after expiry");
    check_write(store, "wf-1", &running("old"), &Transition::mark_running(0, T0.plus(LEASE_MS).plus(1)), false).await;
    check_write(
        store,
        "wf-1",
        &Guard::Token { token: "old".into() },
        &Transition::heartbeat(T0.plus(LEASE_MS).plus(1), LEASE_MS).unwrap(),
        false,
    )
    .await;
    check_write(store, "wf-1", &running("new"), &Transition::mark_running(0, T0.plus(LEASE_MS).plus(1)), true).await;
}

// --- token-guarded writes (K-6.4) --------------------------------------------------------

/// Heartbeat under `Token`: wrong token misses; hits on running and failing; no bump.
pub async fn heartbeat_token_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let mut f = claimed("wf-2", "b");
    f.status = WorkflowStatus::Failing;
    seed(store, f).await;
    let hb = Transition::heartbeat(T0.plus(10_000), LEASE_MS).unwrap();
    check_write(store, "wf-1", &Guard::Token { token: "b".into() }, &hb, false).await;
    check_write(store, "wf-1", &Guard::Token { token: "a".into() }, &hb, true).await;
    check_write(store, "wf-2", &Guard::Token { token: "b".into() }, &hb, true).await;
}

/// Mark running under `Running`: wrong token and right token on a failing instance miss.
pub async fn mark_running_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let mut f = claimed("wf-2", "a");
    f.status = WorkflowStatus::Failing;
    seed(store, f).await;
    let t = Transition::mark_running(2, T0.plus(1));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    check_write(store, "wf-2", &running("a"), &t, false).await;
    check_write(store, "wf-1", &running("a"), &t, true).await;
}

/// CompleteStep: status and output in one write; clears resume.
pub async fn complete_step_guard(store: &DynStore) {
    let mut i = claimed("wf-1", "a");
    i.resume = Some(Resume { kind: ResumeKind::Signal, step_index: 1, signal_id: Some("sig-1".into()) });
    seed(store, i).await;
    let t = Transition::complete_step(
        1,
        STEPS[1],
        json!({"summary": "ok", "n": [1, 2.5]}),
        DurationMs::from_millis(250),
        T0.plus(2),
        true,
    );
    check_write(store, "wf-1", &running("b"), &t, false).await;
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    assert_eq!(after.output.len(), 2, "output.<name>, never the whole map");
}

/// The completion order (K-17.6 amendment): a step's `completed_revision` round-trips
/// through create and read (a value past 2^53, so no adapter goes through a float), the
/// write that completes steps stores the stamp it carries on each of them (fused: both
/// with the one revision), a patch can clear it, and replay clears it from the failed
/// steps it resets while a completed step keeps its own.
pub async fn completed_revision_round_trip(store: &DynStore) {
    let mut inst = claimed("wf-1", "a");
    inst.steps[0].status = StepStatus::Completed;
    inst.steps[0].completed_revision = Some((1 << 53) + 1);
    let inst = seed(store, inst).await;
    let read = store.get(&"wf-1".into()).await.expect("get").expect("exists");
    assert_eq!(read.steps[0].completed_revision, Some((1 << 53) + 1));
    let mut t = Transition::complete_step(1, STEPS[1], json!("done"), DurationMs::from_millis(20), T0.plus(16), false)
        .fuse(Transition::complete_step(2, STEPS[2], json!("too"), DurationMs::ZERO, T0.plus(16), false));
    t.stamp_completions(inst.revision + 1);
    check_write(store, "wf-1", &running("b"), &t, false).await;
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    let stamps: Vec<Option<u64>> = after.steps.iter().map(|s| s.completed_revision).collect();
    assert_eq!(stamps, vec![Some((1 << 53) + 1), Some(after.revision), Some(after.revision)]);
    let mut clear = Transition::release_after(T0.plus(17), DurationMs::ZERO).expect("release");
    clear.step_mut(2).completed_revision = Some(Patch::Unset);
    let after = check_write(store, "wf-1", &running("a"), &clear, true).await;
    assert_eq!(after.steps[2].completed_revision, None);

    let mut f = failed_instance("wf-2");
    f.steps[0].status = StepStatus::Completed;
    f.steps[0].completed_revision = Some(2);
    f.steps[1].completed_revision = Some(3);
    seed(store, f).await;
    let replay = Transition::replay(json!({"fencing_token": "f2"}), T0.plus(22));
    let after = check_write(store, "wf-2", &Guard::Failed { unless_round: None }, &replay, true).await;
    assert_eq!((after.steps[0].completed_revision, after.steps[1].completed_revision), (Some(2), None));
}
