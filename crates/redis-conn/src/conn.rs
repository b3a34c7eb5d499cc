//! One connection to a single Redis server or to a Redis Cluster, and the URL forms that
//! choose between them.

use crate::{map_redis_error, CONNECT_TIMEOUT_MS, RESPONSE_TIMEOUT_MS};
use kernel_core::{Error, Result};
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisFuture, Value};
use std::time::Duration;

/// Most seed nodes a cluster URL may list.
pub const CLUSTER_SEEDS_MAX: usize = 64;

/// What a Redis URL names: one server, or the seed nodes of a cluster.
///
/// | URL | topology |
/// |---|---|
/// | `redis://host[:port][/db][?…]`, `rediss://…` | one server |
/// | `redis+cluster://host:port[,host:port…][?…]`, `rediss+cluster://…` | a cluster, from its seeds |
/// | `redis://host:port,host:port[,…][?…]` (more than one host) | a cluster, from its seeds |
///
/// A cluster URL's user and password and its query parameters (`protocol=resp3`, …) apply
/// to every node; a cluster has only database 0, so a path other than `/` or `/0` is
/// refused. The seeds are where the client first asks for the slot map; the cluster's other
/// nodes are found from it.
///
/// ```
/// use redis_conn::Topology;
/// let t = Topology::parse("redis+cluster://127.0.0.1:7000,127.0.0.1:7001/?protocol=resp3").unwrap();
/// assert_eq!(
///     t,
///     Topology::Cluster(vec![
///         "redis://127.0.0.1:7000/?protocol=resp3".into(),
///         "redis://127.0.0.1:7001/?protocol=resp3".into()
///     ])
/// );
/// assert!(matches!(Topology::parse("redis://127.0.0.1:6379/2").unwrap(), Topology::Single(_)));
/// assert!(Topology::parse("redis+cluster://h:1/3").is_err()); // a cluster has database 0 only
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One server, at this URL.
    Single(String),
    /// A cluster: one single-server URL per seed node.
    Cluster(Vec<String>),
}

impl Topology {
    /// Read a URL (see the table above). A malformed cluster URL is
    /// [`Error::InvalidInput`] on field `redis url`, whose text never repeats a password;
    /// anything else that is not a cluster URL is left to the driver, which says what is
    /// wrong with it when it connects.
    pub fn parse(url: &str) -> Result<Topology> {
        let bad = |why: &str| Error::invalid("redis url", why.to_string());
        let single = || Ok(Topology::Single(url.to_string()));
        let Some((scheme, rest)) = url.split_once("://") else { return single() };
        let (base, forced) = match scheme {
            "redis" | "rediss" => (scheme, false),
            "redis+cluster" => ("redis", true),
            "rediss+cluster" => ("rediss", true),
            _ => return single(),
        };
        let (before_query, query) = rest.split_once('?').map_or((rest, None), |(b, q)| (b, Some(q)));
        let (authority, path) = before_query.split_once('/').map_or((before_query, ""), |(a, p)| (a, p));
        let (userinfo, hosts) = authority.rsplit_once('@').map_or((None, authority), |(u, h)| (Some(u), h));
        let hosts: Vec<&str> = hosts.split(',').collect();
        if !forced && hosts.len() == 1 {
            return single();
        }
        if hosts.iter().any(|h| h.is_empty()) {
            return Err(bad("a cluster URL lists host:port pairs separated by commas, none empty"));
        }
        if hosts.len() > CLUSTER_SEEDS_MAX {
            return Err(bad(&format!("{} seed nodes exceed the limit of {CLUSTER_SEEDS_MAX}", hosts.len())));
        }
        if !matches!(path, "" | "0") {
            return Err(bad("a cluster has only database 0"));
        }
        let nodes = hosts
            .iter()
            .map(|h| {
                let mut node = format!("{base}://");
                if let Some(u) = userinfo {
                    node.push_str(u);
                    node.push('@');
                }
                node.push_str(h);
                if let Some(q) = query {
                    node.push_str("/?");
                    node.push_str(q);
                }
                node
            })
            .collect();
        Ok(Topology::Cluster(nodes))
    }
}

