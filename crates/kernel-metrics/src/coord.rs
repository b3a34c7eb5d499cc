//! The coordination ports, measured: [`MeteredQueue`], [`MeteredWakeup`],
//! [`MeteredPermits`].

use crate::registry::{Metrics, PortOpLabels, ResourceLabels};
use kernel_core::domain::{Instant, Priority};
use kernel_core::ports::{
    DynPermits, DynQueue, DynWakeup, LaneEntry, LaneStats, PermitDecision, PermitLimits, PermitOwner, PermitUsage,
    Permits, ReadyQueue, Wakeup, WakeupReceiver,
};
use kernel_core::{Result, WorkflowId};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

fn timed<T>(metrics: &Metrics, port: &'static str, op: &'static str, started: std::time::Instant, r: &Result<T>) {
    let labels = PortOpLabels { port, op };
    metrics.coord_call_seconds.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
    if r.is_err() {
        metrics.coord_errors.get_or_create(&labels).inc();
    }
}

/// A `ReadyQueue` that forwards every call unchanged and records
/// `wfk_coord_call_seconds{port="queue",op}` and `wfk_coord_errors_total{port="queue",op}`.
pub struct MeteredQueue {
    inner: Arc<DynQueue>,
    metrics: Arc<Metrics>,
}

impl MeteredQueue {
    /// Wrap `inner`.
    pub fn new(inner: Arc<DynQueue>, metrics: Arc<Metrics>) -> Self {
        MeteredQueue { inner, metrics }
    }
}

#[async_trait::async_trait]
impl ReadyQueue for MeteredQueue {
    async fn enqueue(&self, workflow_id: &WorkflowId, priority: Priority, claimable_at: Instant) -> Result<()> {
        let t = std::time::Instant::now();
        let r = self.inner.enqueue(workflow_id, priority, claimable_at).await;
        timed(&self.metrics, "queue", "enqueue", t, &r);
        r
    }

    async fn enqueue_many(&self, entries: &[LaneEntry]) -> Result<()> {
        let t = std::time::Instant::now();
        let r = self.inner.enqueue_many(entries).await;
        timed(&self.metrics, "queue", "enqueue_many", t, &r);
        r
    }

    async fn pop_due(&self, now: Instant, max: usize) -> Result<Vec<WorkflowId>> {
        let t = std::time::Instant::now();
        let r = self.inner.pop_due(now, max).await;
        timed(&self.metrics, "queue", "pop_due", t, &r);
        r
    }

    async fn stats(&self, now: Instant) -> Result<[LaneStats; 4]> {
        let t = std::time::Instant::now();
        let r = self.inner.stats(now).await;
        timed(&self.metrics, "queue", "stats", t, &r);
        r
    }
}

/// A `Wakeup` that forwards every call unchanged and records
/// `wfk_coord_call_seconds{port="wakeup",op}` and `wfk_coord_errors_total{port="wakeup",op}`.
pub struct MeteredWakeup {
    inner: Arc<DynWakeup>,
    metrics: Arc<Metrics>,
}

impl MeteredWakeup {
    /// Wrap `inner`.
    pub fn new(inner: Arc<DynWakeup>, metrics: Arc<Metrics>) -> Self {
        MeteredWakeup { inner, metrics }
    }
}

#[async_trait::async_trait]
impl Wakeup for MeteredWakeup {
    async fn notify(&self) -> Result<()> {
        let t = std::time::Instant::now();
        let r = self.inner.notify().await;
        timed(&self.metrics, "wakeup", "notify", t, &r);
        r
    }

    async fn subscribe(&self) -> Result<WakeupReceiver> {
        let t = std::time::Instant::now();
        let r = self.inner.subscribe().await;
        timed(&self.metrics, "wakeup", "subscribe", t, &r);
        r
    }
}

