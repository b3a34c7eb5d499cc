//! Guards and transitions: every write to an instance, declared as data (sans-IO).
//!
//! A store adapter receives a [`Guard`] (the condition of K-6.4) and a [`Transition`] (the
//! typed update) and must apply them as **one atomic conditional update**. The pure
//! [`Guard::matches`] and [`Transition::apply_to`] define the semantics: the in-memory store
//! uses them directly, the engine uses them to keep its local copy in step with the store,
//! and the conformance suite checks every other adapter against them.

use crate::domain::*;
use crate::error::{Error, Result};
use crate::id::{BusinessRound, ClaimToken, FencingToken};
use crate::record::{HistoryEntry, StepRecord};
use crate::validate;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Set or remove a field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Patch<T> {
    /// `$set`
    Set(T),
    /// `$unset`
    Unset,
}

impl<T: Clone> Patch<T> {
    fn apply(&self, slot: &mut Option<T>) {
        *slot = match self {
            Patch::Set(v) => Some(v.clone()),
            Patch::Unset => None,
        }
    }
}

/// The write condition, always combined with `workflow_id = id` (K-6.4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Guard {
    /// Claim (K-6.2): `status ∈ {running, failing} AND claimable_time ≤ now AND type ∈ types`.
    Claimable {
        /// The caller's clock.
        now: Instant,
        /// Types the worker has definitions for.
        types: Vec<String>,
    },
    /// `status = running AND claim_token = token`.
    Running {
        /// The current claim.
        token: ClaimToken,
    },
    /// `status = failing AND claim_token = token`.
    Failing {
        /// The current claim.
        token: ClaimToken,
    },
    /// `claim_token = token` alone (heartbeat, fingerprint push-back).
    Token {
        /// The current claim.
        token: ClaimToken,
    },
    /// Replay (K-5): `status = failed`, and, when `unless_round` is given, the instance's
    /// round (`input.fencing_token`) is not that token. A failed round is never replayed
    /// under its own round (that would re-run its failed steps under a new K-17.1 key);
    /// build it with [`Guard::replay`].
    Failed {
        /// The requesting round; `None` replays whatever round failed.
        unless_round: Option<FencingToken>,
    },
    /// Timer activation (K-9.2): `status = waiting AND claimable_time ≤ now AND wait.step_index = i`.
    DueWait {
        /// The caller's clock.
        now: Instant,
        /// The waiting step.
        step_index: u32,
    },
    /// Signal activation (K-9.3): `status = waiting AND` the exact wait identity.
    SignalWait(WaitIdentity),
    /// Cancel / supersede: `status ∈ {running, waiting, failing}`.
    Active,
    /// Priority raise (promote-only): `business_priority` less urgent than the given one,
    /// and the instance not terminal.
    PriorityBelow(Priority),
    /// An operator's write to an instance no claim holds (cancel, regenerate; K-6.8):
    /// `status ∈ {running, waiting, failing} AND revision = r AND claim_token` absent —
    /// optimistic: the operator read the instance at revision `r`, saw no claim, and
    /// computed the write from it; a miss means it changed or was claimed meanwhile
    /// (re-read and decide again), never a blind retry. An instance under a claim gets an
    /// [`OperatorRequest`](crate::operator_request::OperatorRequest) instead, written
    /// under [`Guard::Token`].
    Operator {
        /// The revision the operator read.
        revision: u64,
    },
}

impl Guard {
    /// The K-2.0 check of every identifier the guard compares against: claim tokens, the
    /// worker's types and a signal wait's `signal_type` and `wait_key`. Every store adapter
    /// calls it before it writes, so all of them refuse the same guards.
    ///
    /// ```
    /// use kernel_core::transition::Guard;
    /// assert!(Guard::Running { token: "tok-1".into() }.validate().is_ok());
    /// assert!(Guard::Running { token: "tok\0".into() }.validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<()> {
        match self {
            Guard::Claimable { now: _, types } => types.iter().try_for_each(|t| validate::identifier("types", t)),
            Guard::Running { token } | Guard::Failing { token } | Guard::Token { token } => {
                validate::identifier("claim_token", token.as_str())
            }
            Guard::SignalWait(WaitIdentity { signal_type, wait_key, generation: _, step_index: _ }) => {
                validate::identifier("signal_type", signal_type)?;
                validate::identifier("wait_key", wait_key)
            }
            Guard::Failed { .. }
            | Guard::DueWait { .. }
            | Guard::Active
            | Guard::PriorityBelow(_)
            | Guard::Operator { .. } => Ok(()),
        }
    }

    /// The replay guard of a StartOrResume carrying `input` (K-5): its business round,
    /// read by [`BusinessRound::of`], when it has a non-empty one.
    ///
    /// ```
    /// use kernel_core::transition::Guard;
    /// let g = Guard::replay(&serde_json::json!({"fencing_token": "f1"}));
    /// assert_eq!(g, Guard::Failed { unless_round: Some("f1".into()) });
    /// assert_eq!(Guard::replay(&serde_json::json!({"x": 1})), Guard::Failed { unless_round: None });
    /// assert_eq!(Guard::replay(&serde_json::json!({"fencing_token": ""})), Guard::Failed { unless_round: None });
    /// ```
    pub fn replay(input: &Value) -> Guard {
        Guard::Failed { unless_round: BusinessRound::of(input).fencing_token.filter(|f| !f.as_str().is_empty()) }
    }

    /// Whether this guard needs the current claim token.
    pub fn is_token_guard(&self) -> bool {
        matches!(self, Guard::Running { .. } | Guard::Failing { .. } | Guard::Token { .. })
    }

    /// The reference semantics of the condition.
    pub fn matches(&self, inst: &WorkflowInstance) -> bool {
        use WorkflowStatus as S;
        let token_is = |t: &ClaimToken| inst.claim_token.as_ref() == Some(t);
        match self {
            Guard::Claimable { now, types } => {
                matches!(inst.status, S::Running | S::Failing)
                    && inst.claimable_time.is_some_and(|c| c <= *now)
                    && types.contains(&inst.workflow_type)
            }
            Guard::Running { token } => inst.status == S::Running && token_is(token),
            Guard::Failing { token } => inst.status == S::Failing && token_is(token),
            Guard::Token { token } => token_is(token),
            Guard::Failed { unless_round } => {
                inst.status == S::Failed && unless_round.as_ref().is_none_or(|f| !BusinessRound::of(&inst.input).is(f))
            }
            Guard::DueWait { now, step_index } => {
                inst.status == S::Waiting
                    && inst.claimable_time.is_some_and(|c| c <= *now)
                    && inst.wait.as_ref().is_some_and(|w| w.step_index() == *step_index)
            }
            Guard::SignalWait(id) => {
                inst.status == S::Waiting && inst.wait.as_ref().and_then(Wait::signal_identity).as_ref() == Some(id)
            }
            Guard::Active => matches!(inst.status, S::Running | S::Waiting | S::Failing),
            Guard::PriorityBelow(p) => !inst.status.is_terminal() && p.is_higher_than(inst.business_priority),
            Guard::Operator { revision } => {
                matches!(inst.status, S::Running | S::Waiting | S::Failing)
                    && inst.revision == *revision
                    && inst.claim_token.is_none()
            }
        }
    }
}

