//! # permit-redis
//!
//! Global traffic permits of the durable workflow kernel on Redis (SPEC K-14):
//! [`RedisPermits`] implements [`Permits`] with one Lua script that purges expired
//! holders and old starts, reads the live limits, and checks and takes both
//! `max_concurrency` and `max_starts_per_second` (0 = unlimited) atomically. Leases and the
//! 1 s start window are timed by Redis `TIME`, one clock for every worker.
//!
//! Keys per resource, under a configurable prefix (on Redis Cluster use a hash-tagged
//! prefix such as `{wfk}`):
//!
//! | key | type | content |
//! |---|---|---|
//! | `<prefix>:permit:<resource>:limits` | hash | `max_concurrency`, `max_starts_per_second`, set by operators, read on every acquire |
//! | `<prefix>:permit:<resource>:holders` | ZSET | owner key → lease end (ms) |
//! | `<prefix>:permit:<resource>:starts` | ZSET | starts of the last second (µs) |
//! | `<prefix>:permits` | ZSET | index of resource names (score 0), for [`Permits::resources`] |
//!
//! The index is written by every acquire or renewal that writes a holder and by
//! [`Permits::set_limits`]; [`Permits::resources`] checks each indexed name against its
//! own keys and drops the names that have neither live limits nor an unexpired holder.
//! Like the holders, an index that only holders wrote expires a second after the last
//! lease it saw; once `set_limits` wrote to it, it persists like the limits hashes.
//! Limits written to a hash by hand (`HSET`) are read by acquires but listed only once the
//! resource is held or written through `set_limits`.
//! That script reads keys it derives from the prefix, so on Redis Cluster the prefix must
//! carry a hash tag (as above) to keep every key on one node. Holders written by workers of
//! a version without the index appear once a worker with it acquires or renews them.
//!
//! Operators: [`Permits::usage`] reports a resource's effective limits, unexpired holders
//! (with their lease ends on Redis `TIME`) and starts in the current window;
//! [`Permits::set_limits`] writes the live limits and indexes the resource. Each is one
//! script call.
//! When the limits hash (or one of its fields) is missing, the application's configured
//! limits apply: the resource's own, else for `tenant:<t>:<base>` those of `<base>`, else
//! the configured fallback — a flushed Redis never means "unlimited".
//!
//! After a flush, holders re-register on their next renewal (a renewal is an acquire by
//! the same owner). Until then new acquires do not see them, so the overshoot is bounded by
//! one renewal interval's worth of new starts. A renewal that finds the resource full after
//! a flush is denied; the running activity is not revoked (the engine only logs it) and its
//! next renewal tries again.
//!
//! Every Redis error is [`Error::Unavailable`]: the engine fails closed and defers the step.
//!
//! ```no_run
//! use kernel_core::ports::{PermitDecision, PermitOwner, Permits};
//! use permit_redis::{PermitLimits, RedisPermits, RedisPermitsConfig};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let config = RedisPermitsConfig::new("wfk", PermitLimits { max_concurrency: 4, max_starts_per_second: 0 })
//!     .default_limits("asr", PermitLimits { max_concurrency: 8, max_starts_per_second: 2 });
//! let permits = RedisPermits::from_url("redis://127.0.0.1:6379", config).await?;
//! let owner = PermitOwner { workflow_id: "wf-1".into(), step: "transcribe".into(), claim_token: "c-9".into() };
//! let resource = RedisPermits::tenant_resource("acme", "asr")?; // "tenant:acme:asr"
//! if let PermitDecision::Granted { .. } = permits.acquire(&resource, &owner).await? {
//!     // ... call the service, renewing with `acquire` while it runs ...
//!     permits.release(&resource, &owner).await?;
//! }
//! # Ok(())
//! # }
//! ```

use kernel_core::model::{DurationMs, Instant};
use kernel_core::ports::{
    PermitDecision, PermitHolder, PermitOwner, PermitUsage, Permits, PERMIT_HOLDERS_MAX, PERMIT_RESOURCES_MAX,
};
use kernel_core::{validate, Error, Result};
use queue_redis::map_redis_error;
use redis::Script;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

