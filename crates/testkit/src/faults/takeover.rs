//! `TakeoverPause`: a store that pauses the first successful takeover until it is resumed.

use kernel_core::domain::*;
use kernel_core::ports::*;
use kernel_core::Result;
use kernel_core::WorkflowId;
use std::sync::Arc;

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
