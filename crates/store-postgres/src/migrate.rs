//! Versioned schema migrations, shipped in the crate (`migrations/*.sql`).

use crate::error;
use kernel_core::{Error, Result};

/// Every migration, in order: `(version, name, SQL)`. The SQL names the schema as
/// `{schema}`; versions are never renumbered and a shipped file is never edited, only
/// followed by a new one.
pub const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "instances_and_inbox", include_str!("../migrations/0001_instances_and_inbox.sql")),
    (2, "document_size", include_str!("../migrations/0002_document_size.sql")),
    (3, "observations", include_str!("../migrations/0003_observations.sql")),
    (4, "claim_by_type", include_str!("../migrations/0004_claim_by_type.sql")),
    (5, "write_path", include_str!("../migrations/0005_write_path.sql")),
    (6, "result_cache", include_str!("../migrations/0006_result_cache.sql")),
    (7, "dead_letters", include_str!("../migrations/0007_dead_letters.sql")),
    (8, "task_inbox", include_str!("../migrations/0008_task_inbox.sql")),
    (9, "compensation", include_str!("../migrations/0009_compensation.sql")),
    (10, "operator_audit", include_str!("../migrations/0010_operator_audit.sql")),
    (11, "trace_parent", include_str!("../migrations/0011_trace_parent.sql")),
    (12, "operator_request", include_str!("../migrations/0012_operator_request.sql")),
    (13, "refused_writes", include_str!("../migrations/0013_refused_writes.sql")),
];

/// How long a migration's DDL waits for a table lock (`SET LOCAL lock_timeout`), in
/// milliseconds; the wait for another process's migration (the advisory lock) is not
/// bounded by it.
const LOCK_TIMEOUT_MS: u64 = 2_000;

/// The advisory-lock key of migrations of `schema`: a fixed FNV-1a hash, so every process
/// of every version agrees on it.
pub fn lock_key(schema: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in "store-postgres migrate ".bytes().chain(schema.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h as i64
}

/// Create `schema` and apply every migration it lacks, in one transaction under a
/// transaction-level advisory lock: idempotent, and safe when several processes start at
/// once (the others wait for the lock, then find every version applied). Returns the
/// versions this call applied.
///
/// Not bounded by the call deadline of the adapters (a migration may legitimately wait for
/// another process's); the server's `statement_timeout` still bounds each statement, and
/// a `lock_timeout` of 2 s each wait for a table lock (past it `Unavailable`).
///
/// A schema holding a version this one does not know (written by a newer version) is a
/// [`Error::Conflict`], nothing applied: a rollback of the code below a schema version
/// is refused rather than run on tables it does not understand.
pub async fn migrate(pool: &crate::Pool, schema: &str) -> Result<Vec<i32>> {
    let schema = crate::schema_name(schema)?;
    let mut client = pool.get().await.map_err(|e| error::before_send("migrate: connect", e))?;
    let tx = client.transaction().await.map_err(|e| error::before_send("migrate: begin", e))?;
    let q = format!("\"{schema}\"");
    let run = |e| error::map(error::Op::Read, "migrate", e);
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&lock_key(schema)]).await.map_err(run)?;
    // Holding the advisory lock, the DDL below waits at most LOCK_TIMEOUT_MS for a table
    // lock (a long transaction on a table): queued behind it, every other statement on
    // that table would wait too. Past it: 55P03, `Unavailable`, nothing applied.
    tx.batch_execute(&format!("SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")).await.map_err(run)?;
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {q}; \
         CREATE TABLE IF NOT EXISTS {q}.schema_migrations (version integer PRIMARY KEY, name text NOT NULL, \
         applied_at timestamptz NOT NULL DEFAULT now())"
    ))
    .await
    .map_err(run)?;
    let applied: Vec<i32> = tx
        .query(&format!("SELECT version FROM {q}.schema_migrations"), &[])
        .await
        .map_err(run)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if let Some(v) = applied.iter().find(|v| !MIGRATIONS.iter().any(|(m, _, _)| m == *v)) {
        return Err(Error::Conflict(format!(
            "schema `{schema}` has migration {v}, which this version does not know: it was written by a newer version"
        )));
    }
    let mut done = Vec::new();
    for (version, name, sql) in MIGRATIONS {
        if applied.contains(version) {
            continue;
        }
        tx.batch_execute(&sql.replace("{schema}", &q)).await.map_err(run)?;
        tx.execute(&format!("INSERT INTO {q}.schema_migrations (version, name) VALUES ($1, $2)"), &[version, name])
            .await
            .map_err(run)?;
        done.push(*version);
    }
    tx.commit().await.map_err(|e| error::map(error::Op::Write, "migrate: commit", e))?;
    Ok(done)
}
