//! # store-postgres
//!
//! The durable side of the kernel on PostgreSQL (≥ 13): [`PostgresWorkflowStore`]
//! implements [`WorkflowStore`](kernel_core::ports::WorkflowStore),
//! [`PostgresSignalInbox`] implements [`SignalInbox`](kernel_core::ports::SignalInbox),
//! [`PostgresOutbox`] the dispatch outbox on the user's business table,
//! [`PostgresResultCache`] the cache of read-only activity results
//! ([`ResultCache`](kernel_core::ports::ResultCache)), and
//! [`PostgresDeadLetters`] implements [`DeadLetters`](kernel_core::ports::DeadLetters),
//! [`PostgresTaskInbox`] implements [`TaskInbox`](kernel_core::ports::TaskInbox), and
//! [`PostgresObservationRepository`] the observer's
//! [`ObservationRepository`](observer::ObservationRepository) (what
//! [`OpsView`](observer::OpsView) queries).
//!
//! Every guarded write is **one** autocommit statement, `UPDATE … WHERE workflow_id = $1
//! AND <guard> RETURNING revision` (K-6.4); `revision` is only ever incremented, never a
//! guard. [`protocol`] builds these statements with pure functions around the SQL of every
//! [`Guard`](kernel_core::transition::Guard) and
//! [`Transition`](kernel_core::transition::Transition), which `sql-protocol` renders in its
//! PostgreSQL dialect; pinned by snapshot tests.
//!
//! ```no_run
//! use kernel_core::ports::{DynStore, WorkflowStore};
//! use std::sync::Arc;
//! use store_postgres::{PostgresConfig, PostgresSignalInbox, PostgresWorkflowStore};
//!
//! # async fn demo() -> kernel_core::Result<()> {
//! let config = PostgresConfig::default(); // schema `workflow_kernel`
//! let pool = store_postgres::connect(&store_postgres::database_url(), &config)?;
//! store_postgres::migrate(&pool, &config.schema).await?; // idempotent, safe to race
//! let store: Arc<DynStore> = Arc::new(PostgresWorkflowStore::new(pool.clone(), config.clone())?);
//! let inbox = PostgresSignalInbox::new(pool, config)?;
//! assert!(store.get(&"wf-1".into()).await?.is_none());
//! # let _ = inbox; Ok(()) }
//! ```
//!
//! ## Driver
//!
//! [`tokio-postgres`](tokio_postgres) with the [`deadpool-postgres`](deadpool_postgres)
//! pool. It speaks the extended protocol directly: each write is one prepared statement
//! (cached per connection) sent as a single autocommit `UPDATE … RETURNING`, with no
//! `BEGIN`/`COMMIT` round trips and no connection check per checkout (the pool's *fast*
//! recycling only drops connections it saw closed). sqlx would add a query macro layer
//! whose compile-time checking needs a database at build time, which this workspace does
//! not allow; without it, sqlx offers nothing the kernel uses that tokio-postgres lacks.
//! Both crates are maintained by the rust-postgres and deadpool projects and depend on
//! tokio only.
//!
//! ## Connection
//!
//! [`database_url`] reads `DATABASE_URL`, else `postgres://postgres@127.0.0.1:5432/test`
//! (the address, not `localhost`, so that trust authentication on 127.0.0.1 applies).
//! Every call has a deadline: [`PostgresConfig::statement_timeout_ms`] is set as the
//! server's `statement_timeout` (the server cancels and rolls back: `Unavailable`), and
//! [`PostgresConfig::call_timeout_ms`] bounds, on the client, the checkout from the pool
//! (past it nothing was sent: `Unavailable`) and then, afresh, prepare and execute (past it
//! a write is `Uncertain`); it must exceed the statement timeout.
//!
//! ## Tables
//!
//! In the configured schema ([`PostgresConfig::schema`]), created by [`migrate`] from the
//! versioned files in `migrations/`:
//!
//! ```text
//! workflow_instances(workflow_id PK, biz_key UNIQUE, workflow_type, status, claimable_time,
//!   claim_token, business_priority, revision, retry_count, prepare_failures, refused_writes,
//!   definition_fingerprint, created_at, updated_at, finished_at,       -- real columns
//!   trace_parent,                                                      -- migration 11
//!   steps, input, output, wait, resume, fingerprint_mismatch,          -- jsonb
//!   compensation,                                                      -- jsonb, migration 9
//!   operator_request)                                 -- jsonb, migration 12, NULL = none
//! signal_inbox(signal_id PK, workflow_id, signal_type, wait_key, generation, status,
//!   created_at, match_time, orphan)
//! observation_attempts(biz_key, workflow_run, step_name, attempt PK, workflow_type, outcome,
//!   revision, updated_at, doc jsonb)
//! observation_snapshots(biz_key PK, workflow_type, status, step_name, revision, updated_at,
//!   doc jsonb)
//! result_cache(key PK, value jsonb, stored_at, expires_at)          -- PostgresResultCache
//! dead_letters(id PK, workflow_id, workflow_type, step, step_index, run, epoch, created_at,
//!   status, closed_at, error jsonb, inputs jsonb, decision jsonb)   -- migration 7
//! task_inbox(id PK, workflow_id, workflow_type, step, level, title, assignee, roles text[],
//!   token, created_at, due_at, status, closed_at, evidence jsonb, decision jsonb,
//!   decided_at, sensitive_text)                   -- migration 8, the last two generated
//! ```
//!
//! `claim_any` takes its candidate from the function `claim_candidate(now, types)`
//! (migration 4): per claimed type the longest-due unlocked instance, of those the longest
//! due, through the index `(workflow_type, claimable_time, workflow_id)`.
//!
//! Times are `bigint` milliseconds since the Unix epoch, ids are `text COLLATE "C"` (byte
//! order, as every other store pages them). `steps`, `wait`, `resume`,
//! `fingerprint_mismatch`, `compensation` and `operator_request` (an operator's request to
//! the holder of a live claim, K-6.8) hold the kernel types' own serde form.
//!
//! ## Refused input
//!
//! kernel-core's K-2.0 rule first (the same refusals as every other store), then what
//! PostgreSQL cannot store: NUL in any string of a JSONB value or in a text column,
//! integers beyond the 64-bit signed range, statements whose values exceed
//! [`Limits::document_bytes_max`], and (checked by a trigger on writes of the JSON
//! columns) an instance whose JSON columns would exceed 16 MiB. All are [`Error::InvalidInput`](kernel_core::Error) with
//! nothing written.

