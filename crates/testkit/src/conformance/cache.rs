//! Conformance cases for the [`ResultCache`] port (K-17.7).
//!
//! Same shape as the [store suite](super::store): `pub async fn case(cache: &DynResultCache)`
//! on an empty cache, and [`result_cache_conformance!`](crate::result_cache_conformance)
//! expanding to one `#[tokio::test]` per case from a factory
//! `|| async { Option<impl CacheFixture> }`.
//!
//! Times are simulated: a case moves `now` by hours without waiting. Every ttl is at least
//! [`TTL`] (an hour), so an adapter whose server also expires entries in real time (Redis
//! `PX`, a MongoDB TTL index) never expires one while a case runs, and every expiry a case
//! sees is the adapter's own filter on the caller's `now`.
//!
//! ```ignore
//! testkit::result_cache_conformance!(|| async { Some(testkit::memory::MemoryResultCache::new()) });
//! ```

use crate::memory::MemoryResultCache;
use crate::time::TestTime;
use kernel_core::domain::{DurationMs, Instant};
use kernel_core::ports::*;
use kernel_core::{validate, Error};
use serde_json::{json, Value};
use std::sync::Arc;

/// The shortest ttl a case uses: an hour, far above a case's real run time.
pub const TTL: DurationMs = DurationMs::from_secs(3_600);

/// A cache under test plus whatever must be cleaned up after the case.
pub trait CacheFixture: Send + Sync + 'static {
    /// The port under test.
    fn cache(&self) -> &DynResultCache;
    /// Drop the fixture's namespace; the default does nothing.
    fn teardown(self) -> futures::future::BoxFuture<'static, ()>
    where
        Self: Sized,
    {
        Box::pin(async {})
    }
}

impl CacheFixture for MemoryResultCache {
    fn cache(&self) -> &DynResultCache {
        self
    }
}

impl CacheFixture for Arc<DynResultCache> {
    fn cache(&self) -> &DynResultCache {
        &**self
    }
}

/// The cases' origin: 2100-01-01, a real date for adapters that store dates, and later
/// than any wall clock the cases run under, so a server-side expiry on the wall clock (a
/// MongoDB TTL index) never removes an entry a case still reads.
fn t0() -> Instant {
    Instant::from_millis(4_102_444_800_000)
}

fn versions() -> CacheVersions {
    CacheVersions {
        prompt: "prompt-3".into(),
        model: "model-2026-01".into(),
        tool: "tools-7".into(),
        data: "data-42".into(),
    }
}

fn key(n: u32) -> CacheKey {
    CacheKey::new("summarize", &versions(), &json!({"doc": n})).expect("key")
}

fn assert_invalid(e: Error, field: &str) {
    match e {
        Error::InvalidInput { field: f, .. } => assert_eq!(f, field, "refusal names the wrong field"),
        e => panic!("expected InvalidInput on {field}, got {e}"),
    }
}

/// A miss, then a put, then a hit with the value, `stored_at = now` and
/// `expires_at = now + ttl`.
pub async fn miss_then_put_then_hit(c: &DynResultCache) {
    let k = key(1);
    assert_eq!(c.get(&k, t0()).await.unwrap(), None, "an empty cache misses");
    let value = json!({"summary": "short", "tokens": 17});
    c.put(&k, &value, t0(), TTL).await.unwrap();
    let hit = c.get(&k, t0()).await.unwrap().expect("hit after put");
    assert_eq!(hit, CachedResult { value: value.clone(), stored_at: t0(), expires_at: t0().plus(TTL) });
    let later = c.get(&k, t0().plus(1_000)).await.unwrap().expect("hit a second later");
    assert_eq!(later.stored_at, t0(), "a get never moves stored_at");
}

/// A get at `expires_at` misses, at `expires_at - 1` hits; the entry is still there for an
/// earlier `now` (expiry is the caller's clock, not a deletion).
pub async fn expiry_at_exactly_expires_at(c: &DynResultCache) {
    let k = key(2);
    let ttl = TTL.saturating_mul(3);
    c.put(&k, &json!("v"), t0(), ttl).await.unwrap();
    let expires_at = t0().plus(ttl);
    let hit = c.get(&k, expires_at.minus(1)).await.unwrap().expect("live one ms before expires_at");
    assert_eq!(hit.expires_at, expires_at);
    assert_eq!(c.get(&k, expires_at).await.unwrap(), None, "expired at expires_at");
    assert_eq!(c.get(&k, expires_at.plus(TTL)).await.unwrap(), None, "expired afterwards");
    assert!(c.get(&k, expires_at.minus(1)).await.unwrap().is_some(), "a get deletes nothing");
}

