//! `migrate()`: idempotent, and safe when several processes start at once.

use crate::support::TestSchema;
use store_postgres::{migrate, MIGRATIONS};

/// Eight concurrent `migrate` calls on a fresh schema (as eight processes starting at
/// once): all succeed, each version is applied by exactly one of them and recorded once;
/// a later call applies nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_migrations_apply_each_version_once() {
    let Some(db) = TestSchema::with_pool_size(10).await else { return };
    // TestSchema migrated already: start again from an empty schema of the same name.
    db.client().await.batch_execute(&format!("DROP SCHEMA \"{}\" CASCADE", db.schema())).await.unwrap();
    let calls = (0..8).map(|_| {
        let (pool, schema) = (db.pool.clone(), db.schema().to_string());
        tokio::spawn(async move { migrate(&pool, &schema).await })
    });
    let mut applied = Vec::new();
    for c in calls {
        applied.extend(c.await.expect("task").expect("migrate"));
    }
    applied.sort_unstable();
    let all: Vec<i32> = MIGRATIONS.iter().map(|(v, _, _)| *v).collect();
    assert_eq!(applied, all, "each version applied by exactly one caller");
    let recorded = db.scalar("SELECT count(*) FROM {s}.schema_migrations").await;
    assert_eq!(recorded, all.len() as i64);
    assert_eq!(migrate(&db.pool, db.schema()).await.unwrap(), Vec::<i32>::new(), "idempotent");
    assert_eq!(db.scalar("SELECT count(*) FROM {s}.workflow_instances").await, 0);
    db.drop_schema().await;
}

/// A schema migrated by a newer version (a version this one does not know) is refused,
/// and a schema name that is not a plain identifier is bad input.
#[tokio::test]
async fn unknown_versions_and_bad_schema_names_are_refused() {
    let Some(db) = TestSchema::new().await else { return };
    db.client()
        .await
        .batch_execute(&format!(
            "INSERT INTO \"{}\".schema_migrations (version, name) VALUES (999, 'future')",
            db.schema()
        ))
        .await
        .unwrap();
    let r = migrate(&db.pool, db.schema()).await;
    assert!(matches!(r, Err(kernel_core::Error::Conflict(_))), "{r:?}");
    for bad in ["", "Upper", "a-b", "x\"; DROP", "1abc", &"s".repeat(64)] {
        let r = migrate(&db.pool, bad).await;
        assert!(matches!(r, Err(kernel_core::Error::InvalidInput { .. })), "{bad:?}: {r:?}");
    }
    db.drop_schema().await;
}

