use crate::RedisConn;
use kernel_core::domain::{DurationMs, Instant};
use kernel_core::ports::*;
use kernel_core::{validate, Error, Result};
use redis::Script;
use redis_conn::{check_prefix, map_redis_error};
use serde_json::{json, Value};
use std::sync::LazyLock;

static PUT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/cache_put.lua")));
static PURGE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/cache_purge.lua")));

/// [`ResultCache`] on Redis (K-17.7): one string per entry, `<prefix>:{<prefix>:cache}:e:<key
/// hex>` = `{"value", "stored_at", "expires_at"}` as JSON, and the ZSET
/// `<prefix>:{<prefix>:cache}:expiry` (member = key hex, score = `expires_at`). All share the
/// hash tag `{<prefix>:cache}`: on a Redis Cluster one cache lives in one slot, so that a
/// put and a purge stay atomic scripts.
///
/// A put is one script: `SET … PX ttl` and the `ZADD`, atomically. `PX` is a backstop: the
/// server expires the entry `ttl` after the put on its own clock, never before the caller's
/// `expires_at` when the caller's clock is the wall clock; a ttl above
/// [`CONFIG_MS_MAX`](validate::CONFIG_MS_MAX) (100 years) gets no server expiry. A get
/// filters on the caller's `now` whatever the server still holds. A purge is one script:
/// `ZRANGEBYSCORE -inf now LIMIT 0 limit`, then `DEL` and `ZREM` of each; it counts only the
/// entries Redis still held (one it already expired counts 0).
///
/// The purge script builds entry keys from the prefix inside the tag, so they are in the
/// slot of the expiry ZSET it is given.
#[derive(Clone)]
pub struct RedisResultCache {
    conn: RedisConn,
    entry_prefix: String,
    expiry: String,
}

impl std::fmt::Debug for RedisResultCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisResultCache").field("expiry", &self.expiry).finish()
    }
}

impl RedisResultCache {
    /// The cache under `prefix`.
    pub fn new(conn: impl Into<RedisConn>, prefix: &str) -> Result<Self> {
        check_prefix(prefix)?;
        Ok(RedisResultCache {
            conn: conn.into(),
            entry_prefix: format!("{prefix}:{{{prefix}:cache}}:e:"),
            expiry: format!("{prefix}:{{{prefix}:cache}}:expiry"),
        })
    }

    /// The cache under `prefix` on a new connection to `url`; see
    /// [`RedisConnection::open`](crate::RedisConnection::open) for the errors.
    pub async fn from_url(url: &str, prefix: &str) -> Result<Self> {
        crate::RedisConnection::open(url).await?.result_cache(prefix)
    }

    /// The Redis key of `key`'s entry.
    pub fn entry_key(&self, key: &CacheKey) -> String {
        format!("{}{}", self.entry_prefix, key.as_str())
    }

    /// The key of the expiry ZSET.
    pub fn expiry_key(&self) -> &str {
        &self.expiry
    }
}

fn decode(key: &str, text: &str) -> Result<CachedResult> {
    let corrupt = |why: &dyn std::fmt::Display| Error::corrupt(format!("redis cache entry `{key}`: {why}"));
    let mut v: Value = serde_json::from_str(text).map_err(|e| corrupt(&e))?;
    let time = |v: &Value, f: &str| v.get(f).and_then(Value::as_i64).map(Instant::from_millis);
    let (Some(stored_at), Some(expires_at)) = (time(&v, "stored_at"), time(&v, "expires_at")) else {
        return Err(corrupt(&"stored_at or expires_at is missing or not an integer"));
    };
    let value = v.get_mut("value").map(Value::take).ok_or_else(|| corrupt(&"value is missing"))?;
    Ok(CachedResult { value, stored_at, expires_at })
}

#[async_trait::async_trait]
impl ResultCache for RedisResultCache {
    async fn get(&self, key: &CacheKey, now: Instant) -> Result<Option<CachedResult>> {
        let k = self.entry_key(key);
        let text: Option<String> =
            redis::cmd("GET").arg(&k).query_async(&mut self.conn.clone()).await.map_err(map_redis_error)?;
        let Some(text) = text else { return Ok(None) };
        Ok(Some(decode(&k, &text)?).filter(|e| e.expires_at > now))
    }

    async fn put(&self, key: &CacheKey, value: &Value, now: Instant, ttl: DurationMs) -> Result<()> {
        let expires_at = check_cache_put(value, now, ttl)?;
        let entry = json!({"value": value, "stored_at": now.as_millis(), "expires_at": expires_at.as_millis()});
        let px = if ttl > validate::CONFIG_MS_MAX { String::new() } else { ttl.as_millis().to_string() };
        PUT.key(self.entry_key(key))
            .key(&self.expiry)
            .arg(entry.to_string())
            .arg(px)
            .arg(expires_at.as_millis())
            .arg(key.as_str())
            .invoke_async::<i64>(&mut self.conn.clone())
            .await
            .map_err(map_redis_error)?;
        Ok(())
    }

    async fn purge_expired(&self, now: Instant, limit: usize) -> Result<u64> {
        check_cache_purge_limit(limit)?;
        PURGE
            .key(&self.expiry)
            .arg(&self.entry_prefix)
            .arg(now.as_millis())
            .arg(limit)
            .invoke_async::<u64>(&mut self.conn.clone())
            .await
            .map_err(map_redis_error)
    }
}