/// The connection type [`RedisPermits::new`] takes, so callers need no `redis` dependency.
pub use redis::aio::ConnectionManager;

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/acquire.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/release.lua")));
static HOLDERS: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/holders.lua")));
static SET_LIMITS: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/set_limits.lua")));
static USAGE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/usage.lua")));
static RESOURCES: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/resources.lua")));

/// Longest permit lease.
pub const LEASE_MS_MAX: DurationMs = DurationMs::from_millis(3_600_000);
/// Default permit lease (renewed by the engine while the activity runs).
pub const LEASE_MS_DEFAULT: DurationMs = DurationMs::from_millis(30_000);
use kernel_core::ports::tenant_base;
pub use kernel_core::ports::{PermitLimits, TENANT_SCOPE};

/// Settings of [`RedisPermits`].
#[derive(Debug, Clone)]
pub struct RedisPermitsConfig {
    /// Key prefix.
    pub prefix: String,
    /// Lease of a granted or renewed permit.
    pub lease_ms: DurationMs,
    /// Application-configured limits per resource (used when Redis has none).
    pub defaults: HashMap<String, PermitLimits>,
    /// Limits of resources configured nowhere.
    pub fallback: PermitLimits,
}

impl RedisPermitsConfig {
    /// Settings with the default lease and no per-resource defaults. `fallback` applies
    /// to every resource that neither Redis nor [`default_limits`](Self::default_limits)
    /// configures; choose it deliberately.
    pub fn new(prefix: impl Into<String>, fallback: PermitLimits) -> Self {
        RedisPermitsConfig { prefix: prefix.into(), lease_ms: LEASE_MS_DEFAULT, defaults: HashMap::new(), fallback }
    }

    /// Configure a resource's limits.
    pub fn default_limits(mut self, resource: impl Into<String>, limits: PermitLimits) -> Self {
        self.defaults.insert(resource.into(), limits);
        self
    }

    /// Set the lease.
    pub fn lease_ms(mut self, ms: impl Into<DurationMs>) -> Self {
        self.lease_ms = ms.into();
        self
    }

    /// Check every field.
    pub fn validate(&self) -> Result<()> {
        validate::identifier("prefix", &self.prefix)?;
        validate::positive_ms("lease_ms", self.lease_ms)?;
        if self.lease_ms > LEASE_MS_MAX {
            return Err(Error::invalid("lease_ms", format_args!("{} exceeds {LEASE_MS_MAX}", self.lease_ms)));
        }
        for name in self.defaults.keys() {
            validate::key_name("defaults", name)?;
        }
        Ok(())
    }

    fn configured(&self, resource: &str) -> PermitLimits {
        self.defaults
            .get(resource)
            .or_else(|| tenant_base(resource).and_then(|base| self.defaults.get(base)))
            .copied()
            .unwrap_or(self.fallback)
    }
}

/// The keys of one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermitKeys {
    /// Live limits hash.
    pub limits: String,
    /// Holders ZSET.
    pub holders: String,
    /// Starts ZSET.
    pub starts: String,
}

/// What one acquire did, with the Redis time it was judged at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquired {
    /// The port-level answer.
    pub decision: PermitDecision,
    /// Redis `TIME` in µs when the script ran: the start time of a granted new permit.
    pub redis_time_us: i64,
    /// Whether the owner already held the permit (a renewal, not a start).
    pub renewed: bool,
}

/// [`Permits`] on Redis. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct RedisPermits {
    conn: ConnectionManager,
    config: Arc<RedisPermitsConfig>,
}

impl std::fmt::Debug for RedisPermits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisPermits").field("config", &self.config).finish()
    }
}

/// The shared Redis connection helper and its timeouts: a call that takes longer than
/// `RESPONSE_TIMEOUT_MS` counts as failed, and the permit then fails closed (the step is
/// deferred).
pub use queue_redis::{connect, CONNECT_TIMEOUT_MS, RESPONSE_TIMEOUT_MS};

impl RedisPermits {
    /// Permits with `config`.
    pub fn new(conn: ConnectionManager, config: RedisPermitsConfig) -> Result<Self> {
        config.validate()?;
        Ok(RedisPermits { conn, config: Arc::new(config) })
    }

    /// Permits with `config` on a new connection to `url` (see [`connect`]).
    pub async fn from_url(url: &str, config: RedisPermitsConfig) -> Result<Self> {
        config.validate()?;
        Self::new(connect(url).await?, config)
    }

