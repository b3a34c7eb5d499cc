//! Side effects every engine room shares: observations (K-15), best-effort enqueue with a
//! wakeup (K-13) and the stream key of an instance (K-16). They take the ports they use, so
//! the publisher (which has no engine) and the engine's modules call the same code.

use crate::id::{BusinessRound, ClaimToken, WorkflowId};
use crate::model::{Millis, Priority, WorkflowInstance};
use crate::ports::{DynObservationSink, DynQueue, DynWakeup, Observation, StreamKey};
use crate::transition::{KindAt, Transition, TransitionKind};

/// Who committed a write, as observations report it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Writer<'a> {
    /// The worker, absent for writes outside a worker (a standalone publisher).
    pub(crate) worker_id: Option<&'a str>,
    /// The claim token after the write, if any.
    pub(crate) claim_token: Option<&'a ClaimToken>,
}

/// Emit one observation per logical transition of a committed write (K-15); heartbeats
/// are not observed. The only place an [`Observation`] is built.
pub(crate) fn observe(
    sink: &DynObservationSink,
    inst: &WorkflowInstance,
    t: &Transition,
    revision: u64,
    writer: Writer<'_>,
) {
    for &KindAt { kind, step } in t.kinds_at() {
        if matches!(kind, TransitionKind::Heartbeat) {
            continue;
        }
        let step = step.and_then(|s| inst.steps.get(s as usize));
        sink.emit(Observation {
            workflow_id: inst.workflow_id.clone(),
            biz_key: inst.biz_key.clone(),
            workflow_type: inst.workflow_type.clone(),
            workflow_run: inst.retry_count,
            revision,
            kind,
            status: inst.status,
            step_name: step.map(|s| s.name.clone()),
            attempt: step.map_or(0, |s| s.attempt),
            elapsed_ms: step.map_or(0, |s| s.elapsed_ms),
            traffic_wait_ms: step.map_or(0, |s| s.traffic_wait_ms),
            error_class: step.and_then(|s| s.error.as_ref().map(|e| e.class)),
            at: t.now,
            worker_id: writer.worker_id.map(str::to_string),
            claim_token: writer.claim_token.cloned(),
        });
    }
}

/// Enqueue a candidate and ring the doorbell. Best effort: the queue only accelerates, the
/// rebuild scan restores a lost entry (K-13), so a failure is logged and nothing else.
pub(crate) async fn enqueue_and_wake(
    queue: &DynQueue,
    wakeup: &DynWakeup,
    workflow_id: &WorkflowId,
    priority: Priority,
    at: Millis,
) {
    if let Err(e) = queue.enqueue(workflow_id, priority, at).await {
        tracing::debug!(%workflow_id, error = %e, "enqueue failed (rebuild scan will restore)");
        return;
    }
    let _ = wakeup.notify().await;
}

/// The stream key of an instance: `input.object_id` (or the biz key), workflow id and
/// `input.fencing_token` (or the run number) (K-16).
pub(crate) fn stream_key(inst: &WorkflowInstance) -> StreamKey {
    let BusinessRound { object_id, fencing_token } = inst.round();
    let object_id = object_id.unwrap_or_else(|| inst.biz_key.as_str().into());
    let fencing_token = fencing_token.unwrap_or_else(|| format!("run-{}", inst.retry_count).into());
    StreamKey { object_id, workflow_id: inst.workflow_id.clone(), fencing_token }
}
