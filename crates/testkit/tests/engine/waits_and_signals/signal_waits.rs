//! Signal waits and yields (K-9): one write suspends, a signal wakes the wait once, early
//! signals and the poll fallback, a yield hands the claim back, stale signals are purged.

use crate::support::{one_step, sig, signal_waiter, start, tick_end};
use kernel_core::engine::ClaimEnd;
use kernel_core::ports::*;
use kernel_core::transition::{Guard, Transition};
use kernel_core::*;
use serde_json::json;
use std::sync::{Arc, Mutex};
use testkit::harness::World;

#[tokio::test]
async fn signal_wait_suspends_in_one_write_and_a_signal_wakes_it_once() {
    // K-9.1, K-9.3, K-2.1
    let world = World::new(1);
    let fact = Arc::new(Mutex::new(false));
    let engine = world.engine("w", vec![signal_waiter(fact.clone(), 2, None)]);
    start(&engine, "sig", "b", json!({})).await;
    world.audit.reset_traffic();
    assert_eq!(tick_end(&engine).await, ClaimEnd::Suspended);
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!(world.audit.counts().writes, 3, "claim, mark running, SuspendClaim");
    assert_eq!((i.status, i.steps[0].status, i.steps[0].attempt), (WorkflowStatus::Waiting, StepStatus::Waiting, 0));
    assert_eq!((i.claim_token.clone(), i.claimable_time), (None, None));
    assert_eq!(i.steps[0].checkpoint, Some(json!({ "n": 1 })));
    // A stale generation never wakes it (K-9.6).
    assert_eq!(engine.deliver_signal(sig("s-old", 1)).await.unwrap(), DeliverOutcome::Pending);
    assert_eq!(world.store.peek("wf-b").unwrap().status, WorkflowStatus::Waiting);
    // Business fact first, then the doorbell.
    *fact.lock().unwrap() = true;
    assert_eq!(engine.deliver_signal(sig("s-1", 2)).await.unwrap(), DeliverOutcome::Activated);
    assert_eq!(engine.deliver_signal(sig("s-1", 2)).await.unwrap(), DeliverOutcome::Duplicate);
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!(i.resume.as_ref().unwrap().signal_id.as_deref(), Some("s-1"));
    world.drive(&engine).await.unwrap();
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!(i.status, WorkflowStatus::Completed);
    assert_eq!(i.output["only"], json!({ "resume": "Signal" }));
    assert_eq!(i.resume, None, "cleared by the completion of that step");
    assert_eq!(i.steps[0].attempt, 1);
}

#[tokio::test]
async fn early_signal_is_consumed_right_after_the_suspend() {
    // K-9.4
    let world = World::new(1);
    let fact = Arc::new(Mutex::new(false));
    let engine = world.engine("w", vec![signal_waiter(fact.clone(), 0, None)]);
    start(&engine, "sig", "b", json!({})).await;
    assert_eq!(engine.deliver_signal(sig("early", 0)).await.unwrap(), DeliverOutcome::Pending);
    assert_eq!(tick_end(&engine).await, ClaimEnd::Suspended);
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!(i.status, WorkflowStatus::Running, "the early signal woke it at once");
    assert_eq!(world.inbox.all()[0].status, SignalStatus::Matched);
}

#[tokio::test]
async fn poll_fallback_wakes_a_signal_wait() {
    // K-9.5, K-9.2
    let world = World::new(1);
    let fact = Arc::new(Mutex::new(false));
    let engine = world.engine("w", vec![signal_waiter(fact.clone(), 0, Some(60_000))]);
    start(&engine, "sig", "b", json!({})).await;
    assert_eq!(tick_end(&engine).await, ClaimEnd::Suspended);
    *fact.lock().unwrap() = true; // the callback was lost, the fact is there
    world.clock.advance(60_000);
    let rep = engine.maintain().await.unwrap();
    assert_eq!(rep.activated, 1);
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!(i.resume.as_ref().unwrap().kind, ResumeKind::Poll);
    world.drive(&engine).await.unwrap();
    assert_eq!(world.store.peek("wf-b").unwrap().output["only"], json!({ "resume": "Poll" }));
}