    /// `tenant:<tenant>:<resource>`, the tenant-scoped name of a resource; it inherits
    /// `<resource>`'s configured limits and counts separately. The tenant must not contain
    /// `:` so that the name splits back unambiguously.
    pub fn tenant_resource(tenant: &str, resource: &str) -> Result<String> {
        kernel_core::ports::tenant_resource(tenant, resource)
    }

    /// Settings in use.
    pub fn config(&self) -> &RedisPermitsConfig {
        &self.config
    }

    /// The keys of `resource`. Distinct resources never share a key: every key ends in a
    /// fixed suffix after the resource name.
    pub fn keys(&self, resource: &str) -> PermitKeys {
        let base = format!("{}:permit:{resource}", self.config.prefix);
        PermitKeys {
            limits: format!("{base}:limits"),
            holders: format!("{base}:holders"),
            starts: format!("{base}:starts"),
        }
    }

    /// Key of the resource index ZSET (`<prefix>:permits`): never a resource's key, whose
    /// names all continue `<prefix>:permit:`.
    pub fn index_key(&self) -> String {
        format!("{}:permits", self.config.prefix)
    }

    /// The limits an acquire of `resource` would use when Redis has none.
    pub fn configured_limits(&self, resource: &str) -> PermitLimits {
        self.config.configured(resource)
    }

    /// Load the scripts now (startup), so the first calls need no round trip for it.
    pub async fn load_scripts(&self) -> Result<()> {
        let mut conn = self.conn.clone();
        for s in [&*ACQUIRE, &*RELEASE, &*HOLDERS, &*SET_LIMITS, &*USAGE, &*RESOURCES] {
            s.prepare_invoke().load_async(&mut conn).await.map_err(map_redis_error)?;
        }
        Ok(())
    }

    /// Acquire or renew, also returning the Redis time the script judged it at.
    pub async fn acquire_at(&self, resource: &str, owner: &PermitOwner) -> Result<Acquired> {
        self.invoke_acquire(resource, owner, false).await
    }

    /// Renew for a running activity: a lost permit is re-registered without a limit check
    /// and without counting a start (see [`Permits::renew`]).
    pub async fn renew_at(&self, resource: &str, owner: &PermitOwner) -> Result<Acquired> {
        self.invoke_acquire(resource, owner, true).await
    }

    async fn invoke_acquire(&self, resource: &str, owner: &PermitOwner, renewal: bool) -> Result<Acquired> {
        validate::key_name("resource", resource)?;
        owner.validate()?;
        let keys = self.keys(resource);
        let configured = self.config.configured(resource);
        let mut inv = ACQUIRE.prepare_invoke();
        inv.key(&keys.limits)
            .key(&keys.holders)
            .key(&keys.starts)
            .key(self.index_key())
            .arg(owner.key())
            .arg(self.config.lease_ms.as_millis())
            .arg(configured.max_concurrency)
            .arg(configured.max_starts_per_second)
            .arg(if renewal { "1" } else { "0" })
            .arg(resource);
        let (granted, ms, redis_time_us, renewed): (i64, i64, i64, i64) =
            inv.invoke_async(&mut self.conn.clone()).await.map_err(map_redis_error)?;
        let decision = if granted == 1 {
            PermitDecision::Granted { lease_ms: DurationMs::from_millis(ms) }
        } else {
            debug_assert!(ms >= 1);
            PermitDecision::Denied { retry_after_ms: DurationMs::from_millis(ms) }
        };
        Ok(Acquired { decision, redis_time_us, renewed: renewed == 1 })
    }

    /// Release; `true` when the owner held a live permit.
    pub async fn release_held(&self, resource: &str, owner: &PermitOwner) -> Result<bool> {
        validate::key_name("resource", resource)?;
        owner.validate()?;
        let mut inv = RELEASE.prepare_invoke();
        inv.key(self.keys(resource).holders).arg(owner.key());
        let removed: i64 = inv.invoke_async(&mut self.conn.clone()).await.map_err(map_redis_error)?;
        Ok(removed == 1)
    }

    /// Owner keys of the live holders of `resource` (expired ones purged first).
    pub async fn holders(&self, resource: &str) -> Result<Vec<String>> {
        validate::key_name("resource", resource)?;
        let mut inv = HOLDERS.prepare_invoke();
        inv.key(self.keys(resource).holders);
        inv.invoke_async(&mut self.conn.clone()).await.map_err(map_redis_error)
    }

