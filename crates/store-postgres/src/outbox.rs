//! The dispatch outbox on the user's business table (K-11, K-12).
//!
//! The adapter knows only what it is told about the business table ([`OutboxTable`]): its
//! schema and name, the `text` primary-key column (default `object_id`), the business
//! status column (default `business_status`), the `jsonb` column holding the user's fields
//! (default `fields`), the `jsonb` column holding the intent (default `workflow_dispatch`,
//! in the serde form of [`DispatchIntent`]), the path inside the fields a new round
//! clears (default `previous_error`) and the failed status (default `failed`). Every write
//! is one autocommit statement, rendered by [`sql_protocol::outbox`] (the table of
//! conditions and assignments is there); this adapter binds, runs and decodes them.

use crate::error::Op;
use crate::{Db, Pool, PostgresConfig, PG};
use kernel_core::model::Instant;
use kernel_core::ports::*;
use kernel_core::{Error, FencingToken, LeaseToken, ObjectId, Result};
use serde_json::Value;
use sql_protocol::outbox::{OutboxColumns, OutboxSql};
use sql_protocol::{row, Statement};

/// Where the outbox lives in the user's business table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxTable {
    /// Schema of the business table.
    pub schema: String,
    /// The business table.
    pub table: String,
    /// Its `text` primary key.
    pub id_column: String,
    /// Its `text` business status column.
    pub status_column: String,
    /// Its `jsonb` column of the user's fields.
    pub fields_column: String,
    /// Its `jsonb` column holding the intent.
    pub dispatch_column: String,
    /// Path (dotted) inside the fields that a new round clears.
    pub error_field: String,
    /// Business status that allows a new round.
    pub failed_status: String,
}

impl Default for OutboxTable {
    fn default() -> Self {
        OutboxTable {
            schema: "public".into(),
            table: "business_objects".into(),
            id_column: "object_id".into(),
            status_column: "business_status".into(),
            fields_column: "fields".into(),
            dispatch_column: "workflow_dispatch".into(),
            error_field: "previous_error".into(),
            failed_status: "failed".into(),
        }
    }
}

impl OutboxTable {
    fn t(&self) -> String {
        format!("\"{}\".\"{}\"", self.schema, self.table)
    }

    fn locks(&self) -> String {
        format!("\"{}\".\"{}_locks\"", self.schema, self.table)
    }
}

/// [`DispatchOutbox`] on a PostgreSQL business table. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PostgresOutbox {
    db: Db,
    table: OutboxTable,
    sql: OutboxSql,
}

impl PostgresOutbox {
    /// The outbox on `table` (checked), through `pool` with the deadlines and limits of
    /// `config`. No round trip is made; [`ensure_table`](Self::ensure_table) creates the
    /// table when the application does not own its DDL.
    pub fn new(pool: Pool, config: PostgresConfig, table: OutboxTable) -> Result<Self> {
        for (field, name) in [("schema", &table.schema), ("table", &table.table)] {
            crate::schema_name(name)
                .map_err(|_| Error::invalid(field, format_args!("{name:?} is not a plain identifier")))?;
        }
        let columns = OutboxColumns {
            id: &table.id_column,
            status: &table.status_column,
            fields: &table.fields_column,
            dispatch: &table.dispatch_column,
            error_field: &table.error_field,
            failed_status: &table.failed_status,
        };
        let sql = OutboxSql::new(PG, config.limits, table.t(), table.locks(), &columns)?;
        Ok(PostgresOutbox { db: Db::new(pool, config)?, table, sql })
    }

