//! Cancel and replay (K-8, K-10): a cancel is idempotent and a late signal does not revive,
//! an activity's cancellation cancels the workflow, a failed replay keeps completed steps.

use crate::support::{sig, signal_waiter, start, tick_end};
use kernel_core::engine::ClaimEnd;
use kernel_core::ports::*;
use kernel_core::*;
use serde_json::json;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use testkit::harness::World;

#[tokio::test]
async fn cancel_is_idempotent_and_a_late_signal_does_not_revive() {
    // K-8 (cancel / supersede)
    let world = World::new(1);
    let engine = world.engine("w", vec![signal_waiter(Arc::new(Mutex::new(false)), 0, None)]);
    start(&engine, "sig", "b", json!({})).await;
    tick_end(&engine).await;
    assert_eq!(engine.cancel(&"wf-b".into()).await.unwrap(), CancelOutcome::Canceled);
    assert_eq!(engine.cancel(&"wf-b".into()).await.unwrap(), CancelOutcome::NotActive);
    assert_eq!(engine.cancel(&"wf-missing".into()).await.unwrap(), CancelOutcome::NotActive);
    assert_eq!(engine.deliver_signal(sig("late", 0)).await.unwrap(), DeliverOutcome::Pending);
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!((i.status, i.wait.clone(), i.claim_token.clone()), (WorkflowStatus::Canceled, None, None));
}

#[tokio::test]
async fn activity_cancellation_cancels_the_workflow_without_finalizer() {
    // K-7.4 (1)
    let world = World::new(1);
    let finalized = Arc::new(AtomicU32::new(0));
    let f = finalized.clone();
    let def = Definition::builder("t")
        .step(
            StepDef::new("a", |_c: ActivityContext| async {
                Err::<StepOutcome, _>(ActivityError::canceled("object deleted"))
            })
            .max_retry(3),
        )
        .failure_finalizer(move |_c: ActivityContext| {
            let f = f.clone();
            async move {
                f.fetch_add(1, Ordering::SeqCst);
                Ok(StepOutcome::complete(json!(null)))
            }
        })
        .build()
        .unwrap();
    let engine = world.engine("w", vec![def]);
    start(&engine, "t", "b", json!({})).await;
    assert_eq!(tick_end(&engine).await, ClaimEnd::Terminal(WorkflowStatus::Canceled));
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!((i.steps[0].status, i.steps[0].attempt), (StepStatus::Skipped, 1));
    assert_eq!(finalized.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn failed_replay_keeps_completed_steps_and_only_one_replay_wins() {
    // K-5 (failed → replay), K-2.1, K-17.1
    let world = World::new(1);
    let keys: Arc<Mutex<Vec<String>>> = Arc::default();
    let k = keys.clone();
    let def = Definition::builder("t")
        .step(StepDef::new("a", |_c: ActivityContext| async { Ok(StepOutcome::complete(json!("a"))) }))
        .step(StepDef::new("b", move |c: ActivityContext| {
            let k = k.clone();
            async move {
                k.lock().unwrap().push(c.idempotency_key());
                if c.input()["fail"] == json!(true) {
                    Err(ActivityError::permanent("bad input"))
                } else {
                    Ok(StepOutcome::complete(json!("b")))
                }
            }
        }))
        .failure_finalizer(|_c: ActivityContext| async { Ok(StepOutcome::complete(json!(null))) })
        .build()
        .unwrap();
    let engine = world.engine("w", vec![def]);
    start(&engine, "t", "b", json!({ "fail": true })).await;
    world.drive(&engine).await.unwrap();
    let failed = world.store.peek("wf-b").unwrap();
    assert_eq!(failed.status, WorkflowStatus::Failed);
    // Failing/terminal: a start in `failing` would not activate; here the replay does.
    let p = engine.publisher();
    let (r1, r2) = tokio::join!(
        p.start_or_resume(StartRequest::new("t", "b", json!({ "fail": false }))),
        p.start_or_resume(StartRequest::new("t", "b", json!({ "fail": false })))
    );
    let (r1, r2) = (r1.unwrap(), r2.unwrap());
    assert_eq!([r1.execution_activated, r2.execution_activated].iter().filter(|a| **a).count(), 1, "one replay winner");
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!((i.status, i.retry_count), (WorkflowStatus::Running, 1));
    assert_eq!(i.steps[0].status, StepStatus::Completed, "completed steps kept");
    assert_eq!((i.steps[1].status, i.steps[1].attempt, i.steps[1].error.clone()), (StepStatus::Pending, 0, None));
    world.drive(&engine).await.unwrap();
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!(i.status, WorkflowStatus::Completed);
    let keys = keys.lock().unwrap().clone();
    assert_eq!(keys, vec!["4:wf-b|1:b|0".to_string(), "4:wf-b|1:b|1".to_string()], "a new logical attempt per round");
}