    /// Whether `owner` holds a live permit of `resource`.
    pub async fn is_held(&self, resource: &str, owner: &PermitOwner) -> Result<bool> {
        Ok(self.holders(resource).await?.contains(&owner.key()))
    }

    /// Write a resource's live limits and index the resource, in one script call (what
    /// [`Permits::set_limits`] does).
    pub async fn set_limits(&self, resource: &str, limits: PermitLimits) -> Result<()> {
        validate::key_name("resource", resource)?;
        let mut inv = SET_LIMITS.prepare_invoke();
        inv.key(self.keys(resource).limits)
            .key(self.index_key())
            .arg(limits.max_concurrency)
            .arg(limits.max_starts_per_second)
            .arg(resource);
        inv.invoke_async::<i64>(&mut self.conn.clone()).await.map_err(map_redis_error)?;
        Ok(())
    }

    /// What [`Permits::usage`] reports, in one script call.
    async fn read_usage(&self, resource: &str) -> Result<PermitUsage> {
        validate::key_name("resource", resource)?;
        let keys = self.keys(resource);
        let configured = self.config.configured(resource);
        let mut inv = USAGE.prepare_invoke();
        inv.key(&keys.limits)
            .key(&keys.holders)
            .key(&keys.starts)
            .arg(configured.max_concurrency)
            .arg(configured.max_starts_per_second)
            .arg(PERMIT_HOLDERS_MAX);
        type Raw = (i64, i64, i64, i64, i64, Vec<(String, f64)>);
        let (max_concurrency, max_starts, overridden, now_ms, starts, held): Raw =
            inv.invoke_async(&mut self.conn.clone()).await.map_err(map_redis_error)?;
        let limit = |field: &str, v: i64| {
            u32::try_from(v)
                .map_err(|_| Error::unavailable(format!("redis: {field} {v} of {} is out of range", keys.limits)))
        };
        let truncated = held.len() > PERMIT_HOLDERS_MAX;
        let holders = held
            .into_iter()
            .take(PERMIT_HOLDERS_MAX)
            .filter_map(|(key, until)| match PermitOwner::from_key(&key) {
                Some(owner) => Some(PermitHolder { owner, lease_until: Some(Instant::from_millis(until as i64)) }),
                None => {
                    tracing::warn!(holders = %keys.holders, member = %key, "permit holder member is not an owner key; not listed");
                    None
                }
            })
            .collect();
        Ok(PermitUsage {
            limits: PermitLimits {
                max_concurrency: limit("max_concurrency", max_concurrency)?,
                max_starts_per_second: limit("max_starts_per_second", max_starts)?,
            },
            overridden: overridden == 1,
            holders,
            truncated,
            starts_in_window: starts.max(0) as u64,
            as_of: Some(Instant::from_millis(now_ms)),
        })
    }

    /// What [`Permits::resources`] lists, in one script call.
    async fn read_resources(&self) -> Result<Vec<String>> {
        let mut inv = RESOURCES.prepare_invoke();
        inv.key(self.index_key()).arg(format!("{}:permit:", self.config.prefix)).arg(PERMIT_RESOURCES_MAX);
        let mut names: Vec<String> = inv.invoke_async(&mut self.conn.clone()).await.map_err(map_redis_error)?;
        names.truncate(PERMIT_RESOURCES_MAX);
        Ok(names)
    }

    /// Delete a resource's live limits, so the configured ones apply.
    pub async fn clear_limits(&self, resource: &str) -> Result<()> {
        validate::key_name("resource", resource)?;
        redis::cmd("DEL")
            .arg(self.keys(resource).limits)
            .query_async::<i64>(&mut self.conn.clone())
            .await
            .map_err(map_redis_error)?;
        Ok(())
    }

    /// Redis `TIME` in µs.
    pub async fn redis_time_us(&self) -> Result<i64> {
        let (s, us): (i64, i64) =
            redis::cmd("TIME").query_async(&mut self.conn.clone()).await.map_err(map_redis_error)?;
        Ok(s * 1_000_000 + us)
    }

