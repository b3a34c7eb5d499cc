//! The crash-window sweep (issue acceptance: every persistence boundary, before and after).

use kernel_examples::scenarios::*;
use testkit::faults::CrashPlan;
use testkit::harness::{crash_run, sweep, Scenario, SweepSample};

/// Every sweep scenario: the seed's story, a failure with its finalizer, a fan-out that
/// runs before its subscribers wait and one that runs after (signal activation and
/// `mark_matched`), a DAG, a step in flight across heartbeats, the DAG with the ready
/// queue down (store-fallback claims), a loop with a branch (loop-back and branch-skip
/// writes), and a refund that reaches the result cache, the dead letters and the task
/// inbox (K-6.8: every port call is a crash point).
fn scenarios() -> Vec<Box<dyn Scenario>> {
    vec![
        Box::new(LiveSummaryScenario { subscribers: 2, page_size: 1 }),
        Box::new(FailingScenario),
        Box::new(FanoutScenario { waiters: 3, page_size: 2 }),
        Box::new(DagScenario),
        Box::new(EarlyWaitScenario { waiters: 2, page_size: 1 }),
        Box::new(HeartbeatScenario { beats: 2 }),
        Box::new(QueueDownScenario),
        Box::new(ReviewLoopScenario),
        Box::new(RefundScenario),
    ]
}

/// The seeded sample the MongoDB sweep uses, in memory: about 20 points, every scenario
/// crashed both before and after a boundary, the same points for the same seed.
#[tokio::test]
async fn seeded_sample_covers_every_scenario_on_both_sides() {
    let all = scenarios();
    let refs: Vec<&dyn Scenario> = all.iter().map(|s| &**s).collect();
    let sample = SweepSample::Seeded { points: 20, seed: 7 };
    let report = sweep(&refs, 7, sample).await;
    assert_eq!(report.runs, 20, "{report:?}");
    assert_eq!(report.by_scenario.len(), refs.len(), "{report:?}");
    for (name, [before, after]) in &report.by_scenario {
        assert!(*before > 0 && *after > 0, "{name}: {before} before, {after} after");
    }
    assert!(report.points_at("store.claim_any") > 0 && report.points_at("store.apply:heartbeat") > 0, "{report}");
    assert_eq!(sweep(&refs, 7, sample).await.by_boundary, report.by_boundary, "same seed, same points");
    report.assert_clean();
}

#[tokio::test]
async fn clean_runs_finish() {
    for sc in scenarios() {
        let r = crash_run(&*sc, 1, CrashPlan::Never).await;
        assert_eq!((r.lost, r.unfinished, r.duplicate_step_completions), (0, 0, 0), "{}: {r:?}", sc.name());
    }
}

/// K-3.1–3.5 under a crash at every boundary: nothing lost, no step completed twice, every
/// zombie write fenced, everything finished, one ASR job per run, every planned crash
/// happened; and the sweep reached signal activation with its inbox mark, heartbeats, the
/// store-fallback claim and the stream sink.
#[tokio::test]
async fn crash_at_every_boundary() {
    let all = scenarios();
    let refs: Vec<&dyn Scenario> = all.iter().map(|s| &**s).collect();
    let report = sweep(&refs, 7, SweepSample::All).await;
    println!("{report}");
    assert!(report.boundaries >= 20, "{report:?}");
    assert_eq!(report.runs, report.boundaries * 2);
    assert_eq!(report.crashes_fired, report.runs, "{report:?}");
    for reached in [
        "inbox.mark_matched",
        "store.apply:heartbeat",
        "store.apply:signal_activation",
        "store.claim_any",
        "stream.reset",
        "stream.append",
        "stream.terminal",
        "cache.put",
        "dead_letters.record",
        "dead_letters.decide",
        "task_inbox.open",
    ] {
        assert!(report.points_at(reached) > 0, "the sweep never reached {reached}: {}", report.boundary_map());
    }
    assert!(!report.by_boundary.contains_key("inbox.purge"), "a purge that deletes nothing is no crash point");
    report.assert_clean();
}
