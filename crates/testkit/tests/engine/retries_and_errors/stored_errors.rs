//! Text the kernel stores from activities is normalized by the kernel (K-2.0 amendment):
//! an error message with control characters is kept printable before any store sees it,
//! so a transient error is retried the same way on every store (PostgreSQL refuses NUL in
//! text; the in-memory and SQLite stores keep it).

use kernel_core::*;
use serde_json::json;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use testkit::harness::World;

#[tokio::test]
async fn a_transient_error_with_control_characters_is_stored_printable_and_retried() {
    let world = World::new(41);
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let flaky = move |_ctx: ActivityContext| {
        let c = c.clone();
        async move {
            if c.fetch_add(1, Ordering::SeqCst) < 2 {
                return Err(ActivityError::transient("gateway said \u{0}busy\nretry"));
            }
            Ok(StepOutcome::complete(json!("ok")))
        }
    };
    let def = Definition::builder("t").step(StepDef::new("call", flaky).max_retry(3)).build().unwrap();
    let engine = world.engine("w", vec![def]);
    world.start_as(&engine, "t", "b", "wf").await;
    engine.tick().await.unwrap();
    let stored = world.store.peek("wf").unwrap().steps[0].error.clone().expect("the retry's error is stored");
    assert_eq!((stored.class, stored.message.as_str()), (ErrorClass::Transient, "gateway said  busy retry"));
    world.drive(&engine).await.unwrap();
    let inst = world.store.peek("wf").unwrap();
    assert_eq!((inst.status, calls.load(Ordering::SeqCst)), (WorkflowStatus::Completed, 3));
}
