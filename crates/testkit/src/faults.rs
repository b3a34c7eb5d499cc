//! Fault decorators over any port: crash before/after a call (by index or by named
//! boundary), an auditing store that counts writes and duplicate completions, lost wakeups
//! and flushed queues (see [`InMemoryQueue::flush`](crate::memory::InMemoryQueue::flush),
//! [`InMemoryWakeup::set_lossy`](crate::memory::InMemoryWakeup::set_lossy)).
//!
//! A crash is modelled as in TigerBeetle's and object_store's harnesses: the durable state
//! survives (it lives behind the decorator), the process's every later call parks forever,
//! and a later [`CrashSwitch::release`] lets the parked "zombie" continue, so its pending
//! write can be shown to be fenced. [`CrashPlan::Every`] instead fails every n-th boundary
//! call and lets the same process go on, so one engine's life crosses many crash points.
//!
//! Every decorator here implements every method of the port it wraps (enforced with
//! `clippy::missing_trait_methods`), so a default body can never change meaning under a
//! wrapper — the way a permit renewal once became a counted start.

use kernel_core::model::*;
use kernel_core::ports::*;
use kernel_core::transition::TransitionKind;
use kernel_core::transition::{Guard, KindAt, Patch, Transition};
use kernel_core::{ClaimToken, FencingToken, LeaseToken, ObjectId, WorkflowId};
use kernel_core::{Error, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// Name of a persistence boundary: port and operation.
pub type BoundaryName = &'static str;

/// Where to crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPlan {
    /// Never crash; only count boundaries.
    Never,
    /// Crash before the call with this 0-based boundary index reaches the port.
    Before(u64),
    /// Crash after that call took effect, before its result is seen.
    After(u64),
    /// Crash before the n-th (0-based) call of this named boundary.
    BeforeNamed(BoundaryName, u64),
    /// Crash after the n-th (0-based) call of this named boundary.
    AfterNamed(BoundaryName, u64),
    /// Fire at every `n`-th boundary (the n-th, 2n-th, … — 1-based; `n = 1` fires at
    /// every one) without killing the process: on [`CrashSide::Before`] the call never
    /// reaches the port and fails with [`Error::Unavailable`]; on [`CrashSide::After`] the
    /// call takes effect and its result is lost as [`Error::Uncertain`]. The engine's own
    /// error handling is what recovers (an uncertain write ends the claim and leaves the
    /// lease to expire, as a crash would; an unavailable one hands the claim back with a
    /// delay), so one engine lives through many crash points.
    /// `n = 0` never fires. Every firing is listed by [`CrashSwitch::fired`].
    ///
    /// The schedule is deterministic: when a recovery cycle (lease expiry, re-claim, retry)
    /// crosses a multiple of `n` boundaries, a `Before` plan fails the same write on every
    /// cycle and the workflow never gets past it. Pick a period that is not such a multiple,
    /// or use `After`, whose failed writes took effect.
    ///
    /// ```
    /// use testkit::faults::{CrashPlan, CrashSide};
    /// // Lose the result of every third durable call, over the engine's whole life.
    /// let plan = CrashPlan::Every { n: 3, side: CrashSide::After };
    /// # let _ = plan;
    /// ```
    Every {
        /// Period, in boundary calls.
        n: u64,
        /// Whether the call is dropped (before) or its result lost (after).
        side: CrashSide,
    },
}

/// Which side of a boundary call a repeated crash hits ([`CrashPlan::Every`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashSide {
    /// The call does not reach the port.
    Before,
    /// The call took effect; the caller never sees its result.
    After,
}

/// One firing of a [`CrashPlan::Every`] switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fired {
    /// 0-based index of the boundary in the switch's log.
    pub index: u64,
    /// The boundary.
    pub name: BoundaryName,
    /// Before or after the call.
    pub side: CrashSide,
}

/// What the switch decided for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// Let the call through.
    Pass,
    /// Let it through, then die.
    DieAfter,
    /// Refuse it: the port never sees it.
    FailBefore(BoundaryName),
    /// Let it through and lose its result.
    FailAfter(BoundaryName),
}

impl Gate {
    /// Run `call` as this gate says.
    async fn run<T, F: std::future::Future<Output = Result<T>>>(self, switch: &CrashSwitch, call: F) -> Result<T> {
        match self {
            Gate::FailBefore(name) => Err(Error::unavailable(format!("crash switch: fired before {name}"))),
            Gate::FailAfter(name) => {
                call.await.and_then(|_| Err(Error::uncertain(format!("crash switch: fired after {name}"))))
            }
            Gate::Pass => call.await,
            Gate::DieAfter => {
                let r = call.await;
                switch.leave(true).await;
                r
            }
        }
    }
}

#[derive(Debug, Default)]
struct SwitchState {
    log: Vec<BoundaryName>,
    per_name: BTreeMap<BoundaryName, u64>,
    crashed_at: Option<(u64, BoundaryName)>,
    fired: Vec<Fired>,
    idle: BTreeSet<u64>,
}

/// Counters of what a released zombie tried.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ZombieStats {
    /// Token-guarded writes the zombie attempted after release with a token that was no
    /// longer the current one.
    pub stale_writes_attempted: u64,
    /// Of those, how many the store accepted (must be 0).
    pub stale_writes_accepted: u64,
}

