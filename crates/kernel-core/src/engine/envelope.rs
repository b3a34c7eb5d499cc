//! The one envelope every port call of the engine passes through (K-6.8).
//!
//! A port that stops answering must not hold a claim, a heartbeat, a scheduling round or a
//! maintenance pass forever, whichever port it is. [`PortEnvelope::call`] gives one call a
//! deadline on the [`Clock`](crate::ports::Clock) port — a write that passes it is
//! [`Error::Uncertain`] (it may still be applied later), a read [`Error::Unavailable`] —
//! and runs the deployment's [`PortHook`] around it (metrics; the fault injection of the
//! test world: a hung port, a refused call, a lost reply).
//!
//! A lost reply is a write that took effect while its caller heard an error: after the port
//! answered a write, the hook's [`reply`](PortHook::reply) may drop the answer and hand the
//! caller an error instead (in the test world [`Error::Uncertain`], what a caller gets from
//! a connection cut after the primary committed). The engine must treat it as it treats a
//! passed deadline: end the claim, retry nothing blindly (K-6.4).
//!
//! The engine applies it to **every** port of its [`Ports`] when it is built
//! ([`envelop`], which takes `Ports` apart field by field, so a port added to `Ports`
//! without an envelope is a compile error): the store, the signal inbox, the ready queue,
//! the wakeup, the permits, the stream sink, the result cache, the dead letters and the task
//! inbox. The clock and the id generator do no I/O; the observation sink's `emit` is
//! synchronous and non-blocking by contract (K-1.2), so neither needs one.

use super::ports::Ports;
use crate::domain::DurationMs;
use crate::error::{Error, Result};
use crate::ports::DynClock;
use std::future::Future;
use std::sync::Arc;

/// Whether a call that passed its deadline may have had an effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// A read: certainly no effect; past its deadline it is [`Error::Unavailable`].
    Read,
    /// A write: it may still be applied; past its deadline it is [`Error::Uncertain`].
    Write,
}

/// One call through the envelope: which port, which method, read or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortCall {
    /// The port: `store`, `inbox`, `queue`, `wakeup`, `permits`, `stream`, `cache`,
    /// `dead_letters`, `task_inbox`, `outbox` or `heartbeat` (the heartbeat's store write,
    /// `heartbeat.apply`, which has its own, shorter deadline: named apart so that a hook can
    /// count, hang or drop the lease renewals without touching the claim's other writes).
    pub port: &'static str,
    /// The port method (`record`, `open`, `acquire`, …).
    pub op: &'static str,
    /// Read or write.
    pub effect: Effect,
}

impl std::fmt::Display for PortCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.port, self.op)
    }
}

/// How a call through the envelope ended, for [`PortHook::after`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallEnd {
    /// The port answered with a value.
    Answered,
    /// The port (or the hook's `before`) answered with an error.
    Failed,
    /// The call passed its deadline; the caller got a typed error.
    DeadlinePassed,
    /// The port answered a write, and the hook's [`reply`](PortHook::reply) dropped the
    /// answer: the write took effect, the caller got the hook's error (a lost reply).
    ReplyLost,
    /// The caller stopped awaiting the call before it ended (a shorter deadline of its
    /// own, as the heartbeat's; a cancelled claim): whether a write took effect is
    /// unknown.
    Abandoned,
}

/// Reports [`CallEnd::Abandoned`] to the hook when a call's future is dropped before it
/// ended.
struct Pending<'a> {
    hook: Option<&'a dyn PortHook>,
    call: PortCall,
    clock: &'a DynClock,
    started: crate::domain::Instant,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(h) = self.hook.take() {
            h.after(&self.call, CallEnd::Abandoned, self.clock.now().duration_since(self.started));
        }
    }
}

/// What a deployment (metrics) or a test world (faults) runs around every port call.
///
/// # Contract
/// - [`before`](Self::before) runs inside the call's deadline, before the call reaches
///   the port: it may delay (a hung port: the deadline still ends the call) or refuse the
///   call (an `Err`: the port never sees it, the caller gets that error).
/// - [`reply`](Self::reply) runs once per write ([`Effect::Write`]) its port answered
///   with a value, synchronously, before the caller sees the answer: it may drop that
///   answer and give the caller an error instead, although the write took effect (a lost
///   reply). The error should be [`Error::Uncertain`] — the only error that tells the
///   caller the truth, that the effect may have happened; any other one models a port that
///   lies about its effect. The default keeps every answer, as a deployment's hook does.
/// - [`after`](Self::after) runs once per call, after it answered, was refused, lost its
///   reply or passed its deadline, synchronously: it must not block (count, record, log).
///   A call its caller stops awaiting first (a shorter deadline of its own, as the
///   heartbeat's; a claim's cancellation) gets its `after` with [`CallEnd::Abandoned`]
///   when its future is dropped.
/// - A hook never changes a port's answer otherwise (a read's answer never); it holds no
///   lock across `before`.
#[async_trait::async_trait]
pub trait PortHook: Send + Sync + 'static {
    /// Before `call` reaches its port.
    async fn before(&self, call: &PortCall) -> Result<()>;
    /// After the port answered the write `call` with a value: `Some(e)` drops that answer
    /// and the caller gets `e` (a lost reply: the effect happened). `None`, the default,
    /// passes the answer on.
    fn reply(&self, call: &PortCall) -> Option<Error> {
        let _ = call;
        None
    }
    /// After `call` ended, `elapsed` on the engine's clock.
    fn after(&self, call: &PortCall, end: CallEnd, elapsed: DurationMs);
}