/// A reconnecting connection to one Redis server or to a Redis Cluster, with bounded
/// timeouts; every Redis adapter (`queue-redis`, `permit-redis`, `sse-stream`) runs on
/// either. Cheap to clone; clones share the connection.
///
/// On a cluster every command is routed by its first key, so each script's keys must share
/// one hash slot: the adapters' key layouts see to that (see `queue-redis`'s crate docs).
#[derive(Clone)]
pub enum RedisConn {
    /// One server ([`ConnectionManager`]: reconnects on its own).
    Single(ConnectionManager),
    /// A cluster (follows slot moves and failovers on its own).
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for RedisConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_cluster() { "RedisConn::Cluster" } else { "RedisConn::Single" })
    }
}

impl From<ConnectionManager> for RedisConn {
    fn from(c: ConnectionManager) -> Self {
        RedisConn::Single(c)
    }
}

impl From<ClusterConnection> for RedisConn {
    fn from(c: ClusterConnection) -> Self {
        RedisConn::Cluster(c)
    }
}

impl RedisConn {
    /// Whether this is a cluster connection.
    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisConn::Cluster(_))
    }

    /// The addresses (`host`, `port`) of every master of the cluster (from `CLUSTER
    /// NODES`), for commands that act per node, such as `SCAN`; empty for one server.
    pub async fn masters(&self) -> Result<Vec<(String, u16)>> {
        let RedisConn::Cluster(c) = self else { return Ok(Vec::new()) };
        let text: String = match c
            .clone()
            .route_command(
                redis::cmd("CLUSTER").arg("NODES").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary),
            )
            .await
            .map_err(map_redis_error)?
        {
            Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
            Value::VerbatimString { text, .. } => text,
            other => {
                redis::from_redis_value(other).map_err(|e| Error::unavailable(format!("redis: CLUSTER NODES: {e}")))?
            }
        };
        Ok(cluster_masters(&text))
    }

    /// Run `cmd` on the node at `host:port` (a cluster), or on the one server.
    pub async fn on_node<T: redis::FromRedisValue>(&self, host: &str, port: u16, cmd: &Cmd) -> Result<T> {
        match self {
            RedisConn::Single(c) => cmd.query_async(&mut c.clone()).await.map_err(map_redis_error),
            RedisConn::Cluster(c) => {
                let routing =
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host: host.to_string(), port });
                let v = c.clone().route_command(cmd.clone(), routing).await.map_err(map_redis_error)?;
                redis::from_redis_value(v).map_err(|e| Error::unavailable(format!("redis: unexpected reply: {e}")))
            }
        }
    }
}

/// Slots of a Redis Cluster.
pub const CLUSTER_SLOTS: u16 = 16_384;

/// The cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag — the part between the
/// first `{` and the next `}`, when not empty — else of the whole key, modulo
/// [`CLUSTER_SLOTS`]. Keys with the same slot can share a script on a cluster.
///
/// ```
/// use redis_conn::hash_slot;
/// assert_eq!(hash_slot("123456789"), 12_739); // the example of the cluster specification
/// assert_eq!(hash_slot("a:{t}:1"), hash_slot("b:{t}:2"));
/// assert_eq!(hash_slot("a{}b"), hash_slot("a{}b")); // an empty tag: the whole key
/// ```
pub fn hash_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        rest.iter().position(|&b| b == b'}').filter(|&len| len > 0).map(|len| &rest[..len])
    });
    let mut crc: u16 = 0;
    for &b in tagged.unwrap_or(bytes) {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc % CLUSTER_SLOTS
}

/// The masters' `host`, `port` in a `CLUSTER NODES` reply (lines of `id host:port@cport
/// flags …`; a master that is failing or has no address is left out).
pub(crate) fn cluster_masters(text: &str) -> Vec<(String, u16)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let (Some(_id), Some(addr), Some(flags)) = (fields.next(), fields.next(), fields.next()) else { continue };
        let flags: Vec<&str> = flags.split(',').collect();
        if !flags.contains(&"master") || flags.iter().any(|f| matches!(*f, "fail" | "fail?" | "noaddr")) {
            continue;
        }
        let hostport = addr.split('@').next().unwrap_or("");
        let hostport = hostport.split(',').next().unwrap_or("");
        if let Some((host, port)) = hostport.rsplit_once(':') {
            if let Ok(port) = port.parse() {
                out.push((host.to_string(), port));
            }
        }
    }
    out.sort();
    out
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
        }
    }
}