/// A migration's DDL waits for a table lock at most `lock_timeout` (2 s), not the whole
/// statement timeout, behind a transaction holding a conflicting lock: refused with
/// `55P03` (`Unavailable`), nothing applied, and applied once the lock is gone.
#[tokio::test]
async fn a_migration_waits_for_a_table_lock_at_most_the_lock_timeout() {
    let Some(db) = TestSchema::new().await else { return };
    let s = format!("\"{}\"", db.schema());
    // Undo version 2, as on a schema migrated by the previous version.
    db.client()
        .await
        .batch_execute(&format!(
            "DELETE FROM {s}.schema_migrations WHERE version = 2;
             DROP TRIGGER workflow_instances_document_size ON {s}.workflow_instances;
             DROP FUNCTION {s}.workflow_instances_document_size();"
        ))
        .await
        .unwrap();
    let (holder, conn) = tokio_postgres::connect(&store_postgres::database_url(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    holder.batch_execute(&format!("BEGIN; LOCK TABLE {s}.workflow_instances IN ROW EXCLUSIVE MODE")).await.unwrap();
    let r = migrate(&db.pool, db.schema()).await;
    let missing = db.scalar("SELECT count(*) FROM {s}.schema_migrations WHERE version = 2").await;
    holder.batch_execute("COMMIT").await.unwrap();
    let text = format!("{r:?}");
    assert!(matches!(r, Err(kernel_core::Error::Unavailable { .. })), "{text}");
    assert!(text.contains("E55P03"), "lock_not_available, not the statement timeout: {text}");
    assert_eq!(missing, 0, "nothing applied");
    assert_eq!(migrate(&db.pool, db.schema()).await.unwrap(), vec![2]);
    db.drop_schema().await;
}

/// An existing schema of version 11 (before `operator_request`), holding an instance, is
/// upgraded by `migrate`: only version 12 is applied, the instance reads back as it was
/// with no request pending, and a request (K-6.8) can then be written to it.
#[tokio::test]
async fn a_version_11_schema_is_upgraded_and_keeps_its_instances() {
    use kernel_core::operator_request::{OperatorRequest, RequestedAction};
    use kernel_core::ports::{WorkflowStore, WriteOutcome};
    use kernel_core::transition::{Guard, Transition};
    let Some(db) = TestSchema::new().await else { return };
    let s = format!("\"{}\"", db.schema());
    // Start again from a schema built by the version-11 migrations alone, as a deployment
    // of the previous release left it.
    let mut c = db.client().await;
    let tx = c.transaction().await.unwrap();
    tx.batch_execute(&format!(
        "DROP SCHEMA {s} CASCADE; CREATE SCHEMA {s}; \
         CREATE TABLE {s}.schema_migrations (version integer PRIMARY KEY, name text NOT NULL, \
         applied_at timestamptz NOT NULL DEFAULT now())"
    ))
    .await
    .unwrap();
    for (version, name, sql) in MIGRATIONS.iter().filter(|(v, _, _)| *v <= 11) {
        tx.batch_execute(&sql.replace("{schema}", &s)).await.unwrap();
        tx.execute(&format!("INSERT INTO {s}.schema_migrations (version, name) VALUES ($1, $2)"), &[version, name])
            .await
            .unwrap();
    }
    let inst = testkit::conformance::store::claimed("wf-1", "tok");
    let steps = serde_json::to_value(&inst.steps).unwrap();
    let output = serde_json::to_value(&inst.output).unwrap();
    tx.execute(
        &format!(
            "INSERT INTO {s}.workflow_instances (workflow_id, biz_key, workflow_type, status, claimable_time, \
             claim_token, business_priority, revision, retry_count, prepare_failures, definition_fingerprint, \
             created_at, updated_at, steps, input, output) \
             VALUES ($1, $2, $3, 'running', $4, 'tok', 2, $5, 0, 0, $6, $7, $8, $9, $10, $11)"
        ),
        &[
            &inst.workflow_id.as_str(),
            &inst.biz_key,
            &inst.workflow_type,
            &inst.claimable_time.unwrap().as_millis(),
            &(inst.revision as i64),
            &inst.definition_fingerprint,
            &inst.created_at.as_millis(),
            &inst.updated_at.as_millis(),
            &steps,
            &inst.input,
            &output,
        ],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    drop(c);
    assert_eq!(migrate(&db.pool, db.schema()).await.unwrap(), vec![12, 13], "only the newer versions are applied");
    let store = db.store();
    assert_eq!(store.get(&"wf-1".into()).await.unwrap(), Some(inst.clone()), "the instance reads back as it was");
    let req = OperatorRequest {
        id: "req-1".into(),
        action: RequestedAction::Regenerate { step: "compose".into() },
        holder: "tok".into(),
        requested_at: inst.updated_at,
    };
    let t = Transition::operator_request(req.clone(), "tok-2".into(), inst.updated_at);
    let r = store.apply(&"wf-1".into(), &Guard::Token { token: "tok".into() }, &t).await.unwrap();
    assert_eq!(r, WriteOutcome::Applied { revision: inst.revision + 1 });
    assert_eq!(store.get(&"wf-1".into()).await.unwrap().unwrap().operator_request, Some(req));
    db.drop_schema().await;
}
