//! # redis-conn
//!
//! The Redis connection every Redis adapter of the durable workflow kernel runs on
//! (`queue-redis`'s lanes, wakeup, dispatch candidates and result cache, `permit-redis`'s
//! permits, `sse-stream`'s progress streams), in one place:
//!
//! - [`connect`] (and [`connect_client`], [`connect_cluster`]): a reconnecting, multiplexed
//!   connection with bounded timeouts ([`CONNECT_TIMEOUT_MS`], [`RESPONSE_TIMEOUT_MS`]), so
//!   a dead Redis makes calls fail quickly instead of hanging the engine.
//! - [`Topology`]: what a URL names, one server or the seed nodes of a Redis Cluster
//!   (`redis+cluster://h1:7000,h2:7001`, or `redis://` listing several hosts).
//! - [`RedisConn`]: one connection type for either; on a cluster every command is routed by
//!   its first key, and [`RedisConn::masters`] / [`RedisConn::on_node`] reach each node for
//!   per-node commands such as `SCAN`.
//! - [`hash_slot`]: the cluster's slot of a key, so the adapters can check that every key a
//!   script touches shares one hash tag (a cluster refuses `CROSSSLOT` scripts).
//! - [`map_redis_error`]: the one mapping of a Redis failure into the kernel's error.
//! - [`check_prefix`]: the key-prefix rule every adapter checks (no braces: the key layouts
//!   set their own hash tags).
//!
//! Callers need no `redis` dependency for the types the adapters' constructors take
//! ([`ConnectionManager`], [`Client`] are re-exported here).
//!
//! With the `testing` feature (enabled only by dev-dependencies), `test_support` decides
//! "connect, start, skip or fail" for every Redis-backed test of the workspace.
//!
//! ```no_run
//! # async fn demo() -> kernel_core::Result<()> {
//! let conn = redis_conn::connect("redis://127.0.0.1:6379").await?;
//! assert!(!conn.is_cluster());
//! let cluster = redis_conn::connect("redis+cluster://127.0.0.1:7000,127.0.0.1:7001").await?;
//! assert!(cluster.is_cluster());
//! # Ok(())
//! # }
//! ```

mod conn;
#[cfg(feature = "testing")]
pub mod test_support;

pub use conn::{connect_cluster, hash_slot, RedisConn, Topology, CLUSTER_SEEDS_MAX, CLUSTER_SLOTS};
/// The connection types the adapters' constructors take, so callers need no `redis`
/// dependency.
pub use redis::{aio::ConnectionManager, Client};

use kernel_core::{validate, Error, Result};
use redis::aio::ConnectionManagerConfig;
use std::time::Duration;

/// How long one Redis call may take before it counts as failed.
pub const RESPONSE_TIMEOUT_MS: u64 = 2_000;
/// How long one connection attempt may take.
pub const CONNECT_TIMEOUT_MS: u64 = 2_000;

/// Map a Redis failure into the kernel's error: the one mapping of every Redis-backed adapter
/// (queue, wakeup, candidates, permits, stream sink). Every Redis failure is
/// [`Error::Unavailable`] with the driver's error as its cause (`source()`): the data in Redis
/// only accelerates, so a caller either falls back to the store (queue), fails closed
/// (permits) or drops a best-effort frame (streams); none needs to know whether a lost reply
/// had taken effect.
pub fn map_redis_error(e: redis::RedisError) -> Error {
    Error::unavailable_with(format!("redis: {e}"), e)
}

/// Open a reconnecting, multiplexed connection with bounded timeouts, so that a dead Redis
/// makes calls fail quickly instead of hanging the engine (a queue call falls back to the
/// store, a permit fails closed): to one server, or to a cluster when the URL says so (see
/// [`Topology`]). The one connection helper of every Redis-backed adapter: a malformed URL
/// is [`Error::InvalidInput`] (field `redis url`), an unreachable server
/// [`Error::Unavailable`], both with the driver's error as their cause.
pub async fn connect(url: &str) -> Result<RedisConn> {
    match Topology::parse(url)? {
        Topology::Single(url) => {
            let client = redis::Client::open(url).map_err(|e| Error::invalid_with("redis url", e.to_string(), e))?;
            Ok(RedisConn::Single(connect_client(client).await?))
        }
        Topology::Cluster(nodes) => Ok(RedisConn::Cluster(connect_cluster(&nodes).await?)),
    }
}

/// [`connect`] for an already opened client.
pub async fn connect_client(client: redis::Client) -> Result<ConnectionManager> {
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_millis(RESPONSE_TIMEOUT_MS)))
        .set_connection_timeout(Some(Duration::from_millis(CONNECT_TIMEOUT_MS)))
        .set_number_of_retries(2);
    ConnectionManager::new_with_config(client, config).await.map_err(map_redis_error)
}

/// Check a key prefix: the identifier rule of K-2.0, and no `{` or `}`: the adapters' key
/// layouts put their own hash tags after the prefix, and a brace in the prefix would make
/// it the tag of every key, all in one slot of a cluster.
pub fn check_prefix(prefix: &str) -> Result<()> {
    validate::identifier("prefix", prefix)?;
    if prefix.contains(['{', '}']) {
        return Err(Error::invalid("prefix", "must not contain `{` or `}` (the key layouts set their own hash tags)"));
    }
    Ok(())
}
