//! # queue-redis
//!
//! Redis adapters for the acceleration layer of the durable workflow kernel (SPEC K-13,
//! K-11.3). Everything here may be lost at any moment: losing it costs latency, never
//! correctness, because the store's conditional claim is what grants execution (K-1.1).
//!
//! - [`RedisReadyQueue`]: four lane ZSETs P0..P3 with a promote-only enqueue (single or a
//!   batch) and a weighted round-robin pop of up to `max` members (blocks 8:6:4:2,
//!   skip-if-empty, burst window), each call one Lua script, so one round trip.
//!   Rotation and burst state live in Redis, so every worker shares them.
//! - [`RedisWakeup`]: the pub/sub doorbell; a subscriber task feeds an mpsc channel and
//!   resubscribes after a connection loss.
//! - [`RedisDispatchCandidates`]: the recovery dispatcher's candidate ZSET (pop = remove).
//! - [`RedisResultCache`]: the result cache of read-only activities
//!   ([`ResultCache`](kernel_core::ports::ResultCache)), one `SET … PX` per entry plus an
//!   expiry ZSET for bounded purges.
//!
//! Every key lives under a configurable prefix and is passed to scripts in `KEYS`; values
//! travel in `ARGV`; scripts are static and loaded once.
//!
//! Each adapter is constructible from a URL ([`RedisReadyQueue::from_url`],
//! [`RedisWakeup::from_url`], [`RedisDispatchCandidates::from_url`]); several adapters on one
//! connection come from a [`RedisConnection`]. Neither needs the `redis` crate in the
//! caller's manifest (the connection types of `redis-conn`, which opens every Redis
//! connection of the workspace, are re-exported here).
//!
//! # Redis Cluster
//!
//! Every adapter runs on one server or on a Redis Cluster: a URL that lists several nodes
//! (`redis://h1:7000,h2:7001`) or says `redis+cluster://` opens a cluster connection
//! ([`Topology`], [`RedisConn`]). A cluster refuses a script whose keys lie in different
//! hash slots (`CROSSSLOT`), so the keys one script touches carry one hash tag (the part
//! in `{…}`), chosen so that the load spreads over the nodes:
//!
//! | keys | hash tag | why together |
//! |---|---|---|
//! | lanes `<p>:{<p>:lane}:p0` … `p3`, rotation `<p>:{<p>:lane}:rotation` | one per lane set | the weighted pop reads all four lanes and the rotation atomically |
//! | result cache `<p>:{<p>:cache}:e:<key>`, expiry `<p>:{<p>:cache}:expiry` | one per cache | a put writes the entry and its expiry atomically; a purge deletes both |
//! | dispatch candidates `<p>:dispatch` | (one key) | |
//! | permits `<p>:permit:{<p>:<resource>}:limits` / `holders` / `starts` / `indexed` | one per resource (`permit-redis`) | an acquire checks and takes all of them atomically |
//! | permit index `<p>:permits` | (one key) | written apart from the acquire |
//! | progress streams (`sse-stream`) | one per stream | |
//! | wakeup channel `<p>:wakeup` | (pub/sub) | a cluster forwards `PUBLISH` to every node |
//!
//! One lane set serves one queue namespace (one prefix); a deployment that needs more pop
//! throughput than one node gives runs several namespaces, which land on different slots.
//! A prefix must not contain `{` or `}`, so that these tags are the ones that count.
//!
//! ```no_run
//! use kernel_core::ports::ReadyQueue;
//! use kernel_core::{Instant, Priority};
//! use queue_redis::RedisReadyQueue;
//!
//! # async fn demo() -> kernel_core::Result<()> {
//! let queue = RedisReadyQueue::from_url("redis://127.0.0.1:6379", "wfk").await?;
//! queue.enqueue(&"wf-1".into(), Priority::P1, Instant::from_millis(1_000)).await?;
//! assert!(queue.pop_due(Instant::from_millis(999), 8).await?.is_empty()); // not due yet
//! assert_eq!(queue.pop_due(Instant::from_millis(1_000), 8).await?, ["wf-1"]);
//! # Ok(())
//! # }
//! ```

mod cache;
mod dispatch;
mod lanes;
mod wakeup;

/// Test support of every Redis-backed test (`redis_conn::test_support`), here for the tests
/// and harnesses that use the queue adapters with it.
#[cfg(feature = "testing")]
pub use redis_conn::test_support;

pub use cache::RedisResultCache;
pub use dispatch::{RedisDispatchCandidates, DISPATCH_BATCH_MAX};
pub use lanes::{LaneWeights, RedisReadyQueue, BURST_MAX, LANE_WEIGHT_MAX};
/// The connection types and helpers the constructors take (from `redis-conn`), so callers
/// need no further dependency.
pub use redis_conn::{connect, connect_client, Client, ConnectionManager, RedisConn};
pub use wakeup::RedisWakeup;

use kernel_core::{Error, Result};
use redis_conn::{check_prefix, connect_cluster, map_redis_error, Topology};

