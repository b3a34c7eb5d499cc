//! # store-sqlite
//!
//! The durable side of the kernel in one SQLite file, for one machine and no server:
//! [`SqliteWorkflowStore`] implements [`WorkflowStore`](kernel_core::ports::WorkflowStore),
//! [`SqliteSignalInbox`] implements [`SignalInbox`](kernel_core::ports::SignalInbox),
//! [`SqliteOutbox`] the dispatch outbox on the user's business table,
//! [`SqliteResultCache`] the cache of read-only activity results
//! ([`ResultCache`](kernel_core::ports::ResultCache)), and
//! [`SqliteDeadLetters`] implements [`DeadLetters`](kernel_core::ports::DeadLetters),
//! [`SqliteTaskInbox`] implements [`TaskInbox`](kernel_core::ports::TaskInbox), and
//! [`SqliteObservationRepository`] the observer's
//! [`ObservationRepository`](observer::ObservationRepository) (what
//! [`OpsView`](observer::OpsView) queries). Several processes may share the file.
//!
//! Every guarded write is **one** autocommit statement, `UPDATE … WHERE workflow_id = ?1
//! AND <guard> RETURNING revision` (K-6.4); `revision` is only ever incremented, never a
//! guard. The SQL of every [`Guard`](kernel_core::transition::Guard) and
//! [`Transition`](kernel_core::transition::Transition) comes from
//! [`sql_protocol`] (the SQLite dialect), the crate store-postgres renders its own with,
//! pinned by snapshot tests.
//!
//! ```no_run
//! use kernel_core::ports::{DynStore, WorkflowStore};
//! use std::sync::Arc;
//! use store_sqlite::{SqliteConfig, SqliteDb, SqliteSignalInbox, SqliteWorkflowStore};
//!
//! # async fn demo() -> kernel_core::Result<()> {
//! // Creates the file if needed, checks it is ours, switches it to WAL and migrates it
//! // (idempotent, safe when several processes open it at once).
//! let db = SqliteDb::open("wf.db", SqliteConfig::default()).await?;
//! let store: Arc<DynStore> = Arc::new(SqliteWorkflowStore::new(db.clone()));
//! let inbox = SqliteSignalInbox::new(db);
//! assert!(store.get(&"wf-1".into()).await?.is_none());
//! # let _ = inbox; Ok(()) }
//! ```
//!
//! ## Binding
//!
//! [`rusqlite`] with its `bundled` feature: SQLite (3.54) is compiled into the binary, so no
//! system library is needed and every build has the same SQLite — the JSON functions,
//! `RETURNING`, `STRICT` tables and aggregate `ORDER BY` the protocol uses included. It is
//! the most used and maintained SQLite binding for Rust and exposes what a store needs
//! (busy timeout, interrupt handles, extended error codes, prepared-statement cache).
//! sqlx would add an async facade over the same blocking library plus a query macro layer
//! that wants a database at build time.
//!
//! ## Durability and concurrency
//!
//! - The file is in WAL mode: readers never block the writer nor each other; one write
//!   transaction at a time for the whole file (SQLite's rule), across processes.
//! - [`Synchronous::Full`] by default: a committed write is on disk before the call
//!   returns, so a power loss loses nothing committed. [`Synchronous::Normal`] (for tests
//!   and sweeps) loses nothing committed when the process is killed, but may lose the last
//!   commits on a crash of the OS or a power loss; the file stays consistent either way.
//! - SQLite calls block, so they never run on the async runtime: each call takes a
//!   connection from a small pool ([`SqliteConfig::pool_size_max`]) and runs on tokio's
//!   blocking threads (`spawn_blocking`). A pool rather than one dedicated thread, because
//!   in WAL mode reads proceed in parallel with the one writer; writes from the pool's
//!   connections queue on SQLite's lock as writes from other processes do.
//! - Another connection's or process's write lock is waited for up to
//!   [`SqliteConfig::busy_timeout_ms`] (`PRAGMA busy_timeout`); past it the call is
//!   `Unavailable` (nothing written). Every call has a deadline,
//!   [`SqliteConfig::call_timeout_ms`], counted from the call (the wait for a pooled
//!   connection included): a call that had not started by then never starts and is
//!   `Unavailable`; a running one is interrupted, a read is `Unavailable`, a write
//!   `Uncertain` — it may have committed (an interrupt that falls between two statements
//!   of a multi-statement write does not stop it), and the caller must treat it so
//!   (K-6.4). A write that waited long for a connection and then meets a lock can reach
//!   the deadline before the busy timeout, so under heavy contention a write may be
//!   `Uncertain` rather than `Unavailable`.
//!
//! ## Tables
//!
//! Created by the versioned files of `migrations/` (see [`migrate`](SqliteDb::migrate)):
//!
//! ```text
//! workflow_instances(workflow_id PK, biz_key UNIQUE, workflow_type, status, claimable_time,
//!   claim_token, business_priority, revision, retry_count, prepare_failures, refused_writes,
//!   definition_fingerprint, created_at, updated_at, finished_at,       -- real columns
//!   trace_parent,                                                      -- migration 8
//!   steps, input, output, wait, resume, fingerprint_mismatch,          -- JSON text
//!   compensation,                                                      -- JSON text, migration 6
//!   operator_request)                             -- JSON text, migration 9, NULL = none
//! signal_inbox(signal_id PK, workflow_id, signal_type, wait_key, generation, status,
//!   created_at, match_time, orphan)
//! observation_attempts(biz_key, workflow_run, step_name, attempt PK, workflow_type, outcome,
//!   revision, updated_at, doc)
//! observation_snapshots(biz_key PK, workflow_type, status, step_name, revision, updated_at, doc)
//! result_cache(key PK, value, stored_at, expires_at)        -- SqliteResultCache
//! dead_letters(id PK, workflow_id, workflow_type, step, step_index, run, epoch, created_at,
//!   status, closed_at, error, inputs, decision)                      -- migration 4, JSON text
//! task_inbox(id PK, workflow_id, workflow_type, step, level, title, assignee, token,
//!   created_at, due_at, status, closed_at, roles, evidence, decision,  -- migration 5, JSON text
//!   decided_at, sensitive_text)                                     -- generated from decision
//! ```
//!
//! Times are `INTEGER` milliseconds since the Unix epoch; text compares byte-wise. The file
//! carries `PRAGMA application_id` = [`APPLICATION_ID`] and `PRAGMA user_version` = its
//! schema version.
//!
//! ## Refused input
//!
//! kernel-core's K-2.0 rule first (the same refusals as every other store), then what
//! SQLite cannot hold or address: integers beyond the 64-bit signed range, NUL in a text
//! column (ids never hold one: K-2.0), an output name holding `"` (a JSON path cannot
//! address it), statements whose values exceed [`Limits::document_bytes_max`], and (a `CHECK`
//! constraint) an instance whose JSON columns would exceed 16 MiB. All are
//! [`Error::InvalidInput`](kernel_core::Error) with nothing written. A read-only file, a
//! full disk or a lock held past the busy timeout are `Unavailable`: the statement was
//! rolled back, nothing written. A NUL inside a JSON string is refused before any statement
//! (`InvalidInput`), as on every store (kernel-core's K-2.0 rule). Details:
//! `docs/store-sqlite.md`.

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

