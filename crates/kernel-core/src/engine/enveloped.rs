//! [`Enveloped`]: a port whose every call runs in a [`PortEnvelope`] — one implementation of
//! each port trait, every method forwarded unchanged through [`PortEnvelope::call`].
//!
//! Each method is listed once, with whether it writes: a write that passes its deadline
//! may still be applied ([`Error::Uncertain`](crate::Error::Uncertain)), a read certainly
//! was not ([`Error::Unavailable`](crate::Error::Unavailable)). Every trait method is
//! implemented (`clippy::missing_trait_methods`), so a default body can never skip the
//! envelope. A method whose calls go by another port name than their trait's says so after
//! `=>`: the heartbeat's store write is `heartbeat.apply` ([`PortCall::port`]).

use super::envelope::{Effect, PortCall, PortEnvelope};
use crate::domain::{DurationMs, Instant, Priority, WorkflowInstance};
use crate::error::Result;
use crate::id::{FencingToken, LeaseToken, ObjectId, WorkflowId};
use crate::ports::*;
use crate::transition::{Guard, Transition, TransitionKind};
use serde_json::Value;
use std::sync::Arc;

/// A port of type `P` (`DynStore`, `DynQueue`, …) whose every call runs in an envelope.
pub struct Enveloped<P: ?Sized> {
    inner: Arc<P>,
    env: Arc<PortEnvelope>,
}

impl<P: ?Sized> std::fmt::Debug for Enveloped<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enveloped").field("envelope", &self.env).finish_non_exhaustive()
    }
}

impl<P: ?Sized> Enveloped<P> {
    /// Every call of `inner` gives up after `deadline_ms` of `clock`; no hook.
    pub fn new(inner: Arc<P>, clock: Arc<DynClock>, deadline_ms: DurationMs) -> Self {
        Enveloped { inner, env: Arc::new(PortEnvelope::new(clock, deadline_ms)) }
    }

    /// Run every call of `inner` in `env`.
    pub fn wrap(inner: Arc<P>, env: Arc<PortEnvelope>) -> Self {
        Enveloped { inner, env }
    }
}

macro_rules! enveloped {
    ($trait:ident for $dyn:ty, $port:literal { $( $effect:ident fn $name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty $(=> $port_of:expr)?; )* }) => {
        #[async_trait::async_trait]
        #[deny(clippy::missing_trait_methods)]
        impl $trait for Enveloped<$dyn> {
            $(
                async fn $name(&self, $($arg: $ty),*) -> Result<$ret> {
                    let port = enveloped!(@port $port $(, $port_of)?);
                    let call = PortCall { port, op: stringify!($name), effect: Effect::$effect };
                    self.env.call(call, self.inner.$name($($arg),*)).await
                }
            )*
        }
    };
    (@port $port:literal) => { $port };
    (@port $port:literal, $port_of:expr) => { $port_of };
}

/// The port name of a store write: `heartbeat` for a lease renewal (K-6.3), `store` for
/// every other one.
fn store_or_heartbeat(transition: &Transition) -> &'static str {
    if transition.kinds().any(|k| k == TransitionKind::Heartbeat) {
        "heartbeat"
    } else {
        "store"
    }
}

enveloped!(WorkflowStore for DynStore, "store" {
    Write fn create(instance: WorkflowInstance) -> CreateOutcome;
    Read fn get(workflow_id: &WorkflowId) -> Option<WorkflowInstance>;
    Read fn get_by_biz_key(biz_key: &str) -> Option<WorkflowInstance>;
    Write fn claim(workflow_id: &WorkflowId, spec: &ClaimSpec) -> Option<WorkflowInstance>;
    Write fn claim_any(spec: &ClaimSpec) -> Option<WorkflowInstance>;
    Write fn apply(workflow_id: &WorkflowId, guard: &Guard, transition: &Transition) -> WriteOutcome => store_or_heartbeat(transition);
    Read fn scan_due_waits(now: Instant, after: Option<&DueCursor>, limit: usize) -> ScanPage<DueWait>;
    Read fn scan_claimable(after: Option<&WorkflowId>, limit: usize) -> ScanPage<Candidate>;
});

enveloped!(SignalInbox for DynInbox, "inbox" {
    Write fn insert(record: SignalRecord) -> InsertOutcome;
    Read fn get(signal_id: &str) -> Option<SignalRecord>;
    Read fn find_pending(workflow_id: &WorkflowId, signal_type: &str, wait_key: &str, generation: u64) -> Option<SignalRecord>;
    Write fn mark_matched(signal_id: &str, now: Instant) -> bool;
    Read fn scan_pending(after: Option<&str>, limit: usize) -> SignalPage;
    Read fn scan_created_before(before: Instant, after: Option<&str>, limit: usize) -> SignalPage;
    Read fn scan_workflow(workflow_id: &WorkflowId, status: SignalStatus, limit: usize) -> Vec<SignalRecord>;
    Write fn delete_if(signal_ids: &[String], status: SignalStatus) -> u64;
    Read fn count_pending_orphans(workflow_id: Option<&WorkflowId>, limit: u64) -> u64;
    Write fn clear_orphans(workflow_id: &WorkflowId) -> u64;
});

