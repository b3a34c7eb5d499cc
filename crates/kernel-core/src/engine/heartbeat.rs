//! One heartbeat driver per engine (K-6.3): every running claim registers its lease here
//! and one task writes the heartbeats of all of them, instead of a task per claim.
//!
//! The driver is started by the first registration and stops by itself once no claim is
//! registered, so it works the same under [`Engine::spawn`](super::Engine::spawn) and for
//! callers of [`Engine::tick`](super::Engine::tick), and never outlives the claims it
//! serves (an engine that is dropped or killed leaves no task behind). It runs on its own
//! task, detached from the activities: an activity that blocks its thread does not stop
//! the heartbeats of its claim on a multi-thread runtime.
//!
//! Each claim keeps its own schedule, as a task per claim would: its first heartbeat is
//! due `heartbeat_ms` after it registered (after the driver first ran, for the claim that
//! started the driver), and the next one `heartbeat_ms` after the previous write returned.
//! Each due heartbeat is written on a short task of its own under its own
//! `heartbeat_deadline_ms`, so a write that hangs until its deadline delays no other claim's
//! heartbeat: the driver goes on scheduling while writes are in flight.

use super::{deadline, ClaimEnd, Inner};
use crate::domain::Instant;
use crate::error::Error;
use crate::id::{ClaimToken, WorkflowId};
use crate::ports::WriteOutcome;
use crate::transition::{Guard, Transition};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// The lease of one claim, shared by the claim and the heartbeat driver.
pub(crate) struct Lease {
    /// The instance claimed.
    pub(crate) workflow_id: WorkflowId,
    /// The claim's token: every heartbeat is guarded by it.
    pub(crate) token: ClaimToken,
    /// End of the lease as last written by this claim (claim or heartbeat), in ms.
    until: AtomicI64,
    /// Why the claim ended outside a write of the claim driver (a heartbeat that missed or
    /// whose outcome is unknown, K-6.4); set once, together with `cancel`.
    ended: Mutex<Option<ClaimEnd>>,
    /// Cancelled on claim loss, uncertain writes and hard shutdown; parent of every
    /// activity's cancellation.
    pub(crate) cancel: CancellationToken,
    /// No more heartbeats: the claim deregistered or a heartbeat ended it.
    stopped: AtomicBool,
    /// Held across a heartbeat write, so a deregistration waits for the one in flight
    /// (the claim reads the lease end after it, K-6.4).
    writing: tokio::sync::Mutex<()>,
}

impl Lease {
    pub(crate) fn new(
        workflow_id: WorkflowId,
        token: ClaimToken,
        until: Option<Instant>,
        cancel: CancellationToken,
    ) -> Self {
        Lease {
            workflow_id,
            token,
            until: AtomicI64::new(until.map_or(i64::MIN, Instant::as_millis)),
            ended: Mutex::new(None),
            cancel,
            stopped: AtomicBool::new(false),
            writing: tokio::sync::Mutex::new(()),
        }
    }

    /// The end of the lease as last written, `None` when it is unknown.
    pub(crate) fn until(&self) -> Option<Instant> {
        let ms = self.until.load(Ordering::SeqCst);
        (ms != i64::MIN).then(|| Instant::from_millis(ms))
    }

    /// The end of the lease as last written, `Instant::from_millis(i64::MIN)` when unknown.
    pub(crate) fn until_or_min(&self) -> Instant {
        Instant::from_millis(self.until.load(Ordering::SeqCst))
    }

    /// End the claim from outside the claim driver's writes: record why (first reason
    /// wins) and cancel every activity of the claim.
    pub(crate) fn end_with(&self, end: ClaimEnd) {
        self.ended.lock().expect("end lock").get_or_insert(end);
        self.cancel.cancel();
    }

    /// How a cancelled claim ended: the recorded reason, else uncertain (a hard shutdown:
    /// the lease is left to expire, K-6.6).
    pub(crate) fn ended_as(&self) -> ClaimEnd {
        self.ended.lock().expect("end lock").clone().unwrap_or(ClaimEnd::Uncertain)
    }
}

/// A registered claim and when its next heartbeat is due.
struct Entry {
    lease: Arc<Lease>,
    /// `None` until a driver that was not running yet first sees the claim, which then
    /// schedules it one interval from then, as a task of its own would have.
    due: Option<Instant>,
    /// A heartbeat write of this claim is in flight; the next is scheduled when it returns.
    in_flight: bool,
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    live: BTreeMap<u64, Entry>,
    /// Whether the driver task is running; it clears this itself, under the same lock, when
    /// it finds no claim registered.
    running: bool,
}

