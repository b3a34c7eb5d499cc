//! One claim, from the won `Claim` write to its end (K-6.5, K-7, K-8, K-4.5).
//!
//! This module only sequences: permit → mark running → the activity
//! ([`invoke`](super::invoke)) → what the result means and how a wave resolves
//! ([`outcome`](super::outcome), pure) → one guarded write. Finalizers and the terminal
//! side channels follow. Every decision on the way is a pure function it calls, then
//! performs the port calls it names: loops and branches ([`control`](super::control)),
//! dead-letter decisions ([`dead_letter_decision`](super::dead_letter_decision)), the
//! compensation ([`compensation_plan`](super::compensation_plan)) and the way to the end
//! ([`terminal`](super::terminal)).
//!
//! The sequences are split by stage: `drive.rs` (the claim's main loop), `steps.rs` (one
//! step: permit, mark running, invoke, the fused write of a lone step), `wave.rs` (the
//! control pass's writes and the end of a wave), `dead_letter.rs` (dead-lettered steps)
//! and `finish.rs` (finalizers, compensation, terminal writes). This file holds the
//! claim's state and its one guarded write.

use super::compensation_plan;
use super::control::{self, panic_message, Control};
use super::dead_letter_decision::{self, AfterDecision, Found};
use super::effects::{self, Writer};
use super::heartbeat::{Heartbeats, Lease};
use super::invoke::{self, HeldPermit, Invocation, Renewal};
use super::outcome::{self, AfterWave, Entry, Halt, StepPolicy, StepResult};
use super::terminal::{self, Fusion, NextMove, PrepareNext, RefusedWrite};
use super::{signals, ClaimEnd, Inner, PrepareContext};
use crate::activity::{Activity, ActivityContext, ActivityError, StepOutcome};
use crate::compensation::{CompensationReport, InverseResult, InverseRun};
use crate::definition::Definition;
use crate::domain::*;
use crate::id::{ClaimToken, WorkflowId};
use crate::ports::*;
use crate::transition::{Guard, Transition};
use crate::validate;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

mod dead_letter;
mod drive;
mod finish;
mod query_first;
mod refused;
mod request;
mod steps;
mod wave;

use query_first::QueryFirst;

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
    /// The store refused this step's plain write (its mark-running): nothing was written
    /// and the claim still holds; once every sibling returned, the wave hands it back
    /// counting the refusal, or fails the step at the run's limit
    /// ([`refused_plain`](Claim::refused_plain)).
    RefusedPlain(usize, crate::error::Error),
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

/// How a step is entered.
enum Entering {
    /// Take its permit and mark it running first.
    Fresh,
    /// Its mark-running was fused into the last write (K-7.1), under this permit.
    Marked(Option<HeldPermit>),
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
    /// Steps found `running` when the claim started: their previous attempt was lost to a
    /// crash or a lease loss, so its outcome is unknown (K-17.2); taken by the first entry.
    lost_attempts: Mutex<std::collections::BTreeSet<usize>>,
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
        if let Some(end) = request::apply_at_start(&inner, &def, &inst, &token).await {
            return end;
        }
        let (prepared, refusal) = match prepare(&inst, &def, inner.prepare.as_ref()) {
            Ok(p) => (p, None),
            Err(r) => (Arc::new(Value::Null), Some(r)),
        };
        let cancel = inner.killed.child_token();
        let lease = Arc::new(Lease::new(inst.workflow_id.clone(), token.clone(), inst.claimable_time, cancel.clone()));
        let lost_attempts = (inst.steps.iter().enumerate())
            .filter(|(_, s)| s.status == crate::domain::StepStatus::Running)
            .map(|(i, _)| i)
            .collect();
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
            lost_attempts: Mutex::new(lost_attempts),
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
        let end = match end {
            // Every activity of the claim has returned: an operator's request addressed to
            // it is applied now (K-6.8).
            ClaimEnd::ClaimLost => claim.apply_own_request().await.unwrap_or(end),
            end => end,
        };
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

    /// Whether this claim may no longer start anything (K-6.8): its own clock reads its
    /// lease end less the clock skew another process may have (`max_clock_skew_ms`), so a
    /// worker whose clock runs ahead, taking the instance over at the lease end by its own
    /// clock, never runs beside what this one starts.
    fn past_start_limit(&self) -> bool {
        self.now() >= self.lease.until_or_min().saturating_sub(self.inner.config.max_clock_skew_ms)
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
    ///
    /// The steps the write completes are stamped with the revision it produces (K-17.6
    /// amendment): this claim is the only writer under its token.
    async fn commit(&self, g: G, mut t: Transition) -> Result<(), Unwritten> {
        let revision = self.doc().inst.revision;
        t.stamp_completions(revision.saturating_add(1));
        match self.inner.ports.store.apply(&self.workflow_id, &self.guard(g), &t).await {
            Ok(WriteOutcome::Applied { revision }) => {
                self.applied(&t, revision);
                Ok(())
            }
            Ok(WriteOutcome::Missed) => {
                tracing::warn!(kinds = ?t.kinds().collect::<Vec<_>>(), "write missed: claim lost");
                // Recorded, so every later `ended_as` says lost (and the holder looks for
                // an operator's request at its end, K-6.8).
                self.lease.end_with(ClaimEnd::ClaimLost);
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
        self.hand_back_counting(g, None).await
    }

    /// [`hand_back`](Self::hand_back), recording the run's count of refused plain writes
    /// when given (K-6.4).
    async fn hand_back_counting(&self, g: G, refused: Option<u32>) -> ClaimEnd {
        self.cancel.cancel();
        let now = self.now();
        let delay = self.inner.config.permit_retry_ms;
        let t = match refused {
            Some(n) => Transition::refused_release(n, now, delay),
            None => Transition::release_after(now, delay),
        };
        let Ok(t) = t else { return ClaimEnd::Uncertain };
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
    ///
    /// A refusal is counted on the instance (`refused_writes`, with the hand-back); at
    /// [`terminal::REFUSED_WRITES_MAX`] in a run the workflow fails instead
    /// ([`refused_plain`](Self::refused_plain)).
    async fn commit_plain(&self, g: G, t: Transition) -> Result<(), ClaimEnd> {
        let refused = refused::Refused::of(g, &t);
        match self.commit(g, t).await {
            Ok(()) => Ok(()),
            Err(Unwritten::End(end)) => Err(end),
            Err(Unwritten::Unavailable) => Err(self.hand_back(g).await),
            Err(Unwritten::Refused(e)) => Err(Box::pin(self.refused_plain(g, refused, e)).await),
        }
    }
}