pub use cache::{SqliteResultCache, RESULT_CACHE};
pub use dead_letter::{SqliteDeadLetters, DEAD_LETTER_COLUMNS};
pub use inbox::SqliteSignalInbox;
pub use migrate::{migrate, APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION};
pub use observation::SqliteObservationRepository;
pub use outbox::{OutboxTable, SqliteOutbox};
pub use sql_protocol::Limits;
pub use store::SqliteWorkflowStore;
pub use task_inbox::{SqliteTaskInbox, TASK_COLUMNS};

use error::Op;
use kernel_core::{Error, Result};
use sql_protocol::Dialect;

/// The dialect every statement of this crate is rendered in.
pub(crate) const D: Dialect = Dialect::Sqlite;
use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Name of the instance table.
pub const INSTANCES: &str = "workflow_instances";
/// Name of the inbox table.
pub const INBOX: &str = "signal_inbox";
/// Name of the dead-letter table.
pub const DEAD_LETTERS: &str = "dead_letters";
/// Name of the human-task table.
pub const TASK_INBOX: &str = "task_inbox";

/// SQLite's `synchronous` setting: when a commit waits for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// `synchronous=FULL`: every commit is synced to disk before it returns; nothing
    /// committed is lost on a power loss. The default.
    #[default]
    Full,
    /// `synchronous=NORMAL`: in WAL mode commits are synced at checkpoints only. A killed
    /// process loses nothing committed (the commit is in the operating system's cache); a
    /// crash of the OS or a power loss may lose the last commits, never the file's
    /// consistency. For tests and sweeps.
    Normal,
}

