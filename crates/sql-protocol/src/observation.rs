//! The observer's projection: every statement of
//! [`ObservationRepository`](observer::ObservationRepository) on the tables
//! `observation_attempts`, `observation_snapshots` and `observation_audit`, for both
//! dialects ([`ObservationSql`]); rows are decoded by [`doc`] (the record is the `doc`
//! column) and [`biz_key`].
//!
//! Writes are revision-guarded. PostgreSQL applies a record with **one** autocommit upsert
//! per table, `INSERT … ON CONFLICT (<key>) DO UPDATE SET … WHERE <stored>.revision <=
//! EXCLUDED.revision`, merging the attempt row's `started_at` and the snapshot's step map
//! and first terminal time inside the statement ([`ObservationSql::attempt_upsert`],
//! [`ObservationSql::snapshot_upsert`]). SQLite runs one write transaction at a time: the
//! store reads the stored row ([`ObservationSql::attempt_get`],
//! [`ObservationSql::snapshot_get`]), applies the observer's merge rules, and writes the
//! result back with the same upserts ([`ObservationSql::attempt_upsert`],
//! [`ObservationSql::snapshot_put`]).
//!
//! Queries: a biz-key prefix is the range `biz_key >= prefix AND biz_key < bound`
//! ([`prefix_upper_bound`]; text compares as bytes, so no character is a wildcard); a
//! paging cursor is `(t < $a OR (t = $a AND key > $b))`. An audit entry is one
//! `INSERT … ON CONFLICT (id) DO NOTHING`; a purge one `DELETE … WHERE id IN (SELECT …
//! ORDER BY at, id LIMIT n)`.

use crate::{storable, text_of, Binds, Dialect, Param, SqlRow, Statement};
use kernel_core::domain::Instant;
use kernel_core::ports::Observation;
use observer::audit::check_audit_purge_limit;
use observer::projection::{effective_limit, prefix_upper_bound};
use observer::{check_finished_purge_limit, FINISHED_STATUSES};
use observer::{AttemptQuery, AttemptRow, AuditEntry, AuditQuery, Error, Result, Snapshot, SnapshotQuery};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Name of the attempt-row table.
pub const OBSERVATION_ATTEMPTS: &str = "observation_attempts";
/// Name of the snapshot table (`biz_key` primary key).
pub const OBSERVATION_SNAPSHOTS: &str = "observation_snapshots";
/// Name of the operator audit table (`id` primary key).
pub const OBSERVATION_AUDIT: &str = "observation_audit";

/// A kernel-side failure of one call, in the projection's terms: a refused value of a
/// write is [`Error::InvalidRecord`], of a query [`Error::InvalidInput`]; every other
/// failure (unavailable, uncertain, corrupt) is [`Error::Unavailable`], since applying
/// the same batch again is idempotent.
pub fn map_error(d: Dialect, e: kernel_core::Error, write: bool) -> Error {
    match e {
        kernel_core::Error::InvalidInput { field, reason, .. } if write => {
            Error::InvalidRecord(format!("{field}: {reason}"))
        }
        kernel_core::Error::InvalidInput { field, reason, .. } => Error::InvalidInput { field, reason },
        other => {
            let store = match d {
                Dialect::Postgres => "postgres",
                Dialect::Sqlite => "sqlite",
            };
            Error::unavailable_with(format!("{store} observations: {other}"), other)
        }
    }
}

/// The record of a row: its `doc` column (`jsonb` or JSON text).
pub fn doc<T: DeserializeOwned>(row: &impl SqlRow) -> kernel_core::Result<T> {
    row.json("doc")
}

/// The `biz_key` column of a row.
pub fn biz_key(row: &impl SqlRow) -> kernel_core::Result<String> {
    row.text("biz_key")
}

/// A serde enum's snake_case name (status, outcome) as stored in its column.
fn name_of<T: serde::Serialize>(v: &T) -> Result<String> {
    match serde_json::to_value(v) {
        Ok(Value::String(s)) => Ok(s),
        other => Err(Error::InvalidInput { field: "query".into(), reason: format!("not a name: {other:?}") }),
    }
}

