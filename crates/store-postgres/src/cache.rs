//! The result cache of read-only activities (K-17.7) on the `result_cache` table.

use crate::error::Op;
use crate::{Db, Pool, PostgresConfig, PG};
use kernel_core::domain::{DurationMs, Instant};
use kernel_core::ports::*;
use kernel_core::Result;
use serde_json::Value;
use sql_protocol::{cache, row};

/// Name of the result-cache table (migration 6).
pub const RESULT_CACHE: &str = "result_cache";

/// [`ResultCache`] on the `result_cache` table, its statements rendered by
/// [`sql_protocol::cache`].
///
/// Row: `(key text PK, value jsonb, stored_at bigint, expires_at bigint)`, times in the
/// caller's clock milliseconds; indexed on `expires_at`. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PostgresResultCache {
    db: Db,
    t: String,
}

impl PostgresResultCache {
    /// The cache on `pool`, in the schema of `config` (run [`migrate`](crate::migrate)
    /// first). No round trip is made.
    pub fn new(pool: Pool, config: PostgresConfig) -> Result<Self> {
        let db = Db::new(pool, config)?;
        Ok(PostgresResultCache { t: format!("{}{RESULT_CACHE}", db.prefix()), db })
    }
}

#[async_trait::async_trait]
impl ResultCache for PostgresResultCache {
    async fn get(&self, key: &CacheKey, now: Instant) -> Result<Option<CachedResult>> {
        let stmt = cache::get(PG, &self.t, key, now);
        self.db.row(Op::Read, "read cached result", stmt, |r| row::cached_result(r)).await
    }

    async fn put(&self, key: &CacheKey, value: &Value, now: Instant, ttl: DurationMs) -> Result<()> {
        self.db
            .rows(Op::Write, "put cached result", cache::put(PG, &self.t, key, value, now, ttl)?, |_| Ok(()))
            .await
            .map(|_| ())
    }

    async fn purge_expired(&self, now: Instant, limit: usize) -> Result<u64> {
        let stmt = cache::purge_expired(PG, &self.t, now, limit)?;
        Ok(self.db.rows(Op::Write, "purge expired cached results", stmt, |_| Ok(())).await?.len() as u64)
    }
}
