//! The one activity entry point's types: [`Activity`], [`ActivityContext`], [`StepOutcome`],
//! [`ActivityError`].

use crate::domain::{DurationMs, ErrorClass, Instant, Resume, StepError};
use crate::id::BusinessRound;
use crate::ports::{SignalSender, StreamHandle};
use serde_json::Value;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Business code of one step (or finalizer). Runs at least once (K-3.5): make its side
/// effects idempotent, e.g. with [`ActivityContext::idempotency_key`].
#[async_trait::async_trait]
pub trait Activity: Send + Sync + 'static {
    /// Run one invocation.
    async fn run(&self, ctx: ActivityContext) -> Result<StepOutcome, ActivityError>;

    /// Who may supply the outcome of a step running this activity (K-17.2 amendment):
    /// [`StepDef::new`](crate::StepDef::new) takes it as the step's. An activity whose
    /// result carries authority (a human task's decision) returns
    /// [`OutcomeAuthority::ActivityOnly`](crate::OutcomeAuthority::ActivityOnly), so no
    /// operator can complete its step with an output of their own.
    fn outcome_authority(&self) -> crate::OutcomeAuthority {
        crate::OutcomeAuthority::ActivityOrOperator
    }
}

#[async_trait::async_trait]
impl<F, Fut> Activity for F
where
    F: Fn(ActivityContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<StepOutcome, ActivityError>> + Send + 'static,
{
    async fn run(&self, ctx: ActivityContext) -> Result<StepOutcome, ActivityError> {
        (self)(ctx).await
    }
}

/// An activity failure with its class (K-7, K-17.2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{class:?}: {message}")]
pub struct ActivityError {
    /// Classification.
    pub class: ErrorClass,
    /// Message (truncated by the engine before it is stored).
    pub message: String,
}

impl ActivityError {
    /// Timeout, rate limit, unavailable: retried with backoff.
    pub fn transient(m: impl Into<String>) -> Self {
        ActivityError { class: ErrorClass::Transient, message: m.into() }
    }
    /// Never retried.
    pub fn permanent(m: impl Into<String>) -> Self {
        ActivityError { class: ErrorClass::Permanent, message: m.into() }
    }
    /// The call may have happened: retried, and the next attempt must query first.
    pub fn unknown_outcome(m: impl Into<String>) -> Self {
        ActivityError { class: ErrorClass::UnknownOutcome, message: m.into() }
    }
    /// The step cannot run on this worker as it is (a recorded output of a schema version
    /// this worker cannot migrate, K-17.4): the claim is handed back after the push-back
    /// delay, as on a fingerprint mismatch (K-4.3), without counting against the retries.
    pub fn parked(m: impl Into<String>) -> Self {
        ActivityError { class: ErrorClass::Parked, message: m.into() }
    }
    /// The business object no longer wants this work: the workflow is canceled.
    pub fn canceled(m: impl Into<String>) -> Self {
        ActivityError { class: ErrorClass::Canceled, message: m.into() }
    }
}

/// A signal wait requested by an activity (K-9).
#[derive(Debug, Clone, PartialEq)]
pub struct SignalWaitSpec {
    /// Signal type.
    pub signal_type: String,
    /// Which business object.
    pub wait_key: String,
    /// Round of waiting (K-9.6).
    pub generation: u64,
    /// Poll fallback delay (K-9.5).
    pub poll_after_ms: Option<DurationMs>,
    /// Checkpoint saved with the wait.
    pub checkpoint: Option<Value>,
}

impl SignalWaitSpec {
    /// Generation of this wait.
    pub fn generation(mut self, g: u64) -> Self {
        self.generation = g;
        self
    }
    /// Also resume after `ms` even without a signal.
    pub fn poll_after_ms(mut self, ms: impl Into<DurationMs>) -> Self {
        self.poll_after_ms = Some(ms.into());
        self
    }
    /// Save a checkpoint with the wait.
    pub fn checkpoint(mut self, v: Value) -> Self {
        self.checkpoint = Some(v);
        self
    }
}

/// What an invocation asks the engine to do next (K-7.4).
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutcome {
    /// Done: commit the output with the step (`CompleteStep`).
    Complete(Value),
    /// Durable sleep: release the worker until `now + delay_ms` (`SuspendClaim`).
    Sleep {
        /// Delay from now.
        delay_ms: DurationMs,
        /// Saved for the next entry.
        checkpoint: Option<Value>,
    },
    /// Wait for a signal (`SuspendClaim`).
    WaitForSignal(SignalWaitSpec),
    /// Hand the worker back and run again soon, from the checkpoint.
    Yield {
        /// Saved for the next entry.
        checkpoint: Option<Value>,
    },
}

impl StepOutcome {
    /// `Complete(output)`.
    pub fn complete(output: Value) -> Self {
        StepOutcome::Complete(output)
    }
    /// `Sleep` with a checkpoint. A delay that is not positive, or whose due time
    /// `now + delay_ms` is past the range of time, makes the step fail permanently (K-7).
    pub fn sleep(delay_ms: impl Into<DurationMs>, checkpoint: Value) -> Self {
        StepOutcome::Sleep { delay_ms: delay_ms.into(), checkpoint: Some(checkpoint) }
    }
    /// `Yield` with a checkpoint.
    pub fn yield_with(checkpoint: Value) -> Self {
        StepOutcome::Yield { checkpoint: Some(checkpoint) }
    }
    /// Start a signal wait (returns a builder convertible with `.into()`).
    pub fn wait_for_signal(signal_type: impl Into<String>, wait_key: impl Into<String>) -> SignalWaitSpec {
        SignalWaitSpec {
            signal_type: signal_type.into(),
            wait_key: wait_key.into(),
            generation: 0,
            poll_after_ms: None,
            checkpoint: None,
        }
    }
}

impl From<SignalWaitSpec> for StepOutcome {
    fn from(s: SignalWaitSpec) -> Self {
        StepOutcome::WaitForSignal(s)
    }
}

/// Everything an invocation may know. Cheap to clone.
#[derive(Clone)]
pub struct ActivityContext {
    pub(crate) workflow_id: Arc<str>,
    pub(crate) workflow_type: Arc<str>,
    pub(crate) biz_key: Arc<str>,
    pub(crate) step_name: Arc<str>,
    pub(crate) step_index: usize,
    pub(crate) input: Arc<Value>,
    pub(crate) round: Arc<BusinessRound>,
    pub(crate) outputs: Arc<BTreeMap<String, Value>>,
    pub(crate) prepared: Arc<Value>,
    pub(crate) attempt: u32,
    pub(crate) workflow_run: u32,
    pub(crate) checkpoint: Option<Value>,
    pub(crate) resume: Option<Resume>,
    pub(crate) previous_error: Option<StepError>,
    pub(crate) claim_token: Arc<str>,
    pub(crate) cancel: CancellationToken,
    pub(crate) signals: SignalSender,
    pub(crate) stream: Option<StreamHandle>,
    pub(crate) now: Instant,
    pub(crate) epoch: u32,
    pub(crate) journal: Option<Arc<crate::journal::StepJournal>>,
    /// An inverse run by the failure path's compensation (K-17.6): the key gets `|c`.
    pub(crate) compensating: bool,
    /// The creating request's W3C `traceparent`, as stored with the instance.
    pub(crate) trace_parent: Option<Arc<str>>,
}

impl std::fmt::Debug for ActivityContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActivityContext")
            .field("workflow_id", &self.workflow_id)
            .field("step", &self.step_name)
            .field("attempt", &self.attempt)
            .field("workflow_run", &self.workflow_run)
            .finish_non_exhaustive()
    }
}

