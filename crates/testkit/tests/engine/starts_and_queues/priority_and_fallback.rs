//! Starts and the ready lanes (K-5, K-13): a priority is promote-only, a queue outage falls
//! back to the store and a flushed queue is rebuilt.

use crate::support::start;
use kernel_core::engine::RoundOutcome;
use kernel_core::*;
use serde_json::json;
use testkit::harness::World;

#[tokio::test]
async fn priority_is_promote_only() {
    // K-5, K-13
    let world = World::new(1);
    let engine = world.engine("w", vec![crate::linear("t", 1, false)]);
    let p = engine.publisher();
    p.start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf-b").priority(Priority::P3)).await.unwrap();
    assert_eq!(world.queue.lane_of("wf-b"), Some(Priority::P3));
    p.start_or_resume(StartRequest::new("t", "b", json!({})).priority(Priority::P1)).await.unwrap();
    assert_eq!(world.store.peek("wf-b").unwrap().business_priority, Priority::P1);
    assert_eq!(world.queue.lane_of("wf-b"), Some(Priority::P1));
    p.start_or_resume(StartRequest::new("t", "b", json!({})).priority(Priority::P3)).await.unwrap();
    assert_eq!(world.store.peek("wf-b").unwrap().business_priority, Priority::P1);
    assert_eq!(world.queue.lane_of("wf-b"), Some(Priority::P1));
}

#[tokio::test]
async fn queue_down_falls_back_to_the_store_and_a_flush_is_rebuilt() {
    // K-6.7, K-13
    let world = World::new(1);
    let engine = world.engine("w", vec![crate::linear("t", 2, false)]);
    start(&engine, "t", "a", json!({})).await;
    start(&engine, "t", "b", json!({})).await;
    world.queue.set_down(true);
    assert!(matches!(engine.tick().await.unwrap(), RoundOutcome::Ran { .. }), "claimed straight from the store");
    world.queue.set_down(false);
    world.queue.flush();
    assert!(matches!(engine.tick().await.unwrap(), RoundOutcome::Idle { .. }));
    let rep = engine.maintain().await.unwrap();
    assert!(rep.enqueued >= 1);
    world.drive(&engine).await.unwrap();
    assert!(world.store.all().iter().all(|i| i.status == WorkflowStatus::Completed));
}
