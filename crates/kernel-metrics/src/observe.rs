//! [`MeteredObservations`]: step outcomes, retries and waits from the observations the
//! engine emits (K-15).

use crate::registry::{KindLabels, Metrics, OutcomeLabels};
use kernel_core::domain::{DurationMs, Instant};
use kernel_core::ports::{DynObservationSink, Observation, ObservationSink};
use kernel_core::transition::TransitionKind;
use kernel_core::WorkflowId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Most workflows [`MeteredObservations`] remembers as waiting for a worker at once; past
/// it, a new wait is not measured (the figures stay bounded, never the engine).
pub const QUEUE_WAITS_TRACKED_MAX: usize = 10_000;

/// Every `outcome` label value of `wfk_steps_total`.
pub(crate) const STEP_OUTCOMES: [&str; 9] =
    ["completed", "failed", "retry", "waiting", "yielded", "skipped", "deferred", "canceled", "dead_lettered"];

/// The `outcome` label of a step transition, `None` for the others (a fixed set).
fn step_outcome(kind: TransitionKind) -> Option<&'static str> {
    Some(match kind {
        TransitionKind::CompleteStep => "completed",
        TransitionKind::StepFailed => "failed",
        TransitionKind::RetryRelease => "retry",
        TransitionKind::SuspendClaim => "waiting",
        TransitionKind::Yield => "yielded",
        TransitionKind::SkipStep => "skipped",
        TransitionKind::PermitDeferral => "deferred",
        TransitionKind::Canceled => "canceled",
        TransitionKind::DeadLetter => "dead_lettered",
        _ => return None,
    })
}

/// Whether a transition leaves the workflow claimable at its own commit time, so the time
/// to its next claim is a wait for a worker (`kind="queue"`). Delayed releases (a retry's
/// backoff, a permit deferral) are not: their wait is the delay the engine chose.
fn claimable_at_commit(kind: TransitionKind) -> bool {
    matches!(
        kind,
        TransitionKind::Create
            | TransitionKind::Yield
            | TransitionKind::TimerActivation
            | TransitionKind::SignalActivation
            | TransitionKind::Replay
    )
}

fn seconds(ms: DurationMs) -> f64 {
    ms.as_millis().max(0) as f64 / 1000.0
}

/// An `ObservationSink` that forwards every observation to `inner` (while `inner` is
/// enabled, as the engine would) and records:
///
/// - `wfk_steps_total{outcome}`: one per step transition (`completed`, `failed`, `retry`,
///   `waiting`, `yielded`, `skipped`, `deferred`, `canceled`, `dead_lettered`);
/// - `wfk_retries_total`: retryable failures released for a retry;
/// - `wfk_step_duration_seconds`: the step's activity time when it finished (completed,
///   failed, skipped or canceled; `Observation::elapsed_ms`);
/// - `wfk_wait_duration_seconds{kind="permit"}`: the permit wait a step accumulated
///   (`Observation::traffic_wait_ms`) when it finished, if any;
/// - `wfk_wait_duration_seconds{kind="queue"}`: from a transition that left a workflow
///   claimable at once (create, yield, timer or signal activation, replay) to its next
///   claim observed here — in this process, for at most [`QUEUE_WAITS_TRACKED_MAX`]
///   workflows at a time.
///
/// It always answers `enabled() == true` (it records), so the engine builds observations
/// for it even when `inner` discards them. It never blocks: a contended memory of queue
/// waits skips the measurement.
pub struct MeteredObservations {
    inner: Arc<DynObservationSink>,
    metrics: Arc<Metrics>,
    claimable_since: Mutex<HashMap<WorkflowId, (Instant, u64)>>,
}

impl MeteredObservations {
    /// Wrap `inner`.
    pub fn new(inner: Arc<DynObservationSink>, metrics: Arc<Metrics>) -> Self {
        MeteredObservations { inner, metrics, claimable_since: Mutex::new(HashMap::new()) }
    }

