//! Guards and transitions: every write to an instance, declared as data (sans-IO).
//!
//! A store adapter receives a [`Guard`] (the condition of K-6.4) and a [`Transition`] (the
//! typed update) and must apply them as **one atomic conditional update**. The pure
//! [`Guard::matches`] and [`Transition::apply_to`] define the semantics: the in-memory store
//! uses them directly, the engine uses them to keep its local copy in step with the store,
//! and the conformance suite checks every other adapter against them.

use crate::model::*;
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
        now: Millis,
        /// Types the worker has definitions for.
        types: Vec<String>,
    },
    /// `status = running AND claim_token = token`.
    Running {
        /// The current claim.
        token: String,
    },
    /// `status = failing AND claim_token = token`.
    Failing {
        /// The current claim.
        token: String,
    },
    /// `claim_token = token` alone (heartbeat, fingerprint push-back).
    Token {
        /// The current claim.
        token: String,
    },
    /// `status = failed` (replay, K-5).
    Failed,
    /// Timer activation (K-9.2): `status = waiting AND claimable_time ≤ now AND wait.step_index = i`.
    DueWait {
        /// The caller's clock.
        now: Millis,
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
}

impl Guard {
    /// Whether this guard needs the current claim token.
    pub fn is_token_guard(&self) -> bool {
        matches!(self, Guard::Running { .. } | Guard::Failing { .. } | Guard::Token { .. })
    }

