use kernel_core::domain::{DurationMs, Instant};
use kernel_core::ports::*;
use kernel_core::{validate, Error, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use kernel_core::ports::tenant_base;
pub use kernel_core::ports::PermitLimits;

/// The start-rate window.
const SECOND: DurationMs = DurationMs::from_secs(1);

#[derive(Debug, Default)]
struct Resource {
    holders: BTreeMap<String, Instant>,
    starts: VecDeque<Instant>,
}

impl Resource {
    fn purge(&mut self, now: Instant) {
        self.holders.retain(|_, until| *until > now);
        while self.starts.front().is_some_and(|t| *t <= now.saturating_sub(SECOND)) {
            self.starts.pop_front();
        }
    }
}

#[derive(Debug, Default)]
struct State {
    /// Live configuration (the "Redis hash"); read on every acquire.
    live: HashMap<String, PermitLimits>,
    resources: HashMap<String, Resource>,
}

/// In-memory [`Permits`] on the engine's [`Clock`] with the K-14 semantics: one atomic
/// check-and-take of both limits, renew by the same owner (also above a lowered limit),
/// expired holders purged by every call, live limits falling back to the configured ones.
///
/// Limits of a resource: the live value if set ([`set_limits`](Self::set_limits)), else
/// the configured default for the resource, else (for `tenant:<t>:<base>`) the configured
/// default for `<base>`, else the fallback ([`with_fallback`](Self::with_fallback)). A
/// flushed live configuration therefore never means "unlimited" unless the application
/// configured exactly that.
#[derive(Clone)]
pub struct InMemoryPermits {
    state: Arc<Mutex<State>>,
    defaults: Arc<HashMap<String, PermitLimits>>,
    fallback: PermitLimits,
    clock: Arc<dyn Clock>,
    lease_ms: DurationMs,
    down: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for InMemoryPermits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InMemoryPermits")
            .field("defaults", &self.defaults)
            .field("fallback", &self.fallback)
            .field("lease_ms", &self.lease_ms)
            .finish()
    }
}