mod cache;
mod codec;
mod dead_letter;
pub mod error;
mod inbox;
mod migrate;
mod observation;
mod outbox;
pub mod protocol;
mod store;
mod task_inbox;

pub use cache::{PostgresResultCache, RESULT_CACHE};
pub use dead_letter::{PostgresDeadLetters, DEAD_LETTER_COLUMNS};
pub use inbox::PostgresSignalInbox;
pub use migrate::{migrate, MIGRATIONS};
pub use observation::{
    attempt_upsert, attempts_query, snapshot_put, snapshot_upsert, snapshots_query, PostgresObservationRepository,
    OBSERVATION_ATTEMPTS, OBSERVATION_SNAPSHOTS,
};
pub use outbox::{OutboxTable, PostgresOutbox};
pub use protocol::Limits;
pub use store::PostgresWorkflowStore;
pub use task_inbox::{PostgresTaskInbox, TASK_COLUMNS};

use error::Op;
use kernel_core::{Error, Result};
use sql_protocol::Dialect;

/// The dialect every statement of this crate is rendered in.
pub(crate) const PG: Dialect = Dialect::Postgres;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio_postgres::Row;

pub use deadpool_postgres::Pool;

/// Name of the instance table.
pub const INSTANCES: &str = "workflow_instances";
/// Name of the inbox table.
pub const INBOX: &str = "signal_inbox";
/// Name of the dead-letter table.
pub const DEAD_LETTERS: &str = "dead_letters";
/// Name of the human-task table.
pub const TASK_INBOX: &str = "task_inbox";
/// The URL used when `DATABASE_URL` is unset.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// `DATABASE_URL`, or [`DEFAULT_DATABASE_URL`] when it is unset or blank.
pub fn database_url() -> String {
    match std::env::var("DATABASE_URL") {
        Ok(u) if !u.trim().is_empty() => u,
        _ => DEFAULT_DATABASE_URL.to_string(),
    }
}

/// Adapter configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresConfig {
    /// Schema holding the tables (an unquoted lower-case SQL identifier, see
    /// [`schema_name`]); default `workflow_kernel`.
    pub schema: String,
    /// Payload and statement size limits, checked before anything is sent.
    pub limits: Limits,
    /// Upper bound on one page of any scan, whatever the caller asks for.
    pub scan_page_max: usize,
    /// Server-side `statement_timeout` of every connection, in milliseconds.
    pub statement_timeout_ms: u64,
    /// Client-side deadlines of every call, in milliseconds: one for the checkout from the
    /// pool (past it, nothing was sent: `Unavailable`), then a fresh one for prepare and
    /// execute. Must be longer than [`statement_timeout_ms`](Self::statement_timeout_ms)
    /// ([`validate`](Self::validate)), so a slow statement is cancelled by the server
    /// (certainly no effect) before the client gives up on it (uncertain).
    pub call_timeout_ms: u64,
    /// Most connections the pool opens.
    pub pool_size_max: usize,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            schema: "workflow_kernel".to_string(),
            limits: Limits::default(),
            scan_page_max: 1000,
            statement_timeout_ms: 5_000,
            call_timeout_ms: 10_000,
            pool_size_max: 16,
        }
    }
}

