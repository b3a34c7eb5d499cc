//! One claim, from the won `Claim` write to its end (K-6.5, K-7, K-8, K-4.5).
//!
//! This module only sequences: permit → mark running → the activity
//! ([`invoke`](super::invoke)) → what the result means and how a wave resolves
//! ([`outcome`](super::outcome), pure) → one guarded write. Finalizers and the terminal
//! side channels follow.

use super::effects::{self, Writer};
use super::heartbeat::{Heartbeats, Lease};
use super::invoke::{self, HeldPermit, Invocation, Renewal};
use super::outcome::{self, AfterWave, Entry, Halt, StepPolicy, StepResult};
use super::{signals, ClaimEnd, Inner, PrepareContext};
use crate::activity::{Activity, ActivityContext, ActivityError, StepOutcome};
use crate::compensation::{CompensationReport, InverseResult, InverseRun};
use crate::definition::Definition;
use crate::id::{ClaimToken, WorkflowId};
use crate::model::*;
use crate::ports::*;
use crate::transition::{Guard, Transition};
use crate::validate;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Which token guard a claim write uses.
#[derive(Clone, Copy)]
enum G {
    Running,
    Failing,
    Token,
}

/// Where one step of a wave stands once it returned.
enum Member {
    /// Its completion or skip is committed.
    Settled,
    /// It stops the claim; resolved with its siblings (K-4.5).
    Halted(Halt),
    /// A write of this step missed or was uncertain: the claim has ended.
    Lost(ClaimEnd),
    /// A write of this step was not taken (the store was unavailable, or refused a write
    /// that carries no value of the step): nothing was written and the claim still holds.
    /// The wave hands the claim back once, after every sibling returned (K-4.5).
    HandBack,
}

/// A guarded write that did not commit (K-6.4).
enum Unwritten {
    /// The claim has ended: the write missed (`ClaimLost`) or its outcome is uncertain.
    End(ClaimEnd),
    /// The store was unavailable: nothing was written and the claim still holds. The
    /// caller hands it back once no sibling step is running any more (K-4.5, K-7.3).
    Unavailable,
    /// The store refused what the write would store (`InvalidInput`): nothing was written
    /// and the claim still holds. The same write would be refused again, so the caller
    /// fails the step whose outcome it carried instead of ending the claim.
    Refused(crate::error::Error),
}

enum Next {
    /// Go on; with the step whose mark-running was fused into the last write, and its permit.
    Continue(Option<(usize, Option<HeldPermit>)>),
    End(ClaimEnd),
}

/// What the control pass decides (K-4 amendment).
enum Control {
    /// `sender`'s loop goes back to `target`.
    LoopBack { sender: usize, target: usize },
    /// Step `i` fails by its policy with this message (a loop at its maximum, a panicking
    /// predicate).
    Stop(usize, String),
    /// These conditional steps are not taken.
    Skip(Vec<usize>),
}

/// Why a step got no permit.
enum NoPermit {
    /// Denied, or the permit backend failed (fail closed): retry after this delay.
    Deferred(DurationMs),
    /// The derived resource name is invalid: the step can never take a permit.
    Refused(String),
}

/// Why a claim stops before any step runs, decided from the claimed document alone.
enum Refusal {
    /// K-4.3: the persisted fingerprint is not this worker's.
    FingerprintMismatch,
    /// K-2.3: PrepareContext refused the input.
    PrepareFailed(String),
}

/// The prepared context of a claim (K-2.3), computed once from the claimed document after
/// the fingerprint check (K-4.3), before anything runs.
fn prepare(inst: &WorkflowInstance, def: &Definition, hook: Option<&PrepareContext>) -> Result<Arc<Value>, Refusal> {
    if inst.definition_fingerprint != def.plan().fingerprint() {
        return Err(Refusal::FingerprintMismatch);
    }
    match hook {
        None => Ok(Arc::new(Value::Null)),
        // A panic is a failure of PrepareContext like any other (counted, bounded).
        Some(prepare) => match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| prepare(inst))) {
            Ok(r) => r.map(Arc::new).map_err(Refusal::PrepareFailed),
            Err(panic) => Err(Refusal::PrepareFailed(format!("PrepareContext panicked: {}", panic_message(&*panic)))),
        },
    }
}

/// Whether `step`'s completion in its current epoch was an operator's (a dead letter decided
/// "complete", K-17.2) — in whatever run: a replay keeps a completed step as it is (K-5).
fn completed_by_operator(step: &Step) -> bool {
    step.record.as_ref().filter(|r| r.epoch == step.epoch).is_some_and(|r| {
        r.entries.iter().any(|e| matches!(e, crate::record::RecordEntry::Operator(o) if o.action == "complete"))
    })
}

/// The message of a caught panic, when it is a string.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic.downcast_ref::<&str>().copied().or_else(|| panic.downcast_ref::<String>().map(String::as_str)).unwrap_or("")
}

/// The claim's copy of its document, kept in step with every committed write: each write
/// is applied to it exactly once ([`Claim::applied`]).
struct ClaimDoc {
    /// The document as last committed, without its input and outputs: the input never
    /// changes during a claim (`Shared::input`) and the outputs live in `outputs`.
    inst: WorkflowInstance,
    /// step name → output, shared with the contexts of the activities: a write that adds an
    /// output changes the map in place unless a running activity still holds it, which then
    /// keeps the outputs it started with.
    outputs: Arc<BTreeMap<String, Value>>,
}

/// What every activity context of a claim shares, built once per claim (the input and the
/// names never change while it lasts).
struct Shared {
    workflow_id: Arc<str>,
    workflow_type: Arc<str>,
    biz_key: Arc<str>,
    claim_token: Arc<str>,
    input: Arc<Value>,
    round: Arc<crate::id::BusinessRound>,
    signals: SignalSender,
    /// The client stream's key, for a definition with a streaming step (K-16).
    stream_key: Option<StreamKey>,
    /// The creating request's trace context, handed to every activity.
    trace_parent: Option<Arc<str>>,
}

struct Claim {
    /// This claim, for the record writers of its activities' contexts.
    me: std::sync::Weak<Claim>,
    inner: Arc<Inner>,
    def: Arc<Definition>,
    workflow_id: WorkflowId,
    /// The token this worker minted for the claim (K-6.2); every write is fenced by it.
    token: ClaimToken,
    doc: Mutex<ClaimDoc>,
    shared: Shared,
    /// The lease, the claim's cancellation and why it ended, shared with the engine's
    /// heartbeat driver (K-6.3, K-6.4).
    lease: Arc<Lease>,
    /// Cancelled on claim loss, uncertain writes and hard shutdown; parent of every
    /// activity's cancellation (the lease's).
    cancel: CancellationToken,
    /// What PrepareContext rebuilt from the input (null without a hook).
    prepared: Arc<Value>,
}

/// Run a claim won with `token` to its end. Activity panics become step errors; no write
/// is ever retried.
pub(crate) async fn run(inner: Arc<Inner>, mut inst: WorkflowInstance, token: ClaimToken) -> ClaimEnd {
    // Field names follow OpenTelemetry's conventions where they exist (`otel.name`,
    // `otel.kind`, read by tracing-opentelemetry); the rest are namespaced `workflow.*`.
    // The token is cut to its last characters: enough to tell claims apart in a log,
    // too little to write under it.
    let span = tracing::info_span!(
        "workflow.claim",
        otel.name = %format_args!("claim {}", inst.workflow_type),
        otel.kind = "consumer",
        worker = %inner.config.worker_id,
        workflow.id = %inst.workflow_id,
        "workflow.type" = %inst.workflow_type,
        workflow.claim = %token.suffix(),
        workflow.trace_parent = inst.trace_parent.as_deref(),
    );
    async move {
        let Some(def) = inner.defs.get(&inst.workflow_type).cloned() else {
            // The claim filter only matches registered types; leave the lease to expire.
            tracing::error!("claimed an unregistered type");
            return ClaimEnd::Uncertain;
        };
        tracing::info!(status = inst.status.as_str(), "claimed");
        if inner.ports.observer.enabled() {
            let writer = Writer { worker_id: Some(&inner.config.worker_id), claim_token: Some(&token) };
            match Transition::claim(&token, inst.updated_at.max(inner.ports.clock.now()), inner.config.lease_ms) {
                Ok(claim_t) => effects::observe(&*inner.ports.observer, &inst, &claim_t, inst.revision, writer),
                // The store accepted the claim, so only a stored time near the end of the
                // range gets here; the observation is skipped, the claim runs.
                Err(e) => tracing::warn!(error = %e, "claim not observed"),
            }
        }
        let (prepared, refusal) = match prepare(&inst, &def, inner.prepare.as_ref()) {
            Ok(p) => (p, None),
            Err(r) => (Arc::new(Value::Null), Some(r)),
        };
        let cancel = inner.killed.child_token();
        let lease = Arc::new(Lease::new(inst.workflow_id.clone(), token.clone(), inst.claimable_time, cancel.clone()));
        let claim = Arc::new_cyclic(|me| Claim {
            me: me.clone(),
            shared: Shared::of(&inner, &def, &mut inst, &token),
            cancel,
            inner: inner.clone(),
            def,
            workflow_id: inst.workflow_id.clone(),
            token,
            doc: Mutex::new(ClaimDoc { outputs: Arc::new(std::mem::take(&mut inst.output)), inst }),
            lease: lease.clone(),
            prepared,
        });
        let (heartbeats, started) = Heartbeats::register(&inner, lease, inner.ports.clock.now());
        let flavor = tokio::runtime::Handle::current().runtime_flavor();
        if started && flavor != tokio::runtime::RuntimeFlavor::CurrentThread {
            // Let the new driver task run once (it only arms its timer): a task spawned here
            // waits in this worker's own slot, which no other worker takes from, so an
            // activity of this claim that blocked the thread would hold it back (K-6.3).
            tokio::task::yield_now().await;
        }
        let end = claim.drive(refusal).await;
        heartbeats.end().await;
        if matches!(end, ClaimEnd::Uncertain | ClaimEnd::ClaimLost) {
            // Claimable again when the lease ends (K-6.4): put it in its lane for then, best
            // effort (K-13: the lanes are only a hint).
            if let Some(lease_until) = claim.lease.until() {
                claim.enqueue(claim.priority(), lease_until).await;
            }
        }
        tracing::info!(end = ?end, "claim ended");
        end
    }
    .instrument(span)
    .await
}

