use crate::id::{ClaimToken, WorkflowId};
use crate::model::{ErrorClass, Millis, WorkflowStatus};
use crate::transition::TransitionKind;
use serde::{Deserialize, Serialize};

/// One committed transition, for the ops projection (K-15). Never drives execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// The instance written.
    pub workflow_id: WorkflowId,
    /// Its permanent idempotency key, so ops views can search by business object.
    pub biz_key: String,
    /// Its definition type.
    pub workflow_type: String,
    /// `workflow_run = retry_count`.
    pub workflow_run: u32,
    /// The committed revision.
    pub revision: u64,
    /// Which logical transition of the write this is (a fused write emits one observation
    /// per kind, K-7.1).
    pub kind: TransitionKind,
    /// Workflow status after the write.
    pub status: WorkflowStatus,
    /// Step concerned, if any.
    pub step_name: Option<String>,
    /// Step attempt after the write.
    pub attempt: u32,
    /// Activity time of that attempt.
    pub elapsed_ms: i64,
    /// Permit wait accumulated by the step.
    pub traffic_wait_ms: i64,
    /// Error class, if the transition records one.
    pub error_class: Option<ErrorClass>,
    /// The writer's clock at the commit (the instance's `updated_at`).
    pub at: Millis,
    /// Worker that committed it (absent for writes outside a worker).
    pub worker_id: Option<String>,
    /// Claim token after the write, if any.
    pub claim_token: Option<ClaimToken>,
}

/// Where observations go.
pub trait ObservationSink: Send + Sync + 'static {
    /// Hand over one observation.
    ///
    /// # Contract
    /// Never blocks and never awaits: a full buffer drops the **newest** event and counts
    /// it. Failures are invisible to the engine (K-1.2).
    fn emit(&self, obs: Observation);
}

/// `dyn ObservationSink`.
pub type DynObservationSink = dyn ObservationSink;

/// Discards observations.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoopObservationSink;

impl ObservationSink for NoopObservationSink {
    fn emit(&self, _obs: Observation) {}
}
