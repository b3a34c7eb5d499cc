//! The result cache of read-only activities (K-17.7) on the `result_cache` table.

use crate::error::Op;
use crate::protocol::{storable_in_postgres, table, Param, Statement};
use crate::{codec, Db, Pool, PostgresConfig};
use kernel_core::domain::{DurationMs, Instant};
use kernel_core::ports::*;
use kernel_core::Result;
use serde_json::Value;

/// Name of the result-cache table (migration 6).
pub const RESULT_CACHE: &str = "result_cache";

/// [`ResultCache`] on the `result_cache` table.
///
/// Row: `(key text PK, value jsonb, stored_at bigint, expires_at bigint)`, times in the
/// caller's clock milliseconds; indexed on `expires_at`. A put is one
/// `INSERT … ON CONFLICT (key) DO UPDATE`, a purge one `DELETE … WHERE key IN (SELECT …
/// ORDER BY expires_at LIMIT n)`; a get filters on `expires_at > now`. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PostgresResultCache {
    db: Db,
}

impl PostgresResultCache {
    /// The cache on `pool`, in the schema of `config` (run [`migrate`](crate::migrate)
    /// first). No round trip is made.
    pub fn new(pool: Pool, config: PostgresConfig) -> Result<Self> {
        Ok(PostgresResultCache { db: Db::new(pool, config)? })
    }

    fn t(&self) -> String {
        table(self.db.schema(), RESULT_CACHE)
    }
}

#[async_trait::async_trait]
impl ResultCache for PostgresResultCache {
    async fn get(&self, key: &CacheKey, now: Instant) -> Result<Option<CachedResult>> {
        let stmt = Statement {
            sql: format!(
                "SELECT value, stored_at, expires_at FROM {} WHERE key = $1::text AND expires_at > $2::bigint",
                self.t()
            ),
            params: vec![Param::Text(key.as_str().to_string()), Param::Int8(now.as_millis())],
        };
        let Some(row) = self.db.query_opt(Op::Read, "read cached result", &stmt).await? else { return Ok(None) };
        Ok(Some(CachedResult {
            value: codec::col::<Value>(&row, "value")?,
            stored_at: Instant::from_millis(codec::col::<i64>(&row, "stored_at")?),
            expires_at: Instant::from_millis(codec::col::<i64>(&row, "expires_at")?),
        }))
    }

    async fn put(&self, key: &CacheKey, value: &Value, now: Instant, ttl: DurationMs) -> Result<()> {
        let expires_at = check_cache_put(value, now, ttl)?;
        storable_in_postgres("value", value)?;
        let stmt = Statement {
            sql: format!(
                "INSERT INTO {} (key, value, stored_at, expires_at) VALUES ($1::text, $2::jsonb, $3::bigint, $4::bigint) \
                 ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, stored_at = EXCLUDED.stored_at, \
                 expires_at = EXCLUDED.expires_at",
                self.t()
            ),
            params: vec![
                Param::Text(key.as_str().to_string()),
                Param::Jsonb(value.clone()),
                Param::Int8(now.as_millis()),
                Param::Int8(expires_at.as_millis()),
            ],
        };
        self.db.query(Op::Write, "put cached result", &stmt).await?;
        Ok(())
    }

    async fn purge_expired(&self, now: Instant, limit: usize) -> Result<u64> {
        check_cache_purge_limit(limit)?;
        let t = self.t();
        let stmt = Statement {
            sql: format!(
                "DELETE FROM {t} WHERE key IN (SELECT key FROM {t} WHERE expires_at <= $1::bigint \
                 ORDER BY expires_at LIMIT $2::bigint) RETURNING key"
            ),
            params: vec![Param::Int8(now.as_millis()), Param::Int8(limit as i64)],
        };
        Ok(self.db.query(Op::Write, "purge expired cached results", &stmt).await?.len() as u64)
    }
}
