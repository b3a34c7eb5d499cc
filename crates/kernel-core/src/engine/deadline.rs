//! Deadlines on store calls, measured on the [`Clock`] port.
//!
//! A primary that stops answering must not hold a claim, a heartbeat or a scheduling round
//! forever. [`DeadlineStore`] gives every call of the wrapped store a deadline of the
//! engine's clock: a write that passes it is [`Error::Uncertain`] (it may still be applied
//! later), a read is [`Error::Unavailable`]. The engine wraps its store in one on
//! [`build`](super::EngineBuilder::build); the heartbeat adds its own, shorter deadline
//! (`EngineConfig::heartbeat_deadline_ms`) so that a process that cannot renew its lease
//! ends the claim before the lease can be taken over.

use crate::error::{Error, Result};
use crate::id::{FencingToken, LeaseToken, ObjectId, WorkflowId};
use crate::model::{DurationMs, Instant, WorkflowInstance};
use crate::ports::*;
use crate::transition::{Guard, Transition};
use serde_json::Value;
use std::future::Future;
use std::sync::Arc;

/// Whether a call that passed its deadline may have had an effect.
#[derive(Clone, Copy)]
pub(crate) enum Call {
    /// A read: certainly no effect.
    Read,
    /// A write: it may still be applied.
    Write,
}

/// Run `fut` until `deadline_ms` of `clock` have passed; then give up with a typed error.
pub(crate) async fn within<T>(
    clock: &DynClock,
    deadline_ms: DurationMs,
    call: Call,
    what: &str,
    fut: impl Future<Output = Result<T>>,
) -> Result<T> {
    let until = clock.now().saturating_add(deadline_ms);
    tokio::select! {
        r = fut => r,
        _ = clock.sleep_until(until) => {
            let message = format!("store {what}: no answer within {deadline_ms} ms");
            tracing::warn!(call = what, deadline_ms = deadline_ms.as_millis(), "store call passed its deadline");
            Err(match call {
                Call::Read => Error::unavailable(message),
                Call::Write => Error::uncertain(message),
            })
        }
    }
}

/// A [`WorkflowStore`] whose every call has a deadline on the given clock.
///
/// A write that passes its deadline is [`Error::Uncertain`]: its effect is unknown, so the
/// caller ends the claim and never retries it blindly (K-6.4). A read that passes it is
/// [`Error::Unavailable`]. Answers within the deadline are passed through unchanged.
pub struct DeadlineStore {
    inner: Arc<DynStore>,
    clock: Arc<DynClock>,
    deadline_ms: DurationMs,
}

impl std::fmt::Debug for DeadlineStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadlineStore").field("deadline_ms", &self.deadline_ms).finish_non_exhaustive()
    }
}

impl DeadlineStore {
    /// Wrap `inner`: every call gives up after `deadline_ms` of `clock`.
    pub fn new(inner: Arc<DynStore>, clock: Arc<DynClock>, deadline_ms: DurationMs) -> Self {
        DeadlineStore { inner, clock, deadline_ms }
    }

    async fn call<T>(&self, call: Call, what: &str, fut: impl Future<Output = Result<T>>) -> Result<T> {
        within(&*self.clock, self.deadline_ms, call, what, fut).await
    }
}

#[async_trait::async_trait]
impl WorkflowStore for DeadlineStore {
    async fn create(&self, instance: WorkflowInstance) -> Result<CreateOutcome> {
        self.call(Call::Write, "create", self.inner.create(instance)).await
    }
    async fn get(&self, workflow_id: &WorkflowId) -> Result<Option<WorkflowInstance>> {
        self.call(Call::Read, "get", self.inner.get(workflow_id)).await
    }
    async fn get_by_biz_key(&self, biz_key: &str) -> Result<Option<WorkflowInstance>> {
        self.call(Call::Read, "get_by_biz_key", self.inner.get_by_biz_key(biz_key)).await
    }
    async fn claim(&self, workflow_id: &WorkflowId, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        self.call(Call::Write, "claim", self.inner.claim(workflow_id, spec)).await
    }
    async fn claim_any(&self, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        self.call(Call::Write, "claim_any", self.inner.claim_any(spec)).await
    }
    async fn apply(&self, workflow_id: &WorkflowId, guard: &Guard, transition: &Transition) -> Result<WriteOutcome> {
        self.call(Call::Write, "apply", self.inner.apply(workflow_id, guard, transition)).await
    }
    async fn scan_due_waits(&self, now: Instant, after: Option<&DueCursor>, limit: usize) -> Result<ScanPage<DueWait>> {
        self.call(Call::Read, "scan_due_waits", self.inner.scan_due_waits(now, after, limit)).await
    }
    async fn scan_claimable(&self, after: Option<&WorkflowId>, limit: usize) -> Result<ScanPage<Candidate>> {
        self.call(Call::Read, "scan_claimable", self.inner.scan_claimable(after, limit)).await
    }
}

