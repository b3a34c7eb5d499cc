//! The decorators measure without changing behaviour: the figures match independent
//! oracles read from the store and the drive report, labels stay bounded, and the set of
//! metric names and label keys is pinned.

use crate::support::*;
use kernel_core::domain::{StepStatus, WorkflowStatus};
use kernel_core::ports::{DynQueue, DynStore};
use kernel_core::WorkflowId;
use kernel_metrics::{poll_lanes, MeteredQueue, MeteredStore, Metrics, LANES, RESOURCE_LABELS_MAX};
use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use testkit::faults::WriteOp;

/// K-15, K-6.4: every counter equals what the durable facts say happened.
#[tokio::test]
async fn counters_match_the_store_and_the_drive_report() {
    let world = world(3);
    let metrics = Arc::new(Metrics::new());
    let engine = metered_engine(&world, &metrics);
    let report = run(&world, &engine, 12, 0).await;
    let text = metrics.render();
    let all = world.instances().await.unwrap();
    assert_eq!(all.len(), 12);
    assert!(all.iter().all(|i| i.status == WorkflowStatus::Completed), "every workflow completes");

    // Claims won: every claim the drive ran went through a won store claim.
    assert_eq!(value(&text, "wfk_claims_total", &[("result", "won")]) as usize, report.claims());
    // Steps completed: the completed steps in the store (no replays, one epoch each).
    let completed_steps = all.iter().flat_map(|i| &i.steps).filter(|s| s.status == StepStatus::Completed).count();
    assert_eq!(completed_steps, 24);
    assert_eq!(value(&text, "wfk_steps_total", &[("outcome", "completed")]) as usize, completed_steps);
    // Retries: one per flaky workflow (every third), each recorded as an attempt in the store.
    let extra_attempts: u32 = all.iter().map(|i| i.steps[0].attempt.saturating_sub(1)).sum();
    assert_eq!(extra_attempts, 4);
    assert_eq!(value(&text, "wfk_retries_total", &[]) as u32, extra_attempts);
    assert_eq!(value(&text, "wfk_steps_total", &[("outcome", "retry")]) as u32, extra_attempts);
    // Permit denials: the traffic waits the store counted on the `hot` steps.
    let denials: u32 = all.iter().map(|i| i.steps[0].traffic_waits).sum();
    assert!(denials > 0, "one start per second must deny some");
    assert_eq!(value(&text, "wfk_permit_denied_total", &[("resource", HOT)]) as u32, denials);
    assert_eq!(value(&text, "wfk_steps_total", &[("outcome", "deferred")]) as u32, denials);
    // Permits held by this process: none once every activity returned.
    assert_eq!(value(&text, "wfk_permit_in_use", &[("resource", HOT)]), 0.0);
    // Store calls: the audit below the metered store saw exactly the applies counted.
    let applies = world.audit.log().iter().filter(|w| w.op == WriteOp::Apply).count();
    assert_eq!(value(&text, "wfk_store_call_seconds_count", &[("op", "apply")]) as usize, applies);
    let creates = world.audit.log().iter().filter(|w| w.op == WriteOp::Create).count();
    assert_eq!(value(&text, "wfk_store_call_seconds_count", &[("op", "create")]) as usize, creates);
    // Step durations: one per finished step.
    assert_eq!(value(&text, "wfk_step_duration_seconds_count", &[]) as usize, completed_steps);
    // Queue waits: every create was followed by a claim.
    assert!(value(&text, "wfk_wait_duration_seconds_count", &[("kind", "queue")]) >= 12.0);
    // No errors in a healthy run.
    assert_eq!(value(&text, "wfk_store_errors_total", &[]), 0.0);
    assert_eq!(value(&text, "wfk_coord_errors_total", &[]), 0.0);
}

/// A stale-token write (a zombie's) is counted as refused; other misses are not.
#[tokio::test]
async fn a_token_guarded_miss_counts_as_a_stale_write() {
    use kernel_core::transition::{Guard, Transition};
    let world = world(4);
    let metrics = Arc::new(Metrics::new());
    let engine = metered_engine(&world, &metrics);
    run(&world, &engine, 1, 0).await;
    let store = MeteredStore::new(world.ports().store, metrics.clone());
    let id = WorkflowId::from(workflow_id(0).as_str());
    let stale = Guard::Running { token: "zombie-token".into() };
    let t = Transition::release(world.now());
    let out = kernel_core::ports::WorkflowStore::apply(&store, &id, &stale, &t).await.unwrap();
    assert!(!out.applied());
    assert_eq!(value(&metrics.render(), "wfk_stale_writes_refused_total", &[]), 1.0);
}

/// The same seed with and without the decorators ends in identical instances: they
/// measure and change nothing.
#[tokio::test]
async fn metered_and_bare_runs_end_identically() {
    let bare = world(5);
    let engine = bare.engine("A", vec![definition()]);
    let bare_report = run(&bare, &engine, 9, 0).await;
    let metered_world = world(5);
    let metrics = Arc::new(Metrics::new());
    let engine = metered_engine(&metered_world, &metrics);
    let metered_report = run(&metered_world, &engine, 9, 0).await;
    assert_eq!(bare_report, metered_report);
    let key = |mut v: Vec<kernel_core::WorkflowInstance>| {
        v.sort_by(|a, b| a.workflow_id.cmp(&b.workflow_id));
        v
    };
    assert_eq!(key(bare.instances().await.unwrap()), key(metered_world.instances().await.unwrap()));
    assert_eq!(bare.audit.log(), metered_world.audit.log());
    assert_eq!(
        bare.observations.events(),
        metered_world.observations.events(),
        "the inner sink sees the same observations"
    );
}

