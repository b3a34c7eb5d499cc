//! A store that forwards every call and lets a test intercept `apply`: refuse one write,
//! or hang it (a primary that stops answering that one call).

use kernel_core::ports::*;
use kernel_core::transition::{Guard, Transition};
use kernel_core::*;
use std::sync::Arc;

/// What an intercepted write does instead of reaching the store.
pub enum Intercepted {
    /// Answer with this error; the store never sees the write.
    Fail(Error),
    /// Never answer (the caller's deadline, if any, ends the call).
    Hang,
}

/// Decides, per write, whether it is intercepted (`None`: it goes to the store).
pub type Intercept = Box<dyn Fn(&WorkflowId, &Guard, &Transition) -> Option<Intercepted> + Send + Sync>;

/// The store `inner`, with its writes passed through `intercept`.
pub struct ApplyHook {
    pub inner: Arc<DynStore>,
    pub intercept: Intercept,
}

#[async_trait::async_trait]
impl WorkflowStore for ApplyHook {
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
        self.inner.claim(workflow_id, spec).await
    }
    async fn claim_any(&self, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        self.inner.claim_any(spec).await
    }
    async fn apply(&self, workflow_id: &WorkflowId, guard: &Guard, transition: &Transition) -> Result<WriteOutcome> {
        match (self.intercept)(workflow_id, guard, transition) {
            Some(Intercepted::Fail(e)) => Err(e),
            Some(Intercepted::Hang) => std::future::pending().await,
            None => self.inner.apply(workflow_id, guard, transition).await,
        }
    }
    async fn scan_due_waits(&self, now: Instant, after: Option<&DueCursor>, limit: usize) -> Result<ScanPage<DueWait>> {
        self.inner.scan_due_waits(now, after, limit).await
    }
    async fn scan_claimable(&self, after: Option<&WorkflowId>, limit: usize) -> Result<ScanPage<Candidate>> {
        self.inner.scan_claimable(after, limit).await
    }
}
