use crate::db::{self, Db, Kind};
use kernel_core::domain::{DurationMs, Instant};
use kernel_core::ports::{
    tenant_base, Clock, PermitDecision, PermitHolder, PermitLimits, PermitOwner, PermitUsage, Permits,
    PERMIT_HOLDERS_MAX, PERMIT_RESOURCES_MAX,
};
use kernel_core::{validate, Error, Result};
use rusqlite::{params, OptionalExtension, Transaction};
use std::collections::HashMap;
use std::sync::Arc;

/// Longest permit lease.
pub const LEASE_MS_MAX: DurationMs = DurationMs::from_millis(3_600_000);
/// Default permit lease (renewed by the engine while the activity runs).
pub const LEASE_MS_DEFAULT: DurationMs = DurationMs::from_millis(30_000);
/// The start-rate window.
const SECOND: DurationMs = DurationMs::from_secs(1);

/// Purge expired holders of every resource (index on `lease_until`).
pub(crate) const PURGE_HOLDERS: &str = "DELETE FROM coord_permit_holder WHERE lease_until <= ?1";
/// Purge starts older than the window, of every resource (index on `started_at`).
pub(crate) const PURGE_STARTS: &str = "DELETE FROM coord_permit_start WHERE started_at <= ?1";
/// Renew the owner's lease if it holds one.
pub(crate) const RENEW: &str = "UPDATE coord_permit_holder SET lease_until = ?3 WHERE resource = ?1 AND owner = ?2";
pub(crate) const INSERT_HOLDER: &str =
    "INSERT INTO coord_permit_holder (resource, owner, lease_until) VALUES (?1, ?2, ?3)";
pub(crate) const LIVE_LIMITS: &str =
    "SELECT max_concurrency, max_starts_per_second FROM coord_permit_limits WHERE resource = ?1";
pub(crate) const HOLDERS: &str = "SELECT count(*), min(lease_until) FROM coord_permit_holder WHERE resource = ?1";
pub(crate) const STARTS: &str = "SELECT count(*), min(started_at) FROM coord_permit_start WHERE resource = ?1";
pub(crate) const INSERT_START: &str =
    "INSERT INTO coord_permit_start (resource, started_at, owner) VALUES (?1, ?2, ?3)";
pub(crate) const RELEASE: &str = "DELETE FROM coord_permit_holder WHERE resource = ?1 AND owner = ?2";
/// Write a resource's live limits.
pub(crate) const SET_LIMITS: &str =
    "INSERT INTO coord_permit_limits (resource, max_concurrency, max_starts_per_second) VALUES (?1, ?2, ?3) \
     ON CONFLICT (resource) DO UPDATE SET max_concurrency = excluded.max_concurrency, \
     max_starts_per_second = excluded.max_starts_per_second";
/// The unexpired holders of a resource, soonest lease end first (one more than listed, to
/// tell a cut list).
pub(crate) const USAGE_HOLDERS: &str = "SELECT owner, lease_until FROM coord_permit_holder \
     WHERE resource = ?1 AND lease_until > ?2 ORDER BY lease_until, owner LIMIT ?3";
/// Starts of a resource in the current 1 s window.
pub(crate) const USAGE_STARTS: &str = "SELECT count(*) FROM coord_permit_start WHERE resource = ?1 AND started_at > ?2";
/// Resources with live limits or an unexpired holder, in name byte order.
pub(crate) const RESOURCES: &str = "SELECT resource FROM coord_permit_limits UNION \
     SELECT resource FROM coord_permit_holder WHERE lease_until > ?1 ORDER BY resource LIMIT ?2";

/// Settings of [`LocalPermits`] (the same as the Redis adapter's).
#[derive(Debug, Clone)]
pub struct LocalPermitsConfig {
    /// Lease of a granted or renewed permit.
    pub lease_ms: DurationMs,
    /// Application-configured limits per resource (used when the file has no live ones).
    pub defaults: HashMap<String, PermitLimits>,
    /// Limits of resources configured nowhere.
    pub fallback: PermitLimits,
}