/// A deadline on a clock and an optional hook: what every port call of the engine runs in.
#[derive(Clone)]
pub struct PortEnvelope {
    clock: Arc<DynClock>,
    deadline_ms: DurationMs,
    hook: Option<Arc<dyn PortHook>>,
}

impl std::fmt::Debug for PortEnvelope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortEnvelope")
            .field("deadline_ms", &self.deadline_ms)
            .field("hook", &self.hook.is_some())
            .finish_non_exhaustive()
    }
}

impl PortEnvelope {
    /// Calls give up after `deadline_ms` of `clock`; no hook.
    pub fn new(clock: Arc<DynClock>, deadline_ms: DurationMs) -> Self {
        PortEnvelope { clock, deadline_ms, hook: None }
    }

    /// Run `hook` around every call.
    pub fn with_hook(mut self, hook: Option<Arc<dyn PortHook>>) -> Self {
        self.hook = hook;
        self
    }

    /// The deadline of one call.
    pub fn deadline_ms(&self) -> DurationMs {
        self.deadline_ms
    }

    /// Run `fut` as `call`: the hook's `before`, then the call, all within the deadline;
    /// for a write the port answered, the hook's `reply` (which may lose the answer); then
    /// the hook's `after`.
    pub async fn call<T>(&self, call: PortCall, fut: impl Future<Output = Result<T>>) -> Result<T> {
        let started = self.clock.now();
        let until = started.saturating_add(self.deadline_ms);
        let hook = self.hook.as_deref();
        let mut pending = Pending { hook, call, clock: &*self.clock, started };
        let guarded = async {
            if let Some(h) = hook {
                h.before(&call).await?;
            }
            fut.await
        };
        let (r, end) = tokio::select! {
            r = guarded => {
                let end = if r.is_ok() { CallEnd::Answered } else { CallEnd::Failed };
                (r, end)
            }
            _ = self.clock.sleep_until(until) => (Err(self.passed(&call)), CallEnd::DeadlinePassed),
        };
        let lost = match (hook, &r) {
            (Some(h), Ok(_)) if call.effect == Effect::Write => h.reply(&call),
            _ => None,
        };
        let (r, end) = match lost {
            Some(e) => {
                tracing::warn!(port = call.port, op = call.op, error = %e, "port hook lost the reply of an applied write");
                (Err(e), CallEnd::ReplyLost)
            }
            None => (r, end),
        };
        // Ended: the guard reports nothing; `after` gets the end.
        pending.hook = None;
        if let Some(h) = hook {
            h.after(&call, end, self.clock.now().duration_since(started));
        }
        r
    }

    fn passed(&self, call: &PortCall) -> Error {
        let deadline_ms = self.deadline_ms;
        let message = format!("{call}: no answer within {deadline_ms} ms");
        tracing::warn!(
            port = call.port,
            op = call.op,
            deadline_ms = deadline_ms.as_millis(),
            "port call passed its deadline"
        );
        match call.effect {
            Effect::Read => Error::unavailable(message),
            Effect::Write => Error::uncertain(message),
        }
    }
}

/// Wrap every port of `ports` that does I/O in `envelope` (see the module doc). `Ports` is
/// taken apart without `..`: a new port is a compile error here until it has its envelope.
pub(crate) fn envelop(ports: Ports, envelope: &PortEnvelope) -> Ports {
    use super::enveloped::Enveloped;
    let Ports {
        store,
        inbox,
        queue,
        wakeup,
        permits,
        clock,
        ids,
        observer,
        stream,
        result_cache,
        dead_letters,
        task_inbox,
    } = ports;
    let env = Arc::new(envelope.clone());
    Ports {
        store: Arc::new(Enveloped::wrap(store, env.clone())),
        inbox: Arc::new(Enveloped::wrap(inbox, env.clone())),
        queue: Arc::new(Enveloped::wrap(queue, env.clone())),
        wakeup: Arc::new(Enveloped::wrap(wakeup, env.clone())),
        permits: Arc::new(Enveloped::wrap(permits, env.clone())),
        // No I/O: a reading of time and a source of ids.
        clock,
        ids,
        // Synchronous and non-blocking by contract (K-1.2).
        observer,
        stream: Arc::new(Enveloped::wrap(stream, env.clone())),
        result_cache: result_cache.map(|c| Arc::new(Enveloped::wrap(c, env.clone())) as _),
        dead_letters: dead_letters.map(|d| Arc::new(Enveloped::wrap(d, env.clone())) as _),
        task_inbox: task_inbox.map(|t| Arc::new(Enveloped::wrap(t, env.clone())) as _),
    }
}
