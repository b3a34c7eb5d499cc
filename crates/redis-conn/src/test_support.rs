//! Support for tests and benchmarks that talk to a real Redis: the one place that decides
//! "connect, start, skip or fail", unique key prefixes with clean-up, and a dedicated
//! throw-away server for tests that flush.
//!
//! - [`require_redis`] reads `REDIS_URL` (default [`DEFAULT_REDIS_URL`]); when `PING` fails
//!   on the default local address it starts `redis-server` there without persistence. If
//!   Redis is still unreachable the test fails under `CI=true` and is skipped elsewhere,
//!   with the reason printed.
//! - [`TestKeys`] gives each test a random prefix and deletes its keys when dropped (also on
//!   panic).
//! - [`DedicatedRedis`] runs a private `redis-server` on a free port and stops it on drop:
//!   tests that `FLUSHALL` use it and never touch the shared server.
//!
//! `REDIS_URL` may name a Redis Cluster (`redis+cluster://host:port,…`, see
//! [`Topology`](crate::Topology)): then `PING` goes to every seed node, nothing is started,
//! and [`TestKeys`] finds and deletes its keys on every master. `scripts/redis-cluster.sh`
//! starts a local one.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Redis used when `REDIS_URL` is unset.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
/// How long to wait for a started server to answer `PING`.
const START_WAIT_MS: u64 = 5_000;

/// `REDIS_URL` or the default.
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty()).unwrap_or_else(|| DEFAULT_REDIS_URL.to_string())
}

/// Whether this run is CI, where a missing Redis must fail instead of skip: `CI=true` or
/// `CI=1`, any case, blanks ignored — the rule of `testkit::ci` (which this crate cannot
/// depend on), checked to agree by a test.
pub fn is_ci() -> bool {
    ci_from(std::env::var("CI").ok().as_deref())
}

/// Whether `value` (the `CI` variable, if set) means a CI run.
pub fn ci_from(value: Option<&str>) -> bool {
    value.is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "1"))
}

/// `PING` over a short-lived synchronous connection; on a cluster URL, to every seed node.
pub fn ping(url: &str) -> Result<(), String> {
    if let Ok(crate::Topology::Cluster(nodes)) = crate::Topology::parse(url) {
        return nodes.iter().try_for_each(|n| ping_one(n));
    }
    ping_one(url)
}

fn ping_one(url: &str) -> Result<(), String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut con = client.get_connection_with_timeout(Duration::from_millis(1_000)).map_err(|e| e.to_string())?;
    let pong: String = redis::cmd("PING").query(&mut con).map_err(|e| e.to_string())?;
    if pong == "PONG" {
        Ok(())
    } else {
        Err(format!("unexpected PING reply {pong:?}"))
    }
}

