//! Fault decorators over any port: crash before/after a call (by index or by named
//! boundary), an auditing store that counts writes and duplicate completions, lost wakeups
//! and flushed queues (see [`InMemoryQueue::flush`](crate::memory::InMemoryQueue::flush),
//! [`InMemoryWakeup::set_lossy`](crate::memory::InMemoryWakeup::set_lossy)).
//!
//! A crash is modelled as in TigerBeetle's and object_store's harnesses: the durable state
//! survives (it lives behind the decorator), the process's every later call parks forever,
//! and a later [`CrashSwitch::release`] lets the parked "zombie" continue, so its pending
//! write can be shown to be fenced.

use kernel_core::model::*;
use kernel_core::ports::*;
use kernel_core::transition::{Guard, Transition};
use kernel_core::Result;
use std::collections::BTreeMap;
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
}

#[derive(Debug, Default)]
struct SwitchState {
    log: Vec<BoundaryName>,
    per_name: BTreeMap<BoundaryName, u64>,
    crashed_at: Option<(u64, BoundaryName)>,
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

    /// Gate one call. Returns `true` when the process must die right after the call.
    async fn enter(&self, name: BoundaryName, boundary: bool) -> bool {
        if self.is_crashed() {
            self.wait_released().await;
            return false;
        }
        if !boundary {
            return false;
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
        };
        if before {
            self.die(index, name);
            self.wait_released().await;
        }
        after
            .then(|| {
                self.state.lock().expect("switch lock").crashed_at = Some((index, name));
            })
            .is_some()
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
        CrashPorts { switch, store, inbox, queue, permits, wakeup, outbox: None, candidates: None }
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
    pub fn wire(self: &Arc<Self>, mut ports: kernel_core::engine::Ports) -> kernel_core::engine::Ports {
        ports.store = self.clone();
        ports.inbox = self.clone();
        ports.queue = self.clone();
        ports.permits = self.clone();
        ports.wakeup = self.clone();
        ports
    }
}

macro_rules! gated {
    ($self:ident, $name:literal, $boundary:expr, $call:expr) => {{
        let die = $self.switch.enter($name, $boundary).await;
        let r = $call;
        $self.switch.leave(die).await;
        r
    }};
}

#[async_trait::async_trait]
impl WorkflowStore for CrashPorts {
    async fn create(&self, instance: WorkflowInstance) -> Result<CreateOutcome> {
        gated!(self, "store.create", true, self.store.create(instance).await)
    }
    async fn get(&self, workflow_id: &str) -> Result<Option<WorkflowInstance>> {
        gated!(self, "store.get", false, self.store.get(workflow_id).await)
    }
    async fn get_by_biz_key(&self, biz_key: &str) -> Result<Option<WorkflowInstance>> {
        gated!(self, "store.get_by_biz_key", false, self.store.get_by_biz_key(biz_key).await)
    }
    async fn claim(&self, workflow_id: &str, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        gated!(self, "store.claim", true, self.store.claim(workflow_id, spec).await)
    }
    async fn claim_any(&self, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        gated!(self, "store.claim_any", true, self.store.claim_any(spec).await)
    }
    async fn apply(&self, workflow_id: &str, guard: &Guard, transition: &Transition) -> Result<WriteOutcome> {
        let name: BoundaryName = match transition.kind() {
            kernel_core::transition::TransitionKind::Heartbeat => "store.apply.heartbeat",
            _ => "store.apply",
        };
        let die = self.switch.enter(name, true).await;
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
        self.switch.leave(die).await;
        r
    }
    async fn scan_due_waits(&self, now: Millis, limit: usize) -> Result<Vec<DueWait>> {
        gated!(self, "store.scan_due_waits", false, self.store.scan_due_waits(now, limit).await)
    }
    async fn scan_claimable(&self, after: Option<&str>, limit: usize) -> Result<Vec<Candidate>> {
        gated!(self, "store.scan_claimable", false, self.store.scan_claimable(after, limit).await)
    }
}

#[async_trait::async_trait]
impl SignalInbox for CrashPorts {
    async fn insert(&self, record: SignalRecord) -> Result<InsertOutcome> {
        gated!(self, "inbox.insert", true, self.inbox.insert(record).await)
    }
    async fn get(&self, signal_id: &str) -> Result<Option<SignalRecord>> {
        gated!(self, "inbox.get", false, self.inbox.get(signal_id).await)
    }
    async fn find_pending(
        &self,
        workflow_id: &str,
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
    async fn mark_matched(&self, signal_id: &str, now: Millis) -> Result<bool> {
        gated!(self, "inbox.mark_matched", true, self.inbox.mark_matched(signal_id, now).await)
    }
    async fn scan_pending(&self, after: Option<&str>, limit: usize) -> Result<Vec<SignalRecord>> {
        gated!(self, "inbox.scan_pending", false, self.inbox.scan_pending(after, limit).await)
    }
    async fn purge_older_than(&self, before: Millis, limit: usize) -> Result<u64> {
        gated!(self, "inbox.purge", true, self.inbox.purge_older_than(before, limit).await)
    }
}

#[async_trait::async_trait]
impl ReadyQueue for CrashPorts {
    async fn enqueue(&self, workflow_id: &str, priority: Priority, claimable_at: Millis) -> Result<()> {
        gated!(self, "queue.enqueue", true, self.queue.enqueue(workflow_id, priority, claimable_at).await)
    }
    async fn pop_due(&self, now: Millis) -> Result<Option<String>> {
        gated!(self, "queue.pop", true, self.queue.pop_due(now).await)
    }
    async fn stats(&self, now: Millis) -> Result<[LaneStats; 4]> {
        gated!(self, "queue.stats", false, self.queue.stats(now).await)
    }
}

#[async_trait::async_trait]
impl Permits for CrashPorts {
    async fn acquire(&self, resource: &str, owner: &PermitOwner) -> Result<PermitDecision> {
        gated!(self, "permits.acquire", true, self.permits.acquire(resource, owner).await)
    }
    async fn release(&self, resource: &str, owner: &PermitOwner) -> Result<()> {
        gated!(self, "permits.release", true, self.permits.release(resource, owner).await)
    }
}

#[async_trait::async_trait]
impl Wakeup for CrashPorts {
    async fn notify(&self) -> Result<()> {
        gated!(self, "wakeup.notify", false, self.wakeup.notify().await)
    }
    async fn subscribe(&self) -> Result<WakeupReceiver> {
        self.wakeup.subscribe().await
    }
}

#[async_trait::async_trait]
impl DispatchOutbox for CrashPorts {
    async fn accept(
        &self,
        object_id: &str,
        fields: serde_json::Value,
        initial_status: &str,
        intent: DispatchIntent,
    ) -> Result<AcceptOutcome> {
        gated!(self, "outbox.accept", true, self.outbox().accept(object_id, fields, initial_status, intent).await)
    }
    async fn get(&self, object_id: &str) -> Result<Option<DispatchRecord>> {
        gated!(self, "outbox.get", false, self.outbox().get(object_id).await)
    }
    async fn confirm_dispatched(&self, object_id: &str, f: &str) -> Result<bool> {
        gated!(self, "outbox.confirm_dispatched", true, self.outbox().confirm_dispatched(object_id, f).await)
    }
    async fn defer_pending(&self, object_id: &str, f: &str, at: Millis) -> Result<bool> {
        gated!(self, "outbox.defer_pending", true, self.outbox().defer_pending(object_id, f, at).await)
    }
    async fn try_lease(&self, object_id: &str, now: Millis, d: &str, until: Millis) -> Result<Option<DispatchRecord>> {
        gated!(self, "outbox.try_lease", true, self.outbox().try_lease(object_id, now, d, until).await)
    }
    async fn renew_lease(&self, object_id: &str, f: &str, d: &str, until: Millis) -> Result<bool> {
        let die = self.switch.enter("outbox.renew_lease", true).await;
        let stale = self.lease_is_stale(object_id, d).await;
        let r = self.outbox().renew_lease(object_id, f, d, until).await;
        if stale {
            self.switch.zombie_write(matches!(r, Ok(true)));
        }
        self.switch.leave(die).await;
        r
    }
    async fn confirm_leased(&self, object_id: &str, f: &str, d: &str) -> Result<bool> {
        let die = self.switch.enter("outbox.confirm_leased", true).await;
        let stale = self.lease_is_stale(object_id, d).await;
        let r = self.outbox().confirm_leased(object_id, f, d).await;
        if stale {
            self.switch.zombie_write(matches!(r, Ok(true)));
        }
        self.switch.leave(die).await;
        r
    }
    async fn revert_leased(&self, object_id: &str, f: &str, d: &str, at: Millis) -> Result<bool> {
        let die = self.switch.enter("outbox.revert_leased", true).await;
        let stale = self.lease_is_stale(object_id, d).await;
        let r = self.outbox().revert_leased(object_id, f, d, at).await;
        if stale {
            self.switch.zombie_write(matches!(r, Ok(true)));
        }
        self.switch.leave(die).await;
        r
    }
    async fn scan_due(&self, now: Millis, after: Option<&str>, limit: usize) -> Result<Vec<(String, Millis)>> {
        gated!(self, "outbox.scan_due", false, self.outbox().scan_due(now, after, limit).await)
    }
    async fn retry_failed(
        &self,
        object_id: &str,
        prev: &str,
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
        object_id: &str,
        f: &str,
        fields: serde_json::Value,
        status: Option<&str>,
    ) -> Result<bool> {
        gated!(self, "outbox.fenced_update", true, self.outbox().fenced_update(object_id, f, fields, status).await)
    }
    async fn try_lock(&self, name: &str, holder: &str, now: Millis, until: Millis) -> Result<bool> {
        gated!(self, "outbox.try_lock", true, self.outbox().try_lock(name, holder, now, until).await)
    }
}

#[async_trait::async_trait]
impl DispatchCandidates for CrashPorts {
    async fn add(&self, object_id: &str, due: Millis) -> Result<()> {
        gated!(self, "candidates.add", true, self.cands().add(object_id, due).await)
    }
    async fn pop_due(&self, now: Millis, max: usize) -> Result<Vec<String>> {
        gated!(self, "candidates.pop", true, self.cands().pop_due(now, max).await)
    }
}

impl CrashPorts {
    /// Whether a released dispatcher writes with a lease token that is no longer current.
    async fn lease_is_stale(&self, object_id: &str, d: &str) -> bool {
        if !self.switch.is_crashed() {
            return false;
        }
        let current =
            self.outbox().get(object_id).await.ok().flatten().and_then(|r| r.dispatch).and_then(|i| i.lease_token);
        current.as_deref() != Some(d)
    }
}

/// Counts of store traffic seen by an [`AuditStore`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AuditCounts {
    /// Calls that write (create, claim, claim_any, apply), whatever their outcome.
    pub writes: u64,
    /// Reads (get, get_by_biz_key, scans).
    pub reads: u64,
    /// Accepted step completions per (workflow_id, workflow_run, step index).
    pub completions: BTreeMap<(String, u32, u32), u64>,
    /// Accepted writes per transition kind label.
    pub accepted: BTreeMap<String, u64>,
}

impl AuditCounts {
    /// Accepted completions above one per (instance, run, step).
    pub fn duplicate_step_completions(&self) -> u64 {
        self.completions.values().map(|n| n.saturating_sub(1)).sum()
    }
}

/// The database's own view: counts writes and reads, and accepted completions per
/// (instance, run, step), independently of the engine.
#[derive(Clone)]
pub struct AuditStore {
    inner: Arc<DynStore>,
    counts: Arc<Mutex<AuditCounts>>,
}

impl std::fmt::Debug for AuditStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditStore").field("counts", &self.counts()).finish_non_exhaustive()
    }
}