/// The terminal statuses as an SQL list of their stored names (constants of the kernel's
/// enum, never user input).
fn finished_statuses() -> Result<String> {
    let names = FINISHED_STATUSES.iter().map(name_of).collect::<Result<Vec<String>>>()?;
    Ok(names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", "))
}

/// Appends `column <op> <placeholder>` for each present filter.
struct Filter {
    b: Binds,
    conds: Vec<String>,
}

impl Filter {
    fn new(d: Dialect) -> Self {
        Filter { b: Binds::new(d), conds: Vec::new() }
    }

    fn push(&mut self, column: &str, op: &str, p: Param) {
        let v = self.b.bind(p);
        self.conds.push(format!("{column} {op} {v}"));
    }

    fn text(&mut self, column: &str, v: Option<String>) {
        if let Some(v) = v {
            self.push(column, "=", Param::Text(v));
        }
    }

    fn window(&mut self, from: Option<Instant>, to: Option<Instant>) {
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
            let t = self.b.bind(Param::Int8(at.as_millis()));
            let k = self.b.bind(Param::Text(id.clone()));
            self.conds.push(format!("({time} < {t} OR ({time} = {t} AND {key} > {k}))"));
        }
    }

    fn statement(self, table: &str, order: &str, limit: usize) -> Statement {
        let cond = if self.conds.is_empty() { String::new() } else { format!(" WHERE {}", self.conds.join(" AND ")) };
        let limit = effective_limit(limit);
        self.b.statement(format!("SELECT doc FROM {table}{cond} ORDER BY {order} LIMIT {limit}"))
    }
}

const SNAPSHOT_COLUMNS: &str = "biz_key, workflow_type, status, step_name, revision, updated_at, doc, wait_signal";

const SNAPSHOT_SET: &str = "workflow_type = EXCLUDED.workflow_type, status = EXCLUDED.status, \
     step_name = EXCLUDED.step_name, revision = EXCLUDED.revision, updated_at = EXCLUDED.updated_at, \
     wait_signal = EXCLUDED.wait_signal";

/// The statements of the observation projection, its tables qualified by the store
/// (`"<schema>".` in PostgreSQL, nothing in SQLite).
#[derive(Debug, Clone)]
pub struct ObservationSql {
    d: Dialect,
    attempts: String,
    snapshots: String,
    audit: String,
}

impl ObservationSql {
    /// The statements of the tables named with `prefix`.
    pub fn new(dialect: Dialect, prefix: &str) -> Self {
        ObservationSql {
            d: dialect,
            attempts: format!("{prefix}{OBSERVATION_ATTEMPTS}"),
            snapshots: format!("{prefix}{OBSERVATION_SNAPSHOTS}"),
            audit: format!("{prefix}{OBSERVATION_AUDIT}"),
        }
    }

    /// The dialect the statements are written in.
    pub fn dialect(&self) -> Dialect {
        self.d
    }

    /// A text value of a record, refused ([`Error::InvalidRecord`]) where the database
    /// cannot store it.
    fn text(&self, field: &str, s: &str) -> Result<Param> {
        text_of(self.d, field, s).map_err(|e| Error::InvalidRecord(e.to_string()))
    }

    fn opt_text(&self, field: &str, s: Option<&String>) -> Result<Param> {
        s.map_or(Ok(Param::NullText), |s| self.text(field, s))
    }

    /// A record as its `doc` value.
    fn json<T: serde::Serialize>(&self, v: &T) -> Result<Param> {
        let v = serde_json::to_value(v).map_err(|e| Error::InvalidRecord(e.to_string()))?;
        storable(self.d, "observation", &v).map_err(|e| Error::InvalidRecord(e.to_string()))?;
        Ok(Param::Jsonb(v))
    }