impl PostgresConfig {
    /// Check the configuration: a valid schema name, positive limits and timeouts, and
    /// `statement_timeout_ms < call_timeout_ms`.
    pub fn validate(&self) -> Result<()> {
        schema_name(&self.schema)?;
        for (field, v) in [
            ("scan_page_max", self.scan_page_max as u64),
            ("statement_timeout_ms", self.statement_timeout_ms),
            ("call_timeout_ms", self.call_timeout_ms),
            ("pool_size_max", self.pool_size_max as u64),
        ] {
            if v == 0 {
                return Err(Error::invalid(field, "must be > 0"));
            }
        }
        if self.statement_timeout_ms >= self.call_timeout_ms {
            return Err(Error::invalid(
                "call_timeout_ms",
                format_args!(
                    "{} ms must be longer than statement_timeout_ms ({} ms), so that the server cancels a slow \
                     statement (no effect) before the client gives up on it (uncertain)",
                    self.call_timeout_ms, self.statement_timeout_ms
                ),
            ));
        }
        Ok(())
    }
}

/// A schema name is 1–63 bytes of `[a-z0-9_]`, not starting with a digit: it is spliced
/// into statements (quoted), so it is checked instead of escaped.
pub fn schema_name(name: &str) -> Result<&str> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    if ok {
        Ok(name)
    } else {
        Err(Error::invalid(
            "schema",
            format_args!("{name:?} is not 1-63 bytes of [a-z0-9_] starting with a letter or _"),
        ))
    }
}

/// A connection pool on `url` with the deadlines of `config` (no round trip is made until
/// first use). A malformed URL is [`Error::InvalidInput`].
pub fn connect(url: &str, config: &PostgresConfig) -> Result<Pool> {
    config.validate()?;
    let mut pg: tokio_postgres::Config =
        url.parse().map_err(|e| Error::invalid_with("database_url", "not a PostgreSQL URL", e))?;
    let mut options = pg.get_options().map(|o| format!("{o} ")).unwrap_or_default();
    options.push_str(&format!("-c statement_timeout={}", config.statement_timeout_ms));
    pg.options(&options);
    if pg.get_application_name().is_none() {
        pg.application_name("workflow-kernel");
    }
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(Duration::from_millis(config.call_timeout_ms));
    }
    let manager = deadpool_postgres::Manager::from_config(
        pg,
        tokio_postgres::NoTls,
        deadpool_postgres::ManagerConfig { recycling_method: deadpool_postgres::RecyclingMethod::Fast },
    );
    let deadline = Some(Duration::from_millis(config.call_timeout_ms));
    deadpool_postgres::Pool::builder(manager)
        .max_size(config.pool_size_max)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(deadline)
        .create_timeout(deadline)
        .build()
        .map_err(|e| Error::invalid_with("database_url", "cannot build the connection pool", e))
}

