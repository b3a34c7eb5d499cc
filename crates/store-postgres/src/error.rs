//! Driver errors → [`kernel_core::Error`].
//!
//! The question each mapping answers: may the write have happened? Every write of this
//! crate is one autocommit statement, so a statement the server answered with an error
//! was rolled back whole:
//!
//! - a serialization failure or deadlock (`40001`, `40P01`), a statement cancelled by
//!   `statement_timeout` (`57014`), too many connections (`53xxx`) and any other `ERROR`
//!   the server *answered* are [`Error::Unavailable`]: certainly no effect, the same call
//!   may be tried again;
//! - a `FATAL` answer to a write (the backend terminated or the server shutting down,
//!   `57P0x`) is [`Error::Uncertain`]: the implicit transaction commits as the request
//!   ends, so the connection may have ended just after the commit;
//! - values PostgreSQL cannot store — NUL in text or JSONB (`22021`, `22P05`), a number
//!   out of range (`22003`), an oversize value or row (`54000`, `22001`) — are
//!   [`Error::InvalidInput`]: nothing was written and the same write would be refused again;
//! - a row a table constraint or the size trigger refuses (`23514`: the instance would
//!   exceed 16 MiB of JSON) is [`Error::InvalidInput`] (`document`), nothing written;
//! - a stored value that does not parse where a statement reads it as a number (`22P02`),
//!   or a stored document of the wrong shape for a JSON function (`22023`, e.g.
//!   `jsonb_array_length` of a `steps` that is not an array), is [`Error::Corrupt`]:
//!   nothing was written;
//! - a connection that was already closed, a checkout from the pool that failed or timed
//!   out, a statement that failed to *prepare*: nothing was sent, [`Error::Unavailable`];
//! - a connection lost or the client-side deadline passed **after** a write was sent:
//!   [`Error::Uncertain`] (the engine ends the claim instead of retrying). Reads have no
//!   effect, so every transport failure of a read is `Unavailable`.

use kernel_core::Error;
use tokio_postgres::error::{Severity, SqlState};

/// Whether a call could have changed the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Cannot change the database.
    Read,
    /// May change the database.
    Write,
}

/// SQLSTATEs of values the server cannot store: refused input, nothing written.
const REFUSED_VALUES: [&SqlState; 5] = [
    &SqlState::CHARACTER_NOT_IN_REPERTOIRE,  // 22021: NUL byte in text
    &SqlState::UNTRANSLATABLE_CHARACTER,     // 22P05: \u0000 in jsonb
    &SqlState::NUMERIC_VALUE_OUT_OF_RANGE,   // 22003: e.g. a counter past bigint
    &SqlState::PROGRAM_LIMIT_EXCEEDED,       // 54000: value or index row too large
    &SqlState::STRING_DATA_RIGHT_TRUNCATION, // 22001
];

/// Whether `e` is a unique-constraint violation.
pub fn is_unique_violation(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&SqlState::UNIQUE_VIOLATION)
}

/// Whether the server answered by ending the connection (`pg_terminate_backend`, a
/// shutdown): a statement it refused while preparing, or a read, may move to another
/// connection; a write may have committed just before (see [`map`]).
pub fn is_terminated(e: &tokio_postgres::Error) -> bool {
    matches!(e.code(), Some(c) if *c == SqlState::ADMIN_SHUTDOWN || *c == SqlState::CRASH_SHUTDOWN || *c == SqlState::CANNOT_CONNECT_NOW)
}

/// Whether a server error ended the session (`FATAL`, `PANIC`): decided on the
/// untranslated severity field — `DbError::severity()` is translated by the server's
/// `lc_messages` (`SCHWERWIEGEND`, `致命的エラー`) — else, on a server too old to send it,
/// on the SQLSTATE of a terminated or shutting-down backend (`57P01`–`57P03`).
pub fn ends_session(parsed: Option<Severity>, code: Option<&SqlState>) -> bool {
    match parsed {
        Some(s) => matches!(s, Severity::Fatal | Severity::Panic),
        None => {
            matches!(code, Some(c) if *c == SqlState::ADMIN_SHUTDOWN || *c == SqlState::CRASH_SHUTDOWN || *c == SqlState::CANNOT_CONNECT_NOW)
        }
    }
}