/// What a transition means, for observations, write counting and snapshot tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransitionKind {
    /// Instance created (K-5).
    Create,
    /// Claim taken (K-6.2).
    Claim,
    /// Lease extended (K-6.3).
    Heartbeat,
    /// Step marked running, attempt+1 (K-7.2).
    MarkRunning,
    /// Step completed with output (K-7.4).
    CompleteStep,
    /// Suspended on a timer or signal, claim released (K-9.1).
    SuspendClaim,
    /// Yielded with a checkpoint (K-7.4).
    Yield,
    /// Step failed retryably; claim released with a delay (K-7.4).
    RetryRelease,
    /// Permit denied; claim released with a delay (K-7.1).
    PermitDeferral,
    /// Step skipped after `on_failed = skip`.
    SkipStep,
    /// Step failed for good.
    StepFailed,
    /// → failing (K-8).
    Failing,
    /// failing → failed (K-8).
    Failed,
    /// → completed (K-8).
    Completed,
    /// Activity reported cancellation: → canceled (K-7.4).
    Canceled,
    /// Explicit cancel / supersede (K-8).
    Supersede,
    /// Definition mismatch push-back (K-4.3).
    FingerprintPushBack,
    /// A due wait activated (K-9.2).
    TimerActivation,
    /// A signal activated the wait (K-9.3).
    SignalActivation,
    /// A failed instance replayed (K-5).
    Replay,
    /// Priority raised (K-5, K-13).
    PriorityRaise,
    /// A finalizer failed; claim released with a delay (K-8).
    FinalizerRelease,
    /// PrepareContext failed; the failure counted, claim released with a delay (K-2.3).
    PrepareRelease,
    /// Claim released without progress: a shutdown between waves (claimable at once), or a
    /// claim handed back with a delay after the store could not take one of its writes.
    Release,
    /// A step recorded a fact (a model call, a value) before its activity continued (K-17.3).
    RecordStep,
    /// An operator regenerated a step: a new logical attempt of it and of the steps that
    /// depend on it (K-17.3).
    Regenerate,
    /// A step was dead-lettered: its error recorded, the workflow waits on the operator
    /// signal (K-17.2).
    DeadLetter,
    /// An operator's dead-letter retry started the step's next logical attempt (K-17.2).
    StepEpoch,
    /// A loop's sender sent the workflow back to the loop's target: every step of the
    /// loop's body starts its next logical attempt (K-4 amendment, K-17.1).
    LoopBack,
    /// Steps whose branch predicate did not hold were skipped (K-4 amendment).
    BranchSkip,
    /// A failing claim handed its compensation back with its progress recorded: an
    /// inverse to retry later, or the failure finalizer failed after every inverse ended
    /// (K-17.6 amendment, K-8).
    CompensationRelease,
    /// A failing claim recorded the compensation's progress before an inverse's attempt:
    /// the inverses ended so far and the attempt now starting (K-17.6 amendment).
    CompensationProgress,
    /// An operator's request was recorded for the holder of the live claim, whose token
    /// it replaced (K-6.8).
    OperatorRequest,
    /// An operator's request was applied: the claim cleared, with the action's own kind
    /// fused in when it still applies (K-6.8).
    RequestApplied,
}

/// One logical transition a write carries, with the step it concerns (K-7.1: a fused write
/// carries several).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KindAt {
    /// What the logical transition means (the observation's `kind`).
    pub kind: TransitionKind,
    /// Index of the step the observation names; `None` for instance-level transitions
    /// (claim, heartbeat, terminal status, replay, priority raise).
    pub step: Option<u32>,
}

/// Change to a step's attempt counter (K-2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AttemptChange {
    /// `$inc` by the given amount (+1 mark-running, −1 suspend/yield).
    Inc(i32),
    /// Set to 0 (replay).
    Reset,
}

/// Update of one step, addressed by index (`steps.<i>.<field>`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct StepPatch {
    /// Index in `steps`; a patch past the last step is refused by the store (nothing
    /// written), never padded.
    pub index: u32,
    /// New step status; `None` leaves it.
    pub status: Option<StepStatus>,
    /// `+1` on mark-running, `−1` on suspend/yield, reset on replay (K-2.1); `None` leaves it.
    pub attempt: Option<AttemptChange>,
    /// The step's last error, set or cleared; `None` leaves it.
    pub error: Option<Patch<StepError>>,
    /// The step's checkpoint, set or cleared; counts against the payload limit.
    pub checkpoint: Option<Patch<Value>>,
    /// Activity time of this attempt, added to `elapsed_ms` (`$inc`).
    pub elapsed_ms_inc: DurationMs,
    /// Permit wait of a deferral, added to `traffic_wait_ms` (`$inc`).
    pub traffic_wait_ms_inc: DurationMs,
    /// Permit denials, added to `traffic_waits` (`$inc`).
    pub traffic_waits_inc: u32,
    /// Time of the mark-running write; `None` leaves `started_at`.
    pub started_at: Option<Instant>,
    /// Completion or failure time, set or cleared; `None` leaves it.
    pub finished_at: Option<Patch<Instant>>,
    /// The step's epoch (K-17.1), set; `None` leaves it.
    pub epoch: Option<u32>,
    /// The step's record of its current logical attempt (K-17.3), set or cleared; counts
    /// against the payload limit.
    pub record: Option<Patch<StepRecord>>,
    /// The step's history of earlier logical attempts, set (bounded by the writer) or
    /// cleared; counts against the payload limit.
    pub history: Option<Patch<Vec<HistoryEntry>>>,
    /// When the current logical attempt first failed retryably, set or cleared.
    pub retrying_since: Option<Patch<Instant>>,
    /// The step's loop iteration counter, set; `None` leaves it.
    pub iterations: Option<u32>,
    /// The revision of the write that completes the step (K-17.6 amendment), set by
    /// [`Transition::stamp_completions`] or cleared; `None` leaves it.
    pub completed_revision: Option<Patch<u64>>,
}

impl StepPatch {
    /// An empty patch of step `index`.
    pub fn at(index: usize) -> Self {
        StepPatch { index: index as u32, ..Default::default() }
    }

    // Patches are destructured field by field here and in every adapter: a new field is a
    // compile error wherever it must be handled, never a silently dropped write.
    fn merge(&mut self, o: &StepPatch) {
        let StepPatch {
            index: _,
            status,
            attempt,
            error,
            checkpoint,
            elapsed_ms_inc,
            traffic_wait_ms_inc,
            traffic_waits_inc,
            started_at,
            finished_at,
            epoch,
            record,
            history,
            retrying_since,
            iterations,
            completed_revision,
        } = o;
        if status.is_some() {
            self.status = *status;
        }
        self.attempt = match (self.attempt, *attempt) {
            (Some(AttemptChange::Inc(a)), Some(AttemptChange::Inc(b))) => Some(AttemptChange::Inc(a + b)),
            (a, None) => a,
            (_, b) => b,
        };
        if error.is_some() {
            self.error = error.clone();
        }
        if checkpoint.is_some() {
            self.checkpoint = checkpoint.clone();
        }
        self.elapsed_ms_inc += *elapsed_ms_inc;
        self.traffic_wait_ms_inc += *traffic_wait_ms_inc;
        self.traffic_waits_inc += traffic_waits_inc;
        if started_at.is_some() {
            self.started_at = *started_at;
        }
        if finished_at.is_some() {
            self.finished_at = finished_at.clone();
        }
        if epoch.is_some() {
            self.epoch = *epoch;
        }
        if record.is_some() {
            self.record = record.clone();
        }
        if history.is_some() {
            self.history = history.clone();
        }
        if retrying_since.is_some() {
            self.retrying_since = retrying_since.clone();
        }
        if iterations.is_some() {
            self.iterations = *iterations;
        }
        if completed_revision.is_some() {
            self.completed_revision = completed_revision.clone();
        }
    }

