//! The observer's projection in the SQLite file: [`SqliteObservationRepository`] implements
//! [`ObservationRepository`] (and so serves [`OpsView`](observer::OpsView)) on the tables
//! `observation_attempts` and `observation_snapshots` of migration 2 (the snapshot's
//! `wait_signal` column and the audit log `observation_audit` of migration 7). It never
//! reads `workflow_instances`.
//!
//! A batch is one `BEGIN IMMEDIATE` transaction (one commit, one sync, for the whole
//! batch): per record, the stored attempt row and snapshot are read and the observer's own
//! merge rules applied (`AttemptRow::merge`, `Snapshot::apply`: a newer or equal revision
//! is applied, an older one changes nothing; the earliest `started_at` kept; step maps
//! merged; the first terminal time kept), then written back. SQLite runs one write transaction at a
//! time, so no other writer can interleave between the read and the write. Attempt row
//! before snapshot.
//!
//! Errors: a record SQLite or K-2.0 refuses (a step name that cannot be a key, NUL in a
//! key column, a revision past the signed 64-bit range) is [`Error::InvalidRecord`], the
//! batch's other records still written. Every other failure is [`Error::Unavailable`],
//! including a write whose outcome is uncertain: applying the same batch again is
//! idempotent, so writing it again is the correct answer to both.
//!
//! Queries: a biz-key prefix is the range `biz_key >= prefix AND biz_key < bound`
//! ([`prefix_upper_bound`]; text compares as bytes, so no character is a wildcard); a
//! paging cursor is `(t < ? OR (t = ? AND key > ?))`. An audit entry is one
//! `INSERT … ON CONFLICT (id) DO NOTHING`; a purge one `DELETE … WHERE id IN (SELECT …
//! ORDER BY at, id LIMIT n)`.

use crate::error::{self, Op};
use crate::protocol::{Param, Statement};
use crate::{run, SqliteDb};
use kernel_core::domain::Instant;
use kernel_core::ports::Observation;
use observer::audit::check_audit_purge_limit;
use observer::projection::{effective_limit, prefix_upper_bound};
use observer::{check_finished_purge_limit, FINISHED_STATUSES};
use observer::{
    check_step_key, AttemptQuery, AttemptRow, AuditEntry, AuditQuery, Error, ObservationRepository, Result, Snapshot,
    SnapshotQuery,
};
use rusqlite::Connection;
use serde_json::Value;
use sql_protocol::{storable, Dialect};

/// Name of the attempt-row table.
pub const OBSERVATION_ATTEMPTS: &str = "observation_attempts";
/// Name of the snapshot table (`biz_key` primary key).
pub const OBSERVATION_SNAPSHOTS: &str = "observation_snapshots";
/// Name of the operator audit table (`id` primary key).
pub const OBSERVATION_AUDIT: &str = "observation_audit";

/// The observation projection in the SQLite file. Cheap to clone (shares the pool).
#[derive(Debug, Clone)]
pub struct SqliteObservationRepository {
    db: SqliteDb,
}

/// A kernel-side failure of one call, in the projection's terms.
fn map(e: kernel_core::Error, write: bool) -> Error {
    match e {
        kernel_core::Error::InvalidInput { field, reason, .. } if write => {
            Error::InvalidRecord(format!("{field}: {reason}"))
        }
        kernel_core::Error::InvalidInput { field, reason, .. } => Error::InvalidInput { field, reason },
        // Unavailable, Uncertain, Corrupt: the batch is idempotent, it is written again.
        other => Error::unavailable_with(format!("sqlite observations: {other}"), other),
    }
}

fn json_text<T: serde::Serialize>(v: &T) -> Result<String> {
    let v = serde_json::to_value(v).map_err(|e| Error::InvalidRecord(e.to_string()))?;
    storable(Dialect::Sqlite, "observation", &v).map_err(|e| Error::InvalidRecord(e.to_string()))?;
    Ok(v.to_string())
}