/// K-17.1: `workflowId ∥ activityType ∥ logicalAttempt`, length-prefixed so that no two
/// distinct triples encode alike. The key of epoch 0 (see [`idempotency_key_at`]).
pub fn idempotency_key(workflow_id: &str, activity_type: &str, logical_attempt: u32) -> String {
    format!("{}:{}|{}:{}|{}", workflow_id.len(), workflow_id, activity_type.len(), activity_type, logical_attempt)
}

/// K-17.1 with per-step epochs: the logical attempt is `(workflow_run, epoch)`; epoch 0
/// encodes exactly as [`idempotency_key`] (every key minted before epochs existed is
/// unchanged), a later epoch appends `|e<epoch>` — no key of epoch 0 ends that way, since
/// its last field is the bare run number.
///
/// ```
/// use kernel_core::activity::{idempotency_key, idempotency_key_at};
/// assert_eq!(idempotency_key_at("wf-42", "transcribe", 3, 0), idempotency_key("wf-42", "transcribe", 3));
/// assert_eq!(idempotency_key_at("wf-42", "transcribe", 3, 2), "5:wf-42|10:transcribe|3|e2");
/// ```
pub fn idempotency_key_at(workflow_id: &str, activity_type: &str, run: u32, epoch: u32) -> String {
    let key = idempotency_key(workflow_id, activity_type, run);
    if epoch == 0 {
        key
    } else {
        format!("{key}|e{epoch}")
    }
}