    fn apply_to(&self, step: &mut Step) {
        let StepPatch {
            index: _,
            status,
            attempt,
            error,
            checkpoint,
            elapsed_ms_inc,
            traffic_wait_ms_inc,
            traffic_waits_inc,
            started_at,
            finished_at,
            epoch,
            record,
            history,
            retrying_since,
            iterations,
            completed_revision,
        } = self;
        if let Some(s) = status {
            step.status = *s;
        }
        match attempt {
            Some(AttemptChange::Inc(d)) => step.attempt = (step.attempt as i64 + *d as i64).max(0) as u32,
            Some(AttemptChange::Reset) => step.attempt = 0,
            None => {}
        }
        if let Some(p) = error {
            p.apply(&mut step.error);
        }
        if let Some(p) = checkpoint {
            p.apply(&mut step.checkpoint);
        }
        step.elapsed_ms += *elapsed_ms_inc;
        step.traffic_wait_ms += *traffic_wait_ms_inc;
        step.traffic_waits += traffic_waits_inc;
        if let Some(t) = started_at {
            step.started_at = Some(*t);
        }
        if let Some(p) = finished_at {
            p.apply(&mut step.finished_at);
        }
        if let Some(e) = epoch {
            step.epoch = *e;
        }
        if let Some(p) = record {
            p.apply(&mut step.record);
        }
        match history {
            Some(Patch::Set(h)) => step.history = h.clone(),
            Some(Patch::Unset) => step.history.clear(),
            None => {}
        }
        if let Some(p) = retrying_since {
            p.apply(&mut step.retrying_since);
        }
        if let Some(n) = iterations {
            step.iterations = *n;
        }
        if let Some(p) = completed_revision {
            p.apply(&mut step.completed_revision);
        }
    }
}

/// One atomic update of an instance. `revision` is `$inc`-ed (never a guard) when
/// `bump_revision` is set; `updated_at = now` always.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Transition {
    /// The logical transitions this write carries, each with the step it concerns (several
    /// when fused, K-7.1). Metadata for observations and write counting: it is not written.
    /// Read it through [`kinds`](Self::kinds) and [`kinds_at`](Self::kinds_at).
    pub kinds: Vec<KindAt>,
    /// The writer's clock, written as `updated_at`.
    pub now: Instant,
    /// New top-level status; `None` leaves it.
    pub status: Option<WorkflowStatus>,
    /// Per-step updates, at most one per step index (a second patch of one index is refused).
    pub steps: Vec<StepPatch>,
    /// `output.<name> = value`, never the whole map (K-4.4); names are document keys
    /// ([`validate::key_name`]), values count against the payload limit.
    pub outputs: Vec<(String, Value)>,
    /// `output.<name>` removed (regenerate: the steps that run again lose their output);
    /// names are document keys; a name also in `outputs` is refused.
    pub outputs_unset: Vec<String>,
    /// Input replaced wholesale (replay); counts against the payload limit.
    pub input: Option<Value>,
    /// When the instance may next be claimed (lease end, retry delay), set or cleared.
    pub claimable_time: Option<Patch<Instant>>,
    /// The claim token, set (claim) or cleared (release); a set token follows K-2.0.
    pub claim_token: Option<Patch<ClaimToken>>,
    /// The wait, set (suspend) or cleared (activation, terminal); a signal wait's identity
    /// follows K-2.0.
    pub wait: Option<Patch<Wait>>,
    /// Why the waiting step resumed, set (activation) or cleared.
    pub resume: Option<Patch<Resume>>,
    /// Both fingerprints, recorded by a definition push-back (K-4.3).
    pub fingerprint_mismatch: Option<FingerprintMismatch>,
    /// New lane (promote-only, K-13); `None` leaves it.
    pub priority: Option<Priority>,
    /// Replay: every failed step → pending with attempt, error, elapsed, traffic statistics,
    /// checkpoint and loop iterations cleared (Mongo: `arrayFilters`).
    pub reset_failed_steps: bool,
    /// `retry_count += 1` (replay, K-2.1).
    pub retry_count_inc: bool,
    /// `prepare_failures` set: counted by a failed PrepareContext (K-2.3), reset to 0 by
    /// replay; `None` leaves it.
    pub prepare_failures: Option<u32>,
    /// `refused_writes` set: counted by the hand-back after a refused plain write, reset to
    /// 0 by replay; `None` leaves it.
    pub refused_writes: Option<u32>,
    /// Terminal time, set (terminal write) or cleared (replay).
    pub finished_at: Option<Patch<Instant>>,
    /// The compensation report (K-17.6), set with the `failed` write or cleared (replay).
    pub compensation: Option<Patch<crate::compensation::CompensationReport>>,
    /// The operator's request to the claim holder (K-6.8), set (a request, under the
    /// holder's token) or cleared (when applied).
    pub operator_request: Option<Patch<crate::operator_request::OperatorRequest>>,
    /// `revision += 1` (every accepted write but claim and heartbeat, K-2.2).
    pub bump_revision: bool,
}

impl Transition {
    /// An empty transition of one kind.
    pub fn new(kind: TransitionKind, now: Instant) -> Self {
        Transition { kinds: vec![KindAt { kind, step: None }], now, bump_revision: true, ..Default::default() }
    }

    /// An empty transition of one kind concerning step `index`.
    pub fn for_step(kind: TransitionKind, index: usize, now: Instant) -> Self {
        Transition {
            kinds: vec![KindAt { kind, step: Some(index as u32) }],
            now,
            bump_revision: true,
            ..Default::default()
        }
    }

    /// The first (primary) kind; [`TransitionKind::Release`] for a transition that carries
    /// none.
    pub fn kind(&self) -> TransitionKind {
        self.kinds.first().map_or(TransitionKind::Release, |k| k.kind)
    }

