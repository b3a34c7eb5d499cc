//! The result cache of read-only activities (K-17.7): a content-hash cache whose key names
//! everything that decides the answer.
//!
//! A read-only activity (a model call that only reads) may be served from the cache. Its
//! key must include the prompt, model, tool and data versions: missing any one, the cache
//! disguises a stale answer as determinism. [`CacheVersions`] therefore has four required
//! fields, and [`CacheKey`] can only be built from one.

use crate::error::{Error, Result};
use crate::time::{DurationMs, Instant};
use crate::validate;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Most entries one [`ResultCache::purge_expired`] call deletes.
pub const CACHE_PURGE_LIMIT_MAX: usize = 10_000;

/// The four versions that decide a cached answer, all required (K-17.7).
///
/// A literal lacking one does not compile:
///
/// ```compile_fail
/// use kernel_core::ports::CacheVersions;
/// let v = CacheVersions { prompt: "p3".into(), model: "m-2026-01".into(), tool: "t1".into() };
/// ```
///
/// With all four:
///
/// ```
/// use kernel_core::ports::{CacheKey, CacheVersions};
/// let v = CacheVersions {
///     prompt: "p3".into(),
///     model: "m-2026-01".into(),
///     tool: "t1".into(),
///     data: "d42".into(),
/// };
/// let key = CacheKey::new("summarize", &v, &serde_json::json!({"doc": 7})).unwrap();
/// assert_eq!(key.as_str().len(), 64);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheVersions {
    /// Version of the prompt (template) the activity sends.
    pub prompt: String,
    /// Version of the model that answers.
    pub model: String,
    /// Version of the tools the model may call.
    pub tool: String,
    /// Version of the data the activity reads.
    pub data: String,
}

/// The content hash an entry of a [`ResultCache`] is stored under: lowercase hex SHA-256
/// over the activity type, the four [`CacheVersions`] and the canonical input.
///
/// Each part enters as an 8-byte big-endian length followed by its bytes, so no two
/// different splits of the same bytes collide; the input enters as canonical JSON (object
/// keys sorted recursively, no whitespace), so key order does not matter.
///
/// ```
/// use kernel_core::ports::{CacheKey, CacheVersions};
/// use serde_json::json;
/// let v = CacheVersions { prompt: "p".into(), model: "m".into(), tool: "t".into(), data: "d".into() };
/// let a = CacheKey::new("read", &v, &json!({"a": 1, "b": 2})).unwrap();
/// let b = CacheKey::new("read", &v, &json!({"b": 2, "a": 1})).unwrap();
/// assert_eq!(a, b);
/// let newer = CacheVersions { data: "d2".into(), ..v.clone() };
/// assert_ne!(a, CacheKey::new("read", &newer, &json!({"a": 1, "b": 2})).unwrap());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey {
    hex: String,
    activity_type: String,
    versions: CacheVersions,
}

impl CacheKey {
    /// The key of `input` to an activity of `activity_type` under `versions`.
    ///
    /// An empty activity type or version is [`Error::InvalidInput`] naming the field
    /// (`activity_type`, `versions.prompt`, …); the input must pass the payload check of
    /// every stored value ([`validate::payload`] with
    /// [`STORE_PAYLOAD_BYTES_MAX`](validate::STORE_PAYLOAD_BYTES_MAX)).
    pub fn new(activity_type: &str, versions: &CacheVersions, input: &Value) -> Result<CacheKey> {
        let CacheVersions { prompt, model, tool, data } = versions;
        for (field, v) in [
            ("activity_type", activity_type),
            ("versions.prompt", prompt.as_str()),
            ("versions.model", model.as_str()),
            ("versions.tool", tool.as_str()),
            ("versions.data", data.as_str()),
        ] {
            if v.is_empty() {
                return Err(Error::invalid(field, "must not be empty"));
            }
        }
        validate::payload("input", input, validate::STORE_PAYLOAD_BYTES_MAX)?;
        let mut canonical_input = String::new();
        canonical(input, &mut canonical_input);
        let mut h = Sha256::new();
        for part in [activity_type, prompt, model, tool, data, canonical_input.as_str()] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part.as_bytes());
        }
        Ok(CacheKey {
            hex: hex::encode(h.finalize()),
            activity_type: activity_type.to_string(),
            versions: versions.clone(),
        })
    }

    /// The key as 64 lowercase hex digits: what adapters store it under.
    pub fn as_str(&self) -> &str {
        &self.hex
    }

    /// The activity type the key was built for.
    pub fn activity_type(&self) -> &str {
        &self.activity_type
    }

    /// The versions the key was built under.
    pub fn versions(&self) -> &CacheVersions {
        &self.versions
    }
}

impl std::fmt::Display for CacheKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.hex)
    }
}