    /// Create the business table (if absent), its lock table and the index of the
    /// recovery scan (due pending intents and expired leases, by id). Idempotent; a table
    /// the application created needs the four configured columns.
    pub async fn ensure_table(&self) -> Result<()> {
        let o = &self.table;
        let (id, st, f, d) = (&o.id_column, &o.status_column, &o.fields_column, &o.dispatch_column);
        let sql = format!(
            "CREATE SCHEMA IF NOT EXISTS \"{schema}\";
             CREATE TABLE IF NOT EXISTS {t} (\"{id}\" text COLLATE \"C\" PRIMARY KEY, \"{st}\" text, \
               \"{f}\" jsonb NOT NULL DEFAULT '{{}}', \"{d}\" jsonb);
             CREATE INDEX IF NOT EXISTS \"{table}_dispatch_due\" ON {t} (\"{id}\") \
               WHERE \"{d}\" ->> 'status' IN ('pending', 'processing');
             CREATE TABLE IF NOT EXISTS {locks} (name text COLLATE \"C\" PRIMARY KEY, holder text NOT NULL, \
               until bigint NOT NULL);",
            schema = o.schema,
            table = o.table,
            t = o.t(),
            locks = o.locks(),
        );
        let client = self.db.pool.get().await.map_err(|e| crate::error::before_send("outbox: connect", e))?;
        client.batch_execute(&sql).await.map_err(|e| crate::error::map(Op::Read, "outbox: create table", e))
    }

    /// One conditional write; `true` when it matched.
    async fn update(&self, what: &'static str, stmt: Statement) -> Result<bool> {
        self.db.write(what, stmt).await
    }
}

#[async_trait::async_trait]
impl DispatchOutbox for PostgresOutbox {
    async fn accept(
        &self,
        object_id: &ObjectId,
        fields: Value,
        initial_status: &str,
        intent: DispatchIntent,
    ) -> Result<AcceptOutcome> {
        let stmt = self.sql.accept(object_id, fields, initial_status, &intent)?;
        Ok(if self.update("accept", stmt).await? { AcceptOutcome::Accepted } else { AcceptOutcome::Exists })
    }

    async fn get(&self, object_id: &ObjectId) -> Result<Option<DispatchRecord>> {
        let stmt = self.sql.get(object_id)?;
        self.db.row(Op::Read, "get object", stmt, |r| row::dispatch_record(r)).await
    }

    async fn confirm_dispatched(&self, object_id: &ObjectId, f: &FencingToken) -> Result<bool> {
        self.update("confirm dispatched", self.sql.confirm_dispatched(object_id, f)?).await
    }

    async fn defer_pending(&self, object_id: &ObjectId, f: &FencingToken, at: Instant) -> Result<bool> {
        self.update("defer intent", self.sql.defer_pending(object_id, f, at)?).await
    }

    async fn try_lease(
        &self,
        object_id: &ObjectId,
        now: Instant,
        lease: &LeaseToken,
        until: Instant,
    ) -> Result<Option<DispatchRecord>> {
        let stmt = self.sql.try_lease(object_id, now, lease, until)?;
        self.db.row(Op::Write, "take dispatch lease", stmt, |r| row::dispatch_record(r)).await
    }

    async fn renew_lease(
        &self,
        object_id: &ObjectId,
        f: &FencingToken,
        lease: &LeaseToken,
        until: Instant,
    ) -> Result<bool> {
        self.update("renew dispatch lease", self.sql.renew_lease(object_id, f, lease, until)?).await
    }

    async fn confirm_leased(&self, object_id: &ObjectId, f: &FencingToken, lease: &LeaseToken) -> Result<bool> {
        self.update("confirm leased intent", self.sql.confirm_leased(object_id, f, lease)?).await
    }

    async fn revert_leased(
        &self,
        object_id: &ObjectId,
        f: &FencingToken,
        lease: &LeaseToken,
        at: Instant,
    ) -> Result<bool> {
        self.update("revert leased intent", self.sql.revert_leased(object_id, f, lease, at)?).await
    }

    async fn scan_due(&self, now: Instant, after: Option<&ObjectId>, limit: usize) -> Result<Vec<(ObjectId, Instant)>> {
        let Some(stmt) = self.sql.scan_due(now, after, self.db.page(limit))? else { return Ok(vec![]) };
        self.db.rows(Op::Read, "scan due intents", stmt, |r| row::due_object(r)).await
    }

    async fn retry_failed(
        &self,
        object_id: &ObjectId,
        prev: &FencingToken,
        next: DispatchIntent,
        initial_status: &str,
    ) -> Result<bool> {
        self.update("install new round", self.sql.retry_failed(object_id, prev, &next, initial_status)?).await
    }

    async fn fenced_update(
        &self,
        object_id: &ObjectId,
        f: &FencingToken,
        fields: Value,
        status: Option<&str>,
    ) -> Result<bool> {
        match self.sql.fenced_update(object_id, f, fields, status)? {
            Some(stmt) => self.update("fenced business write", stmt).await,
            None => Ok(false),
        }
    }

    async fn try_lock(&self, name: &str, holder: &str, now: Instant, until: Instant) -> Result<bool> {
        self.update("take scan lock", self.sql.try_lock(name, holder, now, until)?).await
    }
}