/// A [`SignalInbox`] whose every call has a deadline on the given clock, with the same
/// meaning as [`DeadlineStore`]: a write that passes it is [`Error::Uncertain`], a read
/// [`Error::Unavailable`]. The inbox lives on the same durable store, so a hung primary
/// must not hold a signal delivery, a repair scan or a retention pass either.
pub struct DeadlineInbox {
    inner: Arc<DynInbox>,
    clock: Arc<DynClock>,
    deadline_ms: DurationMs,
}

impl std::fmt::Debug for DeadlineInbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadlineInbox").field("deadline_ms", &self.deadline_ms).finish_non_exhaustive()
    }
}

impl DeadlineInbox {
    /// Wrap `inner`: every call gives up after `deadline_ms` of `clock`.
    pub fn new(inner: Arc<DynInbox>, clock: Arc<DynClock>, deadline_ms: DurationMs) -> Self {
        DeadlineInbox { inner, clock, deadline_ms }
    }

    async fn call<T>(&self, call: Call, what: &str, fut: impl Future<Output = Result<T>>) -> Result<T> {
        within(&*self.clock, self.deadline_ms, call, what, fut).await
    }
}

#[async_trait::async_trait]
impl SignalInbox for DeadlineInbox {
    async fn insert(&self, record: SignalRecord) -> Result<InsertOutcome> {
        self.call(Call::Write, "inbox insert", self.inner.insert(record)).await
    }
    async fn get(&self, signal_id: &str) -> Result<Option<SignalRecord>> {
        self.call(Call::Read, "inbox get", self.inner.get(signal_id)).await
    }
    async fn find_pending(
        &self,
        workflow_id: &WorkflowId,
        signal_type: &str,
        wait_key: &str,
        generation: u64,
    ) -> Result<Option<SignalRecord>> {
        let fut = self.inner.find_pending(workflow_id, signal_type, wait_key, generation);
        self.call(Call::Read, "inbox find_pending", fut).await
    }
    async fn mark_matched(&self, signal_id: &str, now: Instant) -> Result<bool> {
        self.call(Call::Write, "inbox mark_matched", self.inner.mark_matched(signal_id, now)).await
    }
    async fn scan_pending(&self, after: Option<&str>, limit: usize) -> Result<Vec<SignalRecord>> {
        self.call(Call::Read, "inbox scan_pending", self.inner.scan_pending(after, limit)).await
    }
    async fn scan_created_before(
        &self,
        before: Instant,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<SignalRecord>> {
        let fut = self.inner.scan_created_before(before, after, limit);
        self.call(Call::Read, "inbox scan_created_before", fut).await
    }
    async fn scan_workflow(
        &self,
        workflow_id: &WorkflowId,
        status: SignalStatus,
        limit: usize,
    ) -> Result<Vec<SignalRecord>> {
        self.call(Call::Read, "inbox scan_workflow", self.inner.scan_workflow(workflow_id, status, limit)).await
    }
    async fn delete_if(&self, signal_ids: &[String], status: SignalStatus) -> Result<u64> {
        self.call(Call::Write, "inbox delete_if", self.inner.delete_if(signal_ids, status)).await
    }
    async fn count_pending_orphans(&self, workflow_id: Option<&WorkflowId>, limit: u64) -> Result<u64> {
        let fut = self.inner.count_pending_orphans(workflow_id, limit);
        self.call(Call::Read, "inbox count_pending_orphans", fut).await
    }
    async fn clear_orphans(&self, workflow_id: &WorkflowId) -> Result<u64> {
        self.call(Call::Write, "inbox clear_orphans", self.inner.clear_orphans(workflow_id)).await
    }
}

/// A [`DispatchOutbox`] whose every call has a deadline on the given clock, with the same
/// meaning as [`DeadlineStore`]: a write that passes it is [`Error::Uncertain`], a read
/// [`Error::Unavailable`]. [`Dispatch`](crate::dispatch::Dispatch) wraps its outbox in one
/// (`DispatchConfig::store_call_deadline_ms`).
pub struct DeadlineOutbox {
    inner: Arc<DynOutbox>,
    clock: Arc<DynClock>,
    deadline_ms: DurationMs,
}

impl std::fmt::Debug for DeadlineOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadlineOutbox").field("deadline_ms", &self.deadline_ms).finish_non_exhaustive()
    }
}

