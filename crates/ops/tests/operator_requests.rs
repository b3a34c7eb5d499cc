//! Operator actions on an instance a worker's claim holds (K-6.8), through the operator
//! surface: the answer says the action was requested, and the instance's view — what
//! `wfk show` prints and the console renders — shows the pending request until its holder
//! applies it.

use kernel_core::engine::RoundOutcome;
use kernel_core::*;
use observer::InMemoryObservationRepository;
use ops::{Actor, Ops, OpsParts};
use serde_json::json;
use std::sync::Arc;
use testkit::harness::World;
use tokio::sync::Semaphore;

/// `hold` waits for its gate or its cancellation.
fn held(gate: &Arc<Semaphore>) -> Definition {
    let g = gate.clone();
    Definition::builder("held")
        .step(
            StepDef::new("hold", move |c: ActivityContext| {
                let g = g.clone();
                async move {
                    tokio::select! {
                        p = g.acquire() => { p.expect("gate").forget(); Ok(StepOutcome::complete(json!("done"))) }
                        _ = c.cancellation().cancelled() => Err(ActivityError::transient("canceled")),
                    }
                }
            })
            .timeout_ms(3_600_000),
        )
        .build()
        .unwrap()
}

async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// K-6.8: a cancel through the operator surface while a worker runs the workflow is a
/// request: the answer says so, `show` lists it with the claim it waits for, and once the
/// holder's next heartbeat misses it applies the cancel and the view no longer lists it.
#[tokio::test(flavor = "current_thread")]
async fn a_cancel_under_a_live_claim_is_shown_as_requested_until_its_holder_applies_it() {
    let world = World::new(5);
    let gate = Arc::new(Semaphore::new(0));
    let worker = world.engine("w", vec![held(&gate)]);
    let req = StartRequest::new("held", "h-1", json!({})).workflow_id("wf-h-1");
    worker.publisher().start_or_resume(req).await.unwrap();
    let w = worker.clone();
    let claim = tokio::spawn(async move { w.tick().await });
    settle().await;
    let ops = Ops::from_parts(OpsParts {
        ports: world.ports(),
        repo: Arc::new(InMemoryObservationRepository::new()),
        definitions: vec![held(&gate)],
        dispatch: None,
        schema: "memory".into(),
    })
    .unwrap();

    let done = ops.cancel(&Actor::operator("ops-alice"), "wf-h-1").await.unwrap();
    assert_eq!(done.detail["outcome"], "requested", "{done:?}");
    let request_id = done.detail["request_id"].as_str().expect("the request's id").to_string();
    let view = ops.show("wf-h-1").await.unwrap();
    let pending = view.pending_request.clone().expect("the view lists the pending request");
    assert_eq!((pending.id.as_str(), pending.action.as_str(), pending.step), (request_id.as_str(), "cancel", None));
    assert_eq!(view.status, WorkflowStatus::Running, "nothing taken from the holder yet");
    // What the console renders: the view's JSON.
    let rendered = serde_json::to_value(&view).unwrap();
    assert_eq!(rendered["pending_request"]["action"], "cancel");

    world.clock.advance(10_000);
    settle().await;
    let out = claim.await.unwrap().unwrap();
    assert!(matches!(out, RoundOutcome::Ran { .. }), "{out:?}");
    let after = ops.show("wf-h-1").await.unwrap();
    assert_eq!((after.status, after.pending_request), (WorkflowStatus::Canceled, None));
}