/// A second put replaces value, `stored_at` and `expires_at`, even with a shorter ttl.
pub async fn put_replaces(c: &DynResultCache) {
    let k = key(3);
    c.put(&k, &json!({"v": 1}), t0(), TTL.saturating_mul(10)).await.unwrap();
    let t1 = t0().plus(TTL);
    c.put(&k, &json!({"v": 2}), t1, TTL).await.unwrap();
    let hit = c.get(&k, t1).await.unwrap().expect("hit");
    assert_eq!(hit, CachedResult { value: json!({"v": 2}), stored_at: t1, expires_at: t1.plus(TTL) });
    // The first put's longer expiry is gone with it.
    assert_eq!(c.get(&k, t1.plus(TTL)).await.unwrap(), None);
    assert_eq!(c.purge_expired(t1.plus(TTL), 10).await.unwrap(), 1, "one entry, not two");
}

/// Entries of different keys (another input, another version) never affect each other.
pub async fn keys_are_isolated(c: &DynResultCache) {
    let a = key(4);
    let b = key(5);
    let newer_model =
        CacheKey::new("summarize", &CacheVersions { model: "model-2026-02".into(), ..versions() }, &json!({"doc": 4}))
            .unwrap();
    c.put(&a, &json!("a"), t0(), TTL).await.unwrap();
    assert_eq!(c.get(&b, t0()).await.unwrap(), None);
    assert_eq!(c.get(&newer_model, t0()).await.unwrap(), None, "a new model version misses");
    c.put(&b, &json!("b"), t0(), TTL.saturating_mul(2)).await.unwrap();
    c.put(&newer_model, &json!("m"), t0(), TTL).await.unwrap();
    assert_eq!(c.get(&a, t0()).await.unwrap().unwrap().value, json!("a"));
    assert_eq!(c.get(&b, t0()).await.unwrap().unwrap().value, json!("b"));
    assert_eq!(c.get(&newer_model, t0()).await.unwrap().unwrap().value, json!("m"));
    // Expiring `a` and `newer_model` leaves `b`.
    assert_eq!(c.purge_expired(t0().plus(TTL), 10).await.unwrap(), 2);
    assert_eq!(c.get(&b, t0().plus(TTL)).await.unwrap().unwrap().value, json!("b"));
}

/// `ttl <= 0` and an overflowing `now + ttl` are refused on `ttl`, nothing written: a new
/// key stays a miss, an existing entry keeps its value.
pub async fn bad_ttl_is_refused(c: &DynResultCache) {
    let k = key(6);
    for ttl in [DurationMs::ZERO, DurationMs::from_millis(-1), DurationMs::from_millis(i64::MIN)] {
        assert_invalid(c.put(&k, &json!(1), t0(), ttl).await.unwrap_err(), "ttl");
    }
    let late = Instant::from_millis(i64::MAX - 10);
    assert_invalid(c.put(&k, &json!(1), late, TTL).await.unwrap_err(), "ttl");
    assert_eq!(c.get(&k, t0()).await.unwrap(), None, "nothing written");
    c.put(&k, &json!("kept"), t0(), TTL).await.unwrap();
    assert_invalid(c.put(&k, &json!("other"), t0(), DurationMs::ZERO).await.unwrap_err(), "ttl");
    let hit = c.get(&k, t0()).await.unwrap().expect("still there");
    assert_eq!(hit, CachedResult { value: json!("kept"), stored_at: t0(), expires_at: t0().plus(TTL) });
}

/// A value over the payload limit, or one no store can hold, is refused on `value`,
/// nothing written.
pub async fn bad_value_is_refused(c: &DynResultCache) {
    let k = key(7);
    let oversized = json!({"text": "x".repeat(validate::STORE_PAYLOAD_BYTES_MAX)});
    assert_invalid(c.put(&k, &oversized, t0(), TTL).await.unwrap_err(), "value");
    assert_invalid(c.put(&k, &json!({"s": "a\0b"}), t0(), TTL).await.unwrap_err(), "value");
    assert_invalid(c.put(&k, &json!(u64::MAX), t0(), TTL).await.unwrap_err(), "value");
    assert_eq!(c.get(&k, t0()).await.unwrap(), None, "nothing written");
    c.put(&k, &json!("kept"), t0(), TTL).await.unwrap();
    assert_invalid(c.put(&k, &oversized, t0().plus(1), TTL).await.unwrap_err(), "value");
    assert_eq!(c.get(&k, t0()).await.unwrap().expect("still there").value, json!("kept"));
    // Just under the limit is accepted and reads back whole.
    let fits = json!("y".repeat(validate::STORE_PAYLOAD_BYTES_MAX - 2));
    c.put(&k, &fits, t0(), TTL).await.unwrap();
    assert_eq!(c.get(&k, t0()).await.unwrap().expect("hit").value, fits);
}