    /// The reference semantics of the condition.
    pub fn matches(&self, inst: &WorkflowInstance) -> bool {
        use WorkflowStatus as S;
        let token_is = |t: &str| inst.claim_token.as_deref() == Some(t);
        match self {
            Guard::Claimable { now, types } => {
                matches!(inst.status, S::Running | S::Failing)
                    && inst.claimable_time.is_some_and(|c| c <= *now)
                    && types.contains(&inst.workflow_type)
            }
            Guard::Running { token } => inst.status == S::Running && token_is(token),
            Guard::Failing { token } => inst.status == S::Failing && token_is(token),
            Guard::Token { token } => token_is(token),
            Guard::Failed => inst.status == S::Failed,
            Guard::DueWait { now, step_index } => {
                inst.status == S::Waiting
                    && inst.claimable_time.is_some_and(|c| c <= *now)
                    && inst.wait.as_ref().is_some_and(|w| w.step_index == *step_index)
            }
            Guard::SignalWait(id) => {
                inst.status == S::Waiting && inst.wait.as_ref().and_then(Wait::signal_identity).as_ref() == Some(id)
            }
            Guard::Active => matches!(inst.status, S::Running | S::Waiting | S::Failing),
            Guard::PriorityBelow(p) => !inst.status.is_terminal() && p.is_higher_than(inst.business_priority),
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
    /// Claim released without progress (shutdown drain of a pending wave).
    Release,
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
    /// Index in `steps`.
    pub index: u32,
    /// New status.
    pub status: Option<StepStatus>,
    /// Attempt change.
    pub attempt: Option<AttemptChange>,
    /// Error set / cleared.
    pub error: Option<Patch<StepError>>,
    /// Checkpoint set / cleared.
    pub checkpoint: Option<Patch<Value>>,
    /// Added to `elapsed_ms`.
    pub elapsed_ms_inc: i64,
    /// Added to `traffic_wait_ms`.
    pub traffic_wait_ms_inc: i64,
    /// Added to `traffic_waits`.
    pub traffic_waits_inc: u32,
    /// New `started_at`.
    pub started_at: Option<Millis>,
    /// `finished_at` set / cleared.
    pub finished_at: Option<Patch<Millis>>,
}

impl StepPatch {
    /// An empty patch of step `index`.
    pub fn at(index: usize) -> Self {
        StepPatch { index: index as u32, ..Default::default() }
    }

    fn merge(&mut self, o: &StepPatch) {
        if o.status.is_some() {
            self.status = o.status;
        }
        self.attempt = match (self.attempt, o.attempt) {
            (Some(AttemptChange::Inc(a)), Some(AttemptChange::Inc(b))) => Some(AttemptChange::Inc(a + b)),
            (a, None) => a,
            (_, b) => b,
        };
        if o.error.is_some() {
            self.error = o.error.clone();
        }
        if o.checkpoint.is_some() {
            self.checkpoint = o.checkpoint.clone();
        }
        self.elapsed_ms_inc += o.elapsed_ms_inc;
        self.traffic_wait_ms_inc += o.traffic_wait_ms_inc;
        self.traffic_waits_inc += o.traffic_waits_inc;
        if o.started_at.is_some() {
            self.started_at = o.started_at;
        }
        if o.finished_at.is_some() {
            self.finished_at = o.finished_at.clone();
        }
    }

    fn apply_to(&self, step: &mut Step) {
        if let Some(s) = self.status {
            step.status = s;
        }
        match self.attempt {
            Some(AttemptChange::Inc(d)) => step.attempt = (step.attempt as i64 + d as i64).max(0) as u32,
            Some(AttemptChange::Reset) => step.attempt = 0,
            None => {}
        }
        if let Some(p) = &self.error {
            p.apply(&mut step.error);
        }
        if let Some(p) = &self.checkpoint {
            p.apply(&mut step.checkpoint);
        }
        step.elapsed_ms += self.elapsed_ms_inc;
        step.traffic_wait_ms += self.traffic_wait_ms_inc;
        step.traffic_waits += self.traffic_waits_inc;
        if let Some(t) = self.started_at {
            step.started_at = Some(t);
        }
        if let Some(p) = &self.finished_at {
            p.apply(&mut step.finished_at);
        }
    }
}

/// One atomic update of an instance. `revision` is `$inc`-ed (never a guard) when
/// `bump_revision` is set; `updated_at = now` always.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Transition {
    /// The logical transitions this write carries (several when fused, K-7.1).
    pub kinds: Vec<TransitionKind>,
    /// The step each entry of `kinds` concerns (same length as `kinds`).
    pub kind_steps: Vec<Option<u32>>,
    /// The writer's clock (`updated_at`).
    pub now: Millis,
    /// New top-level status.
    pub status: Option<WorkflowStatus>,
    /// Per-step updates (distinct indices).
    pub steps: Vec<StepPatch>,
    /// `output.<name> = value`, never the whole map (K-4.4).
    pub outputs: Vec<(String, Value)>,
    /// Input replaced wholesale (replay).
    pub input: Option<Value>,
    /// `claimable_time`.
    pub claimable_time: Option<Patch<Millis>>,
    /// `claim_token`.
    pub claim_token: Option<Patch<String>>,
    /// `wait`.
    pub wait: Option<Patch<Wait>>,
    /// `resume`.
    pub resume: Option<Patch<Resume>>,
    /// Both fingerprints (push-back).
    pub fingerprint_mismatch: Option<FingerprintMismatch>,
    /// New `business_priority`.
    pub priority: Option<Priority>,
    /// Replay: every failed step → pending with attempt, error, elapsed, traffic statistics
    /// and checkpoint cleared (Mongo: `arrayFilters`).
    pub reset_failed_steps: bool,
    /// `retry_count += 1`.
    pub retry_count_inc: bool,
    /// `finished_at`.
    pub finished_at: Option<Patch<Millis>>,
    /// `revision += 1` (every accepted write but claim and heartbeat, K-2.2).
    pub bump_revision: bool,
}

impl Transition {
    /// An empty transition of one kind.
    pub fn new(kind: TransitionKind, now: Millis) -> Self {
        Transition { kinds: vec![kind], kind_steps: vec![None], now, bump_revision: true, ..Default::default() }
    }

    /// An empty transition of one kind concerning step `index`.
    pub fn for_step(kind: TransitionKind, index: usize, now: Millis) -> Self {
        Transition {
            kinds: vec![kind],
            kind_steps: vec![Some(index as u32)],
            now,
            bump_revision: true,
            ..Default::default()
        }
    }

