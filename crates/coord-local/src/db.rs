//! The one connection of a [`LocalCoord`](crate::LocalCoord), its pragmas, its migrations,
//! the deadline of every call and the mapping of SQLite errors into the kernel's.

use kernel_core::domain::DurationMs;
use kernel_core::{Error, Result};
use rusqlite::{Connection, ErrorCode, InterruptHandle, OptionalExtension, Transaction, TransactionBehavior};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

/// Version of the coordination tables this build writes (the `schema_version` row of
/// `coord_meta`; independent of SQLite's `user_version`, which a store may use).
pub const SCHEMA_VERSION: i64 = 2;

/// The migrations, in order: migration `i` takes the tables from version `i` to `i + 1`.
pub(crate) const MIGRATIONS: &[&str] =
    &[include_str!("../migrations/001_coord.sql"), include_str!("../migrations/002_lane_pops.sql")];

/// Durability of a commit (SQLite's `synchronous` pragma, per connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// `NORMAL`: in WAL mode a commit survives a process crash (`kill -9`) but the last
    /// commits may be lost on power loss or an OS crash. The default: the coordination
    /// tables are a cache the rebuild scan restores (K-13), like Redis.
    #[default]
    Normal,
    /// `FULL`: every commit is synced to disk before it returns.
    Full,
}

impl Synchronous {
    fn pragma(self) -> &'static str {
        match self {
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
        }
    }
}

/// Whether a call may have written (decides `Unavailable` vs `Uncertain` past its deadline).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Read,
    Write,
}

/// The connection of one [`LocalCoord`](crate::LocalCoord), shared by its handles.
pub(crate) struct Db {
    conn: Mutex<Connection>,
    interrupt: InterruptHandle,
    /// The file, `None` for an in-memory database.
    path: Option<PathBuf>,
    /// What error messages call the database.
    pub(crate) label: String,
    call_timeout: std::time::Duration,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db").field("label", &self.label).finish()
    }
}

/// States of one call: the caller's deadline and the blocking worker race for the first
/// transition, so that "the deadline passed before anything ran" is known for sure.
const WAITING: u8 = 0;
const STARTED: u8 = 1;
/// The deadline passed before the call ran: it never runs.
const ABANDONED: u8 = 2;
/// The deadline passed while the call ran: it commits nothing from now on.
const EXPIRED: u8 = 3;
const DONE: u8 = 4;

/// What a call's body needs besides the connection.
pub(crate) struct Ctx<'a> {
    /// What error messages call the database.
    pub(crate) label: &'a str,
    state: &'a AtomicU8,
}

impl Ctx<'_> {
    /// Whether the caller was already answered (the deadline passed).
    fn expired(&self) -> bool {
        self.state.load(Ordering::SeqCst) == EXPIRED
    }
}

impl Db {
    /// Open (creating it if needed) and migrate `path`, or an in-memory database.
    pub(crate) fn open(
        path: Option<&Path>,
        busy_timeout_ms: DurationMs,
        call_timeout_ms: DurationMs,
        synchronous: Synchronous,
    ) -> Result<Db> {
        let label = match path {
            Some(p) => format!("sqlite coordination file {}", p.display()),
            None => "in-memory sqlite coordination".to_string(),
        };
        let conn = match path {
            Some(p) => Connection::open(p),
            None => Connection::open_in_memory(),
        }
        .map_err(|e| open_error(&label, e))?;
        conn.set_prepared_statement_cache_capacity(32);
        let mut conn = conn;
        prepare_retrying_deadlocks(&mut conn, path.is_some(), busy_timeout_ms.to_std(), synchronous, &label)?;
        let interrupt = conn.get_interrupt_handle();
        Ok(Db {
            conn: Mutex::new(conn),
            interrupt,
            path: path.map(Path::to_path_buf),
            label,
            call_timeout: call_timeout_ms.to_std(),
        })
    }