    fn revision(&self, r: u64) -> Result<Param> {
        let max = match self.d {
            Dialect::Postgres => "PostgreSQL's bigint",
            Dialect::Sqlite => "SQLite's 64-bit integer",
        };
        i64::try_from(r).map(Param::Int8).map_err(|_| Error::InvalidRecord(format!("revision {r} exceeds {max}")))
    }

    /// The key of an attempt row, bound in the order of its primary key.
    fn attempt_key(&self, b: &mut Binds, row: &AttemptRow) -> Result<Vec<String>> {
        Ok(vec![
            b.bind(self.text("biz_key", &row.biz_key)?),
            b.bind(Param::Int8(row.workflow_run.into())),
            b.bind(self.text("step_name", &row.step_name)?),
            b.bind(Param::Int8(row.attempt.into())),
        ])
    }

    /// The stored attempt row of `row`'s key ([`doc`]).
    pub fn attempt_get(&self, row: &AttemptRow) -> Result<Statement> {
        let mut b = Binds::new(self.d);
        let k = self.attempt_key(&mut b, row)?;
        let sql = format!(
            "SELECT doc FROM {} WHERE biz_key = {} AND workflow_run = {} AND step_name = {} AND attempt = {}",
            self.attempts, k[0], k[1], k[2], k[3]
        );
        Ok(b.statement(sql))
    }

    /// The upsert of an attempt row, every column and document field from `row`.
    /// PostgreSQL: revision-guarded, and `started_at` keeps the stored one when that is a
    /// number and `row`'s is absent or not earlier (`AttemptRow::merge` inside the
    /// statement). SQLite: `row` is the stored row already merged, written as it is.
    pub fn attempt_upsert(&self, row: &AttemptRow) -> Result<Statement> {
        let mut b = Binds::new(self.d);
        let mut vals = self.attempt_key(&mut b, row)?;
        vals.extend([
            b.bind(self.text("workflow_type", &row.workflow_type)?),
            b.bind(Param::Text(row.outcome.as_str().to_string())),
            b.bind(self.revision(row.revision)?),
            b.bind(Param::Int8(row.updated_at.as_millis())),
            b.bind(self.json(row)?),
        ]);
        let t = &self.attempts;
        let head = format!(
            "INSERT INTO {t} AS a (biz_key, workflow_run, step_name, attempt, workflow_type, outcome, revision, \
             updated_at, doc) VALUES ({}) \
             ON CONFLICT (biz_key, workflow_run, step_name, attempt) DO UPDATE SET \
             workflow_type = EXCLUDED.workflow_type, outcome = EXCLUDED.outcome, revision = EXCLUDED.revision, \
             updated_at = EXCLUDED.updated_at, ",
            vals.join(", ")
        );
        let sql = match self.d {
            Dialect::Postgres => format!(
                "{head}doc = CASE WHEN jsonb_typeof(a.doc -> 'started_at') = 'number' \
                 AND COALESCE((EXCLUDED.doc ->> 'started_at')::bigint >= (a.doc ->> 'started_at')::bigint, TRUE) \
                 THEN jsonb_set(EXCLUDED.doc, '{{started_at}}', a.doc -> 'started_at') \
                 ELSE EXCLUDED.doc END \
                 WHERE a.revision <= EXCLUDED.revision"
            ),
            Dialect::Sqlite => format!("{head}doc = EXCLUDED.doc"),
        };
        Ok(b.statement(sql))
    }

    fn snapshot_values(&self, b: &mut Binds, s: &Snapshot) -> Result<String> {
        let status = name_of(&s.status).map_err(|e| Error::InvalidRecord(e.to_string()))?;
        let vals = [
            b.bind(self.text("biz_key", &s.biz_key)?),
            b.bind(self.text("workflow_type", &s.workflow_type)?),
            b.bind(Param::Text(status)),
            b.bind(self.opt_text("step_name", s.step_name.as_ref())?),
            b.bind(self.revision(s.revision)?),
            b.bind(Param::Int8(s.updated_at.as_millis())),
            b.bind(self.json(s)?),
            b.bind(self.opt_text("wait_signal", s.wait_signal.as_ref())?),
        ];
        Ok(vals.join(", "))
    }

