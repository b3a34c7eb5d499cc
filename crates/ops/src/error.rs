//! The operator surface's one error type: five kinds, each with its exit code and its HTTP
//! status, so the command line and the console answer the same refusal the same way.

use serde::Serialize;

/// What went wrong, in the terms an operator acts on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
#[serde(tag = "error", content = "message", rename_all = "snake_case")]
pub enum OpsError {
    /// No such workflow, dead letter, task, object or resource.
    #[error("not found: {0}")]
    NotFound(String),
    /// The request itself is wrong (a bad id, filter, payload or flag).
    #[error("bad input: {0}")]
    BadInput(String),
    /// Refused by a guard: the state no longer allows it (K-6.4), the actor's role or
    /// eligibility does not, or a decision was taken already.
    #[error("refused: {0}")]
    Refused(String),
    /// A store, queue or repository could not be reached, or answered uncertainly.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

impl OpsError {
    /// The process exit code of the `wfk` command line: 1 not found, 2 bad input, 3 refused
    /// by a guard, 4 unavailable (0 is success).
    pub fn exit_code(&self) -> u8 {
        match self {
            OpsError::NotFound(_) => 1,
            OpsError::BadInput(_) => 2,
            OpsError::Refused(_) => 3,
            OpsError::Unavailable(_) => 4,
        }
    }

    /// The HTTP status of the ops server: 404, 400, 409, 503.
    pub fn http_status(&self) -> u16 {
        match self {
            OpsError::NotFound(_) => 404,
            OpsError::BadInput(_) => 400,
            OpsError::Refused(_) => 409,
            OpsError::Unavailable(_) => 503,
        }
    }

    /// `not_found`, `bad_input`, `refused` or `unavailable` (the audit log's result).
    pub fn kind(&self) -> &'static str {
        match self {
            OpsError::NotFound(_) => "not_found",
            OpsError::BadInput(_) => "bad_input",
            OpsError::Refused(_) => "refused",
            OpsError::Unavailable(_) => "unavailable",
        }
    }

    /// The message without the kind.
    pub fn message(&self) -> &str {
        match self {
            OpsError::NotFound(m) | OpsError::BadInput(m) | OpsError::Refused(m) | OpsError::Unavailable(m) => m,
        }
    }
}

impl From<kernel_core::Error> for OpsError {
    fn from(e: kernel_core::Error) -> Self {
        use kernel_core::Error as E;
        match e {
            E::NotFound(m) => OpsError::NotFound(m),
            E::InvalidInput { .. } | E::UnregisteredType(_) => OpsError::BadInput(e.to_string()),
            E::Conflict(m) | E::RoundChanged(m) => OpsError::Refused(m),
            E::LimitExceeded { .. } => OpsError::Refused(e.to_string()),
            _ => OpsError::Unavailable(e.to_string()),
        }
    }
}

impl From<observer::Error> for OpsError {
    fn from(e: observer::Error) -> Self {
        match e {
            observer::Error::InvalidRecord(m) => OpsError::BadInput(m),
            e @ observer::Error::InvalidInput { .. } => OpsError::BadInput(e.to_string()),
            other => OpsError::Unavailable(other.to_string()),
        }
    }
}

impl From<compose::ComposeError> for OpsError {
    fn from(e: compose::ComposeError) -> Self {
        use compose::ComposeError as C;
        match e {
            C::Connect { .. } => OpsError::Unavailable(e.to_string()),
            other => OpsError::BadInput(other.to_string()),
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = OpsError> = std::result::Result<T, E>;