    /// Every logical kind this write carries, in order (several when fused, K-7.1).
    pub fn kinds(&self) -> impl Iterator<Item = TransitionKind> + '_ {
        self.kinds.iter().map(|k| k.kind)
    }

    /// Every logical kind with the step it concerns, in order.
    pub fn kinds_at(&self) -> &[KindAt] {
        &self.kinds
    }

    /// Mutable patch of step `index`, created on first use.
    pub fn step_mut(&mut self, index: usize) -> &mut StepPatch {
        if let Some(pos) = self.steps.iter().position(|p| p.index == index as u32) {
            return &mut self.steps[pos];
        }
        self.steps.push(StepPatch::at(index));
        self.steps.last_mut().expect("just pushed")
    }

    /// Fuse `next` into `self`: one write that carries both transitions (K-7.1). Fields of
    /// `next` win; counters add up; revision is bumped once.
    pub fn fuse(mut self, next: Transition) -> Transition {
        let Transition {
            kinds,
            now,
            status,
            steps,
            outputs,
            outputs_unset,
            input,
            claimable_time,
            claim_token,
            wait,
            resume,
            fingerprint_mismatch,
            priority,
            reset_failed_steps,
            retry_count_inc,
            prepare_failures,
            refused_writes,
            finished_at,
            compensation,
            operator_request,
            bump_revision,
        } = next;
        self.kinds.extend(kinds);
        self.now = self.now.max(now);
        if status.is_some() {
            self.status = status;
        }
        for p in &steps {
            self.step_mut(p.index as usize).merge(p);
        }
        for (k, v) in outputs {
            self.outputs.retain(|(n, _)| *n != k);
            self.outputs_unset.retain(|n| *n != k);
            self.outputs.push((k, v));
        }
        for k in outputs_unset {
            self.outputs.retain(|(n, _)| *n != k);
            if !self.outputs_unset.contains(&k) {
                self.outputs_unset.push(k);
            }
        }
        macro_rules! take {
            ($($f:ident),*) => {$( if $f.is_some() { self.$f = $f; } )*};
        }
        take!(
            input,
            claimable_time,
            claim_token,
            wait,
            resume,
            fingerprint_mismatch,
            priority,
            prepare_failures,
            refused_writes,
            finished_at,
            compensation,
            operator_request
        );
        self.reset_failed_steps |= reset_failed_steps;
        self.retry_count_inc |= retry_count_inc;
        self.bump_revision |= bump_revision;
        self
    }

    /// Apply to a document whose guard matched. This is the reference semantics.
    pub fn apply_to(&self, inst: &mut WorkflowInstance) {
        let Transition {
            kinds: _,
            now,
            status,
            steps,
            outputs,
            outputs_unset,
            input,
            claimable_time,
            claim_token,
            wait,
            resume,
            fingerprint_mismatch,
            priority,
            reset_failed_steps,
            retry_count_inc,
            prepare_failures,
            refused_writes,
            finished_at,
            compensation,
            operator_request,
            bump_revision,
        } = self;
        if let Some(p) = compensation {
            p.apply(&mut inst.compensation);
        }
        if let Some(p) = operator_request {
            p.apply(&mut inst.operator_request);
        }
        if let Some(s) = status {
            inst.status = *s;
        }
        if *reset_failed_steps {
            // A new run: the step starts afresh, and keeps its epoch, its record (now of an
            // earlier run, so never replayed) and its history for audit (K-17.3).
            for s in inst.steps.iter_mut().filter(|s| s.status == StepStatus::Failed) {
                let name = std::mem::take(&mut s.name);
                let (epoch, record, history) = (s.epoch, s.record.take(), std::mem::take(&mut s.history));
                *s = Step { epoch, record, history, ..Step::pending(name) };
            }
        }
        for p in steps {
            if let Some(step) = inst.steps.get_mut(p.index as usize) {
                p.apply_to(step);
            }
        }
        for (k, v) in outputs {
            inst.output.insert(k.clone(), v.clone());
        }
        for k in outputs_unset {
            inst.output.remove(k);
        }
        if let Some(i) = input {
            inst.input = i.clone();
        }
        if let Some(p) = claimable_time {
            p.apply(&mut inst.claimable_time);
        }
        if let Some(p) = claim_token {
            p.apply(&mut inst.claim_token);
        }
        if let Some(p) = wait {
            p.apply(&mut inst.wait);
        }
        if let Some(p) = resume {
            p.apply(&mut inst.resume);
        }
        if let Some(m) = fingerprint_mismatch {
            inst.fingerprint_mismatch = Some(m.clone());
        }
        if let Some(p) = priority {
            inst.business_priority = *p;
        }
        if *retry_count_inc {
            inst.retry_count += 1;
        }
        if let Some(n) = prepare_failures {
            inst.prepare_failures = *n;
        }
        if let Some(n) = refused_writes {
            inst.refused_writes = *n;
        }
        if let Some(p) = finished_at {
            p.apply(&mut inst.finished_at);
        }
        if *bump_revision {
            inst.revision += 1;
        }
        inst.updated_at = *now;
    }

    /// The K-2.0 check of everything this write would store (store `apply`): output names
    /// are document keys ([`validate::key_name`]: no `$` prefix, no `.`); a claim token, a
    /// signal wait's `signal_type` and `wait_key` and a resume's `signal_id` follow the
    /// identifier rule; input, each output and each checkpoint are at most
    /// `payload_bytes_max` serialized bytes (adapters pass
    /// [`validate::STORE_PAYLOAD_BYTES_MAX`] or their configured limit). Structurally, a
    /// step is patched at most once and replay's `reset_failed_steps` carries no step patch
    /// (a document store could not express both in one update).
    ///
    /// Every store adapter calls it before writing; a refusal is
    /// [`Error::InvalidInput`] and nothing is written.
    ///
    /// ```
    /// use kernel_core::domain::{DurationMs, Instant};
    /// use kernel_core::transition::Transition;
    /// use kernel_core::validate::STORE_PAYLOAD_BYTES_MAX;
    /// let ok = Transition::complete_step(0, "fetch", serde_json::json!(1), DurationMs::ZERO, Instant::ZERO, false);
    /// assert!(ok.validate(STORE_PAYLOAD_BYTES_MAX).is_ok());
    /// let bad = Transition::complete_step(0, "$set", serde_json::json!(1), DurationMs::ZERO, Instant::ZERO, false);
    /// assert!(bad.validate(STORE_PAYLOAD_BYTES_MAX).is_err());
    /// ```
    pub fn validate(&self, payload_bytes_max: usize) -> Result<()> {
        let Transition {
            kinds: _,
            now: _,
            status: _,
            steps,
            outputs,
            outputs_unset,
            input,
            claimable_time: _,
            claim_token,
            wait,
            resume,
            fingerprint_mismatch: _,
            priority: _,
            reset_failed_steps,
            retry_count_inc: _,
            prepare_failures: _,
            refused_writes: _,
            finished_at: _,
            compensation,
            operator_request,
            bump_revision: _,
        } = self;
        if let Some(Patch::Set(c)) = compensation {
            c.validate()?;
        }
        if let Some(Patch::Set(r)) = operator_request {
            r.validate()?;
        }
        if *reset_failed_steps && !steps.is_empty() {
            // Both could name the same element (`steps.$[f]` and `steps.<i>`), which a
            // document store refuses as a path conflict; no kernel transition needs it.
            return Err(Error::invalid("transition", "reset_failed_steps cannot be combined with step patches"));
        }
        let mut seen = std::collections::BTreeSet::new();
        for p in steps {
            if !seen.insert(p.index) {
                return Err(Error::invalid("transition.steps", format_args!("step {} patched twice", p.index)));
            }
            if let Some(Patch::Set(c)) = &p.checkpoint {
                validate::payload(&format!("steps.{}.checkpoint", p.index), c, payload_bytes_max)?;
            }
            if let Some(Patch::Set(r)) = &p.record {
                r.validate(&format!("steps.{}.record", p.index), payload_bytes_max)?;
            }
            if let Some(Patch::Set(h)) = &p.history {
                let field = format!("steps.{}.history", p.index);
                let v = serde_json::to_value(h).map_err(|e| Error::invalid(&field, e))?;
                validate::payload(&field, &v, payload_bytes_max)?;
            }
        }
        for name in outputs_unset {
            validate::key_name("output", name)?;
            if outputs.iter().any(|(n, _)| n == name) {
                return Err(Error::invalid(
                    "transition.outputs_unset",
                    format_args!("output {name} both set and unset"),
                ));
            }
        }
        for (name, v) in outputs {
            validate::key_name("output", name)?;
            validate::payload(&format!("output.{name}"), v, payload_bytes_max)?;
        }
        if let Some(i) = input {
            validate::payload("input", i, payload_bytes_max)?;
        }
        if let Some(Patch::Set(t)) = claim_token {
            validate::identifier("claim_token", t.as_str())?;
        }
        if let Some(Patch::Set(w)) = wait {
            w.validate()?;
        }
        if let Some(Patch::Set(r)) = resume {
            r.validate()?;
        }
        Ok(())
    }

    /// Stamp every step this write completes with `revision`, the revision the write
    /// produces (K-17.6 amendment: the store-assigned completion order). The claim holder
    /// is the only writer under its token, so the revision its write produces is the
    /// revision it last saw plus one; a write that bumps no revision completes nothing.
    ///
    /// ```
    /// use kernel_core::domain::{DurationMs, Instant};
    /// use kernel_core::transition::{Patch, Transition};
    /// let mut t = Transition::complete_step(2, "post", serde_json::json!(1), DurationMs::ZERO, Instant::ZERO, false);
    /// t.stamp_completions(8);
    /// assert_eq!(t.steps[0].completed_revision, Some(Patch::Set(8)));
    /// ```
    pub fn stamp_completions(&mut self, revision: u64) {
        if !self.bump_revision {
            return;
        }
        for p in self.steps.iter_mut().filter(|p| p.status == Some(StepStatus::Completed)) {
            p.completed_revision = Some(Patch::Set(revision));
        }
    }

    /// Whether any step patch sets `status = completed` (used by harness counters).
    pub fn completed_steps(&self) -> impl Iterator<Item = u32> + '_ {
        self.steps.iter().filter(|p| p.status == Some(StepStatus::Completed)).map(|p| p.index)
    }
}

