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
use crate::{Db, PostgresConfig, PG};
use kernel_core::domain::Instant;
use kernel_core::ports::Observation;
use observer::{
    check_step_key, AttemptQuery, AttemptRow, AuditEntry, AuditQuery, Error, ObservationRepository, Result, Snapshot,
    SnapshotQuery,
};
use sql_protocol::observation::{self as obs_sql, ObservationSql};
pub use sql_protocol::observation::{OBSERVATION_ATTEMPTS, OBSERVATION_SNAPSHOTS};
use sql_protocol::Statement;

/// The observation projection on PostgreSQL. Cheap to clone (shares the pool).
#[derive(Debug, Clone)]
pub struct PostgresObservationRepository {
    db: Db,
    sql: ObservationSql,
}

fn sql(schema: &str) -> ObservationSql {
    ObservationSql::new(PG, &format!("\"{schema}\"."))
}

/// The upsert of an attempt row ([`ObservationSql::attempt_upsert`]).
pub fn attempt_upsert(schema: &str, row: &AttemptRow) -> Result<Statement> {
    sql(schema).attempt_upsert(row)
}

/// The upsert applying one observation to its snapshot ([`ObservationSql::snapshot_upsert`]).
pub fn snapshot_upsert(schema: &str, obs: &Observation) -> Result<Statement> {
    sql(schema).snapshot_upsert(obs)
}

/// The wholesale replacement of a snapshot (repair), returning a row when applied.
pub fn snapshot_put(schema: &str, snapshot: &Snapshot) -> Result<Statement> {
    sql(schema).snapshot_put(snapshot)
}

/// The `find_snapshots` query ([`ObservationSql::snapshots_query`]).
pub fn snapshots_query(schema: &str, q: &SnapshotQuery) -> Result<Statement> {
    sql(schema).snapshots_query(q)
}

/// The `find_attempts` query ([`ObservationSql::attempts_query`]).
pub fn attempts_query(schema: &str, q: &AttemptQuery) -> Result<Statement> {
    Ok(sql(schema).attempts_query(q))
}

fn map(e: kernel_core::Error, write: bool) -> Error {
    obs_sql::map_error(PG, e, write)
}

impl PostgresObservationRepository {
    /// The repository on `pool`, in `config.schema` (migrated by [`crate::migrate`]).
    pub fn new(pool: crate::Pool, config: PostgresConfig) -> kernel_core::Result<Self> {
        let db = Db::new(pool, config)?;
        let sql = sql(db.schema());
        Ok(PostgresObservationRepository { db, sql })
    }

    /// How many rows the write `stmt` returned; a refused value is the record's.
    async fn write(&self, what: &str, stmt: Result<Statement>) -> Result<usize> {
        self.count(what, stmt?, true).await
    }

    /// How many rows the write `stmt` returned, failures mapped as a write's when `write`.
    async fn count(&self, what: &str, stmt: Statement, write: bool) -> Result<usize> {
        let rows = self.db.rows(Op::Write, what, stmt, |_| Ok(())).await.map_err(|e| map(e, write))?;
        Ok(rows.len())
    }

    async fn read<T: serde::de::DeserializeOwned>(&self, what: &str, stmt: Result<Statement>) -> Result<Vec<T>> {
        self.db.rows(Op::Read, what, stmt?, |r| obs_sql::doc(r)).await.map_err(|e| map(e, false))
    }
}

#[async_trait::async_trait]
impl ObservationRepository for PostgresObservationRepository {
    async fn write_batch(&self, batch: &[Observation]) -> Result<()> {
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
                match self.write("observation attempt upsert", self.sql.attempt_upsert(&row)).await {
                    Err(Error::InvalidRecord(m)) => {
                        invalid.get_or_insert(m);
                        continue;
                    }
                    Err(e) => return Err(e),
                    Ok(_) => {}
                }
            }
            match self.write("observation snapshot upsert", self.sql.snapshot_upsert(obs)).await {
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
        Ok(self.write("observation snapshot put", self.sql.snapshot_put(snapshot)).await? > 0)
    }

    async fn snapshot(&self, biz_key: &str) -> Result<Option<Snapshot>> {
        Ok(self.read("observation snapshot", Ok(self.sql.snapshot_get(biz_key))).await?.pop())
    }

    async fn find_snapshots(&self, query: &SnapshotQuery) -> Result<Vec<Snapshot>> {
        self.read("observation snapshots", self.sql.snapshots_query(query)).await
    }

    async fn find_attempts(&self, query: &AttemptQuery) -> Result<Vec<AttemptRow>> {
        self.read("observation attempts", Ok(self.sql.attempts_query(query))).await
    }

    async fn append_audit(&self, entry: &AuditEntry) -> Result<()> {
        self.write("observation audit append", self.sql.audit_insert(entry)).await?;
        Ok(())
    }

    async fn find_audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>> {
        self.read("observation audit", self.sql.audit_query(query)).await
    }

    async fn purge_audit(&self, before: Instant, limit: usize) -> Result<u64> {
        let stmt = self.sql.audit_purge(before, limit)?;
        Ok(self.count("observation audit purge", stmt, false).await? as u64)
    }

    async fn purge_finished(&self, before: Instant, limit: usize) -> Result<u64> {
        let stmt = self.sql.finished_purge(before, limit)?;
        Ok(self.count("observation finished purge", stmt, false).await? as u64)
    }
}