impl Synchronous {
    fn pragma(self) -> &'static str {
        match self {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        }
    }
}

/// Adapter configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteConfig {
    /// Payload and statement size limits, checked before anything is executed.
    pub limits: Limits,
    /// Upper bound on one page of any scan, whatever the caller asks for.
    pub scan_page_max: usize,
    /// How long a statement waits for another connection's or process's write lock
    /// (`PRAGMA busy_timeout`), in milliseconds; past it the call is `Unavailable`.
    pub busy_timeout_ms: u64,
    /// The deadline of every call (waiting for a pooled connection included), in
    /// milliseconds. Must exceed [`busy_timeout_ms`](Self::busy_timeout_ms), so that a call
    /// that got its connection at once and is blocked on a lock fails with no effect
    /// before the deadline makes it uncertain (a call that first waited for a connection
    /// may still reach the deadline while waiting on the lock: `Uncertain` for a write).
    pub call_timeout_ms: u64,
    /// Most connections open at once (so most calls running at once).
    pub pool_size_max: usize,
    /// When a commit waits for the disk.
    pub synchronous: Synchronous,
    /// Open the file read-only (inspection tools): every write is refused by SQLite
    /// (`Unavailable`), nothing changed. [`SqliteDb::open`] then migrates nothing and
    /// refuses a file whose schema is not current.
    pub read_only: bool,
    /// How long [`SqliteDb::open`] waits for another process's migration, in milliseconds.
    pub migrate_wait_ms: u64,
}

impl Default for SqliteConfig {
    fn default() -> Self {
        SqliteConfig {
            limits: Limits::default(),
            scan_page_max: 1000,
            busy_timeout_ms: 5_000,
            call_timeout_ms: 10_000,
            pool_size_max: 4,
            synchronous: Synchronous::Full,
            read_only: false,
            migrate_wait_ms: 30_000,
        }
    }
}

impl SqliteConfig {
    /// Check the configuration: positive limits and timeouts, `busy_timeout_ms <
    /// call_timeout_ms`.
    pub fn validate(&self) -> Result<()> {
        for (field, v) in [
            ("scan_page_max", self.scan_page_max as u64),
            ("busy_timeout_ms", self.busy_timeout_ms),
            ("call_timeout_ms", self.call_timeout_ms),
            ("pool_size_max", self.pool_size_max as u64),
            ("migrate_wait_ms", self.migrate_wait_ms),
        ] {
            if v == 0 {
                return Err(Error::invalid(field, "must be > 0"));
            }
        }
        if self.busy_timeout_ms >= self.call_timeout_ms {
            return Err(Error::invalid(
                "call_timeout_ms",
                format_args!(
                    "{} ms must be longer than busy_timeout_ms ({} ms), so that a call waiting for a lock fails with \
                     no effect before the deadline makes it uncertain",
                    self.call_timeout_ms, self.busy_timeout_ms
                ),
            ));
        }
        Ok(())
    }
}

struct Inner {
    path: PathBuf,
    config: SqliteConfig,
    idle: Mutex<Vec<Connection>>,
    slots: Arc<tokio::sync::Semaphore>,
}

/// One SQLite file: its path, configuration and connection pool, shared by every adapter
/// of this crate. Cheap to clone.
#[derive(Clone)]
pub struct SqliteDb {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SqliteDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteDb").field("path", &self.inner.path).field("config", &self.inner.config).finish()
    }
}