/// Pure constructors of every transition the kernel performs. Each documents the guard it
/// is written under (K-6.4).
impl Transition {
    /// Claim (K-6.2), under [`Guard::Claimable`]: lease and token, no revision bump.
    ///
    /// A lease end `now + lease_ms` that is not representable is refused as
    /// [`Error::InvalidInput`] on `lease_ms`.
    pub fn claim(token: &ClaimToken, now: Instant, lease_ms: DurationMs) -> Result<Self> {
        let mut t = Transition::new(TransitionKind::Claim, now);
        t.claimable_time = Some(Patch::Set(now.try_add(lease_ms, "lease_ms")?));
        t.claim_token = Some(Patch::Set(token.clone()));
        t.bump_revision = false;
        Ok(t)
    }

    /// Heartbeat (K-6.3), under [`Guard::Token`]: extend the lease, no revision bump.
    ///
    /// An overflowing lease end is refused as [`Error::InvalidInput`] on `lease_ms`.
    pub fn heartbeat(now: Instant, lease_ms: DurationMs) -> Result<Self> {
        let mut t = Transition::new(TransitionKind::Heartbeat, now);
        t.claimable_time = Some(Patch::Set(now.try_add(lease_ms, "lease_ms")?));
        t.bump_revision = false;
        Ok(t)
    }

    /// Mark running (K-7.2), under [`Guard::Running`]: `attempt++`.
    pub fn mark_running(index: usize, now: Instant) -> Self {
        let mut t = Transition::for_step(TransitionKind::MarkRunning, index, now);
        let p = t.step_mut(index);
        p.status = Some(StepStatus::Running);
        p.attempt = Some(AttemptChange::Inc(1));
        p.started_at = Some(now);
        t
    }

    /// CompleteStep (K-7.4), under [`Guard::Running`]: status and output in one update;
    /// clears `resume` when it applied to this step.
    pub fn complete_step(
        index: usize,
        name: &str,
        output: Value,
        elapsed_ms: DurationMs,
        now: Instant,
        clears_resume: bool,
    ) -> Self {
        let mut t = Transition::for_step(TransitionKind::CompleteStep, index, now);
        let p = t.step_mut(index);
        p.status = Some(StepStatus::Completed);
        p.elapsed_ms_inc = elapsed_ms;
        p.finished_at = Some(Patch::Set(now));
        t.outputs.push((name.to_string(), output));
        if clears_resume {
            t.resume = Some(Patch::Unset);
        }
        t
    }

    /// SuspendClaim (K-9.1), under [`Guard::Running`]: one update parks the step and the
    /// workflow, saves the checkpoint, rolls the attempt back and releases the claim.
    pub fn suspend(index: usize, wait: Wait, checkpoint: Option<Value>, elapsed_ms: DurationMs, now: Instant) -> Self {
        let mut t = Transition::for_step(TransitionKind::SuspendClaim, index, now);
        let p = t.step_mut(index);
        p.status = Some(StepStatus::Waiting);
        p.attempt = Some(AttemptChange::Inc(-1));
        p.elapsed_ms_inc = elapsed_ms;
        p.checkpoint = Some(checkpoint_patch(checkpoint));
        t.status = Some(WorkflowStatus::Waiting);
        t.claimable_time = Some(wait.poll_time().map_or(Patch::Unset, Patch::Set));
        t.wait = Some(Patch::Set(wait));
        t.claim_token = Some(Patch::Unset);
        t.resume = Some(Patch::Unset);
        t
    }

    /// Yield (K-7.4), under [`Guard::Running`]: step pending with its checkpoint, attempt
    /// rolled back, claimable now, claim and resume cleared.
    pub fn yield_step(index: usize, checkpoint: Option<Value>, elapsed_ms: DurationMs, now: Instant) -> Self {
        let mut t = Transition::for_step(TransitionKind::Yield, index, now);
        let p = t.step_mut(index);
        p.status = Some(StepStatus::Pending);
        p.attempt = Some(AttemptChange::Inc(-1));
        p.elapsed_ms_inc = elapsed_ms;
        p.checkpoint = Some(checkpoint_patch(checkpoint));
        t.claimable_time = Some(Patch::Set(now));
        t.claim_token = Some(Patch::Unset);
        t.resume = Some(Patch::Unset);
        t
    }

    /// A sibling that also asked to suspend or yield while another outcome won (K-4.5):
    /// pending with its checkpoint, attempt rolled back. Carries no claim change.
    pub fn park_sibling(index: usize, checkpoint: Option<Value>, elapsed_ms: DurationMs, now: Instant) -> Self {
        let mut t = Transition::for_step(TransitionKind::Yield, index, now);
        let p = t.step_mut(index);
        p.status = Some(StepStatus::Pending);
        p.attempt = Some(AttemptChange::Inc(-1));
        p.elapsed_ms_inc = elapsed_ms;
        p.checkpoint = Some(checkpoint_patch(checkpoint));
        t
    }

    /// Step back to pending after a retryable error (no claim change; see [`Self::release_until`]).
    pub fn step_retry(index: usize, error: StepError, elapsed_ms: DurationMs, now: Instant) -> Self {
        let mut t = Transition::for_step(TransitionKind::RetryRelease, index, now);
        let p = t.step_mut(index);
        p.status = Some(StepStatus::Pending);
        p.error = Some(Patch::Set(error));
        p.checkpoint = Some(Patch::Unset);
        p.elapsed_ms_inc = elapsed_ms;
        t
    }

