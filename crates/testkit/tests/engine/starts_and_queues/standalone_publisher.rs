//! A publisher built from the store, the queue and the wakeup alone (K-5, K-4.1).

use kernel_core::ports::*;
use kernel_core::transition::TransitionKind;
use kernel_core::*;
use serde_json::json;
use std::sync::Arc;
use testkit::harness::{RecordingSink, World};

#[tokio::test]
async fn a_publisher_needs_only_store_queue_and_wakeup() {
    // K-5 (create, enqueue + wakeup), K-4.1 (publishers register plans)
    let world = World::new(1);
    let def = crate::linear("t", 2, false);
    let plan = def.plan().clone();
    let ports = world.ports();
    let publisher =
        Publisher::builder(ports.store.clone(), ports.queue.clone(), ports.wakeup.clone()).plan(plan).build().unwrap();
    let before = SystemClock.now();
    let out = publisher.start_or_resume(StartRequest::new("t", "b", json!({ "n": 1 }))).await.unwrap();
    assert!(out.created && out.execution_activated);
    let i = &out.instance;
    // Defaults: random ids and the system clock, not the world's.
    assert!(i.workflow_id.starts_with("wf-") && !i.workflow_id.starts_with("wf-t-"), "{}", i.workflow_id);
    assert!(i.created_at >= before && i.created_at <= SystemClock.now(), "system clock");
    assert!(!world.queue.is_empty(), "enqueued");
    assert!(world.observations.events().is_empty(), "no-op observation sink by default");
    // Unknown types and bad inputs are refused as with an engine's publisher.
    let r = publisher.start_or_resume(StartRequest::new("nope", "c", json!({}))).await;
    assert!(matches!(r, Err(Error::UnregisteredType(_))), "{r:?}");
    assert!(matches!(
        Publisher::builder(ports.store.clone(), ports.queue.clone(), ports.wakeup.clone()).payload_bytes_max(0).build(),
        Err(Error::InvalidInput { .. })
    ));
}

#[tokio::test]
async fn a_standalone_publisher_with_overrides_starts_what_an_engine_runs() {
    // K-5, K-15: the create observation is the same as from an engine's publisher.
    let world = World::new(1);
    let def = crate::linear("t", 2, false);
    let engine = world.engine("w", vec![def.clone()]);
    let ports = world.ports();
    let sink = RecordingSink::default();
    let publisher = Publisher::builder(ports.store.clone(), ports.queue.clone(), ports.wakeup.clone())
        .clock(ports.clock.clone())
        .ids(ports.ids.clone())
        .observer(Arc::new(sink.clone()))
        .stream(ports.stream.clone())
        .plan(def.plan().clone())
        .payload_bytes_max(16)
        .build()
        .unwrap();
    let r = publisher.start_or_resume(StartRequest::new("t", "big", json!({ "text": "x".repeat(32) }))).await;
    assert!(matches!(r, Err(Error::InvalidInput { ref field, .. }) if field == "input"), "{r:?}");
    let out = publisher.start_or_resume(StartRequest::new("t", "b", json!({}))).await.unwrap();
    assert_eq!(out.instance.workflow_id, "wf-t-000001", "ids from the override");
    assert_eq!(out.instance.created_at, world.now(), "clock from the override");
    let via_engine = engine.publisher().start_or_resume(StartRequest::new("t", "c", json!({}))).await.unwrap();
    let created = sink.events();
    assert_eq!(created.len(), 1);
    assert_eq!((created[0].kind, created[0].worker_id.clone()), (TransitionKind::Create, None));
    let from_engine = world.observations.events();
    let mut expect = created[0].clone();
    expect.workflow_id = via_engine.instance.workflow_id.clone();
    expect.biz_key = "c".into();
    assert_eq!(from_engine, vec![expect], "one Observation shape for both publishers");
    world.drive(&engine).await.unwrap();
    assert_eq!(world.store.peek(&out.instance.workflow_id).unwrap().status, WorkflowStatus::Completed);
}

#[tokio::test]
async fn an_operator_replay_needs_no_plan_and_refuses_what_k5_keeps() {
    // K-5 (failed → replay by one CAS), K-11.4 (a failed round is never replayed under its
    // own round), K-15 (the replay is observed)
    let world = World::new(1);
    let def = Definition::builder("t")
        .step(StepDef::new("a", |c: ActivityContext| async move {
            if c.input()["fail"] == json!(true) && c.idempotency_key().ends_with("|0") {
                Err(ActivityError::permanent("bad input"))
            } else {
                Ok(StepOutcome::complete(json!("a")))
            }
        }))
        .build()
        .unwrap();
    let engine = world.engine("w", vec![def]);
    let ports = world.ports();
    // A publisher with no plan at all: the replay reads the stored input.
    let publisher = Publisher::builder(ports.store.clone(), ports.queue.clone(), ports.wakeup.clone())
        .observer(ports.observer.clone())
        .build()
        .unwrap();
    engine
        .publisher()
        .start_or_resume(StartRequest::new("t", "b", json!({ "fail": true })).workflow_id("wf-b"))
        .await
        .unwrap();
    engine
        .publisher()
        .start_or_resume(
            StartRequest::new("t", "r", json!({ "fail": true, "fencing_token": "f1", "object_id": "o1" }))
                .workflow_id("wf-r"),
        )
        .await
        .unwrap();
    let id: WorkflowId = "wf-b".into();
    // Not failed yet: refused, nothing written.
    let before = world.store.peek("wf-b").unwrap().revision;
    assert!(matches!(publisher.replay(&id).await, Err(Error::Conflict(_))));
    assert_eq!(world.store.peek("wf-b").unwrap().revision, before);
    world.drive(&engine).await.unwrap();
    assert_eq!(world.store.peek("wf-b").unwrap().status, WorkflowStatus::Failed);
    let run = publisher.replay(&id).await.unwrap();
    assert_eq!((run.status, run.retry_count), (WorkflowStatus::Running, 1));
    assert!(world.observations.events().iter().any(|o| o.workflow_id == id && o.kind == TransitionKind::Replay));
    // A second replay finds it running: refused.
    assert!(matches!(publisher.replay(&id).await, Err(Error::Conflict(_))));
    world.drive(&engine).await.unwrap();
    assert_eq!(world.store.peek("wf-b").unwrap().status, WorkflowStatus::Completed);
    // The instance of a dispatch round stays failed; the refusal names retry-failed.
    let round: WorkflowId = "wf-r".into();
    assert_eq!(world.store.peek("wf-r").unwrap().status, WorkflowStatus::Failed);
    match publisher.replay(&round).await {
        Err(Error::Conflict(m)) => assert!(m.contains("retry-failed") && m.contains("f1"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(world.store.peek("wf-r").unwrap().status, WorkflowStatus::Failed);
    assert!(matches!(publisher.replay(&"wf-none".into()).await, Err(Error::NotFound(_))));
    assert!(matches!(publisher.replay(&"bad\nid".into()).await, Err(Error::InvalidInput { .. })));
}
