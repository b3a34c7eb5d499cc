//! A PostgreSQL store built from a URL: `DATABASE_URL`, else store-postgres's local default
//! (`postgres://postgres@127.0.0.1:5432/test`), in a scratch schema that `destroy` drops.
//! Skipped (with the reason printed) when no server answers, except under CI
//! (`testkit::ci`), where that fails.

use compose::{ComposeError, Deployment, QueueOptions, QueueSide, Role, Scheme, StoreSide};
use kernel_core::engine::{EngineConfig, Publisher};
use kernel_core::ports::{IdGenerator, RandomIds};
use kernel_core::{Definition, ObjectId, PlanRegistry, StartRequest, StepDef, StepOutcome, WorkflowStatus};
use serde_json::json;
use std::time::Duration;

/// The server's URL, or `None` (printed) when none answers outside CI.
async fn server(test: &str) -> Option<(String, tokio_postgres::Client)> {
    let url = store_postgres::database_url();
    let connect = tokio_postgres::connect(&url, tokio_postgres::NoTls);
    match tokio::time::timeout(Duration::from_secs(3), connect).await {
        Ok(Ok((client, conn))) => {
            tokio::spawn(conn);
            Some((url, client))
        }
        Ok(Err(e)) => testkit::ci::skip_or_fail(test, &format!("no PostgreSQL server at {url}: {e}")),
        Err(_) => testkit::ci::skip_or_fail(test, &format!("no PostgreSQL server at {url}: connect timed out")),
    }
}

async fn schema_exists(client: &tokio_postgres::Client, schema: &str) -> bool {
    let row = client
        .query_one("SELECT count(*) FROM information_schema.schemata WHERE schema_name = $1", &[&schema])
        .await
        .unwrap();
    row.get::<_, i64>(0) == 1
}

