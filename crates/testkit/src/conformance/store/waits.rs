//! Store conformance cases of waits (K-9): suspends on a timer or a signal, yields, parked
//! siblings, retry and permit releases, and the activations that end a wait.

use super::*;
use crate::time::TestTime;
use kernel_core::transition::{Guard, Transition};
use serde_json::json;

/// SuspendClaim on a timer: waiting, attempt rolled back, claimable at the due time.
pub async fn suspend_timer_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let wait = Wait::Timer { step_index: 1, due: Some(T0.plus(60_000)) };
    let t = Transition::suspend(1, wait, Some(json!({"cursor": 8})), DurationMs::from_millis(40), T0.plus(3));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    assert_eq!(
        (after.status, after.claimable_time, after.steps[1].attempt),
        (WorkflowStatus::Waiting, Some(T0.plus(60_000)), 0)
    );
}

/// SuspendClaim on a signal without poll time: `claimable_time` is unset.
pub async fn suspend_signal_guard(store: &DynStore) {
    let mut i = claimed("wf-1", "a");
    i.resume = Some(Resume { kind: ResumeKind::Timer, step_index: 1, signal_id: None });
    seed(store, i).await;
    let wait = Wait::Signal {
        signal_type: "approved".into(),
        wait_key: "doc:42".into(),
        generation: 3,
        step_index: 1,
        poll_time: None,
    };
    let t = Transition::suspend(1, wait, None, DurationMs::from_millis(0), T0.plus(3));
    let mut f = claimed("wf-2", "a");
    f.status = WorkflowStatus::Failing;
    seed(store, f).await;
    check_write(store, "wf-2", &running("a"), &t, false).await;
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    assert_eq!((after.claimable_time, after.resume.clone(), after.steps[1].checkpoint.clone()), (None, None, None));
}

/// Yield: pending with checkpoint, attempt rolled back, claimable now, claim cleared.
pub async fn yield_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::yield_step(1, Some(json!({"page": 2})), DurationMs::from_millis(10), T0.plus(4));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    check_write(store, "wf-1", &running("a"), &t, true).await;
}

/// A JSON `null` checkpoint is no checkpoint: a durable store cannot tell a `null` field
/// from an absent one, so every store reads both back as `None` (the transition
/// constructors clear the checkpoint for either).
pub async fn null_checkpoint_reads_back_as_none(store: &DynStore) {
    let mut inst = claimed("wf-1", "a");
    inst.steps[1].checkpoint = Some(json!({"page": 2}));
    seed(store, inst).await;
    let t = Transition::park_sibling(1, Some(json!(null)), DurationMs::from_millis(10), T0.plus(5));
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    assert_eq!(after.steps[1].checkpoint, None, "a null checkpoint clears the step's checkpoint");
}

/// A parked sibling (K-4.5): pending with checkpoint, attempt rolled back, claim kept.
pub async fn park_sibling_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::park_sibling(1, None, DurationMs::from_millis(10), T0.plus(4));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    check_write(store, "wf-1", &running("a"), &t, true).await;
}

/// Retry release: step pending with its error, checkpoint cleared, claim released later.
pub async fn retry_release_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::step_retry(1, err(ErrorClass::Transient), DurationMs::from_millis(33), T0.plus(5))
        .release_until(T0.plus(2_000));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    check_write(store, "wf-1", &running("a"), &t, true).await;
}

/// Permit deferral: traffic statistics grow, attempt unchanged, claim released later.
pub async fn permit_deferral_guard(store: &DynStore) {
    let mut i = claimed("wf-1", "a");
    i.steps[1].traffic_wait_ms = DurationMs::from_millis(100);
    i.steps[1].traffic_waits = 2;
    seed(store, i).await;
    let t = Transition::permit_deferral(1, DurationMs::from_millis(500), T0.plus(6)).release_until(T0.plus(500));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    assert_eq!(
        (after.steps[1].traffic_wait_ms, after.steps[1].traffic_waits, after.steps[1].attempt),
        (DurationMs::from_millis(600), 3, 1)
    );
}