/// Shared controller of one simulated process's port calls.
#[derive(Debug)]
pub struct CrashSwitch {
    plan: CrashPlan,
    state: Mutex<SwitchState>,
    crashed: watch::Sender<bool>,
    released: watch::Sender<bool>,
    zombie_attempted: AtomicU64,
    zombie_accepted: AtomicU64,
}

impl CrashSwitch {
    /// A switch following `plan`.
    pub fn new(plan: CrashPlan) -> Arc<Self> {
        Arc::new(CrashSwitch {
            plan,
            state: Mutex::default(),
            crashed: watch::Sender::new(false),
            released: watch::Sender::new(false),
            zombie_attempted: AtomicU64::new(0),
            zombie_accepted: AtomicU64::new(0),
        })
    }
    /// Boundaries crossed so far, in order.
    pub fn log(&self) -> Vec<BoundaryName> {
        self.state.lock().expect("switch lock").log.clone()
    }
    /// The boundary the process died at.
    pub fn crashed_at(&self) -> Option<(u64, BoundaryName)> {
        self.state.lock().expect("switch lock").crashed_at
    }
    /// Every firing of a [`CrashPlan::Every`] plan so far, in order (empty for the other
    /// plans, whose one crash is [`crashed_at`](Self::crashed_at)).
    pub fn fired(&self) -> Vec<Fired> {
        self.state.lock().expect("switch lock").fired.clone()
    }
    /// Indices (in [`log`](Self::log)) of boundary calls that changed nothing: a purge
    /// that deleted no record. A crash on either side of such a call is the same state as
    /// a crash next to it, so a sweep does not count them as crash points.
    pub fn idle(&self) -> BTreeSet<u64> {
        self.state.lock().expect("switch lock").idle.clone()
    }
    /// Whether the process has died.
    pub fn is_crashed(&self) -> bool {
        *self.crashed.borrow()
    }
    /// Resolves when the process dies.
    pub async fn wait_crashed(&self) {
        let mut rx = self.crashed.subscribe();
        while !*rx.borrow_and_update() {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
    /// Die now: every later call of this process parks (a crash injected from inside an
    /// activity, e.g. "the process died during compose").
    pub fn crash_now(&self) {
        {
            let mut st = self.state.lock().expect("switch lock");
            let idx = st.log.len() as u64;
            st.crashed_at.get_or_insert((idx, "crash_now"));
        }
        self.crashed.send_replace(true);
    }

    /// Let the parked zombie continue.
    pub fn release(&self) {
        self.released.send_replace(true);
    }
    /// What the zombie tried after release.
    pub fn zombie_stats(&self) -> ZombieStats {
        ZombieStats {
            stale_writes_attempted: self.zombie_attempted.load(Ordering::SeqCst),
            stale_writes_accepted: self.zombie_accepted.load(Ordering::SeqCst),
        }
    }

    async fn wait_released(&self) {
        let mut rx = self.released.subscribe();
        while !*rx.borrow_and_update() {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Gate one call: whether it passes, fails on one side, or the process dies after it.
    async fn enter(&self, name: BoundaryName, boundary: bool) -> Gate {
        self.enter_at(name, boundary).await.0
    }

    /// [`enter`](Self::enter), also returning the boundary's index in the log (`None` for
    /// a call that is not a boundary or comes after the crash).
    async fn enter_at(&self, name: BoundaryName, boundary: bool) -> (Gate, Option<u64>) {
        if self.is_crashed() {
            self.wait_released().await;
            return (Gate::Pass, None);
        }
        if !boundary {
            return (Gate::Pass, None);
        }
        let (index, nth) = {
            let mut st = self.state.lock().expect("switch lock");
            let index = st.log.len() as u64;
            st.log.push(name);
            let nth = st.per_name.entry(name).or_insert(0);
            let n = *nth;
            *nth += 1;
            (index, n)
        };
        let (before, after) = match self.plan {
            CrashPlan::Never => (false, false),
            CrashPlan::Before(i) => (i == index, false),
            CrashPlan::After(i) => (false, i == index),
            CrashPlan::BeforeNamed(b, n) => (b == name && n == nth, false),
            CrashPlan::AfterNamed(b, n) => (false, b == name && n == nth),
            CrashPlan::Every { n, side } => {
                if n == 0 || (index + 1) % n != 0 {
                    return (Gate::Pass, Some(index));
                }
                self.state.lock().expect("switch lock").fired.push(Fired { index, name, side });
                let gate = match side {
                    CrashSide::Before => Gate::FailBefore(name),
                    CrashSide::After => Gate::FailAfter(name),
                };
                return (gate, Some(index));
            }
        };
        if before {
            self.die(index, name);
            self.wait_released().await;
        }
        if after {
            self.state.lock().expect("switch lock").crashed_at = Some((index, name));
            return (Gate::DieAfter, Some(index));
        }
        (Gate::Pass, Some(index))
    }

    /// Note that the boundary call at `index` changed nothing.
    fn mark_idle(&self, index: Option<u64>) {
        if let Some(i) = index {
            self.state.lock().expect("switch lock").idle.insert(i);
        }
    }

    fn die(&self, index: u64, name: BoundaryName) {
        self.state.lock().expect("switch lock").crashed_at = Some((index, name));
        self.crashed.send_replace(true);
    }

    async fn leave(&self, die_after: bool) {
        if die_after {
            self.crashed.send_replace(true);
            self.wait_released().await;
        }
    }

    fn zombie_write(&self, applied: bool) {
        self.zombie_attempted.fetch_add(1, Ordering::SeqCst);
        if applied {
            self.zombie_accepted.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The ports of one simulated process, every call gated by a [`CrashSwitch`].
///
/// Boundaries (calls that change durable or shared state) are counted; reads are not, but
/// after the crash every call parks.
#[derive(Clone)]
pub struct CrashPorts {
    /// The controller.
    pub switch: Arc<CrashSwitch>,
    store: Arc<DynStore>,
    inbox: Arc<DynInbox>,
    queue: Arc<DynQueue>,
    permits: Arc<DynPermits>,
    wakeup: Arc<DynWakeup>,
    outbox: Option<Arc<DynOutbox>>,
    candidates: Option<Arc<DynCandidates>>,
    stream: Option<Arc<DynStreamSink>>,
    dead_letters: Option<Arc<DynDeadLetters>>,
    task_inbox: Option<Arc<DynTaskInbox>>,
    cache: Option<Arc<DynResultCache>>,
}

impl std::fmt::Debug for CrashPorts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrashPorts").field("switch", &self.switch).finish_non_exhaustive()
    }
}

impl CrashPorts {
    /// Wrap the given ports.
    pub fn new(
        switch: Arc<CrashSwitch>,
        store: Arc<DynStore>,
        inbox: Arc<DynInbox>,
        queue: Arc<DynQueue>,
        permits: Arc<DynPermits>,
        wakeup: Arc<DynWakeup>,
    ) -> Self {
        CrashPorts {
            switch,
            store,
            inbox,
            queue,
            permits,
            wakeup,
            outbox: None,
            candidates: None,
            stream: None,
            dead_letters: None,
            task_inbox: None,
            cache: None,
        }
    }
    /// Also gate the side ports a claim and a maintenance pass call: the dead letters
    /// (boundaries `dead_letters.record`, `.decide`, `.close`), the task inbox
    /// (`task_inbox.open`, `.decide`, `.close`) and the result cache (`cache.put`). Reads
    /// and the maintenance pass's bounded purges of these side records (they decide
    /// nothing; a crash there only delays a purge) are gated but are not boundaries, so an
    /// engine's boundary schedule does not move with its maintenance passes. [`wire`](Self::wire) then replaces those
    /// the ports have.
    pub fn with_side_ports(
        mut self,
        dead_letters: Option<Arc<DynDeadLetters>>,
        task_inbox: Option<Arc<DynTaskInbox>>,
        cache: Option<Arc<DynResultCache>>,
    ) -> Self {
        self.dead_letters = dead_letters;
        self.task_inbox = task_inbox;
        self.cache = cache;
        self
    }
    /// Also gate the client stream sink (boundaries `stream.reset`, `stream.append`,
    /// `stream.terminal`); [`wire`](Self::wire) then replaces the engine's stream port too.
    pub fn with_stream(mut self, stream: Arc<DynStreamSink>) -> Self {
        self.stream = Some(stream);
        self
    }
    /// Also gate a dispatch outbox and its candidate index.
    pub fn with_dispatch(mut self, outbox: Arc<DynOutbox>, candidates: Arc<DynCandidates>) -> Self {
        self.outbox = Some(outbox);
        self.candidates = Some(candidates);
        self
    }
    fn outbox(&self) -> &DynOutbox {
        self.outbox.as_deref().expect("CrashPorts built without with_dispatch")
    }
    fn cands(&self) -> &DynCandidates {
        self.candidates.as_deref().expect("CrashPorts built without with_dispatch")
    }
    /// Replace the matching fields of `ports` with gated ones.
    ///
    /// `Ports` is taken apart field by field: a port added to it does not compile here until
    /// it is gated (or said to need no gate).
    pub fn wire(self: &Arc<Self>, ports: kernel_core::engine::Ports) -> kernel_core::engine::Ports {
        let kernel_core::engine::Ports {
            store: _,
            inbox: _,
            queue: _,
            wakeup: _,
            permits: _,
            clock,
            ids,
            observer,
            stream,
            result_cache,
            dead_letters,
            task_inbox,
        } = ports;
        let me = || self.clone();
        kernel_core::engine::Ports {
            store: me(),
            inbox: me(),
            queue: me(),
            wakeup: me(),
            permits: me(),
            // No durable or shared state: no boundary.
            clock,
            ids,
            observer,
            stream: if self.stream.is_some() { me() } else { stream },
            result_cache: if self.cache.is_some() { Some(me()) } else { result_cache },
            dead_letters: if self.dead_letters.is_some() { Some(me()) } else { dead_letters },
            task_inbox: if self.task_inbox.is_some() { Some(me()) } else { task_inbox },
        }
    }
    fn stream(&self) -> &DynStreamSink {
        self.stream.as_deref().expect("CrashPorts built without with_stream")
    }
    fn dls(&self) -> &DynDeadLetters {
        self.dead_letters.as_deref().expect("CrashPorts built without side ports")
    }
    fn tasks(&self) -> &DynTaskInbox {
        self.task_inbox.as_deref().expect("CrashPorts built without side ports")
    }
    fn cache(&self) -> &DynResultCache {
        self.cache.as_deref().expect("CrashPorts built without side ports")
    }
}

/// The boundary name of a store write: `store.apply:` and the snake-case names of the
/// transition kinds it carries, in fusion order, joined by `+` (e.g. `store.apply:heartbeat`,
/// `store.apply:complete_step+mark_running`), so a sweep's boundary map shows which
/// transitions it reached. Names are interned: the set of kind sequences is small.
pub fn apply_boundary(transition: &Transition) -> BoundaryName {
    static NAMES: std::sync::OnceLock<Mutex<BTreeSet<&'static str>>> = std::sync::OnceLock::new();
    let kinds: Vec<String> = transition.kinds().map(kind_name).collect();
    let name = format!("store.apply:{}", if kinds.is_empty() { "release".to_string() } else { kinds.join("+") });
    let mut names = NAMES.get_or_init(Mutex::default).lock().expect("names lock");
    if let Some(n) = names.get(name.as_str()) {
        return n;
    }
    let leaked: &'static str = Box::leak(name.into_boxed_str());
    names.insert(leaked);
    leaked
}

/// Snake-case name of a transition kind, as boundary names carry it (its serialized name).
pub fn kind_name(kind: TransitionKind) -> String {
    match serde_json::to_value(kind) {
        Ok(serde_json::Value::String(s)) => s,
        _ => format!("{kind:?}"),
    }
}

macro_rules! gated {
    ($self:ident, $name:literal, $boundary:expr, $call:expr) => {{
        let gate = $self.switch.enter($name, $boundary).await;
        gate.run(&$self.switch, async { $call }).await
    }};
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl WorkflowStore for CrashPorts {
    async fn create(&self, instance: WorkflowInstance) -> Result<CreateOutcome> {
        gated!(self, "store.create", true, self.store.create(instance).await)
    }
    async fn get(&self, workflow_id: &WorkflowId) -> Result<Option<WorkflowInstance>> {
        gated!(self, "store.get", false, self.store.get(workflow_id).await)
    }
    async fn get_by_biz_key(&self, biz_key: &str) -> Result<Option<WorkflowInstance>> {
        gated!(self, "store.get_by_biz_key", false, self.store.get_by_biz_key(biz_key).await)
    }
    async fn claim(&self, workflow_id: &WorkflowId, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        gated!(self, "store.claim", true, self.store.claim(workflow_id, spec).await)
    }
    async fn claim_any(&self, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        gated!(self, "store.claim_any", true, self.store.claim_any(spec).await)
    }
    async fn apply(&self, workflow_id: &WorkflowId, guard: &Guard, transition: &Transition) -> Result<WriteOutcome> {
        let gate = self.switch.enter(apply_boundary(transition), true).await;
        if let Gate::FailBefore(_) = gate {
            return gate.run(&self.switch, async { Ok(WriteOutcome::Missed) }).await;
        }
        // A zombie's token write is stale when its token is no longer the current one.
        let stale = if self.switch.is_crashed() {
            let current = self.store.get(workflow_id).await.ok().flatten().and_then(|i| i.claim_token);
            match guard {
                Guard::Running { token } | Guard::Failing { token } | Guard::Token { token } => {
                    current.as_deref() != Some(token.as_str())
                }
                _ => false,
            }
        } else {
            false
        };
        let r = self.store.apply(workflow_id, guard, transition).await;
        if stale {
            self.switch.zombie_write(matches!(r, Ok(WriteOutcome::Applied { .. })));
        }
        gate.run(&self.switch, async { r }).await
    }
    async fn scan_due_waits(&self, now: Instant, after: Option<&DueCursor>, limit: usize) -> Result<ScanPage<DueWait>> {
        gated!(self, "store.scan_due_waits", false, self.store.scan_due_waits(now, after, limit).await)
    }
    async fn scan_claimable(&self, after: Option<&WorkflowId>, limit: usize) -> Result<ScanPage<Candidate>> {
        gated!(self, "store.scan_claimable", false, self.store.scan_claimable(after, limit).await)
    }
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl SignalInbox for CrashPorts {
    async fn insert(&self, record: SignalRecord) -> Result<InsertOutcome> {
        gated!(self, "inbox.insert", true, self.inbox.insert(record).await)
    }
    async fn get(&self, signal_id: &str) -> Result<Option<SignalRecord>> {
        gated!(self, "inbox.get", false, self.inbox.get(signal_id).await)
    }
    async fn find_pending(
        &self,
        workflow_id: &WorkflowId,
        signal_type: &str,
        wait_key: &str,
        generation: u64,
    ) -> Result<Option<SignalRecord>> {
        gated!(
            self,
            "inbox.find_pending",
            false,
            self.inbox.find_pending(workflow_id, signal_type, wait_key, generation).await
        )
    }
    async fn mark_matched(&self, signal_id: &str, now: Instant) -> Result<bool> {
        gated!(self, "inbox.mark_matched", true, self.inbox.mark_matched(signal_id, now).await)
    }
    async fn scan_pending(&self, after: Option<&str>, limit: usize) -> Result<SignalPage> {
        gated!(self, "inbox.scan_pending", false, self.inbox.scan_pending(after, limit).await)
    }
    async fn scan_created_before(&self, before: Instant, after: Option<&str>, limit: usize) -> Result<SignalPage> {
        gated!(self, "inbox.scan_created_before", false, self.inbox.scan_created_before(before, after, limit).await)
    }
    async fn scan_workflow(
        &self,
        workflow_id: &WorkflowId,
        status: SignalStatus,
        limit: usize,
    ) -> Result<Vec<SignalRecord>> {
        gated!(self, "inbox.scan_workflow", false, self.inbox.scan_workflow(workflow_id, status, limit).await)
    }
    /// A purge that deletes nothing is marked idle ([`CrashSwitch::idle`]).
    async fn delete_if(&self, signal_ids: &[String], status: SignalStatus) -> Result<u64> {
        let (gate, index) = self.switch.enter_at("inbox.purge", true).await;
        if let Gate::FailBefore(_) = gate {
            return gate.run(&self.switch, async { Ok(0) }).await;
        }
        let r = self.inbox.delete_if(signal_ids, status).await;
        if matches!(r, Ok(0)) {
            self.switch.mark_idle(index);
        }
        gate.run(&self.switch, async { r }).await
    }
    async fn count_pending_orphans(&self, workflow_id: Option<&WorkflowId>, limit: u64) -> Result<u64> {
        gated!(self, "inbox.count_pending_orphans", false, self.inbox.count_pending_orphans(workflow_id, limit).await)
    }
    async fn clear_orphans(&self, workflow_id: &WorkflowId) -> Result<u64> {
        gated!(self, "inbox.clear_orphans", true, self.inbox.clear_orphans(workflow_id).await)
    }
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl ReadyQueue for CrashPorts {
    async fn enqueue(&self, workflow_id: &WorkflowId, priority: Priority, claimable_at: Instant) -> Result<()> {
        gated!(self, "queue.enqueue", true, self.queue.enqueue(workflow_id, priority, claimable_at).await)
    }
    async fn enqueue_many(&self, entries: &[LaneEntry]) -> Result<()> {
        gated!(self, "queue.enqueue_many", true, self.queue.enqueue_many(entries).await)
    }
    /// One boundary per call, whatever its batch size: the batch is one atomic operation.
    async fn pop_due(&self, now: Instant, max: usize) -> Result<Vec<WorkflowId>> {
        gated!(self, "queue.pop", true, self.queue.pop_due(now, max).await)
    }
    async fn stats(&self, now: Instant) -> Result<[LaneStats; 4]> {
        gated!(self, "queue.stats", false, self.queue.stats(now).await)
    }
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl Permits for CrashPorts {
    async fn acquire(&self, resource: &str, owner: &PermitOwner) -> Result<PermitDecision> {
        gated!(self, "permits.acquire", true, self.permits.acquire(resource, owner).await)
    }
    /// Its own boundary, never an acquire: under a crash test a renewal stays what the
    /// port promises, an uncounted re-registration (K-14).
    async fn renew(&self, resource: &str, owner: &PermitOwner) -> Result<PermitDecision> {
        gated!(self, "permits.renew", true, self.permits.renew(resource, owner).await)
    }
    async fn release(&self, resource: &str, owner: &PermitOwner) -> Result<()> {
        gated!(self, "permits.release", true, self.permits.release(resource, owner).await)
    }
    async fn usage(&self, resource: &str) -> Result<PermitUsage> {
        gated!(self, "permits.usage", false, self.permits.usage(resource).await)
    }
    async fn resources(&self) -> Result<Vec<String>> {
        gated!(self, "permits.resources", false, self.permits.resources().await)
    }
    async fn set_limits(&self, resource: &str, limits: PermitLimits) -> Result<()> {
        gated!(self, "permits.set_limits", true, self.permits.set_limits(resource, limits).await)
    }
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl StreamSink for CrashPorts {
    async fn reset(&self, key: &StreamKey, owner: StreamOwner) -> Result<u64> {
        gated!(self, "stream.reset", true, self.stream().reset(key, owner).await)
    }
    async fn append(&self, key: &StreamKey, owner: StreamOwner, frame: Frame) -> Result<u64> {
        gated!(self, "stream.append", true, self.stream().append(key, owner, frame).await)
    }
    async fn terminal(&self, key: &StreamKey, owner: StreamOwner, summary: serde_json::Value) -> Result<()> {
        gated!(self, "stream.terminal", true, self.stream().terminal(key, owner, summary).await)
    }
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl Wakeup for CrashPorts {
    async fn notify(&self) -> Result<()> {
        gated!(self, "wakeup.notify", false, self.wakeup.notify().await)
    }
    async fn subscribe(&self) -> Result<WakeupReceiver> {
        self.wakeup.subscribe().await
    }
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl DeadLetters for CrashPorts {
    async fn record(&self, dl: &DeadLetter) -> Result<bool> {
        gated!(self, "dead_letters.record", true, self.dls().record(dl).await)
    }
    async fn get(&self, id: &str) -> Result<Option<DeadLetter>> {
        gated!(self, "dead_letters.get", false, self.dls().get(id).await)
    }
    async fn list(
        &self,
        status: Option<DeadLetterStatus>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>> {
        gated!(self, "dead_letters.list", false, self.dls().list(status, after, limit).await)
    }
    async fn decide(&self, id: &str, decision: &DeadLetterDecision) -> Result<DecideOutcome> {
        gated!(self, "dead_letters.decide", true, self.dls().decide(id, decision).await)
    }
    async fn close(&self, id: &str, now: Instant) -> Result<bool> {
        gated!(self, "dead_letters.close", true, self.dls().close(id, now).await)
    }
    async fn purge_closed(&self, before: Instant, limit: usize) -> Result<u64> {
        gated!(self, "dead_letters.purge", false, self.dls().purge_closed(before, limit).await)
    }
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl TaskInbox for CrashPorts {
    async fn open(&self, task: &TaskRecord) -> Result<Option<TaskRecord>> {
        gated!(self, "task_inbox.open", true, self.tasks().open(task).await)
    }
    async fn get(&self, id: &str) -> Result<Option<TaskRecord>> {
        gated!(self, "task_inbox.get", false, self.tasks().get(id).await)
    }
    async fn list_open(&self, actor: &Actor, after: Option<&str>, limit: usize) -> Result<Vec<TaskRecord>> {
        gated!(self, "task_inbox.list_open", false, self.tasks().list_open(actor, after, limit).await)
    }
    async fn decide(&self, id: &str, token: &str, actor: &Actor, decision: &TaskDecision) -> Result<TaskDecideOutcome> {
        gated!(self, "task_inbox.decide", true, self.tasks().decide(id, token, actor, decision).await)
    }
    async fn close(&self, id: &str, now: Instant) -> Result<TaskCloseOutcome> {
        gated!(self, "task_inbox.close", true, self.tasks().close(id, now).await)
    }
    async fn purge_sensitive_reasons(&self, before: Instant, limit: usize) -> Result<u64> {
        gated!(self, "task_inbox.purge_reasons", false, self.tasks().purge_sensitive_reasons(before, limit).await)
    }
    async fn purge_closed(&self, before: Instant, limit: usize) -> Result<u64> {
        gated!(self, "task_inbox.purge", false, self.tasks().purge_closed(before, limit).await)
    }
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl ResultCache for CrashPorts {
    async fn get(&self, key: &CacheKey, now: Instant) -> Result<Option<CachedResult>> {
        gated!(self, "cache.get", false, self.cache().get(key, now).await)
    }
    async fn put(&self, key: &CacheKey, value: &serde_json::Value, now: Instant, ttl: DurationMs) -> Result<()> {
        gated!(self, "cache.put", true, self.cache().put(key, value, now, ttl).await)
    }
    async fn purge_expired(&self, now: Instant, limit: usize) -> Result<u64> {
        gated!(self, "cache.purge", false, self.cache().purge_expired(now, limit).await)
    }
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl DispatchOutbox for CrashPorts {
    async fn accept(
        &self,
        object_id: &ObjectId,
        fields: serde_json::Value,
        initial_status: &str,
        intent: DispatchIntent,
    ) -> Result<AcceptOutcome> {
        gated!(self, "outbox.accept", true, self.outbox().accept(object_id, fields, initial_status, intent).await)
    }
    async fn get(&self, object_id: &ObjectId) -> Result<Option<DispatchRecord>> {
        gated!(self, "outbox.get", false, self.outbox().get(object_id).await)
    }
    async fn confirm_dispatched(&self, object_id: &ObjectId, f: &FencingToken) -> Result<bool> {
        gated!(self, "outbox.confirm_dispatched", true, self.outbox().confirm_dispatched(object_id, f).await)
    }
    async fn defer_pending(&self, object_id: &ObjectId, f: &FencingToken, at: Instant) -> Result<bool> {
        gated!(self, "outbox.defer_pending", true, self.outbox().defer_pending(object_id, f, at).await)
    }
    async fn try_lease(
        &self,
        object_id: &ObjectId,
        now: Instant,
        d: &LeaseToken,
        until: Instant,
    ) -> Result<Option<DispatchRecord>> {
        gated!(self, "outbox.try_lease", true, self.outbox().try_lease(object_id, now, d, until).await)
    }
    async fn renew_lease(
        &self,
        object_id: &ObjectId,
        f: &FencingToken,
        d: &LeaseToken,
        until: Instant,
    ) -> Result<bool> {
        let gate = self.switch.enter("outbox.renew_lease", true).await;
        if let Gate::FailBefore(_) = gate {
            return gate.run(&self.switch, async { Ok(false) }).await;
        }
        let stale = self.lease_is_stale(object_id, d).await;
        let r = self.outbox().renew_lease(object_id, f, d, until).await;
        if stale {
            self.switch.zombie_write(matches!(r, Ok(true)));
        }
        gate.run(&self.switch, async { r }).await
    }
    async fn confirm_leased(&self, object_id: &ObjectId, f: &FencingToken, d: &LeaseToken) -> Result<bool> {
        let gate = self.switch.enter("outbox.confirm_leased", true).await;
        if let Gate::FailBefore(_) = gate {
            return gate.run(&self.switch, async { Ok(false) }).await;
        }
        let stale = self.lease_is_stale(object_id, d).await;
        let r = self.outbox().confirm_leased(object_id, f, d).await;
        if stale {
            self.switch.zombie_write(matches!(r, Ok(true)));
        }
        gate.run(&self.switch, async { r }).await
    }
    async fn revert_leased(&self, object_id: &ObjectId, f: &FencingToken, d: &LeaseToken, at: Instant) -> Result<bool> {
        let gate = self.switch.enter("outbox.revert_leased", true).await;
        if let Gate::FailBefore(_) = gate {
            return gate.run(&self.switch, async { Ok(false) }).await;
        }
        let stale = self.lease_is_stale(object_id, d).await;
        let r = self.outbox().revert_leased(object_id, f, d, at).await;
        if stale {
            self.switch.zombie_write(matches!(r, Ok(true)));
        }
        gate.run(&self.switch, async { r }).await
    }
    async fn scan_due(&self, now: Instant, after: Option<&ObjectId>, limit: usize) -> Result<Vec<(ObjectId, Instant)>> {
        gated!(self, "outbox.scan_due", false, self.outbox().scan_due(now, after, limit).await)
    }
    async fn retry_failed(
        &self,
        object_id: &ObjectId,
        prev: &FencingToken,
        next: DispatchIntent,
        initial_status: &str,
    ) -> Result<bool> {
        gated!(
            self,
            "outbox.retry_failed",
            true,
            self.outbox().retry_failed(object_id, prev, next, initial_status).await
        )
    }
    async fn fenced_update(
        &self,
        object_id: &ObjectId,
        f: &FencingToken,
        fields: serde_json::Value,
        status: Option<&str>,
    ) -> Result<bool> {
        gated!(self, "outbox.fenced_update", true, self.outbox().fenced_update(object_id, f, fields, status).await)
    }
    async fn try_lock(&self, name: &str, holder: &str, now: Instant, until: Instant) -> Result<bool> {
        gated!(self, "outbox.try_lock", true, self.outbox().try_lock(name, holder, now, until).await)
    }
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl DispatchCandidates for CrashPorts {
    async fn add(&self, object_id: &ObjectId, due: Instant) -> Result<()> {
        gated!(self, "candidates.add", true, self.cands().add(object_id, due).await)
    }
    async fn pop_due(&self, now: Instant, max: usize) -> Result<Vec<ObjectId>> {
        gated!(self, "candidates.pop", true, self.cands().pop_due(now, max).await)
    }
}

/// Calls a [`CountingQueue`] saw, per method, failed ones included. On the Redis adapters
/// each call is one round trip (one command or one script), so these are the round trips
/// the engine and the publisher spend on the lanes and the doorbell.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct QueueCalls {
    /// [`ReadyQueue::enqueue`] calls.
    pub enqueue: u64,
    /// [`ReadyQueue::enqueue_many`] calls.
    pub enqueue_many: u64,
    /// Entries those `enqueue_many` calls carried.
    pub enqueued_in_batches: u64,
    /// [`ReadyQueue::pop_due`] calls.
    pub pop_due: u64,
    /// Members those pops returned.
    pub popped: u64,
    /// [`ReadyQueue::stats`] calls.
    pub stats: u64,
    /// [`Wakeup::notify`] calls.
    pub notify: u64,
    /// [`Wakeup::subscribe`] calls.
    pub subscribe: u64,
}

impl QueueCalls {
    /// Calls that reach the queue or the doorbell (every method; `subscribe` opens a
    /// connection rather than making a request, so it is left out).
    pub fn round_trips(&self) -> u64 {
        self.enqueue + self.enqueue_many + self.pop_due + self.stats + self.notify
    }
}

/// A decorator over a ready queue and a doorbell that counts calls per method
/// ([`QueueCalls`]), so a test can pin how many round trips a path makes without timing it.
///
/// ```
/// use std::sync::Arc;
/// use kernel_core::ports::{ReadyQueue, Wakeup};
/// use kernel_core::{Instant, Priority};
/// use testkit::faults::CountingQueue;
/// use testkit::memory::{InMemoryQueue, InMemoryWakeup};
/// # tokio_test_block_on(async {
/// let counting = CountingQueue::new(Arc::new(InMemoryQueue::default()), Arc::new(InMemoryWakeup::new()));
/// counting.enqueue(&"wf-1".into(), Priority::P1, Instant::ZERO).await.unwrap();
/// assert_eq!(counting.pop_due(Instant::ZERO, 8).await.unwrap().len(), 1);
/// counting.notify().await.unwrap();
/// let calls = counting.counts();
/// assert_eq!((calls.enqueue, calls.pop_due, calls.popped, calls.notify), (1, 1, 1, 1));
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Clone)]
pub struct CountingQueue {
    queue: Arc<DynQueue>,
    wakeup: Arc<DynWakeup>,
    counts: Arc<Mutex<QueueCalls>>,
    pops: Arc<Mutex<Vec<(usize, usize)>>>,
}

impl std::fmt::Debug for CountingQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountingQueue").field("counts", &self.counts()).finish_non_exhaustive()
    }
}

impl CountingQueue {
    /// Count the calls to `queue` and `wakeup`.
    pub fn new(queue: Arc<DynQueue>, wakeup: Arc<DynWakeup>) -> Self {
        CountingQueue { queue, wakeup, counts: Arc::default(), pops: Arc::default() }
    }
    /// The calls so far.
    pub fn counts(&self) -> QueueCalls {
        *self.counts.lock().expect("counts lock")
    }
    /// Every successful `pop_due` so far, in order: (`max` asked, members returned).
    pub fn pops(&self) -> Vec<(usize, usize)> {
        self.pops.lock().expect("pops lock").clone()
    }
    /// Start counting from zero.
    pub fn reset(&self) {
        *self.counts.lock().expect("counts lock") = QueueCalls::default();
        self.pops.lock().expect("pops lock").clear();
    }
    /// Replace the queue and the wakeup of `ports` with this decorator.
    pub fn wire(self: &Arc<Self>, mut ports: kernel_core::engine::Ports) -> kernel_core::engine::Ports {
        ports.queue = self.clone();
        ports.wakeup = self.clone();
        ports
    }
    fn count(&self, f: impl FnOnce(&mut QueueCalls)) {
        f(&mut self.counts.lock().expect("counts lock"));
    }
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl ReadyQueue for CountingQueue {
    async fn enqueue(&self, workflow_id: &WorkflowId, priority: Priority, claimable_at: Instant) -> Result<()> {
        self.count(|c| c.enqueue += 1);
        self.queue.enqueue(workflow_id, priority, claimable_at).await
    }
    async fn enqueue_many(&self, entries: &[LaneEntry]) -> Result<()> {
        self.count(|c| {
            c.enqueue_many += 1;
            c.enqueued_in_batches += entries.len() as u64;
        });
        self.queue.enqueue_many(entries).await
    }
    async fn pop_due(&self, now: Instant, max: usize) -> Result<Vec<WorkflowId>> {
        self.count(|c| c.pop_due += 1);
        let r = self.queue.pop_due(now, max).await;
        if let Ok(ids) = &r {
            self.count(|c| c.popped += ids.len() as u64);
            self.pops.lock().expect("pops lock").push((max, ids.len()));
        }
        r
    }
    async fn stats(&self, now: Instant) -> Result<[LaneStats; 4]> {
        self.count(|c| c.stats += 1);
        self.queue.stats(now).await
    }
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl Wakeup for CountingQueue {
    async fn notify(&self) -> Result<()> {
        self.count(|c| c.notify += 1);
        self.wakeup.notify().await
    }
    async fn subscribe(&self) -> Result<WakeupReceiver> {
        self.count(|c| c.subscribe += 1);
        self.wakeup.subscribe().await
    }
}

impl CrashPorts {
    /// Whether a released dispatcher writes with a lease token that is no longer current.
    async fn lease_is_stale(&self, object_id: &ObjectId, d: &LeaseToken) -> bool {
        if !self.switch.is_crashed() {
            return false;
        }
        let current =
            self.outbox().get(object_id).await.ok().flatten().and_then(|r| r.dispatch).and_then(|i| i.lease_token);
        current.as_ref() != Some(d)
    }
}

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

/// Store decorator that pauses the first successful takeover (a claim of an instance whose
/// lease was held by someone else) until [`resume`](Self::resume).
pub struct TakeoverPause {
    inner: Arc<DynStore>,
    raw: Arc<DynStore>,
    armed: std::sync::atomic::AtomicBool,
    paused: tokio::sync::watch::Sender<bool>,
    resumed: tokio::sync::watch::Sender<bool>,
}

impl TakeoverPause {
    /// Pause `inner`'s first takeover; `raw` is read to know whether an instance was leased.
    pub fn new(inner: Arc<DynStore>, raw: Arc<DynStore>) -> Self {
        TakeoverPause {
            inner,
            raw,
            armed: std::sync::atomic::AtomicBool::new(true),
            paused: tokio::sync::watch::Sender::new(false),
            resumed: tokio::sync::watch::Sender::new(false),
        }
    }
    /// Resolves once the takeover happened and is paused.
    pub async fn wait_paused(&self) {
        let mut rx = self.paused.subscribe();
        let _ = rx.wait_for(|p| *p).await;
    }
    /// Let the paused claim return.
    pub fn resume(&self) {
        self.resumed.send_replace(true);
    }
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl WorkflowStore for TakeoverPause {
    async fn create(&self, instance: WorkflowInstance) -> Result<CreateOutcome> {
        self.inner.create(instance).await
    }
    async fn get(&self, workflow_id: &WorkflowId) -> Result<Option<WorkflowInstance>> {
        self.inner.get(workflow_id).await
    }
    async fn get_by_biz_key(&self, biz_key: &str) -> Result<Option<WorkflowInstance>> {
        self.inner.get_by_biz_key(biz_key).await
    }
    async fn claim(&self, workflow_id: &WorkflowId, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        let was_leased = self.raw.get(workflow_id).await.ok().flatten().is_some_and(|i| i.claim_token.is_some());
        let r = self.inner.claim(workflow_id, spec).await;
        if was_leased && matches!(r, Ok(Some(_))) && self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            self.paused.send_replace(true);
            let mut rx = self.resumed.subscribe();
            let _ = rx.wait_for(|r| *r).await;
        }
        r
    }
    async fn claim_any(&self, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        self.inner.claim_any(spec).await
    }
    async fn apply(
        &self,
        workflow_id: &WorkflowId,
        guard: &kernel_core::transition::Guard,
        transition: &kernel_core::transition::Transition,
    ) -> Result<WriteOutcome> {
        self.inner.apply(workflow_id, guard, transition).await
    }
    async fn scan_due_waits(&self, now: Instant, after: Option<&DueCursor>, limit: usize) -> Result<ScanPage<DueWait>> {
        self.inner.scan_due_waits(now, after, limit).await
    }
    async fn scan_claimable(&self, after: Option<&WorkflowId>, limit: usize) -> Result<ScanPage<Candidate>> {
        self.inner.scan_claimable(after, limit).await
    }
}
