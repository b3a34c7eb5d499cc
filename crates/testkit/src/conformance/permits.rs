//! Conformance cases for the permits port (K-14).
//!
//! Cases take the port plus [`PermitHooks`]: how to change live limits, simulate a flushed
//! backend, read the permit clock and let time pass. The clock may be a manual one (the
//! in-memory adapter) or Redis `TIME` (the Redis adapter), so no case depends on exact
//! time: a case whose assertion could only fail because the machine stalled longer than
//! the case's time bound is retried on a fresh resource (up to [`ATTEMPTS`] times) instead
//! of failing.
//!
//! Every adapter under test must be configured with [`configured_defaults`] and the
//! fallback [`FALLBACK_LIMITS`], and use a lease of at least [`LEASE_MS_MIN`]. The operator
//! cases ([`Permits::usage`], [`Permits::resources`], [`Permits::set_limits`]) go through the
//! port itself, not the hooks, and assume nothing else writes the fixture's backing store.
//!
//! [`Permits::usage`]: kernel_core::ports::Permits::usage
//! [`Permits::resources`]: kernel_core::ports::Permits::resources
//! [`Permits::set_limits`]: kernel_core::ports::Permits::set_limits

use crate::memory::{InMemoryPermits, PermitLimits};
use futures::future::join_all;
use kernel_core::domain::{DurationMs, Instant};
use kernel_core::ports::{DynPermits, PermitDecision, PermitOwner, PermitUsage, PERMIT_RESOURCES_MAX};
use kernel_core::Error;
use kernel_core::WorkflowId;
use std::collections::HashMap;

/// Tries per case before a disturbed run counts as a failure.
pub const ATTEMPTS: usize = 3;
/// Shortest lease an adapter under test may grant (ms).
pub const LEASE_MS_MIN: DurationMs = DurationMs::from_millis(200);
/// Prefix of the resources named in [`configured_defaults`]: `configured-0` … (one per
/// attempt).
pub const CONFIGURED: &str = "configured";
/// Application-configured limits of the `configured-<n>` resources.
pub const CONFIGURED_LIMITS: PermitLimits = PermitLimits { max_concurrency: 1, max_starts_per_second: 0 };
/// Limits of resources configured nowhere.
pub const FALLBACK_LIMITS: PermitLimits = PermitLimits { max_concurrency: 2, max_starts_per_second: 0 };

/// The application configuration every adapter under test is built with.
pub fn configured_defaults() -> HashMap<String, PermitLimits> {
    (0..ATTEMPTS).map(|a| (format!("{CONFIGURED}-{a}"), CONFIGURED_LIMITS)).collect()
}

/// What the cases need besides the port.
#[async_trait::async_trait]
pub trait PermitHooks: Send + Sync {
    /// Set a resource's live limits (what an operator writes).
    async fn set_limits(&self, resource: &str, limits: PermitLimits);
    /// Remove a resource's live limits (a missing hash).
    async fn clear_limits(&self, resource: &str);
    /// Lose every holder and live limit (a flushed backend).
    async fn flush(&self);
    /// Lease the adapter grants (ms).
    fn lease_ms(&self) -> DurationMs;
    /// Now on the permit clock (ms).
    async fn now_ms(&self) -> Instant;
    /// Let at least `ms` of permit-clock time pass.
    async fn pass(&self, ms: DurationMs);
}

/// An adapter under test with its hooks.
pub trait PermitFixture: Send + Sync {
    /// The port.
    fn permits(&self) -> &DynPermits;
    /// Its hooks.
    fn hooks(&self) -> &dyn PermitHooks;
    /// Clean up after the case (it runs also when the case panics); the default does nothing.
    fn teardown(self) -> futures::future::BoxFuture<'static, ()>
    where
        Self: Sized,
    {
        Box::pin(async {})
    }
}

/// The machine stalled longer than a case's time bound; retry on a fresh resource.
#[derive(Debug)]
struct Disturbed;

type Attempt = Result<(), Disturbed>;

/// Time bound of one assertion window on the permit clock.
struct Window<'a> {
    h: &'a dyn PermitHooks,
    t0: Instant,
    bound_ms: DurationMs,
}