    fn record(&self, obs: &Observation) {
        let m = &self.metrics;
        if let Some(outcome) = step_outcome(obs.kind) {
            m.steps.get_or_create(&OutcomeLabels { outcome }).inc();
        }
        let finished = matches!(
            obs.kind,
            TransitionKind::CompleteStep
                | TransitionKind::StepFailed
                | TransitionKind::SkipStep
                | TransitionKind::Canceled
        );
        if obs.kind == TransitionKind::RetryRelease {
            m.retries.inc();
        }
        if finished && obs.step_name.is_some() {
            m.step_duration_seconds.observe(seconds(obs.elapsed_ms));
            if obs.traffic_wait_ms > DurationMs::ZERO {
                m.wait_duration_seconds
                    .get_or_create(&KindLabels { kind: "permit" })
                    .observe(seconds(obs.traffic_wait_ms));
            }
        }
        let Ok(mut since) = self.claimable_since.try_lock() else {
            return;
        };
        if claimable_at_commit(obs.kind) {
            if since.len() < QUEUE_WAITS_TRACKED_MAX || since.contains_key(&obs.workflow_id) {
                since.insert(obs.workflow_id.clone(), (obs.at, obs.revision));
            }
        } else if let Some((from, revision)) = since.remove(&obs.workflow_id) {
            // Only the claim that directly follows the write that made the workflow
            // claimable measures a queue wait: a later claim (another process claimed and
            // released it in between, unseen here) would count hours of other states.
            if obs.kind == TransitionKind::Claim && obs.revision <= revision.saturating_add(1) {
                let waited = (obs.at - from).max(DurationMs::ZERO);
                m.wait_duration_seconds.get_or_create(&KindLabels { kind: "queue" }).observe(seconds(waited));
            }
        }
    }
}

impl ObservationSink for MeteredObservations {
    /// Always: this sink records every observation.
    fn enabled(&self) -> bool {
        true
    }

    fn emit(&self, obs: Observation) {
        self.record(&obs);
        if self.inner.enabled() {
            self.inner.emit(obs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_outcome_label_is_in_the_fixed_set() {
        let kinds = [
            TransitionKind::CompleteStep,
            TransitionKind::StepFailed,
            TransitionKind::RetryRelease,
            TransitionKind::SuspendClaim,
            TransitionKind::Yield,
            TransitionKind::SkipStep,
            TransitionKind::PermitDeferral,
            TransitionKind::Canceled,
            TransitionKind::DeadLetter,
        ];
        let labels: Vec<&str> = kinds.iter().filter_map(|k| step_outcome(*k)).collect();
        assert_eq!(labels, STEP_OUTCOMES);
        assert_eq!(step_outcome(TransitionKind::Claim), None);
        assert_eq!(step_outcome(TransitionKind::Completed), None, "a workflow's end is not a step outcome");
    }

    fn obs(kind: TransitionKind, at: i64, revision: u64) -> Observation {
        Observation {
            workflow_id: "wf-1".into(),
            biz_key: "b-1".into(),
            workflow_type: "t".into(),
            workflow_run: 0,
            revision,
            kind,
            status: kernel_core::WorkflowStatus::Running,
            step_name: None,
            attempt: 0,
            elapsed_ms: DurationMs::ZERO,
            traffic_wait_ms: DurationMs::ZERO,
            error_class: None,
            at: Instant::from_millis(at),
            worker_id: None,
            claim_token: None,
            wait_signal: None,
        }
    }

    fn queue_wait_sum(m: &Metrics) -> String {
        m.render()
            .lines()
            .find(|l| l.starts_with(r#"wfk_wait_duration_seconds_sum{kind="queue"}"#))
            .unwrap_or("")
            .to_string()
    }

    #[test]
    fn only_the_claim_right_after_the_claimable_write_measures_a_queue_wait() {
        // A yield at revision 5, then — other processes' writes unseen — a claim a day later
        // at revision 12: no day-long queue wait. A claim at revision 6 measures.
        let metrics = Arc::new(Metrics::new());
        let sink = MeteredObservations::new(Arc::new(kernel_core::ports::NoopObservationSink), metrics.clone());
        sink.emit(obs(TransitionKind::Yield, 0, 5));
        sink.emit(obs(TransitionKind::Claim, 86_400_000, 12));
        assert!(!queue_wait_sum(&metrics).contains("86400"), "{}", metrics.render());
        sink.emit(obs(TransitionKind::Yield, 100_000, 13));
        sink.emit(obs(TransitionKind::Claim, 100_250, 14));
        assert!(queue_wait_sum(&metrics).ends_with(" 0.25"), "{}", queue_wait_sum(&metrics));
        // The entry is gone once anything else is observed: nothing leaks toward the cap.
        sink.emit(obs(TransitionKind::Yield, 200_000, 15));
        sink.emit(obs(TransitionKind::MarkRunning, 200_010, 17));
        assert!(sink.claimable_since.lock().unwrap().is_empty());
    }
}
