use crate::domain::{DurationMs, ErrorClass, Instant, WorkflowStatus};
use crate::id::{ClaimToken, WorkflowId};
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
    pub elapsed_ms: DurationMs,
    /// Permit wait accumulated by the step.
    pub traffic_wait_ms: DurationMs,
    /// Error class, if the transition records one.
    pub error_class: Option<ErrorClass>,
    /// The writer's clock at the commit (the instance's `updated_at`).
    pub at: Instant,
    /// Worker that committed it (absent for writes outside a worker).
    pub worker_id: Option<String>,
    /// Claim token after the write, if any.
    pub claim_token: Option<ClaimToken>,
    /// The signal type the instance waits for after the write, when it holds a signal wait
    /// (`None` for a timer, or no wait), so the projection can list the workflows waiting
    /// on a signal without reading instances. Absent in older serialized observations.
    #[serde(default)]
    pub wait_signal: Option<String>,
}

/// Where observations go.
pub trait ObservationSink: Send + Sync + 'static {
    /// Whether this sink wants observations at all.
    ///
    /// # Contract
    /// Cheap and side-effect free: the engine asks before building every observation (one
    /// per logical transition of each committed write, K-15) and builds none while it is
    /// `false`, so a sink that discards everything costs the hot path nothing. `false` means
    /// [`emit`](Self::emit) would discard whatever it is given; a sink that records or
    /// forwards returns `true`, a decorator forwards its inner sink's answer. The answer may
    /// change over time (a sink switched off at runtime); an observation skipped while it was
    /// `false` is not emitted later. Observations never drive execution (K-1.2), so no
    /// answer changes what the engine writes.
    fn enabled(&self) -> bool;

    /// Hand over one observation.
    ///
    /// # Contract
    /// Never blocks and never awaits: a full buffer drops the **newest** event and counts
    /// it. Failures are invisible to the engine (K-1.2). The engine calls it only while
    /// [`enabled`](Self::enabled) is `true`.
    fn emit(&self, obs: Observation);
}

/// `dyn ObservationSink`.
pub type DynObservationSink = dyn ObservationSink;

/// Discards observations.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoopObservationSink;

impl ObservationSink for NoopObservationSink {
    fn enabled(&self) -> bool {
        false
    }
    fn emit(&self, _obs: Observation) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_noop_sink_is_disabled_so_nothing_is_built_for_it() {
        let sink: &DynObservationSink = &NoopObservationSink;
        assert!(!sink.enabled());
    }
}
