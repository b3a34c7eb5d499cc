//! How a claim ends (K-6.3, K-6.6, K-13): a shutdown timeout leaves the lease to expire, an
//! uncertain heartbeat ends the claim, and every hand-back is enqueued at its claimable time.

use crate::support::{settle, until_cancelled, Trouble, TroubledStore};
use kernel_core::engine::{ClaimEnd, RoundOutcome};
use kernel_core::ports::*;
use kernel_core::*;
use serde_json::json;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use testkit::harness::{test_config, World};

#[tokio::test]
async fn a_shutdown_timeout_leaves_the_lease_to_expire() {
    // K-6.6: a shutdown that times out behaves like a crash. The claim's activity never
    // returns; after the timeout nothing may extend the lease any more.
    let world = World::new(3);
    let never = |_c: ActivityContext| async move {
        std::future::pending::<()>().await;
        Ok(StepOutcome::complete(json!(null)))
    };
    let def = Definition::builder("t").step(StepDef::new("stuck", never).timeout_ms(3_600_000)).build().unwrap();
    let config = EngineConfig { shutdown_timeout_ms: DurationMs::from_secs(20), ..test_config("w") };
    let engine = world.engine_on(world.ports(), config, vec![def]);
    let hb = engine.config().heartbeat_ms;
    world.start_as(&engine, "t", "b", "wf-3").await;
    let running = engine.spawn();
    settle().await;
    assert_eq!(world.store.peek("wf-3").unwrap().steps[0].status, StepStatus::Running);
    let shutdown = tokio::spawn(running.shutdown());
    settle().await;
    for _ in 0..2 {
        world.clock.advance(hb);
        settle().await;
    }
    assert!(!shutdown.await.unwrap(), "the shutdown timed out");
    let lease_end = world.store.peek("wf-3").unwrap().claimable_time.unwrap();
    for _ in 0..6 {
        world.clock.advance(hb);
        settle().await;
    }
    let after = world.store.peek("wf-3").unwrap().claimable_time.unwrap();
    assert_eq!(after, lease_end, "the lease was extended after the shutdown timed out");
    assert!(world.now() > after, "the lease has run out");
}

#[tokio::test]
async fn an_uncertain_heartbeat_ends_the_claim_and_cancels_the_activity() {
    // K-6.4: an uncertain outcome ends the claim: the running activity is cancelled, no
    // new activity starts and nothing more is written.
    let world = World::new(3);
    let (cancelled, second) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let store = TroubledStore::new(world.ports().store);
    let mut ports = world.ports();
    ports.store = store.clone();
    let engine = world.engine_on(ports, test_config("w"), vec![until_cancelled(cancelled.clone(), second.clone())]);
    world.start_as(&engine, "t", "b", "wf-3").await;
    let e = engine.clone();
    let claim = tokio::spawn(async move { e.tick().await });
    settle().await;
    store.set(Trouble::HeartbeatUncertain);
    world.clock.advance(engine.config().heartbeat_ms);
    settle().await;
    assert_eq!(cancelled.load(Ordering::SeqCst), 1, "the running activity was not cancelled");
    let out = claim.await.unwrap().unwrap();
    assert!(matches!(out, RoundOutcome::Ran { end: ClaimEnd::Uncertain, .. }), "{out:?}");
    assert_eq!(second.load(Ordering::SeqCst), 0, "no new activity started");
    assert_eq!(store.writes_after_uncertain.load(Ordering::SeqCst), 0, "nothing written after it");
}

#[tokio::test]
async fn a_shutdown_release_between_waves_enqueues_the_instance() {
    // K-6.6 + K-13: a graceful shutdown hands a claimed instance back between waves; the
    // instance is claimable at once, so it is also put in its lane (and the doorbell rung),
    // not left for the next lane rebuild.
    let world = World::new(9);
    let gate = Arc::new(tokio::sync::Notify::new());
    let g = gate.clone();
    let first = move |_c: ActivityContext| {
        let g = g.clone();
        async move {
            g.notified().await;
            Ok(StepOutcome::complete(json!(1)))
        }
    };
    let second = |_c: ActivityContext| async move { Ok(StepOutcome::complete(json!(2))) };
    let def = Definition::builder("t")
        .step(StepDef::new("first", first).timeout_ms(3_600_000))
        .step(StepDef::new("second", second))
        .build()
        .unwrap();
    let engine = world.engine_on(world.ports(), test_config("w"), vec![def]);
    world.start_as(&engine, "t", "b", "wf-9").await;
    let running = engine.spawn();
    settle().await;
    assert_eq!(world.store.peek("wf-9").unwrap().steps[0].status, StepStatus::Running);
    world.queue.flush();
    let shutdown = tokio::spawn(running.shutdown());
    settle().await;
    gate.notify_one();
    assert!(shutdown.await.unwrap(), "a clean shutdown");
    let inst = world.store.peek("wf-9").unwrap();
    assert_eq!(inst.status, WorkflowStatus::Running);
    assert_eq!(inst.steps[1].status, StepStatus::Pending, "the second wave did not start");
    assert!(inst.claim_token.is_none(), "handed back");
    assert!(world.queue.lane_of("wf-9").is_some(), "the released instance is enqueued");
}

#[tokio::test]
async fn a_fingerprint_push_back_is_enqueued_at_its_claimable_time() {
    // K-4.3 + K-13: a pushed-back instance becomes claimable at now + push-back; it is put
    // in its lane at that time, not left for the next lane rebuild.
    let world = World::new(9);
    let one = |name: &str| {
        Definition::builder("t")
            .step(StepDef::new(name, |_c: ActivityContext| async { Ok(StepOutcome::complete(json!(1))) }))
            .build()
            .unwrap()
    };
    let old = world.engine("old", vec![one("a")]);
    let new = world.engine("new", vec![one("b")]);
    new.publisher().start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf-9f")).await.unwrap();
    let out = old.tick().await.unwrap();
    assert!(matches!(out, RoundOutcome::Ran { end: ClaimEnd::PushedBack, .. }), "{out:?}");
    let at = world.store.peek("wf-9f").unwrap().claimable_time.expect("claimable later");
    assert_eq!(at, world.now().saturating_add(old.config().fingerprint_pushback_ms));
    assert!(world.queue.lane_of("wf-9f").is_some(), "the pushed-back instance is enqueued");
    let before = Instant::from_millis(at.as_millis() - 1);
    assert!(world.queue.pop_due(before, 1).await.unwrap().is_empty(), "not due before the push-back ends");
    assert_eq!(world.queue.pop_due(at, 1).await.unwrap(), [WorkflowId::from("wf-9f")]);
}
