//! The result cache of read-only activities (K-17.7) on the `result_cache` table.

use crate::error::Op;
use crate::{SqliteDb, D};
use kernel_core::domain::{DurationMs, Instant};
use kernel_core::ports::*;
use kernel_core::Result;
use serde_json::Value;
use sql_protocol::{cache, row};

/// Name of the result-cache table (migration 3).
pub const RESULT_CACHE: &str = "result_cache";

/// [`ResultCache`] on the `result_cache` table, its statements rendered by
/// [`sql_protocol::cache`].
///
/// Row: `(key TEXT PK, value TEXT (JSON), stored_at INTEGER, expires_at INTEGER)`, times in
/// the caller's clock milliseconds; indexed on `expires_at`. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SqliteResultCache {
    db: SqliteDb,
}

impl SqliteResultCache {
    /// The cache in `db`'s file (opened and migrated by [`SqliteDb::open`]).
    pub fn new(db: SqliteDb) -> Self {
        SqliteResultCache { db }
    }
}

#[async_trait::async_trait]
impl ResultCache for SqliteResultCache {
    async fn get(&self, key: &CacheKey, now: Instant) -> Result<Option<CachedResult>> {
        let stmt = cache::get(D, RESULT_CACHE, key, now);
        self.db.row(Op::Read, "read cached result", stmt, |r| row::cached_result(r)).await
    }

    async fn put(&self, key: &CacheKey, value: &Value, now: Instant, ttl: DurationMs) -> Result<()> {
        self.db.write("put cached result", cache::put(D, RESULT_CACHE, key, value, now, ttl)?).await.map(|_| ())
    }

    async fn purge_expired(&self, now: Instant, limit: usize) -> Result<u64> {
        let stmt = cache::purge_expired(D, RESULT_CACHE, now, limit)?;
        Ok(self.db.write("purge expired cached results", stmt).await? as u64)
    }
}
