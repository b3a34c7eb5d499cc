//! A failing or panicking PrepareContext is counted, bounded and converges to `failed`
//! without running business code (K-6, K-8).

use kernel_core::*;
use serde_json::json;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use testkit::harness::{test_config, World};

#[tokio::test]
async fn a_failing_prepare_context_converges_to_failed_without_business_code() {
    // K-2.3 + K-8: a PrepareContext that keeps failing is tried a bounded number of times,
    // across claims (the count is persisted), with growing delays; then the workflow fails
    // through `failing`. No business code runs without its context (K-17.6 amendment): no
    // step, and not the failure finalizer.
    let world = World::new(7);
    let (steps, finalizer) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let (s, f) = (steps.clone(), finalizer.clone());
    let def = Definition::builder("t")
        .step(StepDef::new("only", move |_c: ActivityContext| {
            let s = s.clone();
            async move {
                s.fetch_add(1, Ordering::SeqCst);
                Ok(StepOutcome::complete(json!(1)))
            }
        }))
        .failure_finalizer(move |_c: ActivityContext| {
            let f = f.clone();
            async move {
                f.fetch_add(1, Ordering::SeqCst);
                Ok(StepOutcome::complete(json!(null)))
            }
        })
        .build()
        .unwrap();
    let calls: Arc<std::sync::Mutex<Vec<Instant>>> = Arc::default();
    let (c, clock) = (calls.clone(), world.clock.clone());
    let config = test_config("w");
    let attempts_max = config.prepare_attempts_max;
    let engine = kernel_core::Engine::builder(world.ports())
        .config(config)
        .register(def)
        .prepare_context(Arc::new(move |_i: &WorkflowInstance| {
            c.lock().unwrap().push(kernel_core::ports::Clock::now(&*clock));
            Err("tenant directory refused the input".to_string())
        }))
        .build()
        .unwrap();
    world.start_as(&engine, "t", "b", "wf-7").await;
    let report = world.drive_until(&engine, 200, &|| false).await.unwrap();
    let i = world.store.peek("wf-7").unwrap();
    assert_eq!(i.status, WorkflowStatus::Failed, "after {} claims", report.claims());
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len() as u32, attempts_max, "PrepareContext attempts");
    let gaps: Vec<_> = calls.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.windows(2).all(|g| g[1] > g[0]), "the delays grow: {gaps:?}");
    assert_eq!(finalizer.load(Ordering::SeqCst), 0, "the failure finalizer does not run without its context");
    assert_eq!(steps.load(Ordering::SeqCst), 0, "no step ran");
    assert_eq!(i.steps[0].status, StepStatus::Pending);
}

#[tokio::test]
async fn a_panicking_prepare_context_counts_as_a_failure_and_converges() {
    // A PrepareContext that panics is a failed PrepareContext (K-2.3): counted, retried a
    // bounded number of times, then the workflow fails. Before, the panic ended the claim's
    // task; the lease expired and the claim repeated forever.
    let world = World::new(7);
    let steps = Arc::new(AtomicU32::new(0));
    let s = steps.clone();
    let def = Definition::builder("t")
        .step(StepDef::new("only", move |_c: ActivityContext| {
            let s = s.clone();
            async move {
                s.fetch_add(1, Ordering::SeqCst);
                Ok(StepOutcome::complete(json!(1)))
            }
        }))
        .build()
        .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let config = test_config("w");
    let attempts_max = config.prepare_attempts_max;
    let engine = kernel_core::Engine::builder(world.ports())
        .config(config)
        .register(def)
        .prepare_context(Arc::new(move |_i: &WorkflowInstance| {
            c.fetch_add(1, Ordering::SeqCst);
            panic!("tenant directory client bug")
        }))
        .build()
        .unwrap();
    world.start_as(&engine, "t", "b", "wf-7p").await;
    let report = tokio::spawn({
        let (world, engine) = (world.clone(), engine.clone());
        async move { world.drive_until(&engine, 200, &|| false).await }
    })
    .await
    .expect("the driver survives a panicking PrepareContext")
    .unwrap();
    let i = world.store.peek("wf-7p").unwrap();
    assert_eq!(i.status, WorkflowStatus::Failed, "after {} claims", report.claims());
    assert_eq!(calls.load(Ordering::SeqCst), attempts_max, "PrepareContext attempts");
    assert_eq!(steps.load(Ordering::SeqCst), 0, "no step ran");
}
