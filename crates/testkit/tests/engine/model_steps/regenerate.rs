//! Regenerate (K-17.3): a new epoch of a step and of its dependents that ran, nothing else;
//! bad requests write nothing.

use super::*;
use kernel_core::activity::idempotency_key_at;
use kernel_core::ports::*;
use kernel_core::*;
use serde_json::json;
use std::sync::{Arc, Mutex};
use testkit::harness::World;

// --- operator actions and bounds ----------------------------------------------------------

fn counting(name: &'static str, runs: Arc<Mutex<Vec<(String, String)>>>) -> StepDef {
    StepDef::new(name, move |ctx: ActivityContext| {
        let runs = runs.clone();
        async move {
            runs.lock().unwrap().push((ctx.step_name().to_string(), ctx.idempotency_key()));
            Ok(StepOutcome::complete(json!({ "by": ctx.idempotency_key() })))
        }
    })
}

/// A workflow a → b, c (independent), then `gate` (after b and c) waiting for a signal.
fn gated(runs: Arc<Mutex<Vec<(String, String)>>>) -> Definition {
    let r = runs.clone();
    Definition::builder("gated")
        .step(counting("a", runs.clone()))
        .step(counting("b", runs.clone()).depends_on(["a"]))
        .step(counting("c", runs.clone()).depends_on(Vec::<String>::new()))
        .step(
            StepDef::new("gate", move |ctx: ActivityContext| {
                let r = r.clone();
                async move {
                    r.lock().unwrap().push(("gate".into(), ctx.idempotency_key()));
                    Ok(match ctx.resume() {
                        Some(Resume { kind: ResumeKind::Signal, .. }) => StepOutcome::complete(json!("open")),
                        _ => StepOutcome::wait_for_signal("go", "g-1").generation(u64::from(ctx.epoch())).into(),
                    })
                }
            })
            .depends_on(["b", "c"]),
        )
        .build()
        .unwrap()
}

/// K-17.3 regenerate: the step and its dependents that ran get a new epoch (a new K-17.1
/// key) and run again, their previous results in their history; an independent step does
/// not run again; a terminal instance is refused.
#[tokio::test]
async fn regenerate_reruns_the_step_and_its_dependents_only() {
    let world = World::new(5);
    let runs = Arc::new(Mutex::new(Vec::new()));
    let engine = world.engine("A", vec![gated(runs.clone())]);
    let wf = engine
        .publisher()
        .start_or_resume(StartRequest::new("gated", "biz:g", json!({})))
        .await
        .unwrap()
        .instance
        .workflow_id;
    world.drive(&engine).await.unwrap();
    let before = world.instance(wf.as_str()).await.unwrap();
    assert_eq!(before.status, WorkflowStatus::Waiting);
    let r = engine.regenerate(&wf, "a").await.unwrap().applied().expect("no claim holds it");
    assert_eq!((r.epoch, r.steps.clone(), r.woken), (1, vec!["a".to_string(), "b".into(), "gate".into()], true));
    let after = world.instance(wf.as_str()).await.unwrap();
    assert!(!after.output.contains_key("a") && !after.output.contains_key("b") && after.output.contains_key("c"));
    assert_eq!(
        after.steps[0].history[0].output,
        before.output.get("a").cloned(),
        "the previous result is kept for audit"
    );
    assert_eq!(after.steps[0].history[0].reason, kernel_core::record::HistoryReason::Regenerate);
    assert_eq!(after.steps[1].history[0].reason, kernel_core::record::HistoryReason::Upstream);
    world.drive(&engine).await.unwrap();
    let a = ran(&runs, "a");
    assert_eq!(a.len(), 2);
    assert_eq!(a[1], idempotency_key_at(wf.as_str(), "a", 0, 1), "a new logical attempt has a new key");
    assert_ne!(a[0], a[1]);
    assert_eq!(ran(&runs, "b").len(), 2);
    assert_eq!(ran(&runs, "c").len(), 1, "an independent step never runs again");
    let signal = Signal::builder(wf.clone(), "go").wait_key("g-1").generation(1).signal_id("go-1").build().unwrap();
    engine.deliver_signal(signal).await.unwrap();
    world.drive(&engine).await.unwrap();
    assert_eq!(world.instance(wf.as_str()).await.unwrap().status, WorkflowStatus::Completed);
    assert!(matches!(engine.regenerate(&wf, "a").await, Err(Error::Conflict(_))), "terminal");
}

/// Regenerate refuses with a typed error and writes nothing: an unknown workflow or step,
/// a step that never ran.
#[tokio::test]
async fn regenerate_refuses_bad_requests_and_writes_nothing() {
    let world = World::new(6);
    let runs = Arc::new(Mutex::new(Vec::new()));
    let engine = world.engine("A", vec![gated(runs)]);
    let wf = engine
        .publisher()
        .start_or_resume(StartRequest::new("gated", "biz:g", json!({})))
        .await
        .unwrap()
        .instance
        .workflow_id;
    let before = world.instance(wf.as_str()).await.unwrap();
    assert!(matches!(engine.regenerate(&"wf-nope".into(), "a").await, Err(Error::NotFound(_))));
    assert!(matches!(engine.regenerate(&wf, "zz").await, Err(Error::InvalidInput { .. })));
    assert!(matches!(engine.regenerate(&wf, "a").await, Err(Error::Conflict(_))), "never ran");
    assert!(matches!(engine.regenerate(&wf, "bad\0name").await, Err(Error::InvalidInput { .. })));
    assert_eq!(world.instance(wf.as_str()).await.unwrap(), before, "nothing written");
}

// --- regressions found in review ----------------------------------------------------------

/// Regenerate reaches a dependent declared before the step it depends on (plan order is
/// not dependency order).
#[tokio::test]
async fn regenerate_reaches_a_dependent_declared_before_its_dependency() {
    let world = World::new(13);
    let runs = Arc::new(Mutex::new(Vec::new()));
    let r = runs.clone();
    let def = Definition::builder("back")
        .step(counting("c", runs.clone()).depends_on(["b"]))
        .step(counting("b", runs.clone()).depends_on(["a"]))
        .step(counting("a", runs.clone()).depends_on(Vec::<String>::new()))
        .step(
            StepDef::new("hold", move |ctx: ActivityContext| {
                let r = r.clone();
                async move {
                    r.lock().unwrap().push(("hold".into(), ctx.idempotency_key()));
                    Ok(StepOutcome::wait_for_signal("go", "h").generation(99).into())
                }
            })
            .depends_on(["c"]),
        )
        .build()
        .unwrap();
    let engine = world.engine("A", vec![def]);
    let wf = engine
        .publisher()
        .start_or_resume(StartRequest::new("back", "biz:back", json!({})))
        .await
        .unwrap()
        .instance
        .workflow_id;
    world.drive(&engine).await.unwrap();
    let r = engine.regenerate(&wf, "a").await.unwrap().applied().expect("no claim holds it");
    assert_eq!(
        r.steps,
        vec!["c".to_string(), "b".into(), "a".into(), "hold".into()],
        "c depends on b, which depends on a"
    );
    assert!(r.woken, "the wait was in `hold`, which was reset");
}