/// The pool, schema and deadlines every adapter of this crate shares.
#[derive(Clone)]
pub(crate) struct Db {
    pub(crate) pool: Pool,
    pub(crate) config: PostgresConfig,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Db {
    pub(crate) fn new(pool: Pool, config: PostgresConfig) -> Result<Self> {
        config.validate()?;
        Ok(Db { pool, config })
    }

    pub(crate) fn schema(&self) -> &str {
        &self.config.schema
    }

    /// Run one statement; every failure mapped (see [`error`]). Two deadlines, each of
    /// [`PostgresConfig::call_timeout_ms`]: the checkout from the pool (past it nothing was
    /// sent: `Unavailable`), then prepare and execute on the connection, so a statement
    /// always has more than the server's `statement_timeout` however long it waited for a
    /// connection (the server cancels and rolls back first, `Unavailable`, before the
    /// client gives up on a write, `Uncertain`).
    pub(crate) async fn query(&self, op: Op, what: &str, stmt: &protocol::Statement) -> Result<Vec<Row>> {
        let ms = self.config.call_timeout_ms;
        // A pooled connection the server dropped (restart, idle kill, network) is only
        // noticed when used. Where nothing can have been written — the prepare failed, or
        // a read — the call moves to another connection, discarding the dead one, up to
        // once per pooled connection; a write already sent is never repeated (its outcome
        // is uncertain).
        let mut tries = 0;
        loop {
            tries += 1;
            let retry = tries <= self.config.pool_size_max;
            let client = match tokio::time::timeout(Duration::from_millis(ms), self.pool.get()).await {
                Ok(c) => c.map_err(|e| error::before_send(what, e))?,
                Err(_) => {
                    return Err(Error::unavailable(format!(
                        "postgres {what}: no pooled connection within the checkout deadline of {ms} ms"
                    )))
                }
            };
            let sent = AtomicBool::new(false);
            let call = async {
                let prepared = match client.prepare_cached(&stmt.sql).await {
                    Ok(p) => p,
                    Err(e) if (e.is_closed() || error::is_terminated(&e)) && retry => return Ok(None),
                    Err(e) => return Err(error::before_send(what, e)),
                };
                if client.is_closed() {
                    if retry {
                        return Ok(None);
                    }
                    return Err(Error::unavailable(format!("postgres {what}: connection closed before sending")));
                }
                sent.store(op == Op::Write, Ordering::SeqCst);
                match client.query(&prepared, &stmt.values()).await {
                    Ok(rows) => Ok(Some(rows)),
                    Err(e) if (error::is_terminated(&e) || e.is_closed()) && op == Op::Read && retry => Ok(None),
                    Err(e) => Err(error::map(op, what, e)),
                }
            };
            match tokio::time::timeout(Duration::from_millis(ms), call).await {
                Ok(Ok(Some(rows))) => return Ok(rows),
                Ok(Ok(None)) => {
                    // The connection is dead and nothing was applied: discard it, try another.
                    drop(deadpool_postgres::Object::take(client));
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    let op = if sent.load(Ordering::SeqCst) { op } else { Op::Read };
                    return Err(error::deadline(op, what, ms));
                }
            }
        }
    }

    pub(crate) async fn query_opt(&self, op: Op, what: &str, stmt: &protocol::Statement) -> Result<Option<Row>> {
        let mut rows = self.query(op, what, stmt).await?;
        if rows.len() > 1 {
            return Err(Error::corrupt(format!("{what}: {} rows where at most one was expected", rows.len())));
        }
        Ok(rows.pop())
    }

    /// Run one statement, decoding every row with `f` (a row that does not decode fails
    /// the call).
    pub(crate) async fn rows<T>(
        &self,
        op: Op,
        what: &str,
        stmt: sql_protocol::Statement,
        f: impl Fn(&codec::R<'_>) -> Result<T>,
    ) -> Result<Vec<T>> {
        self.query(op, what, &stmt.into()).await?.iter().map(|r| f(&codec::R(r))).collect()
    }

    /// [`rows`](Self::rows) of a statement that returns at most one row.
    pub(crate) async fn row<T>(
        &self,
        op: Op,
        what: &str,
        stmt: sql_protocol::Statement,
        f: impl Fn(&codec::R<'_>) -> Result<T>,
    ) -> Result<Option<T>> {
        self.query_opt(op, what, &stmt.into()).await?.as_ref().map(|r| f(&codec::R(r))).transpose()
    }

    /// Run a write; whether it returned a row.
    pub(crate) async fn write(&self, what: &str, stmt: sql_protocol::Statement) -> Result<bool> {
        Ok(self.query_opt(Op::Write, what, &stmt.into()).await?.is_some())
    }

    /// Run a counting statement ([`row::count`](sql_protocol::row::count) of its one row).
    pub(crate) async fn count(&self, op: Op, what: &str, stmt: sql_protocol::Statement) -> Result<u64> {
        sql_protocol::row::count(self.query_opt(op, what, &stmt.into()).await?.as_ref().map(codec::R).as_ref())
    }

    /// Run a [`counted`](sql_protocol::Dialect::counted) write: how many rows it changed.
    pub(crate) async fn affected(&self, what: &str, stmt: sql_protocol::Statement) -> Result<u64> {
        let rows = self.query(Op::Write, what, &stmt.into()).await?;
        sql_protocol::affected(PG, &rows.iter().map(codec::R).collect::<Vec<_>>())
    }

    /// `"<schema>".`: the qualification of this crate's tables.
    pub(crate) fn prefix(&self) -> String {
        format!("\"{}\".", self.config.schema)
    }

    /// A scan limit: `None` for an empty page, else `limit` capped by `scan_page_max`.
    pub(crate) fn page(&self, limit: usize) -> Option<i64> {
        (limit > 0).then(|| limit.min(self.config.scan_page_max) as i64)
    }
}