impl InMemoryPermits {
    /// Permits with application-configured `defaults` and a permit lease of `lease_ms`.
    /// Resources configured nowhere are unlimited until [`with_fallback`](Self::with_fallback)
    /// says otherwise.
    pub fn new(
        clock: Arc<dyn Clock>,
        defaults: HashMap<String, PermitLimits>,
        lease_ms: impl Into<DurationMs>,
    ) -> Self {
        let lease_ms = lease_ms.into();
        InMemoryPermits {
            state: Arc::default(),
            defaults: Arc::new(defaults),
            fallback: PermitLimits::default(),
            clock,
            lease_ms,
            down: Arc::default(),
        }
    }
    /// Limits for resources that neither the live configuration nor `defaults` name.
    pub fn with_fallback(mut self, fallback: PermitLimits) -> Self {
        self.fallback = fallback;
        self
    }
    /// `tenant:<tenant>:<resource>`, the tenant-scoped name of a resource. The tenant must
    /// not contain `:` so that the name splits back unambiguously.
    pub fn tenant_resource(tenant: &str, resource: &str) -> Result<String> {
        kernel_core::ports::tenant_resource(tenant, resource)
    }
    /// Lease length granted.
    pub fn lease_ms(&self) -> DurationMs {
        self.lease_ms
    }
    /// Change a resource's live limits without the port's name check (operators do this in
    /// Redis); [`Permits::set_limits`] is the checked form.
    pub fn set_limits(&self, resource: &str, limits: PermitLimits) {
        self.state.lock().expect("permit lock").live.insert(resource.to_string(), limits);
    }
    /// Remove a resource's live limits, so the configured ones apply again.
    pub fn clear_limits(&self, resource: &str) {
        self.state.lock().expect("permit lock").live.remove(resource);
    }
    /// Forget live limits and holders (a flushed Redis).
    pub fn flush(&self) {
        let mut st = self.state.lock().expect("permit lock");
        st.live.clear();
        st.resources.clear();
    }
    /// Make calls fail (fail-closed tests).
    pub fn set_down(&self, down: bool) {
        self.down.store(down, std::sync::atomic::Ordering::SeqCst);
    }
    /// Current holders of a resource (after purging expired ones).
    pub fn holders(&self, resource: &str) -> usize {
        let now = self.clock.now();
        let mut st = self.state.lock().expect("permit lock");
        let r = st.resources.entry(resource.to_string()).or_default();
        r.purge(now);
        r.holders.len()
    }
    /// Whether `owner` currently holds a permit of `resource`.
    pub fn is_held(&self, resource: &str, owner: &PermitOwner) -> bool {
        let now = self.clock.now();
        let st = self.state.lock().expect("permit lock");
        st.resources.get(resource).and_then(|r| r.holders.get(&owner.key())).is_some_and(|until| *until > now)
    }
    fn configured(&self, resource: &str) -> PermitLimits {
        self.defaults
            .get(resource)
            .or_else(|| tenant_base(resource).and_then(|base| self.defaults.get(base)))
            .copied()
            .unwrap_or(self.fallback)
    }
    fn check_up(&self) -> Result<()> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::unavailable("in-memory permits are down"));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Permits for InMemoryPermits {
    async fn acquire(&self, resource: &str, owner: &PermitOwner) -> Result<PermitDecision> {
        validate::key_name("resource", resource)?;
        owner.validate()?;
        self.check_up()?;
        let now = self.clock.now();
        let configured = self.configured(resource);
        let mut st = self.state.lock().expect("permit lock");
        let limits = st.live.get(resource).copied().unwrap_or(configured);
        let r = st.resources.entry(resource.to_string()).or_default();
        r.purge(now);
        let key = owner.key();
        if let Some(until) = r.holders.get_mut(&key) {
            // Renewal: never revoked, even above a lowered limit; not a new start.
            *until = now.saturating_add(self.lease_ms);
            return Ok(PermitDecision::Granted { lease_ms: self.lease_ms });
        }
        if limits.max_concurrency > 0 && r.holders.len() as u32 >= limits.max_concurrency {
            let soonest = r.holders.values().min().copied().unwrap_or(now.saturating_add(DurationMs::from_millis(100)));
            let retry_after_ms = (soonest - now).clamp(DurationMs::from_millis(1), self.lease_ms);
            return Ok(PermitDecision::Denied { retry_after_ms });
        }
        if limits.max_starts_per_second > 0 && r.starts.len() as u32 >= limits.max_starts_per_second {
            let oldest = r.starts.front().copied().unwrap_or(now);
            return Ok(PermitDecision::Denied {
                retry_after_ms: (oldest.saturating_add(SECOND) - now).max(DurationMs::from_millis(1)),
            });
        }
        r.holders.insert(key, now.saturating_add(self.lease_ms));
        r.starts.push_back(now);
        Ok(PermitDecision::Granted { lease_ms: self.lease_ms })
    }

    async fn renew(&self, resource: &str, owner: &PermitOwner) -> Result<PermitDecision> {
        validate::key_name("resource", resource)?;
        owner.validate()?;
        self.check_up()?;
        let now = self.clock.now();
        let mut st = self.state.lock().expect("permit lock");
        let r = st.resources.entry(resource.to_string()).or_default();
        r.purge(now);
        // Held or lost (expired, flushed): re-register, no limit check, no new start.
        r.holders.insert(owner.key(), now.saturating_add(self.lease_ms));
        Ok(PermitDecision::Granted { lease_ms: self.lease_ms })
    }

    async fn release(&self, resource: &str, owner: &PermitOwner) -> Result<()> {
        validate::key_name("resource", resource)?;
        owner.validate()?;
        self.check_up()?;
        let now = self.clock.now();
        let mut st = self.state.lock().expect("permit lock");
        if let Some(r) = st.resources.get_mut(resource) {
            r.purge(now);
            r.holders.remove(&owner.key());
        }
        Ok(())
    }

    async fn usage(&self, resource: &str) -> Result<PermitUsage> {
        validate::key_name("resource", resource)?;
        self.check_up()?;
        let now = self.clock.now();
        let configured = self.configured(resource);
        let st = self.state.lock().expect("permit lock");
        let live = st.live.get(resource).copied();
        let mut usage = PermitUsage {
            limits: live.unwrap_or(configured),
            overridden: live.is_some(),
            as_of: Some(now),
            ..PermitUsage::default()
        };
        if let Some(r) = st.resources.get(resource) {
            // Read-only: expired holders and old starts are skipped, not purged.
            let mut held: Vec<(Instant, &String)> =
                r.holders.iter().filter(|(_, until)| **until > now).map(|(k, until)| (*until, k)).collect();
            held.sort();
            usage.truncated = held.len() > PERMIT_HOLDERS_MAX;
            usage.holders = held
                .into_iter()
                .take(PERMIT_HOLDERS_MAX)
                .filter_map(|(until, key)| {
                    PermitOwner::from_key(key).map(|owner| PermitHolder { owner, lease_until: Some(until) })
                })
                .collect();
            usage.starts_in_window = r.starts.iter().filter(|t| **t > now.saturating_sub(SECOND)).count() as u64;
        }
        Ok(usage)
    }

    async fn resources(&self) -> Result<Vec<String>> {
        self.check_up()?;
        let now = self.clock.now();
        let st = self.state.lock().expect("permit lock");
        let held = st.resources.iter().filter(|(_, r)| r.holders.values().any(|until| *until > now)).map(|(n, _)| n);
        let names: BTreeSet<&String> = st.live.keys().chain(held).collect();
        Ok(names.into_iter().take(PERMIT_RESOURCES_MAX).cloned().collect())
    }

    async fn set_limits(&self, resource: &str, limits: PermitLimits) -> Result<()> {
        validate::key_name("resource", resource)?;
        self.check_up()?;
        InMemoryPermits::set_limits(self, resource, limits);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(n: usize) -> PermitOwner {
        PermitOwner { workflow_id: format!("wf-{n}").into(), step: "call".into(), claim_token: format!("t-{n}").into() }
    }

    #[tokio::test]
    async fn usage_and_resources_are_bounded_and_usage_purges_nothing() {
        let clock = Arc::new(crate::ManualClock::new(Instant::from_millis(1_000)));
        let p = InMemoryPermits::new(clock.clone(), HashMap::new(), 100);
        for i in 0..=PERMIT_HOLDERS_MAX {
            assert!(matches!(p.acquire("wide", &owner(i)).await.unwrap(), PermitDecision::Granted { .. }));
        }
        let u = p.usage("wide").await.unwrap();
        assert_eq!((u.holders.len(), u.truncated), (PERMIT_HOLDERS_MAX, true));
        for n in 0..=PERMIT_RESOURCES_MAX {
            Permits::set_limits(&p, &format!("n-{n:05}"), PermitLimits::default()).await.unwrap();
        }
        let names = p.resources().await.unwrap();
        assert_eq!(names.len(), PERMIT_RESOURCES_MAX);
        assert_eq!(names.first().map(String::as_str), Some("n-00000"));
        assert!(!names.contains(&"wide".to_string()), "`wide` sorts after every `n-…`");
        clock.advance(DurationMs::from_millis(100));
        assert!(p.usage("wide").await.unwrap().holders.is_empty(), "expired at the lease end");
        let st = p.state.lock().unwrap();
        assert_eq!(st.resources["wide"].holders.len(), PERMIT_HOLDERS_MAX + 1, "usage purged nothing");
    }

    #[test]
    fn tenant_names() {
        assert_eq!(tenant_resource("acme", "asr").unwrap(), "tenant:acme:asr");
        assert!(tenant_resource("a:b", "asr").is_err());
        assert!(tenant_resource("acme", "a.b").is_err());
        assert!(tenant_resource("$acme", "asr").is_err());
        assert_eq!(tenant_base("tenant:acme:asr"), Some("asr"));
        assert_eq!(tenant_base("tenant:acme:"), None);
        assert_eq!(tenant_base("asr"), None);
    }
}