/// One Redis deployment, a server or a cluster: the clients that open the wakeup's
/// dedicated pub/sub connections (one per seed node of a cluster) and one shared
/// reconnecting connection with bounded timeouts (see [`connect`]). Cheap to clone; the
/// adapters built from it share the connection.
#[derive(Clone)]
pub struct RedisConnection {
    clients: Vec<Client>,
    conn: RedisConn,
}

impl std::fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConnection").finish_non_exhaustive()
    }
}

impl RedisConnection {
    /// Connect to `url`: `redis://[user:password@]host[:port][/db]` (or `rediss://` where
    /// the driver was built with TLS) for one server, `redis+cluster://host:port[,…]` or
    /// `redis://host:port,host:port[,…]` for a cluster ([`Topology`]). A malformed URL is
    /// [`Error::InvalidInput`]; an unreachable server is [`Error::Unavailable`].
    pub async fn open(url: &str) -> Result<Self> {
        let open = |u: &str| Client::open(u).map_err(|e| Error::invalid_with("redis url", e.to_string(), e));
        match Topology::parse(url)? {
            Topology::Single(url) => {
                let client = open(&url)?;
                let conn = connect_client(client.clone()).await?;
                Ok(RedisConnection { clients: vec![client], conn: RedisConn::Single(conn) })
            }
            Topology::Cluster(nodes) => {
                let clients = nodes.iter().map(|n| open(n)).collect::<Result<Vec<_>>>()?;
                let conn = connect_cluster(&nodes).await?;
                Ok(RedisConnection { clients, conn: RedisConn::Cluster(conn) })
            }
        }
    }

    /// A client of the server, or of the first seed node of the cluster (opens further
    /// connections).
    pub fn client(&self) -> &Client {
        &self.clients[0]
    }

    /// The shared connection.
    pub fn connection(&self) -> &RedisConn {
        &self.conn
    }

    /// Whether this is a cluster.
    pub fn is_cluster(&self) -> bool {
        self.conn.is_cluster()
    }

    /// Ready lanes under `prefix` with the given weights, on this connection.
    pub fn ready_queue(&self, prefix: &str, weights: LaneWeights) -> Result<RedisReadyQueue> {
        RedisReadyQueue::new(self.conn.clone(), prefix, weights)
    }

    /// The wakeup doorbell under `prefix`, publishing on this connection.
    pub fn wakeup(&self, prefix: &str) -> Result<RedisWakeup> {
        RedisWakeup::with_clients(self.clients.clone(), self.conn.clone(), prefix)
    }

    /// The result cache under `prefix`, on this connection.
    pub fn result_cache(&self, prefix: &str) -> Result<RedisResultCache> {
        RedisResultCache::new(self.conn.clone(), prefix)
    }

    /// The dispatch candidates under `prefix`, on this connection.
    pub fn dispatch_candidates(&self, prefix: &str) -> Result<RedisDispatchCandidates> {
        RedisDispatchCandidates::new(self.conn.clone(), prefix)
    }

    /// Delete every key under `prefix` (`<prefix>:*`, found with `SCAN`, deleted in pages
    /// of [`PURGE_PAGE`]) and return how many were deleted: the end of a throw-away
    /// namespace, or the loss of the acceleration data a demo simulates. Never `FLUSHALL`:
    /// other namespaces on the same server are untouched.
    ///
    /// # Contract
    /// Not atomic: keys written under the prefix while it runs may survive. Idempotent.
    pub async fn purge_prefix(&self, prefix: &str) -> Result<u64> {
        check_prefix(prefix)?;
        let pattern = format!("{prefix}:*");
        let nodes = match &self.conn {
            RedisConn::Single(_) => vec![(String::new(), 0)],
            RedisConn::Cluster(_) => self.conn.masters().await?,
        };
        let mut deleted = 0u64;
        for (host, port) in nodes {
            let mut cursor: u64 = 0;
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor).arg("MATCH").arg(&pattern).arg("COUNT").arg(PURGE_PAGE);
                let (next, keys): (u64, Vec<String>) = self.conn.on_node(&host, port, &scan).await?;
                deleted += self.delete(&keys).await?;
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(deleted)
    }

    /// `DEL` of `keys`: one command on a server; on a cluster one per key (keys of different
    /// slots cannot share a command), sent together.
    async fn delete(&self, keys: &[String]) -> Result<u64> {
        if keys.is_empty() {
            return Ok(0);
        }
        if !self.conn.is_cluster() {
            return redis::cmd("DEL").arg(keys).query_async(&mut self.conn.clone()).await.map_err(map_redis_error);
        }
        let dels = keys.iter().map(|k| {
            let mut conn = self.conn.clone();
            async move { redis::cmd("DEL").arg(k).query_async::<u64>(&mut conn).await.map_err(map_redis_error) }
        });
        Ok(futures::future::try_join_all(dels).await?.into_iter().sum())
    }
}

/// Keys one `SCAN` page of [`RedisConnection::purge_prefix`] asks for (and one `DEL` takes).
pub const PURGE_PAGE: usize = 500;
