use crate::RedisConn;
use kernel_core::domain::{DurationMs, Instant, Priority};
use kernel_core::ports::{check_enqueue_many, check_pop_max, LaneEntry, LaneStats, ReadyQueue};
use kernel_core::{validate, Error, Result, WorkflowId};
use redis::Script;
use redis_conn::{check_prefix, map_redis_error};
use std::sync::LazyLock;

static ENQUEUE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/enqueue.lua")));
static ENQUEUE_MANY: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/enqueue_many.lua")));
static POP: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/pop.lua")));
static STATS: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/stats.lua")));

pub use kernel_core::ports::{LaneWeights, BURST_MAX, LANE_WEIGHT_MAX};

/// The ready lanes on Redis (K-13): ZSETs `<prefix>:{<prefix>:lane}:p0` … `p3` (member
/// `workflow_id`, score `claimable_time` in ms) and the shared rotation hash
/// `<prefix>:{<prefix>:lane}:rotation` (`current`, `served`, `burst_left`, and the per-lane
/// pop counters `pops0` … `pops3` that the pop script bumps and [`ReadyQueue::stats`]
/// reports as [`LaneStats::pops`]). The five keys share the hash tag `{<prefix>:lane}`, so
/// on a Redis Cluster they live in one slot and every script stays one atomic call.
///
/// Semantics are exactly those of `kernel_memory::InMemoryQueue`; both run the same
/// conformance suite. Cheap to clone; clones share the connection.
///
/// Every [`ReadyQueue`] call is **one round trip**: one `EVALSHA` of a static script
/// (`enqueue`, `enqueue_many` for a whole batch, `pop_due` for a whole batch of up to
/// `max` pops, `stats`), so counting calls counts round trips. The redis crate loads a
/// script it finds missing (`NOSCRIPT`) with one extra call;
/// [`load_scripts`](Self::load_scripts) at startup avoids that.
#[derive(Clone)]
pub struct RedisReadyQueue {
    conn: RedisConn,
    lanes: [String; 4],
    rotation: String,
    weights: LaneWeights,
}

impl std::fmt::Debug for RedisReadyQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisReadyQueue").field("lanes", &self.lanes).field("weights", &self.weights).finish()
    }
}

/// The four lane keys of `prefix`, tagged `{<prefix>:lane}`.
fn lane_keys(prefix: &str) -> [String; 4] {
    [0, 1, 2, 3].map(|i| format!("{prefix}:{{{prefix}:lane}}:p{i}"))
}

/// The rotation hash key of `prefix`, in the slot of its lanes.
fn rotation_key(prefix: &str) -> String {
    format!("{prefix}:{{{prefix}:lane}}:rotation")
}

impl RedisReadyQueue {
    /// Lanes under `prefix` with the given weights.
    pub fn new(conn: impl Into<RedisConn>, prefix: &str, weights: LaneWeights) -> Result<Self> {
        check_prefix(prefix)?;
        weights.validate()?;
        Ok(RedisReadyQueue { conn: conn.into(), lanes: lane_keys(prefix), rotation: rotation_key(prefix), weights })
    }

    /// Lanes under `prefix` with the default weights (8:6:4:2) on a new connection to
    /// `url`; see [`RedisConnection::open`](crate::RedisConnection::open) for the errors.
    pub async fn from_url(url: &str, prefix: &str) -> Result<Self> {
        crate::RedisConnection::open(url).await?.ready_queue(prefix, LaneWeights::default())
    }

    /// Key of a lane's ZSET.
    pub fn lane_key(&self, p: Priority) -> &str {
        &self.lanes[p.index()]
    }

    /// Key of the shared rotation hash (`current`, `served`, `burst_left`, `pops0` …
    /// `pops3`).
    pub fn rotation_key(&self) -> &str {
        &self.rotation
    }

    /// Weights in use.
    pub fn weights(&self) -> LaneWeights {
        self.weights
    }