impl SqliteDb {
    /// Open `path` (created when missing, unless read-only), check that it is this crate's
    /// database of a version this build knows, switch it to WAL and apply the migrations
    /// it lacks. A file that is not ours, or of a newer schema version, is
    /// [`Error::Conflict`] naming the file and the versions, and nothing in it is changed.
    pub async fn open(path: impl AsRef<Path>, config: SqliteConfig) -> Result<SqliteDb> {
        config.validate()?;
        let db = SqliteDb {
            inner: Arc::new(Inner {
                path: path.as_ref().to_path_buf(),
                slots: Arc::new(tokio::sync::Semaphore::new(config.pool_size_max)),
                config,
                idle: Mutex::new(Vec::new()),
            }),
        };
        let inner = db.inner.clone();
        tokio::task::spawn_blocking(move || migrate::migrate(&inner.path, &inner.config))
            .await
            .map_err(|e| Error::unavailable(format!("sqlite open: the opening task failed: {e}")))??;
        Ok(db)
    }

    /// Apply the migrations the file lacks (see [`open`](Self::open), which calls it);
    /// returns the versions applied.
    pub async fn migrate(&self) -> Result<Vec<u32>> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || migrate::migrate(&inner.path, &inner.config))
            .await
            .map_err(|e| Error::unavailable(format!("sqlite migrate: the task failed: {e}")))?
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The configuration in force.
    pub fn config(&self) -> &SqliteConfig {
        &self.inner.config
    }

    /// A scan limit: `None` for an empty page, else `limit` capped by `scan_page_max`.
    pub(crate) fn page(&self, limit: usize) -> Option<i64> {
        (limit > 0).then(|| limit.min(self.inner.config.scan_page_max) as i64)
    }

    /// Run `f` on a pooled connection on a blocking thread, under the call deadline:
    /// waiting for a connection counts; past the deadline the statement is interrupted and
    /// the call is `Unavailable` (a read) or `Uncertain` (a write).
    pub(crate) async fn call<T, F>(&self, op: Op, what: &'static str, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        let ms = self.inner.config.call_timeout_ms;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(ms);
        let slot = match tokio::time::timeout_at(deadline, self.inner.slots.clone().acquire_owned()).await {
            Ok(Ok(s)) => s,
            Ok(Err(_)) => return Err(Error::unavailable(format!("sqlite {what}: the pool is closed"))),
            Err(_) => {
                return Err(Error::unavailable(format!(
                    "sqlite {what}: no pooled connection within the call deadline of {ms} ms"
                )))
            }
        };
        let inner = self.inner.clone();
        let state: Arc<Mutex<CallState>> = Arc::new(Mutex::new(CallState::Pending));
        let handle = state.clone();
        let task = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            let pooled = inner.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
            let mut conn = match pooled {
                Some(c) => c,
                None => {
                    open_connection(&inner.path, &inner.config, false).map_err(|e| error::map(Op::Read, what, e))?
                }
            };
            {
                let mut st = handle.lock().unwrap_or_else(|p| p.into_inner());
                if matches!(*st, CallState::Abandoned) {
                    // The caller was told `Unavailable` at its deadline: nothing may run.
                    inner.idle.lock().unwrap_or_else(|p| p.into_inner()).push(conn);
                    return Err(error::deadline(Op::Read, what, 0));
                }
                *st = CallState::Running(conn.get_interrupt_handle());
            }
            let r = f(&mut conn);
            *handle.lock().unwrap_or_else(|p| p.into_inner()) = CallState::Done;
            // A connection left inside a transaction (an error between BEGIN and COMMIT
            // that could not roll back) is not reused.
            if conn.is_autocommit() {
                inner.idle.lock().unwrap_or_else(|p| p.into_inner()).push(conn);
            }
            r
        });
        match tokio::time::timeout_at(deadline, task).await {
            Ok(Ok(r)) => r,
            Ok(Err(join)) => {
                let msg = format!("sqlite {what}: the call's thread failed: {join}");
                Err(if op == Op::Write { Error::uncertain(msg) } else { Error::unavailable(msg) })
            }
            Err(_) => {
                let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
                match &*st {
                    // Not started: it never will, so nothing was written.
                    CallState::Pending => {
                        *st = CallState::Abandoned;
                        Err(error::deadline(Op::Read, what, ms))
                    }
                    CallState::Running(h) => {
                        h.interrupt();
                        Err(error::deadline(op, what, ms))
                    }
                    CallState::Abandoned | CallState::Done => Err(error::deadline(op, what, ms)),
                }
            }
        }
    }
}