/// A serde enum's snake_case name (status, outcome) as stored in its column.
fn name_of<T: serde::Serialize>(v: &T) -> Result<String> {
    match serde_json::to_value(v) {
        Ok(Value::String(s)) => Ok(s),
        other => Err(Error::InvalidInput { field: "query".into(), reason: format!("not a name: {other:?}") }),
    }
}

fn revision(r: u64) -> Result<i64> {
    i64::try_from(r).map_err(|_| Error::InvalidRecord(format!("revision {r} exceeds SQLite's 64-bit integer")))
}

fn text(field: &str, s: &str) -> Result<Param> {
    sql_protocol::text_of(Dialect::Sqlite, field, s).map_err(|e| Error::InvalidRecord(e.to_string()))
}

fn read_doc<T: serde::de::DeserializeOwned>(
    c: &Connection,
    what: &str,
    stmt: &Statement,
) -> std::result::Result<Vec<T>, kernel_core::Error> {
    run(c, Op::Read, what, stmt, |r| -> std::result::Result<T, kernel_core::Error> {
        let doc: String = crate::codec::col(r, "doc")?;
        serde_json::from_str(&doc).map_err(|e| kernel_core::Error::corrupt_with(format!("{what}: decode: {e}"), e))
    })?
    .into_iter()
    .collect()
}

/// The stored attempt row merged with `row`, written when `row` is at least as new.
fn upsert_attempt(c: &Connection, row: &AttemptRow) -> Result<()> {
    let key = vec![
        text("biz_key", &row.biz_key)?,
        Param::Int8(row.workflow_run.into()),
        text("step_name", &row.step_name)?,
        Param::Int8(row.attempt.into()),
    ];
    let read = Statement {
        sql: format!(
            "SELECT doc FROM {OBSERVATION_ATTEMPTS} WHERE biz_key = ?1 AND workflow_run = ?2 AND step_name = ?3 \
             AND attempt = ?4"
        ),
        params: key.clone(),
    };
    let stored: Option<AttemptRow> = read_doc(c, "observation attempt", &read).map_err(|e| map(e, false))?.pop();
    let merged = match stored {
        Some(mut s) => {
            if !s.merge(row.clone()) {
                return Ok(());
            }
            s
        }
        None => row.clone(),
    };
    let mut params = key;
    params.extend([
        text("workflow_type", &merged.workflow_type)?,
        Param::Text(merged.outcome.as_str().to_string()),
        Param::Int8(revision(merged.revision)?),
        Param::Int8(merged.updated_at.as_millis()),
        Param::Text(json_text(&merged)?),
    ]);
    let write = Statement {
        sql: format!(
            "INSERT INTO {OBSERVATION_ATTEMPTS} (biz_key, workflow_run, step_name, attempt, workflow_type, outcome, \
             revision, updated_at, doc) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
             ON CONFLICT (biz_key, workflow_run, step_name, attempt) DO UPDATE SET \
             workflow_type = excluded.workflow_type, outcome = excluded.outcome, revision = excluded.revision, \
             updated_at = excluded.updated_at, doc = excluded.doc"
        ),
        params,
    };
    run(c, Op::Write, "observation attempt upsert", &write, |_| ()).map_err(|e| map(e, true))?;
    Ok(())
}

/// Write `s` as the snapshot of its biz_key, unless the stored one is newer; returns
/// whether it was written.
fn put(c: &Connection, s: &Snapshot) -> Result<bool> {
    let params = vec![
        text("biz_key", &s.biz_key)?,
        text("workflow_type", &s.workflow_type)?,
        Param::Text(name_of(&s.status).map_err(|e| Error::InvalidRecord(e.to_string()))?),
        match &s.step_name {
            Some(n) => text("step_name", n)?,
            None => Param::NullText,
        },
        Param::Int8(revision(s.revision)?),
        Param::Int8(s.updated_at.as_millis()),
        Param::Text(json_text(s)?),
        match &s.wait_signal {
            Some(w) => text("wait_signal", w)?,
            None => Param::NullText,
        },
    ];
    let write = Statement {
        sql: format!(
            "INSERT INTO {OBSERVATION_SNAPSHOTS} (biz_key, workflow_type, status, step_name, revision, updated_at, doc, \
             wait_signal) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
             ON CONFLICT (biz_key) DO UPDATE SET workflow_type = excluded.workflow_type, status = excluded.status, \
             step_name = excluded.step_name, revision = excluded.revision, updated_at = excluded.updated_at, \
             doc = excluded.doc, wait_signal = excluded.wait_signal \
             WHERE {OBSERVATION_SNAPSHOTS}.revision <= excluded.revision RETURNING 1"
        ),
        params,
    };
    Ok(!run(c, Op::Write, "observation snapshot put", &write, |_| ()).map_err(|e| map(e, true))?.is_empty())
}

