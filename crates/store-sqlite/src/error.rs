//! SQLite errors → [`kernel_core::Error`].
//!
//! The question each mapping answers: may the write have happened? Every guarded write of
//! this crate is one autocommit statement (or one `BEGIN IMMEDIATE` transaction), and
//! SQLite rolls back a statement (and an autocommit transaction) that fails, so:
//!
//! - another connection's lock held past the busy timeout (`SQLITE_BUSY`,
//!   `SQLITE_LOCKED`), a read-only file or directory (`SQLITE_READONLY`), a full disk or
//!   quota (`SQLITE_FULL`), a file that cannot be opened (`SQLITE_CANTOPEN`,
//!   `SQLITE_PERM`, `SQLITE_AUTH`): [`Error::Unavailable`], certainly no effect; the same
//!   call may succeed once the condition is gone (space freed, permissions fixed, the lock
//!   released);
//! - a row a `CHECK` constraint refuses (`SQLITE_CONSTRAINT_CHECK`: the instance would hold
//!   more than 16 MiB of JSON, a priority out of range), a value too large for SQLite
//!   (`SQLITE_TOOBIG`), an integer overflow in an expression, any other refusal of the
//!   statement's input that the same statement meets again ([`REFUSED_INPUT`]: a JSON path
//!   SQLite cannot parse, a value JSON cannot hold, too many bound values):
//!   [`Error::InvalidInput`], nothing written — never `Unavailable`, which a caller retries
//!   (the engine would re-run the activity on every claim);
//! - a database file that is not one (`SQLITE_NOTADB`) or is damaged (`SQLITE_CORRUPT`),
//!   a stored value a statement cannot read as JSON: [`Error::Corrupt`];
//! - an I/O error (`SQLITE_IOERR`) while writing: [`Error::Uncertain`] (it may come from
//!   the sync of a commit whose frames are already in the log); while reading,
//!   `Unavailable`;
//! - the call deadline passed: the statement is interrupted; a read is `Unavailable`, a
//!   write `Uncertain` (it may have committed just before the interrupt).

use kernel_core::Error;
use rusqlite::ffi::ErrorCode;

/// Whether a call could have changed the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Cannot change the database.
    Read,
    /// May change the database.
    Write,
}

/// Messages of SQLite's `SQLITE_ERROR` that refuse what a statement was given, so that the
/// same statement fails again: [`Error::InvalidInput`]. (Store paths are escaped,
/// `sql_protocol::sqlite_json_path`, so a name never produces the first; the mapping is the
/// last line, should a path or value reach SQLite that it cannot take.)
pub const REFUSED_INPUT: [&str; 6] = [
    "bad JSON path",
    "JSON path too deep",
    "JSON nested too deep",
    "JSON cannot hold BLOB values",
    "too many SQL variables",
    "Expression tree is too large",
];

/// Map a rusqlite error of a call of kind `op`; `what` names the call in the message. The
/// driver's error is kept as the cause (`source()`).
pub fn map(op: Op, what: &str, e: rusqlite::Error) -> Error {
    let msg = format!("sqlite {what}: {e}");
    match &e {
        rusqlite::Error::SqliteFailure(f, _) => match f.code {
            ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
            | ErrorCode::ReadOnly
            | ErrorCode::DiskFull
            | ErrorCode::CannotOpen
            | ErrorCode::PermissionDenied
            | ErrorCode::AuthorizationForStatementDenied
            | ErrorCode::NoLargeFileSupport
            | ErrorCode::OutOfMemory => Error::unavailable_with(msg, e),
            ErrorCode::ConstraintViolation => {
                let field = if msg.contains("workflow_instances_document_size") { "document" } else { what };
                Error::invalid_with(field, msg, e)
            }
            ErrorCode::TooBig | ErrorCode::TypeMismatch | ErrorCode::ParameterOutOfRange => {
                Error::invalid_with(what, msg, e)
            }
            ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt => Error::corrupt_with(msg, e),
            ErrorCode::OperationInterrupted | ErrorCode::SystemIoFailure | ErrorCode::FileLockingProtocolFailed
                if op == Op::Write =>
            {
                Error::uncertain_with(msg, e)
            }
            // A statement that failed otherwise (malformed JSON in a stored value, an
            // integer overflow) was rolled back: nothing written, and the same statement
            // fails again.
            ErrorCode::Unknown if msg.contains("malformed JSON") => Error::corrupt_with(msg, e),
            ErrorCode::Unknown if msg.contains("integer overflow") => Error::invalid_with(what, msg, e),
            ErrorCode::Unknown if REFUSED_INPUT.iter().any(|r| msg.contains(r)) => Error::invalid_with(what, msg, e),
            _ => Error::unavailable_with(msg, e),
        },
        rusqlite::Error::ToSqlConversionFailure(_) | rusqlite::Error::NulError(_) => Error::invalid_with(what, msg, e),
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::IntegralValueOutOfRange(..)
        | rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::Utf8Error(..) => Error::corrupt_with(msg, e),
        _ if op == Op::Write => Error::uncertain_with(msg, e),
        _ => Error::unavailable_with(msg, e),
    }
}

/// The call deadline passed: a read had no effect, a write may have.
pub fn deadline(op: Op, what: &str, ms: u64) -> Error {
    let msg = format!("sqlite {what}: no answer within the call deadline of {ms} ms");
    match op {
        Op::Read => Error::unavailable(msg),
        Op::Write => Error::uncertain(msg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What SQLite refuses in the input of a statement — here a JSON path it cannot parse
    /// ("bad JSON path", as a name ending in `\` made of a pasted path) — fails the same
    /// statement again: it is [`Error::InvalidInput`], never an outage the caller would retry
    /// on every claim.
    #[test]
    fn deterministic_refusals_are_invalid_input() {
        let c = rusqlite::Connection::open_in_memory().unwrap();
        for sql in [
            r#"SELECT json_set('{}', '$."tail\', 1)"#,
            "SELECT json_extract('{}', 'no-dollar')",
            "SELECT json_extract('[1]', '$[x]')",
        ] {
            for op in [Op::Read, Op::Write] {
                let e = c.query_row(sql, [], |r| r.get::<_, Option<String>>(0)).expect_err(sql);
                let mapped = map(op, "apply", e);
                assert!(matches!(mapped, Error::InvalidInput { .. }), "{sql} ({op:?}): {mapped:?}");
            }
        }
    }
}
