//! The observer's projection on PostgreSQL: [`PostgresObservationRepository`] implements
//! [`ObservationRepository`] (and so serves [`OpsView`](observer::OpsView)) on the tables
//! `observation_attempts` and `observation_snapshots` of migration 3 (the snapshot's
//! `wait_signal` column and the audit log `observation_audit` of migration 10). It never
//! reads `workflow_instances`.
//!
//! Each record is **one** autocommit upsert, `INSERT … ON CONFLICT (<key>) DO UPDATE SET …
//! WHERE <stored>.revision <= EXCLUDED.revision`: a newer or equal revision is applied, an
//! older one updates nothing (not an error). The attempt row keeps the earliest
//! `started_at` it has seen: the stored one stays when the newer row has none or a later
//! one (`AttemptRow::merge`), decided inside the same upsert; the snapshot merges its
//! per-step map and keeps its first terminal time, as the in-memory reference does. A batch is written record by record
//! (one biz_key may appear several times in a batch, which a multi-row upsert refuses),
//! attempt row before snapshot.
//!
//! Errors: a record PostgreSQL or K-2.0 refuses (a step name that cannot be a key, NUL in a
//! string, a revision past `bigint`) is [`Error::InvalidRecord`], the batch's other records
//! still written. Every other failure is [`Error::Unavailable`], including a write whose
//! outcome is uncertain: every upsert is idempotent, so writing the same batch again is the
//! correct answer to both.
//!
//! Queries: a biz-key prefix is the range `biz_key >= prefix AND biz_key < bound`
//! ([`prefix_upper_bound`]; keys are `COLLATE "C"`, so no character is a wildcard and the
//! primary key answers it); a paging cursor is `(t < $a OR (t = $a AND key > $b))`. An
//! audit entry is one `INSERT … ON CONFLICT (id) DO NOTHING`; a purge one `DELETE … WHERE
//! id IN (SELECT … ORDER BY at, id LIMIT n)`.

use crate::error::Op;
use crate::protocol::{table, Param, Statement};
use crate::{Db, PostgresConfig};
use kernel_core::domain::Instant;
use kernel_core::ports::Observation;
use observer::audit::check_audit_purge_limit;
use observer::projection::{effective_limit, prefix_upper_bound};
use observer::{check_finished_purge_limit, FINISHED_STATUSES};
use observer::{
    check_step_key, AttemptQuery, AttemptRow, AuditEntry, AuditQuery, Error, ObservationRepository, Result, Snapshot,
    SnapshotQuery,
};
use serde_json::Value;

/// Name of the attempt-row table.
pub const OBSERVATION_ATTEMPTS: &str = "observation_attempts";
/// Name of the snapshot table (`biz_key` primary key).
pub const OBSERVATION_SNAPSHOTS: &str = "observation_snapshots";
/// Name of the operator audit table (`id` primary key).
pub const OBSERVATION_AUDIT: &str = "observation_audit";

/// The observation projection on PostgreSQL. Cheap to clone (shares the pool).
#[derive(Debug, Clone)]
pub struct PostgresObservationRepository {
    db: Db,
}

/// A kernel-side failure of one call, in the projection's terms.
fn map(e: kernel_core::Error, write: bool) -> Error {
    match e {
        kernel_core::Error::InvalidInput { field, reason, .. } if write => {
            Error::InvalidRecord(format!("{field}: {reason}"))
        }
        kernel_core::Error::InvalidInput { field, reason, .. } => Error::InvalidInput { field, reason },
        // Unavailable, and Uncertain: the upserts are idempotent, the same batch is retried.
        other => Error::unavailable_with(format!("postgres observations: {other}"), other),
    }
}

fn json<T: serde::Serialize>(v: &T) -> Result<Value> {
    serde_json::to_value(v).map_err(|e| Error::InvalidRecord(e.to_string()))
}