    /// The exact `EVALSHA` that [`Permits::acquire`] sends, for benchmarks that measure the
    /// adapter's own overhead. The script must be loaded ([`Self::load_scripts`]).
    pub fn raw_acquire_command(&self, resource: &str, owner: &PermitOwner) -> redis::Cmd {
        let keys = self.keys(resource);
        let configured = self.config.configured(resource);
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(ACQUIRE.get_hash())
            .arg(4)
            .arg(keys.limits)
            .arg(keys.holders)
            .arg(keys.starts)
            .arg(self.index_key())
            .arg(owner.key())
            .arg(self.config.lease_ms.as_millis())
            .arg(configured.max_concurrency)
            .arg(configured.max_starts_per_second)
            .arg("0")
            .arg(resource);
        cmd
    }

    /// The exact `EVALSHA` that [`Permits::release`] sends.
    pub fn raw_release_command(&self, resource: &str, owner: &PermitOwner) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(RELEASE.get_hash()).arg(1).arg(self.keys(resource).holders).arg(owner.key());
        cmd
    }
}

#[async_trait::async_trait]
impl Permits for RedisPermits {
    async fn acquire(&self, resource: &str, owner: &PermitOwner) -> Result<PermitDecision> {
        Ok(self.acquire_at(resource, owner).await?.decision)
    }

    async fn renew(&self, resource: &str, owner: &PermitOwner) -> Result<PermitDecision> {
        Ok(self.renew_at(resource, owner).await?.decision)
    }

    async fn release(&self, resource: &str, owner: &PermitOwner) -> Result<()> {
        self.release_held(resource, owner).await.map(|_| ())
    }

    async fn usage(&self, resource: &str) -> Result<PermitUsage> {
        self.read_usage(resource).await
    }

    async fn resources(&self) -> Result<Vec<String>> {
        self.read_resources().await
    }

    async fn set_limits(&self, resource: &str, limits: PermitLimits) -> Result<()> {
        RedisPermits::set_limits(self, resource, limits).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_names_and_configured_lookup() {
        assert_eq!(RedisPermits::tenant_resource("acme", "asr").unwrap(), "tenant:acme:asr");
        assert!(RedisPermits::tenant_resource("a:b", "asr").is_err());
        assert!(RedisPermits::tenant_resource("acme", "a.b").is_err());
        assert!(RedisPermits::tenant_resource("$acme", "asr").is_err());
        let asr = PermitLimits { max_concurrency: 8, max_starts_per_second: 2 };
        let fallback = PermitLimits { max_concurrency: 1, max_starts_per_second: 0 };
        let c = RedisPermitsConfig::new("p", fallback).default_limits("asr", asr);
        assert_eq!(c.configured("asr"), asr);
        assert_eq!(c.configured("tenant:acme:asr"), asr);
        assert_eq!(c.configured("tenant:acme:"), fallback);
        assert_eq!(c.configured("ocr"), fallback);
    }

    /// Workers of different versions share the permit keys during a rolling deploy, so a
    /// script change is a protocol change: these pins make it deliberate.
    #[test]
    fn script_fingerprints_are_pinned() {
        assert_eq!(ACQUIRE.get_hash(), "d9da2cdebdb0d0c5dc3dbb0622f7365346bf7458");
        assert_eq!(RELEASE.get_hash(), "c5a93b835a3561b233615b8b84c98b6a16c6f840");
        assert_eq!(HOLDERS.get_hash(), "efbf4e7f3cd5b8e84052a29d3a4e64d8217b8e07");
        assert_eq!(SET_LIMITS.get_hash(), "5bd1239692e2205ae9de2a14fc4db88db2925996");
        assert_eq!(USAGE.get_hash(), "a6d957db6b98dc035ec037a0da104b1d177cd1a7");
        assert_eq!(RESOURCES.get_hash(), "710531120e9a55f405ead833d6a0abc39cb24134");
    }

    #[test]
    fn config_limits() {
        let c = RedisPermitsConfig::new("p", PermitLimits::default());
        assert!(c.validate().is_ok());
        assert!(c.clone().lease_ms(0).validate().is_err());
        assert!(c.clone().lease_ms(LEASE_MS_MAX + DurationMs::from_millis(1)).validate().is_err());
        assert!(RedisPermitsConfig::new("", PermitLimits::default()).validate().is_err());
        assert!(c.default_limits("a.b", PermitLimits::default()).validate().is_err());
    }
}
