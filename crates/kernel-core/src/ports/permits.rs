use crate::error::{Error, Result};
use crate::id::{ClaimToken, WorkflowId};
use crate::model::Millis;
use crate::validate;

/// Who holds a permit: `workflow_id + step + claim_token` (K-14).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PermitOwner {
    /// The instance whose activity holds the permit.
    pub workflow_id: WorkflowId,
    /// The step whose activity holds it (a document key, K-2.0).
    pub step: String,
    /// The claim under which the activity runs: a later claim of the same step is a new
    /// owner, so a zombie's permit is never mistaken for its successor's.
    pub claim_token: ClaimToken,
}

impl PermitOwner {
    /// Check the owner's parts (the step is a document key).
    pub fn validate(&self) -> Result<()> {
        validate::identifier("owner.workflow_id", self.workflow_id.as_str())?;
        validate::key_name("owner.step", &self.step)?;
        validate::identifier("owner.claim_token", self.claim_token.as_str())
    }

    /// Unambiguous single-string form used as a set member.
    pub fn key(&self) -> String {
        format!(
            "{}:{}|{}:{}|{}",
            self.workflow_id.as_str().len(),
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
        /// How long the caller should wait before asking again (the permit deferral's
        /// delay, K-7.1).
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
    /// bounded by one renewal interval (K-14). A renewal is never denied for capacity; an
    /// error means the backing store could not be reached.
    ///
    /// There is no default body: a renewal that fell back to [`acquire`](Self::acquire)
    /// would be a counted, limit-checked start, which is what this method must not be.
    /// Every adapter and every decorator implements it.
    ///
    /// What the engine does with an error: the activity keeps running (a running activity
    /// is never cancelled for a permit), the error is logged, and the next renewal is tried
    /// one `permit_renew_ms` later. If the lease runs out meanwhile, the permit's slot is
    /// free for others until a later renewal re-registers it — the bounded overshoot above.
    async fn renew(&self, resource: &str, owner: &PermitOwner) -> Result<PermitDecision>;

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
    async fn renew(&self, _resource: &str, _owner: &PermitOwner) -> Result<PermitDecision> {
        Ok(PermitDecision::Granted { lease_ms: Millis::MAX / 4 })
    }
    async fn release(&self, _resource: &str, _owner: &PermitOwner) -> Result<()> {
        Ok(())
    }
}

/// Limits of one resource; 0 disables a limit (K-14).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PermitLimits {
    /// Holders at once.
    pub max_concurrency: u32,
    /// Starts in any 1 s window.
    pub max_starts_per_second: u32,
}

/// Start of a tenant-scoped resource name: `tenant:<tenant>:<resource>`.
pub const TENANT_SCOPE: &str = "tenant:";

/// The tenant-scoped name of `resource` (K-14): `tenant:<tenant>:<resource>`, so one tenant
/// cannot fill every worker.
///
/// ```
/// use kernel_core::ports::tenant_resource;
/// assert_eq!(tenant_resource("acme", "asr").unwrap(), "tenant:acme:asr");
/// assert!(tenant_resource("a:b", "asr").is_err());
/// ```
pub fn tenant_resource(tenant: &str, resource: &str) -> Result<String> {
    validate::key_name("tenant", tenant)?;
    if tenant.contains(':') {
        return Err(Error::invalid("tenant", "must not contain `:`"));
    }
    validate::key_name("resource", resource)?;
    let name = format!("{TENANT_SCOPE}{tenant}:{resource}");
    validate::key_name("resource", &name)?;
    Ok(name)
}

/// `<base>` of `tenant:<t>:<base>`, whose configured limits a tenant-scoped resource inherits.
pub fn tenant_base(resource: &str) -> Option<&str> {
    let rest = resource.strip_prefix(TENANT_SCOPE)?;
    let (_tenant, base) = rest.split_once(':')?;
    (!base.is_empty()).then_some(base)
}