    /// The file, `None` for an in-memory database.
    pub(crate) fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Run `f` on the connection on the blocking pool, within the call deadline.
    ///
    /// Past the deadline the caller gets an answer at once: [`Error::Unavailable`] when `f`
    /// had not started (it then never runs); otherwise the running statement is interrupted
    /// and the answer is [`Error::Uncertain`] for a write (its commit may have happened just
    /// before) and [`Error::Unavailable`] for a read.
    pub(crate) async fn call<T, F>(self: &Arc<Self>, what: &'static str, kind: Kind, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection, &Ctx<'_>) -> Result<T> + Send + 'static,
    {
        let state = Arc::new(AtomicU8::new(WAITING));
        let db = Arc::clone(self);
        let st = Arc::clone(&state);
        let job = tokio::task::spawn_blocking(move || {
            // A panic elsewhere cannot leave a transaction open (see below), so the
            // connection behind a poisoned lock is still sound.
            let mut conn = db.conn.lock().unwrap_or_else(|p| p.into_inner());
            if st.compare_exchange(WAITING, STARTED, Ordering::SeqCst, Ordering::SeqCst).is_err() {
                return Err(Error::unavailable(format!("{}: {what}: deadline passed before the call ran", db.label)));
            }
            let out = f(&mut conn, &Ctx { label: &db.label, state: &st });
            if !conn.is_autocommit() {
                // Only a bug gets here (every transaction is committed or dropped).
                let _ = conn.execute_batch("ROLLBACK");
            }
            let _ = st.compare_exchange(STARTED, DONE, Ordering::SeqCst, Ordering::SeqCst);
            out
        });
        match tokio::time::timeout(self.call_timeout, job).await {
            Ok(Ok(out)) => out,
            Ok(Err(join)) => {
                let msg = format!("{}: {what}: the call failed: {join}", self.label);
                Err(match kind {
                    Kind::Read => Error::unavailable(msg),
                    Kind::Write => Error::uncertain(msg),
                })
            }
            Err(_) => {
                let ms = self.call_timeout.as_millis();
                if state.compare_exchange(WAITING, ABANDONED, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                    return Err(Error::unavailable(format!(
                        "{}: {what}: no answer within {ms} ms (the call did not run)",
                        self.label
                    )));
                }
                if state.compare_exchange(STARTED, EXPIRED, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                    // The body checks EXPIRED once it holds the write lock and before it
                    // commits, so a write answered here does not commit later; the
                    // interrupt stops a statement that is running now.
                    self.interrupt.interrupt();
                }
                let msg = format!("{}: {what}: no answer within {ms} ms", self.label);
                Err(match kind {
                    Kind::Read => Error::unavailable(msg),
                    Kind::Write => Error::uncertain(msg),
                })
            }
        }
    }
}

/// One `BEGIN IMMEDIATE` transaction: the write lock of the file is taken first (waiting
/// up to the busy timeout), so concurrent callers — threads or processes — are serialized
/// and no decision is made on a snapshot another writer has moved past.
///
/// A failure before `COMMIT` rolls back: [`Error::Unavailable`]. A failing `COMMIT` may
/// have been durable or not: [`Error::Uncertain`], except a busy one (nothing committed).
/// A call whose deadline passed while it waited for the lock or ran its body rolls back
/// instead of committing (its caller was answered already).
pub(crate) fn write<T>(
    conn: &mut Connection,
    ctx: &Ctx<'_>,
    what: &str,
    body: impl FnOnce(&Transaction<'_>) -> rusqlite::Result<T>,
) -> Result<T> {
    let label = ctx.label;
    let expired = || Error::uncertain(format!("{label}: {what}: rolled back after its deadline"));
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| map(label, what, e))?;
    if ctx.expired() {
        return Err(expired());
    }
    let out = body(&tx).map_err(|e| map(label, what, e))?;
    if ctx.expired() {
        return Err(expired());
    }
    tx.commit().map_err(|e| {
        if matches!(code(&e), Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)) {
            map(label, what, e)
        } else {
            Error::uncertain_with(format!("{label}: {what}: commit failed: {e}"), e)
        }
    })?;
    Ok(out)
}

