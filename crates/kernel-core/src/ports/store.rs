use crate::error::Result;
use crate::model::{Millis, Priority, ResumeKind, WorkflowInstance};
use crate::transition::{Guard, Transition};
use serde::{Deserialize, Serialize};

/// Result of [`WorkflowStore::create`].
#[derive(Debug, Clone, PartialEq)]
pub enum CreateOutcome {
    /// This call inserted the instance.
    Created(WorkflowInstance),
    /// An instance with that `biz_key` already existed (returned as stored). The
    /// duplicate-key loser of a race lands here too (K-5).
    Exists(WorkflowInstance),
}

/// Result of a guarded write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The guard matched; the transition was applied. Carries the new revision.
    Applied {
        /// Revision after the write.
        revision: u64,
    },
    /// The guard did not match; nothing changed. Under a token guard this means the claim
    /// is lost (K-6.4).
    Missed,
}

impl WriteOutcome {
    /// Whether the write was applied.
    pub fn applied(&self) -> bool {
        matches!(self, WriteOutcome::Applied { .. })
    }
}

/// Claim parameters (K-6.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSpec {
    /// The caller's clock.
    pub now: Millis,
    /// Lease length: `claimable_time = now + lease_ms`.
    pub lease_ms: Millis,
    /// The new claim token.
    pub token: String,
    /// Types the worker has definitions for.
    pub types: Vec<String>,
}

impl ClaimSpec {
    /// The guard this claim writes under.
    pub fn guard(&self) -> Guard {
        Guard::Claimable { now: self.now, types: self.types.clone() }
    }
}

/// A due wait found by [`WorkflowStore::scan_due_waits`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DueWait {
    /// Instance.
    pub workflow_id: String,
    /// The waiting step.
    pub step_index: u32,
    /// `timer` for sleeps, `poll` for signal waits with a poll fallback.
    pub resume: ResumeKind,
    /// Its priority (for re-enqueue).
    pub priority: Priority,
}

/// A claimable instance found by [`WorkflowStore::scan_claimable`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    /// Instance.
    pub workflow_id: String,
    /// Lane.
    pub priority: Priority,
    /// Score.
    pub claimable_time: Millis,
}

/// The durable workflow store: the only authority on execution rights (K-1.1).
///
/// Every write is **one atomic conditional update** of one instance. Token-guarded misses
/// are reported as [`WriteOutcome::Missed`]; an uncertain outcome is
/// [`Error::Uncertain`](crate::Error::Uncertain) and is never retried blindly.
#[async_trait::async_trait]
pub trait WorkflowStore: Send + Sync + 'static {
    /// Insert a new instance.
    ///
    /// # Contract
    /// Atomic on the permanent unique `biz_key` (K-3.2): of concurrent creates exactly one
    /// returns `Created`; the rest return `Exists` with the stored instance. Also unique on
    /// `workflow_id`.
    async fn create(&self, instance: WorkflowInstance) -> Result<CreateOutcome>;

    /// Read by `workflow_id`.
    async fn get(&self, workflow_id: &str) -> Result<Option<WorkflowInstance>>;

    /// Read by `biz_key`.
    async fn get_by_biz_key(&self, biz_key: &str) -> Result<Option<WorkflowInstance>>;

    /// Claim one instance (K-6.2).
    ///
    /// # Contract
    /// One conditional update under `spec.guard()` setting `claimable_time = now + lease`
    /// and `claim_token = token` (no revision bump); returns the updated document, or
    /// `None` when the guard missed (a stale candidate).
    async fn claim(&self, workflow_id: &str, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>>;

    /// Claim any one due instance straight from the store (Redis down or empty, K-6.7).
    ///
    /// # Contract
    /// As [`claim`](Self::claim) on some instance matching the guard; no priority order.
    async fn claim_any(&self, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>>;

    /// Apply `transition` if `guard` matches (K-6.4).
    ///
    /// # Contract
    /// One atomic conditional update with filter `workflow_id = id AND guard`; `revision`
    /// is incremented (when the transition says so), never used as a guard. Returns
    /// `Missed` when nothing matched; nothing is written then.
    async fn apply(&self, workflow_id: &str, guard: &Guard, transition: &Transition) -> Result<WriteOutcome>;

    /// Waiting instances whose `claimable_time <= now` (timer activation, K-9.2).
    ///
    /// # Contract
    /// Read-only, at most `limit` rows.
    async fn scan_due_waits(&self, now: Millis, limit: usize) -> Result<Vec<DueWait>>;

    /// Running or failing instances with a `claimable_time`, ordered by `workflow_id`,
    /// strictly after `after` (rebuild scan, K-13).
    ///
    /// # Contract
    /// Read-only, at most `limit` rows.
    async fn scan_claimable(&self, after: Option<&str>, limit: usize) -> Result<Vec<Candidate>>;
}

/// `dyn WorkflowStore`.
pub type DynStore = dyn WorkflowStore;
