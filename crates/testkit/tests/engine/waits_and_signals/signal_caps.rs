//! Bounded signals (K-9): signals for unknown workflow ids are capped per id and in total,
//! early signals of a workflow that now exists leave the orphan budget, and the pending
//! signals of a live workflow are capped.

use crate::support::waits_for_approval;
use kernel_core::ports::*;
use kernel_core::*;
use testkit::harness::World;

const DAY_MS: i64 = 24 * 3_600_000;

fn signal(workflow_id: &str, signal_type: &str, generation: u64, id: &str) -> Signal {
    Signal::builder(workflow_id, signal_type).wait_key("doc:1").generation(generation).signal_id(id).build().unwrap()
}

#[tokio::test]
async fn signals_for_an_unknown_workflow_id_are_capped_per_id() {
    // Bounded inbox: pending signals for a workflow id that does not exist are accepted
    // up to orphan_signals_per_workflow_max; one more is a typed error and writes nothing.
    let world = World::new(1);
    let config = EngineConfig { orphan_signals_per_workflow_max: 3, ..testkit::harness::test_config("w") };
    let engine = world.engine_on(world.ports(), config, vec![waits_for_approval("t")]);
    for k in 0..3 {
        let out = engine.deliver_signal(signal("wf-ghost", "approved", 0, &format!("g-{k}"))).await.unwrap();
        assert_eq!(out, DeliverOutcome::Pending);
    }
    let r = engine.deliver_signal(signal("wf-ghost", "approved", 0, "g-3")).await;
    assert!(
        matches!(&r, Err(Error::LimitExceeded { what, max: 3 }) if what == "orphan_signals_per_workflow_max"),
        "{r:?}"
    );
    assert!(world.inbox.get("g-3").await.unwrap().is_none(), "nothing written");
    // A redelivery of a stored one is not a new signal; another id has its own budget.
    assert_eq!(engine.deliver_signal(signal("wf-ghost", "approved", 0, "g-0")).await.unwrap(), DeliverOutcome::Pending);
    assert_eq!(engine.deliver_signal(signal("wf-other", "approved", 0, "o-0")).await.unwrap(), DeliverOutcome::Pending);
    // Signals for an existing workflow are never orphans and never capped this way.
    world.start_as(&engine, "t", "b", "wf-b").await;
    for k in 0..5 {
        engine.deliver_signal(signal("wf-b", "reviewed", 0, &format!("b-{k}"))).await.unwrap();
    }
}

#[tokio::test]
async fn signals_for_unknown_workflow_ids_are_capped_in_total() {
    // Bounded inbox: in total at most orphan_signals_max pending orphans; retention purges
    // them after the retention period, which frees the budget.
    let world = World::new(1);
    let config = EngineConfig { orphan_signals_max: 4, ..testkit::harness::test_config("w") };
    let engine = world.engine_on(world.ports(), config, vec![waits_for_approval("t")]);
    for k in 0..4 {
        engine.deliver_signal(signal(&format!("wf-ghost-{k}"), "approved", 0, &format!("g-{k}"))).await.unwrap();
    }
    let r = engine.deliver_signal(signal("wf-ghost-9", "approved", 0, "g-9")).await;
    assert!(matches!(&r, Err(Error::LimitExceeded { what, max: 4 }) if what == "orphan_signals_max"), "{r:?}");
    assert_eq!(world.inbox.all().len(), 4, "nothing written");
    world.clock.advance(8 * DAY_MS);
    assert_eq!(engine.maintain().await.unwrap().signals_purged, 4, "orphans are purged after retention");
    assert_eq!(
        engine.deliver_signal(signal("wf-ghost-9", "approved", 0, "g-9")).await.unwrap(),
        DeliverOutcome::Pending
    );
}

#[tokio::test]
async fn early_signals_of_a_workflow_that_now_exists_leave_the_orphan_budget() {
    // Bounded inbox: the orphan budget counts signals for workflow ids that do not exist.
    // Early signals kept for a workflow created since (never consumed: its wait is of
    // another type) must not use up the budget of every other unknown id for good.
    let world = World::new(1);
    let config = EngineConfig { orphan_signals_max: 2, ..testkit::harness::test_config("w") };
    let engine = world.engine_on(world.ports(), config, vec![waits_for_approval("t")]);
    for k in 0..2 {
        let out = engine.deliver_signal(signal("wf-x", "reviewed", 0, &format!("x-{k}"))).await.unwrap();
        assert_eq!(out, DeliverOutcome::Pending);
    }
    world.start_as(&engine, "t", "x", "wf-x").await;
    world.drive(&engine).await.unwrap();
    engine.maintain().await.unwrap();
    assert_eq!(
        world.inbox.get("x-0").await.unwrap().map(|r| r.status),
        Some(SignalStatus::Pending),
        "the early signals of the live workflow are kept"
    );
    assert_eq!(
        engine.deliver_signal(signal("wf-y", "approved", 0, "y-0")).await.map_err(|e| e.to_string()),
        Ok(DeliverOutcome::Pending),
        "the budget is free again for an id that does not exist"
    );
}

#[tokio::test]
async fn pending_signals_of_a_live_workflow_are_capped() {
    // K-9.4: pending records of a live workflow that no wait consumes (another type, never
    // awaited) are kept up to pending_signals_per_workflow_max; past retention the oldest
    // beyond it are deleted, the newest kept, and the workflow still wakes.
    let world = World::new(1);
    let config = EngineConfig { pending_signals_per_workflow_max: 2, ..testkit::harness::test_config("w") };
    let engine = world.engine_on(world.ports(), config, vec![waits_for_approval("t")]);
    world.start_as(&engine, "t", "b", "wf-b").await;
    world.drive(&engine).await.unwrap();
    for k in 0..4 {
        let out = engine.deliver_signal(signal("wf-b", "reviewed", 0, &format!("p-{k}"))).await.unwrap();
        assert_eq!(out, DeliverOutcome::Pending);
        world.clock.advance(1);
    }
    engine.maintain().await.unwrap();
    assert_eq!(world.inbox.all().len(), 4, "nothing is deleted within the retention period");
    world.clock.advance(8 * DAY_MS);
    let report = engine.maintain().await.unwrap();
    let mut left: Vec<String> = world.inbox.all().into_iter().map(|r| r.signal_id).collect();
    left.sort();
    assert_eq!(left, ["p-2", "p-3"], "the oldest beyond the cap deleted: {report:?}");
    assert_eq!(report.signals_purged, 2);
    assert_eq!(
        engine.deliver_signal(signal("wf-b", "approved", 0, "a-0")).await.unwrap(),
        DeliverOutcome::Activated,
        "the waiting workflow still wakes"
    );
}