    /// Load the scripts now (startup), so the first calls need no round trip for it.
    pub async fn load_scripts(&self) -> Result<()> {
        let mut conn = self.conn.clone();
        for s in [&*ENQUEUE, &*ENQUEUE_MANY, &*POP, &*STATS] {
            s.prepare_invoke().load_async(&mut conn).await.map_err(map_redis_error)?;
        }
        Ok(())
    }

    /// Lane of a member, if queued (a diagnostic: one atomic read of the four lanes).
    pub async fn lane_of(&self, member: &str) -> Result<Option<Priority>> {
        let mut pipe = redis::pipe();
        pipe.atomic();
        for k in &self.lanes {
            pipe.zscore(k, member);
        }
        let scores: Vec<Option<f64>> = pipe.query_async(&mut self.conn.clone()).await.map_err(map_redis_error)?;
        Ok(scores.iter().position(Option::is_some).map(|i| Priority::ALL[i]))
    }

    /// Score of a member in its lane, if queued.
    pub async fn score_of(&self, member: &str) -> Result<Option<Instant>> {
        let Some(p) = self.lane_of(member).await? else { return Ok(None) };
        let s: Option<f64> = redis::cmd("ZSCORE")
            .arg(self.lane_key(p))
            .arg(member)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(map_redis_error)?;
        Ok(s.map(|s| Instant::from_millis(s as i64)))
    }

    /// Delete the lanes and the rotation state (the pop counters with it).
    pub async fn clear(&self) -> Result<()> {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(&self.lanes).arg(&self.rotation);
        cmd.query_async::<()>(&mut self.conn.clone()).await.map_err(map_redis_error)
    }

    /// The exact `EVALSHA` that [`ReadyQueue::pop_due`] sends for a batch of up to `max`,
    /// for benchmarks that measure the adapter's own overhead (its reply is an array of
    /// members). The script must be loaded ([`Self::load_scripts`]); `max` is not checked
    /// here.
    pub fn raw_pop_command(&self, now: Instant, max: usize) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(POP.get_hash()).arg(5).arg(&self.lanes).arg(&self.rotation);
        cmd.arg(now.as_millis()).arg(&self.weights.weights).arg(self.weights.burst).arg(max);
        cmd
    }
}

#[async_trait::async_trait]
impl ReadyQueue for RedisReadyQueue {
    async fn enqueue(&self, workflow_id: &WorkflowId, priority: Priority, claimable_at: Instant) -> Result<()> {
        validate::identifier("workflow_id", workflow_id.as_str())?;
        let mut inv = ENQUEUE.prepare_invoke();
        inv.key(&self.lanes).arg(workflow_id.as_str()).arg(priority.index()).arg(claimable_at.as_millis());
        inv.invoke_async::<i64>(&mut self.conn.clone()).await.map_err(map_redis_error)?;
        Ok(())
    }

    async fn enqueue_many(&self, entries: &[LaneEntry]) -> Result<()> {
        check_enqueue_many(entries)?;
        if entries.is_empty() {
            return Ok(());
        }
        let mut inv = ENQUEUE_MANY.prepare_invoke();
        inv.key(&self.lanes);
        for LaneEntry { workflow_id, priority, claimable_at } in entries {
            inv.arg(workflow_id.as_str()).arg(priority.index()).arg(claimable_at.as_millis());
        }
        inv.invoke_async::<i64>(&mut self.conn.clone()).await.map_err(map_redis_error)?;
        Ok(())
    }

    async fn pop_due(&self, now: Instant, max: usize) -> Result<Vec<WorkflowId>> {
        check_pop_max(max)?;
        let mut inv = POP.prepare_invoke();
        inv.key(&self.lanes)
            .key(&self.rotation)
            .arg(now.as_millis())
            .arg(&self.weights.weights)
            .arg(self.weights.burst)
            .arg(max);
        let ids = inv.invoke_async::<Vec<String>>(&mut self.conn.clone()).await.map_err(map_redis_error)?;
        let mut ids = ids;
        if ids.len() > max {
            // Only a wrong script gets here; the members are already out of the lanes, so
            // keep what was asked for and leave the rest to the rebuild scan (K-13).
            tracing::error!(returned = ids.len(), max, "lane pop returned more members than asked for");
            ids.truncate(max);
        }
        Ok(ids.into_iter().map(WorkflowId::from).collect())
    }

