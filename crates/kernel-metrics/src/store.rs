//! [`MeteredStore`]: the workflow store, measured.

use crate::registry::{Metrics, OpLabels, ResultLabels};
use kernel_core::domain::{Instant, WorkflowInstance};
use kernel_core::ports::{
    Candidate, ClaimSpec, CreateOutcome, DueCursor, DueWait, DynStore, ScanPage, WorkflowStore, WriteOutcome,
};
use kernel_core::transition::{Guard, Transition};
use kernel_core::{Result, WorkflowId};
use std::sync::Arc;

/// A `WorkflowStore` that forwards every call unchanged and records
/// `wfk_store_call_seconds{op}`, `wfk_store_errors_total{op}`,
/// `wfk_claims_total{result="won|missed"}` (a `claim` that returned the instance, or the
/// stale candidate it missed; a `claim_any` that found nothing is not a claim attempt) and
/// `wfk_stale_writes_refused_total` (an `apply` under a claim-token guard that missed: the
/// claim was lost, K-6.4).
///
/// Latency is wall time (`std::time::Instant`), not the `Clock` port: it measures the
/// adapter, not the workflow's schedule.
pub struct MeteredStore {
    inner: Arc<DynStore>,
    metrics: Arc<Metrics>,
}

impl MeteredStore {
    /// Wrap `inner`.
    pub fn new(inner: Arc<DynStore>, metrics: Arc<Metrics>) -> Self {
        MeteredStore { inner, metrics }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<DynStore> {
        &self.inner
    }

    fn timed<T>(&self, op: &'static str, started: std::time::Instant, r: &Result<T>) {
        let labels = OpLabels { op };
        self.metrics.store_call_seconds.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
        if r.is_err() {
            self.metrics.store_errors.get_or_create(&labels).inc();
        }
    }

    fn claimed(&self, won: bool) {
        let result = if won { "won" } else { "missed" };
        self.metrics.claims.get_or_create(&ResultLabels { result }).inc();
    }
}

fn token_guarded(guard: &Guard) -> bool {
    matches!(guard, Guard::Running { .. } | Guard::Failing { .. } | Guard::Token { .. })
}

#[async_trait::async_trait]
impl WorkflowStore for MeteredStore {
    async fn create(&self, instance: WorkflowInstance) -> Result<CreateOutcome> {
        let t = std::time::Instant::now();
        let r = self.inner.create(instance).await;
        self.timed("create", t, &r);
        r
    }

    async fn get(&self, workflow_id: &WorkflowId) -> Result<Option<WorkflowInstance>> {
        let t = std::time::Instant::now();
        let r = self.inner.get(workflow_id).await;
        self.timed("get", t, &r);
        r
    }

    async fn get_by_biz_key(&self, biz_key: &str) -> Result<Option<WorkflowInstance>> {
        let t = std::time::Instant::now();
        let r = self.inner.get_by_biz_key(biz_key).await;
        self.timed("get_by_biz_key", t, &r);
        r
    }

    async fn claim(&self, workflow_id: &WorkflowId, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        let t = std::time::Instant::now();
        let r = self.inner.claim(workflow_id, spec).await;
        self.timed("claim", t, &r);
        if let Ok(got) = &r {
            self.claimed(got.is_some());
        }
        r
    }

    async fn claim_any(&self, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        let t = std::time::Instant::now();
        let r = self.inner.claim_any(spec).await;
        self.timed("claim_any", t, &r);
        if let Ok(Some(_)) = &r {
            self.claimed(true);
        }
        r
    }

    async fn apply(&self, workflow_id: &WorkflowId, guard: &Guard, transition: &Transition) -> Result<WriteOutcome> {
        let t = std::time::Instant::now();
        let r = self.inner.apply(workflow_id, guard, transition).await;
        self.timed("apply", t, &r);
        if matches!(r, Ok(WriteOutcome::Missed)) && token_guarded(guard) {
            self.metrics.stale_writes_refused.inc();
        }
        r
    }

    async fn scan_due_waits(&self, now: Instant, after: Option<&DueCursor>, limit: usize) -> Result<ScanPage<DueWait>> {
        let t = std::time::Instant::now();
        let r = self.inner.scan_due_waits(now, after, limit).await;
        self.timed("scan_due_waits", t, &r);
        r
    }

    async fn scan_claimable(&self, after: Option<&WorkflowId>, limit: usize) -> Result<ScanPage<Candidate>> {
        let t = std::time::Instant::now();
        let r = self.inner.scan_claimable(after, limit).await;
        self.timed("scan_claimable", t, &r);
        r
    }
}