/// One read transaction (a consistent snapshot across its statements).
pub(crate) fn read<T>(
    conn: &mut Connection,
    ctx: &Ctx<'_>,
    what: &str,
    body: impl FnOnce(&Transaction<'_>) -> rusqlite::Result<T>,
) -> Result<T> {
    let label = ctx.label;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred).map_err(|e| map(label, what, e))?;
    let out = body(&tx).map_err(|e| map(label, what, e))?;
    // Nothing to keep: ending a read transaction releases its snapshot.
    drop(tx);
    Ok(out)
}

fn code(e: &rusqlite::Error) -> Option<ErrorCode> {
    match e {
        rusqlite::Error::SqliteFailure(f, _) => Some(f.code),
        _ => None,
    }
}

/// Every SQLite failure of a call that certainly did not commit: [`Error::Unavailable`]
/// (locked past the busy timeout, read-only file, full disk, I/O), keeping the driver's
/// error as the cause. The coordination tables only recommend (K-1.1), so a caller falls
/// back as it does when Redis is down.
pub(crate) fn map(label: &str, what: &str, e: rusqlite::Error) -> Error {
    let why = match code(&e) {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            "locked by another connection past the busy timeout"
        }
        Some(ErrorCode::ReadOnly) => "the file is read-only",
        Some(ErrorCode::DiskFull) => "the disk is full",
        Some(ErrorCode::OperationInterrupted) => "interrupted at its deadline",
        Some(ErrorCode::NotADatabase) => "the file is not a SQLite database",
        _ => "failed",
    };
    Error::unavailable_with(format!("{label}: {what}: {why}: {e}"), e)
}

fn open_error(label: &str, e: rusqlite::Error) -> Error {
    match code(&e) {
        Some(ErrorCode::NotADatabase) => {
            Error::invalid_with("path", format_args!("{label}: not a SQLite database, nothing changed"), e)
        }
        _ => map(label, "open", e),
    }
}

