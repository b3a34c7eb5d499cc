//! Permits before each activity entry (K-14): a denial defers without counting an attempt,
//! by the retry interval, and a permit error fails closed.

use crate::support::{one_step, start, tick_end};
use kernel_core::engine::ClaimEnd;
use kernel_core::ports::*;
use kernel_core::*;
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use testkit::harness::World;
use testkit::memory::PermitLimits;
use testkit::time::TestTime;

/// A one-step workflow `t` on `resource` whose activity counts its entries.
fn counting_step_on(resource: &str) -> (Definition, Arc<AtomicU32>) {
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let activity = move |_c: ActivityContext| {
        let r = r.clone();
        async move {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(StepOutcome::complete(json!(1)))
        }
    };
    (one_step("t", activity, |s| s.resource(resource)), runs)
}

/// A world whose resource `asr` (one slot) another owner holds, an engine whose one step
/// needs it, and workflow `wf-b` started on it.
async fn asr_held_by_another() -> (World, Engine, Arc<AtomicU32>, PermitOwner) {
    let limits = HashMap::from([("asr".to_string(), PermitLimits { max_concurrency: 1, max_starts_per_second: 0 })]);
    let world = World::with_limits(1, limits);
    let (def, runs) = counting_step_on("asr");
    let engine = world.engine("w", vec![def]);
    let other = PermitOwner { workflow_id: "x".into(), step: "s".into(), claim_token: "t".into() };
    assert!(matches!(world.permits.acquire("asr", &other).await.unwrap(), PermitDecision::Granted { .. }));
    start(&engine, "t", "b", json!({})).await;
    (world, engine, runs, other)
}

#[tokio::test]
async fn permit_denial_defers_without_counting_an_attempt() {
    // K-7.1 (permit), K-2.1, K-14
    let (world, engine, runs, other) = asr_held_by_another().await;
    let now = world.now();
    assert_eq!(tick_end(&engine).await, ClaimEnd::Released);
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!((i.steps[0].status, i.steps[0].attempt, i.steps[0].traffic_waits), (StepStatus::Pending, 0, 1));
    assert!(i.steps[0].traffic_wait_ms > 0);
    assert!(i.claimable_time.unwrap() > now && i.claim_token.is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the activity never ran unpermitted");
    world.permits.release("asr", &other).await.unwrap();
    world.drive(&engine).await.unwrap();
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!((i.status, i.steps[0].attempt), (WorkflowStatus::Completed, 1));
}

/// A step denied because the resource is full comes back after `permit_retry_ms`, not after
/// the adapter's hint (the soonest holder's lease end, 30 s here): a holder releases when its
/// activity returns, usually long before its lease ends, and a waiter deferred to the lease
/// end would starve while later arrivals take the freed slots (K-14: released "with a
/// wakeup", which finds only due waiters). A shorter hint (the start window) is kept.
#[tokio::test]
async fn a_full_resource_defers_by_the_retry_interval_not_the_holders_lease() {
    let (world, engine, _runs, other) = asr_held_by_another().await;
    let retry = engine.config().permit_retry_ms;
    let now = world.now();
    assert_eq!(tick_end(&engine).await, ClaimEnd::Released);
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!(
        i.claimable_time,
        Some(now.plus(retry.as_millis())),
        "deferred by permit_retry_ms ({retry}), not the 30 s lease"
    );

    // The start window's hint is exact and shorter: it is kept.
    let limits = HashMap::from([("ocr".to_string(), PermitLimits { max_concurrency: 0, max_starts_per_second: 1 })]);
    let world = World::with_limits(2, limits);
    let (def, _runs) = counting_step_on("ocr");
    let engine = world.engine("w", vec![def]);
    assert!(matches!(world.permits.acquire("ocr", &other).await.unwrap(), PermitDecision::Granted { .. }));
    world.clock.advance(900);
    start(&engine, "t", "c", json!({})).await;
    let now = world.now();
    assert_eq!(tick_end(&engine).await, ClaimEnd::Released);
    let i = world.store.peek("wf-c").unwrap();
    let waited = i.claimable_time.unwrap() - now;
    assert!(waited <= DurationMs::from_millis(100) && waited < engine.config().permit_retry_ms, "{waited}");
}

#[tokio::test]
async fn permit_errors_fail_closed() {
    // K-14: Redis error ⇒ defer, never run unpermitted.
    let world = World::new(1);
    let (def, runs) = counting_step_on("asr");
    let engine = world.engine("w", vec![def]);
    world.permits.set_down(true);
    start(&engine, "t", "b", json!({})).await;
    assert_eq!(tick_end(&engine).await, ClaimEnd::Released);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    world.permits.set_down(false);
    world.drive(&engine).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
