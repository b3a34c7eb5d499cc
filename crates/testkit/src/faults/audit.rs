//! `AuditStore`: a store that counts writes and duplicate completions and keeps a per-write log.

use kernel_core::domain::*;
use kernel_core::ports::*;
use kernel_core::transition::TransitionKind;
use kernel_core::transition::{Guard, KindAt, Patch, Transition};
use kernel_core::Result;
use kernel_core::{ClaimToken, WorkflowId};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// Counts of store traffic seen by an [`AuditStore`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AuditCounts {
    /// Calls that write (create, claim, claim_any, apply), whatever their outcome.
    pub writes: u64,
    /// Reads (get, get_by_biz_key, scans).
    pub reads: u64,
    /// Accepted step completions per (workflow_id, workflow_run, step index, step epoch):
    /// one per logical attempt (K-17.1), so a regenerated step's second completion is not
    /// a duplicate.
    pub completions: BTreeMap<(String, u32, u32, u32), u64>,
    /// Accepted writes per transition kind label.
    pub accepted: BTreeMap<String, u64>,
}

impl AuditCounts {
    /// Accepted completions above one per (instance, run, step, epoch).
    pub fn duplicate_step_completions(&self) -> u64 {
        self.completions.values().map(|n| n.saturating_sub(1)).sum()
    }
}

/// Which store call an [`AuditedWrite`] records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOp {
    /// [`WorkflowStore::create`].
    Create,
    /// [`WorkflowStore::claim`] of a named instance.
    Claim,
    /// [`WorkflowStore::claim_any`] (the store fallback).
    ClaimAny,
    /// [`WorkflowStore::apply`].
    Apply,
}

/// How an audited write ended, as the store answered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditOutcome {
    /// The store accepted it; `revision` is the instance's revision after the write
    /// (a claim does not bump it; a create reports the stored instance's).
    Applied {
        /// Revision after the write.
        revision: u64,
    },
    /// The guard did not match (a claim that found nothing, a create that met an
    /// existing `biz_key`).
    Missed,
    /// The store returned an error; its message.
    Failed(String),
}

/// One write as the store saw it, in call order ([`AuditStore::log`]).
#[derive(Debug, Clone, PartialEq)]
pub struct AuditedWrite {
    /// Which call.
    pub op: WriteOp,
    /// The instance written; for a `claim_any`, the one it claimed (`None` when it found
    /// nothing).
    pub workflow_id: Option<WorkflowId>,
    /// The condition the write was made under (a claim's is [`Guard::Claimable`]; a create
    /// has none, the unique `biz_key` is its condition).
    pub guard: Option<Guard>,
    /// Transition kinds in the write, in fusion order (`[Create]` for a create, `[Claim]`
    /// for a claim).
    pub kinds: Vec<TransitionKind>,
    /// The kinds with the step each concerns (empty for a create or a claim).
    pub kinds_at: Vec<KindAt>,
    /// The claim token: the one a claim minted, or the one an apply's guard carries.
    pub token: Option<ClaimToken>,
    /// The writer's clock: the claim's `now`, the transition's `now`.
    pub at: Option<Instant>,
    /// The lease end the write sets, if it sets one: an accepted claim's `claimable_time`,
    /// a heartbeat's new lease end.
    pub lease_until: Option<Instant>,
    /// What the store answered.
    pub outcome: AuditOutcome,
    /// Steps the write completed, if accepted.
    pub completed_steps: Vec<u32>,
    /// The workflow run (`retry_count`) accepted completions were counted for, if any.
    pub run: Option<u32>,
}

#[derive(Debug, Default)]
struct AuditState {
    counts: AuditCounts,
    log: Vec<AuditedWrite>,
    log_dropped: u64,
    /// Per instance, the token of its last accepted claim and the run it claimed.
    claimed_run: HashMap<WorkflowId, (ClaimToken, u32)>,
    /// Per (instance, step), the epoch the last accepted write set (absent: 0).
    epochs: HashMap<(WorkflowId, u32), u32>,
}

impl AuditState {
    fn record(&mut self, w: AuditedWrite) {
        if self.log.len() < AuditStore::LOG_CAPACITY {
            self.log.push(w);
        } else {
            self.log_dropped += 1;
        }
    }
}