impl SqliteDb {
    /// Run one statement to completion, decoding every row with `f` (a row that does not
    /// decode fails the call).
    pub(crate) async fn rows<T: Send + 'static>(
        &self,
        op: Op,
        what: &'static str,
        stmt: protocol::Statement,
        f: fn(&codec::R<'_, '_>) -> Result<T>,
    ) -> Result<Vec<T>> {
        self.call(op, what, move |c| run(c, op, what, &stmt, |r| f(&codec::R(r)))?.into_iter().collect()).await
    }

    /// [`rows`](Self::rows) of a statement that returns at most one row.
    pub(crate) async fn row<T: Send + 'static>(
        &self,
        op: Op,
        what: &'static str,
        stmt: protocol::Statement,
        f: fn(&codec::R<'_, '_>) -> Result<T>,
    ) -> Result<Option<T>> {
        one(self.rows(op, what, stmt, f).await?, what)
    }

    /// Run a counting statement ([`row::count`](sql_protocol::row::count) of its one row).
    pub(crate) async fn count(&self, op: Op, what: &'static str, stmt: protocol::Statement) -> Result<u64> {
        self.call(op, what, move |c| {
            let n = run(c, op, what, &stmt, |r| sql_protocol::row::count(Some(&codec::R(r))))?;
            Ok(one(n, what)?.transpose()?.unwrap_or(0))
        })
        .await
    }

    /// Run a [`counted`](Dialect::counted) write: how many rows it changed.
    pub(crate) async fn affected(&self, what: &'static str, stmt: protocol::Statement) -> Result<u64> {
        Ok(self.write(what, stmt).await? as u64)
    }

    /// Run a write; how many rows it returned.
    pub(crate) async fn write(&self, what: &'static str, stmt: protocol::Statement) -> Result<usize> {
        self.call(Op::Write, what, move |c| Ok(run(c, Op::Write, what, &stmt, |_| ())?.len())).await
    }
}

/// At most one row.
pub(crate) fn one<T>(mut rows: Vec<T>, what: &str) -> Result<Option<T>> {
    if rows.len() > 1 {
        return Err(Error::corrupt(format!("{what}: {} rows where at most one was expected", rows.len())));
    }
    Ok(rows.pop())
}

/// Where a call's blocking task is, as its deadline sees it.
enum CallState {
    /// Queued on the blocking pool, nothing run yet.
    Pending,
    /// Past its deadline before it started: it must not run.
    Abandoned,
    /// Running its statements; the handle interrupts them.
    Running(rusqlite::InterruptHandle),
    /// Finished (its result may still be on its way).
    Done,
}

/// A connection with this crate's settings: busy timeout, foreign keys, the configured
/// `synchronous`, a statement cache. Only [`SqliteDb::open`] (`create`) may create the
/// file: a pooled connection opened later on a file removed meanwhile fails
/// (`SQLITE_CANTOPEN`) instead of leaving an empty, unmigrated file behind.
pub(crate) fn open_connection(path: &Path, config: &SqliteConfig, create: bool) -> rusqlite::Result<Connection> {
    let mut flags = OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if config.read_only {
        flags |= OpenFlags::SQLITE_OPEN_READ_ONLY;
    } else {
        flags |= OpenFlags::SQLITE_OPEN_READ_WRITE;
        if create {
            flags |= OpenFlags::SQLITE_OPEN_CREATE;
        }
    }
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(Duration::from_millis(config.busy_timeout_ms))?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.pragma_update(None, "synchronous", config.synchronous.pragma())?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

/// Run `stmt` on `conn` to completion (so an autocommit write has committed, or its
/// failure is reported, before this returns), mapping every row with `f`.
pub(crate) fn run<T>(
    conn: &Connection,
    op: Op,
    what: &str,
    stmt: &protocol::Statement,
    mut f: impl FnMut(&rusqlite::Row<'_>) -> T,
) -> Result<Vec<T>> {
    // A statement that does not prepare was not executed.
    let mut st = conn.prepare_cached(&stmt.sql).map_err(|e| error::map(Op::Read, what, e))?;
    let values = protocol::values(stmt);
    let mut rows = st.query(rusqlite::params_from_iter(values.iter())).map_err(|e| error::map(op, what, e))?;
    let mut out = Vec::new();
    loop {
        match rows.next() {
            Ok(Some(r)) => out.push(f(r)),
            Ok(None) => return Ok(out),
            Err(e) => return Err(error::map(op, what, e)),
        }
    }
}