#[tokio::test]
async fn half_done_signal_match_is_finished_by_the_claimer() {
    // K-9.4: activation committed, inbox not marked.
    let world = World::new(1);
    let fact = Arc::new(Mutex::new(true));
    let engine = world.engine("w", vec![signal_waiter(Arc::new(Mutex::new(false)), 0, None)]);
    start(&engine, "sig", "b", json!({})).await;
    assert_eq!(tick_end(&engine).await, ClaimEnd::Suspended);
    world
        .inbox
        .insert(SignalRecord {
            signal_id: "s-1".into(),
            workflow_id: "wf-b".into(),
            signal_type: "go".into(),
            wait_key: "key-1".into(),
            generation: 0,
            status: SignalStatus::Pending,
            created_at: world.now(),
            match_time: None,
            orphan: false,
        })
        .await
        .unwrap();
    let id = WaitIdentity { signal_type: "go".into(), wait_key: "key-1".into(), generation: 0, step_index: 0 };
    let t = Transition::signal_activation(0, "s-1", world.now());
    assert!(world.store.apply(&"wf-b".into(), &Guard::SignalWait(id), &t).await.unwrap().applied());
    let _ = fact;
    world.queue.enqueue(&"wf-b".into(), Priority::P2, world.now()).await.unwrap();
    let _ = tick_end(&engine).await;
    assert_eq!(world.inbox.all()[0].status, SignalStatus::Matched, "marked before any step ran");
}

#[tokio::test]
async fn yield_hands_back_with_the_checkpoint_and_rolls_the_attempt_back() {
    // K-7.4 (yield), K-10
    let world = World::new(1);
    let def = one_step(
        "t",
        |c: ActivityContext| async move {
            let n = c.checkpoint().and_then(|v| v["cursor"].as_u64()).unwrap_or(0);
            if n < 3 {
                Ok(StepOutcome::yield_with(json!({ "cursor": n + 1 })))
            } else {
                Ok(StepOutcome::complete(json!(n)))
            }
        },
        |s| s,
    );
    let engine = world.engine("w", vec![def]);
    start(&engine, "t", "b", json!({})).await;
    assert_eq!(tick_end(&engine).await, ClaimEnd::Yielded);
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!(
        (i.steps[0].status, i.steps[0].attempt, i.steps[0].checkpoint.clone()),
        (StepStatus::Pending, 0, Some(json!({ "cursor": 1 })))
    );
    assert_eq!(i.claimable_time, Some(world.now()));
    world.drive(&engine).await.unwrap();
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!((i.status, i.steps[0].attempt, i.output["only"].clone()), (WorkflowStatus::Completed, 1, json!(3)));
}

#[tokio::test]
async fn stale_signals_are_purged_after_retention() {
    // Bound on inbox growth: a doorbell that never meets its wait does not stay forever.
    let world = World::new(1);
    let engine = world.engine("w", vec![signal_waiter(Arc::new(Mutex::new(false)), 3, None)]);
    start(&engine, "sig", "b", json!({})).await;
    tick_end(&engine).await;
    assert_eq!(engine.deliver_signal(sig("stale", 1)).await.unwrap(), DeliverOutcome::Pending);
    assert_eq!(engine.maintain().await.unwrap().signals_purged, 0, "kept within retention");
    world.clock.advance(engine.config().signal_retention_ms + DurationMs::from_millis(1));
    assert_eq!(engine.maintain().await.unwrap().signals_purged, 1);
    assert!(world.inbox.all().is_empty());
    assert_eq!(world.store.peek("wf-b").unwrap().status, WorkflowStatus::Waiting, "the wait is untouched");
}