impl LocalPermitsConfig {
    /// Settings with the default lease and no per-resource defaults. `fallback` applies to
    /// every resource that neither the live limits nor
    /// [`default_limits`](Self::default_limits) configure; choose it deliberately.
    pub fn new(fallback: PermitLimits) -> Self {
        LocalPermitsConfig { lease_ms: LEASE_MS_DEFAULT, defaults: HashMap::new(), fallback }
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

/// Global traffic permits (K-14) in the SQLite file, shared by every process on it.
///
/// Tables: `coord_permit_limits` (live limits per resource, what an operator writes;
/// [`set_limits`](Self::set_limits)), `coord_permit_holder` (owner key → lease end, ms) and
/// `coord_permit_start` (starts of the last second, ms). The operator reads
/// ([`Permits::usage`], [`Permits::resources`]) are one read transaction each and purge
/// nothing; every other call is one `BEGIN IMMEDIATE` transaction that purges expired holders and old starts, reads the live
/// limits (else the configured ones: the resource's own, for `tenant:<t>:<base>` those of
/// `<base>`, else the fallback — a missing row never means "unlimited") and checks and
/// takes both limits; the file's write lock makes that atomic across processes.
///
/// **Time** comes from the [`Clock`] given at construction, read inside the transaction
/// (after the write lock is taken), where the Redis adapter uses Redis `TIME`: with the
/// system clock every process on the machine reads the same wall clock, so leases and the
/// 1 s start window mean the same to all of them. A wall clock stepped backwards lengthens
/// leases by the step; forwards, shortens them.
///
/// Expired holders and starts older than the window are purged by every call, for every
/// resource (through indexes on their times), so rows of resources nobody asks for any
/// more do not accumulate.
#[derive(Clone)]
pub struct LocalPermits {
    pub(crate) db: Arc<Db>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) config: Arc<LocalPermitsConfig>,
}

impl std::fmt::Debug for LocalPermits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalPermits").field("config", &self.config).finish()
    }
}

fn purge(tx: &Transaction<'_>, now: Instant) -> rusqlite::Result<()> {
    tx.prepare_cached(PURGE_HOLDERS)?.execute([now.as_millis()])?;
    tx.prepare_cached(PURGE_STARTS)?.execute([now.saturating_sub(SECOND).as_millis()])?;
    Ok(())
}

fn acquire_in(
    tx: &Transaction<'_>,
    now: Instant,
    resource: &str,
    owner: &str,
    lease: DurationMs,
    configured: PermitLimits,
    renewal: bool,
) -> rusqlite::Result<PermitDecision> {
    purge(tx, now)?;
    let until = now.saturating_add(lease).as_millis();
    let granted = PermitDecision::Granted { lease_ms: lease };
    // Renewal by the same owner: never revoked, even above a lowered limit; not a start.
    let renewed = tx.prepare_cached(RENEW)?.execute(params![resource, owner, until])?;
    if renewed == 1 {
        return Ok(granted);
    }
    if renewal {
        // A running activity re-registers a lost permit without a limit check and
        // without a start (K-14); the overshoot is bounded by one renewal interval.
        tx.prepare_cached(INSERT_HOLDER)?.execute(params![resource, owner, until])?;
        return Ok(granted);
    }
    let live: Option<(i64, i64)> =
        tx.prepare_cached(LIVE_LIMITS)?.query_row([resource], |r| Ok((r.get(0)?, r.get(1)?))).optional()?;
    let (max_concurrency, max_starts) = match live {
        Some((c, s)) => (c, s),
        None => (i64::from(configured.max_concurrency), i64::from(configured.max_starts_per_second)),
    };
    if max_concurrency > 0 {
        let (held, soonest): (i64, Option<i64>) =
            tx.prepare_cached(HOLDERS)?.query_row([resource], |r| Ok((r.get(0)?, r.get(1)?)))?;
        if held >= max_concurrency {
            let wait = soonest.map_or(100, |s| s - now.as_millis()).clamp(1, lease.as_millis());
            return Ok(PermitDecision::Denied { retry_after_ms: DurationMs::from_millis(wait) });
        }
    }
    if max_starts > 0 {
        let (started, oldest): (i64, Option<i64>) =
            tx.prepare_cached(STARTS)?.query_row([resource], |r| Ok((r.get(0)?, r.get(1)?)))?;
        if started >= max_starts {
            let oldest = oldest.unwrap_or(now.as_millis());
            let wait = (oldest + SECOND.as_millis() - now.as_millis()).max(1);
            return Ok(PermitDecision::Denied { retry_after_ms: DurationMs::from_millis(wait) });
        }
    }
    tx.prepare_cached(INSERT_HOLDER)?.execute(params![resource, owner, until])?;
    tx.prepare_cached(INSERT_START)?.execute(params![resource, now.as_millis(), owner])?;
    Ok(granted)
}