    /// Permit denied (K-7.1): step pending, traffic statistics grow, attempt unchanged.
    pub fn permit_deferral(index: usize, delay_ms: DurationMs, now: Instant) -> Self {
        let mut t = Transition::for_step(TransitionKind::PermitDeferral, index, now);
        let p = t.step_mut(index);
        p.status = Some(StepStatus::Pending);
        p.traffic_wait_ms_inc = delay_ms;
        p.traffic_waits_inc = 1;
        t
    }

    /// Release the claim until `at` (retry release, permit deferral, finalizer error,
    /// shutdown), under the current token guard.
    pub fn release_until(mut self, at: Instant) -> Self {
        self.claimable_time = Some(Patch::Set(at));
        self.claim_token = Some(Patch::Unset);
        self
    }

    /// `on_failed = skip`: step skipped with its error.
    pub fn skip_step(index: usize, error: StepError, elapsed_ms: DurationMs, now: Instant) -> Self {
        let mut t = Transition::for_step(TransitionKind::SkipStep, index, now);
        let p = t.step_mut(index);
        p.status = Some(StepStatus::Skipped);
        p.error = Some(Patch::Set(error));
        p.checkpoint = Some(Patch::Unset);
        p.elapsed_ms_inc = elapsed_ms;
        p.finished_at = Some(Patch::Set(now));
        t
    }

    /// A step failed for good; the workflow goes `failing` in the same write (K-8), under
    /// [`Guard::Running`].
    pub fn step_failed(index: usize, error: StepError, elapsed_ms: DurationMs, now: Instant) -> Self {
        let mut t = Transition::for_step(TransitionKind::StepFailed, index, now);
        let p = t.step_mut(index);
        p.status = Some(StepStatus::Failed);
        p.error = Some(Patch::Set(error));
        p.checkpoint = Some(Patch::Unset);
        p.elapsed_ms_inc = elapsed_ms;
        p.finished_at = Some(Patch::Set(now));
        t.fuse(Transition::failing(now))
    }

    /// `running → failing`, under [`Guard::Running`]; the claim is kept.
    pub fn failing(now: Instant) -> Self {
        let mut t = Transition::new(TransitionKind::Failing, now);
        t.status = Some(WorkflowStatus::Failing);
        t
    }

    /// `failing → failed`, under [`Guard::Failing`].
    pub fn failed(now: Instant) -> Self {
        Transition::terminal(TransitionKind::Failed, WorkflowStatus::Failed, now)
    }

    /// [`failed`](Self::failed) with the compensation's report (K-17.6), under
    /// [`Guard::Failing`]: the steps in `undone` (those whose inverse completed) become
    /// failed with a permanent error saying so, so a replay runs them again — their effect
    /// was undone — instead of taking their outputs as still true.
    pub fn failed_compensated(now: Instant, report: crate::compensation::CompensationReport, undone: &[usize]) -> Self {
        let mut t = Transition::failed(now);
        t.compensation = Some(Patch::Set(report));
        for &i in undone {
            let p = t.step_mut(i);
            p.status = Some(StepStatus::Failed);
            p.error = Some(Patch::Set(StepError {
                class: ErrorClass::Permanent,
                message: "compensated: undone by its inverse".to_string(),
            }));
        }
        t
    }

    /// `running → completed`, under [`Guard::Running`].
    pub fn completed(now: Instant) -> Self {
        Transition::terminal(TransitionKind::Completed, WorkflowStatus::Completed, now)
    }

    /// The activity reported cancellation (K-7.4): step skipped, workflow canceled, claim
    /// cleared, no finalizer, under [`Guard::Running`].
    pub fn activity_canceled(index: usize, error: StepError, elapsed_ms: DurationMs, now: Instant) -> Self {
        let mut t = Transition::for_step(TransitionKind::Canceled, index, now);
        let p = t.step_mut(index);
        p.status = Some(StepStatus::Skipped);
        p.error = Some(Patch::Set(error));
        p.elapsed_ms_inc = elapsed_ms;
        p.finished_at = Some(Patch::Set(now));
        let mut term = Transition::terminal(TransitionKind::Canceled, WorkflowStatus::Canceled, now);
        term.kinds.clear();
        t.fuse(term)
    }

    /// Record an operator's request for the holder of the live claim (K-6.8), under
    /// [`Guard::Token`] with the holder's token: the request is set and `token` replaces
    /// the holder's claim token, so the holder's next guarded write misses; the lease
    /// (`claimable_time`) is left as it is.
    pub fn operator_request(
        request: crate::operator_request::OperatorRequest,
        token: ClaimToken,
        now: Instant,
    ) -> Self {
        let mut t = Transition::new(TransitionKind::OperatorRequest, now);
        t.operator_request = Some(Patch::Set(request));
        t.claim_token = Some(Patch::Set(token));
        t
    }

    /// Apply an operator's request (K-6.8), under [`Guard::Token`] with the current token:
    /// `action` is the action's own write (a supersede, a regenerate), or `None` when it no
    /// longer applies, which releases the claim at once. The request and the claim token
    /// are cleared either way.
    pub fn request_applied(action: Option<Transition>, now: Instant) -> Self {
        let mut t = Transition::new(TransitionKind::RequestApplied, now);
        t.operator_request = Some(Patch::Unset);
        t.claim_token = Some(Patch::Unset);
        match action {
            Some(a) => t.fuse(a),
            None => {
                t.claimable_time = Some(Patch::Set(now));
                t
            }
        }
    }

    /// Explicit cancel / supersede (K-8): under [`Guard::Operator`] when no claim holds
    /// the instance, else applied by the claim through [`Transition::request_applied`].
    pub fn supersede(now: Instant) -> Self {
        Transition::terminal(TransitionKind::Supersede, WorkflowStatus::Canceled, now)
    }

    fn terminal(kind: TransitionKind, status: WorkflowStatus, now: Instant) -> Self {
        let mut t = Transition::new(kind, now);
        t.status = Some(status);
        t.claim_token = Some(Patch::Unset);
        t.claimable_time = Some(Patch::Unset);
        t.wait = Some(Patch::Unset);
        t.resume = Some(Patch::Unset);
        t.finished_at = Some(Patch::Set(now));
        t
    }

    /// A finalizer failed: release with a delay (K-8), under the current token guard.
    ///
    /// An overflowing release time is refused as [`Error::InvalidInput`] on `delay_ms`.
    pub fn finalizer_release(now: Instant, delay_ms: DurationMs) -> Result<Self> {
        Ok(Transition::new(TransitionKind::FinalizerRelease, now).release_until(now.try_add(delay_ms, "delay_ms")?))
    }

    /// Hand a failing claim back until `until` with the compensation's progress recorded
    /// (K-17.6 amendment), under [`Guard::Failing`]: the entries so far and when it goes on
    /// (an [`InProgress`](crate::compensation::CompensationOutcome::InProgress) report), or
    /// the finished report while the failure finalizer is retried.
    pub fn compensation_release(report: crate::compensation::CompensationReport, until: Instant, now: Instant) -> Self {
        let mut t = Transition::new(TransitionKind::CompensationRelease, now).release_until(until);
        t.compensation = Some(Patch::Set(report));
        t
    }

