//! The crash-window sweep (issue acceptance: every persistence boundary, before and after).

use kernel_examples::scenarios::*;
use testkit::faults::CrashPlan;
use testkit::harness::{crash_run, sweep, Scenario, SweepSample};

fn scenarios() -> (LiveSummaryScenario, FailingScenario, FanoutScenario, DagScenario) {
    (
        LiveSummaryScenario { subscribers: 2, page_size: 1 },
        FailingScenario,
        FanoutScenario { waiters: 3, page_size: 2 },
        DagScenario,
    )
}

#[tokio::test]
async fn clean_runs_finish() {
    let (a, b, c, d) = scenarios();
    for sc in [&a as &dyn Scenario, &b, &c, &d] {
        let r = crash_run(sc, 1, CrashPlan::Never).await;
        assert_eq!((r.lost, r.unfinished, r.duplicate_step_completions), (0, 0, 0), "{}: {r:?}", sc.name());
    }
}

/// K-3.1–3.5 under a crash at every boundary: nothing lost, no step completed twice, every
/// zombie write fenced, everything finished, one ASR job per run.
#[tokio::test]
async fn crash_at_every_boundary() {
    let (a, b, c, d) = scenarios();
    let report = sweep(&[&a, &b, &c, &d], 7, SweepSample::All).await;
    println!("{report}");
    println!("crash-sweep boundaries by name: {:?}", report.by_boundary);
    assert!(report.boundaries >= 20, "{report:?}");
    assert_eq!(report.runs, report.boundaries * 2);
    report.assert_clean();
}