/// Set the pragmas and migrate, within the busy timeout. SQLite answers `SQLITE_BUSY` at
/// once, without waiting in its busy handler, when two connections would deadlock on a lock
/// upgrade — which happens when several processes open a new file together and each
/// switches it to WAL while the others read its schema. Such an answer is retried (short
/// pauses) until the busy timeout has passed since the first try; a lock held past the busy
/// timeout stays `Unavailable` as before.
fn prepare_retrying_deadlocks(
    conn: &mut Connection,
    file: bool,
    busy_timeout: std::time::Duration,
    synchronous: Synchronous,
    label: &str,
) -> Result<()> {
    let deadline = std::time::Instant::now() + busy_timeout;
    let mut pause = std::time::Duration::from_millis(2);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match prepare(conn, file, left, synchronous, label) {
            Err(Error::Unavailable { cause: Some(cause), .. })
                if busy(&cause) && std::time::Instant::now() + pause < deadline =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

/// Whether the driver error behind an `Unavailable` is a busy or locked database.
fn busy(cause: &kernel_core::error::Cause) -> bool {
    (**cause)
        .downcast_ref::<rusqlite::Error>()
        .is_some_and(|e| matches!(code(e), Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)))
}

/// One try of [`prepare_retrying_deadlocks`]: busy timeout, WAL, `synchronous`, migrations.
fn prepare(
    conn: &mut Connection,
    file: bool,
    busy_timeout: std::time::Duration,
    synchronous: Synchronous,
    label: &str,
) -> Result<()> {
    conn.busy_timeout(busy_timeout).map_err(|e| open_error(label, e))?;
    if file {
        // WAL: readers never block the writer and a commit appends to the log; the mode
        // is stored in the file, so every process on it uses it.
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
            .map_err(|e| open_error(label, e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(Error::unavailable(format!("{label}: journal_mode is {mode}, WAL is required")));
        }
    }
    conn.pragma_update(None, "synchronous", synchronous.pragma()).map_err(|e| open_error(label, e))?;
    migrate(conn, label)
}

/// Bring the coordination tables to [`SCHEMA_VERSION`] in one `BEGIN IMMEDIATE`
/// transaction: a second process migrating at the same time waits for the first (busy
/// timeout) and then finds the work done. A file whose tables are newer than this build is
/// refused, nothing changed.
fn migrate(conn: &mut Connection, label: &str) -> Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| open_error(label, e))?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS coord_meta (key TEXT NOT NULL PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID",
    )
    .map_err(|e| open_error(label, e))?;
    let version: i64 = tx
        .query_row("SELECT value FROM coord_meta WHERE key = 'schema_version'", [], |r| r.get(0))
        .optional()
        .map_err(|e| open_error(label, e))?
        .unwrap_or(0);
    if !(0..=SCHEMA_VERSION).contains(&version) {
        // Dropping the transaction rolls back: the file is left as it was.
        return Err(Error::invalid(
            "path",
            format_args!(
                "{label}: coordination schema version {version} is not one this build knows \
                 (it writes version {SCHEMA_VERSION}); nothing changed"
            ),
        ));
    }
    for sql in &MIGRATIONS[version as usize..] {
        tx.execute_batch(sql).map_err(|e| map(label, "migrate", e))?;
    }
    if version < SCHEMA_VERSION {
        tx.execute(
            "INSERT INTO coord_meta (key, value) VALUES ('schema_version', ?1) \
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            [SCHEMA_VERSION],
        )
        .map_err(|e| map(label, "migrate", e))?;
        tracing::info!(database = label, from = version, to = SCHEMA_VERSION, "coordination tables migrated");
    }
    tx.commit().map_err(|e| map(label, "migrate", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_version_has_its_migration() {
        assert_eq!(MIGRATIONS.len() as i64, SCHEMA_VERSION);
    }

    #[test]
    fn migrating_twice_is_a_no_op() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn, "t").unwrap();
        conn.execute("INSERT INTO coord_lane VALUES ('a', 1, 5)", []).unwrap();
        migrate(&mut conn, "t").unwrap();
        let n: i64 = conn.query_row("SELECT count(*) FROM coord_lane", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 1, "a second migrate left the data alone");
    }

    #[test]
    fn a_version_1_file_migrates_to_the_pop_counters_keeping_its_data() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(MIGRATIONS[0]).unwrap();
        conn.execute_batch(
            "CREATE TABLE coord_meta (key TEXT NOT NULL PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID; \
             INSERT INTO coord_meta VALUES ('schema_version', 1); INSERT INTO coord_lane VALUES ('a', 1, 5);",
        )
        .unwrap();
        migrate(&mut conn, "t").unwrap();
        let v: i64 = conn.query_row("SELECT value FROM coord_meta", [], |r| r.get(0)).unwrap();
        assert_eq!(v, SCHEMA_VERSION);
        let n: i64 = conn.query_row("SELECT count(*) FROM coord_lane", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 1, "the lanes are kept");
        let pops: i64 = conn.query_row("SELECT count(*) FROM coord_lane_pops", [], |r| r.get(0)).unwrap();
        assert_eq!(pops, 0, "the counters start empty (0 for every lane)");
        assert!(conn.execute("INSERT INTO coord_lane_pops VALUES (4, 1)", []).is_err(), "lanes are 0..=3");
    }

    #[test]
    fn a_newer_schema_is_refused_unchanged() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn, "db.sqlite").unwrap();
        conn.execute("UPDATE coord_meta SET value = 99 WHERE key = 'schema_version'", []).unwrap();
        let e = migrate(&mut conn, "db.sqlite").expect_err("newer schema");
        let msg = e.to_string();
        assert!(matches!(e, Error::InvalidInput { .. }), "{e:?}");
        assert!(msg.contains("db.sqlite") && msg.contains("99") && msg.contains(&SCHEMA_VERSION.to_string()), "{msg}");
        let v: i64 = conn.query_row("SELECT value FROM coord_meta", [], |r| r.get(0)).unwrap();
        assert_eq!(v, 99, "nothing changed");
    }
}
