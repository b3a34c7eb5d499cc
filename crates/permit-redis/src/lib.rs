//! # permit-redis
//!
//! Global traffic permits of the durable workflow kernel on Redis (SPEC K-14):
//! [`RedisPermits`] implements [`Permits`] with one Lua script that purges expired
//! holders and old starts, reads the live limits, and checks and takes both
//! `max_concurrency` and `max_starts_per_second` (0 = unlimited) atomically. Leases and the
//! 1 s start window are timed by Redis `TIME`, one clock for every worker.
//!
//! Keys per resource, under a configurable prefix; the four keys of a resource share the
//! hash tag `{<prefix>:<resource>}`, so on a Redis Cluster each resource lives in one slot
//! (its acquire stays one atomic script) and different resources spread over the nodes:
//!
//! | key | type | content |
//! |---|---|---|
//! | `<prefix>:permit:{<prefix>:<resource>}:limits` | hash | `max_concurrency`, `max_starts_per_second`, set by operators, read on every acquire |
//! | `<prefix>:permit:{<prefix>:<resource>}:holders` | ZSET | owner key → lease end (ms) |
//! | `<prefix>:permit:{<prefix>:<resource>}:starts` | ZSET | starts of the last second (µs) |
//! | `<prefix>:permit:{<prefix>:<resource>}:indexed` | string | the index lists the resource until at least this Redis time (ms) |
//! | `<prefix>:permits` | ZSET | index of resource names (score 0), for [`Permits::resources`] |
//!
//! The index is another key (another slot), so the acquire script never writes it: it
//! reports when the index is due — the first holder after a while, or after a flush — and
//! only then a second call lists the resource, with a lease of headroom, so a steady
//! stream of acquires and renewals costs one round trip each. [`Permits::set_limits`]
//! writes the limits, then lists the resource. [`Permits::resources`] checks each indexed
//! name against its own keys and drops the names that have neither live limits nor an
//! unexpired holder. Like the holders, an index that only holders wrote expires a second
//! after the last lease it saw; once `set_limits` wrote to it, it persists like the limits
//! hashes. Limits written to a hash by hand (`HSET`) are read by acquires but listed only
//! once the resource is held or written through `set_limits`. A failed index write after a
//! granted acquire is logged, not an error: the permit is held; the listing misses the
//! resource until its next holder after the headroom.
//!
//! The untagged keys of earlier versions (`<prefix>:permit:<resource>:…`) are not
//! read: see [`RedisPermits::migrate_untagged_limits`].
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

use kernel_core::domain::{DurationMs, Instant};
use kernel_core::ports::{
    PermitDecision, PermitHolder, PermitOwner, PermitUsage, Permits, PERMIT_HOLDERS_MAX, PERMIT_RESOURCES_MAX,
};
use kernel_core::{validate, Error, Result};
use redis::Script;
use redis_conn::map_redis_error;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

/// The connection types [`RedisPermits::new`] takes, so callers need no `redis` dependency.
pub use redis_conn::{ConnectionManager, RedisConn};

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/acquire.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/release.lua")));
static HOLDERS: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/holders.lua")));
static SET_LIMITS: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/set_limits.lua")));
static USAGE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/usage.lua")));
static INDEX: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/index.lua")));
static LIVE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/live.lua")));

/// Names one page of [`Permits::resources`] reads from the index (and checks at once).
pub const INDEX_PAGE: usize = 128;

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
        redis_conn::check_prefix(&self.prefix)?;
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
    /// Index marker: the index lists the resource until at least this Redis time (ms).
    pub indexed: String,
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
    conn: RedisConn,
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
pub use redis_conn::{connect, CONNECT_TIMEOUT_MS, RESPONSE_TIMEOUT_MS};