/// The retry of a step whose last attempt ended with an unknown outcome (K-17.2): the
/// query hook first; the activity only when the operation did not take effect.
struct QueryFirst {
    query: Arc<dyn crate::definition::OutcomeQuery>,
    activity: Arc<dyn Activity>,
}

#[async_trait::async_trait]
impl Activity for QueryFirst {
    async fn run(&self, ctx: ActivityContext) -> Result<StepOutcome, ActivityError> {
        match self.query.query(&ctx).await? {
            crate::definition::QueryAnswer::Done(output) => Ok(StepOutcome::Complete(output)),
            crate::definition::QueryAnswer::NotDone => self.activity.run(ctx).await,
            crate::definition::QueryAnswer::StillUnknown => {
                Err(ActivityError::unknown_outcome("the query could not tell whether the operation took effect"))
            }
        }
    }
}

/// Writes a step's record under its claim (K-6.4: `status = running AND claim_token`).
struct ClaimRecorder {
    claim: std::sync::Weak<Claim>,
    index: usize,
}

#[async_trait::async_trait]
impl crate::journal::RecordWriter for ClaimRecorder {
    async fn write(
        &self,
        record: crate::record::StepRecord,
        history: Option<Vec<crate::record::HistoryEntry>>,
    ) -> Result<(), ActivityError> {
        let Some(claim) = self.claim.upgrade() else {
            return Err(ActivityError::transient("the claim has ended; nothing recorded"));
        };
        let t = Transition::record_step(self.index, record, history, claim.now());
        match claim.commit(G::Running, t).await {
            Ok(()) => Ok(()),
            Err(Unwritten::Refused(e)) => {
                Err(ActivityError::permanent(format!("the store refused the step's record: {e}")))
            }
            Err(Unwritten::Unavailable) => Err(ActivityError::transient("store unavailable; nothing recorded")),
            Err(Unwritten::End(end)) => Err(ActivityError::transient(format!("claim ended ({end:?}); stop"))),
        }
    }
}

impl Shared {
    /// What the claim's contexts share, taken from the claimed document: its input moves
    /// here (it never changes during a claim).
    fn of(inner: &Arc<Inner>, def: &Definition, inst: &mut WorkflowInstance, token: &ClaimToken) -> Shared {
        let stream_key = def.steps().iter().any(|s| s.is_streaming()).then(|| effects::stream_key(inst));
        let round = Arc::new(inst.round());
        Shared {
            workflow_id: inst.workflow_id.as_str().into(),
            workflow_type: inst.workflow_type.as_str().into(),
            biz_key: inst.biz_key.as_str().into(),
            claim_token: token.as_str().into(),
            input: Arc::new(std::mem::take(&mut inst.input)),
            round,
            signals: signals::sender(inner),
            stream_key,
            trace_parent: inst.trace_parent.as_deref().map(Arc::from),
        }
    }
}

impl Claim {
    /// How a cancelled claim ended: the recorded reason, else uncertain (a hard shutdown:
    /// the lease is left to expire, K-6.6).
    fn ended_as(&self) -> ClaimEnd {
        self.lease.ended_as()
    }

    fn now(&self) -> Instant {
        self.inner.ports.clock.now()
    }

