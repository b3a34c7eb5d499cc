//! The simulated story (`live_summary --simulated`): in memory, in simulated time, one
//! process; it fails unless every workflow completes and every result is done.

use kernel_examples::story;
use testkit::harness::World;

#[tokio::test]
async fn the_simulated_story_completes_with_every_result_done() {
    let world = World::with_limits(42, story::limits());
    story::run(world.clone()).await.expect("the story finishes");
    let instances = world.instances().await.expect("instances");
    assert_eq!(instances.len(), 3, "two summaries and the fan-out");
    assert!(instances.iter().all(|i| i.status == kernel_core::WorkflowStatus::Completed));
}