fn stored_snapshot(c: &Connection, biz_key: &str) -> std::result::Result<Option<Snapshot>, kernel_core::Error> {
    let read = Statement {
        sql: format!("SELECT doc FROM {OBSERVATION_SNAPSHOTS} WHERE biz_key = ?1"),
        params: vec![Param::Text(biz_key.to_string())],
    };
    Ok(read_doc(c, "observation snapshot", &read)?.pop())
}

/// One observation: its attempt row, then its snapshot.
fn write_one(c: &Connection, obs: &Observation) -> Result<()> {
    if let Some(name) = &obs.step_name {
        check_step_key(name).map_err(Error::InvalidRecord)?;
    }
    if let Some(row) = AttemptRow::from_observation(obs) {
        upsert_attempt(c, &row)?;
    }
    let snapshot = match stored_snapshot(c, &obs.biz_key).map_err(|e| map(e, false))? {
        Some(mut s) => {
            if !s.apply(obs) {
                return Ok(());
            }
            s
        }
        None => Snapshot::from_observation(obs),
    };
    put(c, &snapshot)?;
    Ok(())
}

/// Appends `column <op> ?n` for each present filter.
#[derive(Default)]
struct Filter {
    conds: Vec<String>,
    params: Vec<Param>,
}

impl Filter {
    fn push(&mut self, column: &str, op: &str, p: Param) {
        self.params.push(p);
        self.conds.push(format!("{column} {op} ?{}", self.params.len()));
    }

    fn text(&mut self, column: &str, v: Option<String>) {
        if let Some(v) = v {
            self.push(column, "=", Param::Text(v));
        }
    }

    fn window(&mut self, from: Option<kernel_core::domain::Instant>, to: Option<kernel_core::domain::Instant>) {
        if let Some(f) = from {
            self.push("updated_at", ">=", Param::Int8(f.as_millis()));
        }
        if let Some(t) = to {
            self.push("updated_at", "<", Param::Int8(t.as_millis()));
        }
    }

    /// `key` starts with `prefix`, as a range (no character is a wildcard).
    fn prefix(&mut self, key: &str, prefix: Option<&String>) {
        if let Some(p) = prefix {
            self.push(key, ">=", Param::Text(p.clone()));
            if let Some(upper) = prefix_upper_bound(p) {
                self.push(key, "<", Param::Text(upper));
            }
        }
    }

    /// Strictly after `(at, id)` in the order `time DESC, key ASC`.
    fn cursor(&mut self, time: &str, key: &str, before: Option<&(Instant, String)>) {
        if let Some((at, id)) = before {
            self.params.push(Param::Int8(at.as_millis()));
            let t = self.params.len();
            self.params.push(Param::Text(id.clone()));
            let k = self.params.len();
            self.conds.push(format!("({time} < ?{t} OR ({time} = ?{t} AND {key} > ?{k}))"));
        }
    }

    fn statement(self, table: &str, order: &str, limit: usize) -> Statement {
        let cond = if self.conds.is_empty() { String::new() } else { format!(" WHERE {}", self.conds.join(" AND ")) };
        let limit = effective_limit(limit);
        Statement { sql: format!("SELECT doc FROM {table}{cond} ORDER BY {order} LIMIT {limit}"), params: self.params }
    }
}

