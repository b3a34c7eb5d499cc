//! Operator actions against live claims (K-6.8): a cancel or a regenerate never takes an
//! instance from the holder of its claim before the lease ends; it is recorded as a request
//! the holder applies once its activities have returned, or the next claimer applies
//! before it starts anything. Simulated time on the world's manual clock.

use crate::support::settle;
use kernel_core::engine::{ClaimEnd, RoundOutcome};
use kernel_core::*;
use serde_json::json;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use testkit::harness::World;
use tokio::sync::Semaphore;

/// What the gated step's activity saw: entries, the most that ran at once, and whether
/// two ever overlapped.
#[derive(Default)]
struct Gate {
    open: Option<Arc<Semaphore>>,
    entries: AtomicU32,
    active: AtomicU32,
    overlaps: AtomicU32,
}

/// `fetch → slow`: `slow` waits for its gate (or its cancellation) and counts overlaps.
fn gated(gate: &Arc<Gate>) -> Definition {
    let g = gate.clone();
    let slow = move |c: ActivityContext| {
        let g = g.clone();
        async move {
            g.entries.fetch_add(1, Ordering::SeqCst);
            if g.active.fetch_add(1, Ordering::SeqCst) > 0 {
                g.overlaps.fetch_add(1, Ordering::SeqCst);
            }
            let open = g.open.clone().expect("gate");
            let r = tokio::select! {
                p = open.acquire() => { p.expect("gate").forget(); Ok(StepOutcome::complete(json!("slow done"))) }
                _ = c.cancellation().cancelled() => Err(ActivityError::transient("canceled")),
            };
            g.active.fetch_sub(1, Ordering::SeqCst);
            r
        }
    };
    Definition::builder("gated")
        .step(StepDef::new("fetch", |_c: ActivityContext| async { Ok(StepOutcome::complete(json!("fetched"))) }))
        .step(StepDef::new("slow", slow).depends_on(["fetch"]).timeout_ms(3_600_000))
        .build()
        .unwrap()
}

fn new_gate() -> Arc<Gate> {
    Arc::new(Gate { open: Some(Arc::new(Semaphore::new(0))), ..Default::default() })
}

/// Start `wf-1` and let worker A enter `slow`, its claim still running.
async fn holder_in_slow(world: &World, a: &Engine, gate: &Gate) -> tokio::task::JoinHandle<Result<RoundOutcome>> {
    let req = StartRequest::new("gated", "b1", json!({})).workflow_id("wf-1");
    a.publisher().start_or_resume(req).await.unwrap();
    let e = a.clone();
    let h = tokio::spawn(async move { e.tick().await });
    settle().await;
    assert_eq!(gate.entries.load(Ordering::SeqCst), 1, "A is in slow");
    assert!(world.store.peek("wf-1").unwrap().claim_token.is_some());
    h
}

/// K-6.8 regression: a regenerate while the claim's activity still ran used to clear the
/// claim and make the instance claimable at once, so a second worker entered the same step
/// beside the first under the same idempotency key.
#[tokio::test(flavor = "current_thread")]
async fn a_regenerate_under_a_live_claim_never_runs_a_step_twice_at_once() {
    let world = World::new(3);
    let gate = new_gate();
    let (a, b) = (world.engine("A", vec![gated(&gate)]), world.engine("B", vec![gated(&gate)]));
    let h = holder_in_slow(&world, &a, &gate).await;
    let lease = world.store.peek("wf-1").unwrap().claimable_time;

    let acted = b.regenerate(&"wf-1".into(), "fetch").await.unwrap();
    assert!(matches!(acted, Acted::Requested { .. }), "a claim holds it: requested, not applied: {acted:?}");
    let held = world.store.peek("wf-1").unwrap();
    assert_eq!(held.claimable_time, lease, "the lease is not shortened");
    assert!(held.operator_request.is_some(), "the request is recorded on the instance");

    // B finds nothing to claim while the lease runs, whatever it tries.
    let e = b.clone();
    let hb = tokio::spawn(async move { e.tick().await });
    settle().await;
    assert_eq!(gate.entries.load(Ordering::SeqCst), 1, "nobody entered slow beside A");
    assert!(matches!(hb.await.unwrap().unwrap(), RoundOutcome::Idle { .. }), "B claimed nothing");

    // A's next heartbeat misses; its activity stops; A applies the request itself.
    world.clock.advance(10_000);
    settle().await;
    let out = h.await.unwrap().unwrap();
    assert!(matches!(out, RoundOutcome::Ran { end: ClaimEnd::Released, .. }), "{out:?}");
    let after = world.store.peek("wf-1").unwrap();
    assert!(after.operator_request.is_none() && after.claim_token.is_none(), "applied and cleared");
    assert_eq!((after.steps[0].epoch, after.steps[1].epoch), (1, 1), "fetch and slow start new attempts");

    gate.open.as_ref().unwrap().add_permits(1);
    world.drive_all(&[&a, &b]).await.unwrap();
    let done = world.store.peek("wf-1").unwrap();
    assert_eq!(done.status, WorkflowStatus::Completed);
    assert_eq!(gate.overlaps.load(Ordering::SeqCst), 0, "no two executions of slow overlapped");
    assert_eq!(gate.entries.load(Ordering::SeqCst), 2, "slow ran once per logical attempt");
}

