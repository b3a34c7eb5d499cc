//! Support for tests, examples and benchmarks that talk to a real Redis: the one place of
//! this crate that decides "connect, start, skip or fail", and unique key prefixes with
//! clean-up.
//!
//! [`require_redis`] reads `REDIS_URL` (default [`DEFAULT_REDIS_URL`]); when `PING` fails on
//! the default local address it starts `redis-server` there without persistence. If Redis
//! is still unreachable the caller fails under `CI=true` and is skipped elsewhere, with the
//! reason printed. [`TestKeys`] deletes every key under its prefix when dropped.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Redis used when `REDIS_URL` is unset.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";

/// `REDIS_URL` or the default.
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty()).unwrap_or_else(|| DEFAULT_REDIS_URL.to_string())
}

/// Whether this run is CI, where a missing Redis must fail instead of skip.
pub fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

fn ping(url: &str) -> Result<(), String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut con = client.get_connection_with_timeout(Duration::from_millis(1_000)).map_err(|e| e.to_string())?;
    redis::cmd("PING").query::<String>(&mut con).map(|_| ()).map_err(|e| e.to_string())
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
        .args(["--daemonize", "yes", "--bind", "127.0.0.1", "--port", "6379", "--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match started {
        Ok(s) if s.success() => {}
        Ok(s) => return Err(format!("{url} did not answer PING ({first}) and redis-server exited with {s}")),
        Err(e) => return Err(format!("{url} did not answer PING ({first}) and redis-server could not start: {e}")),
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match ping(&url) {
            Ok(()) => return Ok(url),
            Err(e) if Instant::now() >= deadline => return Err(format!("started redis-server but PING fails: {e}")),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// The Redis URL for `test`, or `None` (after printing why) when Redis is unavailable
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

/// A prefix no other test or run uses: `wfk-test-sse-<name>-<unique>`.
pub fn unique_prefix(test: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("wfk-test-sse-{test}-{:x}{nanos:x}{n}", std::process::id())
}

/// A test's key namespace; every key under it is deleted on drop (also on panic).
#[derive(Debug)]
pub struct TestKeys {
    /// Redis URL.
    pub url: String,
    /// Key prefix.
    pub prefix: String,
}

impl TestKeys {
    /// A fresh namespace for `test` on `url`.
    pub fn new(url: &str, test: &str) -> Self {
        TestKeys { url: url.to_string(), prefix: unique_prefix(test) }
    }

    /// Keys currently under the prefix.
    pub fn keys(&self) -> Vec<String> {
        let Ok(client) = redis::Client::open(self.url.as_str()) else { return Vec::new() };
        let Ok(mut con) = client.get_connection_with_timeout(Duration::from_millis(1_000)) else { return Vec::new() };
        let mut out = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let r: redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{}:*", self.prefix))
                .arg("COUNT")
                .arg(1_000)
                .query(&mut con);
            let Ok((next, batch)) = r else { return out };
            out.extend(batch);
            if next == 0 {
                return out;
            }
            cursor = next;
        }
    }
}

impl Drop for TestKeys {
    fn drop(&mut self) {
        let keys = self.keys();
        if keys.is_empty() {
            return;
        }
        if let Ok(client) = redis::Client::open(self.url.as_str()) {
            if let Ok(mut con) = client.get_connection_with_timeout(Duration::from_millis(1_000)) {
                for chunk in keys.chunks(500) {
                    let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(chunk).query(&mut con);
                }
            }
        }
    }
}