/// The database's own view: counts writes and reads, accepted completions per
/// (instance, run, step) independently of the engine, and keeps a log of every write
/// (guard, transition kinds, outcome, revision).
///
/// The run of a completion is the one the store handed out with the claim whose token
/// guarded the write; the document is read back after a write only when that is unknown
/// (a write under a token this audit did not see claimed), or for every accepted write when
/// [`read_back`](Self::read_back) asks for it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use kernel_core::{Definition, StartRequest, StepDef, StepOutcome, ActivityContext};
/// use kernel_core::transition::TransitionKind;
/// use testkit::faults::{AuditOutcome, WriteOp};
/// use testkit::harness::World;
///
/// let world = World::new(1);
/// let def = Definition::builder("t")
///     .step(StepDef::new("a", |_c: ActivityContext| async { Ok(StepOutcome::complete(serde_json::json!(1))) }))
///     .build()
///     .unwrap();
/// let engine = world.engine("w", vec![def]);
/// engine.publisher().start_or_resume(StartRequest::new("t", "b", serde_json::json!({}))).await.unwrap();
/// world.drive(&engine).await.unwrap();
/// let log = world.audit.log();
/// assert_eq!(log[0].op, WriteOp::Create);
/// let last = log.last().unwrap();
/// assert!(last.kinds.contains(&TransitionKind::Completed));
/// assert!(matches!(last.outcome, AuditOutcome::Applied { .. }));
/// # }
/// ```
#[derive(Clone)]
pub struct AuditStore {
    inner: Arc<DynStore>,
    state: Arc<Mutex<AuditState>>,
    read_back: bool,
}

impl std::fmt::Debug for AuditStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditStore").field("counts", &self.counts()).finish_non_exhaustive()
    }
}

impl AuditStore {
    /// Most writes kept in the log; later ones are counted by
    /// [`log_dropped`](Self::log_dropped) instead.
    pub const LOG_CAPACITY: usize = 100_000;