impl RedisPermits {
    /// Permits with `config`.
    pub fn new(conn: impl Into<RedisConn>, config: RedisPermitsConfig) -> Result<Self> {
        config.validate()?;
        Ok(RedisPermits { conn: conn.into(), config: Arc::new(config) })
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

    /// The keys of `resource`, all with the hash tag `{<prefix>:<resource>}` (one slot).
    /// Distinct resources never share a key: every key ends in a fixed suffix after the
    /// resource name.
    pub fn keys(&self, resource: &str) -> PermitKeys {
        Self::keys_of(&self.config.prefix, resource)
    }

    fn keys_of(prefix: &str, resource: &str) -> PermitKeys {
        let base = format!("{prefix}:permit:{{{prefix}:{resource}}}");
        PermitKeys {
            limits: format!("{base}:limits"),
            holders: format!("{base}:holders"),
            starts: format!("{base}:starts"),
            indexed: format!("{base}:indexed"),
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
        for s in [&*ACQUIRE, &*RELEASE, &*HOLDERS, &*SET_LIMITS, &*USAGE, &*INDEX, &*LIVE] {
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
            .key(&keys.indexed)
            .arg(owner.key())
            .arg(self.config.lease_ms.as_millis())
            .arg(configured.max_concurrency)
            .arg(configured.max_starts_per_second)
            .arg(if renewal { "1" } else { "0" });
        let (granted, ms, redis_time_us, renewed, index_due): (i64, i64, i64, i64, i64) =
            inv.invoke_async(&mut self.conn.clone()).await.map_err(map_redis_error)?;
        if index_due > 0 {
            if let Err(e) = self.index(resource, &index_due.to_string()).await {
                tracing::warn!(resource, error = %e, "permit held, but the resource index was not written");
            }
        }
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

    /// Write a resource's live limits, then list the resource in the index: two script
    /// calls (what [`Permits::set_limits`] does). A failure between them leaves the limits
    /// in force and the resource unlisted; repeating the call is harmless.
    pub async fn set_limits(&self, resource: &str, limits: PermitLimits) -> Result<()> {
        validate::key_name("resource", resource)?;
        let mut inv = SET_LIMITS.prepare_invoke();
        inv.key(self.keys(resource).limits).arg(limits.max_concurrency).arg(limits.max_starts_per_second);
        inv.invoke_async::<i64>(&mut self.conn.clone()).await.map_err(map_redis_error)?;
        self.index(resource, "persist").await
    }

    /// List `resource` in the index until `until` (Redis ms), or for good (`persist`).
    async fn index(&self, resource: &str, until: &str) -> Result<()> {
        let mut inv = INDEX.prepare_invoke();
        inv.key(self.index_key()).arg(resource).arg(until);
        inv.invoke_async::<i64>(&mut self.conn.clone()).await.map_err(map_redis_error)?;
        Ok(())
    }

    /// Whether `resource` has live limits or an unexpired holder; with `forget`, a resource
    /// that has neither also loses its index marker.
    async fn live(&self, resource: &str, forget: bool) -> Result<bool> {
        let keys = self.keys(resource);
        let mut inv = LIVE.prepare_invoke();
        inv.key(&keys.limits).key(&keys.holders).key(&keys.indexed).arg(if forget { "1" } else { "0" });
        let live: i64 = inv.invoke_async(&mut self.conn.clone()).await.map_err(map_redis_error)?;
        Ok(live == 1)
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

    /// What [`Permits::resources`] lists: the index in name order, pages of
    /// [`INDEX_PAGE`] names, each checked against its own keys (concurrently: on a cluster
    /// they are in other slots). A name that is not live is dropped from the index, then
    /// checked once more and put back if a holder came meanwhile, so a concurrent acquire is
    /// never left unlisted.
    async fn read_resources(&self) -> Result<Vec<String>> {
        let index = self.index_key();
        let mut out = Vec::new();
        let mut from = "-".to_string();
        while out.len() < PERMIT_RESOURCES_MAX {
            let batch: Vec<String> = redis::cmd("ZRANGEBYLEX")
                .arg(&index)
                .arg(&from)
                .arg("+")
                .arg("LIMIT")
                .arg(0)
                .arg(INDEX_PAGE)
                .query_async(&mut self.conn.clone())
                .await
                .map_err(map_redis_error)?;
            let Some(last) = batch.last() else { break };
            from = format!("({last}");
            let full = batch.len() == INDEX_PAGE;
            let live = futures::future::try_join_all(batch.iter().map(|r| self.live(r, false))).await?;
            for (name, live) in batch.into_iter().zip(live) {
                if live {
                    if out.len() < PERMIT_RESOURCES_MAX {
                        out.push(name);
                    }
                    continue;
                }
                redis::cmd("ZREM")
                    .arg(&index)
                    .arg(&name)
                    .query_async::<i64>(&mut self.conn.clone())
                    .await
                    .map_err(map_redis_error)?;
                if self.live(&name, true).await? {
                    // A holder came between the check and the removal: list it again.
                    redis::cmd("ZADD")
                        .arg(&index)
                        .arg("NX")
                        .arg(0)
                        .arg(&name)
                        .query_async::<i64>(&mut self.conn.clone())
                        .await
                        .map_err(map_redis_error)?;
                    if out.len() < PERMIT_RESOURCES_MAX {
                        out.push(name);
                    }
                }
            }
            if !full {
                break;
            }
        }
        Ok(out)
    }

    /// Copy the live limits that earlier versions kept under untagged keys
    /// (`<prefix>:permit:<resource>:limits`) to this version's keys, listing each resource,
    /// and delete the old hashes; returns the resources moved. Run once when moving a
    /// deployment to this version (or onto a cluster: run it against the old server with
    /// this version's adapter on the old server, then move the keys, or just set the limits
    /// again). Holders and start windows are not moved: they are not facts, and running
    /// activities re-register on their next renewal (K-14's bounded overshoot). Only a
    /// single server can be scanned for them; on a cluster this is
    /// [`Error::InvalidInput`].
    pub async fn migrate_untagged_limits(&self) -> Result<Vec<String>> {
        if self.conn.is_cluster() {
            return Err(Error::invalid("redis url", "untagged permit keys exist only on a single server"));
        }
        let head = format!("{}:permit:", self.config.prefix);
        let mut moved = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{head}*:limits"))
                .arg("COUNT")
                .arg(500)
                .query_async(&mut self.conn.clone())
                .await
                .map_err(map_redis_error)?;
            for key in keys {
                let Some(resource) = key.strip_prefix(&head).and_then(|r| r.strip_suffix(":limits")) else { continue };
                if resource.starts_with('{') || validate::key_name("resource", resource).is_err() {
                    continue;
                }
                let (mc, ms): (Option<u32>, Option<u32>) = redis::cmd("HMGET")
                    .arg(&key)
                    .arg("max_concurrency")
                    .arg("max_starts_per_second")
                    .query_async(&mut self.conn.clone())
                    .await
                    .map_err(map_redis_error)?;
                let configured = self.config.configured(resource);
                let limits = PermitLimits {
                    max_concurrency: mc.unwrap_or(configured.max_concurrency),
                    max_starts_per_second: ms.unwrap_or(configured.max_starts_per_second),
                };
                self.set_limits(resource, limits).await?;
                redis::cmd("DEL")
                    .arg(&key)
                    .query_async::<i64>(&mut self.conn.clone())
                    .await
                    .map_err(map_redis_error)?;
                moved.push(resource.to_string());
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        moved.sort();
        Ok(moved)
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
            .arg(keys.indexed)
            .arg(owner.key())
            .arg(self.config.lease_ms.as_millis())
            .arg(configured.max_concurrency)
            .arg(configured.max_starts_per_second)
            .arg("0");
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
        assert_eq!(ACQUIRE.get_hash(), "be2817be1f1d1c988640e84491349e05715f3941");
        assert_eq!(RELEASE.get_hash(), "c5a93b835a3561b233615b8b84c98b6a16c6f840");
        assert_eq!(HOLDERS.get_hash(), "efbf4e7f3cd5b8e84052a29d3a4e64d8217b8e07");
        assert_eq!(SET_LIMITS.get_hash(), "9c41eb9be6fb4b43e1596717b3e9afd0a94d6b33");
        assert_eq!(USAGE.get_hash(), "a6d957db6b98dc035ec037a0da104b1d177cd1a7");
        assert_eq!(INDEX.get_hash(), "36a78e0a0b9facae5d1141f664e2a5e832094477");
        assert_eq!(LIVE.get_hash(), "693092b35ccdd1bb0072b2276098a19bed278aa1");
    }

    /// On a cluster an acquire's keys must share one slot: a resource's four keys do, and
    /// different resources spread over the slots (K-14).
    #[test]
    fn one_resource_is_one_slot_and_resources_spread() {
        let p = RedisPermitsConfig::new("wfk", PermitLimits::default());
        let slot_of = |r: &str| {
            let base = RedisPermits::keys_of(&p.prefix, r);
            let slots: std::collections::BTreeSet<u16> = [base.limits, base.holders, base.starts, base.indexed]
                .iter()
                .map(|k| redis_conn::hash_slot(k))
                .collect();
            assert_eq!(slots.len(), 1, "{r}: {slots:?}");
            *slots.first().unwrap()
        };
        let spread: std::collections::BTreeSet<u16> = (0..64).map(|i| slot_of(&format!("tenant:t{i}:asr"))).collect();
        assert!(spread.len() > 32, "64 resources on {} slots", spread.len());
        assert!(RedisPermitsConfig::new("{wfk}", PermitLimits::default()).validate().is_err(), "a braced prefix");
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