/// The `find_snapshots` query: only the filters present, newest `updated_at` first.
pub fn snapshots_query(q: &SnapshotQuery) -> Result<Statement> {
    q.validate()?;
    let mut f = Filter::default();
    f.text("workflow_type", q.workflow_type.clone());
    f.text("status", q.status.as_ref().map(name_of).transpose()?);
    f.text("step_name", q.step_name.clone());
    f.text("wait_signal", q.waiting_on.clone());
    f.prefix("biz_key", q.biz_key_prefix.as_ref());
    f.window(q.updated_from, q.updated_to);
    f.cursor("updated_at", "biz_key", q.before.as_ref());
    Ok(f.statement(OBSERVATION_SNAPSHOTS, "updated_at DESC, biz_key", q.limit))
}

/// The `find_attempts` query: only the filters present, newest `updated_at` first.
pub fn attempts_query(q: &AttemptQuery) -> Result<Statement> {
    let mut f = Filter::default();
    f.text("biz_key", q.biz_key.clone());
    f.text("workflow_type", q.workflow_type.clone());
    f.text("step_name", q.step_name.clone());
    f.text("outcome", q.outcome.map(|o| o.as_str().to_string()));
    f.window(q.updated_from, q.updated_to);
    Ok(f.statement(OBSERVATION_ATTEMPTS, "updated_at DESC, biz_key, workflow_run, step_name, attempt", q.limit))
}

/// The `find_audit` query: only the filters present, newest `at` first, ties by id.
pub fn audit_query(q: &AuditQuery) -> Result<Statement> {
    q.validate()?;
    let mut f = Filter::default();
    f.text("actor", q.actor.clone());
    f.text("action", q.action.clone());
    f.text("target", q.target.clone());
    f.cursor("at", "id", q.before.as_ref());
    Ok(f.statement(OBSERVATION_AUDIT, "at DESC, id", q.limit))
}

/// The insert of an audit entry, nothing when its id is stored.
fn audit_insert(entry: &AuditEntry) -> Result<Statement> {
    entry.validate()?;
    Ok(Statement {
        sql: format!(
            "INSERT INTO {OBSERVATION_AUDIT} (id, at, actor, action, target, doc) VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
             ON CONFLICT (id) DO NOTHING"
        ),
        params: vec![
            text("id", &entry.id)?,
            Param::Int8(entry.at.as_millis()),
            text("actor", &entry.actor)?,
            text("action", &entry.action)?,
            text("target", &entry.target)?,
            Param::Text(json_text(entry)?),
        ],
    })
}

impl SqliteObservationRepository {
    /// The repository in `db`'s file (opened and migrated by [`SqliteDb::open`]).
    pub fn new(db: SqliteDb) -> Self {
        SqliteObservationRepository { db }
    }

    async fn read<T: serde::de::DeserializeOwned + Send + 'static>(
        &self,
        what: &'static str,
        stmt: Result<Statement>,
    ) -> Result<Vec<T>> {
        let stmt = stmt?;
        self.db.call(Op::Read, what, move |c| read_doc(c, what, &stmt)).await.map_err(|e| map(e, false))
    }

    /// Run `f` in one `BEGIN IMMEDIATE` transaction; the kernel error of the transaction
    /// itself (begin, commit) is mapped as a write.
    async fn transaction<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce(&Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let r = self
            .db
            .call(Op::Write, what, move |c| {
                let tx = c
                    .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                    .map_err(|e| error::map(Op::Read, what, e))?;
                let out = f(&tx);
                tx.commit().map_err(|e| error::map(Op::Write, what, e))?;
                Ok(out)
            })
            .await
            .map_err(|e| map(e, false))?;
        r
    }
}

#[async_trait::async_trait]
impl ObservationRepository for SqliteObservationRepository {
    async fn write_batch(&self, batch: &[Observation]) -> Result<()> {
        let batch = batch.to_vec();
        self.transaction("observation batch", move |c| {
            let mut invalid = None;
            for obs in &batch {
                match write_one(c, obs) {
                    Ok(()) => {}
                    // The record's failed statement was rolled back alone; the others stay.
                    Err(Error::InvalidRecord(m)) => {
                        invalid.get_or_insert(m);
                    }
                    Err(e) => return Err(e),
                }
            }
            invalid.map_or(Ok(()), |m| Err(Error::InvalidRecord(m)))
        })
        .await
    }

