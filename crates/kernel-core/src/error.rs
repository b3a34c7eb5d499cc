//! The one error type of the kernel. Adapters map their private errors into it.

use std::fmt;
use std::sync::Arc;

/// Result alias used by every port and engine call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure the kernel and its ports can report.
///
/// Variants are semantic, not per-backend: a Mongo timeout and a Redis connection reset are
/// both [`Error::Unavailable`] or [`Error::Uncertain`] depending on whether the write may have
/// happened. A variant an adapter maps a driver failure into keeps that failure as its
/// `cause`, which [`std::error::Error::source`] returns; build them with the constructors
/// ([`Error::unavailable_with`], …). Two errors compare equal when their variant, messages
/// and causes' messages are equal.
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
        /// The driver or parser failure that rejected it, if one did (a malformed URL, a
        /// document the server refuses as too large).
        #[source]
        cause: Option<Cause>,
    },
    /// The workflow type has no registered definition or plan.
    #[error("unregistered workflow type `{0}`")]
    UnregisteredType(String),
    /// No such record.
    #[error("not found: {0}")]
    NotFound(String),
    /// A unique constraint or conditional write refused the request.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The backend could not be reached; the call certainly had no effect.
    #[error("unavailable: {message}")]
    Unavailable {
        /// What failed, for logs (names the backend and the call).
        message: String,
        /// The driver's own error, when a driver reported the failure.
        #[source]
        cause: Option<Cause>,
    },
    /// The call may or may not have taken effect (timeout, connection lost mid-write).
    /// A claim that sees this ends; the write is never retried unconditionally (K-6.4).
    #[error("uncertain outcome: {message}")]
    Uncertain {
        /// What failed, for logs (names the backend and the call).
        message: String,
        /// The driver's own error, when a driver reported the failure.
        #[source]
        cause: Option<Cause>,
    },
    /// The business round moved on (fencing token changed, K-11.2).
    #[error("round changed: {0}")]
    RoundChanged(String),
    /// A bound the kernel keeps was reached (e.g. pending signals for a workflow id that
    /// does not exist); nothing was written. Retrying helps only once the count has fallen
    /// (the records were consumed or purged).
    #[error("limit exceeded: {what} is at its maximum of {max}")]
    LimitExceeded {
        /// What is bounded (e.g. `orphan_signals_per_workflow_max`).
        what: String,
        /// The bound.
        max: u64,
    },
    /// A stored record cannot be read back (written by an incompatible version, or changed
    /// outside the kernel). Nothing was written by the failing call, except by a claim,
    /// whose lease is written before the claimed document is decoded.
    #[error("corrupt stored data: {message}")]
    Corrupt {
        /// Which record or field does not decode, and why.
        message: String,
        /// The instance that does not decode, when the call did not name it (a claim of
        /// any instance, [`WorkflowStore::claim_any`](crate::ports::WorkflowStore::claim_any)).
        workflow_id: Option<crate::id::WorkflowId>,
        /// The decoder's own error, when a decoder reported the failure.
        #[source]
        cause: Option<Cause>,
    },
}

impl Error {
    /// Shorthand for [`Error::InvalidInput`] without a cause.
    pub fn invalid(field: impl Into<String>, reason: impl fmt::Display) -> Self {
        Error::InvalidInput { field: field.into(), reason: reason.to_string(), cause: None }
    }

    /// [`Error::InvalidInput`] rejected by `cause` (a parser's or driver's error).
    pub fn invalid_with(field: impl Into<String>, reason: impl fmt::Display, cause: impl Into<Cause>) -> Self {
        Error::InvalidInput { field: field.into(), reason: reason.to_string(), cause: Some(cause.into()) }
    }

