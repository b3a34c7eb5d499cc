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

use crate::codec::R;
use crate::error::{self, Op};
use crate::{run, SqliteDb, D};
use kernel_core::domain::Instant;
use kernel_core::ports::Observation;
use observer::{
    check_step_key, AttemptQuery, AttemptRow, AuditEntry, AuditQuery, Error, ObservationRepository, Result, Snapshot,
    SnapshotQuery,
};
use rusqlite::Connection;
use sql_protocol::observation::{self as obs_sql, ObservationSql};
use sql_protocol::Statement;

/// The observation projection in the SQLite file. Cheap to clone (shares the pool).
#[derive(Debug, Clone)]
pub struct SqliteObservationRepository {
    db: SqliteDb,
}

fn map(e: kernel_core::Error, write: bool) -> Error {
    obs_sql::map_error(D, e, write)
}

fn sql() -> ObservationSql {
    ObservationSql::new(D, "")
}

fn read_doc<T: serde::de::DeserializeOwned>(
    c: &Connection,
    what: &str,
    stmt: &Statement,
) -> std::result::Result<Vec<T>, kernel_core::Error> {
    run(c, Op::Read, what, stmt, |r| obs_sql::doc(&R(r)))?.into_iter().collect()
}

/// How many rows the write `stmt` returned, failures mapped as a write's when `write`.
fn write(c: &Connection, what: &str, stmt: &Statement, write: bool) -> Result<usize> {
    Ok(run(c, Op::Write, what, stmt, |_| ()).map_err(|e| map(e, write))?.len())
}

/// The stored attempt row merged with `row`, written when `row` is at least as new.
fn upsert_attempt(c: &Connection, row: &AttemptRow) -> Result<()> {
    let read = sql().attempt_get(row)?;
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
    write(c, "observation attempt upsert", &sql().attempt_upsert(&merged)?, true)?;
    Ok(())
}

/// Write `s` as the snapshot of its biz_key, unless the stored one is newer; returns
/// whether it was written.
fn put(c: &Connection, s: &Snapshot) -> Result<bool> {
    Ok(write(c, "observation snapshot put", &sql().snapshot_put(s)?, true)? > 0)
}

/// One observation: its attempt row, then its snapshot.
fn write_one(c: &Connection, obs: &Observation) -> Result<()> {
    if let Some(name) = &obs.step_name {
        check_step_key(name).map_err(Error::InvalidRecord)?;
    }
    if let Some(row) = AttemptRow::from_observation(obs) {
        upsert_attempt(c, &row)?;
    }
    let read = sql().snapshot_get(&obs.biz_key);
    let stored = read_doc::<Snapshot>(c, "observation snapshot", &read).map_err(|e| map(e, false))?.pop();
    let snapshot = match stored {
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

/// The `find_snapshots` query ([`ObservationSql::snapshots_query`]).
pub fn snapshots_query(q: &SnapshotQuery) -> Result<Statement> {
    sql().snapshots_query(q)
}

/// The `find_attempts` query ([`ObservationSql::attempts_query`]).
pub fn attempts_query(q: &AttemptQuery) -> Result<Statement> {
    Ok(sql().attempts_query(q))
}

/// The `find_audit` query ([`ObservationSql::audit_query`]).
pub fn audit_query(q: &AuditQuery) -> Result<Statement> {
    sql().audit_query(q)
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
        Ok(self.read("observation snapshot", Ok(sql().snapshot_get(biz_key))).await?.pop())
    }

    async fn find_snapshots(&self, query: &SnapshotQuery) -> Result<Vec<Snapshot>> {
        self.read("observation snapshots", snapshots_query(query)).await
    }

    async fn find_attempts(&self, query: &AttemptQuery) -> Result<Vec<AttemptRow>> {
        self.read("observation attempts", attempts_query(query)).await
    }

    async fn append_audit(&self, entry: &AuditEntry) -> Result<()> {
        let stmt = sql().audit_insert(entry)?;
        self.transaction("observation audit append", move |c| {
            write(c, "observation audit append", &stmt, true)?;
            Ok(())
        })
        .await
    }

    async fn find_audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>> {
        self.read("observation audit", audit_query(query)).await
    }

    async fn purge_audit(&self, before: Instant, limit: usize) -> Result<u64> {
        let stmt = sql().audit_purge(before, limit)?;
        self.transaction("observation audit purge", move |c| {
            Ok(write(c, "observation audit purge", &stmt, false)? as u64)
        })
        .await
    }

    async fn purge_finished(&self, before: Instant, limit: usize) -> Result<u64> {
        // The snapshots, then every attempt row of their biz keys (primary key prefix), in
        // one transaction.
        let snapshots = sql().finished_purge(before, limit)?;
        self.transaction("observation finished purge", move |c| {
            let what = "observation finished purge";
            let keys = run(c, Op::Write, what, &snapshots, |r| obs_sql::biz_key(&R(r))).map_err(|e| map(e, false))?;
            let mut deleted = 0u64;
            for key in keys {
                let key = key.map_err(|e| map(e, false))?;
                write(c, what, &sql().attempts_delete(&key), false)?;
                deleted += 1;
            }
            Ok(deleted)
        })
        .await
    }
}