fn wait_for_ping(url: &str, wait_ms: u64) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    loop {
        match ping(url) {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn probe() -> Result<String, String> {
    let url = redis_url();
    let first = match ping(&url) {
        Ok(()) => return Ok(url),
        Err(e) => e,
    };
    if url != DEFAULT_REDIS_URL {
        return Err(format!("{url} did not answer PING: {first}"));
    }
    let started = Command::new("redis-server")
        .args([
            "--daemonize",
            "yes",
            "--bind",
            "127.0.0.1",
            "-::1",
            "--port",
            "6379",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match started {
        Ok(s) if s.success() => {}
        Ok(s) => return Err(format!("{url} did not answer PING ({first}) and redis-server exited with {s}")),
        Err(e) => return Err(format!("{url} did not answer PING ({first}) and redis-server could not start: {e}")),
    }
    wait_for_ping(&url, START_WAIT_MS)
        .map(|()| url.clone())
        .map_err(|e| format!("started redis-server but {url} still fails PING: {e}"))
}

/// The Redis URL for a test, or `None` (after printing why) when Redis is unavailable
/// outside CI. Under `CI=true` an unavailable Redis panics. Probed once per process.
pub fn require_redis(test: &str) -> Option<String> {
    static PROBE: OnceLock<Result<String, String>> = OnceLock::new();
    match PROBE.get_or_init(probe) {
        Ok(url) => Some(url.clone()),
        Err(reason) if is_ci() => panic!("{test}: Redis is required under CI=true: {reason}"),
        Err(reason) => {
            eprintln!("SKIPPED {test}: Redis unavailable: {reason}");
            None
        }
    }
}

/// A prefix no other test or run uses: `wfk-test:<name>:<unique>`.
pub fn unique_prefix(test: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("wfk-test:{test}:{:x}{nanos:x}{n}", std::process::id())
}

/// A test's key namespace on a Redis; every key under it is deleted on drop.
#[derive(Debug)]
pub struct TestKeys {
    /// Redis URL.
    pub url: String,
    /// Key prefix (no trailing `:`).
    pub prefix: String,
}

impl TestKeys {
    /// A fresh namespace for `test` on `url`.
    pub fn new(url: &str, test: &str) -> Self {
        TestKeys { url: url.to_string(), prefix: unique_prefix(test) }
    }

    /// Keys currently under the prefix (on every master of a cluster).
    pub fn keys(&self) -> Vec<String> {
        self.keys_by_node().into_iter().flat_map(|(_, keys)| keys).collect()
    }

    /// The keys under the prefix with the node URL that holds them.
    fn keys_by_node(&self) -> Vec<(String, Vec<String>)> {
        let mut out = Vec::new();
        for node in node_urls(&self.url) {
            let Ok(mut con) = sync_connection(&node) else { continue };
            let mut keys = Vec::new();
            let mut cursor: u64 = 0;
            loop {
                let r: redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(format!("{}:*", self.prefix))
                    .arg("COUNT")
                    .arg(1_000)
                    .query(&mut con);
                let Ok((next, batch)) = r else { break };
                keys.extend(batch);
                if next == 0 {
                    break;
                }
                cursor = next;
            }
            out.push((node, keys));
        }
        out
    }
}

fn sync_connection(url: &str) -> redis::RedisResult<redis::Connection> {
    redis::Client::open(url)?.get_connection_with_timeout(Duration::from_millis(1_000))
}

/// The server's URL, or one URL per master of the cluster `url` names (from `CLUSTER
/// NODES` of the first seed that answers).
pub fn node_urls(url: &str) -> Vec<String> {
    let Ok(crate::Topology::Cluster(seeds)) = crate::Topology::parse(url) else { return vec![url.to_string()] };
    for seed in &seeds {
        let Ok(mut con) = sync_connection(seed) else { continue };
        let Ok(text) = redis::cmd("CLUSTER").arg("NODES").query::<String>(&mut con) else { continue };
        let scheme = seed.split_once("://").map_or("redis", |(s, _)| s);
        let auth = seed.split_once("://").and_then(|(_, r)| r.split_once('@')).map(|(u, _)| format!("{u}@"));
        return crate::conn::cluster_masters(&text)
            .into_iter()
            .map(|(host, port)| format!("{scheme}://{}{host}:{port}", auth.as_deref().unwrap_or("")))
            .collect();
    }
    Vec::new()
}

impl Drop for TestKeys {
    fn drop(&mut self) {
        for (node, keys) in self.keys_by_node() {
            let Ok(mut con) = sync_connection(&node) else { continue };
            // One key per DEL: keys of different slots cannot share one on a cluster.
            for key in keys {
                let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(key).query(&mut con);
            }
        }
    }
}

/// A private `redis-server` without persistence on a free local port, stopped on drop.
#[derive(Debug)]
pub struct DedicatedRedis {
    child: Child,
    /// Its URL.
    pub url: String,
    /// Its port.
    pub port: u16,
}

impl DedicatedRedis {
    /// Start one, or `None` (after printing why) when `redis-server` cannot run outside
    /// CI; under `CI=true` that panics.
    pub fn start(test: &str) -> Option<Self> {
        match Self::try_start() {
            Ok(r) => Some(r),
            Err(reason) if is_ci() => panic!("{test}: a dedicated redis-server is required under CI=true: {reason}"),
            Err(reason) => {
                eprintln!("SKIPPED {test}: cannot start a dedicated redis-server: {reason}");
                None
            }
        }
    }

    fn try_start() -> Result<Self, String> {
        let mut last = String::new();
        for _ in 0..3 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map_err(|e| e.to_string())?
                .port();
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("redis-server: {e}"))?;
            let mut server = DedicatedRedis { child, url: format!("redis://127.0.0.1:{port}"), port };
            match wait_for_ping(&server.url, START_WAIT_MS) {
                Ok(()) => return Ok(server),
                // Lost a race for the port: try another one.
                Err(e) => {
                    last = e;
                    server.stop();
                }
            }
        }
        Err(last)
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Kill the server process (SIGKILL): a Redis outage. Clients see refused connections
    /// until [`restart`](Self::restart).
    pub fn kill(&mut self) {
        self.stop();
    }

    /// Start a fresh, empty server (no persistence: every key is gone, as after a crash of
    /// a cache) on the same port after [`kill`](Self::kill), and wait until it answers.
    pub fn restart(&mut self) -> Result<(), String> {
        self.child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-server: {e}"))?;
        wait_for_ping(&self.url, START_WAIT_MS)
    }
}

impl Drop for DedicatedRedis {
    fn drop(&mut self) {
        self.stop();
    }
}