/// 200 workflows over 100 resources: bounded label sets, and no label value is a
/// workflow id.
#[tokio::test]
async fn labels_stay_bounded_and_never_name_a_workflow() {
    let world = world(6);
    let metrics = Arc::new(Metrics::new());
    let engine = metered_engine(&world, &metrics);
    run(&world, &engine, 200, 100).await;
    let text = metrics.render();
    let samples = samples(&text);
    let ids: HashSet<String> = (0..200).map(workflow_id).collect();
    for s in &samples {
        for (k, v) in &s.labels {
            assert!(!ids.contains(v), "label {k}={v} of {} names a workflow", s.name);
            assert!(!v.starts_with("biz-"), "label {k}={v} of {} names a biz key", s.name);
        }
    }
    let resources: BTreeSet<&str> =
        samples.iter().filter_map(|s| s.labels.get("resource")).map(String::as_str).collect();
    assert_eq!(resources.len(), RESOURCE_LABELS_MAX + 1, "{resources:?}");
    assert!(resources.contains("other"));
    // Every other label has a fixed set of values.
    let fixed = |key: &str| -> BTreeSet<String> { samples.iter().filter_map(|s| s.labels.get(key)).cloned().collect() };
    assert!(fixed("result").is_subset(&["won", "missed"].map(String::from).into()));
    assert!(fixed("outcome").len() <= 9);
    assert!(fixed("op").len() <= 17);
    // The number of series is bounded independently of the workflow count.
    assert!(samples.len() < 1_500, "{} samples", samples.len());
    let accepted_claims = world.audit.counts().accepted.get("claim").copied().unwrap_or(0);
    assert_eq!(value(&text, "wfk_claims_total", &[("result", "won")]) as u64, accepted_claims);
}

/// Lanes and observer gauges.
#[tokio::test]
async fn lane_and_observer_gauges_follow_their_sources() {
    let world = world(7);
    let metrics = Arc::new(Metrics::new());
    let queue: Arc<DynQueue> = Arc::new(MeteredQueue::new(Arc::new(world.queue.clone()), metrics.clone()));
    let now = world.now();
    queue.enqueue(&"a".into(), kernel_core::domain::Priority::P0, now).await.unwrap();
    queue.enqueue(&"b".into(), kernel_core::domain::Priority::P3, now).await.unwrap();
    queue.enqueue(&"c".into(), kernel_core::domain::Priority::P3, now).await.unwrap();
    world.clock.advance(kernel_core::domain::DurationMs::from_millis(2_500));
    poll_lanes(&metrics, &*queue, &*world.clock).await.unwrap();
    let text = metrics.render();
    assert_eq!(value(&text, "wfk_lane_depth", &[("lane", LANES[0])]), 1.0);
    assert_eq!(value(&text, "wfk_lane_depth", &[("lane", LANES[1])]), 0.0);
    assert_eq!(value(&text, "wfk_lane_depth", &[("lane", LANES[3])]), 2.0);
    assert_eq!(value(&text, "wfk_lane_oldest_due_seconds", &[("lane", LANES[3])]), 2.5);
    metrics.record_observer(&observer::ObserverStats { queue_len: 4, dropped: 2, ..Default::default() });
    let text = metrics.render();
    assert_eq!(value(&text, "wfk_observation_queue_depth", &[]), 4.0);
    assert_eq!(value(&text, "wfk_observation_dropped_total", &[]), 2.0);
}

/// The metric names, types and label keys, pinned: a change here changes every dashboard
/// built on them. Update `tests/it/snapshots/metric_names.txt` (`UPDATE_SNAPSHOTS=1`) only
/// on purpose.
#[tokio::test]
async fn metric_names_and_label_keys_snapshot() {
    let world = world(8);
    let metrics = Arc::new(Metrics::new());
    let engine = metered_engine(&world, &metrics);
    run(&world, &engine, 3, 0).await;
    // One error of each kind of port, so their families have samples.
    let store: Arc<DynStore> = Arc::new(MeteredStore::new(world.ports().store, metrics.clone()));
    store.get(&WorkflowId::from("bad\nid")).await.expect_err("refused id");
    let queue: Arc<DynQueue> = Arc::new(MeteredQueue::new(Arc::new(world.queue.clone()), metrics.clone()));
    queue.pop_due(world.now(), 0).await.expect_err("refused max");
    poll_lanes(&metrics, &*queue, &*world.clock).await.unwrap();
    metrics.record_observer(&observer::ObserverStats::default());
    let text = metrics.render();
    let mut lines: BTreeSet<String> =
        text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).map(|l| format!("TYPE {l}")).collect();
    for s in samples(&text) {
        let keys: Vec<&str> = s.labels.keys().map(String::as_str).filter(|k| *k != "le").collect();
        lines.insert(format!("{}{{{}}}", s.name, keys.join(",")));
    }
    let actual: String = lines.into_iter().map(|l| l + "\n").collect();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/snapshots/metric_names.txt");
    if std::env::var("UPDATE_SNAPSHOTS").is_ok_and(|v| v == "1") {
        std::fs::write(path, &actual).unwrap();
    }
    let expected = std::fs::read_to_string(path).expect("snapshot file (UPDATE_SNAPSHOTS=1 writes it)");
    assert_eq!(actual, expected, "metric names changed; rerun with UPDATE_SNAPSHOTS=1 if intended");
}