    /// [`Error::Unavailable`] without a cause (a fake or a decorator that is down).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Error::Unavailable { message: message.into(), cause: None }
    }

    /// [`Error::Unavailable`] reported by a driver: `cause` is returned by `source()`.
    pub fn unavailable_with(message: impl Into<String>, cause: impl Into<Cause>) -> Self {
        Error::Unavailable { message: message.into(), cause: Some(cause.into()) }
    }

    /// [`Error::Uncertain`] without a cause.
    pub fn uncertain(message: impl Into<String>) -> Self {
        Error::Uncertain { message: message.into(), cause: None }
    }

    /// [`Error::Uncertain`] reported by a driver: `cause` is returned by `source()`.
    pub fn uncertain_with(message: impl Into<String>, cause: impl Into<Cause>) -> Self {
        Error::Uncertain { message: message.into(), cause: Some(cause.into()) }
    }

    /// [`Error::Corrupt`] without a cause.
    pub fn corrupt(message: impl Into<String>) -> Self {
        Error::Corrupt { message: message.into(), workflow_id: None, cause: None }
    }

    /// This error naming the instance that does not decode, if it is [`Error::Corrupt`].
    pub fn of_instance(self, id: crate::id::WorkflowId) -> Self {
        match self {
            Error::Corrupt { message, cause, .. } => Error::Corrupt { message, workflow_id: Some(id), cause },
            e => e,
        }
    }

    /// The instance an [`Error::Corrupt`] names, if any.
    pub fn corrupt_workflow_id(&self) -> Option<&crate::id::WorkflowId> {
        match self {
            Error::Corrupt { workflow_id, .. } => workflow_id.as_ref(),
            _ => None,
        }
    }

    /// [`Error::Corrupt`] reported by a decoder: `cause` is returned by `source()`.
    pub fn corrupt_with(message: impl Into<String>, cause: impl Into<Cause>) -> Self {
        Error::Corrupt { message: message.into(), workflow_id: None, cause: Some(cause.into()) }
    }

    /// The driver or decoder failure this error was mapped from, if any (the same value
    /// [`std::error::Error::source`] returns, still shared for cloning).
    pub fn cause(&self) -> Option<&Cause> {
        match self {
            Error::InvalidInput { cause, .. }
            | Error::Unavailable { cause, .. }
            | Error::Uncertain { cause, .. }
            | Error::Corrupt { cause, .. } => cause.as_ref(),
            _ => None,
        }
    }

    /// Whether the same call may simply be tried again later.
    ///
    /// Only [`Error::Unavailable`] qualifies: an [`Error::Uncertain`] write must be re-derived
    /// from a fresh read, and a [`Error::Conflict`] or [`Error::RoundChanged`] will not change
    /// by waiting.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Unavailable { .. })
    }
}

/// The underlying failure an [`Error`] was mapped from: a driver's, parser's or decoder's
/// own error, shared so the [`Error`] stays [`Clone`].
///
/// It dereferences to the error itself, so `source()` of the [`Error`] is the driver's error
/// (`downcast_ref::<redis::RedisError>()` finds it). Two causes are equal when their messages
/// are: equality of errors is for tests and for deduplicating reports, and a driver error has
/// no equality of its own.
#[derive(Clone)]
pub struct Cause(Arc<dyn std::error::Error + Send + Sync + 'static>);

impl Cause {
    /// Wrap a driver's error.
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Cause(Arc::new(e))
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for Cause {
    fn from(e: E) -> Self {
        Cause::new(e)
    }
}

impl std::ops::Deref for Cause {
    type Target = dyn std::error::Error + Send + Sync + 'static;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_string() == other.0.to_string()
    }
}

impl Eq for Cause {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[derive(Debug, PartialEq)]
    struct DriverError(&'static str);

    impl fmt::Display for DriverError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for DriverError {}

    #[test]
    fn source_is_the_drivers_own_error() {
        let e = Error::unavailable_with("redis: connect", DriverError("connection refused"));
        let src = e.source().expect("a cause");
        assert_eq!(src.downcast_ref::<DriverError>(), Some(&DriverError("connection refused")));
        let e = Error::uncertain_with("insert", DriverError("reset"));
        assert!(e.source().and_then(|s| s.downcast_ref::<DriverError>()).is_some());
        let e = Error::corrupt_with("field `x`", DriverError("bad utf-8"));
        assert!(e.source().and_then(|s| s.downcast_ref::<DriverError>()).is_some());
        let e = Error::invalid_with("redis url", "no scheme", DriverError("no scheme"));
        assert!(e.source().and_then(|s| s.downcast_ref::<DriverError>()).is_some());
        assert_eq!(e.to_string(), "invalid redis url: no scheme");
    }

    #[test]
    fn display_is_unchanged_by_the_cause() {
        assert_eq!(Error::unavailable("down").to_string(), "unavailable: down");
        assert_eq!(Error::unavailable_with("down", DriverError("x")).to_string(), "unavailable: down");
        assert_eq!(Error::uncertain_with("lost", DriverError("x")).to_string(), "uncertain outcome: lost");
        assert_eq!(Error::corrupt_with("f", DriverError("x")).to_string(), "corrupt stored data: f");
        assert_eq!(Error::invalid("f", "r").to_string(), "invalid f: r");
        assert!(Error::unavailable("down").source().is_none());
    }

    #[test]
    fn retryable_only_when_unavailable_with_or_without_cause() {
        assert!(Error::unavailable("down").is_retryable());
        assert!(Error::unavailable_with("down", DriverError("x")).is_retryable());
        assert!(!Error::uncertain_with("lost", DriverError("x")).is_retryable());
        assert!(!Error::corrupt("f").is_retryable());
        assert!(!Error::invalid("f", "r").is_retryable());
    }

    #[test]
    fn clones_compare_equal_and_causes_compare_by_message() {
        let e = Error::unavailable_with("down", DriverError("refused"));
        assert_eq!(e.clone(), e);
        assert_eq!(e, Error::unavailable_with("down", DriverError("refused")));
        assert_ne!(e, Error::unavailable_with("down", DriverError("reset")));
        assert_ne!(e, Error::unavailable("down"));
    }
}