enveloped!(ReadyQueue for DynQueue, "queue" {
    Write fn enqueue(workflow_id: &WorkflowId, priority: Priority, claimable_at: Instant) -> ();
    Write fn enqueue_many(entries: &[LaneEntry]) -> ();
    Write fn pop_due(now: Instant, max: usize) -> Vec<WorkflowId>;
    Read fn stats(now: Instant) -> [LaneStats; 4];
});

enveloped!(Wakeup for DynWakeup, "wakeup" {
    Write fn notify() -> ();
    Read fn subscribe() -> WakeupReceiver;
});

enveloped!(Permits for DynPermits, "permits" {
    Write fn acquire(resource: &str, owner: &PermitOwner) -> PermitDecision;
    Write fn renew(resource: &str, owner: &PermitOwner) -> PermitDecision;
    Write fn release(resource: &str, owner: &PermitOwner) -> ();
    Read fn usage(resource: &str) -> PermitUsage;
    Read fn resources() -> Vec<String>;
    Write fn set_limits(resource: &str, limits: PermitLimits) -> ();
});

enveloped!(StreamSink for DynStreamSink, "stream" {
    Write fn reset(key: &StreamKey, owner: StreamOwner) -> u64;
    Write fn append(key: &StreamKey, owner: StreamOwner, frame: Frame) -> u64;
    Write fn terminal(key: &StreamKey, owner: StreamOwner, summary: Value) -> ();
});

enveloped!(ResultCache for DynResultCache, "cache" {
    Read fn get(key: &CacheKey, now: Instant) -> Option<CachedResult>;
    Write fn put(key: &CacheKey, value: &Value, now: Instant, ttl: DurationMs) -> ();
    Write fn purge_expired(now: Instant, limit: usize) -> u64;
});

enveloped!(DeadLetters for DynDeadLetters, "dead_letters" {
    Write fn record(dl: &DeadLetter) -> bool;
    Read fn get(id: &str) -> Option<DeadLetter>;
    Read fn list(status: Option<DeadLetterStatus>, after: Option<&str>, limit: usize) -> Vec<DeadLetter>;
    Write fn decide(id: &str, decision: &DeadLetterDecision) -> DecideOutcome;
    Write fn close(id: &str, now: Instant) -> bool;
    Write fn purge_closed(before: Instant, limit: usize) -> u64;
});

enveloped!(TaskInbox for DynTaskInbox, "task_inbox" {
    Write fn open(task: &TaskRecord) -> Option<TaskRecord>;
    Read fn get(id: &str) -> Option<TaskRecord>;
    Read fn list_open(actor: &Actor, after: Option<&str>, limit: usize) -> Vec<TaskRecord>;
    Write fn decide(id: &str, token: &str, actor: &Actor, decision: &TaskDecision) -> TaskDecideOutcome;
    Write fn close(id: &str, now: Instant) -> TaskCloseOutcome;
    Write fn purge_sensitive_reasons(before: Instant, limit: usize) -> u64;
    Write fn purge_closed(before: Instant, limit: usize) -> u64;
});

enveloped!(DispatchOutbox for DynOutbox, "outbox" {
    Write fn accept(object_id: &ObjectId, fields: Value, initial_status: &str, intent: DispatchIntent) -> AcceptOutcome;
    Read fn get(object_id: &ObjectId) -> Option<DispatchRecord>;
    Write fn confirm_dispatched(object_id: &ObjectId, fencing_token: &FencingToken) -> bool;
    Write fn defer_pending(object_id: &ObjectId, fencing_token: &FencingToken, at: Instant) -> bool;
    Write fn try_lease(object_id: &ObjectId, now: Instant, lease_token: &LeaseToken, lease_until: Instant) -> Option<DispatchRecord>;
    Write fn renew_lease(object_id: &ObjectId, fencing_token: &FencingToken, lease_token: &LeaseToken, lease_until: Instant) -> bool;
    Write fn confirm_leased(object_id: &ObjectId, fencing_token: &FencingToken, lease_token: &LeaseToken) -> bool;
    Write fn revert_leased(object_id: &ObjectId, fencing_token: &FencingToken, lease_token: &LeaseToken, at: Instant) -> bool;
    Read fn scan_due(now: Instant, after: Option<&ObjectId>, limit: usize) -> Vec<(ObjectId, Instant)>;
    Write fn retry_failed(object_id: &ObjectId, prev_fencing_token: &FencingToken, next: DispatchIntent, initial_status: &str) -> bool;
    Write fn fenced_update(object_id: &ObjectId, fencing_token: &FencingToken, fields: Value, business_status: Option<&str>) -> bool;
    Write fn try_lock(name: &str, holder: &str, now: Instant, until: Instant) -> bool;
});