/// The heartbeat driver of one engine.
#[derive(Default)]
pub(crate) struct Heartbeats {
    registry: Mutex<Registry>,
    /// Rung when the last claim deregistered (so an idle driver ends at once instead of at
    /// its next due time) and when a heartbeat write returned (its claim's next one is due).
    changed: Notify,
}

/// A claim's registration with the driver; removed when dropped (also when the claim's
/// task is aborted by a shutdown that timed out: K-6.6, the lease is left to expire).
pub(crate) struct Registration {
    inner: Arc<Inner>,
    id: u64,
    lease: Arc<Lease>,
}

impl Heartbeats {
    /// Register a claim whose lease was just written at `now`: its first heartbeat is due
    /// one interval later. Starts the driver if it is not running. Returns whether it was
    /// started: on a multi-thread runtime the caller lets it run once before going on, so
    /// the new task is scheduled before anything can block the caller's thread.
    pub(crate) fn register(inner: &Arc<Inner>, lease: Arc<Lease>, now: Instant) -> (Registration, bool) {
        let hb = &inner.heartbeats;
        let mut r = hb.registry.lock().expect("heartbeat lock");
        let id = r.next_id;
        r.next_id += 1;
        let start = !r.running;
        let due = (!start).then(|| now.saturating_add(inner.config.heartbeat_ms));
        r.live.insert(id, Entry { lease: lease.clone(), due, in_flight: false });
        if start {
            r.running = true;
            // A root span: the driver outlives the claim that started it and serves every
            // other claim, so it must not keep that claim's span open (nor file later
            // claims' heartbeats under it).
            let span = tracing::info_span!(parent: None, "heartbeats", worker = %inner.config.worker_id);
            tokio::spawn(drive(inner.clone()).instrument(span));
        } else {
            // A running driver may be waiting for writes in flight only (every other claim's
            // heartbeat hanging until its deadline): wake it so it schedules this one.
            drop(r);
            hb.changed.notify_one();
        }
        (Registration { inner: inner.clone(), id, lease }, start)
    }

    fn remove(&self, id: u64) {
        // Called from a drop: a poisoned lock must not panic again.
        let mut r = self.registry.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if r.live.remove(&id).is_some() && r.live.is_empty() {
            self.changed.notify_one();
        }
    }
}

impl Registration {
    /// No more heartbeats for this claim: waits for one in flight, so the lease end read
    /// afterwards is the last one written.
    pub(crate) async fn end(self) {
        self.lease.stopped.store(true, Ordering::SeqCst);
        let _ = self.lease.writing.lock().await;
        // Drop removes it.
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.lease.stopped.store(true, Ordering::SeqCst);
        self.inner.heartbeats.remove(self.id);
    }
}

/// The driver: sleep until the earliest due heartbeat, start a write for every due one
/// (each on its own task, so none waits for another), and end once no claim is registered.
async fn drive(inner: Arc<Inner>) {
    let clock = inner.ports.clock.clone();
    let hb = &inner.heartbeats;
    let mut exit = DriverExit { inner: &inner, normal: false };
    loop {
        let next = {
            let mut r = hb.registry.lock().expect("heartbeat lock");
            if r.live.is_empty() {
                r.running = false;
                exit.normal = true;
                return;
            }
            let first = clock.now().saturating_add(inner.config.heartbeat_ms);
            for e in r.live.values_mut() {
                e.due.get_or_insert(first);
            }
            r.live.values().filter(|e| !e.in_flight).filter_map(|e| e.due).min()
        };
        match next {
            Some(next) => {
                tokio::select! {
                    _ = clock.sleep_until(next) => {}
                    // The last claim left or a write returned: look again.
                    _ = hb.changed.notified() => continue,
                }
            }
            // Every registered claim has a write in flight: wait for one to return.
            None => {
                hb.changed.notified().await;
                continue;
            }
        }
        let now = clock.now();
        let mut r = hb.registry.lock().expect("heartbeat lock");
        for (&id, e) in r.live.iter_mut().filter(|(_, e)| !e.in_flight && e.due.is_some_and(|d| d <= now)) {
            e.in_flight = true;
            let (inner, lease) = (inner.clone(), e.lease.clone());
            tokio::spawn(
                async move {
                    // A hard shutdown (K-6.6) drops a write in flight: the lease is left to
                    // expire, never extended after the engine gave up its claims.
                    let keep = tokio::select! {
                        biased;
                        _ = inner.killed.cancelled() => {
                            lease.stopped.store(true, Ordering::SeqCst);
                            false
                        }
                        keep = beat(&inner, &lease) => keep,
                    };
                    let hb = &inner.heartbeats;
                    let mut r = hb.registry.lock().expect("heartbeat lock");
                    if keep {
                        let next_due = inner.ports.clock.now().saturating_add(inner.config.heartbeat_ms);
                        if let Some(e) = r.live.get_mut(&id) {
                            e.due = Some(next_due);
                            e.in_flight = false;
                        }
                    } else {
                        // Ended by its heartbeat: no more beats (its registration finds it gone).
                        r.live.remove(&id);
                    }
                    drop(r);
                    hb.changed.notify_one();
                }
                .in_current_span(),
            );
        }
    }
}

