//! `memory:` for demos: one process, the wall clock, a workflow from start to completion.

use compose::{Deployment, QueueOptions, Scheme};
use kernel_core::domain::DurationMs;
use kernel_core::engine::{Engine, EngineConfig};
use kernel_core::{Definition, StartRequest, StepDef, StepOutcome, WorkflowStatus};
use serde_json::json;
use std::sync::Arc;

#[tokio::test]
async fn a_memory_deployment_runs_a_workflow_to_completion() {
    let d = Deployment::connect("memory:", "memory://", &QueueOptions::default()).await.unwrap();
    assert_eq!((d.store.scheme, d.queue.scheme), (Scheme::Memory, Scheme::Memory));
    assert_eq!(d.describe(), "store=memory queue=memory");
    let side = d.publisher_side();
    assert!(Arc::ptr_eq(&side.store, &d.store.store) && Arc::ptr_eq(&side.queue, &d.queue.queue));

    let def = Definition::builder("hello")
        .step(StepDef::new("a", |_| async { Ok(StepOutcome::complete(json!(1))) }))
        .step(StepDef::new("b", |_| async { Ok(StepOutcome::complete(json!(2))) }).depends_on(["a"]))
        .build()
        .unwrap();
    let config = EngineConfig {
        worker_id: "w".into(),
        poll_interval_ms: DurationMs::from_millis(20),
        ..EngineConfig::default()
    };
    let engine = Engine::builder(d.ports().build().unwrap()).config(config).register(def).build().unwrap();
    let running = engine.spawn();
    let out = engine.publisher().start_or_resume(StartRequest::new("hello", "hello:1", json!({}))).await.unwrap();
    let id = out.instance.workflow_id;
    let mut status = None;
    for _ in 0..500 {
        status = d.store.store.get(&id).await.unwrap().map(|i| i.status);
        if status == Some(WorkflowStatus::Completed) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(running.shutdown().await, "clean shutdown");
    assert_eq!(status, Some(WorkflowStatus::Completed));
    // The observation repository of `memory:` is an in-process one; destroy is a no-op.
    let repo = d.store.observation_repository().await.unwrap();
    assert!(repo.snapshot("hello:1").await.unwrap().is_none());
    d.destroy().await.unwrap();
}
