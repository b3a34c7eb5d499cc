//! What a start asks (`StartRequest`) and what it answers (`StartOutcome`), K-5.

use crate::domain::*;
use crate::id::WorkflowId;
use crate::trace::TraceParent;
use serde_json::Value;

/// A StartOrResume request (K-5).
#[derive(Debug, Clone, PartialEq)]
pub struct StartRequest {
    /// Registered type.
    pub workflow_type: String,
    /// Permanent idempotency key.
    pub biz_key: String,
    /// Business-facing id; generated when absent.
    pub workflow_id: Option<WorkflowId>,
    /// Exact input snapshot (small).
    pub input: Value,
    /// Lane (promote-only).
    pub priority: Priority,
    /// The caller's W3C trace context, stored with the instance when this request creates
    /// it (never changed afterwards) and handed to its activities
    /// ([`ActivityContext::trace_parent`](crate::ActivityContext::trace_parent)).
    pub trace_parent: Option<TraceParent>,
}

impl StartRequest {
    /// A request with priority P2 and a generated workflow id.
    pub fn new(workflow_type: impl Into<String>, biz_key: impl Into<String>, input: Value) -> Self {
        StartRequest {
            workflow_type: workflow_type.into(),
            biz_key: biz_key.into(),
            workflow_id: None,
            input,
            priority: Priority::P2,
            trace_parent: None,
        }
    }
    /// Set the workflow id.
    pub fn workflow_id(mut self, id: impl Into<WorkflowId>) -> Self {
        self.workflow_id = Some(id.into());
        self
    }
    /// Set the priority.
    pub fn priority(mut self, p: Priority) -> Self {
        self.priority = p;
        self
    }
    /// Carry the caller's trace context (parse the header with [`TraceParent::parse`]).
    pub fn trace_parent(mut self, tp: TraceParent) -> Self {
        self.trace_parent = Some(tp);
        self
    }
}

/// Result of StartOrResume.
#[derive(Debug, Clone, PartialEq)]
pub struct StartOutcome {
    /// The instance as read or written.
    pub instance: WorkflowInstance,
    /// True only for a create and for the replay winner (K-5).
    pub execution_activated: bool,
    /// True when this call inserted the instance.
    pub created: bool,
}
