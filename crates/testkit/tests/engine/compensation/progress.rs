//! The compensation's progress is durable (K-17.6 amendment): a later claim of a failing
//! workflow runs no finished inverse again, an inverse that fails is tried again by a later
//! claim after its backoff (never by a sleep inside the claim), and one that keeps failing
//! is escalated once. Simulated time on the world's manual clock.

use kernel_core::compensation::{CompensationOutcome, InverseResult};
use kernel_core::engine::{ClaimEnd, RoundOutcome};
use kernel_core::*;
use serde_json::json;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use testkit::harness::World;

fn counted(n: &Arc<AtomicU32>, fails: u32) -> impl Activity {
    let n = n.clone();
    move |_c: ActivityContext| {
        let n = n.clone();
        async move {
            if n.fetch_add(1, Ordering::SeqCst) < fails {
                Err(ActivityError::transient("ledger unavailable"))
            } else {
                Ok(StepOutcome::complete(json!("done")))
            }
        }
    }
}

fn failing() -> impl Activity {
    |_: ActivityContext| async { Err::<StepOutcome, _>(ActivityError::permanent("vendor unknown")) }
}

/// `reserve → post → check (fails)`, inverses of `reserve` and `post` counted.
fn def(
    unreserve: &Arc<AtomicU32>,
    unpost: &Arc<AtomicU32>,
    unpost_fails: u32,
    finalizer: Option<Arc<AtomicU32>>,
) -> Definition {
    let ok = |_: ActivityContext| async { Ok(StepOutcome::complete(json!("ok"))) };
    let mut b = Definition::builder("inv")
        .step(StepDef::new("reserve", ok).compensate_with(counted(unreserve, 0)))
        .step(StepDef::new("post", ok).depends_on(["reserve"]).compensate_with(counted(unpost, unpost_fails)))
        .step(StepDef::new("check", failing()).depends_on(["post"]));
    if let Some(f) = finalizer {
        b = b.failure_finalizer(counted(&f, 3));
    }
    b.build().unwrap()
}

/// A minute at a time, drive until `wf-1` has ended (ten minutes at most).
async fn until_ended(world: &World, engine: &Engine) {
    for _ in 0..10 {
        if world.store.peek("wf-1").unwrap().status.is_terminal() {
            break;
        }
        world.clock.advance(60_000);
        world.drive(engine).await.unwrap();
    }
}