/// The signal-wait generation of the logical attempt `(run, epoch)`: `run << 32 | epoch`
/// (see [`ActivityContext::logical_generation`]).
///
/// ```
/// assert_eq!(kernel_core::activity::logical_generation(2, 3), (2 << 32) | 3);
/// ```
pub fn logical_generation(run: u32, epoch: u32) -> u64 {
    (u64::from(run) << 32) | u64::from(epoch)
}

impl ActivityContext {
    /// Workflow id.
    pub fn workflow_id(&self) -> &str {
        &self.workflow_id
    }
    /// Workflow type.
    pub fn workflow_type(&self) -> &str {
        &self.workflow_type
    }
    /// Business key.
    pub fn biz_key(&self) -> &str {
        &self.biz_key
    }
    /// Step name (the activity type of K-17.1).
    pub fn step_name(&self) -> &str {
        &self.step_name
    }
    /// Step index.
    pub fn step_index(&self) -> usize {
        self.step_index
    }
    /// The instance input (exact snapshot).
    pub fn input(&self) -> &Value {
        &self.input
    }
    /// Outputs of completed steps, as of the start of this wave.
    pub fn outputs(&self) -> &BTreeMap<String, Value> {
        &self.outputs
    }
    /// Output of a completed step.
    pub fn output(&self, step: &str) -> Option<&Value> {
        self.outputs.get(step)
    }
    /// What PrepareContext rebuilt from the input at claim start (K-2.3).
    pub fn prepared(&self) -> &Value {
        &self.prepared
    }
    /// Physical attempt (real entries including this one).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
    /// Logical attempt = `workflow_run` (K-17.1).
    pub fn workflow_run(&self) -> u32 {
        self.workflow_run
    }
    /// Idempotency key for external side effects (K-17.1): stable across physical retries,
    /// suspensions and crashes of one logical attempt; new for a replayed round and for a
    /// new epoch of the step (regenerate, dead-letter retry).
    ///
    /// The inverse of a step run by the failure path's compensation (K-17.6) gets the
    /// step's key with `|c` appended — its own key, derived from the original's, so the
    /// downstream dedupes a repeated inverse without confusing it with the original.
    pub fn idempotency_key(&self) -> String {
        let key = idempotency_key_at(&self.workflow_id, &self.step_name, self.workflow_run, self.epoch);
        if self.compensating {
            format!("{key}|c")
        } else {
            key
        }
    }
    /// Whether this invocation is the inverse of the step, run by the failure path's
    /// compensation (K-17.6).
    pub fn is_compensation(&self) -> bool {
        self.compensating
    }
    /// The step's epoch (K-17.1): 0 until the step is re-run within the run (an operator's
    /// regenerate or dead-letter retry, a loop iteration).
    pub fn epoch(&self) -> u32 {
        self.epoch
    }
    /// A signal-wait generation of this logical attempt, `run << 32 | epoch`: a step that
    /// waits inside a loop (or may be regenerated) waits with it, so a signal meant for an
    /// earlier iteration never wakes a later one (K-9.6). The deliverer computes the same
    /// value with [`logical_generation`] from the run and epoch of the step it signals (the
    /// waiting instance's `wait.generation` holds it too).
    pub fn logical_generation(&self) -> u64 {
        logical_generation(self.workflow_run, self.epoch)
    }

    /// Call a model through the kernel (K-17.3, K-17.4, K-17.7). The call is recorded with
    /// the step — every sample, validated against the step's output schema and re-sampled
    /// up to the step's limit (default 2) — before this returns; a later invocation of the
    /// same logical attempt gets the recorded output back without calling the model. An
    /// output recorded under an older schema version is migrated by the schema's
    /// registered migration (recorded), or the step parks. Calls are matched to records by
    /// order and label: make them in the same order on every invocation, one at a time.
    ///
    /// Errors: the model's own (transient ones retry the step; recorded samples are not
    /// drawn again), a permanent error when no sample is valid within the limit, when the
    /// request differs from the recorded one, or when the record would exceed the payload
    /// limits; a transient error when the record could not be written (stop then).
    pub async fn model(
        &self,
        model: &dyn crate::model_call::Model,
        request: crate::model_call::ModelRequest,
    ) -> Result<Value, ActivityError> {
        match &self.journal {
            Some(j) => j.model(self, model, request).await,
            None => Err(ActivityError::permanent("model calls are recorded per step; a finalizer cannot make one")),
        }
    }