impl DeadlineOutbox {
    /// Wrap `inner`: every call gives up after `deadline_ms` of `clock`.
    pub fn new(inner: Arc<DynOutbox>, clock: Arc<DynClock>, deadline_ms: DurationMs) -> Self {
        DeadlineOutbox { inner, clock, deadline_ms }
    }

    async fn call<T>(&self, call: Call, what: &str, fut: impl Future<Output = Result<T>>) -> Result<T> {
        within(&*self.clock, self.deadline_ms, call, what, fut).await
    }
}

#[async_trait::async_trait]
impl DispatchOutbox for DeadlineOutbox {
    async fn accept(
        &self,
        object_id: &ObjectId,
        fields: Value,
        initial_status: &str,
        intent: DispatchIntent,
    ) -> Result<AcceptOutcome> {
        let fut = self.inner.accept(object_id, fields, initial_status, intent);
        self.call(Call::Write, "outbox accept", fut).await
    }
    async fn get(&self, object_id: &ObjectId) -> Result<Option<DispatchRecord>> {
        self.call(Call::Read, "outbox get", self.inner.get(object_id)).await
    }
    async fn confirm_dispatched(&self, object_id: &ObjectId, fencing_token: &FencingToken) -> Result<bool> {
        self.call(Call::Write, "outbox confirm_dispatched", self.inner.confirm_dispatched(object_id, fencing_token))
            .await
    }
    async fn defer_pending(&self, object_id: &ObjectId, fencing_token: &FencingToken, at: Instant) -> Result<bool> {
        self.call(Call::Write, "outbox defer_pending", self.inner.defer_pending(object_id, fencing_token, at)).await
    }
    async fn try_lease(
        &self,
        object_id: &ObjectId,
        now: Instant,
        lease_token: &LeaseToken,
        lease_until: Instant,
    ) -> Result<Option<DispatchRecord>> {
        let fut = self.inner.try_lease(object_id, now, lease_token, lease_until);
        self.call(Call::Write, "outbox try_lease", fut).await
    }
    async fn renew_lease(
        &self,
        object_id: &ObjectId,
        fencing_token: &FencingToken,
        lease_token: &LeaseToken,
        lease_until: Instant,
    ) -> Result<bool> {
        let fut = self.inner.renew_lease(object_id, fencing_token, lease_token, lease_until);
        self.call(Call::Write, "outbox renew_lease", fut).await
    }
    async fn confirm_leased(
        &self,
        object_id: &ObjectId,
        fencing_token: &FencingToken,
        lease_token: &LeaseToken,
    ) -> Result<bool> {
        let fut = self.inner.confirm_leased(object_id, fencing_token, lease_token);
        self.call(Call::Write, "outbox confirm_leased", fut).await
    }
    async fn revert_leased(
        &self,
        object_id: &ObjectId,
        fencing_token: &FencingToken,
        lease_token: &LeaseToken,
        at: Instant,
    ) -> Result<bool> {
        let fut = self.inner.revert_leased(object_id, fencing_token, lease_token, at);
        self.call(Call::Write, "outbox revert_leased", fut).await
    }
    async fn scan_due(&self, now: Instant, after: Option<&ObjectId>, limit: usize) -> Result<Vec<(ObjectId, Instant)>> {
        self.call(Call::Read, "outbox scan_due", self.inner.scan_due(now, after, limit)).await
    }
    async fn retry_failed(
        &self,
        object_id: &ObjectId,
        prev_fencing_token: &FencingToken,
        next: DispatchIntent,
        initial_status: &str,
    ) -> Result<bool> {
        let fut = self.inner.retry_failed(object_id, prev_fencing_token, next, initial_status);
        self.call(Call::Write, "outbox retry_failed", fut).await
    }
    async fn fenced_update(
        &self,
        object_id: &ObjectId,
        fencing_token: &FencingToken,
        fields: Value,
        business_status: Option<&str>,
    ) -> Result<bool> {
        let fut = self.inner.fenced_update(object_id, fencing_token, fields, business_status);
        self.call(Call::Write, "outbox fenced_update", fut).await
    }
    async fn try_lock(&self, name: &str, holder: &str, now: Instant, until: Instant) -> Result<bool> {
        self.call(Call::Write, "outbox try_lock", self.inner.try_lock(name, holder, now, until)).await
    }
}