/// K-6.8, K-8: a cancel under a live claim is requested; the holder stops at its next
/// heartbeat and applies it: canceled, and nothing ran beside it.
#[tokio::test(flavor = "current_thread")]
async fn a_cancel_under_a_live_claim_is_applied_by_its_holder() {
    let world = World::new(4);
    let gate = new_gate();
    let (a, b) = (world.engine("A", vec![gated(&gate)]), world.engine("B", vec![gated(&gate)]));
    let h = holder_in_slow(&world, &a, &gate).await;
    let lease = world.store.peek("wf-1").unwrap().claimable_time;
    let first = b.cancel(&"wf-1".into()).await.unwrap();
    let CancelOutcome::Requested { request_id } = first else { panic!("requested, not applied: {first:?}") };
    assert_eq!(
        b.cancel(&"wf-1".into()).await.unwrap(),
        CancelOutcome::Requested { request_id: request_id.clone() },
        "a second cancel reports the same request"
    );
    assert_eq!(world.store.peek("wf-1").unwrap().claimable_time, lease, "the lease is not shortened");
    assert!(matches!(b.tick().await.unwrap(), RoundOutcome::Idle { .. }));
    world.clock.advance(10_000);
    settle().await;
    let out = h.await.unwrap().unwrap();
    assert!(matches!(out, RoundOutcome::Ran { end: ClaimEnd::Terminal(WorkflowStatus::Canceled), .. }), "{out:?}");
    let after = world.store.peek("wf-1").unwrap();
    assert_eq!(after.status, WorkflowStatus::Canceled);
    assert!(after.operator_request.is_none());
    assert_eq!(gate.entries.load(Ordering::SeqCst), 1);
}

/// K-6.8: when the holder is gone (its process died with the request recorded), the worker
/// that claims the instance after the lease has ended applies the request before it runs
/// anything.
#[tokio::test(flavor = "current_thread")]
async fn a_request_whose_holder_died_is_applied_by_the_next_claimer_first() {
    let world = World::new(5);
    let gate = new_gate();
    let (a, b) = (world.engine("A", vec![gated(&gate)]), world.engine("B", vec![gated(&gate)]));
    let h = holder_in_slow(&world, &a, &gate).await;
    h.abort(); // A's process dies: its claim and its activity with it.
    let _ = h.await;
    let lease = world.store.peek("wf-1").unwrap().claimable_time.unwrap();
    assert!(matches!(b.regenerate(&"wf-1".into(), "fetch").await.unwrap(), Acted::Requested { .. }));
    world.clock.set(lease.saturating_sub(DurationMs::from_millis(1)));
    assert!(matches!(b.tick().await.unwrap(), RoundOutcome::Idle { .. }), "nothing before the lease ends");
    world.clock.set(lease);
    let out = b.tick().await.unwrap();
    assert!(matches!(out, RoundOutcome::Ran { end: ClaimEnd::Released, .. }), "{out:?}");
    assert_eq!(gate.entries.load(Ordering::SeqCst), 1, "B ran nothing in the claim that applied the request");
    let after = world.store.peek("wf-1").unwrap();
    assert!(after.operator_request.is_none());
    assert_eq!(after.steps[0].epoch, 1, "the regenerate was applied");
}

/// K-6.8: an instance no claim holds takes the action at once, and the answer says so.
#[tokio::test(flavor = "current_thread")]
async fn an_instance_no_claim_holds_takes_the_action_at_once() {
    let world = World::new(6);
    let gate = new_gate();
    let a = world.engine("A", vec![gated(&gate)]);
    let req = StartRequest::new("gated", "b1", json!({})).workflow_id("wf-1");
    a.publisher().start_or_resume(req).await.unwrap();
    assert_eq!(a.cancel(&"wf-1".into()).await.unwrap(), CancelOutcome::Canceled);
    assert_eq!(a.cancel(&"wf-1".into()).await.unwrap(), CancelOutcome::NotActive);
    assert!(matches!(a.regenerate(&"wf-1".into(), "fetch").await, Err(Error::Conflict(_))), "ended");
}

/// K-6.8: a request that no longer applies when the holder leaves (the regenerated step is
/// no longer completed: a cancel was requested too and replaced it… here: a later action
/// of another kind while one is pending is refused, and a cancel replaces a regenerate).
#[tokio::test(flavor = "current_thread")]
async fn a_cancel_replaces_a_pending_regenerate_and_a_regenerate_waits_for_a_pending_cancel() {
    let world = World::new(7);
    let gate = new_gate();
    let (a, b) = (world.engine("A", vec![gated(&gate)]), world.engine("B", vec![gated(&gate)]));
    let h = holder_in_slow(&world, &a, &gate).await;
    assert!(matches!(b.regenerate(&"wf-1".into(), "fetch").await.unwrap(), Acted::Requested { .. }));
    assert!(matches!(b.cancel(&"wf-1".into()).await.unwrap(), CancelOutcome::Requested { .. }));
    let pending = world.store.peek("wf-1").unwrap().operator_request.unwrap();
    assert_eq!(pending.action, kernel_core::operator_request::RequestedAction::Cancel);
    assert!(matches!(b.regenerate(&"wf-1".into(), "fetch").await, Err(Error::Conflict(_))));
    world.clock.advance(10_000);
    settle().await;
    let _ = h.await.unwrap().unwrap();
    assert_eq!(world.store.peek("wf-1").unwrap().status, WorkflowStatus::Canceled);
}