    /// Record a value that steers control (K-17.4a) — the time, a random draw, an external
    /// lookup — once: `f` runs on the first invocation of the logical attempt, and every
    /// later one gets the recorded value back. Matched by order and label like
    /// [`model`](Self::model).
    ///
    /// ```
    /// # use kernel_core::{ActivityContext, ActivityError, StepOutcome};
    /// async fn route(ctx: ActivityContext) -> Result<StepOutcome, ActivityError> {
    ///     // Never branch on ctx.now() directly: a re-run would see another time.
    ///     let now = ctx.record("now", || async { Ok(serde_json::json!(ctx.now().as_millis())) }).await?;
    ///     let lane = if now.as_i64().unwrap_or(0) % 2 == 0 { "even" } else { "odd" };
    ///     Ok(StepOutcome::complete(serde_json::json!({"lane": lane})))
    /// }
    /// # let _ = route;
    /// ```
    pub async fn record<F, Fut>(&self, label: &str, f: F) -> Result<Value, ActivityError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Value, ActivityError>>,
    {
        match &self.journal {
            Some(j) => j.value(label, f()).await,
            None => Err(ActivityError::permanent("values are recorded per step; a finalizer cannot record one")),
        }
    }
    /// The step's record as a loop of recorded calls reads it between calls (a bounded agent,
    /// the `kernel-agents` crate): the live clock, the record's size and room, the entries
    /// around the cursor, the step's output schema. `None` in a finalizer, which has no
    /// record.
    pub fn record_cursor(&self) -> Option<crate::journal::RecordCursor<'_>> {
        self.journal.as_deref().map(crate::journal::RecordCursor)
    }
    /// Checkpoint saved by the last suspend or yield of this step.
    pub fn checkpoint(&self) -> Option<&Value> {
        self.checkpoint.as_ref()
    }
    /// Why the step resumed, if it was waiting.
    pub fn resume(&self) -> Option<&Resume> {
        self.resume.as_ref()
    }
    /// The error of the previous attempt. When its class is
    /// [`ErrorClass::UnknownOutcome`], query the external system before acting again.
    pub fn previous_error(&self) -> Option<&StepError> {
        self.previous_error.as_ref()
    }
    /// Whether the previous attempt ended with an unknown outcome (K-17.2).
    pub fn must_query_before_retry(&self) -> bool {
        self.previous_error.as_ref().is_some_and(|e| e.class == ErrorClass::UnknownOutcome)
    }
    /// The business round of the input (`input.object_id`, `input.fencing_token`, K-12),
    /// typed for the outbox's fenced writes.
    pub fn round(&self) -> &BusinessRound {
        &self.round
    }
    /// Business fencing token from `input.fencing_token` (K-12), as a string.
    pub fn fencing_token(&self) -> Option<&str> {
        self.round.fencing_token.as_deref()
    }
    /// Suffix of the claim token, for logs.
    pub fn claim_token(&self) -> &str {
        &self.claim_token
    }
    /// The W3C `traceparent` of the request that created the workflow
    /// ([`StartRequest::trace_parent`](crate::StartRequest::trace_parent)), the same for
    /// every step, attempt and replay: the parent an activity's own span joins. `None` when
    /// the request carried none.
    pub fn trace_parent(&self) -> Option<&str> {
        self.trace_parent.as_deref()
    }
    /// Cancelled on timeout, claim loss and shutdown timeout; pass it to every I/O call.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }
    /// Deliver signals (fan-out, K-10).
    pub fn signals(&self) -> &SignalSender {
        &self.signals
    }
    /// The client stream of a streaming step.
    pub fn stream(&self) -> Option<&StreamHandle> {
        self.stream.as_ref()
    }
    /// Clock reading when the invocation started. Orchestration decisions must not depend
    /// on it unless it is recorded in an output or checkpoint (K-17.4a).
    pub fn now(&self) -> Instant {
        self.now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_key_is_unambiguous() {
        assert_eq!(idempotency_key("wf-42", "transcribe", 0), "5:wf-42|10:transcribe|0");
        assert_ne!(idempotency_key("a|1:b", "c", 0), idempotency_key("a", "b|1:c", 0));
    }

    #[test]
    fn epoch_keys_keep_epoch_zero_and_never_collide() {
        // K-17.1 amendment: golden values of both encodings.
        assert_eq!(idempotency_key_at("wf-42", "transcribe", 0, 0), "5:wf-42|10:transcribe|0");
        assert_eq!(idempotency_key_at("wf-42", "transcribe", 1, 3), "5:wf-42|10:transcribe|1|e3");
        let mut seen = std::collections::BTreeSet::new();
        for run in 0..20 {
            for epoch in 0..20 {
                assert!(seen.insert(idempotency_key_at("wf", "s", run, epoch)), "({run}, {epoch}) collides");
            }
        }
    }
}