/// K-17.6 amendment regression: when the failure finalizer failed, every later claim ran
/// every inverse again (each up to `compensation_attempts` times), without bound.
#[tokio::test(flavor = "current_thread")]
async fn a_failing_finalizer_never_runs_a_finished_inverse_again() {
    let world = World::new(11);
    let (unreserve, unpost, finalizer) =
        (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let engine = world.engine("w", vec![def(&unreserve, &unpost, 0, Some(finalizer.clone()))]);
    world.start_as(&engine, "inv", "b1", "wf-1").await;
    world.drive(&engine).await.unwrap();
    until_ended(&world, &engine).await;
    let inst = world.store.peek("wf-1").unwrap();
    assert_eq!(inst.status, WorkflowStatus::Failed);
    assert_eq!(finalizer.load(Ordering::SeqCst), 4, "the finalizer failed three times, then completed");
    assert_eq!(
        (unreserve.load(Ordering::SeqCst), unpost.load(Ordering::SeqCst)),
        (1, 1),
        "each inverse ran once, whatever the finalizer did"
    );
    assert_eq!(inst.compensation.unwrap().outcome, CompensationOutcome::Recovered);
}

/// K-17.6 amendment: an inverse that fails is tried again by a later claim once its backoff
/// has passed — the claim is handed back with `claimable_time` at the next try and the
/// progress on the instance — and one that keeps failing is escalated exactly once.
#[tokio::test(flavor = "current_thread")]
async fn a_failed_inverse_is_retried_by_a_later_claim_after_its_backoff_and_escalated_once() {
    let world = World::new(12);
    let (unreserve, unpost) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    // The task inbox's calls counted in the envelope: the escalation opens one task once
    // (a second open of the same id would leave one record too).
    let calls = testkit::port_faults::PortFaults::new(world.clock.clone());
    let engine = Engine::builder(world.ports())
        .config(testkit::harness::test_config("w"))
        .register(def(&unreserve, &unpost, u32::MAX, None))
        .port_hook(calls.clone())
        .build()
        .unwrap();
    world.start_as(&engine, "inv", "b1", "wf-1").await;
    // The steps run; `check` fails; the compensation starts with `post`'s inverse.
    let mut ends = Vec::new();
    while let RoundOutcome::Ran { end, .. } = engine.tick().await.unwrap() {
        ends.push(end);
        if matches!(ends.last(), Some(ClaimEnd::Released)) {
            break;
        }
    }
    let held = world.store.peek("wf-1").unwrap();
    assert_eq!(held.status, WorkflowStatus::Failing);
    assert_eq!(unpost.load(Ordering::SeqCst), 1, "one attempt per claim");
    let progress = held.compensation.clone().expect("the progress is on the instance");
    assert_eq!(progress.outcome, CompensationOutcome::InProgress);
    assert_eq!(
        (progress.steps[0].step.as_str(), progress.steps[0].result, progress.steps[0].attempts),
        ("post", InverseResult::Retrying, 1)
    );
    let next_try = held.claimable_time.expect("claimable again later");
    assert!(next_try >= world.now(), "handed back until its next try");
    assert_eq!(progress.at, next_try, "the report says when the compensation goes on");
    // Nothing runs before the next try.
    if next_try > world.now() {
        assert!(matches!(engine.tick().await.unwrap(), RoundOutcome::Idle { .. }));
    }
    until_ended(&world, &engine).await;
    let inst = world.store.peek("wf-1").unwrap();
    assert_eq!(inst.status, WorkflowStatus::Failed);
    let cfg = testkit::harness::test_config("w");
    assert_eq!(unpost.load(Ordering::SeqCst), cfg.compensation_attempts, "attempts bounded across claims");
    let report = inst.compensation.unwrap();
    assert_eq!(report.outcome, CompensationOutcome::Escalated);
    assert_eq!(report.steps[0].result, InverseResult::Escalated);
    assert_eq!(report.steps[1].result, InverseResult::Compensated, "reserve's inverse ran after post's");
    assert_eq!(world.task_inbox.all().len(), 1, "one escalation task");
    assert_eq!(calls.calls("task_inbox.open"), 1, "escalated once: one open call");
}

/// K-17.6 amendment: an attempt is recorded before it runs, so an inverse during which the
/// process ends every time is still bounded — after `compensation_attempts` starts it is
/// given up (its last outcome unknown) and escalated, and an inverse that completed before
/// is never run again.
#[tokio::test(flavor = "current_thread")]
async fn an_inverse_whose_process_ends_during_every_attempt_is_given_up_and_escalated() {
    let world = World::new(13);
    let unreserve = Arc::new(AtomicU32::new(0));
    let entered = Arc::new(AtomicU32::new(0));
    let e = entered.clone();
    let hangs = move |_c: ActivityContext| {
        let e = e.clone();
        async move {
            e.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<()>().await;
            Ok(StepOutcome::complete(json!("never")))
        }
    };
    let ok = |_: ActivityContext| async { Ok(StepOutcome::complete(json!("ok"))) };
    let def = Definition::builder("inv")
        .step(StepDef::new("reserve", ok).compensate_with(counted(&unreserve, 0)))
        .step(StepDef::new("post", ok).depends_on(["reserve"]).compensate_with(hangs))
        .step(StepDef::new("check", failing()).depends_on(["post"]))
        .build()
        .unwrap();
    let engine = world.engine("w", vec![def]);
    world.start_as(&engine, "inv", "b1", "wf-1").await;
    let lease = engine.config().lease_ms;
    for _ in 0..10 {
        if world.store.peek("wf-1").unwrap().status.is_terminal() {
            break;
        }
        // A process runs the claim and dies inside the inverse (its task is dropped).
        let e = engine.clone();
        let h = tokio::spawn(async move { e.tick().await });
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        h.abort();
        let _ = h.await;
        world.clock.advance(lease.as_millis() + 1);
        let _ = engine.maintain().await;
    }
    let inst = world.store.peek("wf-1").unwrap();
    assert_eq!(inst.status, WorkflowStatus::Failed, "{:?}", inst.compensation);
    let cfg = testkit::harness::test_config("w");
    assert_eq!(entered.load(Ordering::SeqCst), cfg.compensation_attempts, "bounded by the recorded starts");
    let report = inst.compensation.unwrap();
    assert_eq!(
        (report.steps[0].result, report.steps[0].attempts),
        (InverseResult::Escalated, cfg.compensation_attempts)
    );
    assert_eq!(report.steps[1].result, InverseResult::Compensated);
    assert_eq!(unreserve.load(Ordering::SeqCst), 1, "reserve's inverse ran once");
    assert_eq!(world.task_inbox.all().len(), 1);
}