/// A serde enum's snake_case name (status, outcome) as stored in its column.
fn name_of<T: serde::Serialize>(v: &T) -> Result<String> {
    match serde_json::to_value(v) {
        Ok(Value::String(s)) => Ok(s),
        other => Err(Error::InvalidInput { field: "query".into(), reason: format!("not a name: {other:?}") }),
    }
}

fn revision(r: u64) -> Result<i64> {
    i64::try_from(r).map_err(|_| Error::InvalidRecord(format!("revision {r} exceeds PostgreSQL's bigint")))
}

/// The upsert of an attempt row: revision-guarded, every column and document field from
/// `row` except `started_at`, which keeps the stored one when that is a number and `row`'s
/// is absent or not earlier.
pub fn attempt_upsert(schema: &str, row: &AttemptRow) -> Result<Statement> {
    let t = table(schema, OBSERVATION_ATTEMPTS);
    let sql = format!(
        "INSERT INTO {t} AS a (biz_key, workflow_run, step_name, attempt, workflow_type, outcome, revision, \
         updated_at, doc) VALUES ($1::text, $2::bigint, $3::text, $4::bigint, $5::text, $6::text, $7::bigint, \
         $8::bigint, $9::jsonb) \
         ON CONFLICT (biz_key, workflow_run, step_name, attempt) DO UPDATE SET \
         workflow_type = EXCLUDED.workflow_type, outcome = EXCLUDED.outcome, revision = EXCLUDED.revision, \
         updated_at = EXCLUDED.updated_at, \
         doc = CASE WHEN jsonb_typeof(a.doc -> 'started_at') = 'number' \
         AND COALESCE((EXCLUDED.doc ->> 'started_at')::bigint >= (a.doc ->> 'started_at')::bigint, TRUE) \
         THEN jsonb_set(EXCLUDED.doc, '{{started_at}}', a.doc -> 'started_at') \
         ELSE EXCLUDED.doc END \
         WHERE a.revision <= EXCLUDED.revision"
    );
    let params = vec![
        Param::Text(row.biz_key.clone()),
        Param::Int8(row.workflow_run.into()),
        Param::Text(row.step_name.clone()),
        Param::Int8(row.attempt.into()),
        Param::Text(row.workflow_type.clone()),
        Param::Text(row.outcome.as_str().to_string()),
        Param::Int8(revision(row.revision)?),
        Param::Int8(row.updated_at.as_millis()),
        Param::Jsonb(json(row)?),
    ];
    Ok(Statement { sql, params })
}

fn snapshot_params(s: &Snapshot) -> Result<Vec<Param>> {
    Ok(vec![
        Param::Text(s.biz_key.clone()),
        Param::Text(s.workflow_type.clone()),
        Param::Text(name_of(&s.status).map_err(|e| Error::InvalidRecord(e.to_string()))?),
        match &s.step_name {
            Some(n) => Param::Text(n.clone()),
            None => Param::NullText,
        },
        Param::Int8(revision(s.revision)?),
        Param::Int8(s.updated_at.as_millis()),
        Param::Jsonb(json(s)?),
        match &s.wait_signal {
            Some(w) => Param::Text(w.clone()),
            None => Param::NullText,
        },
    ])
}

const SNAPSHOT_INSERT: &str = "(biz_key, workflow_type, status, step_name, revision, updated_at, doc, wait_signal) \
     VALUES ($1::text, $2::text, $3::text, $4::text, $5::bigint, $6::bigint, $7::jsonb, $8::text) \
     ON CONFLICT (biz_key) DO UPDATE SET workflow_type = EXCLUDED.workflow_type, status = EXCLUDED.status, \
     step_name = EXCLUDED.step_name, revision = EXCLUDED.revision, updated_at = EXCLUDED.updated_at, \
     wait_signal = EXCLUDED.wait_signal, ";