/// Ends a driver that stops without having found the registry empty: dropped with its
/// runtime, or unwinding from a panic. Every claim still registered can no longer be
/// heartbeaten: each is ended as uncertain (its activities cancelled, the lease left to
/// expire, K-6.4), and the next registration starts a new driver.
struct DriverExit<'a> {
    inner: &'a Inner,
    /// Set, under the registry lock, when the driver found no claim and said so: a new
    /// driver may already run by the time this is dropped.
    normal: bool,
}

impl Drop for DriverExit<'_> {
    fn drop(&mut self) {
        if self.normal {
            return;
        }
        let mut r = self.inner.heartbeats.registry.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        r.running = false;
        for e in std::mem::take(&mut r.live).into_values() {
            e.lease.stopped.store(true, Ordering::SeqCst);
            e.lease.end_with(ClaimEnd::Uncertain);
        }
    }
}

/// One heartbeat of one claim, with today's meaning of each answer. Returns whether the
/// claim keeps beating.
///
/// The write has `heartbeat_deadline_ms` of the clock. Applied: the lease is extended. A
/// miss (claim lost) or an uncertain outcome (including a passed deadline) ends the claim
/// (K-6.4): the running activity is cancelled, no new one starts, nothing more is written
/// and the lease is left to expire. An error that certainly had no effect is retried at the
/// next interval while that retry can still finish before the lease ends; otherwise it ends
/// the claim the same way.
async fn beat(inner: &Inner, lease: &Lease) -> bool {
    let _writing = lease.writing.lock().await;
    if lease.stopped.load(Ordering::SeqCst) {
        return false;
    }
    let span = tracing::info_span!("heartbeat", workflow_id = %lease.workflow_id);
    let keep = async {
        let (clock, config) = (&inner.ports.clock, &inner.config);
        let now = clock.now();
        let t = match Transition::heartbeat(now, config.lease_ms) {
            Ok(t) => t,
            Err(e) => {
                // A lease end past the range of time: stop extending, let the lease run out.
                tracing::error!(error = %e, "heartbeat refused; ending the claim");
                lease.end_with(ClaimEnd::Uncertain);
                return false;
            }
        };
        let guard = Guard::Token { token: lease.token.clone() };
        let write = inner.ports.store.apply(&lease.workflow_id, &guard, &t);
        match deadline::write_within(&**clock, config.heartbeat_deadline_ms, "heartbeat", write).await {
            Ok(WriteOutcome::Applied { .. }) => {
                lease.until.store(now.saturating_add(config.lease_ms).as_millis(), Ordering::SeqCst);
                true
            }
            Ok(WriteOutcome::Missed) => {
                tracing::warn!("heartbeat missed: claim lost");
                lease.end_with(ClaimEnd::ClaimLost);
                false
            }
            Err(e @ Error::Uncertain { .. }) => {
                tracing::warn!(error = %e, "heartbeat outcome uncertain; ending the claim");
                lease.end_with(ClaimEnd::Uncertain);
                false
            }
            Err(e) => {
                let retry_done = clock.now().saturating_add(config.heartbeat_ms + config.heartbeat_deadline_ms);
                if retry_done >= lease.until_or_min().saturating_sub(config.max_clock_skew_ms) {
                    tracing::warn!(error = %e, "heartbeat failed and the lease ends before a retry could; ending the claim");
                    lease.end_with(ClaimEnd::Uncertain);
                    return false;
                }
                tracing::warn!(error = %e, "heartbeat failed; retrying at the next interval");
                true
            }
        }
    }
    .instrument(span)
    .await;
    if !keep {
        lease.stopped.store(true, Ordering::SeqCst);
    }
    keep
}