    /// The stored snapshot of `biz_key` ([`doc`]).
    pub fn snapshot_get(&self, biz_key: &str) -> Statement {
        let mut b = Binds::new(self.d);
        let k = b.bind(Param::Text(biz_key.to_string()));
        b.statement(format!("SELECT doc FROM {} WHERE biz_key = {k}", self.snapshots))
    }

    /// PostgreSQL: the upsert applying one observation to its snapshot, the observation's
    /// fields, the stored step map merged with its step, the first terminal time kept while
    /// terminal, revision-guarded. SQLite applies the observation to the stored snapshot in
    /// its transaction and writes it with [`snapshot_put`](Self::snapshot_put): refused here.
    pub fn snapshot_upsert(&self, obs: &Observation) -> Result<Statement> {
        if self.d != Dialect::Postgres {
            return Err(Error::InvalidInput {
                field: "dialect".into(),
                reason: "SQLite merges a snapshot in its transaction, then puts it".into(),
            });
        }
        let mut b = Binds::new(self.d);
        let vals = self.snapshot_values(&mut b, &Snapshot::from_observation(obs))?;
        let sql = format!(
            "INSERT INTO {} AS s ({SNAPSHOT_COLUMNS}) VALUES ({vals}) ON CONFLICT (biz_key) DO UPDATE SET \
             {SNAPSHOT_SET}, \
             doc = EXCLUDED.doc || jsonb_build_object(\
             'steps', COALESCE(s.doc -> 'steps', '{{}}'::jsonb) || (EXCLUDED.doc -> 'steps'), \
             'finished_at', CASE WHEN EXCLUDED.doc -> 'finished_at' = 'null'::jsonb THEN 'null'::jsonb \
             ELSE COALESCE(NULLIF(s.doc -> 'finished_at', 'null'::jsonb), EXCLUDED.doc -> 'finished_at') END) \
             WHERE s.revision <= EXCLUDED.revision",
            self.snapshots
        );
        Ok(b.statement(sql))
    }

    /// The wholesale write of a snapshot unless the stored one is newer, returning a row
    /// when written.
    pub fn snapshot_put(&self, snapshot: &Snapshot) -> Result<Statement> {
        let mut b = Binds::new(self.d);
        let vals = self.snapshot_values(&mut b, snapshot)?;
        let sql = format!(
            "INSERT INTO {} AS s ({SNAPSHOT_COLUMNS}) VALUES ({vals}) ON CONFLICT (biz_key) DO UPDATE SET \
             {SNAPSHOT_SET}, doc = EXCLUDED.doc WHERE s.revision <= EXCLUDED.revision RETURNING 1",
            self.snapshots
        );
        Ok(b.statement(sql))
    }

    /// The `find_snapshots` query: only the filters present, newest `updated_at` first.
    pub fn snapshots_query(&self, q: &SnapshotQuery) -> Result<Statement> {
        q.validate()?;
        let mut f = Filter::new(self.d);
        f.text("workflow_type", q.workflow_type.clone());
        f.text("status", q.status.as_ref().map(name_of).transpose()?);
        f.text("step_name", q.step_name.clone());
        f.text("wait_signal", q.waiting_on.clone());
        f.prefix("biz_key", q.biz_key_prefix.as_ref());
        f.window(q.updated_from, q.updated_to);
        f.cursor("updated_at", "biz_key", q.before.as_ref());
        Ok(f.statement(&self.snapshots, "updated_at DESC, biz_key", q.limit))
    }

    /// The `find_attempts` query: only the filters present, newest `updated_at` first.
    pub fn attempts_query(&self, q: &AttemptQuery) -> Statement {
        let mut f = Filter::new(self.d);
        f.text("biz_key", q.biz_key.clone());
        f.text("workflow_type", q.workflow_type.clone());
        f.text("step_name", q.step_name.clone());
        f.text("outcome", q.outcome.map(|o| o.as_str().to_string()));
        f.window(q.updated_from, q.updated_to);
        f.statement(&self.attempts, "updated_at DESC, biz_key, workflow_run, step_name, attempt", q.limit)
    }

