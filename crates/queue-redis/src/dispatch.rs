use crate::RedisConn;
use kernel_core::domain::Instant;
use kernel_core::ObjectId;
use kernel_core::{validate, Error, Result};
use redis::Script;
use redis_conn::{check_prefix, map_redis_error};
use std::sync::LazyLock;

static POP: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/dispatch_pop.lua")));

#[cfg(test)]
pub(crate) fn pop_script_hash() -> &'static str {
    POP.get_hash()
}

/// Largest batch one [`RedisDispatchCandidates::pop_due`] may take.
pub const DISPATCH_BATCH_MAX: usize = 1_000;

/// The recovery dispatcher's candidate ZSET `<prefix>:dispatch` (K-11.3): member = business
/// object id, score = earliest attempt time (ms). It holds identity only, never tokens; a
/// popped candidate is removed, and the dispatcher re-adds it when an attempt fails. The
/// store scan under the dispatcher's mutex remains the fallback when Redis is down.
#[derive(Clone)]
pub struct RedisDispatchCandidates {
    conn: RedisConn,
    key: String,
}

impl std::fmt::Debug for RedisDispatchCandidates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisDispatchCandidates").field("key", &self.key).finish()
    }
}

impl RedisDispatchCandidates {
    /// Candidates under `prefix`.
    pub fn new(conn: impl Into<RedisConn>, prefix: &str) -> Result<Self> {
        check_prefix(prefix)?;
        Ok(RedisDispatchCandidates { conn: conn.into(), key: format!("{prefix}:dispatch") })
    }

    /// Candidates under `prefix` on a new connection to `url`; see
    /// [`RedisConnection::open`](crate::RedisConnection::open) for the errors.
    pub async fn from_url(url: &str, prefix: &str) -> Result<Self> {
        crate::RedisConnection::open(url).await?.dispatch_candidates(prefix)
    }

    /// Key of the ZSET.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Add (or move) a candidate due at `due_ms`.
    ///
    /// # Contract
    /// Idempotent; re-adding overwrites the due time (the dispatcher re-adds with its next
    /// attempt time).
    pub async fn add(&self, id: &ObjectId, due_ms: Instant) -> Result<()> {
        validate::identifier("id", id.as_str())?;
        redis::cmd("ZADD")
            .arg(&self.key)
            .arg(due_ms.as_millis())
            .arg(id.as_str())
            .query_async::<i64>(&mut self.conn.clone())
            .await
            .map_err(map_redis_error)?;
        Ok(())
    }

    /// Remove and return up to `batch_max` candidates due at `now`, earliest first.
    ///
    /// # Contract
    /// Atomic: concurrent callers never receive the same candidate. `batch_max` must be in
    /// `1..=DISPATCH_BATCH_MAX`.
    pub async fn pop_due(&self, now: Instant, batch_max: usize) -> Result<Vec<ObjectId>> {
        if !(1..=DISPATCH_BATCH_MAX).contains(&batch_max) {
            return Err(Error::invalid("batch_max", format_args!("{batch_max} is not in 1..={DISPATCH_BATCH_MAX}")));
        }
        let mut inv = POP.prepare_invoke();
        inv.key(&self.key).arg(now.as_millis()).arg(batch_max);
        let out: Vec<String> = inv.invoke_async(&mut self.conn.clone()).await.map_err(map_redis_error)?;
        debug_assert!(out.len() <= batch_max);
        Ok(out.into_iter().map(ObjectId::from).collect())
    }

    /// Number of candidates (due or not).
    pub async fn len(&self) -> Result<u64> {
        redis::cmd("ZCARD").arg(&self.key).query_async(&mut self.conn.clone()).await.map_err(map_redis_error)
    }

    /// Whether no candidate is stored.
    pub async fn is_empty(&self) -> Result<bool> {
        Ok(self.len().await? == 0)
    }
}

#[async_trait::async_trait]
impl kernel_core::ports::DispatchCandidates for RedisDispatchCandidates {
    async fn add(&self, object_id: &ObjectId, due: Instant) -> Result<()> {
        RedisDispatchCandidates::add(self, object_id, due).await
    }

    async fn pop_due(&self, now: Instant, max: usize) -> Result<Vec<ObjectId>> {
        if max == 0 {
            return Ok(vec![]);
        }
        RedisDispatchCandidates::pop_due(self, now, max.min(DISPATCH_BATCH_MAX)).await
    }
}