impl AuditStore {
    /// Audit `inner`.
    pub fn new(inner: Arc<DynStore>) -> Self {
        AuditStore { inner, counts: Arc::default() }
    }
    /// A snapshot of the counters.
    pub fn counts(&self) -> AuditCounts {
        self.counts.lock().expect("audit lock").clone()
    }
    /// Zero the write/read counters (completions are kept).
    pub fn reset_traffic(&self) {
        let mut c = self.counts.lock().expect("audit lock");
        c.writes = 0;
        c.reads = 0;
        c.accepted.clear();
    }
    fn read(&self) {
        self.counts.lock().expect("audit lock").reads += 1;
    }
    fn write(&self) {
        self.counts.lock().expect("audit lock").writes += 1;
    }
}

#[async_trait::async_trait]
impl WorkflowStore for AuditStore {
    async fn create(&self, instance: WorkflowInstance) -> Result<CreateOutcome> {
        self.write();
        self.inner.create(instance).await
    }
    async fn get(&self, workflow_id: &str) -> Result<Option<WorkflowInstance>> {
        self.read();
        self.inner.get(workflow_id).await
    }
    async fn get_by_biz_key(&self, biz_key: &str) -> Result<Option<WorkflowInstance>> {
        self.read();
        self.inner.get_by_biz_key(biz_key).await
    }
    async fn claim(&self, workflow_id: &str, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        self.write();
        let r = self.inner.claim(workflow_id, spec).await;
        if matches!(r, Ok(Some(_))) {
            *self.counts.lock().expect("audit lock").accepted.entry("claim".into()).or_insert(0) += 1;
        }
        r
    }
    async fn claim_any(&self, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        self.write();
        let r = self.inner.claim_any(spec).await;
        if matches!(r, Ok(Some(_))) {
            *self.counts.lock().expect("audit lock").accepted.entry("claim".into()).or_insert(0) += 1;
        }
        r
    }
    async fn apply(&self, workflow_id: &str, guard: &Guard, transition: &Transition) -> Result<WriteOutcome> {
        self.write();
        let r = self.inner.apply(workflow_id, guard, transition).await;
        if let Ok(WriteOutcome::Applied { .. }) = r {
            // The run of the completion is read back from the store, not taken from the engine.
            let run = self.inner.get(workflow_id).await.ok().flatten().map_or(0, |i| i.retry_count);
            let mut c = self.counts.lock().expect("audit lock");
            for step in transition.completed_steps() {
                *c.completions.entry((workflow_id.to_string(), run, step)).or_insert(0) += 1;
            }
            let label = format!("{:?}", transition.kinds);
            *c.accepted.entry(label).or_insert(0) += 1;
        }
        r
    }
    async fn scan_due_waits(&self, now: Millis, limit: usize) -> Result<Vec<DueWait>> {
        self.read();
        self.inner.scan_due_waits(now, limit).await
    }
    async fn scan_claimable(&self, after: Option<&str>, limit: usize) -> Result<Vec<Candidate>> {
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
impl WorkflowStore for TakeoverPause {
    async fn create(&self, instance: WorkflowInstance) -> Result<CreateOutcome> {
        self.inner.create(instance).await
    }
    async fn get(&self, workflow_id: &str) -> Result<Option<WorkflowInstance>> {
        self.inner.get(workflow_id).await
    }
    async fn get_by_biz_key(&self, biz_key: &str) -> Result<Option<WorkflowInstance>> {
        self.inner.get_by_biz_key(biz_key).await
    }
    async fn claim(&self, workflow_id: &str, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
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
        workflow_id: &str,
        guard: &kernel_core::transition::Guard,
        transition: &kernel_core::transition::Transition,
    ) -> Result<WriteOutcome> {
        self.inner.apply(workflow_id, guard, transition).await
    }
    async fn scan_due_waits(&self, now: Millis, limit: usize) -> Result<Vec<DueWait>> {
        self.inner.scan_due_waits(now, limit).await
    }
    async fn scan_claimable(&self, after: Option<&str>, limit: usize) -> Result<Vec<Candidate>> {
        self.inner.scan_claimable(after, limit).await
    }
}