/// Map a driver error of a call of kind `op` whose statement was sent; `what` names the
/// call in the message. The driver's error is kept as the cause (`source()`).
pub fn map(op: Op, what: &str, e: tokio_postgres::Error) -> Error {
    let msg = format!("postgres {what}: {e}");
    let fatal = e.as_db_error().is_some_and(|d| ends_session(d.parsed_severity(), Some(d.code())));
    if fatal && op == Op::Write {
        // The server ended the connection (terminated, shutting down). In autocommit the
        // commit happens when the request ends, so the connection may have ended just after
        // committing this write: its outcome is unknown.
        return Error::uncertain_with(msg, e);
    }
    if let Some(code) = e.code() {
        if REFUSED_VALUES.contains(&code) {
            return Error::invalid_with(what, msg, e);
        }
        if *code == SqlState::CHECK_VIOLATION {
            // A table constraint refused the row the write would leave (the document size
            // of migration 2, a priority out of range): the statement failed whole.
            let field = match e.as_db_error().and_then(|d| d.constraint()) {
                Some("workflow_instances_document_size") => "document",
                _ => what,
            };
            return Error::invalid_with(field, msg, e);
        }
        if *code == SqlState::INVALID_TEXT_REPRESENTATION || *code == SqlState::INVALID_PARAMETER_VALUE {
            // Every bound value is typed, so only a stored value read as a number (a
            // step counter changed outside the kernel, 22P02) fails to parse, and only a
            // stored document of the wrong shape (`steps` not an array, 22023) is refused
            // by a JSON function: nothing written, and retrying would fail the same way.
            return Error::Corrupt { message: msg, workflow_id: None, cause: Some(e.into()) };
        }
        // The server answered: an autocommit statement that failed was rolled back.
        return Error::unavailable_with(msg, e);
    }
    if op == Op::Write {
        // Closed or I/O failure after the statement was handed to the connection: it may
        // have reached the server and committed.
        Error::uncertain_with(msg, e)
    } else {
        Error::unavailable_with(msg, e)
    }
}

/// Map a failure that happened before anything was executed (preparing a statement,
/// checking a connection out): certainly no effect.
pub fn before_send(what: &str, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::unavailable_with(format!("postgres {what}: {e}"), e)
}

/// The client-side deadline passed: a read had no effect, a write may have.
pub fn deadline(op: Op, what: &str, ms: u64) -> Error {
    let msg = format!("postgres {what}: no answer within the call deadline of {ms} ms");
    match op {
        Op::Read => Error::unavailable(msg),
        Op::Write => Error::uncertain(msg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The decision reads the untranslated severity (a server answering in German sends
    /// `SCHWERWIEGEND` as the translated field, `FATAL` as the parsed one), falling back
    /// on the SQLSTATE only when the server did not send it.
    #[test]
    fn session_end_is_decided_on_untranslated_fields() {
        assert!(ends_session(Some(Severity::Fatal), Some(&SqlState::ADMIN_SHUTDOWN)));
        assert!(ends_session(Some(Severity::Panic), None));
        assert!(ends_session(Some(Severity::Fatal), Some(&SqlState::T_R_SERIALIZATION_FAILURE)));
        assert!(!ends_session(Some(Severity::Error), Some(&SqlState::QUERY_CANCELED)));
        assert!(
            !ends_session(Some(Severity::Error), Some(&SqlState::ADMIN_SHUTDOWN)),
            "the severity decides when sent"
        );
        assert!(ends_session(None, Some(&SqlState::ADMIN_SHUTDOWN)));
        assert!(ends_session(None, Some(&SqlState::CRASH_SHUTDOWN)));
        assert!(!ends_session(None, Some(&SqlState::QUERY_CANCELED)));
        assert!(!ends_session(None, None));
    }
}