/// The upsert applying one observation to its snapshot: the observation's fields, the
/// stored step map merged with its step, the first terminal time kept while terminal.
pub fn snapshot_upsert(schema: &str, obs: &Observation) -> Result<Statement> {
    let t = table(schema, OBSERVATION_SNAPSHOTS);
    let sql = format!(
        "INSERT INTO {t} AS s {SNAPSHOT_INSERT}\
         doc = EXCLUDED.doc || jsonb_build_object(\
         'steps', COALESCE(s.doc -> 'steps', '{{}}'::jsonb) || (EXCLUDED.doc -> 'steps'), \
         'finished_at', CASE WHEN EXCLUDED.doc -> 'finished_at' = 'null'::jsonb THEN 'null'::jsonb \
         ELSE COALESCE(NULLIF(s.doc -> 'finished_at', 'null'::jsonb), EXCLUDED.doc -> 'finished_at') END) \
         WHERE s.revision <= EXCLUDED.revision"
    );
    Ok(Statement { sql, params: snapshot_params(&Snapshot::from_observation(obs))? })
}

/// The wholesale replacement of a snapshot (repair), returning a row when applied.
pub fn snapshot_put(schema: &str, snapshot: &Snapshot) -> Result<Statement> {
    let t = table(schema, OBSERVATION_SNAPSHOTS);
    let sql = format!(
        "INSERT INTO {t} AS s {SNAPSHOT_INSERT}doc = EXCLUDED.doc WHERE s.revision <= EXCLUDED.revision RETURNING 1"
    );
    Ok(Statement { sql, params: snapshot_params(snapshot)? })
}

/// Appends `column <op> $n` for each present filter.
#[derive(Default)]
struct Filter {
    conds: Vec<String>,
    params: Vec<Param>,
}

impl Filter {
    fn push(&mut self, column: &str, op: &str, p: Param) {
        self.params.push(p);
        let cast = if matches!(self.params.last(), Some(Param::Int8(_))) { "bigint" } else { "text" };
        self.conds.push(format!("{column} {op} ${}::{cast}", self.params.len()));
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
            self.conds.push(format!("({time} < ${t}::bigint OR ({time} = ${t}::bigint AND {key} > ${k}::text))"));
        }
    }

    fn statement(self, table: &str, order: &str, limit: usize) -> Statement {
        let cond = if self.conds.is_empty() { String::new() } else { format!(" WHERE {}", self.conds.join(" AND ")) };
        let limit = effective_limit(limit);
        Statement { sql: format!("SELECT doc FROM {table}{cond} ORDER BY {order} LIMIT {limit}"), params: self.params }
    }
}

/// The `find_snapshots` query: only the filters present, newest `updated_at` first.
pub fn snapshots_query(schema: &str, q: &SnapshotQuery) -> Result<Statement> {
    q.validate()?;
    let mut f = Filter::default();
    f.text("workflow_type", q.workflow_type.clone());
    f.text("status", q.status.as_ref().map(name_of).transpose()?);
    f.text("step_name", q.step_name.clone());
    f.text("wait_signal", q.waiting_on.clone());
    f.prefix("biz_key", q.biz_key_prefix.as_ref());
    f.window(q.updated_from, q.updated_to);
    f.cursor("updated_at", "biz_key", q.before.as_ref());
    Ok(f.statement(&table(schema, OBSERVATION_SNAPSHOTS), "updated_at DESC, biz_key", q.limit))
}

/// The `find_attempts` query: only the filters present, newest `updated_at` first.
pub fn attempts_query(schema: &str, q: &AttemptQuery) -> Result<Statement> {
    let mut f = Filter::default();
    f.text("biz_key", q.biz_key.clone());
    f.text("workflow_type", q.workflow_type.clone());
    f.text("step_name", q.step_name.clone());
    f.text("outcome", q.outcome.map(|o| o.as_str().to_string()));
    f.window(q.updated_from, q.updated_to);
    Ok(f.statement(
        &table(schema, OBSERVATION_ATTEMPTS),
        "updated_at DESC, biz_key, workflow_run, step_name, attempt",
        q.limit,
    ))
}

