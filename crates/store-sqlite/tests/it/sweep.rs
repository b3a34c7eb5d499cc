//! The crash-window sweep of the kernel on SQLite: every scenario of the in-memory sweep,
//! crashed before and after every persistence boundary it crosses, each run in a fresh
//! file (`synchronous=NORMAL`); the same zero counts as in memory.

use crate::support::config;
use std::collections::HashMap;
use std::sync::Arc;
use store_sqlite::{SqliteDb, SqliteSignalInbox, SqliteWorkflowStore};
use testkit::harness::{sweep_on, BoxFuture, Lister, Scenario, SweepSample, World};
use testkit::scenarios::*;

#[tokio::test]
async fn crash_sweep_on_sqlite() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let root = dir.path().to_path_buf();
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let factory = move |seed: u64| -> BoxFuture<'static, World> {
        let n = runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let path = root.join(format!("sweep-{seed}-{n}.db"));
        Box::pin(async move {
            let db = SqliteDb::open(&path, config()).await.expect("open");
            let store = SqliteWorkflowStore::new(db.clone());
            let inbox = SqliteSignalInbox::new(db);
            let listed = store.clone();
            let lister: Lister = Arc::new(move || {
                let s = listed.clone();
                Box::pin(async move { s.list(1_000).await })
            });
            World::with_durable(seed, HashMap::new(), Arc::new(store), Arc::new(inbox), lister)
        })
    };
    let live = LiveSummaryScenario { subscribers: 1, page_size: 1 };
    let fan = FanoutScenario { waiters: 2, page_size: 1 };
    let early = EarlyWaitScenario { waiters: 2, page_size: 1 };
    let beat = HeartbeatScenario { beats: 1 };
    let scenarios: [&dyn Scenario; 9] = [
        &live,
        &FailingScenario,
        &fan,
        &DagScenario,
        &early,
        &beat,
        &QueueDownScenario,
        &ReviewLoopScenario,
        &RefundScenario,
    ];
    let started = std::time::Instant::now();
    let report = sweep_on(&scenarios, 7, SweepSample::All, &factory).await;
    let elapsed = started.elapsed();
    println!("{report} store=sqlite synchronous=normal elapsed_s={:.1}", elapsed.as_secs_f64());
    assert_eq!(report.by_scenario.len(), scenarios.len(), "{report:?}");
    assert_eq!(report.runs, report.points_before + report.points_after, "{report:?}");
    for (name, [before, after]) in &report.by_scenario {
        assert!(*before > 0 && *after > 0, "{name}: {before} points before, {after} after: {report:?}");
    }
    for reached in [
        &["store.claim_any"][..],
        &["store.apply:heartbeat"],
        &["store.apply:signal_activation"],
        &["inbox.mark_matched"],
        &["cache.put"],
        &["dead_letters.record"],
        &["task_inbox.open"],
    ] {
        assert!(reached.iter().any(|r| report.points_at(r) > 0), "{reached:?} not swept: {}", report.boundary_map());
    }
    report.assert_clean();
    // As many boundaries as the clean in-memory runs of the same scenarios and seed cross:
    // the adapter changes where the state lives, never the protocol.
    let memory = testkit::harness::sweep(&scenarios, 7, SweepSample::AtMost(1)).await;
    assert_eq!(memory.runs, scenarios.len() as u64);
    assert_eq!((report.boundaries, report.idle_skipped), (memory.boundaries, memory.idle_skipped), "sqlite vs memory");
}