/// Most permits [`MeteredPermits`] tracks as held at once (an engine holds at most one per
/// running activity); past it, grants are not added to `wfk_permit_in_use`.
pub(crate) const HELD_TRACKED_MAX: usize = 65_536;

/// A `Permits` that forwards every call unchanged and records
/// `wfk_coord_call_seconds{port="permits",op}`, `wfk_coord_errors_total{port="permits",op}`,
/// `wfk_permit_denied_total{resource}` and `wfk_permit_in_use{resource}`: the permits this
/// process holds, moved by a granted `acquire` of an owner not yet holding one and by the
/// `release` of one it holds (a renewal or a repeated release moves nothing). The
/// `resource` label is capped ([`RESOURCE_LABELS_MAX`](crate::RESOURCE_LABELS_MAX)).
pub struct MeteredPermits {
    inner: Arc<DynPermits>,
    metrics: Arc<Metrics>,
    held: Mutex<HashSet<(String, String)>>,
}

impl MeteredPermits {
    /// Wrap `inner`.
    pub fn new(inner: Arc<DynPermits>, metrics: Arc<Metrics>) -> Self {
        MeteredPermits { inner, metrics, held: Mutex::new(HashSet::new()) }
    }

    fn in_use(&self, resource: &str) -> prometheus_client::metrics::gauge::Gauge {
        let labels = ResourceLabels { resource: self.metrics.resource_label(resource) };
        self.metrics.permit_in_use.get_or_create(&labels).clone()
    }
}

#[async_trait::async_trait]
impl Permits for MeteredPermits {
    async fn acquire(&self, resource: &str, owner: &PermitOwner) -> Result<PermitDecision> {
        let t = std::time::Instant::now();
        let r = self.inner.acquire(resource, owner).await;
        timed(&self.metrics, "permits", "acquire", t, &r);
        match &r {
            Ok(PermitDecision::Granted { .. }) => {
                let newly = self.held.lock().is_ok_and(|mut held| {
                    held.len() < HELD_TRACKED_MAX && held.insert((resource.to_string(), owner.key()))
                });
                if newly {
                    self.in_use(resource).inc();
                }
            }
            Ok(PermitDecision::Denied { .. }) => {
                let labels = ResourceLabels { resource: self.metrics.resource_label(resource) };
                self.metrics.permit_denied.get_or_create(&labels).inc();
            }
            Err(_) => {}
        }
        r
    }

    async fn renew(&self, resource: &str, owner: &PermitOwner) -> Result<PermitDecision> {
        let t = std::time::Instant::now();
        let r = self.inner.renew(resource, owner).await;
        timed(&self.metrics, "permits", "renew", t, &r);
        r
    }

    async fn release(&self, resource: &str, owner: &PermitOwner) -> Result<()> {
        let t = std::time::Instant::now();
        let r = self.inner.release(resource, owner).await;
        timed(&self.metrics, "permits", "release", t, &r);
        // Whatever the answer, this process no longer counts the permit as its own: the
        // engine does not try again, and an unreleased permit's lease expires.
        let was_held = self.held.lock().is_ok_and(|mut held| held.remove(&(resource.to_string(), owner.key())));
        if was_held {
            self.in_use(resource).dec();
        }
        r
    }

    async fn usage(&self, resource: &str) -> Result<PermitUsage> {
        let t = std::time::Instant::now();
        let r = self.inner.usage(resource).await;
        timed(&self.metrics, "permits", "usage", t, &r);
        r
    }

    async fn resources(&self) -> Result<Vec<String>> {
        let t = std::time::Instant::now();
        let r = self.inner.resources().await;
        timed(&self.metrics, "permits", "resources", t, &r);
        r
    }

    async fn set_limits(&self, resource: &str, limits: PermitLimits) -> Result<()> {
        let t = std::time::Instant::now();
        let r = self.inner.set_limits(resource, limits).await;
        timed(&self.metrics, "permits", "set_limits", t, &r);
        r
    }
}