impl LocalPermits {
    /// `tenant:<tenant>:<resource>`, the tenant-scoped name of a resource; it inherits
    /// `<resource>`'s configured limits and counts separately.
    pub fn tenant_resource(tenant: &str, resource: &str) -> Result<String> {
        kernel_core::ports::tenant_resource(tenant, resource)
    }

    /// Settings in use.
    pub fn config(&self) -> &LocalPermitsConfig {
        &self.config
    }

    /// The limits an acquire of `resource` uses when the file has no live ones.
    pub fn configured_limits(&self, resource: &str) -> PermitLimits {
        self.config.configured(resource)
    }

    /// Write a resource's live limits (read by every process on its next acquire).
    pub async fn set_limits(&self, resource: &str, limits: PermitLimits) -> Result<()> {
        validate::key_name("resource", resource)?;
        let resource = resource.to_string();
        self.db
            .call("permits.set_limits", Kind::Write, move |c, ctx| {
                db::write(c, ctx, "permits.set_limits", |tx| {
                    tx.prepare_cached(SET_LIMITS)?.execute(params![
                        resource,
                        limits.max_concurrency,
                        limits.max_starts_per_second
                    ])
                })
            })
            .await?;
        Ok(())
    }

    /// Delete a resource's live limits, so the configured ones apply.
    pub async fn clear_limits(&self, resource: &str) -> Result<()> {
        validate::key_name("resource", resource)?;
        let resource = resource.to_string();
        self.db
            .call("permits.clear_limits", Kind::Write, move |c, ctx| {
                db::write(c, ctx, "permits.clear_limits", |tx| {
                    tx.execute("DELETE FROM coord_permit_limits WHERE resource = ?1", [resource])
                })
            })
            .await?;
        Ok(())
    }

    /// Forget every holder, start and live limit (what a flushed Redis loses): holders
    /// re-register on their next renewal, and the configured limits apply.
    pub async fn clear(&self) -> Result<()> {
        self.db
            .call("permits.clear", Kind::Write, |c, ctx| {
                db::write(c, ctx, "permits.clear", |tx| {
                    tx.execute_batch(
                        "DELETE FROM coord_permit_holder; DELETE FROM coord_permit_start; \
                         DELETE FROM coord_permit_limits;",
                    )
                })
            })
            .await
    }

    /// Owner keys ([`PermitOwner::key`]) of the live holders of `resource`.
    pub async fn holders(&self, resource: &str) -> Result<Vec<String>> {
        validate::key_name("resource", resource)?;
        let resource = resource.to_string();
        let clock = Arc::clone(&self.clock);
        self.db
            .call("permits.holders", Kind::Read, move |c, ctx| {
                db::read(c, ctx, "permits.holders", |tx| {
                    let now = clock.now();
                    let mut st = tx.prepare_cached(
                        "SELECT owner FROM coord_permit_holder WHERE resource = ?1 AND lease_until > ?2 ORDER BY owner",
                    )?;
                    let rows = st.query_map(params![resource, now.as_millis()], |r| r.get::<_, String>(0))?;
                    rows.collect()
                })
            })
            .await
    }

    /// Whether `owner` holds a live permit of `resource`.
    pub async fn is_held(&self, resource: &str, owner: &PermitOwner) -> Result<bool> {
        Ok(self.holders(resource).await?.contains(&owner.key()))
    }