    fn doc(&self) -> std::sync::MutexGuard<'_, ClaimDoc> {
        self.doc.lock().expect("doc lock")
    }

    /// The instance's ready lane, as last committed.
    fn priority(&self) -> Priority {
        self.doc().inst.business_priority
    }

    fn guard(&self, g: G) -> Guard {
        let token = self.token.clone();
        match g {
            G::Running => Guard::Running { token },
            G::Failing => Guard::Failing { token },
            G::Token => Guard::Token { token },
        }
    }

    async fn enqueue(&self, priority: Priority, at: Instant) {
        let ports = &self.inner.ports;
        effects::enqueue_and_wake(&*ports.queue, &*ports.wakeup, &self.workflow_id, priority, at).await;
    }

    /// A transition refused before any write (a time past the representable range): end
    /// the claim without writing; the lease runs out and the instance is claimed again.
    fn refused(&self, e: crate::error::Error) -> ClaimEnd {
        tracing::error!(error = %e, "transition refused; ending the claim");
        self.cancel.cancel();
        ClaimEnd::Uncertain
    }

    /// One guarded write, by what the store answered (K-6.4): a miss is claim loss and an
    /// uncertain outcome ends the claim, both cancelling its activities and neither retried;
    /// `Unavailable` certainly had no effect: nothing is written here, the caller hands the
    /// claim back with a delay once no sibling runs ([`Unwritten::Unavailable`]);
    /// `InvalidInput` is a refusal of the content ([`Unwritten::Refused`]), which the caller
    /// turns into a failure of the step the write carried.
    async fn commit(&self, g: G, t: Transition) -> Result<(), Unwritten> {
        match self.inner.ports.store.apply(&self.workflow_id, &self.guard(g), &t).await {
            Ok(WriteOutcome::Applied { revision }) => {
                self.applied(&t, revision);
                Ok(())
            }
            Ok(WriteOutcome::Missed) => {
                tracing::warn!(kinds = ?t.kinds().collect::<Vec<_>>(), "write missed: claim lost");
                self.cancel.cancel();
                Err(Unwritten::End(ClaimEnd::ClaimLost))
            }
            Err(e @ crate::error::Error::InvalidInput { .. }) => {
                tracing::error!(kinds = ?t.kinds().collect::<Vec<_>>(), error = %e, "write refused by the store");
                Err(Unwritten::Refused(e))
            }
            Err(e @ crate::error::Error::Unavailable { .. }) => {
                tracing::warn!(kinds = ?t.kinds().collect::<Vec<_>>(), error = %e, "store unavailable: nothing written");
                Err(Unwritten::Unavailable)
            }
            Err(e) => {
                tracing::warn!(kinds = ?t.kinds().collect::<Vec<_>>(), error = %e, "write outcome uncertain: ending the claim");
                self.cancel.cancel();
                Err(Unwritten::End(ClaimEnd::Uncertain))
            }
        }
    }

    /// Keep the local copy and the observation in step with a committed write: the write
    /// is applied to the copy once, and observed from it under the lock (no copy is made;
    /// nothing is built when the sink is disabled).
    fn applied(&self, t: &Transition, revision: u64) {
        debug_assert!(t.input.is_none(), "no write of a claim changes the input");
        let mut d = self.doc();
        let ClaimDoc { inst, outputs } = &mut *d;
        t.apply_to(inst);
        inst.revision = revision;
        if !inst.output.is_empty() {
            // In place unless a running activity still holds the map (it keeps its own).
            Arc::make_mut(outputs).append(&mut inst.output);
        }
        if !t.outputs_unset.is_empty() {
            let map = Arc::make_mut(outputs);
            for name in &t.outputs_unset {
                map.remove(name);
            }
        }
        let writer = Writer { worker_id: Some(&self.inner.config.worker_id), claim_token: Some(&self.token) };
        effects::observe(&*self.inner.ports.observer, inst, t, revision, writer);
    }

    /// After a write the store could not take (nothing written): stop this claim's
    /// activities and release the instance until `now + permit_retry_ms`, one attempt; if
    /// the release cannot be written either, the lease is left to expire.
    async fn hand_back(&self, g: G) -> ClaimEnd {
        self.cancel.cancel();
        let now = self.now();
        let delay = self.inner.config.permit_retry_ms;
        let Ok(t) = Transition::release_after(now, delay) else { return ClaimEnd::Uncertain };
        match self.inner.ports.store.apply(&self.workflow_id, &self.guard(g), &t).await {
            Ok(WriteOutcome::Applied { revision }) => {
                self.applied(&t, revision);
                self.enqueue(self.priority(), now.saturating_add(delay)).await;
                ClaimEnd::Released
            }
            Ok(WriteOutcome::Missed) => ClaimEnd::ClaimLost,
            Err(e) => {
                tracing::warn!(error = %e, "hand-back not written; the lease is left to expire");
                ClaimEnd::Uncertain
            }
        }
    }

    /// [`commit`](Self::commit) of a write that carries no step outcome (mark running,
    /// release, failing, completed, failed, push-back). The kernel puts no caller value in
    /// them, so a refusal is a store that cannot take the document as it is: the claim is
    /// handed back with a delay, without re-running anything.
    async fn commit_plain(&self, g: G, t: Transition) -> Result<(), ClaimEnd> {
        match self.commit(g, t).await {
            Ok(()) => Ok(()),
            Err(Unwritten::End(end)) => Err(end),
            Err(Unwritten::Unavailable | Unwritten::Refused(_)) => Err(self.hand_back(g).await),
        }
    }

    /// The error stored on a step whose outcome the store refused: permanent, with the
    /// store's reason.
    fn refusal_error(&self, e: &crate::error::Error) -> StepError {
        let mut message = format!("the store refused the step's outcome: {e}");
        let max = self.inner.config.error_message_bytes_max;
        if message.len() > max {
            let mut cut = max;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        StepError { class: ErrorClass::Permanent, message }
    }

    /// The wave's write, carrying a value of step `idx`, was refused: fail the step for
    /// good with a write that carries less and less of it, so a document at its size limit
    /// still ends (K-7.4) instead of re-running the step after every hand-back:
    /// the store's reason (unless the refused write was already a failure), then a short
    /// fixed message, then `failing` alone, which carries nothing from the step.
    async fn fail_refused(&self, idx: usize, e: &crate::error::Error, failing: bool) -> ClaimEnd {
        let short = StepError { class: ErrorClass::Permanent, message: "refused by the store".into() };
        let errors = if failing { vec![short] } else { vec![self.refusal_error(e), short] };
        for error in errors {
            match self.commit(G::Running, Transition::step_failed(idx, error, DurationMs::ZERO, self.now())).await {
                Ok(()) => return self.fail_path().await,
                Err(Unwritten::Refused(e)) => tracing::warn!(error = %e, "the step's failure was refused as well"),
                Err(Unwritten::End(end)) => return end,
                Err(Unwritten::Unavailable) => return self.hand_back(G::Running).await,
            }
        }
        match self.commit_plain(G::Running, Transition::failing(self.now())).await {
            Ok(()) => self.fail_path().await,
            Err(end) => end,
        }
    }

    /// A completion of step `idx` the store refused: the step failed for good, resolved with
    /// its wave like any failure (K-4.5, K-7.4 row 4), so the workflow goes `failing` and
    /// through its failure finalizer to `failed`.
    fn refused_completion(&self, e: &crate::error::Error, elapsed_ms: DurationMs) -> Member {
        Member::Halted(Halt::Failed { error: self.refusal_error(e), elapsed_ms })
    }

    async fn drive(&self, refusal: Option<Refusal>) -> ClaimEnd {
        let (status, resuming_signal, prepare_failures) = {
            let d = self.doc();
            let resuming_signal = match &d.inst.resume {
                Some(Resume { kind: ResumeKind::Signal, signal_id: Some(id), .. }) => Some(id.clone()),
                _ => None,
            };
            (d.inst.status, resuming_signal, d.inst.prepare_failures)
        };
        let plan = self.def.plan();
        let status_guard = if status == WorkflowStatus::Failing { G::Failing } else { G::Running };
        match refusal {
            // K-4.3: a fingerprint mismatch is not a failure; push back, touch no step.
            Some(Refusal::FingerprintMismatch) => {
                let persisted = self.doc().inst.definition_fingerprint.clone();
                tracing::warn!(persisted = %persisted, worker = %plan.fingerprint(), "definition fingerprint mismatch; pushing back");
                let t = match Transition::fingerprint_push_back(
                    &persisted,
                    plan.fingerprint(),
                    self.now(),
                    self.inner.config.fingerprint_pushback_ms,
                ) {
                    Ok(t) => t,
                    Err(e) => return self.refused(e),
                };
                let at = match t.claimable_time {
                    Some(crate::transition::Patch::Set(at)) => Some(at),
                    _ => None,
                };
                return match self.commit_plain(G::Token, t).await {
                    Ok(()) => {
                        if let Some(at) = at {
                            self.enqueue(self.priority(), at).await;
                        }
                        ClaimEnd::PushedBack
                    }
                    Err(e) => e,
                };
            }
            Some(Refusal::PrepareFailed(msg)) => {
                return self.prepare_failed(status, prepare_failures, status_guard, msg).await
            }
            None => {}
        }
        // K-9.4: finish a half-done signal match before any step runs, so the record can
        // never wake the next identical wait.
        if let Some(id) = &resuming_signal {
            if let Err(e) = self.inner.ports.inbox.mark_matched(id, self.now()).await {
                tracing::warn!(error = %e, "could not mark the resuming signal matched; releasing");
                return self.release_after(status_guard, self.inner.config.permit_retry_ms).await;
            }
        }
        if status == WorkflowStatus::Failing {
            return self.fail_path().await;
        }
        // K-17.2: dead-lettered steps that woke (operator signal, poll, or beside another
        // one) are marked by their own state — pending with a permanent error under a
        // dead-letter policy, which nothing else leaves behind: their decisions first.
        let dead_lettered: Vec<usize> = {
            let d = self.doc();
            d.inst
                .steps
                .iter()
                .enumerate()
                .filter(|(i, s)| {
                    s.status == StepStatus::Pending
                        && s.error.as_ref().is_some_and(|e| e.class == ErrorClass::Permanent)
                        && self.dead_letters_step(*i)
                })
                .map(|(i, _)| i)
                .collect()
        };
        for i in dead_lettered {
            if let Some(end) = self.resume_dead_letter(i).await {
                return end;
            }
        }
        let mut started: Option<(usize, Option<HeldPermit>)> = None;
        loop {
            if self.cancel.is_cancelled() {
                // The claim has ended (K-6.4) or the engine was killed (K-6.6): write
                // nothing more, leave the lease to expire.
                if let Some((_, permit)) = started.take() {
                    self.release_permit(permit).await;
                }
                return self.ended_as();
            }
            if started.is_none() && self.inner.stopping.is_cancelled() {
                // Shutdown between waves: hand the instance back at once, and put it in
                // its lane so another worker claims it without waiting for a rebuild (K-13).
                let now = self.now();
                return match self.commit_plain(G::Running, Transition::release(now)).await {
                    Ok(()) => {
                        self.enqueue(self.priority(), now).await;
                        ClaimEnd::Released
                    }
                    Err(e) => e,
                };
            }
            let next = if let Some((idx, permit)) = started.take() {
                self.run_single(idx, Some(permit)).await
            } else if let Some(next) = self.control().await {
                // A loop-back, a branch skip or a loop past its maximum was written (K-4
                // amendment): read the plan again.
                next
            } else {
                let (ready, all_done, any_failed) = {
                    let d = self.doc();
                    let steps = &d.inst.steps;
                    (plan.ready(steps), plan.all_done(steps), steps.iter().any(|s| s.status == StepStatus::Failed))
                };
                if ready.is_empty() {
                    if all_done {
                        return self.success_path().await;
                    }
                    if any_failed {
                        if let Err(e) = self.commit_plain(G::Running, Transition::failing(self.now())).await {
                            return e;
                        }
                        return self.fail_path().await;
                    }
                    tracing::error!("running instance with nothing ready; releasing");
                    return self.release_after(G::Running, self.inner.config.finalizer_retry_ms).await;
                }
                if ready.len() == 1 {
                    self.run_single(ready[0], None).await
                } else {
                    self.run_wave(ready).await
                }
            };
            match next {
                Next::Continue(s) => started = s,
                Next::End(e) => return e,
            }
        }
    }

    /// A failed PrepareContext (K-2.3): counted on the instance; below
    /// `prepare_attempts_max` the claim is released with a growing delay, at the limit the
    /// workflow fails through `failing` and its failure finalizer (K-8). Steps never run
    /// without a context.
    async fn prepare_failed(&self, status: WorkflowStatus, prepare_failures: u32, g: G, msg: String) -> ClaimEnd {
        let config = &self.inner.config;
        let failures = prepare_failures.saturating_add(1);
        let now = self.now();
        if failures < config.prepare_attempts_max {
            let delay = config.prepare_retry_delay(failures);
            tracing::error!(error = %msg, failures, delay_ms = delay.as_millis(), "PrepareContext failed; releasing with a delay");
            let t = match Transition::prepare_release(failures, now, delay) {
                Ok(t) => t,
                Err(e) => return self.refused(e),
            };
            return match self.commit_plain(g, t).await {
                Ok(()) => {
                    self.enqueue(self.priority(), now.saturating_add(delay)).await;
                    ClaimEnd::Released
                }
                Err(e) => e,
            };
        }
        tracing::error!(error = %msg, failures, "PrepareContext failed too often; failing the workflow");
        if status != WorkflowStatus::Failing {
            let mut t = Transition::failing(now);
            t.prepare_failures = Some(failures);
            if let Err(e) = self.commit_plain(G::Running, t).await {
                return e;
            }
        }
        self.fail_path().await
    }

    async fn release_after(&self, g: G, delay: DurationMs) -> ClaimEnd {
        let now = self.now();
        let t = match Transition::finalizer_release(now, delay) {
            Ok(t) => t,
            Err(e) => return self.refused(e),
        };
        match self.commit_plain(g, t).await {
            Ok(()) => {
                self.enqueue(self.priority(), now.saturating_add(delay)).await;
                ClaimEnd::Released
            }
            Err(e) => e,
        }
    }

    /// Acquire the step's permit, failing closed on errors (K-14). The resource is the
    /// step's fixed name or the one derived from this workflow's input and prepared context.
    async fn acquire_permit(&self, idx: usize) -> Result<Option<HeldPermit>, NoPermit> {
        let sd = &self.def.steps()[idx];
        let input = &self.shared.input;
        let derived = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sd.resource_for(input, &self.prepared)));
        let resource = match derived {
            Ok(Some(resource)) => resource,
            Ok(None) => return Ok(None),
            Err(panic) => {
                let msg = panic_message(&*panic);
                tracing::error!(step = sd.name(), panic = msg, "resource function panicked");
                return Err(NoPermit::Refused(format!("the step's resource function panicked: {msg}")));
            }
        };
        if let Err(e) = validate::key_name("resource", &resource) {
            tracing::error!(step = sd.name(), error = %e, "derived resource name refused");
            return Err(NoPermit::Refused(format!("the step's derived resource is not a valid name: {e}")));
        }
        let resource = resource.as_str();
        let owner = PermitOwner {
            workflow_id: self.workflow_id.clone(),
            step: sd.name().to_string(),
            claim_token: self.token.clone(),
        };
        match self.inner.ports.permits.acquire(resource, &owner).await {
            Ok(PermitDecision::Granted { .. }) => Ok(Some(HeldPermit { resource: resource.to_string(), owner })),
            Ok(PermitDecision::Denied { retry_after_ms }) => {
                tracing::info!(step = sd.name(), resource, "permit denied; deferring");
                // At most `permit_retry_ms`: a full resource's hint is its soonest holder's
                // lease end, but a holder releases (with a wakeup, K-14) when its activity
                // returns, usually long before; a waiter deferred to the lease end would
                // starve behind later arrivals. A shorter hint (the start window) is kept.
                Err(NoPermit::Deferred(
                    retry_after_ms.min(self.inner.config.permit_retry_ms).max(DurationMs::from_millis(1)),
                ))
            }
            Err(e) => {
                tracing::warn!(step = sd.name(), resource, error = %e, "permit check failed; failing closed");
                Err(NoPermit::Deferred(self.inner.config.permit_retry_ms))
            }
        }
    }

    /// Give the permit back when the activity returned, whatever the outcome (K-14).
    async fn release_permit(&self, permit: Option<HeldPermit>) {
        if let Some(p) = permit {
            if let Err(e) = self.inner.ports.permits.release(&p.resource, &p.owner).await {
                tracing::debug!(error = %e, "permit release failed (its lease will expire)");
            }
            let _ = self.inner.ports.wakeup.notify().await;
        }
    }

    /// Reset the client stream before a streaming step re-executes (K-7.2, K-16); a failed
    /// reset never blocks the step.
    async fn maybe_reset_stream(&self, idx: usize) {
        if !self.def.steps()[idx].is_streaming() {
            return;
        }
        let reset = {
            let d = self.doc();
            let step = &d.inst.steps[idx];
            step.status == StepStatus::Running || step.error.is_some()
        };
        if let (true, Some(key)) = (reset, &self.shared.stream_key) {
            // Fenced by this claim's lease (K-16): a zombie's reset is refused by the sink
            // once a successor wrote, before its own mark-running write is refused.
            if let Err(e) = self.inner.ports.stream.reset(key, self.stream_owner()).await {
                tracing::debug!(error = %e, "stream reset failed");
            }
        }
    }

    /// This claim as a stream writer: its lease end as the store last accepted it.
    fn stream_owner(&self) -> StreamOwner {
        StreamOwner { lease_until: self.lease.until_or_min() }
    }

    /// Permit, mark running, invoke (K-7 steps 1–3). A step that did not reach its
    /// activity is a deferral, or the end of the claim.
    async fn enter_and_invoke(&self, idx: usize, premarked: Option<Option<HeldPermit>>) -> Result<Invocation, Member> {
        if self.cancel.is_cancelled() {
            // The claim has ended: no new activity starts (K-6.4).
            if let Some(permit) = premarked {
                self.release_permit(permit).await;
            }
            return Err(Member::Lost(self.ended_as()));
        }
        let permit = match premarked {
            Some(p) => p,
            None => {
                let permit = match self.acquire_permit(idx).await {
                    Ok(p) => p,
                    Err(NoPermit::Deferred(delay_ms)) => return Err(Member::Halted(Halt::Deferred { delay_ms })),
                    // Never entered: a permanent failure of the step, through the normal path.
                    Err(NoPermit::Refused(msg)) => {
                        return Ok(Invocation {
                            result: Err(ActivityError::permanent(msg)),
                            elapsed_ms: DurationMs::ZERO,
                        })
                    }
                };
                self.maybe_reset_stream(idx).await;
                if let Err(u) = self.commit(G::Running, Transition::mark_running(idx, self.now())).await {
                    self.release_permit(permit).await;
                    return Err(match u {
                        Unwritten::End(e) => Member::Lost(e),
                        Unwritten::Unavailable | Unwritten::Refused(_) => Member::HandBack,
                    });
                }
                permit
            }
        };
        if self.cancel.is_cancelled() {
            // The claim ended while the step was being marked running.
            self.release_permit(permit).await;
            return Err(Member::Lost(self.ended_as()));
        }
        // A process that slept past its lease must not start new side effects: another
        // worker may own the instance already (the write would be fenced, the call not).
        if self.now() >= self.lease.until_or_min() {
            tracing::warn!("lease expired before the activity started; stopping");
            self.cancel.cancel();
            self.release_permit(permit).await;
            return Err(Member::Lost(ClaimEnd::ClaimLost));
        }
        Ok(self.invoke_step(idx, permit).await)
    }

    /// The context of one invocation, built from the claim's copy under its lock: the
    /// names, input and outputs are shared, not copied.
    fn context(&self, idx: Option<usize>, name: &str, cancel: CancellationToken) -> ActivityContext {
        let sh = &self.shared;
        let stream = match (idx, &sh.stream_key) {
            (Some(i), Some(key)) if self.def.steps()[i].is_streaming() => {
                Some(StreamHandle::new(self.inner.ports.stream.clone(), key.clone(), self.stream_owner()))
            }
            _ => None,
        };
        let now = self.now();
        let d = self.doc();
        let step = idx.and_then(|i| d.inst.steps.get(i));
        ActivityContext {
            workflow_id: sh.workflow_id.clone(),
            workflow_type: sh.workflow_type.clone(),
            biz_key: sh.biz_key.clone(),
            step_name: name.into(),
            step_index: idx.unwrap_or(usize::MAX),
            input: sh.input.clone(),
            round: sh.round.clone(),
            outputs: d.outputs.clone(),
            prepared: self.prepared.clone(),
            attempt: step.map_or(1, |s| s.attempt),
            workflow_run: d.inst.retry_count,
            checkpoint: step.and_then(|s| s.checkpoint.clone()),
            resume: d.inst.resume.clone().filter(|r| Some(r.step_index as usize) == idx),
            previous_error: step.and_then(|s| s.error.clone()),
            claim_token: sh.claim_token.clone(),
            cancel,
            signals: sh.signals.clone(),
            stream,
            now,
            epoch: step.map_or(0, |s| s.epoch),
            journal: idx.zip(step).map(|(i, s)| self.journal(i, s, d.inst.retry_count, now)),
            compensating: false,
            trace_parent: sh.trace_parent.clone(),
        }
    }

    /// The journal of an invocation of step `idx` (K-17.3): its record for the current
    /// logical attempt, written back through this claim.
    fn journal(&self, idx: usize, step: &Step, run: u32, now: Instant) -> Arc<crate::journal::StepJournal> {
        let limits = self.inner.config.history_limits;
        Arc::new(crate::journal::StepJournal {
            writer: Arc::new(ClaimRecorder { claim: self.me.clone(), index: idx }),
            clock: self.inner.ports.clock.clone(),
            cache: self.inner.ports.result_cache.clone(),
            settings: self.def.steps()[idx].model.clone(),
            key: crate::activity::idempotency_key_at(&self.shared.workflow_id, &step.name, run, step.epoch),
            payload_bytes_max: self.inner.config.payload_bytes_max,
            state: tokio::sync::Mutex::new(crate::journal::JournalState::of(step, run, &limits, now)),
            poisoned: Default::default(),
        })
    }

    async fn invoke_step(&self, idx: usize, permit: Option<HeldPermit>) -> Invocation {
        let sd = &self.def.steps()[idx];
        let cancel = self.cancel.child_token();
        let ctx = self.context(Some(idx), sd.name(), cancel.clone());
        let span = tracing::info_span!(
            "workflow.step",
            otel.name = %format_args!("step {}", sd.name()),
            otel.kind = "internal",
            workflow.id = %self.workflow_id,
            "workflow.type" = %self.def.workflow_type(),
            workflow.step = sd.name(),
            workflow.attempt = ctx.attempt,
            workflow.claim = %self.token.suffix(),
        );
        let renewal = permit.as_ref().map(|permit| Renewal {
            permits: &*self.inner.ports.permits,
            permit,
            every_ms: self.inner.config.permit_renew_ms,
        });
        let clock = &self.inner.ports.clock;
        // K-17.2: after an unknown outcome, ask the external system before any retry.
        let activity: Arc<dyn Activity> = match &sd.query {
            Some(query) if ctx.must_query_before_retry() => {
                Arc::new(QueryFirst { query: query.clone(), activity: sd.activity().clone() })
            }
            _ => sd.activity().clone(),
        };
        let out = invoke::invoke(clock, activity, ctx, cancel, sd.get_timeout_ms(), renewal).instrument(span).await;
        self.release_permit(permit).await;
        out
    }

    /// What the invocation means for step `idx` (K-7.4), from the facts as they are now.
    fn classify(&self, idx: usize, inv: Invocation) -> StepResult {
        let (attempt, retrying_since) = {
            let d = self.doc();
            (d.inst.steps[idx].attempt, d.inst.steps[idx].retrying_since)
        };
        let entry = Entry {
            index: idx,
            attempt,
            elapsed_ms: inv.elapsed_ms,
            now: self.now(),
            policy: StepPolicy::from(&self.def.steps()[idx]),
            payload_bytes_max: self.inner.config.payload_bytes_max,
            error_message_bytes_max: self.inner.config.error_message_bytes_max,
            retrying_since,
            park_ms: self.inner.config.fingerprint_pushback_ms,
            dead_letter: self.dead_letters_step(idx).then(|| self.dead_letter_wait(idx)),
        };
        outcome::classify(inv.result, &entry, || self.inner.ports.ids.random_u64())
    }

    /// The `CompleteStep` write of a valid output.
    fn completion(&self, idx: usize, output: Value, elapsed_ms: DurationMs) -> Transition {
        let now = self.now();
        let mut t = {
            let d = self.doc();
            let clears = d.inst.resume.as_ref().is_some_and(|r| r.step_index as usize == idx);
            Transition::complete_step(idx, &d.inst.steps[idx].name, output, elapsed_ms, now, clears)
        };
        self.retry_clock(&mut t);
        t
    }

    async fn commit_skip(&self, idx: usize, error: StepError, elapsed_ms: DurationMs) -> Member {
        match self.commit(G::Running, Transition::skip_step(idx, error, elapsed_ms, self.now())).await {
            Ok(()) => Member::Settled,
            Err(Unwritten::End(e)) => Member::Lost(e),
            Err(Unwritten::Unavailable) => Member::HandBack,
            Err(Unwritten::Refused(e)) => self.refused_completion(&e, elapsed_ms),
        }
    }

    /// A lone ready step: the fusion path of K-7.1.
    async fn run_single(&self, idx: usize, premarked: Option<Option<HeldPermit>>) -> Next {
        let inv = match self.enter_and_invoke(idx, premarked).await {
            Ok(inv) => inv,
            Err(m) => return self.settle(vec![(idx, m)]).await,
        };
        if self.cancel.is_cancelled() && !matches!(inv.result, Ok(StepOutcome::Complete(_))) {
            // The claim ended during the activity; write nothing more.
            return Next::End(self.ended_as());
        }
        let (t, elapsed_ms, loops_back) = match self.classify(idx, inv) {
            StepResult::Complete { output, elapsed_ms } => {
                let loops_back = self.may_loop_back(idx, &output);
                (self.completion(idx, output, elapsed_ms), elapsed_ms, loops_back)
            }
            StepResult::Skipped { error, elapsed_ms } => {
                let m = self.commit_skip(idx, error, elapsed_ms).await;
                return self.settle(vec![(idx, m)]).await;
            }
            StepResult::Halt(h) => return self.settle(vec![(idx, Member::Halted(h))]).await,
        };
        if loops_back {
            // The completion alone: the loop-back is decided from the committed output by
            // the control pass (the same path as after a crash), never fused.
            return match self.commit(G::Running, t).await {
                Ok(()) => Next::Continue(None),
                Err(u) => self.completion_unwritten(idx, u, elapsed_ms).await,
            };
        }
        let (all_done, next, priority) = self.after_completion(idx);
        let now = self.now();
        // Last completion + completed when there is no success finalizer.
        if all_done && self.def.success_finalizer().is_none() {
            return match self.commit(G::Running, t.fuse(Transition::completed(now))).await {
                Ok(()) => {
                    self.on_terminal().await;
                    Next::End(ClaimEnd::Terminal(WorkflowStatus::Completed))
                }
                Err(u) => self.completion_unwritten(idx, u, elapsed_ms).await,
            };
        }
        // A conditional next step is decided by the control pass first (never fused).
        if next.len() == 1
            && self.def.steps()[next[0]].when.is_none()
            && !self.inner.stopping.is_cancelled()
            && !self.cancel.is_cancelled()
        {
            let j = next[0];
            // Permit before attempt++ (K-7.1): fuse completion with the next start only
            // when the permit is already granted under this token.
            match self.acquire_permit(j).await {
                Ok(permit) => {
                    self.maybe_reset_stream(j).await;
                    return match self.commit(G::Running, t.fuse(Transition::mark_running(j, now))).await {
                        Ok(()) => Next::Continue(Some((j, permit))),
                        Err(u) => {
                            self.release_permit(permit).await;
                            self.completion_unwritten(idx, u, elapsed_ms).await
                        }
                    };
                }
                // The next step fails on its own entry; complete this one alone.
                Err(NoPermit::Refused(_)) => {}
                Err(NoPermit::Deferred(delay)) => {
                    let t = t.fuse(Transition::permit_deferral(j, delay, now).release_until(now.saturating_add(delay)));
                    return match self.commit(G::Running, t).await {
                        Ok(()) => {
                            self.enqueue(priority, now.saturating_add(delay)).await;
                            Next::End(ClaimEnd::Released)
                        }
                        Err(u) => self.completion_unwritten(idx, u, elapsed_ms).await,
                    };
                }
            }
        }
        match self.commit(G::Running, t).await {
            Ok(()) => Next::Continue(None),
            Err(u) => self.completion_unwritten(idx, u, elapsed_ms).await,
        }
    }

    /// Whether completing step `idx` with `output` may send the workflow back (its loop's
    /// predicate holds, or panicked): such a completion is written alone.
    fn may_loop_back(&self, idx: usize, output: &Value) -> bool {
        let Some(l) = self.def.steps()[idx].loop_to.as_ref() else { return false };
        !matches!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (l.again)(output))), Ok(false))
    }

    /// What the control pass decides from the committed document `d` (K-4 amendment), or
    /// `None` when there is nothing to decide: the first completed loop sender (in step
    /// order) whose predicate holds on its recorded output — or panics — loops back or, at
    /// its maximum, stops; otherwise the fresh ready conditional steps whose predicate does
    /// not hold are skipped. The one decision both [`control`](Self::control) and the wave's
    /// [`loop_back_supersedes`](Self::loop_back_supersedes) act on.
    fn decide_control(&self, d: &ClaimDoc) -> Option<Control> {
        let plan = self.def.plan();
        if !plan.steps().iter().any(|p| p.loop_to.is_some() || p.reads.is_some()) {
            // A plain DAG: nothing to decide.
            return None;
        }
        for (i, sd) in self.def.steps().iter().enumerate() {
            let (Some(l), Some(target)) = (sd.loop_to.as_ref(), plan.steps()[i].loop_to) else { continue };
            let step = &d.inst.steps[i];
            if step.status != StepStatus::Completed || completed_by_operator(step) {
                // An operator's output for this logical attempt (a dead letter decided
                // "complete") leaves the loop: it is not asked again.
                continue;
            }
            let out = d.outputs.get(&step.name).unwrap_or(&Value::Null);
            return match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (l.again)(out))) {
                Ok(false) => continue,
                Ok(true) => {
                    let max = l.max_iterations.unwrap_or(0);
                    Some(if step.iterations >= max {
                        Control::Stop(
                            i,
                            format!(
                                "loop from {} to {} reached its maximum of {max} iterations",
                                sd.name(),
                                plan.steps()[target].name
                            ),
                        )
                    } else {
                        Control::LoopBack { sender: i, target }
                    })
                }
                Err(panic) => {
                    Some(Control::Stop(i, format!("the loop predicate panicked: {}", panic_message(&*panic))))
                }
            };
        }
        let mut skip = Vec::new();
        for i in plan.ready(&d.inst.steps) {
            let Some(b) = self.def.steps()[i].when.as_ref() else { continue };
            if d.inst.steps[i].status != StepStatus::Pending {
                // A running leftover was taken before it started.
                continue;
            }
            let inputs = crate::definition::BranchInputs { reads: &b.reads, outputs: &d.outputs };
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (b.holds)(&inputs))) {
                Ok(true) => {}
                Ok(false) => skip.push(i),
                Err(panic) => {
                    return Some(Control::Stop(i, format!("the branch predicate panicked: {}", panic_message(&*panic))))
                }
            }
        }
        (!skip.is_empty()).then_some(Control::Skip(skip))
    }

    /// The control pass (K-4 amendment), before the ready steps are read: the first
    /// completed loop sender whose predicate holds on its recorded output sends the
    /// workflow back (one write), or, at its maximum, fails by its policy; otherwise every
    /// fresh ready conditional step whose predicate does not hold is skipped (one write).
    /// Decided from the committed document alone, so a crash between a sender's completion
    /// and its loop-back decides the same way on the next claim. `None`: nothing to do.
    async fn control(&self) -> Option<Next> {
        // The loop-back write is built from the same reading of the document as the decision.
        let (decision, loop_back) = {
            let d = self.doc();
            let decision = self.decide_control(&d)?;
            let t = match &decision {
                Control::LoopBack { sender, target } => Some(self.loop_back(&d, *sender, *target)),
                _ => None,
            };
            (decision, t)
        };
        let t = match decision {
            Control::LoopBack { .. } => loop_back.expect("built with the decision"),
            Control::Skip(indices) => Transition::branch_skip(&indices, self.now()),
            Control::Stop(i, message) => {
                tracing::warn!(step = self.def.steps()[i].name(), %message, "control stop");
                let inv = Invocation { result: Err(ActivityError::permanent(message)), elapsed_ms: DurationMs::ZERO };
                return Some(match self.classify(i, inv) {
                    StepResult::Skipped { error, elapsed_ms } => {
                        // A skipped step has no output (K-4.4, `BranchInputs::output`): a
                        // sender skipped at its maximum loses the output it completed with.
                        let mut t = Transition::skip_step(i, error, elapsed_ms, self.now());
                        let name = self.def.steps()[i].name().to_string();
                        if self.doc().outputs.contains_key(&name) {
                            t.outputs_unset.push(name);
                        }
                        let m = match self.commit(G::Running, t).await {
                            Ok(()) => Member::Settled,
                            Err(Unwritten::End(e)) => Member::Lost(e),
                            Err(Unwritten::Unavailable) => Member::HandBack,
                            Err(Unwritten::Refused(e)) => self.refused_completion(&e, elapsed_ms),
                        };
                        self.settle(vec![(i, m)]).await
                    }
                    StepResult::Halt(h) => self.settle(vec![(i, Member::Halted(h))]).await,
                    StepResult::Complete { .. } => unreachable!("a permanent error never completes"),
                });
            }
        };
        let streams = t.kind() == crate::transition::TransitionKind::LoopBack
            && t.steps.iter().any(|p| self.def.steps()[p.index as usize].is_streaming());
        Some(match self.commit_plain(G::Running, t).await {
            Ok(()) => {
                if let (true, Some(key)) = (streams, &self.shared.stream_key) {
                    // A streaming step of the body runs again: its readers start over (K-16),
                    // best effort, fenced by this claim's lease.
                    if let Err(e) = self.inner.ports.stream.reset(key, self.stream_owner()).await {
                        tracing::debug!(error = %e, "stream reset after a loop-back failed");
                    }
                }
                Next::Continue(None)
            }
            Err(e) => Next::End(e),
        })
    }

    /// The loop-back write of sender `sender` to `target` (K-4 amendment, K-17.1). The
    /// loop's body is the target and every step that depends on it (transitively), except
    /// the steps after the sender (they run once the loop is left): each starts its next
    /// epoch, whether or not it ran in this iteration — so a step's epoch counts the
    /// iterations that covered it, whatever a crash interleaved — and each that ran keeps
    /// its attempt (output, error, record) in its history. The sender's iteration counter
    /// goes up by one, an enclosed loop's counter back to 0.
    fn loop_back(&self, d: &ClaimDoc, sender: usize, target: usize) -> Transition {
        let plan = self.def.plan();
        let body = plan.loop_body(sender).unwrap_or_else(|| {
            let mut only = vec![false; plan.steps().len()];
            only[target] = true;
            only
        });
        // A loop whose body lies strictly inside this one is entered again: its counter
        // starts over. No other counter is touched, so two loops never reset each other
        // and every loop stays bounded (by the product of the maximums around it).
        let enclosed = |j: usize| {
            plan.loop_body(j).is_some_and(|inner| inner != body && inner.iter().zip(&body).all(|(i, o)| !*i || *o))
        };
        let now = self.now();
        let run = d.inst.retry_count;
        let limits = self.inner.config.history_limits;
        let mut resets = Vec::new();
        let mut outputs_unset = Vec::new();
        for (j, s) in d.inst.steps.iter().enumerate().filter(|(j, _)| body[*j]) {
            let ran = s.status != StepStatus::Pending || s.attempt > 0 || s.record.is_some();
            let output = d.outputs.get(&s.name).cloned();
            if output.is_some() {
                outputs_unset.push(s.name.clone());
            }
            let history = if ran {
                let entry = crate::record::HistoryEntry {
                    run,
                    epoch: s.epoch,
                    reason: crate::record::HistoryReason::Loop,
                    output,
                    error: s.error.clone(),
                    record: s.record.clone(),
                    at: now,
                };
                limits.push(s.history.clone(), entry)
            } else {
                s.history.clone()
            };
            let iterations = if j == sender {
                Some(s.iterations.saturating_add(1))
            } else if s.iterations > 0 && enclosed(j) {
                Some(0)
            } else {
                None
            };
            resets.push((j, s.epoch.saturating_add(1), history, iterations));
        }
        let clear_resume =
            d.inst.resume.as_ref().is_some_and(|r| body.get(r.step_index as usize).copied().unwrap_or(false));
        Transition::loop_back(sender, resets, outputs_unset, clear_resume, now)
    }

    /// What the plan says once step `idx` completes, before its completion is written
    /// (whether every step is then done, and which steps are ready), with the instance's
    /// lane. A completion changes no other step, so this is read from the claim's copy with
    /// that one status changed for the reading, instead of from a copy of the instance.
    fn after_completion(&self, idx: usize) -> (bool, Vec<usize>, Priority) {
        let plan = self.def.plan();
        let mut d = self.doc();
        let steps = &mut d.inst.steps;
        let was = std::mem::replace(&mut steps[idx].status, StepStatus::Completed);
        let seen = (plan.all_done(steps), plan.ready(steps));
        steps[idx].status = was;
        (seen.0, seen.1, d.inst.business_priority)
    }

    /// A lone step's completion write (fused or not) that did not commit: a refusal fails
    /// the completing step; any other end stands.
    async fn completion_unwritten(&self, idx: usize, u: Unwritten, elapsed_ms: DurationMs) -> Next {
        match u {
            Unwritten::End(e) => Next::End(e),
            Unwritten::Unavailable => Next::End(self.hand_back(G::Running).await),
            Unwritten::Refused(e) => self.settle(vec![(idx, self.refused_completion(&e, elapsed_ms))]).await,
        }
    }

    /// A wave of parallel steps: each commits its own completion or skip (K-4.4); the rest
    /// is resolved after all siblings returned (K-4.5).
    async fn run_wave(&self, ready: Vec<usize>) -> Next {
        let futs = ready.iter().map(|&idx| async move {
            let inv = match self.enter_and_invoke(idx, None).await {
                Ok(inv) => inv,
                Err(m) => return (idx, m),
            };
            if self.cancel.is_cancelled() && !matches!(inv.result, Ok(StepOutcome::Complete(_))) {
                // The claim ended during the activity (as in `run_single`); write nothing.
                return (idx, Member::Lost(self.ended_as()));
            }
            let m = match self.classify(idx, inv) {
                StepResult::Complete { output, elapsed_ms } => {
                    match self.commit(G::Running, self.completion(idx, output, elapsed_ms)).await {
                        Ok(()) => Member::Settled,
                        Err(Unwritten::End(e)) => Member::Lost(e),
                        Err(Unwritten::Unavailable) => Member::HandBack,
                        Err(Unwritten::Refused(e)) => self.refused_completion(&e, elapsed_ms),
                    }
                }
                StepResult::Skipped { error, elapsed_ms } => self.commit_skip(idx, error, elapsed_ms).await,
                StepResult::Halt(h) => Member::Halted(h),
            };
            (idx, m)
        });
        let members = futures::future::join_all(futs).await;
        self.settle(members).await
    }

    /// End a wave: a lost member ends the claim; otherwise [`outcome::resolve_wave`] gives
    /// the one write (if any step halted) and what follows it.
    async fn settle(&self, members: Vec<(usize, Member)>) -> Next {
        let mut wave = Vec::with_capacity(members.len());
        // The step to fail if the store refuses the wave's write: the first whose outcome
        // carries a value of its own (an error, a checkpoint); a deferral carries none.
        let mut blame = None;
        let mut hand_back = false;
        for (idx, m) in members {
            if let Member::Halted(h) = &m {
                if !matches!(h, Halt::Deferred { .. }) {
                    blame.get_or_insert(idx);
                }
            }
            match m {
                Member::Settled => wave.push((idx, None)),
                Member::Halted(h) => wave.push((idx, Some(h))),
                Member::Lost(e) => return Next::End(e),
                Member::HandBack => hand_back = true,
            }
        }
        if hand_back {
            // Every sibling has returned: the one hand-back of the wave (K-4.5). What the
            // halted siblings would have written is lost with it; they run again.
            return Next::End(self.hand_back(G::Running).await);
        }
        if self.loop_back_supersedes(&wave) {
            // A sender of this wave completed and its loop goes back over every halted
            // sibling: their waits, yields, retries and deferrals belong to an iteration that
            // is over; the control pass takes the loop back now and they run again in the
            // next one, instead of holding the loop-back until they resume.
            return Next::Continue(None);
        }
        let dead_letters: Vec<(usize, StepError)> = wave
            .iter()
            .filter_map(|(i, h)| match h {
                Some(Halt::DeadLetter { error, .. }) => Some((*i, error.clone())),
                _ => None,
            })
            .collect();
        let Some(resolution) = outcome::resolve_wave(wave, self.now()) else {
            return Next::Continue(None);
        };
        let failing = matches!(resolution.then, AfterWave::Failing | AfterWave::Canceled);
        let mut transition = resolution.transition;
        self.retry_clock(&mut transition);
        match self.commit(G::Running, transition).await {
            Ok(()) => {}
            Err(Unwritten::End(e)) => return Next::End(e),
            Err(Unwritten::Unavailable) => return Next::End(self.hand_back(G::Running).await),
            Err(Unwritten::Refused(e)) => {
                let Some(idx) = blame else {
                    return Next::End(self.hand_back(G::Running).await);
                };
                return Next::End(self.fail_refused(idx, &e, failing).await);
            }
        }
        let prio = self.priority();
        Next::End(match resolution.then {
            AfterWave::Canceled => {
                self.on_terminal().await;
                ClaimEnd::Terminal(WorkflowStatus::Canceled)
            }
            AfterWave::Failing => self.fail_path().await,
            AfterWave::Released { at } => {
                self.enqueue(prio, at).await;
                ClaimEnd::Released
            }
            AfterWave::Suspended { wait } => {
                self.after_suspend(&wait).await;
                ClaimEnd::Suspended
            }
            AfterWave::Yielded { at } => {
                self.enqueue(prio, at).await;
                ClaimEnd::Yielded
            }
            AfterWave::DeadLettered { .. } => {
                for (i, error) in dead_letters {
                    self.record_dead_letter(i, error).await;
                }
                let wait = self.doc().inst.wait.clone();
                if let Some(wait) = wait {
                    // K-9.4: a decision whose doorbell rang before the wait was stored.
                    self.after_suspend(&wait).await;
                }
                ClaimEnd::Suspended
            }
        })
    }

    /// Whether the control pass's next decision is a loop-back whose body holds every
    /// halted member of `wave`, each halted only for now (a wait, a yield, a retry, a park,
    /// a deferral — never a failure, a cancellation or a dead letter, which stand).
    fn loop_back_supersedes(&self, wave: &[(usize, Option<Halt>)]) -> bool {
        let halted: Vec<usize> = wave.iter().filter(|(_, h)| h.is_some()).map(|(i, _)| *i).collect();
        if halted.is_empty()
            || wave
                .iter()
                .any(|(_, h)| matches!(h, Some(Halt::Failed { .. } | Halt::Canceled { .. } | Halt::DeadLetter { .. })))
        {
            return false;
        }
        // Exactly what the control pass will do next: only a loop-back whose body holds
        // every halted member supersedes them (a stop, a skip or another sender's loop
        // leaves their halts to stand).
        let decision = self.decide_control(&self.doc());
        match decision {
            Some(Control::LoopBack { sender, .. }) => self
                .def
                .plan()
                .loop_body(sender)
                .is_some_and(|body| halted.iter().all(|&h| body.get(h).copied().unwrap_or(false))),
            _ => false,
        }
    }

    /// The retry clock of `max_retry_duration` (K-17.2), kept on the steps a write
    /// concerns: a retry release starts it once per logical attempt; an invocation that
    /// succeeded (completed, suspended, yielded) stops it.
    fn retry_clock(&self, t: &mut Transition) {
        use crate::transition::Patch;
        let d = self.doc();
        let now = self.now();
        for p in t.steps.iter_mut() {
            let Some(step) = d.inst.steps.get(p.index as usize) else { continue };
            let retry = p.status == Some(StepStatus::Pending)
                && matches!(&p.error, Some(Patch::Set(e)) if matches!(e.class, ErrorClass::Transient | ErrorClass::UnknownOutcome));
            let succeeded = p.traffic_waits_inc == 0
                && p.error.is_none()
                && matches!(p.status, Some(StepStatus::Completed | StepStatus::Waiting | StepStatus::Pending));
            if retry && step.retrying_since.is_none() {
                p.retrying_since = Some(Patch::Set(now));
            } else if succeeded && step.retrying_since.is_some() && p.retrying_since.is_none() {
                p.retrying_since = Some(Patch::Unset);
            }
        }
    }

    /// Whether step `idx` can be dead-lettered: its policy says so, or it asks a query hook
    /// after unknown outcomes and the engine keeps dead letters (K-17.2).
    fn dead_letters_step(&self, idx: usize) -> bool {
        self.def.steps().get(idx).is_some_and(|sd| {
            sd.get_on_failed() == crate::definition::OnFailed::DeadLetter
                || (sd.query.is_some() && self.inner.ports.dead_letters.is_some())
        })
    }

    /// The operator signal wait of step `idx`'s current logical attempt (K-17.2), with
    /// its poll fallback (K-9.5).
    fn dead_letter_wait(&self, idx: usize) -> Wait {
        let d = self.doc();
        let step = &d.inst.steps[idx];
        Wait::Signal {
            signal_type: super::operator::DEAD_LETTER_SIGNAL.to_string(),
            wait_key: step.name.clone(),
            generation: super::operator::dead_letter_generation(d.inst.retry_count, step.epoch),
            step_index: idx as u32,
            poll_time: Some(self.now().saturating_add(self.inner.config.dead_letter_poll_ms)),
        }
    }

    /// The dead-letter record of step `idx` (K-17.2), written after the instance's wait:
    /// best effort — a record lost here is written by the poll fallback's visit.
    async fn record_dead_letter(&self, idx: usize, error: StepError) {
        let Some(dls) = self.inner.ports.dead_letters.clone() else {
            tracing::error!("a step was dead-lettered on an engine without a DeadLetters port");
            return;
        };
        let dl = {
            let d = self.doc();
            super::operator::dead_letter_of(&d.inst, idx, &self.shared.input, error, self.now())
        };
        match dls.record(&dl).await {
            Ok(_) => tracing::warn!(dead_letter = %dl.id, step = %dl.step, "step dead-lettered"),
            Err(e) => tracing::warn!(error = %e, "dead letter not recorded; the poll fallback records it"),
        }
    }

    /// A step resumed from a dead-letter wait (K-17.2): apply the operator's decision, or
    /// wait again. `None`: the claim goes on (the step is pending in its next epoch, or
    /// completed with the operator's output).
    async fn resume_dead_letter(&self, idx: usize) -> Option<ClaimEnd> {
        use crate::ports::{DeadLetterAction, DeadLetterStatus};
        let Some(dls) = self.inner.ports.dead_letters.clone() else {
            tracing::error!("a dead-lettered step resumed on an engine without a DeadLetters port; releasing");
            return Some(self.release_after(G::Running, self.inner.config.fingerprint_pushback_ms).await);
        };
        let (id, error) = {
            let d = self.doc();
            let step = &d.inst.steps[idx];
            let id =
                crate::activity::idempotency_key_at(&d.inst.workflow_id, &step.name, d.inst.retry_count, step.epoch);
            (id, step.error.clone().unwrap_or(StepError { class: ErrorClass::Permanent, message: String::new() }))
        };
        let found = match dls.get(&id).await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(error = %e, "dead letter unreadable; releasing");
                return Some(self.release_after(G::Running, self.inner.config.permit_retry_ms).await);
            }
        };
        let decision = match found {
            Some(dl) if dl.status != DeadLetterStatus::Open => dl.decision,
            Some(_) => None,
            None => {
                // The record was lost after the wait was stored: write it now.
                self.record_dead_letter(idx, error.clone()).await;
                None
            }
        };
        let Some(decision) = decision else {
            let wait = self.dead_letter_wait(idx);
            let t = Transition::dead_letter(idx, wait.clone(), error, DurationMs::ZERO, self.now());
            return Some(match self.commit_plain(G::Running, t).await {
                Ok(()) => {
                    self.after_suspend(&wait).await;
                    ClaimEnd::Suspended
                }
                Err(e) => e,
            });
        };
        let now = self.now();
        // A human task's Complete is refused here too, when it was decided without its definition.
        let authority = self.def.steps()[idx].get_outcome_authority();
        let (action, entry) = super::operator::resolve_decision(&decision, authority, now);
        let (t, fails) = {
            let d = self.doc();
            let step = &d.inst.steps[idx];
            let run = d.inst.retry_count;
            let mut record =
                step.record_of(run).cloned().unwrap_or_else(|| crate::record::StepRecord::new(run, step.epoch));
            record.entries.push(crate::record::RecordEntry::Operator(entry));
            match &action {
                DeadLetterAction::Retry => {
                    let h = crate::record::HistoryEntry {
                        run,
                        epoch: step.epoch,
                        reason: crate::record::HistoryReason::DeadLetterRetry,
                        output: None,
                        error: step.error.clone(),
                        record: Some(record),
                        at: now,
                    };
                    let history = self.inner.config.history_limits.push(step.history.clone(), h);
                    (Transition::step_epoch(idx, step.epoch.saturating_add(1), history, now), false)
                }
                DeadLetterAction::Complete { output } => {
                    let t = Transition::record_step(idx, record, None, now).fuse(Transition::complete_step(
                        idx,
                        &step.name,
                        output.clone(),
                        DurationMs::ZERO,
                        now,
                        true,
                    ));
                    (t, false)
                }
                DeadLetterAction::Fail => {
                    let message = format!(
                        "failed by {}{}",
                        decision.actor,
                        decision.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default()
                    );
                    let error = StepError { class: ErrorClass::Permanent, message };
                    (
                        Transition::record_step(idx, record, None, now).fuse(Transition::step_failed(
                            idx,
                            error,
                            DurationMs::ZERO,
                            now,
                        )),
                        true,
                    )
                }
            }
        };
        if let Err(e) = self.commit_plain(G::Running, t).await {
            return Some(e);
        }
        if let Err(e) = dls.close(&id, now).await {
            tracing::warn!(error = %e, dead_letter = %id, "applied dead letter not closed");
        }
        if fails {
            return Some(self.fail_path().await);
        }
        None
    }

    /// K-9.4: right after a signal wait is stored, consume an early signal.
    async fn after_suspend(&self, wait: &Wait) {
        let Some(id) = wait.signal_identity() else { return };
        match self.inner.ports.inbox.find_pending(&self.workflow_id, &id.signal_type, &id.wait_key, id.generation).await
        {
            Ok(Some(rec)) => {
                if let Err(e) = signals::try_match(&self.inner, &rec).await {
                    tracing::debug!(error = %e, "early-signal match failed; the repair scan will retry");
                }
            }
            Ok(None) => {}
            Err(e) => tracing::debug!(error = %e, "early-signal lookup failed; the repair scan will retry"),
        }
    }

    async fn run_finalizer(&self, activity: Arc<dyn Activity>, name: &str) -> Result<(), ActivityError> {
        let cancel = self.cancel.child_token();
        let ctx = self.context(None, name, cancel.clone());
        let span = tracing::info_span!("finalizer", name);
        let timeout_ms = self.inner.config.finalizer_timeout_ms;
        let inv =
            invoke::invoke(&self.inner.ports.clock, activity, ctx, cancel, timeout_ms, None).instrument(span).await;
        match inv.result {
            Ok(StepOutcome::Complete(_)) => Ok(()),
            Ok(other) => Err(ActivityError::permanent(format!("a finalizer must complete, got {other:?}"))),
            Err(e) => Err(e),
        }
    }

    /// Success (K-8): finalizer, then `running + token → completed`.
    async fn success_path(&self) -> ClaimEnd {
        if let Some(f) = self.def.success_finalizer().cloned() {
            if let Err(e) = self.run_finalizer(f, "success_finalizer").await {
                tracing::warn!(error = %e, "success finalizer failed; releasing with a delay");
                return self.release_after(G::Running, self.inner.config.finalizer_retry_ms).await;
            }
        }
        match self.commit_plain(G::Running, Transition::completed(self.now())).await {
            Ok(()) => {
                self.on_terminal().await;
                ClaimEnd::Terminal(WorkflowStatus::Completed)
            }
            Err(e) => e,
        }
    }

    /// Failure (K-8): in `failing`, the compensation (K-17.6) when the definition declares
    /// inverses, the finalizer, then `failing + token → failed` with the compensation's
    /// report. Failed steps are never re-run here.
    async fn fail_path(&self) -> ClaimEnd {
        let report = match self.compensate().await {
            Ok(r) => r,
            Err(end) => return end,
        };
        if let Some(f) = self.def.failure_finalizer().cloned() {
            if let Err(e) = self.run_finalizer(f, "failure_finalizer").await {
                tracing::warn!(error = %e, "failure finalizer failed; releasing with a delay");
                return self.release_after(G::Failing, self.inner.config.finalizer_retry_ms).await;
            }
        }
        let t = match report {
            Some((r, undone)) => Transition::failed_compensated(self.now(), r, &undone),
            None => Transition::failed(self.now()),
        };
        match self.commit_plain(G::Failing, t).await {
            Ok(()) => {
                self.on_terminal().await;
                ClaimEnd::Terminal(WorkflowStatus::Failed)
            }
            Err(e) => e,
        }
    }

    /// The compensation of a failing workflow (K-17.6), `None` when no step declares an
    /// inverse: the inverses of the completed steps that declare one, in reverse completion
    /// order, each with its own idempotency key (the step's with `|c`) and up to
    /// `compensation_attempts` attempts one after the other (a transient error retries; a
    /// permanent error or an inverse that does not complete stops at once). An inverse
    /// that kept failing is escalated to a person through the task inbox, or recorded as
    /// failed without one — never dropped. Run again from the start if the claim is lost
    /// before the terminal write: inverses are idempotent by their keys.
    async fn compensate(&self) -> Result<Option<(CompensationReport, Vec<usize>)>, ClaimEnd> {
        let steps = self.def.steps();
        if steps.iter().all(|s| s.get_inverse().is_none()) {
            return Ok(None);
        }
        // Reverse completion order; on a tie (one millisecond, or the clocks of two workers)
        // a step with more transitive dependencies first, so a dependent is undone before
        // what it depends on (a dependent always has more).
        let dependents: Vec<Vec<bool>> = (0..steps.len()).map(|k| self.def.plan().dependents(k)).collect();
        let ancestors = |i: usize| dependents.iter().enumerate().filter(|(k, d)| *k != i && d[i]).count();
        let mut order: Vec<(usize, Instant, usize)> = {
            let d = self.doc();
            steps
                .iter()
                .enumerate()
                .filter(|(i, sd)| sd.get_inverse().is_some() && d.inst.steps[*i].status == StepStatus::Completed)
                .map(|(i, _)| (i, d.inst.steps[i].finished_at.unwrap_or(Instant::ZERO), ancestors(i)))
                .collect()
        };
        order.sort_by(|a, b| b.1.cmp(&a.1).then(b.2.cmp(&a.2)).then(b.0.cmp(&a.0)));
        let mut runs = Vec::with_capacity(order.len());
        let mut undone = Vec::new();
        for (idx, _, _) in order {
            let run = self.run_inverse(idx).await?;
            if run.result == InverseResult::Compensated {
                undone.push(idx);
            }
            runs.push(run);
        }
        let outcome = CompensationReport::outcome_of(&runs);
        tracing::info!(outcome = outcome.as_str(), inverses = runs.len(), "compensation ended");
        Ok(Some((CompensationReport { outcome, steps: runs, at: self.now() }, undone)))
    }

    /// `Err` with how the claim ended when it may no longer start an inverse: canceled,
    /// lost, past its lease (another worker may own the instance already), or the stored
    /// instance is no longer `failing` under this claim's token — an operator's cancel is
    /// seen before the next inverse starts (one read per inverse, on the failure path only;
    /// a read that fails stops the compensation too: the next claim runs it again).
    async fn may_start_inverse(&self) -> Result<(), ClaimEnd> {
        if self.cancel.is_cancelled() {
            return Err(self.ended_as());
        }
        if self.now() >= self.lease.until_or_min() {
            tracing::warn!("lease expired during the compensation; stopping");
            self.cancel.cancel();
            return Err(ClaimEnd::ClaimLost);
        }
        let id = WorkflowId::from(&*self.shared.workflow_id);
        match self.inner.ports.store.get(&id).await {
            Ok(Some(i))
                if i.status == WorkflowStatus::Failing
                    && i.claim_token.as_ref().map(|t| t.as_str()) == Some(&*self.shared.claim_token) =>
            {
                Ok(())
            }
            Ok(found) => {
                tracing::info!(status = ?found.map(|i| i.status), "the instance changed during the compensation; stopping");
                self.cancel.cancel();
                Err(ClaimEnd::ClaimLost)
            }
            Err(e) => {
                tracing::warn!(error = %e, "the instance could not be read during the compensation; stopping");
                Err(ClaimEnd::Uncertain)
            }
        }
    }

    async fn run_inverse(&self, idx: usize) -> Result<InverseRun, ClaimEnd> {
        let sd = &self.def.steps()[idx];
        let inverse = sd.get_inverse().expect("only steps with an inverse are compensated").clone();
        let cfg = &self.inner.config;
        let mut attempts = 0;
        let error = loop {
            self.may_start_inverse().await?;
            attempts += 1;
            let cancel = self.cancel.child_token();
            let mut ctx = self.context(Some(idx), sd.name(), cancel.clone());
            ctx.compensating = true;
            ctx.journal = None;
            ctx.attempt = attempts;
            let span = tracing::info_span!("compensate", step = sd.name(), attempt = attempts);
            let inv =
                invoke::invoke(&self.inner.ports.clock, inverse.clone(), ctx, cancel, cfg.finalizer_timeout_ms, None)
                    .instrument(span)
                    .await;
            let e = match inv.result {
                Ok(StepOutcome::Complete(_)) => {
                    self.close_escalation(idx).await;
                    return Ok(InverseRun {
                        step: sd.name().to_string(),
                        result: InverseResult::Compensated,
                        attempts,
                        error: None,
                        task: None,
                    });
                }
                Ok(other) => ActivityError::permanent(format!("an inverse must complete, got {other:?}")),
                Err(e) => e,
            };
            if e.class != ErrorClass::Transient || attempts >= cfg.compensation_attempts {
                break e;
            }
            tracing::warn!(step = sd.name(), attempt = attempts, error = %e, "inverse failed; retrying");
        };
        // The claim ending is not the inverse failing: nothing is escalated for it.
        self.may_start_inverse().await?;
        // No store holds NUL everywhere, and the report and the task title must be written.
        let printable: String = error.message.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
        let message = outcome::truncate(printable, crate::compensation::INVERSE_ERROR_BYTES_MAX);
        tracing::warn!(step = sd.name(), attempts, error = %message, "inverse kept failing");
        let task = self.escalate_inverse(idx, &message).await;
        Ok(InverseRun {
            step: sd.name().to_string(),
            result: if task.is_some() { InverseResult::Escalated } else { InverseResult::Failed },
            attempts,
            error: Some(message),
            task,
        })
    }

    /// The escalation task id of step `idx`'s inverse (one per logical attempt).
    fn escalation_task_id(&self, idx: usize) -> String {
        let d = self.doc();
        let s = &d.inst.steps[idx];
        let key = crate::activity::idempotency_key_at(&self.shared.workflow_id, &s.name, d.inst.retry_count, s.epoch);
        crate::human::task_id(&format!("{key}|c"), 0)
    }

    /// An inverse completed: close the task an earlier pass may have opened for it, so
    /// nobody undoes the step a second time by hand (best effort; absent is the rule).
    async fn close_escalation(&self, idx: usize) {
        let Some(inbox) = self.inner.ports.task_inbox.clone() else { return };
        if let Err(e) = inbox.close(&self.escalation_task_id(idx), self.now()).await {
            tracing::warn!(error = %e, "the escalation task of a compensated step could not be closed");
        }
    }

    /// Open a human task for an inverse that kept failing (K-17.5); its id, or `None`
    /// without a task inbox or when the inbox refused.
    async fn escalate_inverse(&self, idx: usize, error: &str) -> Option<String> {
        let inbox = self.inner.ports.task_inbox.clone()?;
        let cfg = &self.inner.config;
        let id = self.escalation_task_id(idx);
        let (wf_type, step) = {
            let d = self.doc();
            (d.inst.workflow_type.clone(), d.inst.steps[idx].name.clone())
        };
        let now = self.now();
        let title = outcome::truncate(
            format!("Undo step `{step}` by hand: its inverse kept failing ({error})"),
            TASK_TEXT_BYTES_MAX,
        );
        let task = crate::ports::TaskRecord {
            id,
            workflow_id: self.shared.workflow_id.to_string().into(),
            workflow_type: wf_type,
            step,
            level: 0,
            title,
            assignee: None,
            roles: cfg.compensation_escalation_roles.clone(),
            evidence: Vec::new(),
            token: crate::human::secure_token().unwrap_or_else(|_| {
                format!("{}{:016x}", self.inner.ports.ids.new_token(), self.inner.ports.ids.random_u64())
            }),
            created_at: now,
            due_at: now.saturating_add(cfg.compensation_escalation_sla_ms),
            status: crate::ports::TaskStatus::Open,
            decision: None,
            closed_at: None,
        };
        match inbox.open(&task).await {
            Ok(_) => Some(task.id),
            Err(e) => {
                tracing::error!(error = %e, "the escalation task of an inverse could not be opened");
                None
            }
        }
    }

    /// After the terminal commit: only best-effort side channels (K-8, K-16).
    async fn on_terminal(&self) {
        let Some(key) = &self.shared.stream_key else { return };
        let summary = {
            let d = self.doc();
            let mut summary = serde_json::json!({ "status": d.inst.status.as_str(), "revision": d.inst.revision });
            // The compensation's outcome is observable to clients too (K-17.6).
            if let Some(c) = &d.inst.compensation {
                summary["compensation"] = serde_json::json!(c.outcome.as_str());
            }
            summary
        };
        if let Err(e) = self.inner.ports.stream.terminal(key, self.stream_owner(), summary).await {
            tracing::debug!(error = %e, "terminal frame failed");
        }
    }
}
