//! The dispatch outbox on a PostgreSQL business table: the shared conformance suite, each
//! case in a fresh schema.

use crate::support::TestSchema;
use kernel_core::ports::DynOutbox;
use store_postgres::{OutboxTable, PostgresOutbox};

/// Outbox fixture: a business table in a fresh schema.
pub struct OutboxDb(TestSchema, PostgresOutbox);

impl testkit::conformance::outbox::OutboxFixture for OutboxDb {
    fn outbox(&self) -> &DynOutbox {
        &self.1
    }
    fn teardown(self) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(self.0.drop_schema())
    }
}

/// A fresh fixture, or `None` when the PostgreSQL tests are skipped.
pub async fn outbox_fixture() -> Option<OutboxDb> {
    let t = TestSchema::new().await?;
    let table = OutboxTable { schema: t.schema().to_string(), ..OutboxTable::default() };
    let o = PostgresOutbox::new(t.pool.clone(), t.config.clone(), table).expect("outbox");
    o.ensure_table().await.expect("create the business table");
    o.ensure_table().await.expect("idempotent");
    Some(OutboxDb(t, o))
}

mod conformance {
    testkit::outbox_conformance!(super::outbox_fixture);
}

mod crash_windows {
    use crate::support::{server_url, SchemaSet};
    use kernel_core::dispatch::AcceptRequest;
    use serde_json::json;
    use std::collections::HashMap;
    use std::sync::Arc;
    use store_postgres::{OutboxTable, PostgresConfig, PostgresOutbox, PostgresSignalInbox, PostgresWorkflowStore};
    use testkit::dispatch::{crash_windows, DispatchEnv};
    use testkit::harness::{BoxFuture, Lister, World};
    use testkit::memory::InMemoryCandidates;
    use testkit::scenarios::workflows::{order, ORDER};

    fn request(i: usize) -> AcceptRequest {
        let object_id = format!("obj-{i}");
        AcceptRequest {
            fields: json!({ "title": format!("note {i}") }),
            workflow_type: ORDER.into(),
            biz_key: format!("{ORDER}:{object_id}"),
            fencing_token: "f1".into(),
            input: json!({ "object_id": object_id, "fencing_token": "f1", "fail": false, "stream": false }),
            priority: kernel_core::Priority::P1,
            object_id: object_id.into(),
        }
    }

    /// K-3.1, K-3.2, K-11: both dispatch paths killed at every write boundary (before and
    /// after) with the store, the inbox and the business table on PostgreSQL (the candidate
    /// index in memory: it is a latency hint the store scan refills), each run in a fresh
    /// schema: no object lost, none dispatched twice, no stale write accepted.
    #[tokio::test]
    async fn both_paths_survive_crashes_on_postgres() {
        let Some(url) = server_url().await else { return };
        let config = PostgresConfig { pool_size_max: 8, ..PostgresConfig::default() };
        let pool = store_postgres::connect(&url, &config).expect("valid database URL");
        let schemas = SchemaSet::new(&url);
        let factory = {
            let (pool, schemas) = (pool.clone(), schemas.clone());
            move |seed: u64| -> BoxFuture<'static, DispatchEnv> {
                let (pool, schemas) = (pool.clone(), schemas.clone());
                Box::pin(async move {
                    let config = schemas.fresh_migrated(&pool).await;
                    let schema = config.schema.clone();
                    let store = PostgresWorkflowStore::new(pool.clone(), config.clone()).expect("store");
                    let inbox = PostgresSignalInbox::new(pool.clone(), config.clone()).expect("inbox");
                    let table = OutboxTable { schema, ..OutboxTable::default() };
                    let outbox = PostgresOutbox::new(pool, config, table).expect("outbox");
                    outbox.ensure_table().await.expect("business table");
                    let listed = store.clone();
                    let lister: Lister = Arc::new(move || {
                        let s = listed.clone();
                        Box::pin(async move { s.list(1_000).await })
                    });
                    let world = World::with_durable(seed, HashMap::new(), Arc::new(store), Arc::new(inbox), lister);
                    DispatchEnv {
                        world,
                        outbox: Arc::new(outbox),
                        candidates: Arc::new(InMemoryCandidates::new()),
                        defs: Arc::new(|o| vec![order(o)]),
                    }
                })
            }
        };
        let started = std::time::Instant::now();
        let report = crash_windows(&factory, &[1, 2], 2, Arc::new(request), 0).await;
        let elapsed = started.elapsed();
        schemas.drop_all().await;
        println!("{report} store=postgres candidates=memory elapsed_s={:.1}", elapsed.as_secs_f64());
        assert_eq!(report.dirty_runs, 0, "{report:?}");
        assert_eq!(report.stale_writes_accepted, 0, "{report:?}");
        assert!(report.runs >= 12, "{report:?}");
    }
}