    /// The `find_audit` query: only the filters present, newest `at` first, ties by id.
    pub fn audit_query(&self, q: &AuditQuery) -> Result<Statement> {
        q.validate()?;
        let mut f = Filter::new(self.d);
        f.text("actor", q.actor.clone());
        f.text("action", q.action.clone());
        f.text("target", q.target.clone());
        f.cursor("at", "id", q.before.as_ref());
        Ok(f.statement(&self.audit, "at DESC, id", q.limit))
    }

    /// The insert of an audit entry, nothing when its id is stored.
    pub fn audit_insert(&self, entry: &AuditEntry) -> Result<Statement> {
        entry.validate()?;
        let mut b = Binds::new(self.d);
        let vals = [
            b.bind(self.text("id", &entry.id)?),
            b.bind(Param::Int8(entry.at.as_millis())),
            b.bind(self.text("actor", &entry.actor)?),
            b.bind(self.text("action", &entry.action)?),
            b.bind(self.text("target", &entry.target)?),
            b.bind(self.json(entry)?),
        ];
        let sql = format!(
            "INSERT INTO {} (id, at, actor, action, target, doc) VALUES ({}) ON CONFLICT (id) DO NOTHING",
            self.audit,
            vals.join(", ")
        );
        Ok(b.statement(sql))
    }

    /// The bounded purge of audit entries older than `before`, oldest first, one row
    /// returned per deleted entry.
    pub fn audit_purge(&self, before: Instant, limit: usize) -> Result<Statement> {
        check_audit_purge_limit(limit)?;
        let mut b = Binds::new(self.d);
        let before = b.bind(Param::Int8(before.as_millis()));
        let t = &self.audit;
        Ok(b.statement(format!(
            "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE at < {before} ORDER BY at, id LIMIT {limit}) \
             RETURNING 1"
        )))
    }

    /// [`purge_finished`](observer::ObservationRepository::purge_finished): the snapshots
    /// (selected by `observation_snapshots_status_updated`, deleted only if still finished
    /// and old), one row per snapshot deleted with its `biz_key` ([`biz_key`]). PostgreSQL
    /// deletes every attempt row of their biz keys in the same statement; SQLite deletes
    /// them with [`attempts_delete`](Self::attempts_delete), per key, in the same
    /// transaction.
    pub fn finished_purge(&self, before: Instant, limit: usize) -> Result<Statement> {
        check_finished_purge_limit(limit)?;
        let finished = finished_statuses()?;
        let mut b = Binds::new(self.d);
        let before = b.bind(Param::Int8(before.as_millis()));
        let (snapshots, attempts) = (&self.snapshots, &self.attempts);
        let delete = format!(
            "DELETE FROM {snapshots} WHERE biz_key IN (SELECT biz_key FROM {snapshots} \
             WHERE status IN ({finished}) AND updated_at < {before} ORDER BY updated_at, biz_key LIMIT {limit}) \
             AND status IN ({finished}) AND updated_at < {before} RETURNING biz_key"
        );
        let sql = match self.d {
            Dialect::Postgres => format!(
                "WITH victims AS ({delete}), \
                 rows AS (DELETE FROM {attempts} a USING victims v WHERE a.biz_key = v.biz_key RETURNING 1) \
                 SELECT biz_key FROM victims"
            ),
            Dialect::Sqlite => delete,
        };
        Ok(b.statement(sql))
    }

    /// Every attempt row of `biz_key` (SQLite's second step of
    /// [`finished_purge`](Self::finished_purge)).
    pub fn attempts_delete(&self, biz_key: &str) -> Statement {
        let mut b = Binds::new(self.d);
        let k = b.bind(Param::Text(biz_key.to_string()));
        b.statement(format!("DELETE FROM {} WHERE biz_key = {k}", self.attempts))
    }
}
