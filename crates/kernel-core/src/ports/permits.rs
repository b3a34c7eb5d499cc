use crate::error::Result;
use crate::model::Millis;

/// Who holds a permit: `workflow_id + step + claim_token` (K-14).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PermitOwner {
    /// Instance.
    pub workflow_id: String,
    /// Step name.
    pub step: String,
    /// Current claim.
    pub claim_token: String,
}

impl PermitOwner {
    /// Unambiguous single-string form used as a set member.
    pub fn key(&self) -> String {
        format!(
            "{}:{}|{}:{}|{}",
            self.workflow_id.len(),
            self.workflow_id,
            self.step.len(),
            self.step,
            self.claim_token
        )
    }
}

/// Answer of an acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermitDecision {
    /// Held (or renewed) until the lease ends.
    Granted {
        /// Lease length the adapter applied.
        lease_ms: Millis,
    },
    /// No capacity now; try again after the hint.
    Denied {
        /// Suggested delay.
        retry_after_ms: Millis,
    },
}

/// Global traffic permits per resource (K-14).
#[async_trait::async_trait]
pub trait Permits: Send + Sync + 'static {
    /// Take or renew a permit.
    ///
    /// # Contract
    /// One atomic check-and-take of both `max_concurrency` and `max_starts_per_second`
    /// (0 = unlimited), with limits read on every call. The same owner re-acquiring renews
    /// its lease and takes no second slot, even above a lowered limit. Expired permits are
    /// purged first. An error means "unknown": callers fail closed (defer the step).
    async fn acquire(&self, resource: &str, owner: &PermitOwner) -> Result<PermitDecision>;

    /// Renew a permit held by `owner` while its activity runs (every `permit_renew_ms`).
    ///
    /// # Contract
    /// Extends the owner's lease. When the permit was lost (its lease expired, or the
    /// backing store was flushed) the owner re-registers without a limit check and without
    /// counting a start: the activity is already running. The overshoot this allows is
    /// bounded by one renewal interval (K-14). The default re-acquires, which adapters
    /// without that distinction may keep.
    async fn renew(&self, resource: &str, owner: &PermitOwner) -> Result<PermitDecision> {
        self.acquire(resource, owner).await
    }

    /// Give a permit back.
    ///
    /// # Contract
    /// Idempotent; releasing a permit not held is a no-op.
    async fn release(&self, resource: &str, owner: &PermitOwner) -> Result<()>;
}

/// `dyn Permits`.
pub type DynPermits = dyn Permits;

/// No limits at all (for deployments without traffic resources).
#[derive(Debug, Default, Clone, Copy)]
pub struct UnlimitedPermits;

#[async_trait::async_trait]
impl Permits for UnlimitedPermits {
    async fn acquire(&self, _resource: &str, _owner: &PermitOwner) -> Result<PermitDecision> {
        Ok(PermitDecision::Granted { lease_ms: Millis::MAX / 4 })
    }
    async fn release(&self, _resource: &str, _owner: &PermitOwner) -> Result<()> {
        Ok(())
    }
}
