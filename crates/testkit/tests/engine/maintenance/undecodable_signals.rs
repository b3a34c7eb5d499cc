//! K-9.4: one inbox record that does not decode never stops a maintenance phase. The
//! repair and retention scans page past it, the pass reports it once, and the records
//! behind it are repaired or purged in the same pass.

use crate::support::waits_for_approval;
use kernel_core::engine::EngineConfig;
use kernel_core::ports::*;
use kernel_core::*;
use serde_json::json;
use testkit::harness::{test_config, World};

/// A pending record for the wait of `workflow_id`, as a delivery that stopped after its
/// insert leaves it: only the repair scan can match it.
fn pending(signal_id: &str, workflow_id: &str, created_at: Instant) -> SignalRecord {
    SignalRecord {
        signal_id: signal_id.into(),
        workflow_id: workflow_id.into(),
        signal_type: "approved".into(),
        wait_key: "doc:1".into(),
        generation: 0,
        status: SignalStatus::Pending,
        created_at,
        match_time: None,
        orphan: false,
    }
}

#[tokio::test]
async fn k9_4_repair_pages_past_an_undecodable_record_and_repairs_the_ones_behind_it() {
    let world = World::new(1);
    // Two records a page, so the bad record shares the first page and the rest follow on
    // later pages of the same pass.
    let config = EngineConfig { scan_page_size: 2, ..test_config("w") };
    let engine = world.engine_on(world.ports(), config, vec![waits_for_approval("t")]);
    let workflows = ["wf-1", "wf-2", "wf-3"];
    for (k, id) in workflows.iter().enumerate() {
        let req = StartRequest::new("t", format!("b{k}"), json!({})).workflow_id(*id);
        engine.publisher().start_or_resume(req).await.unwrap();
    }
    world.drive(&engine).await.unwrap();
    assert!(workflows.iter().all(|id| world.store.peek(id).unwrap().status == WorkflowStatus::Waiting));

    // `sig-a` sorts first and does not decode; the three behind it are good.
    world.inbox.plant_undecodable("sig-a", world.now());
    for (k, id) in workflows.iter().enumerate() {
        world.inbox.insert(pending(&format!("sig-b{k}"), id, world.now())).await.unwrap();
    }

    let report = engine.maintain().await.unwrap();
    assert_eq!(report.phases_failed, Vec::<&str>::new(), "no phase failed as a whole");
    assert_eq!(report.signals_repaired, 3, "every good record behind the bad one is repaired: {report:?}");
    assert_eq!(report.undecodable_signals, ["sig-a"], "the bad record is reported once");
    for id in workflows {
        assert_eq!(world.store.peek(id).unwrap().status, WorkflowStatus::Running, "{id} activated");
    }
    for k in 0..3 {
        let rec = world.inbox.get(&format!("sig-b{k}")).await.unwrap().unwrap();
        assert_eq!(rec.status, SignalStatus::Matched);
    }

    // The next pass meets it again and reports it again; nothing else is left to repair.
    let again = engine.maintain().await.unwrap();
    assert_eq!((again.signals_repaired, again.undecodable_signals.as_slice()), (0, ["sig-a".to_string()].as_slice()));
    world.drive(&engine).await.unwrap();
    assert!(workflows.iter().all(|id| world.store.peek(id).unwrap().status == WorkflowStatus::Completed));
}

#[tokio::test]
async fn k9_4_retention_pages_past_an_undecodable_record_and_purges_the_ones_behind_it() {
    let world = World::new(1);
    let engine = world.engine("w", vec![waits_for_approval("t")]);
    let retention = engine.config().signal_retention_ms;
    // Records of a workflow that does not exist, past retention: all may go, but the bad
    // one is not decoded, so it is kept and reported.
    world.inbox.plant_undecodable("sig-a", world.now());
    for id in ["sig-b", "sig-c"] {
        world.inbox.insert(SignalRecord { orphan: true, ..pending(id, "wf-gone", world.now()) }).await.unwrap();
    }
    world.clock.advance(retention);
    world.clock.advance(DurationMs::from_millis(1));

    let report = engine.maintain().await.unwrap();
    assert_eq!(report.phases_failed, Vec::<&str>::new(), "no phase failed as a whole");
    assert_eq!(report.signals_purged, 2, "the records behind the bad one are purged: {report:?}");
    assert_eq!(report.undecodable_signals, ["sig-a"], "met by repair and retention, reported once");
    assert_eq!(world.inbox.all(), vec![], "only the undecodable record is left");
    assert!(world.inbox.get("sig-a").await.is_err(), "kept for an operator");
}
