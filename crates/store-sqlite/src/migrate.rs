//! Versioned schema migrations, shipped in the crate (`migrations/*.sql`).
//!
//! The file says whose it is and which version it holds in its header: `PRAGMA
//! application_id` = [`APPLICATION_ID`] and `PRAGMA user_version` = the schema version.
//! Both are written in the same transaction as the migrations they describe.

use crate::error::{self, Op};
use crate::{open_connection, SqliteConfig};
use kernel_core::{Error, Result};
use rusqlite::{Connection, TransactionBehavior};
use std::path::Path;
use std::time::Duration;

/// Every migration, in order: `(version, name, SQL)`. Versions are never renumbered and a
/// shipped file is never edited, only followed by a new one.
pub const MIGRATIONS: &[(u32, &str, &str)] = &[
    (1, "instances_and_inbox", include_str!("../migrations/0001_instances_and_inbox.sql")),
    (2, "observations", include_str!("../migrations/0002_observations.sql")),
    (3, "result_cache", include_str!("../migrations/0003_result_cache.sql")),
    (4, "dead_letters", include_str!("../migrations/0004_dead_letters.sql")),
    (5, "task_inbox", include_str!("../migrations/0005_task_inbox.sql")),
    (6, "compensation", include_str!("../migrations/0006_compensation.sql")),
    (7, "operator_audit", include_str!("../migrations/0007_operator_audit.sql")),
    (8, "trace_parent", include_str!("../migrations/0008_trace_parent.sql")),
    (9, "operator_request", include_str!("../migrations/0009_operator_request.sql")),
    (10, "refused_writes", include_str!("../migrations/0010_refused_writes.sql")),
];

/// The schema version this build writes and reads: the last migration's.
pub const SCHEMA_VERSION: u32 = 10;

/// `PRAGMA application_id` of a database of this crate (`"WFK1"`).
pub const APPLICATION_ID: i32 = 0x5746_4B31;

/// What the header and the catalogue say about a file.
#[derive(Debug, Clone, Copy)]
struct Identity {
    application_id: i32,
    user_version: u32,
    objects: i64,
}

fn identity(conn: &Connection) -> rusqlite::Result<Identity> {
    // One statement, so one read snapshot: read one by one, the three could straddle
    // another process's migration (tables there, header not yet written) and call the file
    // foreign. coord-local's tables (`coord_…`, versioned in their own row) may share the
    // file and may have been created first: they do not make a file foreign.
    let (application_id, user_version, objects): (i32, i64, i64) = conn.query_row(
        "SELECT (SELECT application_id FROM pragma_application_id), \
                (SELECT user_version FROM pragma_user_version), \
                (SELECT count(*) FROM sqlite_schema WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\' \
                 AND name NOT LIKE 'coord\\_%' ESCAPE '\\')",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    Ok(Identity { application_id, user_version: u32::try_from(user_version).unwrap_or(u32::MAX), objects })
}

/// Refused unless the file is empty or ours at a version this build knows. Nothing is
/// written before this check passes.
fn check(path: &Path, id: Identity) -> Result<()> {
    let file = path.display();
    let ours = id.application_id == APPLICATION_ID;
    let empty = id.application_id == 0 && id.user_version == 0 && id.objects == 0;
    if !ours && !empty {
        return Err(Error::Conflict(format!(
            "sqlite file `{file}` is not a workflow-kernel database (application_id {:#x}, user_version {}, {} \
             schema objects; expected application_id {APPLICATION_ID:#x}): nothing changed",
            id.application_id, id.user_version, id.objects
        )));
    }
    if id.user_version > SCHEMA_VERSION {
        return Err(Error::Conflict(format!(
            "sqlite file `{file}` has schema version {}, newer than version {SCHEMA_VERSION} this build knows: it \
             was written by a newer version; nothing changed",
            id.user_version
        )));
    }
    Ok(())
}

fn open_error(path: &Path, what: &str, e: rusqlite::Error) -> Error {
    match error::map(Op::Read, what, e) {
        Error::Corrupt { message, cause, .. } => {
            Error::Corrupt { message: format!("sqlite file `{}`: {message}", path.display()), workflow_id: None, cause }
        }
        Error::Unavailable { message, cause } => {
            Error::Unavailable { message: format!("sqlite file `{}`: {message}", path.display()), cause }
        }
        other => other,
    }
}

/// WAL is a property of the file, set once. Another process switching it at the same
/// moment makes this wait on its lock (busy timeout) — except when the two would deadlock
/// on a lock upgrade (each read the schema, each wants the exclusive lock): SQLite then
/// answers `SQLITE_BUSY` at once, without its busy handler. Such an answer is retried with
/// short pauses until `wait` has passed since the first try. Returns the journal mode.
fn switch_to_wal(conn: &Connection, wait: Duration) -> rusqlite::Result<String> {
    let deadline = std::time::Instant::now() + wait;
    let mut pause = Duration::from_millis(2);
    loop {
        match conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0)) {
            Err(rusqlite::Error::SqliteFailure(f, _))
                if f.code == rusqlite::ErrorCode::DatabaseBusy && std::time::Instant::now() + pause < deadline =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

/// Blocking: open `path`, check it (nothing changed when it is not ours or newer), switch it to WAL
/// and apply the migrations it lacks in one `BEGIN IMMEDIATE` transaction: the version is
/// re-read under the write lock, so when two processes start at once one migrates and the
/// other waits (up to [`SqliteConfig::migrate_wait_ms`]) and then finds nothing to do.
/// Returns the versions applied.
pub fn migrate(path: &Path, config: &SqliteConfig) -> Result<Vec<u32>> {
    let mut conn = open_connection(path, config, true).map_err(|e| open_error(path, "open", e))?;
    conn.busy_timeout(Duration::from_millis(config.migrate_wait_ms)).map_err(|e| open_error(path, "open", e))?;
    // A read: fails on a file that is not a database at all (SQLITE_NOTADB), changes nothing.
    let id = identity(&conn).map_err(|e| open_error(path, "read the header", e))?;
    check(path, id)?;
    if config.read_only {
        if id.user_version != SCHEMA_VERSION {
            return Err(Error::Conflict(format!(
                "sqlite file `{}` has schema version {}, this build needs {SCHEMA_VERSION}, and it is opened read-only",
                path.display(),
                id.user_version
            )));
        }
        return Ok(Vec::new());
    }
    let mode = switch_to_wal(&conn, Duration::from_millis(config.migrate_wait_ms))
        .map_err(|e| open_error(path, "set WAL mode", e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::unavailable(format!(
            "sqlite file `{}`: cannot switch to WAL mode (journal_mode stays `{mode}`)",
            path.display()
        )));
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| open_error(path, "migrate: begin", e))?;
    // Re-read under the write lock: another process may have migrated meanwhile.
    let id = identity(&tx).map_err(|e| open_error(path, "migrate: read the header", e))?;
    check(path, id)?;
    let mut done = Vec::new();
    for (version, name, sql) in MIGRATIONS {
        if *version <= id.user_version {
            continue;
        }
        tx.execute_batch(sql).map_err(|e| open_error(path, &format!("migrate: version {version} ({name})"), e))?;
        done.push(*version);
    }
    if !done.is_empty() || id.application_id != APPLICATION_ID {
        tx.execute_batch(&format!("PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {SCHEMA_VERSION};"))
            .map_err(|e| open_error(path, "migrate: write the header", e))?;
    }
    tx.commit().map_err(|e| error::map(Op::Write, "migrate: commit", e))?;
    Ok(done)
}