    /// Record the compensation's progress before an inverse's attempt (K-17.6 amendment),
    /// under [`Guard::Failing`]: an [`InProgress`](crate::compensation::CompensationOutcome::InProgress)
    /// report whose last entry is the attempt now starting; the claim goes on.
    pub fn compensation_progress(report: crate::compensation::CompensationReport, now: Instant) -> Self {
        let mut t = Transition::new(TransitionKind::CompensationProgress, now);
        t.compensation = Some(Patch::Set(report));
        t
    }

    /// A failed PrepareContext (K-2.3), under the status guard of the claim: the failure
    /// count set to `failures`, the claim released until `now + delay_ms`.
    ///
    /// An overflowing release time is refused as [`Error::InvalidInput`] on `delay_ms`.
    pub fn prepare_release(failures: u32, now: Instant, delay_ms: DurationMs) -> Result<Self> {
        let mut t =
            Transition::new(TransitionKind::PrepareRelease, now).release_until(now.try_add(delay_ms, "delay_ms")?);
        t.prepare_failures = Some(failures);
        Ok(t)
    }

    /// Give the claim back without progress (shutdown between waves).
    pub fn release(now: Instant) -> Self {
        Transition::new(TransitionKind::Release, now).release_until(now)
    }

    /// Give the claim back without progress, claimable again at `now + delay_ms` (a write
    /// the store could not take: nothing was written, the step runs again later).
    ///
    /// An overflowing release time is refused as [`Error::InvalidInput`] on `delay_ms`.
    pub fn release_after(now: Instant, delay_ms: DurationMs) -> Result<Self> {
        Ok(Transition::new(TransitionKind::Release, now).release_until(now.try_add(delay_ms, "delay_ms")?))
    }

    /// Give the claim back after a plain write the store refused (K-6.4), claimable again
    /// at `now + delay_ms`, with the run's count of refused writes set to `refused`.
    ///
    /// An overflowing release time is refused as [`Error::InvalidInput`] on `delay_ms`.
    pub fn refused_release(refused: u32, now: Instant, delay_ms: DurationMs) -> Result<Self> {
        let mut t = Transition::release_after(now, delay_ms)?;
        t.refused_writes = Some(refused);
        Ok(t)
    }

    /// Fingerprint push-back (K-4.3), under [`Guard::Token`]: no step touched.
    ///
    /// An overflowing release time is refused as [`Error::InvalidInput`] on `delay_ms`.
    pub fn fingerprint_push_back(persisted: &str, worker: &str, now: Instant, delay_ms: DurationMs) -> Result<Self> {
        let mut t =
            Transition::new(TransitionKind::FingerprintPushBack, now).release_until(now.try_add(delay_ms, "delay_ms")?);
        t.fingerprint_mismatch =
            Some(FingerprintMismatch { persisted: persisted.to_string(), worker: worker.to_string() });
        Ok(t)
    }

    /// Timer / poll activation (K-9.2), under [`Guard::DueWait`]: `claimable_time` kept.
    pub fn timer_activation(index: usize, kind: ResumeKind, now: Instant) -> Self {
        let mut t = Transition::for_step(TransitionKind::TimerActivation, index, now);
        t.step_mut(index).status = Some(StepStatus::Pending);
        t.status = Some(WorkflowStatus::Running);
        t.wait = Some(Patch::Unset);
        t.claim_token = Some(Patch::Unset);
        t.resume = Some(Patch::Set(Resume { kind, step_index: index as u32, signal_id: None }));
        t
    }

    /// Signal activation (K-9.3), under [`Guard::SignalWait`]: claimable now.
    pub fn signal_activation(index: usize, signal_id: &str, now: Instant) -> Self {
        let mut t = Transition::for_step(TransitionKind::SignalActivation, index, now);
        t.step_mut(index).status = Some(StepStatus::Pending);
        t.status = Some(WorkflowStatus::Running);
        t.wait = Some(Patch::Unset);
        t.claim_token = Some(Patch::Unset);
        t.claimable_time = Some(Patch::Set(now));
        t.resume = Some(Patch::Set(Resume {
            kind: ResumeKind::Signal,
            step_index: index as u32,
            signal_id: Some(signal_id.to_string()),
        }));
        t
    }

    /// Replay of a failed instance (K-5), under [`Guard::Failed`] (built by
    /// [`Guard::replay`]).
    pub fn replay(input: Value, now: Instant) -> Self {
        let mut t = Transition::new(TransitionKind::Replay, now);
        t.status = Some(WorkflowStatus::Running);
        t.input = Some(input);
        t.retry_count_inc = true;
        t.prepare_failures = Some(0);
        t.refused_writes = Some(0);
        t.claimable_time = Some(Patch::Set(now));
        t.claim_token = Some(Patch::Unset);
        t.finished_at = Some(Patch::Unset);
        t.compensation = Some(Patch::Unset);
        t.resume = Some(Patch::Unset);
        t.wait = Some(Patch::Unset);
        t.reset_failed_steps = true;
        t
    }

    /// Priority raise (promote-only), under [`Guard::PriorityBelow`].
    pub fn priority_raise(p: Priority, now: Instant) -> Self {
        let mut t = Transition::new(TransitionKind::PriorityRaise, now);
        t.priority = Some(p);
        t
    }

    /// A step recorded a fact (K-17.3), under [`Guard::Running`]: the step's record set to
    /// `record` (its logical attempt's entries so far); `history`, when given, replaces the
    /// step's history (a record of an earlier attempt moved there, bounded by the writer).
    /// No claim change.
    pub fn record_step(index: usize, record: StepRecord, history: Option<Vec<HistoryEntry>>, now: Instant) -> Self {
        let mut t = Transition::for_step(TransitionKind::RecordStep, index, now);
        let p = t.step_mut(index);
        p.record = Some(Patch::Set(record));
        p.history = history.map(Patch::Set);
        t
    }

    /// The first retryable failure of a logical attempt is remembered on the step
    /// (`max_retry_duration` counts from it): added to a retry release.
    pub fn retrying_since(mut self, index: usize, at: Instant) -> Self {
        self.step_mut(index).retrying_since = Some(Patch::Set(at));
        self
    }

    /// Dead letter (K-17.2), under [`Guard::Running`]: the step waits with its error kept
    /// (its attempts were real: the counter stays), the workflow waits on the operator
    /// signal `wait`, the claim is released. No new status, no worker held.
    pub fn dead_letter(index: usize, wait: Wait, error: StepError, elapsed_ms: DurationMs, now: Instant) -> Self {
        let mut t = Transition::for_step(TransitionKind::DeadLetter, index, now);
        let p = t.step_mut(index);
        p.status = Some(StepStatus::Waiting);
        p.error = Some(Patch::Set(error));
        p.elapsed_ms_inc = elapsed_ms;
        t.status = Some(WorkflowStatus::Waiting);
        t.claimable_time = Some(match wait.poll_time() {
            Some(at) => Patch::Set(at),
            None => Patch::Unset,
        });
        t.wait = Some(Patch::Set(wait));
        t.claim_token = Some(Patch::Unset);
        t.resume = Some(Patch::Unset);
        t
    }

