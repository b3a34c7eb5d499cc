//! Driver errors → [`kernel_core::Error`].
//!
//! The question each mapping answers: may the write have happened? A server that answered
//! `ok: 0` (or a write error) did not apply a single-document write; a request that never
//! left (no server selected, pool cleared before sending) did not either — both are
//! [`Error::Unavailable`]. A connection lost or a timeout after the request was sent, a
//! write-concern failure (applied on the primary, replication unknown) and an unreadable
//! reply are [`Error::Uncertain`] for writes: the engine ends the claim instead of retrying.
//! Reads have no effect, so every transport failure of a read is `Unavailable`.

use kernel_core::Error;
use mongodb::error::{Error as DriverError, ErrorKind, WriteFailure};

/// The MongoDB code of a duplicate-key error.
pub const DUPLICATE_KEY: i32 = 11000;

/// Whether a call could have changed the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Cannot change the database.
    Read,
    /// May change the database.
    Write,
}

/// The server error code, wherever the driver put it.
pub(crate) fn code(e: &DriverError) -> Option<i32> {
    match e.kind.as_ref() {
        ErrorKind::Command(c) => Some(c.code),
        ErrorKind::Write(WriteFailure::WriteError(w)) => Some(w.code),
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => Some(w.code),
        _ => None,
    }
}

pub(crate) fn is_duplicate_key(e: &DriverError) -> bool {
    code(e) == Some(DUPLICATE_KEY)
}

// Codes of a server that refuses a document's content, so the write was not applied and
// the same write would be refused again: the document would exceed 16 MiB
// (BSONObjectTooLarge 10334, "Resulting document after update is larger than …" 17419,
// 17420), nest deeper than the server allows (Overflow 15), or hold a field the server
// cannot store (DollarPrefixedFieldName 52, EmptyFieldName 56, DottedFieldName 57,
// InvalidDBRef 55).
const TOO_LARGE: [i32; 8] = [10334, 17419, 17420, 15, 52, 55, 56, 57];

/// Map a driver error of a call of kind `op`; `what` names the call in the message. The
/// driver's error is kept as the cause (`source()`). This is the one mapping of MongoDB
/// driver errors into [`kernel_core::Error`]; every adapter of this crate uses it.
pub fn map(op: Op, what: &str, e: DriverError) -> Error {
    let msg = format!("{what}: {e}");
    let kind = match e.kind.as_ref() {
        ErrorKind::Write(WriteFailure::WriteConcernError(_)) => uncertain_if_write(op),
        ErrorKind::Command(c) if TOO_LARGE.contains(&c.code) => Kind::Invalid,
        ErrorKind::Write(WriteFailure::WriteError(w)) if TOO_LARGE.contains(&w.code) => Kind::Invalid,
        ErrorKind::Command(c) if c.code == 50 => uncertain_if_write(op), // MaxTimeMSExpired
        // The server answered `ok: 0`: a single-document write was not applied.
        ErrorKind::Command(_) | ErrorKind::Write(WriteFailure::WriteError(_)) => Kind::Unavailable,
        ErrorKind::ServerSelection { .. }
        | ErrorKind::DnsResolve { .. }
        | ErrorKind::Authentication { .. }
        | ErrorKind::InvalidTlsConfig { .. }
        | ErrorKind::Shutdown => Kind::Unavailable,
        ErrorKind::InvalidArgument { .. } | ErrorKind::BsonSerialization(_) => Kind::Invalid,
        // Io, pool cleared mid-operation, unreadable replies and anything newer: the request
        // may have reached the server.
        _ => uncertain_if_write(op),
    };
    match kind {
        Kind::Unavailable => Error::unavailable_with(msg, e),
        Kind::Uncertain => Error::uncertain_with(msg, e),
        Kind::Invalid => Error::invalid_with(what, msg, e),
    }
}

/// Which [`Error`] variant a driver error lands in.
enum Kind {
    Unavailable,
    Uncertain,
    Invalid,
}

/// A transport failure of a write may have applied it; of a read, it had no effect.
fn uncertain_if_write(op: Op) -> Kind {
    if op == Op::Write {
        Kind::Uncertain
    } else {
        Kind::Unavailable
    }
}
