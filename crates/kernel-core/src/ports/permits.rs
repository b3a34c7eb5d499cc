use crate::domain::{DurationMs, Instant};
use crate::error::{Error, Result};
use crate::id::{ClaimToken, WorkflowId};
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

    /// The owner whose [`key`](Self::key) is `key`, or `None` when `key` is not of that form
    /// (a member written by hand into the backing store). Total: never panics on any input.
    ///
    /// ```
    /// use kernel_core::ports::PermitOwner;
    /// let o = PermitOwner { workflow_id: "w|1".into(), step: "call".into(), claim_token: "t:9".into() };
    /// assert_eq!(PermitOwner::from_key(&o.key()), Some(o));
    /// assert_eq!(PermitOwner::from_key("3:abc|x"), None);
    /// ```
    pub fn from_key(key: &str) -> Option<PermitOwner> {
        /// `<len>:<len bytes>|` at the start of `s`: the part and what follows the `|`.
        fn part(s: &str) -> Option<(&str, &str)> {
            let (len, rest) = s.split_once(':')?;
            if len.is_empty() || len.len() > 10 || !len.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let n: usize = len.parse().ok()?;
            let value = rest.get(..n)?;
            let rest = rest.get(n..)?.strip_prefix('|')?;
            Some((value, rest))
        }
        let (workflow_id, rest) = part(key)?;
        let (step, claim_token) = part(rest)?;
        Some(PermitOwner { workflow_id: workflow_id.into(), step: step.into(), claim_token: claim_token.into() })
    }
}

/// Most holders one [`Permits::usage`] returns.
pub const PERMIT_HOLDERS_MAX: usize = 1_000;
/// Most resources one [`Permits::resources`] returns.
pub const PERMIT_RESOURCES_MAX: usize = 1_000;

/// One current holder of a resource, as [`Permits::usage`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermitHolder {
    /// Who holds it.
    pub owner: PermitOwner,
    /// When its lease ends unless renewed, on the adapter's permit clock (Redis `TIME` on
    /// the Redis adapter); `None` where the adapter does not know it.
    pub lease_until: Option<Instant>,
}

/// What [`Permits::usage`] reports about one resource.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PermitUsage {
    /// The limits an [`acquire`](Permits::acquire) would apply now: the live override if
    /// one is set, else the application's configured ones.
    pub limits: PermitLimits,
    /// Whether a live override ([`Permits::set_limits`]) is in force, rather than the
    /// configured limits.
    pub overridden: bool,
    /// Unexpired holders, soonest lease end first (ties by [`PermitOwner::key`] bytes), at
    /// most [`PERMIT_HOLDERS_MAX`].
    pub holders: Vec<PermitHolder>,
    /// Whether more unexpired holders exist than `holders` lists.
    pub truncated: bool,
    /// Starts counted in the current 1 s window (what `max_starts_per_second` is checked
    /// against).
    pub starts_in_window: u64,
    /// The permit clock's reading the report was taken at (compare with
    /// [`PermitHolder::lease_until`]); `None` where the adapter has no clock.
    pub as_of: Option<Instant>,
}

/// Answer of an acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermitDecision {
    /// Held (or renewed) until the lease ends.
    Granted {
        /// Lease length the adapter applied.
        lease_ms: DurationMs,
    },
    /// No capacity now; try again after the hint.
    Denied {
        /// How long the caller should wait before asking again (the permit deferral's
        /// delay, K-7.1).
        retry_after_ms: DurationMs,
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

    /// What an operator sees of one resource: its effective limits, its current holders and
    /// its starts in the current 1 s window.
    ///
    /// # Contract
    /// Read-only: no holder, start or limit changes, and no start is counted. `limits` are
    /// those an [`acquire`](Self::acquire) would read now (the live override if set, else
    /// the configured limits, per field as `acquire` reads them), with `overridden` telling
    /// which. `holders` are the holders whose lease has not ended, soonest lease end first,
    /// at most [`PERMIT_HOLDERS_MAX`], with `truncated` set when more exist; a released or
    /// expired holder is never listed. The parts are read in one consistent snapshot (one
    /// round trip on a remote adapter). A resource nobody configured or holds reports its
    /// effective limits and no holders. `resource` follows the key-name rule
    /// ([`validate::key_name`]), else [`Error::InvalidInput`] before any effect.
    async fn usage(&self, resource: &str) -> Result<PermitUsage>;

    /// The resources an operator can look at: those with a live limit override or an
    /// unexpired holder now.
    ///
    /// # Contract
    /// Read-only as far as holders and limits go (an adapter may drop index entries of
    /// resources that have neither). Sorted by name bytes, without duplicates, at most
    /// [`PERMIT_RESOURCES_MAX`]: a full vector may mean more exist, and holds the first
    /// ones in that order. Limits only configured by the application (never written to the
    /// backing store) do not make a resource appear. One round trip on a remote adapter.
    async fn resources(&self) -> Result<Vec<String>>;

    /// Persist a live limit override for `resource` in the backing store.
    ///
    /// # Contract
    /// After `Ok`, every worker's next [`acquire`](Self::acquire) of `resource` on the same
    /// backing store reads `limits` (limits are read on every call), until another
    /// `set_limits` replaces them or the backing store loses them (a flushed store falls
    /// back to the configured limits). Both fields are written together; 0 disables a
    /// limit. Lowering a limit never evicts a holder: current holders keep renewing (above
    /// the new limit too) and only new acquires are refused until the count falls below
    /// it. Afterwards [`resources`](Self::resources) lists `resource` and
    /// [`usage`](Self::usage) reports `limits` with `overridden` set. `resource` follows the
    /// key-name rule ([`validate::key_name`]), else [`Error::InvalidInput`] and nothing is
    /// written. One atomic write (one round trip on a remote adapter). An adapter with no
    /// backing store to write to refuses with [`Error::InvalidInput`] naming `limits`.
    async fn set_limits(&self, resource: &str, limits: PermitLimits) -> Result<()>;
}