    /// A parked step (K-17.4, `ErrorClass::Parked`), under [`Guard::Running`]: pending with
    /// its reason, the attempt rolled back and the checkpoint kept (it was not a failure);
    /// combine with [`release_until`](Self::release_until).
    pub fn park_step(index: usize, error: StepError, elapsed_ms: DurationMs, now: Instant) -> Self {
        let mut t = Transition::for_step(TransitionKind::RetryRelease, index, now);
        let p = t.step_mut(index);
        p.status = Some(StepStatus::Pending);
        p.attempt = Some(AttemptChange::Inc(-1));
        p.error = Some(Patch::Set(error));
        p.elapsed_ms_inc = elapsed_ms;
        t
    }

    /// A step dead-lettered in the same wave as another (K-17.2), under
    /// [`Guard::Running`]: pending with its (permanent) error, no wait of its own — the
    /// instance waits on the other's; its own dead letter is applied at the next claim.
    pub fn dead_letter_sibling(index: usize, error: StepError, elapsed_ms: DurationMs, now: Instant) -> Self {
        let mut t = Transition::for_step(TransitionKind::DeadLetter, index, now);
        let p = t.step_mut(index);
        p.status = Some(StepStatus::Pending);
        p.error = Some(Patch::Set(error));
        p.elapsed_ms_inc = elapsed_ms;
        t
    }

    /// The next logical attempt of one step (an operator's dead-letter retry, K-17.2),
    /// under [`Guard::Running`]: epoch set, the step pending and fresh (attempt, error,
    /// checkpoint, record, retry start and finish time cleared), `history` (the superseded
    /// attempt appended by the writer, bounded) stored.
    pub fn step_epoch(index: usize, epoch: u32, history: Vec<HistoryEntry>, now: Instant) -> Self {
        let mut t = Transition::for_step(TransitionKind::StepEpoch, index, now);
        t.step_mut(index).fresh_attempt(epoch, history);
        t.resume = Some(Patch::Unset);
        t
    }

    /// Regenerate (K-17.3), under [`Guard::Operator`]: each of `resets` — the regenerated
    /// step and every step that depends on it and has run — starts its next logical attempt
    /// ([`StepPatch::fresh_attempt`] with the given epoch and history) and loses its output;
    /// the claim token is cleared (a worker holding a claim loses it). `wake`: the instance
    /// becomes running and claimable now, its wait and resume cleared (it was running, or it
    /// waited in one of the reset steps); otherwise it keeps waiting and the reset steps run
    /// once its wait ends.
    pub fn regenerate(
        resets: Vec<(usize, u32, Vec<HistoryEntry>)>,
        outputs_unset: Vec<String>,
        wake: bool,
        now: Instant,
    ) -> Self {
        let first = resets.first().map(|r| r.0).unwrap_or(0);
        let mut t = Transition::for_step(TransitionKind::Regenerate, first, now);
        for (index, epoch, history) in resets {
            t.step_mut(index).fresh_attempt(epoch, history);
        }
        t.outputs_unset = outputs_unset;
        t.claim_token = Some(Patch::Unset);
        if wake {
            t.status = Some(WorkflowStatus::Running);
            t.claimable_time = Some(Patch::Set(now));
            t.wait = Some(Patch::Unset);
            t.resume = Some(Patch::Unset);
        }
        t
    }
}

impl Transition {
    /// A loop's back-edge taken (K-4 amendment), under [`Guard::Running`]: each of `resets`
    /// — the loop's target and every step that depends on it and has run, the sender among
    /// them — starts its next logical attempt ([`StepPatch::fresh_attempt`] with the given
    /// epoch and history, the iteration counter set as given) and loses its output; the
    /// resume is cleared when it belongs to a reset step (`clear_resume`). `sender` is the
    /// step whose loop was taken (the observation names it).
    pub fn loop_back(
        sender: usize,
        resets: Vec<(usize, u32, Vec<HistoryEntry>, Option<u32>)>,
        outputs_unset: Vec<String>,
        clear_resume: bool,
        now: Instant,
    ) -> Self {
        let mut t = Transition::for_step(TransitionKind::LoopBack, sender, now);
        for (index, epoch, history, iterations) in resets {
            let p = t.step_mut(index);
            p.fresh_attempt(epoch, history);
            p.iterations = iterations;
        }
        t.outputs_unset = outputs_unset;
        if clear_resume {
            t.resume = Some(Patch::Unset);
        }
        t
    }

    /// Steps whose branch predicate did not hold (K-4 amendment), under
    /// [`Guard::Running`]: each skipped without an error, its finish time set.
    pub fn branch_skip(indices: &[usize], now: Instant) -> Self {
        let mut t = Transition::for_step(TransitionKind::BranchSkip, indices.first().copied().unwrap_or(0), now);
        for &index in indices {
            let p = t.step_mut(index);
            p.status = Some(StepStatus::Skipped);
            p.error = Some(Patch::Unset);
            p.finished_at = Some(Patch::Set(now));
        }
        t
    }
}

impl StepPatch {
    /// A new logical attempt of the step (K-17.1): epoch set, pending, attempt reset, error,
    /// checkpoint, record, retry start and finish time cleared, `history` stored.
    pub fn fresh_attempt(&mut self, epoch: u32, history: Vec<HistoryEntry>) {
        self.status = Some(StepStatus::Pending);
        self.attempt = Some(AttemptChange::Reset);
        self.error = Some(Patch::Unset);
        self.checkpoint = Some(Patch::Unset);
        self.finished_at = Some(Patch::Unset);
        self.epoch = Some(epoch);
        self.record = Some(Patch::Unset);
        self.history = Some(if history.is_empty() { Patch::Unset } else { Patch::Set(history) });
        self.retrying_since = Some(Patch::Unset);
    }
}

/// A step's checkpoint as saved: `None` and JSON `null` both clear it. A stored document
/// cannot tell the two apart (a `null` field reads back as no checkpoint on every durable
/// store), so the in-memory store must not either.
fn checkpoint_patch(checkpoint: Option<Value>) -> Patch<Value> {
    match checkpoint {
        None | Some(Value::Null) => Patch::Unset,
        Some(v) => Patch::Set(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_refuse_an_overflowing_due_time() {
        // K-6.2, K-6.3, K-8, K-4.3: a lease end or release time past the range of time is
        // bad input, never a wrapped time.
        let now = Instant::from_millis(1_700_000_000_000);
        let field = |r: Result<Transition>| match r {
            Err(Error::InvalidInput { field, .. }) => field,
            other => panic!("expected InvalidInput, got {other:?}"),
        };
        assert_eq!(field(Transition::claim(&"tok".into(), now, DurationMs::MAX)), "lease_ms");
        assert_eq!(field(Transition::heartbeat(now, DurationMs::MAX)), "lease_ms");
        assert_eq!(field(Transition::finalizer_release(now, DurationMs::MAX)), "delay_ms");
        assert_eq!(field(Transition::fingerprint_push_back("a", "b", now, DurationMs::MAX)), "delay_ms");
        let t = Transition::claim(&"tok".into(), now, DurationMs::from_secs(30)).unwrap();
        assert_eq!(t.claimable_time, Some(Patch::Set(Instant::from_millis(1_700_000_030_000))));
        let t = Transition::finalizer_release(Instant::MAX, DurationMs::ZERO).unwrap();
        assert_eq!(t.claimable_time, Some(Patch::Set(Instant::MAX)));
    }
}