// --- no-token writes ---------------------------------------------------------------------

/// Timer activation under `DueWait`: not due and wrong step miss; the hit keeps
/// `claimable_time` and sets `resume.kind = timer`.
pub async fn timer_activation_guard(store: &DynStore) {
    seed(store, waiting("wf-1", None, Some(T0.plus(1_000)))).await;
    let t = Transition::timer_activation(1, ResumeKind::Timer, T0.plus(1_000));
    check_write(store, "wf-1", &Guard::DueWait { now: T0.plus(999), step_index: 1 }, &t, false).await;
    check_write(store, "wf-1", &Guard::DueWait { now: T0.plus(1_000), step_index: 2 }, &t, false).await;
    let after = check_write(store, "wf-1", &Guard::DueWait { now: T0.plus(1_000), step_index: 1 }, &t, true).await;
    assert_eq!((after.status, after.claimable_time), (WorkflowStatus::Running, Some(T0.plus(1_000))));
    check_write(store, "wf-1", &Guard::DueWait { now: T0.plus(1_000), step_index: 1 }, &t, false).await;
}

/// A signal wait's poll fallback (K-9.5) activates with `resume.kind = poll`.
pub async fn poll_activation_guard(store: &DynStore) {
    seed(store, waiting("wf-1", Some(1), Some(T0.plus(500)))).await;
    let t = Transition::timer_activation(1, ResumeKind::Poll, T0.plus(600));
    check_write(store, "wf-1", &Guard::DueWait { now: T0.plus(499), step_index: 1 }, &t, false).await;
    check_write(store, "wf-1", &Guard::DueWait { now: T0.plus(600), step_index: 1 }, &t, true).await;
}

/// Signal activation under `SignalWait`: stale generation, other key, other type and a
/// timer wait miss (K-9.6); the hit is claimable now with `resume = signal`.
pub async fn signal_activation_guard(store: &DynStore) {
    seed(store, waiting("wf-1", Some(2), None)).await;
    seed(store, waiting("wf-t", None, Some(T0))).await;
    let id = WaitIdentity { signal_type: "approved".into(), wait_key: "doc:42".into(), generation: 2, step_index: 1 };
    let t = Transition::signal_activation(1, "sig-1", T0.plus(20));
    let with = |f: &dyn Fn(&mut WaitIdentity)| {
        let mut x = id.clone();
        f(&mut x);
        Guard::SignalWait(x)
    };
    check_write(store, "wf-1", &with(&|x| x.generation = 1), &t, false).await;
    check_write(store, "wf-1", &with(&|x| x.wait_key = "doc:43".into()), &t, false).await;
    check_write(store, "wf-1", &with(&|x| x.signal_type = "rejected".into()), &t, false).await;
    check_write(store, "wf-1", &with(&|x| x.step_index = 0), &t, false).await;
    check_write(
        store,
        "wf-t",
        &Guard::SignalWait(WaitIdentity {
            signal_type: "approved".into(),
            wait_key: "doc:42".into(),
            generation: 0,
            step_index: 1,
        }),
        &t,
        false,
    )
    .await;
    let after = check_write(store, "wf-1", &Guard::SignalWait(id.clone()), &t, true).await;
    assert_eq!(
        (after.status, after.claimable_time, after.wait.clone()),
        (WorkflowStatus::Running, Some(T0.plus(20)), None)
    );
    check_write(store, "wf-1", &Guard::SignalWait(id), &t, false).await;
}

/// Cancel / supersede under `Active`: hits waiting (and running), misses terminal.
pub async fn supersede_guard(store: &DynStore) {
    seed(store, waiting("wf-1", Some(1), Some(T0.plus(5)))).await;
    let mut done = instance("wf-2");
    done.status = WorkflowStatus::Completed;
    done.claimable_time = None;
    seed(store, done).await;
    let t = Transition::supersede(T0.plus(21));
    check_write(store, "wf-2", &Guard::Active, &t, false).await;
    check_write(store, "wf-1", &Guard::Active, &t, true).await;
    check_write(store, "wf-1", &Guard::Active, &t, false).await;
}