impl<'a> Window<'a> {
    async fn open(h: &'a dyn PermitHooks, bound_ms: impl Into<DurationMs>) -> Window<'a> {
        Window { h, t0: h.now_ms().await, bound_ms: bound_ms.into() }
    }
    /// `cond` must hold unless more than the bound elapsed since the window opened.
    async fn ensure(&self, cond: bool, what: impl std::fmt::Display) -> Attempt {
        if cond {
            return Ok(());
        }
        let elapsed = self.h.now_ms().await - self.t0;
        if elapsed >= self.bound_ms {
            eprintln!("permit conformance: {what} failed after a {elapsed} ms stall; retrying");
            return Err(Disturbed);
        }
        panic!("{what} (window open for {elapsed} ms of permit time)");
    }
}

fn owner(n: usize) -> PermitOwner {
    PermitOwner { workflow_id: format!("wf-{n}").into(), step: "call".into(), claim_token: format!("tok-{n}").into() }
}

async fn acquire(p: &DynPermits, r: &str, o: &PermitOwner) -> PermitDecision {
    p.acquire(r, o).await.unwrap_or_else(|e| panic!("acquire {r} by {}: {e}", o.key()))
}

async fn granted(p: &DynPermits, r: &str, o: &PermitOwner) -> bool {
    matches!(acquire(p, r, o).await, PermitDecision::Granted { .. })
}

async fn release(p: &DynPermits, r: &str, o: &PermitOwner) {
    p.release(r, o).await.unwrap_or_else(|e| panic!("release {r} by {}: {e}", o.key()));
}

async fn run_attempts<'a, F, Fut>(name: &str, mut attempt: F)
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Attempt> + 'a,
{
    for a in 0..ATTEMPTS {
        if attempt(a).await.is_ok() {
            return;
        }
    }
    panic!("{name}: every attempt was disturbed by stalls");
}

/// `max_concurrency` holders at most; a denial hints a delay within the lease; a release
/// frees a slot.
pub async fn grants_up_to_max_concurrency_then_denies(p: &DynPermits, h: &dyn PermitHooks) {
    run_attempts("grants_up_to_max_concurrency_then_denies", |a| async move {
        let r = format!("conc-{a}");
        h.set_limits(&r, PermitLimits { max_concurrency: 2, max_starts_per_second: 0 }).await;
        let w = Window::open(h, h.lease_ms() / 2).await;
        w.ensure(granted(p, &r, &owner(1)).await, "first holder").await?;
        w.ensure(granted(p, &r, &owner(2)).await, "second holder").await?;
        match acquire(p, &r, &owner(3)).await {
            PermitDecision::Denied { retry_after_ms } => {
                assert!(
                    (1..=h.lease_ms().as_millis()).contains(&retry_after_ms.as_millis()),
                    "retry_after_ms {retry_after_ms}"
                )
            }
            PermitDecision::Granted { .. } => w.ensure(false, "third holder denied").await?,
        }
        release(p, &r, &owner(1)).await;
        w.ensure(granted(p, &r, &owner(3)).await, "released slot reused").await?;
        w.ensure(!granted(p, &r, &owner(4)).await, "full again").await
    })
    .await
}

/// The same owner re-acquiring renews and takes no second slot.
pub async fn same_owner_renews_without_second_slot(p: &DynPermits, h: &dyn PermitHooks) {
    run_attempts("same_owner_renews_without_second_slot", |a| async move {
        let r = format!("renew-{a}");
        h.set_limits(&r, PermitLimits { max_concurrency: 1, max_starts_per_second: 0 }).await;
        let w = Window::open(h, h.lease_ms() / 2).await;
        for i in 0..3 {
            match acquire(p, &r, &owner(1)).await {
                PermitDecision::Granted { lease_ms } => assert_eq!(lease_ms, h.lease_ms()),
                PermitDecision::Denied { .. } => w.ensure(false, format_args!("renewal {i}")).await?,
            }
        }
        w.ensure(!granted(p, &r, &owner(2)).await, "renewals took one slot").await?;
        release(p, &r, &owner(1)).await;
        w.ensure(granted(p, &r, &owner(2)).await, "slot freed").await
    })
    .await
}

/// Owner identity is workflow id + step + claim token: a new claim is a new owner.
pub async fn owner_is_workflow_step_and_claim_token(p: &DynPermits, h: &dyn PermitHooks) {
    run_attempts("owner_is_workflow_step_and_claim_token", |a| async move {
        let r = format!("owner-{a}");
        h.set_limits(&r, PermitLimits { max_concurrency: 1, max_starts_per_second: 0 }).await;
        let o =
            |w: &str, s: &str, t: &str| PermitOwner { workflow_id: w.into(), step: s.into(), claim_token: t.into() };
        let w = Window::open(h, h.lease_ms() / 2).await;
        w.ensure(granted(p, &r, &o("w1", "s", "t1")).await, "first").await?;
        w.ensure(!granted(p, &r, &o("w1", "s", "t2")).await, "other claim token").await?;
        w.ensure(!granted(p, &r, &o("w1", "s2", "t1")).await, "other step").await?;
        w.ensure(!granted(p, &r, &o("w2", "s", "t1")).await, "other workflow").await?;
        // Fields are length-prefixed: shifting a separator makes another owner.
        w.ensure(!granted(p, &r, &o("w1|1:s", "t", "1")).await, "ambiguous split").await?;
        w.ensure(granted(p, &r, &o("w1", "s", "t1")).await, "same owner renews").await
    })
    .await
}

/// Lowering a limit live affects new acquires only; held permits keep renewing.
pub async fn held_permits_renew_above_lowered_limit(p: &DynPermits, h: &dyn PermitHooks) {
    run_attempts("held_permits_renew_above_lowered_limit", |a| async move {
        let r = format!("lower-{a}");
        h.set_limits(&r, PermitLimits { max_concurrency: 3, max_starts_per_second: 0 }).await;
        let w = Window::open(h, h.lease_ms() / 2).await;
        for i in 1..=3 {
            w.ensure(granted(p, &r, &owner(i)).await, format_args!("holder {i}")).await?;
        }
        h.set_limits(&r, PermitLimits { max_concurrency: 1, max_starts_per_second: 0 }).await;
        for i in 1..=3 {
            w.ensure(granted(p, &r, &owner(i)).await, format_args!("holder {i} renews above the lowered limit"))
                .await?;
        }
        w.ensure(!granted(p, &r, &owner(4)).await, "new acquire obeys the lowered limit").await?;
        release(p, &r, &owner(1)).await;
        release(p, &r, &owner(2)).await;
        w.ensure(!granted(p, &r, &owner(4)).await, "one holder left = the new limit").await?;
        release(p, &r, &owner(3)).await;
        w.ensure(granted(p, &r, &owner(4)).await, "below the limit again").await
    })
    .await
}

/// Releasing a permit not held is a no-op; releasing twice is fine.
pub async fn release_is_idempotent(p: &DynPermits, h: &dyn PermitHooks) {
    run_attempts("release_is_idempotent", |a| async move {
        let r = format!("rel-{a}");
        h.set_limits(&r, PermitLimits { max_concurrency: 1, max_starts_per_second: 0 }).await;
        release(p, &r, &owner(9)).await;
        let w = Window::open(h, h.lease_ms() / 2).await;
        w.ensure(granted(p, &r, &owner(1)).await, "first").await?;
        release(p, &r, &owner(9)).await;
        w.ensure(!granted(p, &r, &owner(2)).await, "a stranger's release frees nothing").await?;
        release(p, &r, &owner(1)).await;
        release(p, &r, &owner(1)).await;
        w.ensure(granted(p, &r, &owner(2)).await, "freed once").await?;
        w.ensure(!granted(p, &r, &owner(3)).await, "double release freed no extra slot").await
    })
    .await
}

/// A limit of 0 disables that limit.
pub async fn zero_means_unlimited(p: &DynPermits, h: &dyn PermitHooks) {
    run_attempts("zero_means_unlimited", |a| async move {
        let r = format!("zero-{a}");
        h.set_limits(&r, PermitLimits { max_concurrency: 0, max_starts_per_second: 0 }).await;
        let w = Window::open(h, h.lease_ms() / 2).await;
        for i in 0..40 {
            w.ensure(granted(p, &r, &owner(i)).await, format_args!("owner {i}")).await?;
        }
        Ok(())
    })
    .await
}

/// A denied acquire registers nothing.
pub async fn denied_acquire_takes_nothing(p: &DynPermits, h: &dyn PermitHooks) {
    run_attempts("denied_acquire_takes_nothing", |a| async move {
        let r = format!("denied-{a}");
        h.set_limits(&r, PermitLimits { max_concurrency: 1, max_starts_per_second: 0 }).await;
        let w = Window::open(h, h.lease_ms() / 2).await;
        w.ensure(granted(p, &r, &owner(1)).await, "first").await?;
        for _ in 0..3 {
            w.ensure(!granted(p, &r, &owner(2)).await, "full").await?;
        }
        release(p, &r, &owner(1)).await;
        w.ensure(granted(p, &r, &owner(3)).await, "denied owner 2 holds nothing").await?;
        release(p, &r, &owner(3)).await;
        w.ensure(granted(p, &r, &owner(2)).await, "owner 2 gets it now").await
    })
    .await
}

/// `max_starts_per_second` bounds new grants in any 1 s window; releasing does not undo a
/// start; the hint points at the window's end.
pub async fn starts_per_second_limits_new_acquires(p: &DynPermits, h: &dyn PermitHooks) {
    run_attempts("starts_per_second_limits_new_acquires", |a| async move {
        let r = format!("sps-{a}");
        h.set_limits(&r, PermitLimits { max_concurrency: 0, max_starts_per_second: 2 }).await;
        let w = Window::open(h, 900).await;
        w.ensure(granted(p, &r, &owner(1)).await, "start 1").await?;
        w.ensure(granted(p, &r, &owner(2)).await, "start 2").await?;
        match acquire(p, &r, &owner(3)).await {
            PermitDecision::Denied { retry_after_ms } => {
                assert!((1..=1_000).contains(&retry_after_ms.as_millis()), "retry_after_ms {retry_after_ms}")
            }
            PermitDecision::Granted { .. } => w.ensure(false, "third start in the same second").await?,
        }
        release(p, &r, &owner(1)).await;
        release(p, &r, &owner(2)).await;
        w.ensure(!granted(p, &r, &owner(4)).await, "releases do not undo starts").await?;
        h.pass(DurationMs::from_millis(1_001)).await;
        assert!(granted(p, &r, &owner(4)).await, "window moved on");
        Ok(())
    })
    .await
}

/// Renewing a held permit is not a start, so it succeeds with the start window full.
pub async fn renewal_is_not_a_start(p: &DynPermits, h: &dyn PermitHooks) {
    run_attempts("renewal_is_not_a_start", |a| async move {
        let r = format!("spsrenew-{a}");
        h.set_limits(&r, PermitLimits { max_concurrency: 0, max_starts_per_second: 1 }).await;
        let w = Window::open(h, 900).await;
        w.ensure(granted(p, &r, &owner(1)).await, "start").await?;
        w.ensure(granted(p, &r, &owner(1)).await, "renewal").await?;
        w.ensure(granted(p, &r, &owner(1)).await, "renewal").await?;
        w.ensure(!granted(p, &r, &owner(2)).await, "window full").await
    })
    .await
}

/// Without live limits the application's configured ones apply, never "unlimited"; live
/// limits override them while present.
pub async fn configured_defaults_apply_when_live_limits_missing(p: &DynPermits, h: &dyn PermitHooks) {
    run_attempts("configured_defaults_apply_when_live_limits_missing", |a| async move {
        let r = format!("{CONFIGURED}-{a}");
        h.clear_limits(&r).await;
        let w = Window::open(h, h.lease_ms() / 2).await;
        w.ensure(granted(p, &r, &owner(1)).await, "configured limit 1: first").await?;
        w.ensure(!granted(p, &r, &owner(2)).await, "configured limit 1: second denied").await?;
        h.set_limits(&r, PermitLimits { max_concurrency: 2, max_starts_per_second: 0 }).await;
        w.ensure(granted(p, &r, &owner(2)).await, "live limit 2").await?;
        h.clear_limits(&r).await;
        w.ensure(!granted(p, &r, &owner(3)).await, "back to configured 1").await?;
        release(p, &r, &owner(1)).await;
        w.ensure(!granted(p, &r, &owner(3)).await, "one holder = configured limit").await?;
        release(p, &r, &owner(2)).await;
        w.ensure(granted(p, &r, &owner(3)).await, "free").await
    })
    .await
}

/// A resource configured nowhere gets the fallback limits.
pub async fn unconfigured_resource_uses_fallback(p: &DynPermits, h: &dyn PermitHooks) {
    run_attempts("unconfigured_resource_uses_fallback", |a| async move {
        let r = format!("unlisted-{a}");
        h.clear_limits(&r).await;
        let w = Window::open(h, h.lease_ms() / 2).await;
        for i in 0..FALLBACK_LIMITS.max_concurrency as usize {
            w.ensure(granted(p, &r, &owner(i)).await, format_args!("fallback holder {i}")).await?;
        }
        w.ensure(!granted(p, &r, &owner(99)).await, "fallback limit reached").await
    })
    .await
}

/// `tenant:<t>:<base>` counts separately per tenant, inherits `<base>`'s configured limits,
/// and takes its own live limits.
pub async fn tenant_scoped_resources_inherit_base_defaults_and_count_separately(p: &DynPermits, h: &dyn PermitHooks) {
    run_attempts("tenant_scoped_resources_inherit_base_defaults_and_count_separately", |a| async move {
        let base = format!("{CONFIGURED}-{a}");
        let acme = InMemoryPermits::tenant_resource("acme", &base).expect("tenant name");
        let other = InMemoryPermits::tenant_resource("other", &base).expect("tenant name");
        assert_eq!(acme, format!("tenant:acme:{base}"));
        for r in [&base, &acme, &other] {
            h.clear_limits(r).await;
        }
        let w = Window::open(h, h.lease_ms() / 2).await;
        w.ensure(granted(p, &acme, &owner(1)).await, "acme first").await?;
        w.ensure(!granted(p, &acme, &owner(2)).await, "acme inherits limit 1").await?;
        w.ensure(granted(p, &other, &owner(2)).await, "other tenant counts separately").await?;
        w.ensure(granted(p, &base, &owner(3)).await, "base resource counts separately").await?;
        w.ensure(!granted(p, &base, &owner(4)).await, "base limit 1").await?;
        h.set_limits(&acme, PermitLimits { max_concurrency: 2, max_starts_per_second: 0 }).await;
        w.ensure(granted(p, &acme, &owner(2)).await, "acme's own live limit").await?;
        w.ensure(!granted(p, &other, &owner(5)).await, "other tenant unaffected").await
    })
    .await
}

/// A holder that stops renewing loses its slot after its lease; the next call purges it.
pub async fn expired_lease_frees_slot(p: &DynPermits, h: &dyn PermitHooks) {
    run_attempts("expired_lease_frees_slot", |a| async move {
        let r = format!("expire-{a}");
        h.set_limits(&r, PermitLimits { max_concurrency: 1, max_starts_per_second: 0 }).await;
        assert!(granted(p, &r, &owner(1)).await, "first");
        h.pass(h.lease_ms() + DurationMs::from_millis(1)).await;
        let w = Window::open(h, h.lease_ms() / 2).await;
        assert!(granted(p, &r, &owner(2)).await, "expired holder purged");
        w.ensure(!granted(p, &r, &owner(1)).await, "the expired owner lost its slot").await
    })
    .await
}

/// Renewal extends the lease from the renewal's time.
pub async fn renewal_extends_lease(p: &DynPermits, h: &dyn PermitHooks) {
    run_attempts("renewal_extends_lease", |a| async move {
        let r = format!("extend-{a}");
        let lease = h.lease_ms();
        h.set_limits(&r, PermitLimits { max_concurrency: 1, max_starts_per_second: 0 }).await;
        let before_grant = Window::open(h, lease - DurationMs::from_millis(1)).await;
        before_grant.ensure(granted(p, &r, &owner(1)).await, "first").await?;
        h.pass(lease / 2).await;
        let before_renewal = Window::open(h, lease - DurationMs::from_millis(1)).await;
        before_grant.ensure(granted(p, &r, &owner(1)).await, "renewal within the lease").await?;
        h.pass(lease - lease / 2).await;
        // Now at or past the first lease's end, still inside the renewed one.
        before_renewal.ensure(!granted(p, &r, &owner(2)).await, "renewed lease still holds").await
    })
    .await
}

/// After a flush (holders and live limits lost) a holder re-registers on its next renewal,
/// and the configured limits apply again.
pub async fn flush_forgets_holders_and_renewal_reregisters(p: &DynPermits, h: &dyn PermitHooks) {
    run_attempts("flush_forgets_holders_and_renewal_reregisters", |a| async move {
        let r = format!("{CONFIGURED}-{a}");
        h.set_limits(&r, PermitLimits { max_concurrency: 3, max_starts_per_second: 0 }).await;
        let w = Window::open(h, h.lease_ms() / 2).await;
        w.ensure(granted(p, &r, &owner(1)).await, "first").await?;
        w.ensure(granted(p, &r, &owner(2)).await, "second").await?;
        h.flush().await;
        w.ensure(granted(p, &r, &owner(1)).await, "renewal re-registers").await?;
        w.ensure(!granted(p, &r, &owner(2)).await, "configured limit 1 applies after the flush").await?;
        w.ensure(!granted(p, &r, &owner(3)).await, "still full").await
    })
    .await
}

/// Resource names follow the key-name rule; owners the identifier rule.
pub async fn rejects_invalid_names(p: &DynPermits, _h: &dyn PermitHooks) {
    let long = "r".repeat(257);
    for bad in ["", "$where", "a.b", "nul\0", long.as_str()] {
        let e = p.acquire(bad, &owner(1)).await.expect_err("bad resource accepted");
        assert!(matches!(e, Error::InvalidInput { .. }), "{bad:?}: {e:?}");
        let e = p.release(bad, &owner(1)).await.expect_err("bad resource accepted");
        assert!(matches!(e, Error::InvalidInput { .. }), "{bad:?}: {e:?}");
    }
    let bad_owner = PermitOwner { workflow_id: "wf".into(), step: "a.b".into(), claim_token: "t".into() };
    let e = p.acquire("ok", &bad_owner).await.expect_err("bad step accepted");
    assert!(matches!(e, Error::InvalidInput { .. }), "{e:?}");
    let bad_owner =
        PermitOwner { workflow_id: WorkflowId::from(String::new()), step: "s".into(), claim_token: "t".into() };
    let e = p.acquire("ok", &bad_owner).await.expect_err("empty workflow id accepted");
    assert!(matches!(e, Error::InvalidInput { .. }), "{e:?}");
}

/// Concurrent acquires never overshoot the limit.
pub async fn concurrent_acquirers_respect_limit(p: &DynPermits, h: &dyn PermitHooks) {
    run_attempts("concurrent_acquirers_respect_limit", |a| async move {
        let r = format!("race-{a}");
        h.set_limits(&r, PermitLimits { max_concurrency: 8, max_starts_per_second: 0 }).await;
        let w = Window::open(h, h.lease_ms() / 2).await;
        let decisions = join_all((0..32).map(|i| {
            let r = r.clone();
            async move { granted(p, &r, &owner(i)).await }
        }))
        .await;
        let n = decisions.iter().filter(|g| **g).count();
        assert!(n <= 8, "{n} holders above max_concurrency 8");
        w.ensure(n == 8, format_args!("{n} of 32 granted, want exactly 8")).await
    })
    .await
}

async fn usage(p: &DynPermits, r: &str) -> PermitUsage {
    p.usage(r).await.unwrap_or_else(|e| panic!("usage {r}: {e}"))
}

async fn resources(p: &DynPermits) -> Vec<String> {
    let names = p.resources().await.unwrap_or_else(|e| panic!("resources: {e}"));
    assert!(names.len() <= PERMIT_RESOURCES_MAX, "{} resources", names.len());
    assert!(names.windows(2).all(|w| w[0] < w[1]), "not sorted and distinct: {names:?}");
    names
}

async fn set_limits(p: &DynPermits, r: &str, limits: PermitLimits) {
    p.set_limits(r, limits).await.unwrap_or_else(|e| panic!("set_limits {r}: {e}"));
}

/// The owners `usage` lists, in its order.
fn holder_owners(u: &PermitUsage) -> Vec<PermitOwner> {
    u.holders.iter().map(|h| h.owner.clone()).collect()
}

/// Every listed lease ends after the report's time, within one lease of it.
fn assert_leases_live(u: &PermitUsage, lease: DurationMs) {
    for h in &u.holders {
        if let (Some(until), Some(at)) = (h.lease_until, u.as_of) {
            assert!(until > at && until <= at.saturating_add(lease), "lease {until} vs as_of {at}: {u:?}");
        }
    }
    let ends: Vec<_> = u.holders.iter().map(|h| (h.lease_until, h.owner.key())).collect();
    assert!(ends.windows(2).all(|w| w[0] <= w[1]), "not soonest lease first: {ends:?}");
}

/// `set_limits` through the port is what the next acquire reads: raising and lowering
/// take effect at once, and `usage` reports the override.
pub async fn set_limits_then_acquire_honours_the_new_limit(p: &DynPermits, h: &dyn PermitHooks) {
    run_attempts("set_limits_then_acquire_honours_the_new_limit", |a| async move {
        let r = format!("{CONFIGURED}-{a}");
        h.clear_limits(&r).await;
        let before = usage(p, &r).await;
        assert_eq!((before.limits, before.overridden), (CONFIGURED_LIMITS, false), "{before:?}");
        let one = PermitLimits { max_concurrency: 1, max_starts_per_second: 0 };
        let two = PermitLimits { max_concurrency: 2, max_starts_per_second: 0 };
        set_limits(p, &r, two).await;
        let u = usage(p, &r).await;
        assert_eq!((u.limits, u.overridden), (two, true), "{u:?}");
        let w = Window::open(h, h.lease_ms() / 2).await;
        w.ensure(granted(p, &r, &owner(1)).await, "first under the override").await?;
        w.ensure(granted(p, &r, &owner(2)).await, "second under the override (configured is 1)").await?;
        w.ensure(!granted(p, &r, &owner(3)).await, "third above the override").await?;
        set_limits(p, &r, PermitLimits { max_concurrency: 3, max_starts_per_second: 0 }).await;
        w.ensure(granted(p, &r, &owner(3)).await, "raised: the next acquire reads it").await?;
        release(p, &r, &owner(1)).await;
        release(p, &r, &owner(2)).await;
        release(p, &r, &owner(3)).await;
        set_limits(p, &r, one).await;
        assert_eq!(usage(p, &r).await.limits, one);
        w.ensure(granted(p, &r, &owner(4)).await, "lowered to 1: one holder").await?;
        w.ensure(!granted(p, &r, &owner(5)).await, "lowered to 1: the second is refused").await?;
        let zero = PermitLimits::default();
        set_limits(p, &r, zero).await;
        for i in 5..10 {
            w.ensure(granted(p, &r, &owner(i)).await, format_args!("0 = unlimited: owner {i}")).await?;
        }
        let u = usage(p, &r).await;
        assert_eq!((u.limits, u.overridden), (zero, true), "an override of zeros is still an override: {u:?}");
        Ok(())
    })
    .await
}

/// `usage` lists exactly the unexpired holders: new ones appear, released and expired
/// ones are gone; the limits are the effective ones.
pub async fn usage_lists_holders_and_drops_released_and_expired_ones(p: &DynPermits, h: &dyn PermitHooks) {
    run_attempts("usage_lists_holders_and_drops_released_and_expired_ones", |a| async move {
        let r = format!("usage-{a}");
        let empty = usage(p, &r).await;
        assert_eq!((empty.limits, empty.overridden), (FALLBACK_LIMITS, false), "fallback limits: {empty:?}");
        assert!(empty.holders.is_empty() && !empty.truncated, "{empty:?}");
        let limits = PermitLimits { max_concurrency: 5, max_starts_per_second: 0 };
        h.set_limits(&r, limits).await;
        let w = Window::open(h, h.lease_ms() / 2).await;
        for i in 1..=3 {
            w.ensure(granted(p, &r, &owner(i)).await, format_args!("holder {i}")).await?;
        }
        let u = usage(p, &r).await;
        assert_eq!((u.limits, u.overridden), (limits, true), "{u:?}");
        assert!(!u.truncated, "{u:?}");
        let mut listed = holder_owners(&u);
        listed.sort_by_key(PermitOwner::key);
        if listed.len() < 3 {
            w.ensure(false, format_args!("three holders listed: {u:?}")).await?;
        }
        assert_eq!(listed, [owner(1), owner(2), owner(3)], "{u:?}");
        assert_leases_live(&u, h.lease_ms());
        release(p, &r, &owner(2)).await;
        let u = usage(p, &r).await;
        let mut listed = holder_owners(&u);
        listed.sort_by_key(PermitOwner::key);
        if listed.len() < 2 {
            w.ensure(false, format_args!("two holders listed: {u:?}")).await?;
        }
        assert_eq!(listed, [owner(1), owner(3)], "a released holder is not listed: {u:?}");
        h.pass(h.lease_ms() + DurationMs::from_millis(1)).await;
        let u = usage(p, &r).await;
        assert!(u.holders.is_empty(), "expired holders are not listed: {u:?}");
        assert_eq!(u.limits, limits, "expiry keeps the override");
        Ok(())
    })
    .await
}

/// `usage` counts the starts of the current 1 s window and changes nothing: it counts no
/// start itself, renewals and releases do not change the count, and the count falls to 0
/// once the window has moved on.
pub async fn usage_counts_starts_in_the_window_and_changes_nothing(p: &DynPermits, h: &dyn PermitHooks) {
    run_attempts("usage_counts_starts_in_the_window_and_changes_nothing", |a| async move {
        let r = format!("usage-sps-{a}");
        h.set_limits(&r, PermitLimits { max_concurrency: 0, max_starts_per_second: 3 }).await;
        let w = Window::open(h, 900).await;
        w.ensure(granted(p, &r, &owner(1)).await, "start 1").await?;
        w.ensure(granted(p, &r, &owner(2)).await, "start 2").await?;
        for _ in 0..5 {
            let u = usage(p, &r).await;
            w.ensure(u.starts_in_window == 2, format_args!("two starts: {u:?}")).await?;
        }
        w.ensure(granted(p, &r, &owner(1)).await, "a renewal is not a start").await?;
        release(p, &r, &owner(2)).await;
        let u = usage(p, &r).await;
        w.ensure(u.starts_in_window == 2, format_args!("renewal and release leave two: {u:?}")).await?;
        w.ensure(granted(p, &r, &owner(3)).await, "usage calls took no start: a third fits").await?;
        w.ensure(!granted(p, &r, &owner(4)).await, "the fourth does not").await?;
        w.ensure(usage(p, &r).await.starts_in_window == 3, "three starts").await?;
        h.pass(DurationMs::from_millis(1_001)).await;
        let u = usage(p, &r).await;
        assert_eq!(u.starts_in_window, 0, "the window moved on: {u:?}");
        Ok(())
    })
    .await
}

/// `resources` lists a resource once a limit is set or a holder holds it, and no longer
/// once neither is true; application-configured limits alone list nothing.
pub async fn resources_lists_set_and_held_resources(p: &DynPermits, h: &dyn PermitHooks) {
    run_attempts("resources_lists_set_and_held_resources", |a| async move {
        let (set, held, configured) =
            (format!("res-b-set-{a}"), format!("res-a-held-{a}"), format!("{CONFIGURED}-{a}"));
        h.clear_limits(&configured).await;
        let names = resources(p).await;
        for r in [&set, &held, &configured] {
            assert!(!names.contains(r), "{r} listed before anything happened: {names:?}");
        }
        set_limits(p, &set, PermitLimits { max_concurrency: 4, max_starts_per_second: 1 }).await;
        let names = resources(p).await;
        assert!(names.contains(&set), "{set} not listed after set_limits: {names:?}");
        assert!(!names.contains(&configured), "configured limits alone list nothing: {names:?}");
        let w = Window::open(h, h.lease_ms() / 2).await;
        w.ensure(granted(p, &held, &owner(1)).await, "holder").await?;
        let names = resources(p).await;
        if !names.contains(&held) {
            w.ensure(false, format_args!("{held} not listed while held: {names:?}")).await?;
        }
        let (i, j) = (names.iter().position(|n| n == &held), names.iter().position(|n| n == &set));
        assert!(i < j, "sorted by name: {names:?}");
        release(p, &held, &owner(1)).await;
        let names = resources(p).await;
        assert!(!names.contains(&held), "{held} listed after its only holder left: {names:?}");
        assert!(names.contains(&set), "{set} still has its limit: {names:?}");
        w.ensure(granted(p, &held, &owner(2)).await, "held again").await?;
        h.pass(h.lease_ms() + DurationMs::from_millis(1)).await;
        let names = resources(p).await;
        assert!(!names.contains(&held), "{held} listed after its holder expired: {names:?}");
        assert!(names.contains(&set), "{set} still has its limit: {names:?}");
        Ok(())
    })
    .await
}

/// Operator calls check resource names like `acquire` does, and a refused `set_limits`
/// writes nothing.
pub async fn operator_calls_refuse_bad_names(p: &DynPermits, _h: &dyn PermitHooks) {
    let before = resources(p).await;
    let long = "r".repeat(257);
    for bad in ["", "$where", "a.b", "nul\0", long.as_str()] {
        let e = p.usage(bad).await.expect_err("bad resource accepted");
        assert!(matches!(&e, Error::InvalidInput { field, .. } if field == "resource"), "{bad:?}: {e:?}");
        let e = p
            .set_limits(bad, PermitLimits { max_concurrency: 1, max_starts_per_second: 0 })
            .await
            .expect_err("bad resource accepted");
        assert!(matches!(&e, Error::InvalidInput { field, .. } if field == "resource"), "{bad:?}: {e:?}");
    }
    assert_eq!(resources(p).await, before, "a refused set_limits wrote nothing");
}

/// Lowering a limit through the port evicts no holder: all stay listed and keep
/// renewing, and only new acquires are refused until the count is below the new limit.
pub async fn lowering_a_limit_keeps_existing_holders(p: &DynPermits, h: &dyn PermitHooks) {
    run_attempts("lowering_a_limit_keeps_existing_holders", |a| async move {
        let r = format!("keep-{a}");
        set_limits(p, &r, PermitLimits { max_concurrency: 3, max_starts_per_second: 0 }).await;
        let w = Window::open(h, h.lease_ms() / 2).await;
        for i in 1..=3 {
            w.ensure(granted(p, &r, &owner(i)).await, format_args!("holder {i}")).await?;
        }
        let lowered = PermitLimits { max_concurrency: 1, max_starts_per_second: 0 };
        set_limits(p, &r, lowered).await;
        let u = usage(p, &r).await;
        if u.holders.len() < 3 {
            w.ensure(false, format_args!("three holders after lowering: {u:?}")).await?;
        }
        assert_eq!((u.holders.len(), u.limits), (3, lowered), "lowering evicted a holder: {u:?}");
        for i in 1..=3 {
            let d = p.renew(&r, &owner(i)).await.expect("renew");
            assert!(matches!(d, PermitDecision::Granted { .. }), "holder {i} renews above the lowered limit: {d:?}");
            w.ensure(granted(p, &r, &owner(i)).await, format_args!("holder {i} re-acquires")).await?;
        }
        w.ensure(!granted(p, &r, &owner(4)).await, "a new acquire obeys the lowered limit").await?;
        w.ensure(usage(p, &r).await.holders.len() == 3, "still three holders").await?;
        release(p, &r, &owner(1)).await;
        release(p, &r, &owner(2)).await;
        w.ensure(!granted(p, &r, &owner(4)).await, "one holder left = the new limit").await?;
        release(p, &r, &owner(3)).await;
        w.ensure(granted(p, &r, &owner(4)).await, "below the limit again").await
    })
    .await
}

/// Expand to one `#[tokio::test]` per permits conformance case; each case takes the fixture's
/// port and hooks (see [`conformance`](crate::conformance) for the factory and the fixture).
#[macro_export]
macro_rules! permits_conformance {
    ($factory:expr) => {
        $crate::__conformance_cases!(permits, PermitFixture, [permits, hooks], $factory;
            grants_up_to_max_concurrency_then_denies,
            same_owner_renews_without_second_slot,
            owner_is_workflow_step_and_claim_token,
            held_permits_renew_above_lowered_limit,
            release_is_idempotent,
            zero_means_unlimited,
            denied_acquire_takes_nothing,
            starts_per_second_limits_new_acquires,
            renewal_is_not_a_start,
            configured_defaults_apply_when_live_limits_missing,
            unconfigured_resource_uses_fallback,
            tenant_scoped_resources_inherit_base_defaults_and_count_separately,
            expired_lease_frees_slot,
            renewal_extends_lease,
            flush_forgets_holders_and_renewal_reregisters,
            rejects_invalid_names,
            concurrent_acquirers_respect_limit,
            set_limits_then_acquire_honours_the_new_limit,
            usage_lists_holders_and_drops_released_and_expired_ones,
            usage_counts_starts_in_the_window_and_changes_nothing,
            resources_lists_set_and_held_resources,
            operator_calls_refuse_bad_names,
            lowering_a_limit_keeps_existing_holders,
        );
    };
}
