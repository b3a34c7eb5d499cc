//! Side effects every engine room shares: observations (K-15), best-effort enqueue with a
//! wakeup (K-13) and the stream key of an instance (K-16). They take the ports they use, so
//! the publisher (which has no engine) and the engine's modules call the same code.

use crate::domain::{DurationMs, Instant, Priority, WorkflowInstance};
use crate::id::{BusinessRound, ClaimToken, WorkflowId};
use crate::ports::{DynObservationSink, DynQueue, DynWakeup, LaneEntry, Observation, StreamKey, ENQUEUE_MANY_MAX};
use crate::transition::{KindAt, Transition, TransitionKind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Who committed a write, as observations report it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Writer<'a> {
    /// The worker, absent for writes outside a worker (a standalone publisher).
    pub(crate) worker_id: Option<&'a str>,
    /// The claim token after the write, if any.
    pub(crate) claim_token: Option<&'a ClaimToken>,
}

/// Emit one observation per logical transition of a committed write (K-15); heartbeats
/// are not observed. The only place an [`Observation`] is built, and only for a sink that
/// is [enabled](crate::ports::ObservationSink::enabled): a disabled sink costs one call.
/// `inst` is the document after the write (its input and outputs are not read, so the
/// claim passes its copy as it holds it, under its lock).
pub(crate) fn observe(
    sink: &DynObservationSink,
    inst: &WorkflowInstance,
    t: &Transition,
    revision: u64,
    writer: Writer<'_>,
) {
    if !sink.enabled() {
        return;
    }
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
            elapsed_ms: step.map_or(DurationMs::ZERO, |s| s.elapsed_ms),
            traffic_wait_ms: step.map_or(DurationMs::ZERO, |s| s.traffic_wait_ms),
            error_class: step.and_then(|s| s.error.as_ref().map(|e| e.class)),
            at: t.now,
            worker_id: writer.worker_id.map(str::to_string),
            claim_token: writer.claim_token.cloned(),
            wait_signal: inst.wait.as_ref().and_then(|w| w.signal_type()).map(str::to_string),
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
    at: Instant,
) {
    if let Err(e) = queue.enqueue(workflow_id, priority, at).await {
        tracing::debug!(%workflow_id, error = %e, "enqueue failed (rebuild scan will restore)");
        return;
    }
    let _ = wakeup.notify().await;
}

/// The bulk form of [`enqueue_and_wake`]: every entry in one [`enqueue_many`] call per
/// [`ENQUEUE_MANY_MAX`] entries, then one ring for all of them. Best effort the same way:
/// after the first failed call it makes no more (Redis is down; the rebuild scan restores
/// what was not enqueued) and rings only when something was enqueued. Returns how many
/// entries were enqueued. An empty slice makes no call.
///
/// [`enqueue_many`]: crate::ports::ReadyQueue::enqueue_many
pub(crate) async fn enqueue_many_and_wake(queue: &DynQueue, wakeup: &DynWakeup, entries: &[LaneEntry]) -> usize {
    let mut enqueued = 0;
    for chunk in entries.chunks(ENQUEUE_MANY_MAX) {
        if let Err(e) = queue.enqueue_many(chunk).await {
            tracing::debug!(entries = chunk.len(), error = %e, "bulk enqueue failed (rebuild scan will restore)");
            break;
        }
        enqueued += chunk.len();
    }
    if enqueued > 0 {
        let _ = wakeup.notify().await;
    }
    enqueued
}

/// Enqueue + wakeup for a whole pass over many instances: after the first Redis error of the
/// pass it stops calling Redis (K-13: the lanes only accelerate; the store-fallback claim and
/// the next pass's rebuild scan find what was skipped). During an outage a reconnecting
/// client spends its connect timeout on every call, so without the gate one pass over `n`
/// instances would pay that `n` times while every timer waits for it.
#[derive(Debug, Default)]
pub(crate) struct QueueGate {
    down: AtomicBool,
    skipped: AtomicUsize,
}

impl QueueGate {
    /// Whether a call of this pass failed: no more Redis calls in it.
    pub(crate) fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }

    /// Enqueues skipped because Redis was down in this pass.
    pub(crate) fn skipped(&self) -> usize {
        self.skipped.load(Ordering::Relaxed)
    }

    fn trip(&self, workflow_id: &WorkflowId, e: &crate::error::Error) {
        if !self.down.swap(true, Ordering::Relaxed) {
            tracing::warn!(%workflow_id, error = %e, "ready queue unavailable; no more Redis calls in this pass");
        }
    }

    /// Enqueue unless Redis already failed in this pass; returns whether it was enqueued.
    pub(crate) async fn enqueue(
        &self,
        queue: &DynQueue,
        workflow_id: &WorkflowId,
        priority: Priority,
        at: Instant,
    ) -> bool {
        if self.is_down() {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        match queue.enqueue(workflow_id, priority, at).await {
            Ok(()) => true,
            Err(e) => {
                self.trip(workflow_id, &e);
                self.skipped.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Ring the doorbell unless Redis already failed in this pass.
    pub(crate) async fn notify(&self, wakeup: &DynWakeup) {
        if self.is_down() {
            return;
        }
        if let Err(e) = wakeup.notify().await {
            tracing::debug!(error = %e, "wakeup failed; no more Redis calls in this pass");
            self.down.store(true, Ordering::Relaxed);
        }
    }

    /// [`enqueue`](Self::enqueue), then ring the doorbell when it was enqueued.
    pub(crate) async fn enqueue_and_wake(
        &self,
        queue: &DynQueue,
        wakeup: &DynWakeup,
        workflow_id: &WorkflowId,
        priority: Priority,
        at: Instant,
    ) {
        if self.enqueue(queue, workflow_id, priority, at).await {
            self.notify(wakeup).await;
        }
    }
}

/// The stream key of an instance: `input.object_id` (or the biz key), workflow id and
/// `input.fencing_token` (or the run number) (K-16).
pub(crate) fn stream_key(inst: &WorkflowInstance) -> StreamKey {
    let BusinessRound { object_id, fencing_token } = inst.round();
    let object_id = object_id.unwrap_or_else(|| inst.biz_key.as_str().into());
    let fencing_token = fencing_token.unwrap_or_else(|| format!("run-{}", inst.retry_count).into());
    StreamKey { object_id, workflow_id: inst.workflow_id.clone(), fencing_token }
}