async fn tables(client: &tokio_postgres::Client, schema: &str) -> Vec<String> {
    let rows = client
        .query("SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1", &[&schema])
        .await
        .unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

fn one_step_plans() -> PlanRegistry {
    let def = Definition::builder("t")
        .step(StepDef::new("a", |_| async { Ok(StepOutcome::complete(json!(1))) }))
        .build()
        .unwrap();
    let mut plans = PlanRegistry::default();
    plans.register(def.plan().clone());
    plans
}

#[tokio::test]
async fn a_scratch_schema_holds_the_store_inbox_and_outbox_and_is_dropped() {
    let Some((url, client)) = server("a_scratch_schema_holds_the_store_inbox_and_outbox_and_is_dropped").await else {
        return;
    };
    let store = StoreSide::connect_scratch(&url, "Wfk-Scratch").await.unwrap();
    assert_eq!(store.scheme, Scheme::Postgres);
    let schema = store.postgres_config().unwrap().schema.clone();
    // The tag is made a schema name: lower case, `_` for `-`.
    assert!(schema.starts_with("wfk_scratch_") && schema != compose::DEFAULT_SCHEMA, "{schema}");
    // Migrated on connect: the store's tables exist before any call.
    let before = tables(&client, &schema).await;
    assert!(before.iter().any(|t| t == store_postgres::INSTANCES), "{before:?}");
    assert!(before.iter().any(|t| t == store_postgres::INBOX), "{before:?}");
    // A second scratch connection gets another schema.
    let other = StoreSide::connect_scratch(&url, "Wfk-Scratch").await.unwrap();
    let other_schema = other.postgres_config().unwrap().schema.clone();
    assert_ne!(other_schema, schema);
    other.destroy().await.unwrap();
    assert!(!schema_exists(&client, &other_schema).await);

    // The ports write to PostgreSQL: a publisher's instance is read back through the store
    // and seen by a query of our own in the scratch schema.
    let queue = QueueSide::connect("memory:", &QueueOptions::default()).await.unwrap();
    let d = Deployment { store: store.clone(), queue };
    assert_eq!(d.describe(), "store=postgres queue=memory");
    let publisher =
        Publisher::new(d.ports().build().unwrap(), one_step_plans(), EngineConfig::default().payload_bytes_max);
    let out = publisher.start_or_resume(StartRequest::new("t", "t:1", json!({}))).await.unwrap();
    assert!(out.created);
    let read = store.store.get(&out.instance.workflow_id).await.unwrap().unwrap();
    assert_eq!(read.status, WorkflowStatus::Running);
    let sql = format!("SELECT workflow_id::text FROM \"{schema}\".workflow_instances");
    let ids: Vec<String> = client.query(&sql, &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(ids, [read.workflow_id.as_str()]);
    // The pool is the one the ports use.
    let pooled = store.postgres_pool().unwrap().get().await.unwrap();
    let n: i64 =
        pooled.query_one(&format!("SELECT count(*) FROM \"{schema}\".workflow_instances"), &[]).await.unwrap().get(0);
    assert_eq!(n, 1);
    drop(pooled);
    // The concrete store lists what the port wrote.
    let listed = store.postgres_store().unwrap().list(10).await.unwrap();
    assert_eq!(listed.iter().map(|i| i.workflow_id.as_str()).collect::<Vec<_>>(), [read.workflow_id.as_str()]);

    // The outbox's business table is created in the same schema.
    let outbox = store.dispatch_outbox().await.unwrap();
    assert!(outbox.get(&ObjectId::from("none")).await.unwrap().is_none());
    let after = tables(&client, &schema).await;
    assert!(after.iter().any(|t| t == "business_objects"), "{after:?}");

    // The observation repository lives in the same schema: a record written through it
    // is a row of its table there.
    let repo = store.observation_repository().await.unwrap();
    let observation = kernel_core::ports::Observation {
        workflow_id: read.workflow_id.clone(),
        biz_key: "compose-obs".into(),
        workflow_type: "one".into(),
        workflow_run: 0,
        revision: 2,
        kind: kernel_core::transition::TransitionKind::MarkRunning,
        status: kernel_core::domain::WorkflowStatus::Running,
        step_name: Some("s".into()),
        attempt: 1,
        elapsed_ms: kernel_core::domain::DurationMs::ZERO,
        traffic_wait_ms: kernel_core::domain::DurationMs::ZERO,
        error_class: None,
        at: kernel_core::domain::Instant::from_millis(1_700_000_000_000),
        worker_id: Some("w".into()),
        claim_token: None,
        wait_signal: None,
    };
    repo.write_batch(&[observation]).await.unwrap();
    let rows: i64 = client
        .query_one(
            &format!("SELECT count(*) FROM \"{schema}\".observation_attempts WHERE biz_key = 'compose-obs'"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 1, "the observation is a row in the store's schema");
    // What PostgreSQL does not offer at all is a typed refusal.
    assert!(matches!(store.mongo_database(), Err(ComposeError::NotOffered { scheme: "postgres", .. })));

    d.destroy().await.unwrap();
    assert!(!schema_exists(&client, &schema).await, "{schema} dropped");
}

#[tokio::test]
async fn the_url_names_the_schema_and_connect_migrates_it_idempotently() {
    let Some((url, client)) = server("the_url_names_the_schema_and_connect_migrates_it_idempotently").await else {
        return;
    };
    let schema = format!("wfk_compose_{}", RandomIds::default().new_token().to_ascii_lowercase().replace('-', "_"));
    let sep = if url.contains('?') { '&' } else { '?' };
    let named = format!("{url}{sep}schema={schema}");
    let first = StoreSide::connect(&named).await.unwrap();
    assert_eq!(first.postgres_config().unwrap().schema, schema);
    let queue = QueueSide::connect("memory:", &QueueOptions::default()).await.unwrap();
    let d = Deployment { store: first, queue };
    let publisher =
        Publisher::new(d.ports().build().unwrap(), one_step_plans(), EngineConfig::default().payload_bytes_max);
    let out = publisher.start_or_resume(StartRequest::new("t", "t:1", json!({}))).await.unwrap();
    // A second connect to the same URL migrates again (nothing to do) and sees the instance.
    let second = StoreSide::connect(&named).await.unwrap();
    assert!(second.store.get(&out.instance.workflow_id).await.unwrap().is_some());
    second.destroy().await.unwrap();
    assert!(!schema_exists(&client, &schema).await);
}

/// The dead letters and the result cache a deployment's ports carry live in the store's
/// (scratch) schema: the round trip works, the rows are in that schema's tables, and a
/// second connection to the same schema reads them back.
#[tokio::test]
async fn dead_letters_and_the_result_cache_live_in_the_store_schema() {
    let Some((url, client)) = server("dead_letters_and_the_result_cache_live_in_the_store_schema").await else {
        return;
    };
    let store = StoreSide::connect_scratch(&url, "wfk_dl_cache").await.unwrap();
    let schema = store.postgres_config().unwrap().schema.clone();
    let queue = QueueSide::connect("memory:", &QueueOptions::default()).await.unwrap();
    let d = Deployment { store, queue };
    let cached_at = crate::ports::round_trip_through_the_ports(&d, "wf-postgres").await;
    for table in [store_postgres::DEAD_LETTERS, store_postgres::RESULT_CACHE] {
        let n: i64 = client.query_one(&format!("SELECT count(*) FROM \"{schema}\".{table}"), &[]).await.unwrap().get(0);
        assert_eq!(n, 1, "one row in {schema}.{table}");
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    let again = StoreSide::connect(&format!("{url}{sep}schema={schema}")).await.unwrap();
    crate::ports::reads_back(&*again.dead_letters, &*again.result_cache, "wf-postgres", cached_at).await;
    d.destroy().await.unwrap();
    assert!(!schema_exists(&client, &schema).await, "{schema} dropped");
}

#[tokio::test]
async fn an_unreachable_server_is_a_typed_connect_error() {
    let e = StoreSide::connect("postgres://postgres:s3cret@127.0.0.1:1/test").await.unwrap_err();
    match &e {
        ComposeError::Connect { role: Role::Store, url, .. } => {
            assert_eq!(url, "postgres://postgres:***@127.0.0.1:1/test")
        }
        other => panic!("expected Connect, got {other:?}"),
    }
    assert!(!e.to_string().contains("s3cret"), "{e}");
}