/// The `find_audit` query: only the filters present, newest `at` first, ties by id.
pub fn audit_query(schema: &str, q: &AuditQuery) -> Result<Statement> {
    q.validate()?;
    let mut f = Filter::default();
    f.text("actor", q.actor.clone());
    f.text("action", q.action.clone());
    f.text("target", q.target.clone());
    f.cursor("at", "id", q.before.as_ref());
    Ok(f.statement(&table(schema, OBSERVATION_AUDIT), "at DESC, id", q.limit))
}

/// The insert of an audit entry, nothing when its id is stored.
pub fn audit_insert(schema: &str, entry: &AuditEntry) -> Result<Statement> {
    entry.validate()?;
    let t = table(schema, OBSERVATION_AUDIT);
    Ok(Statement {
        sql: format!(
            "INSERT INTO {t} (id, at, actor, action, target, doc) \
             VALUES ($1::text, $2::bigint, $3::text, $4::text, $5::text, $6::jsonb) ON CONFLICT (id) DO NOTHING"
        ),
        params: vec![
            Param::Text(entry.id.clone()),
            Param::Int8(entry.at.as_millis()),
            Param::Text(entry.actor.clone()),
            Param::Text(entry.action.clone()),
            Param::Text(entry.target.clone()),
            Param::Jsonb(json(entry)?),
        ],
    })
}

/// The bounded purge of audit entries older than `before`, oldest first, one row returned
/// per deleted entry.
pub fn audit_purge(schema: &str, before: Instant, limit: usize) -> Result<Statement> {
    check_audit_purge_limit(limit)?;
    let t = table(schema, OBSERVATION_AUDIT);
    Ok(Statement {
        sql: format!(
            "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE at < $1::bigint ORDER BY at, id LIMIT {limit}) \
             RETURNING 1"
        ),
        params: vec![Param::Int8(before.as_millis())],
    })
}

/// [`purge_finished`](ObservationRepository::purge_finished) as one statement: the
/// snapshots (selected by `observation_snapshots_status_updated`, deleted only if still
/// finished and old) and every attempt row of their biz keys, in one transaction; returns
/// one row per snapshot deleted.
pub fn finished_purge(schema: &str, before: Instant, limit: usize) -> Result<Statement> {
    check_finished_purge_limit(limit)?;
    let snapshots = table(schema, OBSERVATION_SNAPSHOTS);
    let attempts = table(schema, OBSERVATION_ATTEMPTS);
    let finished = finished_statuses()?;
    Ok(Statement {
        sql: format!(
            "WITH victims AS (DELETE FROM {snapshots} WHERE biz_key IN (SELECT biz_key FROM {snapshots} \
             WHERE status IN ({finished}) AND updated_at < $1::bigint ORDER BY updated_at, biz_key LIMIT {limit}) \
             AND status IN ({finished}) AND updated_at < $1::bigint RETURNING biz_key), \
             rows AS (DELETE FROM {attempts} a USING victims v WHERE a.biz_key = v.biz_key RETURNING 1) \
             SELECT biz_key FROM victims"
        ),
        params: vec![Param::Int8(before.as_millis())],
    })
}

/// The terminal statuses as an SQL list of their stored names (constants of the kernel's
/// enum, never user input).
fn finished_statuses() -> Result<String> {
    let names = FINISHED_STATUSES.iter().map(name_of).collect::<Result<Vec<String>>>()?;
    Ok(names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", "))
}

impl PostgresObservationRepository {
    /// The repository on `pool`, in `config.schema` (migrated by [`crate::migrate`]).
    pub fn new(pool: crate::Pool, config: PostgresConfig) -> kernel_core::Result<Self> {
        Ok(PostgresObservationRepository { db: Db::new(pool, config)? })
    }

    async fn write(&self, what: &str, stmt: Result<Statement>) -> Result<Vec<tokio_postgres::Row>> {
        self.db.query(Op::Write, what, &stmt?).await.map_err(|e| map(e, true))
    }