    /// What [`Permits::usage`] reports, in one read transaction (nothing is purged).
    async fn read_usage(&self, resource: &str) -> Result<PermitUsage> {
        validate::key_name("resource", resource)?;
        let configured = self.config.configured(resource);
        let resource = resource.to_string();
        let clock = Arc::clone(&self.clock);
        type Raw = (Instant, Option<(i64, i64)>, Vec<(String, i64)>, i64);
        let (now, live, held, starts): Raw = self
            .db
            .call("permits.usage", Kind::Read, move |c, ctx| {
                db::read(c, ctx, "permits.usage", |tx| {
                    let now = clock.now();
                    let live = tx
                        .prepare_cached(LIVE_LIMITS)?
                        .query_row([&resource], |r| Ok((r.get(0)?, r.get(1)?)))
                        .optional()?;
                    let mut st = tx.prepare_cached(USAGE_HOLDERS)?;
                    let rows = st
                        .query_map(params![resource, now.as_millis(), PERMIT_HOLDERS_MAX as i64 + 1], |r| {
                            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
                        })?;
                    let held = rows.collect::<rusqlite::Result<Vec<_>>>()?;
                    let window_start = now.saturating_sub(SECOND).as_millis();
                    let starts =
                        tx.prepare_cached(USAGE_STARTS)?.query_row(params![resource, window_start], |r| r.get(0))?;
                    Ok((now, live, held, starts))
                })
            })
            .await?;
        let limit = |field: &str, v: i64| {
            u32::try_from(v).map_err(|_| Error::corrupt(format!("coord_permit_limits.{field} {v} is out of range")))
        };
        let limits = match live {
            Some((c, s)) => PermitLimits {
                max_concurrency: limit("max_concurrency", c)?,
                max_starts_per_second: limit("max_starts_per_second", s)?,
            },
            None => configured,
        };
        let truncated = held.len() > PERMIT_HOLDERS_MAX;
        let holders = held
            .into_iter()
            .take(PERMIT_HOLDERS_MAX)
            .filter_map(|(key, until)| match PermitOwner::from_key(&key) {
                Some(owner) => Some(PermitHolder { owner, lease_until: Some(Instant::from_millis(until)) }),
                None => {
                    tracing::warn!(owner = %key, "coord_permit_holder row is not an owner key; not listed");
                    None
                }
            })
            .collect();
        Ok(PermitUsage {
            limits,
            overridden: live.is_some(),
            holders,
            truncated,
            starts_in_window: starts.max(0) as u64,
            as_of: Some(now),
        })
    }

    /// What [`Permits::resources`] lists, in one read transaction.
    async fn read_resources(&self) -> Result<Vec<String>> {
        let clock = Arc::clone(&self.clock);
        self.db
            .call("permits.resources", Kind::Read, move |c, ctx| {
                db::read(c, ctx, "permits.resources", |tx| {
                    let now = clock.now();
                    let mut st = tx.prepare_cached(RESOURCES)?;
                    let rows = st.query_map(params![now.as_millis(), PERMIT_RESOURCES_MAX as i64], |r| r.get(0))?;
                    rows.collect()
                })
            })
            .await
    }

    async fn invoke(&self, resource: &str, owner: &PermitOwner, renewal: bool) -> Result<PermitDecision> {
        validate::key_name("resource", resource)?;
        owner.validate()?;
        let configured = self.config.configured(resource);
        let lease = self.config.lease_ms;
        let (resource, key) = (resource.to_string(), owner.key());
        let clock = Arc::clone(&self.clock);
        let what = if renewal { "permits.renew" } else { "permits.acquire" };
        self.db
            .call(what, Kind::Write, move |c, ctx| {
                db::write(c, ctx, what, |tx| {
                    // Read under the write lock: the file's transactions and their times
                    // are in the same order.
                    let now = clock.now();
                    acquire_in(tx, now, &resource, &key, lease, configured, renewal)
                })
            })
            .await
    }
}

#[async_trait::async_trait]
impl Permits for LocalPermits {
    async fn acquire(&self, resource: &str, owner: &PermitOwner) -> Result<PermitDecision> {
        self.invoke(resource, owner, false).await
    }

    async fn renew(&self, resource: &str, owner: &PermitOwner) -> Result<PermitDecision> {
        self.invoke(resource, owner, true).await
    }

    async fn release(&self, resource: &str, owner: &PermitOwner) -> Result<()> {
        validate::key_name("resource", resource)?;
        owner.validate()?;
        let (resource, key) = (resource.to_string(), owner.key());
        let clock = Arc::clone(&self.clock);
        self.db
            .call("permits.release", Kind::Write, move |c, ctx| {
                db::write(c, ctx, "permits.release", |tx| {
                    purge(tx, clock.now())?;
                    tx.prepare_cached(RELEASE)?.execute(params![resource, key])
                })
            })
            .await?;
        Ok(())
    }

    async fn usage(&self, resource: &str) -> Result<PermitUsage> {
        self.read_usage(resource).await
    }

    async fn resources(&self) -> Result<Vec<String>> {
        self.read_resources().await
    }

    async fn set_limits(&self, resource: &str, limits: PermitLimits) -> Result<()> {
        LocalPermits::set_limits(self, resource, limits).await
    }
}
