//! The one error type of the kernel. Adapters map their private errors into it.

use std::fmt;

/// Result alias used by every port and engine call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure the kernel and its ports can report.
///
/// Variants are semantic, not per-backend: a Mongo timeout and a Redis connection reset are
/// both [`Error::Unavailable`] or [`Error::Uncertain`] depending on whether the write may have
/// happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A caller-supplied value breaks a rule; nothing was written.
    #[error("invalid {field}: {reason}")]
    InvalidInput {
        /// Which input (e.g. `biz_key`, `steps[2].name`).
        field: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The workflow type has no registered definition or plan.
    #[error("unregistered workflow type `{0}`")]
    UnregisteredType(String),
    /// A token-guarded write missed: another worker holds the instance, or it moved on (K-6.4).
    #[error("claim lost on workflow `{0}`")]
    ClaimLost(String),
    /// No such record.
    #[error("not found: {0}")]
    NotFound(String),
    /// A unique constraint or conditional write refused the request.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The backend could not be reached; the call certainly had no effect.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The call may or may not have taken effect (timeout, connection lost mid-write).
    /// A claim that sees this ends; the write is never retried unconditionally (K-6.4).
    #[error("uncertain outcome: {0}")]
    Uncertain(String),
    /// The business round moved on (fencing token changed, K-11.2).
    #[error("round changed: {0}")]
    RoundChanged(String),
    /// The engine is shutting down.
    #[error("shutting down")]
    ShuttingDown,
    /// A stored record cannot be read back (written by an incompatible version, or changed
    /// outside the kernel). Nothing was written by the failing call.
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
}

impl Error {
    /// Shorthand for [`Error::InvalidInput`].
    pub fn invalid(field: impl Into<String>, reason: impl fmt::Display) -> Self {
        Error::InvalidInput { field: field.into(), reason: reason.to_string() }
    }

    /// Whether the same call may simply be tried again later.
    ///
    /// Only [`Error::Unavailable`] qualifies: an [`Error::Uncertain`] write must be re-derived
    /// from a fresh read, and a [`Error::ClaimLost`] must never be retried.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Unavailable(_))
    }
}