    async fn read<T: serde::de::DeserializeOwned>(&self, what: &str, stmt: Result<Statement>) -> Result<Vec<T>> {
        let rows = self.db.query(Op::Read, what, &stmt?).await.map_err(|e| map(e, false))?;
        rows.iter()
            .map(|r| {
                let doc: Value =
                    r.try_get(0).map_err(|e| Error::unavailable_with(format!("{what}: decode: {e}"), e))?;
                serde_json::from_value(doc).map_err(|e| Error::unavailable_with(format!("{what}: decode: {e}"), e))
            })
            .collect()
    }
}

#[async_trait::async_trait]
impl ObservationRepository for PostgresObservationRepository {
    async fn write_batch(&self, batch: &[Observation]) -> Result<()> {
        let schema = self.db.schema().to_string();
        let mut invalid = None;
        for obs in batch {
            if let Some(name) = &obs.step_name {
                if let Err(reason) = check_step_key(name) {
                    invalid.get_or_insert(reason);
                    continue;
                }
            }
            // Attempt row first: a snapshot never points at a row that is missing for good.
            if let Some(row) = AttemptRow::from_observation(obs) {
                match self.write("observation attempt upsert", attempt_upsert(&schema, &row)).await {
                    Err(Error::InvalidRecord(m)) => {
                        invalid.get_or_insert(m);
                        continue;
                    }
                    Err(e) => return Err(e),
                    Ok(_) => {}
                }
            }
            match self.write("observation snapshot upsert", snapshot_upsert(&schema, obs)).await {
                Err(Error::InvalidRecord(m)) => {
                    invalid.get_or_insert(m);
                }
                Err(e) => return Err(e),
                Ok(_) => {}
            }
        }
        invalid.map_or(Ok(()), |m| Err(Error::InvalidRecord(m)))
    }

    async fn put_snapshot(&self, snapshot: &Snapshot) -> Result<bool> {
        for name in snapshot.steps.keys() {
            check_step_key(name).map_err(Error::InvalidRecord)?;
        }
        let rows = self.write("observation snapshot put", snapshot_put(self.db.schema(), snapshot)).await?;
        Ok(!rows.is_empty())
    }

    async fn snapshot(&self, biz_key: &str) -> Result<Option<Snapshot>> {
        let t = table(self.db.schema(), OBSERVATION_SNAPSHOTS);
        let stmt = Statement {
            sql: format!("SELECT doc FROM {t} WHERE biz_key = $1::text"),
            params: vec![Param::Text(biz_key.to_string())],
        };
        Ok(self.read("observation snapshot", Ok(stmt)).await?.pop())
    }

    async fn find_snapshots(&self, query: &SnapshotQuery) -> Result<Vec<Snapshot>> {
        self.read("observation snapshots", snapshots_query(self.db.schema(), query)).await
    }

    async fn find_attempts(&self, query: &AttemptQuery) -> Result<Vec<AttemptRow>> {
        self.read("observation attempts", attempts_query(self.db.schema(), query)).await
    }

    async fn append_audit(&self, entry: &AuditEntry) -> Result<()> {
        self.write("observation audit append", audit_insert(self.db.schema(), entry)).await?;
        Ok(())
    }

    async fn find_audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>> {
        self.read("observation audit", audit_query(self.db.schema(), query)).await
    }

    async fn purge_audit(&self, before: Instant, limit: usize) -> Result<u64> {
        let stmt = audit_purge(self.db.schema(), before, limit)?;
        let rows = self.db.query(Op::Write, "observation audit purge", &stmt).await.map_err(|e| map(e, false))?;
        Ok(rows.len() as u64)
    }

    async fn purge_finished(&self, before: Instant, limit: usize) -> Result<u64> {
        let stmt = finished_purge(self.db.schema(), before, limit)?;
        let rows = self.db.query(Op::Write, "observation finished purge", &stmt).await.map_err(|e| map(e, false))?;
        Ok(rows.len() as u64)
    }
}
