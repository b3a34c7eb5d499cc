//! The dispatch outbox on the user's business table (K-11, K-12).
//!
//! The adapter knows only what it is told about the business table ([`OutboxTable`]): its
//! schema and name, the `text` primary-key column (default `object_id`), the business
//! status column (default `business_status`), the `jsonb` column holding the user's fields
//! (default `fields`), the `jsonb` column holding the intent (default `workflow_dispatch`,
//! in the serde form of [`DispatchIntent`](kernel_core::ports::DispatchIntent)), the path inside the fields a new round
//! clears (default `previous_error`) and the failed status (default `failed`). Every write
//! is one autocommit statement, rendered by [`sql_protocol::outbox`] (the table of
//! conditions and assignments is there); this adapter binds, runs and decodes them.

use crate::error::Op;
use crate::{Db, Pool, PostgresConfig, PG};
use kernel_core::{Error, Result};
use sql_protocol::outbox::{OutboxColumns, OutboxSql};
use sql_protocol::Statement;

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

/// [`DispatchOutbox`](kernel_core::ports::DispatchOutbox) on a PostgreSQL business table. Cheap to clone.
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

sql_protocol::dispatch_outbox!(PostgresOutbox, Op::Read, Op::Write);
