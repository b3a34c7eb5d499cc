//! Human-task steps (K-17.5): a person approves, rejects, escalates or cancels; a timeout
//! never approves.

use crate::ports::TaskOutcome;
use serde::{Deserialize, Serialize};

/// What the SLA path of a human-task step may conclude when nobody decided in time. It has
/// no approve variant, so no configuration and no code path can turn a timeout into an
/// approval:
///
/// ```compile_fail
/// use kernel_core::human::SlaOutcome;
/// let _ = SlaOutcome::Approve; // there is no such variant: a timeout never approves
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SlaOutcome {
    /// Hand the task to the next level of the escalation path (past the last level the
    /// step ends `escalated`).
    Escalate,
    /// Conclude with a rejection.
    Reject,
    /// Conclude with a cancellation.
    Cancel,
}

impl SlaOutcome {
    /// The outcome a step records for it; never [`TaskOutcome::Approve`].
    pub fn outcome(self) -> TaskOutcome {
        match self {
            SlaOutcome::Escalate => TaskOutcome::Escalate,
            SlaOutcome::Reject => TaskOutcome::Reject,
            SlaOutcome::Cancel => TaskOutcome::Cancel,
        }
    }
}
