//! An operator's request to the holder of a live claim (K-6.8).
//!
//! An operator action that would take execution away from a claim whose lease may still
//! run (cancel, regenerate, and every bulk action built on them) is not written as the
//! action itself: it is recorded on the instance as an [`OperatorRequest`], in one write
//! fenced by the holder's claim token that also replaces that token. The holder's next
//! guarded write (its heartbeat, or the write that ends its step) then misses; once its
//! activities have returned, it reads the request and applies it, clearing the claim.
//! When the holder is gone, the worker that claims the instance after the lease has ended
//! applies the request before it starts anything. The lease itself is never shortened, so
//! no two executions of one step overlap.
//!
//! An instance that no claim holds (waiting, or released) takes the action directly under
//! [`Guard::Operator`](crate::transition::Guard::Operator), which requires that no claim
//! token is set.

use crate::error::Result;
use crate::id::ClaimToken;
use crate::time::Instant;
use crate::validate;
use serde::{Deserialize, Serialize};

/// What an operator asked the holder of a live claim to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RequestedAction {
    /// Cancel / supersede (K-8): `→ canceled`, the claim cleared.
    Cancel,
    /// Regenerate step `step` (K-17.3), computed from the instance as the holder leaves it.
    Regenerate {
        /// The step to regenerate (a step name of the instance's definition).
        step: String,
    },
}

impl RequestedAction {
    /// The action's name, as `wfk show` and the console print it.
    pub fn as_str(&self) -> &'static str {
        match self {
            RequestedAction::Cancel => "cancel",
            RequestedAction::Regenerate { .. } => "regenerate",
        }
    }
}

/// A request recorded on an instance under a live claim (K-6.8); at most one per instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorRequest {
    /// Unique id of the request (K-2.0 identifier), for the audit trail.
    pub id: String,
    /// What was asked.
    pub action: RequestedAction,
    /// The claim the request was addressed to: the token it replaced. Its holder applies
    /// the request at the end of its claim; any later claimer applies it at its start.
    pub holder: ClaimToken,
    /// The requesting process's clock.
    pub requested_at: Instant,
}

impl OperatorRequest {
    /// The K-2.0 check of what the request stores: its id and the holder's token follow
    /// the identifier rule, a regenerated step's name is a document key.
    ///
    /// ```
    /// use kernel_core::operator_request::{OperatorRequest, RequestedAction};
    /// use kernel_core::Instant;
    /// let r = OperatorRequest {
    ///     id: "req-1".into(),
    ///     action: RequestedAction::Regenerate { step: "draft".into() },
    ///     holder: "tok-1".into(),
    ///     requested_at: Instant::ZERO,
    /// };
    /// assert!(r.validate().is_ok());
    /// assert!(OperatorRequest { id: "".into(), ..r }.validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<()> {
        validate::identifier("operator_request.id", &self.id)?;
        validate::identifier("operator_request.holder", self.holder.as_str())?;
        match &self.action {
            RequestedAction::Cancel => Ok(()),
            RequestedAction::Regenerate { step } => validate::key_name("operator_request.step", step),
        }
    }
}
