//! K-7.1: durable writes per completed step on the happy path.

use kernel_core::StartRequest;
use serde_json::json;
use testkit::harness::World;

async fn writes_for(success_finalizer: bool) -> (u64, u64) {
    let world = World::new(1);
    let engine = world.engine("w", vec![crate::linear("linear4", 4, success_finalizer)]);
    engine.publisher().start_or_resume(StartRequest::new("linear4", "b-1", json!({}))).await.unwrap();
    world.audit.reset_traffic(); // count from the claim on: the create belongs to the publisher
    world.drive(&engine).await.unwrap();
    let inst = world.store.all().pop().unwrap();
    assert_eq!(inst.status, kernel_core::WorkflowStatus::Completed);
    assert!(inst.steps.iter().all(|s| s.attempt == 1));
    let c = world.audit.counts();
    println!(
        "write-budget: finalizer={success_finalizer} writes={} reads={} accepted={:?}",
        c.writes, c.reads, c.accepted
    );
    (c.writes, c.reads)
}

#[tokio::test]
async fn four_step_linear_costs_six_writes() {
    let (writes, _reads) = writes_for(false).await;
    assert!(writes <= 6, "claim + start + 3 fused complete/start + fused last/completed = 6, got {writes}");
    assert_eq!(writes, 6);
}

#[tokio::test]
async fn four_step_linear_with_success_finalizer_costs_seven_writes() {
    let (writes, _reads) = writes_for(true).await;
    assert_eq!(writes, 7);
}

#[tokio::test]
async fn fused_writes_still_emit_one_observation_per_transition() {
    let world = World::new(1);
    let engine = world.engine("w", vec![crate::linear("linear4", 4, false)]);
    engine.publisher().start_or_resume(StartRequest::new("linear4", "b-1", json!({}))).await.unwrap();
    world.drive(&engine).await.unwrap();
    use kernel_core::transition::TransitionKind as K;
    let kinds: Vec<K> = world.observations.events().iter().map(|o| o.kind).collect();
    assert_eq!(
        kinds,
        vec![
            K::Create,
            K::Claim,
            K::MarkRunning,
            K::CompleteStep,
            K::MarkRunning,
            K::CompleteStep,
            K::MarkRunning,
            K::CompleteStep,
            K::MarkRunning,
            K::CompleteStep,
            K::Completed
        ]
    );
    // Revisions are the committed ones: fused transitions share a revision.
    let revs: Vec<u64> = world.observations.events().iter().map(|o| o.revision).collect();
    assert_eq!(revs, vec![0, 0, 1, 2, 2, 3, 3, 4, 4, 5, 5]);
}