/// Canonical JSON of `v`: object keys sorted (by their bytes) at every depth, no
/// whitespace, strings and numbers as serde_json writes them. The depth is bounded by the
/// payload check that runs before.
fn canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (k, x)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical(x, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(x, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// An entry read from a [`ResultCache`].
#[derive(Debug, Clone, PartialEq)]
pub struct CachedResult {
    /// The activity's result as stored.
    pub value: Value,
    /// The `now` of the put that stored it.
    pub stored_at: Instant,
    /// `stored_at + ttl`: from this instant on the entry is expired.
    pub expires_at: Instant,
}

/// The shared check of a [`ResultCache::put`], run by every adapter before any I/O:
/// `ttl > 0`, `now + ttl` representable, the value a storable payload of at most
/// [`STORE_PAYLOAD_BYTES_MAX`](validate::STORE_PAYLOAD_BYTES_MAX) bytes. Returns
/// `expires_at`.
pub fn check_cache_put(value: &Value, now: Instant, ttl: DurationMs) -> Result<Instant> {
    if !ttl.is_positive() {
        return Err(Error::invalid("ttl", format_args!("{ttl} ms is not positive")));
    }
    let expires_at = now.try_add(ttl, "ttl")?;
    validate::payload("value", value, validate::STORE_PAYLOAD_BYTES_MAX)?;
    Ok(expires_at)
}

/// The shared check of a [`ResultCache::purge_expired`] limit: `1..=`[`CACHE_PURGE_LIMIT_MAX`].
pub fn check_cache_purge_limit(limit: usize) -> Result<()> {
    if limit == 0 || limit > CACHE_PURGE_LIMIT_MAX {
        return Err(Error::invalid("limit", format_args!("{limit} is outside 1..={CACHE_PURGE_LIMIT_MAX}")));
    }
    Ok(())
}

/// The cache of read-only activity results (K-17.7), keyed by [`CacheKey`].
///
/// # Contract
/// - Times are the caller's [`Clock`](crate::ports::Clock) readings, never the adapter's
///   own clock (tests run on simulated time). An adapter may additionally let its server
///   expire entries (Redis `PX`, a MongoDB TTL index) as a backstop, never before
///   `expires_at`.
/// - An entry is live while `expires_at > now`: a [`get`](Self::get) at `expires_at` or
///   later misses, whether or not the entry is still stored.
/// - Every bad input is [`Error::InvalidInput`] and nothing is written: `ttl <= 0`, an
///   overflowing `now + ttl`, a value refused by [`validate::payload`] (at most
///   [`STORE_PAYLOAD_BYTES_MAX`](validate::STORE_PAYLOAD_BYTES_MAX) bytes) and a purge
///   `limit` outside `1..=`[`CACHE_PURGE_LIMIT_MAX`]. Every adapter runs the same checks
///   ([`check_cache_put`], [`check_cache_purge_limit`]) before any I/O.
/// - Entries of different keys never affect each other.
#[async_trait::async_trait]
pub trait ResultCache: Send + Sync + 'static {
    /// The live entry of `key` at `now`.
    ///
    /// # Contract
    /// Read-only. `Some` only for an entry with `expires_at > now`; an expired entry still
    /// stored is a miss (`None`), as is a key never put or purged.
    async fn get(&self, key: &CacheKey, now: Instant) -> Result<Option<CachedResult>>;

    /// Store `value` under `key`, replacing any entry, with `stored_at = now` and
    /// `expires_at = now + ttl`.
    ///
    /// # Contract
    /// One atomic replace of the key's entry. `ttl <= 0`, an overflowing `now + ttl` and a
    /// value refused by [`validate::payload`] are [`Error::InvalidInput`], nothing written.
    async fn put(&self, key: &CacheKey, value: &Value, now: Instant, ttl: DurationMs) -> Result<()>;

    /// Delete at most `limit` entries with `expires_at <= now`; returns how many this call
    /// deleted.
    ///
    /// # Contract
    /// Never deletes a live entry (`expires_at > now`). Bounded by `limit`, which outside
    /// `1..=`[`CACHE_PURGE_LIMIT_MAX`] is [`Error::InvalidInput`] (nothing deleted). An
    /// adapter whose server already expired an entry may count less than it would
    /// otherwise; what it still holds with `expires_at <= now` it deletes.
    async fn purge_expired(&self, now: Instant, limit: usize) -> Result<u64>;
}

/// `dyn ResultCache`.
pub type DynResultCache = dyn ResultCache;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn v() -> CacheVersions {
        CacheVersions { prompt: "p1".into(), model: "m1".into(), tool: "t1".into(), data: "d1".into() }
    }

    fn key(t: &str, versions: &CacheVersions, input: &Value) -> String {
        CacheKey::new(t, versions, input).unwrap().as_str().to_string()
    }

    #[test]
    fn golden_key() {
        let k = CacheKey::new("summarize", &v(), &json!({"b": [1, "x"], "a": {"d": null, "c": true}})).unwrap();
        // SHA-256 over the length-prefixed parts; the input as `{"a":{"c":true,"d":null},"b":[1,"x"]}`.
        let mut h = Sha256::new();
        for part in ["summarize", "p1", "m1", "t1", "d1", r#"{"a":{"c":true,"d":null},"b":[1,"x"]}"#] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part.as_bytes());
        }
        assert_eq!(k.as_str(), hex::encode(h.finalize()));
        assert_eq!(k.as_str(), "d986047350022a417d4146adf466ae9e8d74ba83ee79744163eaa9298af41169");
    }

    #[test]
    fn accessors() {
        let k = CacheKey::new("summarize", &v(), &json!(1)).unwrap();
        assert_eq!(k.activity_type(), "summarize");
        assert_eq!(k.versions(), &v());
        assert_eq!(k.to_string(), k.as_str());
        assert!(k.as_str().bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    }

    #[test]
    fn every_part_changes_the_key() {
        let input = json!({"q": "x"});
        let base = key("read", &v(), &input);
        let changed = [
            key("read", &CacheVersions { prompt: "p2".into(), ..v() }, &input),
            key("read", &CacheVersions { model: "m2".into(), ..v() }, &input),
            key("read", &CacheVersions { tool: "t2".into(), ..v() }, &input),
            key("read", &CacheVersions { data: "d2".into(), ..v() }, &input),
            key("write", &v(), &input),
            key("read", &v(), &json!({"q": "y"})),
        ];
        for (i, k) in changed.iter().enumerate() {
            assert_ne!(k, &base, "change {i} kept the key");
        }
        let mut all: Vec<&String> = changed.iter().collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), changed.len(), "two different changes collided");
    }

    #[test]
    fn object_key_order_does_not_matter() {
        assert_eq!(key("read", &v(), &json!({"a": 1, "b": 2})), key("read", &v(), &json!({"b": 2, "a": 1})));
        assert_eq!(
            key("read", &v(), &json!([{"x": {"b": 1, "a": 2}}])),
            key("read", &v(), &json!([{"x": {"a": 2, "b": 1}}]))
        );
        assert_ne!(key("read", &v(), &json!([1, 2])), key("read", &v(), &json!([2, 1])));
    }

    #[test]
    fn splits_differ() {
        let ab_c = key("ab", &CacheVersions { prompt: "c".into(), ..v() }, &json!(1));
        let a_bc = key("a", &CacheVersions { prompt: "bc".into(), ..v() }, &json!(1));
        assert_ne!(ab_c, a_bc);
        let m = key("t", &CacheVersions { model: "ab".into(), tool: "c".into(), ..v() }, &json!(1));
        let n = key("t", &CacheVersions { model: "a".into(), tool: "bc".into(), ..v() }, &json!(1));
        assert_ne!(m, n);
    }

    #[test]
    fn empty_parts_are_refused_by_name() {
        let input = json!(1);
        let field = |e: Error| match e {
            Error::InvalidInput { field, .. } => field,
            e => panic!("{e}"),
        };
        assert_eq!(field(CacheKey::new("", &v(), &input).unwrap_err()), "activity_type");
        for (f, versions) in [
            ("versions.prompt", CacheVersions { prompt: String::new(), ..v() }),
            ("versions.model", CacheVersions { model: String::new(), ..v() }),
            ("versions.tool", CacheVersions { tool: String::new(), ..v() }),
            ("versions.data", CacheVersions { data: String::new(), ..v() }),
        ] {
            assert_eq!(field(CacheKey::new("read", &versions, &input).unwrap_err()), f);
        }
        assert_eq!(field(CacheKey::new("read", &v(), &json!({"s": "a\0b"})).unwrap_err()), "input");
        let big = json!("x".repeat(validate::STORE_PAYLOAD_BYTES_MAX));
        assert_eq!(field(CacheKey::new("read", &v(), &big).unwrap_err()), "input");
    }

    #[test]
    fn put_and_purge_checks() {
        let t = Instant::from_millis(1_000);
        assert_eq!(check_cache_put(&json!(1), t, DurationMs::from_millis(5)).unwrap(), Instant::from_millis(1_005));
        assert!(check_cache_put(&json!(1), t, DurationMs::ZERO).is_err());
        assert!(check_cache_put(&json!(1), t, DurationMs::from_millis(-1)).is_err());
        assert!(check_cache_put(&json!(1), t, DurationMs::MAX).is_err());
        assert!(check_cache_put(&json!(u64::MAX), t, DurationMs::from_millis(5)).is_err());
        assert!(check_cache_purge_limit(0).is_err());
        assert!(check_cache_purge_limit(1).is_ok());
        assert!(check_cache_purge_limit(CACHE_PURGE_LIMIT_MAX).is_ok());
        assert!(check_cache_purge_limit(CACHE_PURGE_LIMIT_MAX + 1).is_err());
    }
}
