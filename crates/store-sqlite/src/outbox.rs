//! The dispatch outbox on the user's business table (K-11, K-12).
//!
//! The adapter knows only what it is told about the business table ([`OutboxTable`]): its
//! name, the `TEXT` primary-key column (default `object_id`), the business status column
//! (default `business_status`), the JSON column holding the user's fields (default
//! `fields`), the JSON column holding the intent (default `workflow_dispatch`, in the
//! serde form of [`DispatchIntent`](kernel_core::ports::DispatchIntent)), the path inside the fields a new round clears
//! (default `previous_error`) and the failed status (default `failed`). Every write is one
//! autocommit statement, rendered by [`sql_protocol::outbox`] (the table of conditions and
//! assignments is there); this adapter binds, runs and decodes them.

use crate::error::Op;
use crate::{SqliteDb, D};
use kernel_core::Result;
use sql_protocol::outbox::{plain_identifier, OutboxColumns, OutboxSql};
use sql_protocol::Statement;

/// Where the outbox lives in the user's business table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxTable {
    /// The business table.
    pub table: String,
    /// Its `TEXT` primary key.
    pub id_column: String,
    /// Its `TEXT` business status column.
    pub status_column: String,
    /// Its JSON column of the user's fields.
    pub fields_column: String,
    /// Its JSON column holding the intent.
    pub dispatch_column: String,
    /// Path (dotted) inside the fields that a new round clears.
    pub error_field: String,
    /// Business status that allows a new round.
    pub failed_status: String,
}

impl Default for OutboxTable {
    fn default() -> Self {
        OutboxTable {
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

/// [`DispatchOutbox`](kernel_core::ports::DispatchOutbox) on a business table in the SQLite file. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SqliteOutbox {
    db: SqliteDb,
    table: OutboxTable,
    sql: OutboxSql,
}

impl SqliteOutbox {
    /// The outbox on `table` (checked) in `db`'s file. Nothing is executed;
    /// [`ensure_table`](Self::ensure_table) creates the table when the application does
    /// not own its DDL.
    pub fn new(db: SqliteDb, table: OutboxTable) -> Result<Self> {
        plain_identifier("table", &table.table)?;
        let columns = OutboxColumns {
            id: &table.id_column,
            status: &table.status_column,
            fields: &table.fields_column,
            dispatch: &table.dispatch_column,
            error_field: &table.error_field,
            failed_status: &table.failed_status,
        };
        let (t, locks) = (format!("\"{}\"", table.table), format!("\"{}_locks\"", table.table));
        let sql = OutboxSql::new(D, db.config().limits, t, locks, &columns)?;
        Ok(SqliteOutbox { db, table, sql })
    }

    /// Create the business table (if absent), its lock table and the index of the
    /// recovery scan (intents not yet dispatched, by id). Idempotent; a table the
    /// application created needs the four configured columns.
    pub async fn ensure_table(&self) -> Result<()> {
        let o = &self.table;
        let (id, st, f, d) = (&o.id_column, &o.status_column, &o.fields_column, &o.dispatch_column);
        let sql = format!(
            "BEGIN IMMEDIATE;
             CREATE TABLE IF NOT EXISTS \"{table}\" (\"{id}\" TEXT PRIMARY KEY NOT NULL, \"{st}\" TEXT, \
               \"{f}\" TEXT NOT NULL DEFAULT '{{}}', \"{d}\" TEXT) STRICT;
             CREATE INDEX IF NOT EXISTS \"{table}_dispatch_due\" ON \"{table}\" (\"{id}\") \
               WHERE \"{d}\" ->> '$.status' IN ('pending', 'processing');
             CREATE TABLE IF NOT EXISTS \"{table}_locks\" (name TEXT PRIMARY KEY NOT NULL, holder TEXT NOT NULL, \
               until INTEGER NOT NULL) STRICT;
             COMMIT;",
            table = o.table,
        );
        self.db
            .call(Op::Write, "outbox: create table", move |c| {
                c.execute_batch(&sql).map_err(|e| {
                    let _ = c.execute_batch("ROLLBACK");
                    crate::error::map(Op::Write, "outbox: create table", e)
                })
            })
            .await
    }

    /// One conditional write; `true` when it matched.
    async fn update(&self, what: &'static str, stmt: Statement) -> Result<bool> {
        Ok(self.db.write(what, stmt).await? > 0)
    }
}

sql_protocol::dispatch_outbox!(SqliteOutbox, Op::Read, Op::Write);