    /// The first (primary) kind.
    pub fn kind(&self) -> TransitionKind {
        self.kinds.first().copied().unwrap_or(TransitionKind::Release)
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
        self.kinds.extend(next.kinds);
        self.kind_steps.extend(next.kind_steps);
        self.now = self.now.max(next.now);
        if next.status.is_some() {
            self.status = next.status;
        }
        for p in &next.steps {
            self.step_mut(p.index as usize).merge(p);
        }
        for (k, v) in next.outputs {
            self.outputs.retain(|(n, _)| *n != k);
            self.outputs.push((k, v));
        }
        macro_rules! take {
            ($($f:ident),*) => {$( if next.$f.is_some() { self.$f = next.$f; } )*};
        }
        take!(input, claimable_time, claim_token, wait, resume, fingerprint_mismatch, priority, finished_at);
        self.reset_failed_steps |= next.reset_failed_steps;
        self.retry_count_inc |= next.retry_count_inc;
        self.bump_revision |= next.bump_revision;
        self
    }

    /// Apply to a document whose guard matched. This is the reference semantics.
    pub fn apply_to(&self, inst: &mut WorkflowInstance) {
        if let Some(s) = self.status {
            inst.status = s;
        }
        if self.reset_failed_steps {
            for s in inst.steps.iter_mut().filter(|s| s.status == StepStatus::Failed) {
                let name = std::mem::take(&mut s.name);
                *s = Step::pending(name);
            }
        }
        for p in &self.steps {
            if let Some(step) = inst.steps.get_mut(p.index as usize) {
                p.apply_to(step);
            }
        }
        for (k, v) in &self.outputs {
            inst.output.insert(k.clone(), v.clone());
        }
        if let Some(i) = &self.input {
            inst.input = i.clone();
        }
        if let Some(p) = &self.claimable_time {
            p.apply(&mut inst.claimable_time);
        }
        if let Some(p) = &self.claim_token {
            p.apply(&mut inst.claim_token);
        }
        if let Some(p) = &self.wait {
            p.apply(&mut inst.wait);
        }
        if let Some(p) = &self.resume {
            p.apply(&mut inst.resume);
        }
        if let Some(m) = &self.fingerprint_mismatch {
            inst.fingerprint_mismatch = Some(m.clone());
        }
        if let Some(p) = self.priority {
            inst.business_priority = p;
        }
        if self.retry_count_inc {
            inst.retry_count += 1;
        }
        if let Some(p) = &self.finished_at {
            p.apply(&mut inst.finished_at);
        }
        if self.bump_revision {
            inst.revision += 1;
        }
        inst.updated_at = self.now;
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
    pub fn claim(token: &str, now: Millis, lease_ms: Millis) -> Self {
        let mut t = Transition::new(TransitionKind::Claim, now);
        t.claimable_time = Some(Patch::Set(now + lease_ms));
        t.claim_token = Some(Patch::Set(token.to_string()));
        t.bump_revision = false;
        t
    }

    /// Heartbeat (K-6.3), under [`Guard::Token`]: extend the lease, no revision bump.
    pub fn heartbeat(now: Millis, lease_ms: Millis) -> Self {
        let mut t = Transition::new(TransitionKind::Heartbeat, now);
        t.claimable_time = Some(Patch::Set(now + lease_ms));
        t.bump_revision = false;
        t
    }

    /// Mark running (K-7.2), under [`Guard::Running`]: `attempt++`.
    pub fn mark_running(index: usize, now: Millis) -> Self {
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
        elapsed_ms: i64,
        now: Millis,
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
    pub fn suspend(index: usize, wait: Wait, checkpoint: Option<Value>, elapsed_ms: i64, now: Millis) -> Self {
        let mut t = Transition::for_step(TransitionKind::SuspendClaim, index, now);
        let p = t.step_mut(index);
        p.status = Some(StepStatus::Waiting);
        p.attempt = Some(AttemptChange::Inc(-1));
        p.elapsed_ms_inc = elapsed_ms;
        p.checkpoint = Some(checkpoint.map_or(Patch::Unset, Patch::Set));
        t.status = Some(WorkflowStatus::Waiting);
        t.claimable_time = Some(wait.poll_time.map_or(Patch::Unset, Patch::Set));
        t.wait = Some(Patch::Set(wait));
        t.claim_token = Some(Patch::Unset);
        t.resume = Some(Patch::Unset);
        t
    }

    /// Yield (K-7.4), under [`Guard::Running`]: step pending with its checkpoint, attempt
    /// rolled back, claimable now, claim and resume cleared.
    pub fn yield_step(index: usize, checkpoint: Option<Value>, elapsed_ms: i64, now: Millis) -> Self {
        let mut t = Transition::for_step(TransitionKind::Yield, index, now);
        let p = t.step_mut(index);
        p.status = Some(StepStatus::Pending);
        p.attempt = Some(AttemptChange::Inc(-1));
        p.elapsed_ms_inc = elapsed_ms;
        p.checkpoint = Some(checkpoint.map_or(Patch::Unset, Patch::Set));
        t.claimable_time = Some(Patch::Set(now));
        t.claim_token = Some(Patch::Unset);
        t.resume = Some(Patch::Unset);
        t
    }

    /// A sibling that also asked to suspend or yield while another outcome won (K-4.5):
    /// pending with its checkpoint, attempt rolled back. Carries no claim change.
    pub fn park_sibling(index: usize, checkpoint: Option<Value>, elapsed_ms: i64, now: Millis) -> Self {
        let mut t = Transition::for_step(TransitionKind::Yield, index, now);
        let p = t.step_mut(index);
        p.status = Some(StepStatus::Pending);
        p.attempt = Some(AttemptChange::Inc(-1));
        p.elapsed_ms_inc = elapsed_ms;
        p.checkpoint = Some(checkpoint.map_or(Patch::Unset, Patch::Set));
        t
    }

    /// Step back to pending after a retryable error (no claim change; see [`Self::release_until`]).
    pub fn step_retry(index: usize, error: StepError, elapsed_ms: i64, now: Millis) -> Self {
        let mut t = Transition::for_step(TransitionKind::RetryRelease, index, now);
        let p = t.step_mut(index);
        p.status = Some(StepStatus::Pending);
        p.error = Some(Patch::Set(error));
        p.checkpoint = Some(Patch::Unset);
        p.elapsed_ms_inc = elapsed_ms;
        t
    }

    /// Permit denied (K-7.1): step pending, traffic statistics grow, attempt unchanged.
    pub fn permit_deferral(index: usize, delay_ms: Millis, now: Millis) -> Self {
        let mut t = Transition::for_step(TransitionKind::PermitDeferral, index, now);
        let p = t.step_mut(index);
        p.status = Some(StepStatus::Pending);
        p.traffic_wait_ms_inc = delay_ms;
        p.traffic_waits_inc = 1;
        t
    }

    /// Release the claim until `at` (retry release, permit deferral, finalizer error,
    /// shutdown), under the current token guard.
    pub fn release_until(mut self, at: Millis) -> Self {
        self.claimable_time = Some(Patch::Set(at));
        self.claim_token = Some(Patch::Unset);
        self
    }

    /// `on_failed = skip`: step skipped with its error.
    pub fn skip_step(index: usize, error: StepError, elapsed_ms: i64, now: Millis) -> Self {
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
    pub fn step_failed(index: usize, error: StepError, elapsed_ms: i64, now: Millis) -> Self {
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
    pub fn failing(now: Millis) -> Self {
        let mut t = Transition::new(TransitionKind::Failing, now);
        t.status = Some(WorkflowStatus::Failing);
        t
    }

    /// `failing → failed`, under [`Guard::Failing`].
    pub fn failed(now: Millis) -> Self {
        Transition::terminal(TransitionKind::Failed, WorkflowStatus::Failed, now)
    }

    /// `running → completed`, under [`Guard::Running`].
    pub fn completed(now: Millis) -> Self {
        Transition::terminal(TransitionKind::Completed, WorkflowStatus::Completed, now)
    }

    /// The activity reported cancellation (K-7.4): step skipped, workflow canceled, claim
    /// cleared, no finalizer, under [`Guard::Running`].
    pub fn activity_canceled(index: usize, error: StepError, elapsed_ms: i64, now: Millis) -> Self {
        let mut t = Transition::for_step(TransitionKind::Canceled, index, now);
        let p = t.step_mut(index);
        p.status = Some(StepStatus::Skipped);
        p.error = Some(Patch::Set(error));
        p.elapsed_ms_inc = elapsed_ms;
        p.finished_at = Some(Patch::Set(now));
        let mut term = Transition::terminal(TransitionKind::Canceled, WorkflowStatus::Canceled, now);
        term.kinds.clear();
        term.kind_steps.clear();
        t.fuse(term)
    }

    /// Explicit cancel / supersede (K-8), under [`Guard::Active`]; no token needed.
    pub fn supersede(now: Millis) -> Self {
        Transition::terminal(TransitionKind::Supersede, WorkflowStatus::Canceled, now)
    }

    fn terminal(kind: TransitionKind, status: WorkflowStatus, now: Millis) -> Self {
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
    pub fn finalizer_release(now: Millis, delay_ms: Millis) -> Self {
        Transition::new(TransitionKind::FinalizerRelease, now).release_until(now + delay_ms)
    }

    /// Give the claim back without progress (shutdown between waves).
    pub fn release(now: Millis) -> Self {
        Transition::new(TransitionKind::Release, now).release_until(now)
    }

    /// Fingerprint push-back (K-4.3), under [`Guard::Token`]: no step touched.
    pub fn fingerprint_push_back(persisted: &str, worker: &str, now: Millis, delay_ms: Millis) -> Self {
        let mut t = Transition::new(TransitionKind::FingerprintPushBack, now).release_until(now + delay_ms);
        t.fingerprint_mismatch =
            Some(FingerprintMismatch { persisted: persisted.to_string(), worker: worker.to_string() });
        t
    }

    /// Timer / poll activation (K-9.2), under [`Guard::DueWait`]: `claimable_time` kept.
    pub fn timer_activation(index: usize, kind: ResumeKind, now: Millis) -> Self {
        let mut t = Transition::for_step(TransitionKind::TimerActivation, index, now);
        t.step_mut(index).status = Some(StepStatus::Pending);
        t.status = Some(WorkflowStatus::Running);
        t.wait = Some(Patch::Unset);
        t.claim_token = Some(Patch::Unset);
        t.resume = Some(Patch::Set(Resume { kind, step_index: index as u32, signal_id: None }));
        t
    }

    /// Signal activation (K-9.3), under [`Guard::SignalWait`]: claimable now.
    pub fn signal_activation(index: usize, signal_id: &str, now: Millis) -> Self {
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

    /// Replay of a failed instance (K-5), under [`Guard::Failed`].
    pub fn replay(input: Value, now: Millis) -> Self {
        let mut t = Transition::new(TransitionKind::Replay, now);
        t.status = Some(WorkflowStatus::Running);
        t.input = Some(input);
        t.retry_count_inc = true;
        t.claimable_time = Some(Patch::Set(now));
        t.claim_token = Some(Patch::Unset);
        t.finished_at = Some(Patch::Unset);
        t.resume = Some(Patch::Unset);
        t.wait = Some(Patch::Unset);
        t.reset_failed_steps = true;
        t
    }

    /// Priority raise (promote-only), under [`Guard::PriorityBelow`].
    pub fn priority_raise(p: Priority, now: Millis) -> Self {
        let mut t = Transition::new(TransitionKind::PriorityRaise, now);
        t.priority = Some(p);
        t
    }
}
