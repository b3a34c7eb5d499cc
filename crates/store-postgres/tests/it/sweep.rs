//! The crash-window sweep of the kernel on PostgreSQL: every scenario of the in-memory
//! sweep, crashed before and after every persistence boundary it crosses, each run in a
//! fresh schema (one pool for all of them); the same zero counts as in memory.

use crate::support::{server_url, SchemaSet};
use std::collections::HashMap;
use std::sync::Arc;
use store_postgres::{PostgresConfig, PostgresSignalInbox, PostgresWorkflowStore};
use testkit::harness::{sweep_on, BoxFuture, Lister, Scenario, SweepSample, World};
use testkit::scenarios::*;

#[tokio::test]
async fn crash_sweep_on_postgres() {
    let Some(url) = server_url().await else { return };
    let config = PostgresConfig { pool_size_max: 8, ..PostgresConfig::default() };
    let pool = store_postgres::connect(&url, &config).expect("valid database URL");
    let schemas = SchemaSet::new(&url);
    let factory = {
        let (pool, schemas) = (pool.clone(), schemas.clone());
        move |seed: u64| -> BoxFuture<'static, World> {
            let (pool, schemas) = (pool.clone(), schemas.clone());
            Box::pin(async move {
                let config = schemas.fresh_migrated(&pool).await;
                let store = PostgresWorkflowStore::new(pool.clone(), config.clone()).expect("store");
                let inbox = PostgresSignalInbox::new(pool, config).expect("inbox");
                let listed = store.clone();
                let lister: Lister = Arc::new(move || {
                    let s = listed.clone();
                    Box::pin(async move { s.list(1_000).await })
                });
                World::with_durable(seed, HashMap::new(), Arc::new(store), Arc::new(inbox), lister)
            })
        }
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
    let dropping = std::time::Instant::now();
    schemas.drop_all().await;
    println!(
        "{report} store=postgres elapsed_s={:.1} schema_drop_s={:.1}",
        elapsed.as_secs_f64(),
        dropping.elapsed().as_secs_f64()
    );
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
    // As many boundaries as the clean in-memory runs of the same scenarios and seed cross
    // (discovery, and one crash run per scenario): the adapter changes where the state lives, never
    // the protocol.
    let memory = testkit::harness::sweep(&scenarios, 7, SweepSample::AtMost(1)).await;
    assert_eq!(memory.runs, scenarios.len() as u64);
    assert_eq!(
        (report.boundaries, report.idle_skipped),
        (memory.boundaries, memory.idle_skipped),
        "postgres vs memory"
    );
}
