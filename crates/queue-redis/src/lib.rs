//! # queue-redis
//!
//! Redis adapters for the acceleration layer of the durable workflow kernel (SPEC K-13,
//! K-11.3). Everything here may be lost at any moment: losing it costs latency, never
//! correctness, because the store's conditional claim is what grants execution (K-1.1).
//!
//! - [`RedisReadyQueue`]: four lane ZSETs P0..P3 with a promote-only enqueue and a weighted
//!   round-robin pop (blocks 8:6:4:2, skip-if-empty, burst window), each one Lua script.
//!   Rotation and burst state live in Redis, so every worker shares them.
//! - [`RedisWakeup`]: the pub/sub doorbell; a subscriber task feeds an mpsc channel and
//!   resubscribes after a connection loss.
//! - [`RedisDispatchCandidates`]: the recovery dispatcher's candidate ZSET (pop = remove).
//!
//! Every key lives under a configurable prefix and is passed to scripts in `KEYS`; values
//! travel in `ARGV`; scripts are static and loaded once. On Redis Cluster use a hash-tagged
//! prefix such as `{wfk}` so that all keys of one script share a slot.
//!
//! ```no_run
//! use kernel_core::ports::ReadyQueue;
//! use kernel_core::Priority;
//! use queue_redis::{connect, LaneWeights, RedisReadyQueue};
//!
//! # async fn demo() -> kernel_core::Result<()> {
//! let conn = connect("redis://127.0.0.1:6379").await?;
//! let queue = RedisReadyQueue::new(conn, "wfk", LaneWeights::default())?;
//! queue.enqueue("wf-1", Priority::P1, 1_000).await?;
//! assert_eq!(queue.pop_due(999).await?, None); // not due yet
//! assert_eq!(queue.pop_due(1_000).await?.as_deref(), Some("wf-1"));
//! # Ok(())
//! # }
//! ```

mod dispatch;
mod lanes;
pub mod test_support;
mod wakeup;

pub use dispatch::{RedisDispatchCandidates, DISPATCH_BATCH_MAX};
pub use lanes::{LaneWeights, RedisReadyQueue, BURST_MAX, LANE_WEIGHT_MAX};
pub use wakeup::RedisWakeup;

use kernel_core::{validate, Error, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::time::Duration;

/// How long one Redis call may take before it counts as failed.
pub const RESPONSE_TIMEOUT_MS: u64 = 2_000;
/// How long one connection attempt may take.
pub const CONNECT_TIMEOUT_MS: u64 = 2_000;

/// Map a Redis failure into the kernel's error. Every Redis failure is
/// [`Error::Unavailable`]: the data here only accelerates, so a caller either falls back to
/// the store (queue) or fails closed (permits); neither needs to know whether a lost reply
/// had taken effect.
pub fn map_redis_error(e: redis::RedisError) -> Error {
    Error::Unavailable(format!("redis: {e}"))
}

/// Open a reconnecting, multiplexed connection with bounded timeouts, so that a dead Redis
/// makes calls fail quickly instead of hanging the engine.
pub async fn connect(url: &str) -> Result<ConnectionManager> {
    let client = redis::Client::open(url).map_err(map_redis_error)?;
    connect_client(client).await
}

/// [`connect`] for an already opened client.
pub async fn connect_client(client: redis::Client) -> Result<ConnectionManager> {
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_millis(RESPONSE_TIMEOUT_MS)))
        .set_connection_timeout(Some(Duration::from_millis(CONNECT_TIMEOUT_MS)))
        .set_number_of_retries(2);
    ConnectionManager::new_with_config(client, config).await.map_err(map_redis_error)
}

/// Check a key prefix: the identifier rule of K-2.0.
pub(crate) fn check_prefix(prefix: &str) -> Result<()> {
    validate::identifier("prefix", prefix)
}
