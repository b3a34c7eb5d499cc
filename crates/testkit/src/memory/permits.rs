use kernel_core::model::Millis;
use kernel_core::ports::*;
use kernel_core::{validate, Error, Result};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Limits of one resource; 0 disables a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PermitLimits {
    /// Holders at once.
    pub max_concurrency: u32,
    /// Starts in any 1 s window.
    pub max_starts_per_second: u32,
}

#[derive(Debug, Default)]
struct Resource {
    holders: BTreeMap<String, Millis>,
    starts: VecDeque<Millis>,
}

#[derive(Debug, Default)]
struct State {
    /// Live configuration (the "Redis hash"); read on every acquire.
    live: HashMap<String, PermitLimits>,
    resources: HashMap<String, Resource>,
}

/// In-memory [`Permits`] on the engine's [`Clock`] with the K-14 semantics: one atomic
/// check-and-take of both limits, renew by the same owner, expired holders purged first,
/// live limits falling back to configured defaults (never "unlimited").
#[derive(Clone)]
pub struct InMemoryPermits {
    state: Arc<Mutex<State>>,
    defaults: Arc<HashMap<String, PermitLimits>>,
    clock: Arc<dyn Clock>,
    lease_ms: Millis,
    down: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for InMemoryPermits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InMemoryPermits").field("defaults", &self.defaults).field("lease_ms", &self.lease_ms).finish()
    }
}

impl InMemoryPermits {
    /// Permits with application-configured `defaults` and a permit lease of `lease_ms`.
    pub fn new(clock: Arc<dyn Clock>, defaults: HashMap<String, PermitLimits>, lease_ms: Millis) -> Self {
        InMemoryPermits { state: Arc::default(), defaults: Arc::new(defaults), clock, lease_ms, down: Arc::default() }
    }
    /// Change a resource's live limits (operators do this in Redis).
    pub fn set_limits(&self, resource: &str, limits: PermitLimits) {
        self.state.lock().expect("permit lock").live.insert(resource.to_string(), limits);
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
        r.holders.retain(|_, until| *until > now);
        r.holders.len()
    }
}

#[async_trait::async_trait]
impl Permits for InMemoryPermits {
    async fn acquire(&self, resource: &str, owner: &PermitOwner) -> Result<PermitDecision> {
        validate::key_name("resource", resource)?;
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Unavailable("in-memory permits are down".into()));
        }
        let now = self.clock.now();
        let mut st = self.state.lock().expect("permit lock");
        let limits = st.live.get(resource).copied().or_else(|| self.defaults.get(resource).copied()).unwrap_or_default();
        let r = st.resources.entry(resource.to_string()).or_default();
        r.holders.retain(|_, until| *until > now);
        while r.starts.front().is_some_and(|t| *t <= now - 1000) {
            r.starts.pop_front();
        }
        let key = owner.key();
        if let Some(until) = r.holders.get_mut(&key) {
            // Renewal: never revoked, even above a lowered limit.
            *until = now + self.lease_ms;
            return Ok(PermitDecision::Granted { lease_ms: self.lease_ms });
        }
        if limits.max_concurrency > 0 && r.holders.len() as u32 >= limits.max_concurrency {
            let soonest = r.holders.values().min().copied().unwrap_or(now + 100);
            return Ok(PermitDecision::Denied { retry_after_ms: (soonest - now).clamp(1, self.lease_ms) });
        }
        if limits.max_starts_per_second > 0 && r.starts.len() as u32 >= limits.max_starts_per_second {
            let oldest = r.starts.front().copied().unwrap_or(now);
            return Ok(PermitDecision::Denied { retry_after_ms: (oldest + 1000 - now).max(1) });
        }
        r.holders.insert(key, now + self.lease_ms);
        r.starts.push_back(now);
        Ok(PermitDecision::Granted { lease_ms: self.lease_ms })
    }

    async fn release(&self, resource: &str, owner: &PermitOwner) -> Result<()> {
        validate::key_name("resource", resource)?;
        let mut st = self.state.lock().expect("permit lock");
        if let Some(r) = st.resources.get_mut(resource) {
            r.holders.remove(&owner.key());
        }
        Ok(())
    }
}
