//! The progress stream is fenced by its owner (K-16, K-6.4): a zombie cannot reset the
//! stream of the worker that took its claim over, nor delete the terminal reference after
//! the workflow ended.

use kernel_core::ports::*;
use kernel_core::*;
use serde_json::json;
use testkit::faults::CrashPlan;
use testkit::harness::World;

/// A streaming step that fails retryably on its first attempt (so the next attempt resets
/// the stream before it re-executes) and completes on the next.
fn streaming() -> Definition {
    let compose = |c: ActivityContext| async move {
        let stream = c.stream().expect("a streaming step has a stream").clone();
        let _ = stream.text(format!("attempt {} by {}", c.attempt(), c.claim_token())).await;
        if c.attempt() == 1 {
            return Err(ActivityError::transient("try again"));
        }
        Ok(StepOutcome::complete(json!("done")))
    };
    Definition::builder("s")
        .step(StepDef::new("compose", compose).resource("r").max_retry(3).streaming())
        .build()
        .expect("valid")
}

/// Defect 11: A is frozen just before its second attempt's permit (so before its stream
/// reset), B takes the claim over after the lease, streams and completes; then A wakes up.
/// Its reset must not wipe B's frames or terminal reference.
#[tokio::test]
async fn a_zombie_cannot_reset_the_new_owners_stream() {
    let world = World::new(11);
    let (a, switch) = world.crashing_engine("A", vec![streaming()], CrashPlan::BeforeNamed("permits.acquire", 1));
    let input = json!({ "object_id": "o-1", "fencing_token": "f1" });
    a.publisher().start_or_resume(StartRequest::new("s", "s:o-1", input).workflow_id("wf-s")).await.unwrap();
    let mut zombie = Box::pin(async { world.drive(&a).await.map(|_| ()) });
    let crashed = tokio::select! { _ = &mut zombie => false, _ = switch.wait_crashed() => true };
    assert!(crashed, "A froze before its second attempt");
    let b = world.engine("B", vec![streaming()]);
    world.drive(&b).await.unwrap();
    let key = StreamKey { object_id: "o-1".into(), workflow_id: "wf-s".into(), fencing_token: "f1".into() };
    let after_b = world.streams.get(&key).expect("stream written");
    assert!(after_b.terminal.is_some(), "B completed the workflow: {after_b:?}");
    assert_eq!(after_b.frames.len(), 1, "B's attempt, alone in its generation: {after_b:?}");
    switch.release();
    zombie.await.unwrap();
    assert_eq!(world.store.peek("wf-s").unwrap().status, WorkflowStatus::Completed);
    assert_eq!(world.streams.get(&key).unwrap(), after_b, "the zombie changed nothing in B's stream");
}
