//! A claim's life (K-4.3, K-6.3, K-6.6): a fingerprint mismatch pushes back, the heartbeat
//! extends the lease, PrepareContext is rebuilt per claim, a graceful shutdown lets claims finish.

use crate::support::{one_step, start, tick_end};
use kernel_core::engine::{ClaimEnd, RoundOutcome};
use kernel_core::ports::*;
use kernel_core::*;
use serde_json::json;
use std::sync::{Arc, Mutex};
use testkit::harness::World;
use testkit::time::TestTime;

#[tokio::test]
async fn fingerprint_mismatch_pushes_back_without_touching_steps() {
    // K-4.3
    let world = World::new(1);
    let old = world.engine("old", vec![crate::linear("t", 2, false)]);
    start(&old, "t", "b", json!({})).await;
    let new = world.engine("new", vec![crate::linear("t", 3, false)]);
    let before = world.store.peek("wf-b").unwrap();
    let now = world.now();
    assert_eq!(tick_end(&new).await, ClaimEnd::PushedBack);
    let after = world.store.peek("wf-b").unwrap();
    assert_eq!(after.steps, before.steps, "no step touched");
    assert_eq!(after.status, WorkflowStatus::Running);
    assert_eq!(after.claimable_time, Some(now.plus(3_600_000)));
    assert_eq!(after.claim_token, None);
    assert_eq!(after.revision, before.revision + 1);
    let m = after.fingerprint_mismatch.unwrap();
    assert_eq!(m.persisted, before.definition_fingerprint);
    assert_ne!(m.worker, m.persisted);
}

#[tokio::test]
async fn heartbeat_extends_the_lease_and_a_missed_heartbeat_cancels_the_activity() {
    // K-6.3
    let world = World::new(1);
    let def = one_step(
        "t",
        |c: ActivityContext| async move {
            c.cancellation().cancelled().await;
            Err(ActivityError::transient("claim lost"))
        },
        |s| s.timeout_ms(3_600_000),
    );
    let engine = world.engine("w", vec![def]);
    start(&engine, "t", "b", json!({})).await;
    let e = engine.clone();
    let h = tokio::spawn(async move { e.tick().await });
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    let lease1 = world.store.peek("wf-b").unwrap().claimable_time.unwrap();
    world.clock.advance(10_000);
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    let lease2 = world.store.peek("wf-b").unwrap().claimable_time.unwrap();
    assert_eq!(lease2, lease1.plus(10_000), "heartbeat at lease/3 moved the lease");
    // K-6.8: a cancel never takes the instance from its live claim: it is requested, the
    // holder's next heartbeat misses, its activity stops, and the holder applies it.
    let cancel = engine.cancel(&"wf-b".into()).await.unwrap();
    assert!(matches!(cancel, CancelOutcome::Requested { .. }), "supersede while running: {cancel:?}");
    assert_eq!(world.store.peek("wf-b").unwrap().claimable_time, Some(lease2), "the lease is not shortened");
    world.clock.advance(10_000);
    let out = h.await.unwrap().unwrap();
    assert!(matches!(out, RoundOutcome::Ran { end: ClaimEnd::Terminal(WorkflowStatus::Canceled), .. }), "{out:?}");
    assert_eq!(world.store.peek("wf-b").unwrap().status, WorkflowStatus::Canceled);
}

#[tokio::test]
async fn prepare_context_is_rebuilt_from_the_input_at_each_claim() {
    // K-2.3
    let world = World::new(1);
    let def = one_step("t", |c: ActivityContext| async move { Ok(StepOutcome::complete(c.prepared().clone())) }, |s| s);
    let mut ports = world.ports();
    ports.observer = Arc::new(NoopObservationSink);
    let engine = kernel_core::Engine::builder(ports)
        .register(def)
        .prepare_context(Arc::new(|i: &WorkflowInstance| Ok(json!({ "tenant": i.input["tenant"].clone() }))))
        .build()
        .unwrap();
    start(&engine, "t", "b", json!({ "tenant": "acme" })).await;
    world.drive(&engine).await.unwrap();
    assert_eq!(world.store.peek("wf-b").unwrap().output["only"], json!({ "tenant": "acme" }));
}

#[tokio::test]
async fn graceful_shutdown_lets_claims_finish_and_a_timeout_leaves_the_lease() {
    // K-6.6
    let world = World::new(1);
    let gate = Arc::new(tokio::sync::Notify::new());
    let g = gate.clone();
    let def = one_step(
        "t",
        move |_c: ActivityContext| {
            let g = g.clone();
            async move {
                g.notified().await;
                Ok(StepOutcome::complete(json!(1)))
            }
        },
        |s| s.timeout_ms(3_600_000),
    );
    // K-6.6: the observer is drained after the claims finished, through a shutdown hook.
    let drained_after: Arc<Mutex<Option<WorkflowStatus>>> = Arc::default();
    let (d, store) = (drained_after.clone(), world.store.clone());
    let hook: kernel_core::engine::ShutdownHook = Arc::new(move || {
        let (d, store) = (d.clone(), store.clone());
        Box::pin(async move {
            *d.lock().unwrap() = store.peek("wf-b").map(|i| i.status);
        })
    });
    let mut b = Engine::builder(world.ports()).config(testkit::harness::test_config("w")).on_shutdown(hook);
    b = b.register(def);
    let engine = b.build().unwrap();
    let running = engine.spawn();
    start(&engine, "t", "b", json!({})).await;
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    assert!(world.store.peek("wf-b").unwrap().claim_token.is_some(), "claimed via the wakeup");
    let shut = tokio::spawn(running.shutdown());
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    gate.notify_one();
    assert!(shut.await.unwrap(), "clean shutdown after the claim finished");
    assert_eq!(world.store.peek("wf-b").unwrap().status, WorkflowStatus::Completed);
    assert_eq!(*drained_after.lock().unwrap(), Some(WorkflowStatus::Completed), "hook ran after the claim");

    // Now a claim that never finishes: the shutdown times out and leaves the lease.
    let engine2 = world.engine(
        "w2",
        vec![one_step(
            "t2",
            |_c: ActivityContext| async { std::future::pending::<Result<StepOutcome, ActivityError>>().await },
            |s| s.timeout_ms(3_600_000),
        )],
    );
    let running = engine2.spawn();
    engine2.publisher().start_or_resume(StartRequest::new("t2", "c", json!({})).workflow_id("wf-c")).await.unwrap();
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    let shut = tokio::spawn(running.shutdown());
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    world.clock.advance(engine2.config().shutdown_timeout_ms);
    assert!(!shut.await.unwrap(), "timed out");
    let i = world.store.peek("wf-c").unwrap();
    assert!(i.claim_token.is_some(), "the lease is left to expire, never cleared");
}