    async fn put_snapshot(&self, snapshot: &Snapshot) -> Result<bool> {
        for name in snapshot.steps.keys() {
            check_step_key(name).map_err(Error::InvalidRecord)?;
        }
        let snapshot = snapshot.clone();
        self.transaction("observation snapshot put", move |c| put(c, &snapshot)).await
    }

    async fn snapshot(&self, biz_key: &str) -> Result<Option<Snapshot>> {
        let stmt = Statement {
            sql: format!("SELECT doc FROM {OBSERVATION_SNAPSHOTS} WHERE biz_key = ?1"),
            params: vec![Param::Text(biz_key.to_string())],
        };
        Ok(self.read("observation snapshot", Ok(stmt)).await?.pop())
    }

    async fn find_snapshots(&self, query: &SnapshotQuery) -> Result<Vec<Snapshot>> {
        self.read("observation snapshots", snapshots_query(query)).await
    }

    async fn find_attempts(&self, query: &AttemptQuery) -> Result<Vec<AttemptRow>> {
        self.read("observation attempts", attempts_query(query)).await
    }

    async fn append_audit(&self, entry: &AuditEntry) -> Result<()> {
        let stmt = audit_insert(entry)?;
        self.transaction("observation audit append", move |c| {
            run(c, Op::Write, "observation audit append", &stmt, |_| ()).map_err(|e| map(e, true))?;
            Ok(())
        })
        .await
    }

    async fn find_audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>> {
        self.read("observation audit", audit_query(query)).await
    }

    async fn purge_audit(&self, before: Instant, limit: usize) -> Result<u64> {
        check_audit_purge_limit(limit)?;
        let stmt = Statement {
            sql: format!(
                "DELETE FROM {OBSERVATION_AUDIT} WHERE id IN (SELECT id FROM {OBSERVATION_AUDIT} WHERE at < ?1 \
                 ORDER BY at, id LIMIT {limit}) RETURNING 1"
            ),
            params: vec![Param::Int8(before.as_millis())],
        };
        self.transaction("observation audit purge", move |c| {
            let deleted = run(c, Op::Write, "observation audit purge", &stmt, |_| ()).map_err(|e| map(e, false))?;
            Ok(deleted.len() as u64)
        })
        .await
    }

    async fn purge_finished(&self, before: Instant, limit: usize) -> Result<u64> {
        check_finished_purge_limit(limit)?;
        let names = FINISHED_STATUSES.iter().map(name_of).collect::<Result<Vec<String>>>()?;
        // Constants of the kernel's enum, never user input.
        let finished = names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ");
        // The snapshots (selected by `observation_snapshots_status_updated`, deleted only if
        // still finished and old), then every attempt row of their biz keys (primary key
        // prefix), in one transaction.
        let snapshots = Statement {
            sql: format!(
                "DELETE FROM {OBSERVATION_SNAPSHOTS} WHERE biz_key IN (SELECT biz_key FROM {OBSERVATION_SNAPSHOTS} \
                 WHERE status IN ({finished}) AND updated_at < ?1 ORDER BY updated_at, biz_key LIMIT {limit}) \
                 AND status IN ({finished}) AND updated_at < ?1 RETURNING biz_key"
            ),
            params: vec![Param::Int8(before.as_millis())],
        };
        let attempts_sql = format!("DELETE FROM {OBSERVATION_ATTEMPTS} WHERE biz_key = ?1");
        self.transaction("observation finished purge", move |c| {
            let keys = run(c, Op::Write, "observation finished purge", &snapshots, |r| r.get::<_, String>(0))
                .map_err(|e| map(e, false))?;
            let mut deleted = 0u64;
            for key in keys {
                let key = key.map_err(|e| Error::unavailable_with("observation finished purge: a biz key", e))?;
                let stmt = Statement { sql: attempts_sql.clone(), params: vec![Param::Text(key)] };
                run(c, Op::Write, "observation finished purge", &stmt, |_| ()).map_err(|e| map(e, false))?;
                deleted += 1;
            }
            Ok(deleted)
        })
        .await
    }
}
