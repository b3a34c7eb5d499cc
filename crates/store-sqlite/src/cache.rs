//! The result cache of read-only activities (K-17.7) on the `result_cache` table.

use crate::error::Op;
use crate::protocol::{Param, Statement};
use crate::{codec, run, SqliteDb};
use kernel_core::domain::{DurationMs, Instant};
use kernel_core::ports::*;
use kernel_core::Result;
use serde_json::Value;

/// Name of the result-cache table (migration 3).
pub const RESULT_CACHE: &str = "result_cache";

/// [`ResultCache`] on the `result_cache` table, in the store's file.
///
/// Row: `(key TEXT PK, value TEXT (JSON), stored_at INTEGER, expires_at INTEGER)`, times in
/// the caller's clock milliseconds; indexed on `expires_at`. A put is one
/// `INSERT … ON CONFLICT (key) DO UPDATE`, a purge one `DELETE … WHERE key IN (SELECT …
/// ORDER BY expires_at LIMIT n)`; a get filters on `expires_at > now`. Cheap to clone.
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

fn entry(row: &rusqlite::Row<'_>) -> Result<CachedResult> {
    Ok(CachedResult {
        value: codec::json_col::<Value>(row, "value")?,
        stored_at: Instant::from_millis(codec::col::<i64>(row, "stored_at")?),
        expires_at: Instant::from_millis(codec::col::<i64>(row, "expires_at")?),
    })
}

#[async_trait::async_trait]
impl ResultCache for SqliteResultCache {
    async fn get(&self, key: &CacheKey, now: Instant) -> Result<Option<CachedResult>> {
        let stmt = Statement {
            sql: format!("SELECT value, stored_at, expires_at FROM {RESULT_CACHE} WHERE key = ?1 AND expires_at > ?2"),
            params: vec![Param::Text(key.as_str().to_string()), Param::Int8(now.as_millis())],
        };
        let what = "read cached result";
        self.db
            .call(Op::Read, what, move |c| run(c, Op::Read, what, &stmt, entry)?.into_iter().next().transpose())
            .await
    }

    async fn put(&self, key: &CacheKey, value: &Value, now: Instant, ttl: DurationMs) -> Result<()> {
        let expires_at = check_cache_put(value, now, ttl)?;
        let stmt = Statement {
            sql: format!(
                "INSERT INTO {RESULT_CACHE} (key, value, stored_at, expires_at) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value, stored_at = excluded.stored_at, \
                 expires_at = excluded.expires_at"
            ),
            params: vec![
                Param::Text(key.as_str().to_string()),
                Param::Jsonb(value.clone()),
                Param::Int8(now.as_millis()),
                Param::Int8(expires_at.as_millis()),
            ],
        };
        let what = "put cached result";
        self.db.call(Op::Write, what, move |c| run(c, Op::Write, what, &stmt, |_| ()).map(|_| ())).await
    }

    async fn purge_expired(&self, now: Instant, limit: usize) -> Result<u64> {
        check_cache_purge_limit(limit)?;
        let stmt = Statement {
            sql: format!(
                "DELETE FROM {RESULT_CACHE} WHERE key IN (SELECT key FROM {RESULT_CACHE} WHERE expires_at <= ?1 \
                 ORDER BY expires_at LIMIT ?2) RETURNING key"
            ),
            params: vec![Param::Int8(now.as_millis()), Param::Int8(limit as i64)],
        };
        let what = "purge expired cached results";
        self.db.call(Op::Write, what, move |c| Ok(run(c, Op::Write, what, &stmt, |_| ())?.len() as u64)).await
    }
}
