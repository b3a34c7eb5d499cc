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
//! fallback [`FALLBACK_LIMITS`], and use a lease of at least [`LEASE_MS_MIN`].

use crate::memory::{InMemoryPermits, PermitLimits};
use futures::future::join_all;
use kernel_core::model::Millis;
use kernel_core::ports::{DynPermits, PermitDecision, PermitOwner};
use kernel_core::Error;
use kernel_core::WorkflowId;
use std::collections::HashMap;

/// Tries per case before a disturbed run counts as a failure.
pub const ATTEMPTS: usize = 3;
/// Shortest lease an adapter under test may grant (ms).
pub const LEASE_MS_MIN: Millis = 200;
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
    fn lease_ms(&self) -> Millis;
    /// Now on the permit clock (ms).
    async fn now_ms(&self) -> Millis;
    /// Let at least `ms` of permit-clock time pass.
    async fn pass(&self, ms: Millis);
}

/// An adapter under test with its hooks.
pub trait PermitFixture: Send + Sync {
    /// The port.
    fn permits(&self) -> &DynPermits;
    /// Its hooks.
    fn hooks(&self) -> &dyn PermitHooks;
}

/// The machine stalled longer than a case's time bound; retry on a fresh resource.
#[derive(Debug)]
struct Disturbed;

type Attempt = Result<(), Disturbed>;

/// Time bound of one assertion window on the permit clock.
struct Window<'a> {
    h: &'a dyn PermitHooks,
    t0: Millis,
    bound_ms: Millis,
}

impl<'a> Window<'a> {
    async fn open(h: &'a dyn PermitHooks, bound_ms: Millis) -> Window<'a> {
        Window { h, t0: h.now_ms().await, bound_ms }
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
                assert!((1..=h.lease_ms()).contains(&retry_after_ms), "retry_after_ms {retry_after_ms}")
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
                assert!((1..=1_000).contains(&retry_after_ms), "retry_after_ms {retry_after_ms}")
            }
            PermitDecision::Granted { .. } => w.ensure(false, "third start in the same second").await?,
        }
        release(p, &r, &owner(1)).await;
        release(p, &r, &owner(2)).await;
        w.ensure(!granted(p, &r, &owner(4)).await, "releases do not undo starts").await?;
        h.pass(1_001).await;
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
        h.pass(h.lease_ms() + 1).await;
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
        let before_grant = Window::open(h, lease - 1).await;
        before_grant.ensure(granted(p, &r, &owner(1)).await, "first").await?;
        h.pass(lease / 2).await;
        let before_renewal = Window::open(h, lease - 1).await;
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

/// Expand to one `#[tokio::test]` per permits conformance case.
///
/// `$factory` is called with the case name and returns a future of `Option<F>` with
/// `F: PermitFixture`; `None` skips the case (the factory prints why).
#[macro_export]
macro_rules! permits_conformance {
    ($factory:expr) => {
        $crate::permits_conformance!(@cases $factory;
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
            concurrent_acquirers_respect_limit
        );
    };
    (@cases $factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[::tokio::test]
            async fn $case() {
                let factory = $factory;
                let Some(fixture) = factory(stringify!($case)).await else { return };
                let fixture: &dyn $crate::conformance::permits::PermitFixture = &fixture;
                $crate::conformance::permits::$case(fixture.permits(), fixture.hooks()).await;
            }
        )*
    };
}
