//! `CrashPorts`: every port behind one [`CrashSwitch`](super::CrashSwitch), each call a named
//! persistence boundary where the plan may crash the process.

use super::*;
use kernel_core::domain::*;
use kernel_core::ports::*;
use kernel_core::transition::TransitionKind;
use kernel_core::transition::{Guard, Transition};
use kernel_core::Result;
use kernel_core::{FencingToken, LeaseToken, ObjectId, WorkflowId};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

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