/// A purge limit of 0 or above [`CACHE_PURGE_LIMIT_MAX`] is refused on `limit`, nothing
/// deleted.
pub async fn bad_purge_limit_is_refused(c: &DynResultCache) {
    c.put(&key(8), &json!(1), t0(), TTL).await.unwrap();
    let after = t0().plus(TTL);
    assert_invalid(c.purge_expired(after, 0).await.unwrap_err(), "limit");
    assert_invalid(c.purge_expired(after, CACHE_PURGE_LIMIT_MAX + 1).await.unwrap_err(), "limit");
    assert_eq!(c.purge_expired(after, CACHE_PURGE_LIMIT_MAX).await.unwrap(), 1, "the entry was still there");
}

/// A purge removes the expired entries (`expires_at <= now`) and no live one.
pub async fn purge_removes_only_expired(c: &DynResultCache) {
    for n in 0..3 {
        c.put(&key(100 + n), &json!(n), t0(), TTL).await.unwrap();
    }
    for n in 0..2 {
        c.put(&key(200 + n), &json!(n), t0(), TTL.saturating_mul(2)).await.unwrap();
    }
    let at = t0().plus(TTL);
    assert_eq!(c.purge_expired(at.minus(1), 100).await.unwrap(), 0, "nothing expired yet");
    assert_eq!(c.purge_expired(at, 100).await.unwrap(), 3, "expires_at == now is expired");
    assert_eq!(c.purge_expired(at, 100).await.unwrap(), 0, "already purged");
    for n in 0..3 {
        assert_eq!(c.get(&key(100 + n), t0()).await.unwrap(), None, "purged entries are gone at any now");
    }
    for n in 0..2 {
        assert_eq!(c.get(&key(200 + n), at).await.unwrap().expect("live entry kept").value, json!(n));
    }
}

/// A purge deletes at most `limit` entries; repeated purges finish the rest.
pub async fn purge_respects_limit(c: &DynResultCache) {
    for n in 0..5 {
        c.put(&key(300 + n), &json!(n), t0(), TTL).await.unwrap();
    }
    let live = key(399);
    c.put(&live, &json!("live"), t0(), TTL.saturating_mul(5)).await.unwrap();
    let at = t0().plus(TTL);
    assert_eq!(c.purge_expired(at, 2).await.unwrap(), 2);
    assert_eq!(c.purge_expired(at, 2).await.unwrap(), 2);
    assert_eq!(c.purge_expired(at, 2).await.unwrap(), 1);
    assert_eq!(c.purge_expired(at, 2).await.unwrap(), 0);
    assert!(c.get(&live, at).await.unwrap().is_some(), "the live entry survived");
}

/// Nested objects, unicode, the extremes of i64, floats and empty containers read back
/// equal.
pub async fn values_round_trip(c: &DynResultCache) {
    let value: Value = json!({
        "nested": {"a": [1, {"b": [true, false, null]}], "z": {"y": {"x": "deep"}}},
        "unicode": "Grüße — 日本語 — 🦀 — \u{1}\u{7f}\"\\",
        "big": i64::MAX,
        "small": i64::MIN,
        "float": 1.5,
        "negative": -0.25,
        "empty_object": {},
        "empty_array": [],
        "key with spaces and ünïcode": "ok",
    });
    let k = key(9);
    c.put(&k, &value, t0(), TTL).await.unwrap();
    assert_eq!(c.get(&k, t0()).await.unwrap().expect("hit").value, value);
    for scalar in [json!(null), json!("just a string"), json!(-7), json!([1, "two", 3.5])] {
        c.put(&k, &scalar, t0(), TTL).await.unwrap();
        assert_eq!(c.get(&k, t0()).await.unwrap().expect("hit").value, scalar);
    }
}

/// Expands to one `#[tokio::test]` per result-cache conformance case (see
/// [`store_conformance!`](crate::store_conformance)).
#[macro_export]
macro_rules! result_cache_conformance {
    ($factory:expr) => {
        $crate::__conformance_cases!(cache, CacheFixture, cache, $factory;
            miss_then_put_then_hit,
            expiry_at_exactly_expires_at,
            put_replaces,
            keys_are_isolated,
            bad_ttl_is_refused,
            bad_value_is_refused,
            bad_purge_limit_is_refused,
            purge_removes_only_expired,
            purge_respects_limit,
            values_round_trip,
        );
    };
}