    /// Audit `inner`.
    pub fn new(inner: Arc<DynStore>) -> Self {
        AuditStore { inner, state: Arc::default(), read_back: false }
    }
    /// Read the document back after every accepted write and take the completion's run
    /// from it, as a database-side trigger would (one extra read per write: off by
    /// default). Clones made afterwards share the setting; counters are shared either way.
    pub fn read_back(mut self, on: bool) -> Self {
        self.read_back = on;
        self
    }
    /// A snapshot of the counters.
    pub fn counts(&self) -> AuditCounts {
        self.lock().counts.clone()
    }
    /// Every write so far, in call order (at most [`LOG_CAPACITY`](Self::LOG_CAPACITY)).
    pub fn log(&self) -> Vec<AuditedWrite> {
        self.lock().log.clone()
    }
    /// The writes of one instance, in call order.
    pub fn log_of(&self, workflow_id: &str) -> Vec<AuditedWrite> {
        self.lock().log.iter().filter(|w| w.workflow_id.as_deref() == Some(workflow_id)).cloned().collect()
    }
    /// Writes not logged because the log was full.
    pub fn log_dropped(&self) -> u64 {
        self.lock().log_dropped
    }
    /// Zero the write/read counters and clear the log (completions are kept).
    pub fn reset_traffic(&self) {
        let mut st = self.lock();
        st.counts.writes = 0;
        st.counts.reads = 0;
        st.counts.accepted.clear();
        st.log.clear();
        st.log_dropped = 0;
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, AuditState> {
        self.state.lock().expect("audit lock")
    }
    fn read(&self) {
        self.lock().counts.reads += 1;
    }
    fn write(&self) {
        self.lock().counts.writes += 1;
    }
    fn claimed(&self, op: WriteOp, spec: &ClaimSpec, r: &Result<Option<WorkflowInstance>>) {
        let mut st = self.lock();
        let outcome = match r {
            Ok(Some(inst)) => {
                *st.counts.accepted.entry("claim".into()).or_insert(0) += 1;
                let token = inst.claim_token.clone().unwrap_or_else(|| spec.token.clone());
                st.claimed_run.insert(inst.workflow_id.clone(), (token, inst.retry_count));
                AuditOutcome::Applied { revision: inst.revision }
            }
            Ok(None) => AuditOutcome::Missed,
            Err(e) => AuditOutcome::Failed(e.to_string()),
        };
        let claimed = r.as_ref().ok().and_then(|i| i.as_ref());
        let workflow_id = claimed.map(|i| i.workflow_id.clone());
        st.record(AuditedWrite {
            op,
            workflow_id,
            guard: Some(spec.guard()),
            kinds: vec![TransitionKind::Claim],
            kinds_at: Vec::new(),
            token: Some(spec.token.clone()),
            at: Some(spec.now),
            lease_until: claimed.and_then(|i| i.claimable_time),
            outcome,
            completed_steps: Vec::new(),
            run: None,
        });
    }
    /// The run an accepted write under `guard` belongs to: the one claimed with that token,
    /// else (or when asked to) read back from the store.
    async fn run_of(&self, workflow_id: &WorkflowId, guard: &Guard) -> u32 {
        if !self.read_back {
            let token = match guard {
                Guard::Running { token } | Guard::Failing { token } | Guard::Token { token } => Some(token),
                _ => None,
            };
            let known = self.lock().claimed_run.get(workflow_id).cloned();
            if let (Some(token), Some((claimed, run))) = (token, known) {
                if *token == claimed {
                    return run;
                }
            }
        }
        self.inner.get(workflow_id).await.ok().flatten().map_or(0, |i| i.retry_count)
    }
}

/// The kinds of a transition, in fusion order.
fn kinds_of(transition: &Transition) -> Vec<TransitionKind> {
    transition.kinds().collect()
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl WorkflowStore for AuditStore {
    async fn create(&self, instance: WorkflowInstance) -> Result<CreateOutcome> {
        self.write();
        let workflow_id = instance.workflow_id.clone();
        let r = self.inner.create(instance).await;
        let (workflow_id, outcome) = match &r {
            Ok(CreateOutcome::Created(i)) => (i.workflow_id.clone(), AuditOutcome::Applied { revision: i.revision }),
            Ok(CreateOutcome::Exists(i)) => (i.workflow_id.clone(), AuditOutcome::Missed),
            Err(e) => (workflow_id, AuditOutcome::Failed(e.to_string())),
        };
        self.lock().record(AuditedWrite {
            op: WriteOp::Create,
            workflow_id: Some(workflow_id),
            guard: None,
            kinds: vec![TransitionKind::Create],
            kinds_at: Vec::new(),
            token: None,
            at: None,
            lease_until: None,
            outcome,
            completed_steps: Vec::new(),
            run: None,
        });
        r
    }
    async fn get(&self, workflow_id: &WorkflowId) -> Result<Option<WorkflowInstance>> {
        self.read();
        self.inner.get(workflow_id).await
    }
    async fn get_by_biz_key(&self, biz_key: &str) -> Result<Option<WorkflowInstance>> {
        self.read();
        self.inner.get_by_biz_key(biz_key).await
    }
    async fn claim(&self, workflow_id: &WorkflowId, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        self.write();
        let r = self.inner.claim(workflow_id, spec).await;
        self.claimed(WriteOp::Claim, spec, &r);
        r
    }
    async fn claim_any(&self, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        self.write();
        let r = self.inner.claim_any(spec).await;
        self.claimed(WriteOp::ClaimAny, spec, &r);
        r
    }
    async fn apply(&self, workflow_id: &WorkflowId, guard: &Guard, transition: &Transition) -> Result<WriteOutcome> {
        self.write();
        let r = self.inner.apply(workflow_id, guard, transition).await;
        let mut entry = AuditedWrite {
            op: WriteOp::Apply,
            workflow_id: Some(workflow_id.clone()),
            guard: Some(guard.clone()),
            kinds: kinds_of(transition),
            kinds_at: transition.kinds_at().to_vec(),
            token: match guard {
                Guard::Running { token } | Guard::Failing { token } | Guard::Token { token } => Some(token.clone()),
                _ => None,
            },
            at: Some(transition.now),
            lease_until: match (transition.kind(), &transition.claimable_time) {
                (TransitionKind::Heartbeat, Some(Patch::Set(t))) => Some(*t),
                _ => None,
            },
            outcome: AuditOutcome::Missed,
            completed_steps: Vec::new(),
            run: None,
        };
        match &r {
            Ok(WriteOutcome::Applied { revision }) => {
                // The run of a completion comes from the store (its claim, or the document),
                // not from the engine.
                let completed: Vec<u32> = transition.completed_steps().collect();
                let run =
                    if completed.is_empty() && !self.read_back { 0 } else { self.run_of(workflow_id, guard).await };
                let mut st = self.lock();
                // The step epochs as the accepted writes set them (the store's view).
                for p in &transition.steps {
                    if let Some(e) = p.epoch {
                        st.epochs.insert((workflow_id.clone(), p.index), e);
                    }
                }
                for step in &completed {
                    let epoch = st.epochs.get(&(workflow_id.clone(), *step)).copied().unwrap_or(0);
                    *st.counts.completions.entry((workflow_id.to_string(), run, *step, epoch)).or_insert(0) += 1;
                }
                let label = format!("{:?}", kinds_of(transition));
                *st.counts.accepted.entry(label).or_insert(0) += 1;
                entry.outcome = AuditOutcome::Applied { revision: *revision };
                entry.run = (!completed.is_empty()).then_some(run);
                entry.completed_steps = completed;
                st.record(entry);
            }
            Ok(WriteOutcome::Missed) => self.lock().record(entry),
            Err(e) => {
                entry.outcome = AuditOutcome::Failed(e.to_string());
                self.lock().record(entry);
            }
        }
        r
    }
    async fn scan_due_waits(&self, now: Instant, after: Option<&DueCursor>, limit: usize) -> Result<ScanPage<DueWait>> {
        self.read();
        self.inner.scan_due_waits(now, after, limit).await
    }
    async fn scan_claimable(&self, after: Option<&WorkflowId>, limit: usize) -> Result<ScanPage<Candidate>> {
        self.read();
        self.inner.scan_claimable(after, limit).await
    }
}