    async fn stats(&self, now: Instant) -> Result<[LaneStats; 4]> {
        let mut inv = STATS.prepare_invoke();
        inv.key(&self.lanes).key(&self.rotation).arg(now.as_millis());
        let raw: Vec<redis::Value> = inv.invoke_async(&mut self.conn.clone()).await.map_err(map_redis_error)?;
        if raw.len() != 16 {
            return Err(Error::unavailable(format!("redis: lane stats returned {} values, expected 16", raw.len())));
        }
        let mut out = [LaneStats::default(); 4];
        for (i, chunk) in raw.chunks(4).enumerate() {
            let depth: u64 = redis::from_redis_value_ref(&chunk[0]).map_err(map_parse)?;
            let ready: u64 = redis::from_redis_value_ref(&chunk[1]).map_err(map_parse)?;
            let oldest: String = redis::from_redis_value_ref(&chunk[2]).map_err(map_parse)?;
            let pops: u64 = redis::from_redis_value_ref(&chunk[3]).map_err(map_parse)?;
            let oldest_wait_ms = if oldest.is_empty() {
                DurationMs::ZERO
            } else {
                let s: f64 = oldest
                    .parse()
                    .map_err(|e| Error::unavailable_with(format!("redis: bad score {oldest:?}: {e}"), e))?;
                now - Instant::from_millis(s as i64)
            };
            out[i] = LaneStats { depth, ready, delayed: depth.saturating_sub(ready), oldest_wait_ms, pops };
        }
        Ok(out)
    }
}

fn map_parse(e: redis::ParsingError) -> Error {
    Error::unavailable_with(format!("redis: unexpected reply: {e}"), e)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Workers of different versions share the lanes and the rotation hash during a rolling
    /// deploy, so a script change is a protocol change: these pins make it deliberate.
    #[test]
    fn script_fingerprints_are_pinned() {
        assert_eq!(ENQUEUE.get_hash(), "55ab236ae81d376acd05a84f0048c59aee5c92ea");
        assert_eq!(ENQUEUE_MANY.get_hash(), "021c4f2181384e54f513c71524942e847459d6bc");
        assert_eq!(POP.get_hash(), "4c37c4e9a7a9932f0a84a801bbb5a9e6cebfa507");
        assert_eq!(STATS.get_hash(), "b7a698f0d165eb1a6765e75d9b0e2ce40021d3d0");
        assert_eq!(crate::dispatch::pop_script_hash(), "e4805134d70d05ac8838c09a69c8e33c4d448990");
    }

    /// On a cluster a script's keys must share one slot: the lanes and the rotation of one
    /// prefix do, and different prefixes spread (K-13).
    #[test]
    fn one_lane_set_is_one_slot_and_prefixes_spread() {
        let slots = |prefix: &str| {
            let mut keys = lane_keys(prefix).to_vec();
            keys.push(rotation_key(prefix));
            keys.iter().map(|k| redis_conn::hash_slot(k)).collect::<std::collections::BTreeSet<u16>>()
        };
        assert_eq!(slots("orders").len(), 1);
        let spread: std::collections::BTreeSet<u16> =
            (0..64).map(|i| *slots(&format!("tenant-{i}")).first().unwrap()).collect();
        assert!(spread.len() > 32, "64 namespaces on {} slots", spread.len());
    }

    #[test]
    fn weights_are_bounded() {
        assert!(LaneWeights::default().validate().is_ok());
        assert!(LaneWeights { weights: [8, 6, 4, 0], burst: 8 }.validate().is_err());
        assert!(LaneWeights { weights: [LANE_WEIGHT_MAX + 1, 6, 4, 2], burst: 8 }.validate().is_err());
        assert!(LaneWeights { weights: [8, 6, 4, 2], burst: 0 }.validate().is_ok());
        assert!(LaneWeights { weights: [8, 6, 4, 2], burst: BURST_MAX + 1 }.validate().is_err());
    }
}