/// Open a cluster connection from its seed URLs (as [`Topology::Cluster`] lists them), with
/// the timeouts of every connection of this crate (see [`connect`](crate::connect)). A seed
/// list the driver refuses is [`Error::InvalidInput`] (field `redis url`), an unreachable
/// cluster [`Error::Unavailable`].
pub async fn connect_cluster(nodes: &[String]) -> Result<ClusterConnection> {
    let client = redis::cluster::ClusterClientBuilder::new(nodes.iter().map(String::as_str))
        .connection_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
        .response_timeout(Duration::from_millis(RESPONSE_TIMEOUT_MS))
        .retries(2)
        .build()
        .map_err(|e| Error::invalid_with("redis url", e.to_string(), e))?;
    client.get_async_connection().await.map_err(map_redis_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_choose_the_topology() {
        let single = |u: &str| assert_eq!(Topology::parse(u).unwrap(), Topology::Single(u.to_string()), "{u}");
        single("redis://127.0.0.1:6379");
        single("redis://:pw@h:1/2?protocol=resp3");
        single("rediss://h");
        single("h:1"); // the driver refuses it
        single("mongodb://h");
        let cluster = |u: &str| match Topology::parse(u) {
            Ok(Topology::Cluster(n)) => n,
            other => panic!("{u}: {other:?}"),
        };
        assert_eq!(cluster("redis://a:1,b:2"), ["redis://a:1", "redis://b:2"]);
        assert_eq!(cluster("redis+cluster://a:1"), ["redis://a:1"]);
        assert_eq!(cluster("rediss+cluster://u:p@a:1,b:2/0?x=y"), ["rediss://u:p@a:1/?x=y", "rediss://u:p@b:2/?x=y"]);
        for bad in ["redis+cluster://a:1,,b:2", "redis://a:1,b:2/3", "redis+cluster://"] {
            let e = Topology::parse(bad).unwrap_err();
            assert!(matches!(&e, Error::InvalidInput { field, .. } if field == "redis url"), "{bad}: {e:?}");
        }
        let many = format!("redis+cluster://{}", vec!["h:1"; CLUSTER_SEEDS_MAX + 1].join(","));
        assert!(Topology::parse(&many).is_err());
        assert!(!Topology::parse("redis+cluster://u:s3cret@h:1/9").unwrap_err().to_string().contains("s3cret"));
    }

    #[test]
    fn hash_slots_follow_the_specification() {
        // CRC16-XMODEM("123456789") = 0x31C3.
        assert_eq!(hash_slot("123456789"), 0x31C3 % CLUSTER_SLOTS);
        assert_eq!(hash_slot("{user1000}.following"), hash_slot("{user1000}.followers"));
        assert_eq!(hash_slot("foo{}{bar}"), hash_slot("foo{}{bar}"));
        assert_ne!(hash_slot("foo{}{bar}"), hash_slot("bar"), "an empty first tag hashes the whole key");
        assert_eq!(hash_slot("foo{{bar}}zap"), hash_slot("{bar"), "the tag runs to the first closing brace");
    }

    #[test]
    fn masters_come_from_cluster_nodes() {
        let text = "\
a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7002@17002 master - 0 0 2 connected 5461-10922
c3 127.0.0.1:7003@17003 slave b2 0 0 2 connected
d4 127.0.0.1:7004@17004 master,fail - 0 0 3 connected
e5 host.example:7005@17005,host.example master - 0 0 4 connected 10923-16383
";
        assert_eq!(
            cluster_masters(text),
            [("127.0.0.1".to_string(), 7001), ("127.0.0.1".to_string(), 7002), ("host.example".to_string(), 7005)]
        );
    }
}
