//! The result cache of read-only activities (K-17.7): every statement of
//! [`ResultCache`](kernel_core::ports::ResultCache) on the `result_cache` table
//! `(key PK, value JSON, stored_at, expires_at)`, for both dialects; decoded by
//! [`row::cached_result`](crate::row::cached_result).

use crate::{storable, Binds, Dialect, Param, Statement};
use kernel_core::domain::{DurationMs, Instant};
use kernel_core::ports::{check_cache_purge_limit, check_cache_put, CacheKey};
use kernel_core::Result;
use serde_json::Value;

/// `get`: the entry unless expired at `now`.
pub fn get(d: Dialect, t: &str, key: &CacheKey, now: Instant) -> Statement {
    let mut b = Binds::new(d);
    let k = b.bind(Param::Text(key.as_str().to_string()));
    let now = b.bind(Param::Int8(now.as_millis()));
    b.statement(format!("SELECT value, stored_at, expires_at FROM {t} WHERE key = {k} AND expires_at > {now}"))
}

/// `put`: one upsert (`ON CONFLICT (key) DO UPDATE`), after the checks of every adapter.
pub fn put(d: Dialect, t: &str, key: &CacheKey, value: &Value, now: Instant, ttl: DurationMs) -> Result<Statement> {
    let expires_at = check_cache_put(value, now, ttl)?;
    storable(d, "value", value)?;
    let mut b = Binds::new(d);
    let vals = [
        b.bind(Param::Text(key.as_str().to_string())),
        b.bind(Param::Jsonb(value.clone())),
        b.bind(Param::Int8(now.as_millis())),
        b.bind(Param::Int8(expires_at.as_millis())),
    ];
    let sql = format!(
        "INSERT INTO {t} (key, value, stored_at, expires_at) VALUES ({}) \
         ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, stored_at = EXCLUDED.stored_at, \
         expires_at = EXCLUDED.expires_at",
        vals.join(", ")
    );
    Ok(b.statement(sql))
}

/// `purge_expired`: at most `limit` entries expired at `now`, `RETURNING key` (one row
/// per entry removed).
pub fn purge_expired(d: Dialect, t: &str, now: Instant, limit: usize) -> Result<Statement> {
    check_cache_purge_limit(limit)?;
    let mut b = Binds::new(d);
    let now = b.bind(Param::Int8(now.as_millis()));
    let limit = b.bind(Param::Int8(limit as i64));
    Ok(b.statement(format!(
        "DELETE FROM {t} WHERE key IN (SELECT key FROM {t} WHERE expires_at <= {now} \
         ORDER BY expires_at LIMIT {limit}) RETURNING key"
    )))
}