/// `dyn Permits`.
pub type DynPermits = dyn Permits;

/// No limits at all (for deployments without traffic resources).
///
/// Operator calls: [`usage`](Permits::usage) reports zero (unlimited) limits, no holders
/// and no starts; [`resources`](Permits::resources) is empty; and
/// [`set_limits`](Permits::set_limits) is refused with [`Error::InvalidInput`] (field
/// `limits`): this deployment has no permits backend to persist a limit in, and accepting
/// one that nothing would enforce would mislead the operator.
#[derive(Debug, Default, Clone, Copy)]
pub struct UnlimitedPermits;

#[async_trait::async_trait]
impl Permits for UnlimitedPermits {
    async fn acquire(&self, _resource: &str, _owner: &PermitOwner) -> Result<PermitDecision> {
        Ok(PermitDecision::Granted { lease_ms: DurationMs::from_millis(i64::MAX / 4) })
    }
    async fn renew(&self, _resource: &str, _owner: &PermitOwner) -> Result<PermitDecision> {
        Ok(PermitDecision::Granted { lease_ms: DurationMs::from_millis(i64::MAX / 4) })
    }
    async fn release(&self, _resource: &str, _owner: &PermitOwner) -> Result<()> {
        Ok(())
    }
    async fn usage(&self, resource: &str) -> Result<PermitUsage> {
        validate::key_name("resource", resource)?;
        Ok(PermitUsage::default())
    }
    async fn resources(&self) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
    async fn set_limits(&self, resource: &str, _limits: PermitLimits) -> Result<()> {
        validate::key_name("resource", resource)?;
        Err(Error::invalid(
            "limits",
            "this deployment has no permits backend (unlimited permits): there is nowhere to persist a limit",
        ))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(w: &str, s: &str, t: &str) -> PermitOwner {
        PermitOwner { workflow_id: w.into(), step: s.into(), claim_token: t.into() }
    }

    #[test]
    fn owner_keys_parse_back() {
        for o in [
            owner("wf-1", "call", "tok"),
            owner("w|1:s", "t", "1"),
            owner("ünï|cödé", "s-1", "a|b:c"),
            owner("", "", ""),
        ] {
            assert_eq!(PermitOwner::from_key(&o.key()), Some(o.clone()), "{}", o.key());
        }
    }

    #[test]
    fn malformed_owner_keys_are_none() {
        for bad in [
            "",
            "wf",
            ":|",
            "4:wf|1:s|t",
            "2:wf1:s|t",
            "2:wf|9:s|t",
            "x:wf|1:s|t",
            "-1:w|1:s|t",
            "+2:wf|1:s|t",
            "99999999999999999999:w|1:s|t",
            // One byte into a two-byte character: not a char boundary.
            "1:\u{fc}|1:s|t",
        ] {
            assert_eq!(PermitOwner::from_key(bad), None, "{bad:?}");
        }
    }

    #[tokio::test]
    async fn unlimited_permits_report_nothing_and_refuse_limits() {
        let p = UnlimitedPermits;
        let u = p.usage("asr").await.unwrap();
        assert_eq!(u, PermitUsage::default());
        assert_eq!(u.limits, PermitLimits { max_concurrency: 0, max_starts_per_second: 0 });
        assert!(p.resources().await.unwrap().is_empty());
        let e = p.set_limits("asr", PermitLimits { max_concurrency: 1, max_starts_per_second: 0 }).await.unwrap_err();
        assert!(matches!(&e, Error::InvalidInput { field, .. } if field == "limits"), "{e:?}");
        assert!(e.to_string().contains("no permits backend"), "{e}");
        for bad in ["", "a.b", "$x"] {
            let e = p.usage(bad).await.unwrap_err();
            assert!(matches!(&e, Error::InvalidInput { field, .. } if field == "resource"), "{e:?}");
            let e = p.set_limits(bad, PermitLimits::default()).await.unwrap_err();
            assert!(matches!(&e, Error::InvalidInput { field, .. } if field == "resource"), "{e:?}");
        }
    }
}
