//! Inbox retention (K-9): the pass deletes only terminal, absent, stale and over-cap records,
//! never the pending signals or the duplicate memory of live workflows.

use crate::support::waits_for_approval;
use kernel_core::ports::*;
use kernel_core::*;
use serde_json::json;
use testkit::harness::World;

const DAY_MS: i64 = 24 * 3_600_000;

fn signal(workflow_id: &str, signal_type: &str, generation: u64, id: &str) -> Signal {
    Signal::builder(workflow_id, signal_type).wait_key("doc:1").generation(generation).signal_id(id).build().unwrap()
}

#[tokio::test]
async fn retention_keeps_pending_signals_and_the_duplicate_memory_of_live_workflows() {
    // K-9.3, K-9.4: an early signal for a workflow still busy and the matched record that
    // recognises a producer's redelivery outlive the retention period while the workflow
    // lives.
    let world = World::new(1);
    let engine = world.engine("w", vec![waits_for_approval("t")]);
    let publisher = engine.publisher();
    publisher.start_or_resume(StartRequest::new("t", "a", json!({})).workflow_id("wf-a")).await.unwrap();
    publisher.start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf-b")).await.unwrap();
    world.drive(&engine).await.unwrap();
    // wf-a's wait is matched; the producer keeps the id and may redeliver.
    assert_eq!(engine.deliver_signal(signal("wf-a", "approved", 0, "sig-a")).await.unwrap(), DeliverOutcome::Activated);
    // An early signal for wf-b's next wait (another type): pending until that wait starts.
    assert_eq!(engine.deliver_signal(signal("wf-b", "reviewed", 0, "sig-b")).await.unwrap(), DeliverOutcome::Pending);
    // wf-a runs on (still live: parked on a long claim lease), wf-b waits.
    world.clock.advance(8 * DAY_MS);
    engine.maintain().await.unwrap();
    assert_eq!(
        world.inbox.get("sig-b").await.unwrap().map(|r| r.status),
        Some(SignalStatus::Pending),
        "a pending signal of a live workflow is kept"
    );
    assert_eq!(world.store.peek("wf-a").unwrap().status, WorkflowStatus::Running, "wf-a is live");
    assert!(world.inbox.get("sig-a").await.unwrap().is_some(), "the duplicate memory of a live workflow is kept");
    assert_eq!(
        engine.deliver_signal(signal("wf-a", "approved", 0, "sig-a")).await.unwrap(),
        DeliverOutcome::Duplicate,
        "the redelivery is recognised"
    );
    assert_eq!(
        engine.deliver_signal(signal("wf-b", "approved", 0, "sig-b2")).await.unwrap(),
        DeliverOutcome::Activated,
        "the waiting workflow still wakes"
    );
}

#[tokio::test]
async fn retention_deletes_only_terminal_absent_stale_and_over_cap_records() {
    // K-9.4: what retention may delete, and only once past the retention period.
    let world = World::new(1);
    let config = EngineConfig { matched_signals_per_workflow_max: 2, ..testkit::harness::test_config("w") };
    let engine = world.engine_on(world.ports(), config, vec![waits_for_approval("t")]);
    let publisher = engine.publisher();
    for id in ["wf-done", "wf-live", "wf-many"] {
        publisher.start_or_resume(StartRequest::new("t", id, json!({})).workflow_id(id)).await.unwrap();
    }
    world.drive(&engine).await.unwrap();
    // wf-done: matched, then completed; a stray pending record too.
    engine.deliver_signal(signal("wf-done", "approved", 0, "done-1")).await.unwrap();
    engine.deliver_signal(signal("wf-done", "reviewed", 0, "done-2")).await.unwrap();
    // An orphan: no such workflow.
    assert_eq!(
        engine.deliver_signal(signal("wf-ghost", "approved", 0, "ghost-1")).await.unwrap(),
        DeliverOutcome::Pending
    );
    world.drive(&engine).await.unwrap();
    assert_eq!(world.store.peek("wf-done").unwrap().status, WorkflowStatus::Completed);
    // wf-many: five old matched records (inserted as facts) and its wait on generation 0.
    for k in 0..5 {
        let r = SignalRecord {
            signal_id: format!("many-{k}"),
            workflow_id: "wf-many".into(),
            signal_type: "approved".into(),
            wait_key: "doc:1".into(),
            generation: 0,
            status: SignalStatus::Matched,
            created_at: world.now().saturating_sub(DurationMs::from_millis(k)),
            match_time: Some(world.now()),
            orphan: false,
        };
        world.inbox.insert(r).await.unwrap();
    }
    let before = world.inbox.all().len();
    engine.maintain().await.unwrap();
    assert_eq!(world.inbox.all().len(), before, "nothing is deleted within the retention period");

    world.clock.advance(8 * DAY_MS);
    let report = engine.maintain().await.unwrap();
    let mut left: Vec<String> = world.inbox.all().into_iter().map(|r| r.signal_id).collect();
    left.sort();
    assert_eq!(left, ["many-0", "many-1"], "terminal, absent and over-cap records deleted: {report:?}");
    assert_eq!(report.signals_purged, 6);
    // wf-live's wait is still there and a new signal wakes it.
    assert_eq!(
        engine.deliver_signal(signal("wf-live", "approved", 0, "live-1")).await.unwrap(),
        DeliverOutcome::Activated
    );
}

#[tokio::test]
async fn retention_deletes_pending_records_of_an_older_generation() {
    // K-9.6, K-9.4: a pending record older than the workflow's current wait generation can
    // never match; one of the current or a newer generation is kept.
    let world = World::new(1);
    let def = Definition::builder("t")
        .step(StepDef::new("ask", |c: ActivityContext| async move {
            if c.resume().is_some() {
                return Ok(StepOutcome::complete(json!("ok")));
            }
            Ok(StepOutcome::wait_for_signal("approved", "doc:1").generation(3).into())
        }))
        .build()
        .unwrap();
    let engine = world.engine("w", vec![def]);
    world.start_as(&engine, "t", "b", "wf-b").await;
    world.drive(&engine).await.unwrap();
    for (id, g) in [("old-1", 1), ("old-2", 2), ("next-4", 4)] {
        assert_eq!(engine.deliver_signal(signal("wf-b", "approved", g, id)).await.unwrap(), DeliverOutcome::Pending);
    }
    world.clock.advance(8 * DAY_MS);
    let report = engine.maintain().await.unwrap();
    assert_eq!(report.signals_purged, 2);
    let left: Vec<String> = world.inbox.all().into_iter().map(|r| r.signal_id).collect();
    assert_eq!(left, ["next-4"]);
}
