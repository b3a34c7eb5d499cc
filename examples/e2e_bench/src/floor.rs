//! The floor: the same four-step protocol as hand-written Lua on Redis alone, with state
//! in Redis, on `--floor-connections` separate connections and as many worker tasks as the
//! engine has slots.
//!
//! Per workflow: a start script (state hash + lane entry + doorbell), a pop script (due
//! entry → lease token on the state) and one script per step (checks the token and the
//! step, records the output, bumps the revision; the last one marks the workflow done).
//! Idle workers wait on the doorbell (one pub/sub connection, fanned out in process) or
//! poll at the engine's default poll interval, as the engine does.

use crate::counting::Tally;
use crate::engine_side::STEPS;
use crate::Burst;
use futures::StreamExt;
use kernel_core::domain::WorkflowStatus;
use redis::aio::MultiplexedConnection;
use redis::Script;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify};

/// Create the state hash (idempotent on the key), queue the workflow and ring the doorbell
/// unless the channel is empty (a batch rings once, after its last start).
/// `KEYS[1]`: state hash, `KEYS[2]`: lane. `ARGV`: id, now (ms), input, doorbell channel or ''.
const START_LUA: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'status', 'running', 'step', 1, 'rev', 0, 'input', ARGV[3], 'created', ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
if ARGV[4] ~= '' then redis.call('PUBLISH', ARGV[4], '1') end
return 1
";

/// Pop the first due entry and lease it: the token and the lease end on its state.
/// `KEYS[1]`: lane. `ARGV`: now (ms), token, lease (ms), state key prefix.
/// Returns the id, or false when nothing is due (or the entry was stale).
const POP_LUA: &str = r"
local id = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 1)[1]
if not id then return false end
redis.call('ZREM', KEYS[1], id)
local key = ARGV[4] .. id
if redis.call('HGET', key, 'status') ~= 'running' then return false end
redis.call('HSET', key, 'token', ARGV[2], 'lease_until', tonumber(ARGV[1]) + tonumber(ARGV[3]))
return id
";

/// Record one step under the lease token. `KEYS[1]`: state hash. `ARGV`: token, step (1-based),
/// output, steps in all, now (ms). Returns 0 (token or step mismatch: nothing written),
/// 1 (step recorded) or 2 (last step recorded, workflow done).
const STEP_LUA: &str = r"
local st = redis.call('HMGET', KEYS[1], 'token', 'step', 'status')
if st[1] ~= ARGV[1] or st[2] ~= ARGV[2] or st[3] ~= 'running' then return 0 end
local i = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'out' .. i, ARGV[3], 'step', i + 1, 'updated', ARGV[5])
redis.call('HINCRBY', KEYS[1], 'rev', 1)
if i == tonumber(ARGV[4]) then
  redis.call('HSET', KEYS[1], 'status', 'done', 'finished', ARGV[5])
  redis.call('HDEL', KEYS[1], 'token', 'lease_until')
  return 2
end
return 1
";

static START: LazyLock<Script> = LazyLock::new(|| Script::new(START_LUA));
static POP: LazyLock<Script> = LazyLock::new(|| Script::new(POP_LUA));
static STEP: LazyLock<Script> = LazyLock::new(|| Script::new(STEP_LUA));

/// The engine's default lease and poll interval, so both sides hold and wait alike.
const LEASE_MS: i64 = 30_000;
const POLL: Duration = Duration::from_secs(5);
/// Ids read back per pipeline by the oracle, and keys per `SCAN` page and `DEL`.
const PAGE: usize = 500;

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// A multiplexed connection with the timeouts the engine's Redis adapters use (the driver's
/// default response timeout, 500 ms, would fail a floor step the engine would wait for).
pub async fn connect(client: &redis::Client) -> Result<MultiplexedConnection, String> {
    let timeout = Some(RESPONSE_TIMEOUT);
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(timeout).set_connection_timeout(timeout);
    client.get_multiplexed_async_connection_with_config(&config).await.map_err(rerr("connect"))
}

/// The engine's Redis call and connect timeout (`redis_conn::RESPONSE_TIMEOUT_MS`), restated
/// so the floor depends on no adapter.
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(2_000);

fn rerr(what: &'static str) -> impl Fn(redis::RedisError) -> String {
    move |e| format!("floor {what}: {e}")
}

struct Keys {
    prefix: String,
    lane: String,
    doorbell: String,
    state_prefix: String,
}

impl Keys {
    fn state(&self, id: &str) -> String {
        format!("{}{id}", self.state_prefix)
    }
}

/// The floor's connections and workers on a fresh key prefix, removed by [`close`](Self::close).
pub struct FloorBench {
    conns: Vec<MultiplexedConnection>,
    keys: Arc<Keys>,
    tally: Arc<Tally>,
    stop: watch::Sender<bool>,
    workers: Vec<tokio::task::JoinHandle<()>>,
    subscriber: tokio::task::JoinHandle<()>,
}

impl FloorBench {
    /// Open `connections` connections and a doorbell subscription, load the scripts and
    /// spawn `workers` worker tasks (worker `w` uses connection `w % connections`).
    pub async fn open(url: &str, connections: usize, workers: usize) -> Result<FloorBench, String> {
        let client = redis::Client::open(url).map_err(rerr("url"))?;
        let mut conns = Vec::with_capacity(connections);
        for _ in 0..connections.max(1) {
            conns.push(connect(&client).await?);
        }
        for s in [&*START, &*POP, &*STEP] {
            s.prepare_invoke().load_async(&mut conns[0]).await.map_err(rerr("script load"))?;
        }
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let prefix = format!("e2e_floor_{:x}", nanos ^ (u128::from(std::process::id()) << 96));
        let keys = Arc::new(Keys {
            lane: format!("{prefix}:lane"),
            doorbell: format!("{prefix}:doorbell"),
            state_prefix: format!("{prefix}:wf:"),
            prefix,
        });
        let bell = Arc::new(Notify::new());
        let mut pubsub = client.get_async_pubsub().await.map_err(rerr("subscribe"))?;
        pubsub.subscribe(&keys.doorbell).await.map_err(rerr("subscribe"))?;
        let ring = bell.clone();
        let subscriber = tokio::spawn(async move {
            let mut messages = pubsub.into_on_message();
            while messages.next().await.is_some() {
                ring.notify_waiters();
            }
        });
        let tally = Arc::new(Tally::new());
        let (stop, stop_rx) = watch::channel(false);
        let workers = (0..workers)
            .map(|w| {
                let worker = Worker {
                    id: w,
                    conn: conns[w % conns.len()].clone(),
                    keys: keys.clone(),
                    tally: tally.clone(),
                    bell: bell.clone(),
                    stop: stop_rx.clone(),
                    seq: AtomicU64::new(0),
                };
                tokio::spawn(worker.run())
            })
            .collect();
        Ok(FloorBench { conns, keys, tally, stop, workers, subscriber })
    }

    /// Start every id the way the engine side's `start_all` does: batches of at most
    /// [`Publisher::START_MANY_MAX`](kernel_core::Publisher::START_MANY_MAX) ids, each one
    /// pipeline of start scripts (one round trip) followed by one doorbell `PUBLISH`; at most
    /// `batches_in_flight` batches at once, spread over the connections.
    async fn start_all(&self, ids: &[String], batches_in_flight: usize) -> Result<(), String> {
        use futures::stream::{self, TryStreamExt};
        let batch = kernel_core::Publisher::START_MANY_MAX;
        stream::iter(ids.chunks(batch).enumerate())
            .map(|(i, chunk)| {
                let mut conn = self.conns[i % self.conns.len()].clone();
                let now = now_ms();
                async move {
                    let mut pipe = redis::pipe();
                    for id in chunk {
                        let mut inv = START.prepare_invoke();
                        inv.key(self.keys.state(id)).key(&self.keys.lane).arg(id).arg(now).arg(r#"{"i":0}"#).arg("");
                        pipe.invoke_script(&inv);
                    }
                    pipe.cmd("PUBLISH").arg(&self.keys.doorbell).arg("1");
                    pipe.query_async::<redis::Value>(&mut conn).await.map_err(rerr("start"))
                }
            })
            .buffered(batches_in_flight.max(1))
            .try_collect::<Vec<redis::Value>>()
            .await
            .map(drop)
    }

    /// Start `n` workflows at once and wait for the last one done; then check in Redis
    /// that every one is done with every output recorded.
    pub async fn burst(
        &self,
        tag: &str,
        n: usize,
        concurrency: usize,
        redis: &mut MultiplexedConnection,
    ) -> Result<Burst, String> {
        let ids: Vec<String> = (0..n).map(|i| format!("{tag}-b{i}")).collect();
        let (terminal0, writes0) = (self.tally.terminal(), self.tally.writes.load(Ordering::Relaxed));
        let cpu0 = crate::cpu::CpuSnapshot::take(redis).await?;
        let t0 = Instant::now();
        self.start_all(&ids, concurrency).await?;
        self.tally.wait_terminal(terminal0 + n as u64, crate::burst_timeout(n)).await?;
        let cpu = crate::cpu::CpuSnapshot::take(redis).await?.since(cpu0);
        let last = self.tally.last_terminal().ok_or("no terminal write seen")?;
        let writes = self.tally.writes.load(Ordering::Relaxed) - writes0;
        self.check_done(&ids).await?;
        Ok(Burst { elapsed: last - t0, cpu, writes, statements: None, commits: None })
    }

    /// Redis as the oracle: every state is `done`, past the last step, with every output.
    async fn check_done(&self, ids: &[String]) -> Result<(), String> {
        let mut conn = self.conns[0].clone();
        let mut bad = 0usize;
        for chunk in ids.chunks(PAGE) {
            let mut pipe = redis::pipe();
            for id in chunk {
                pipe.cmd("HMGET").arg(self.keys.state(id)).arg("status").arg("step");
                for k in 1..=STEPS {
                    pipe.arg(format!("out{k}"));
                }
            }
            let rows: Vec<Vec<Option<String>>> = pipe.query_async(&mut conn).await.map_err(rerr("read back"))?;
            let last = (STEPS + 1).to_string();
            bad += rows
                .iter()
                .filter(|r| {
                    !(r[0].as_deref() == Some("done")
                        && r[1].as_deref() == Some(last.as_str())
                        && r[2..].iter().all(Option::is_some))
                })
                .count();
        }
        match bad {
            0 => Ok(()),
            k => Err(format!("floor: {k} of {} workflows not done in Redis", ids.len())),
        }
    }

    /// `k` workflows one at a time: milliseconds from the start call to the last step's write.
    pub async fn singles(&self, tag: &str, k: usize) -> Result<Vec<f64>, String> {
        let mut out = Vec::with_capacity(k);
        for i in 0..k {
            let id = vec![format!("{tag}-s{i}")];
            let before = self.tally.terminal();
            let t0 = Instant::now();
            self.start_all(&id, 1).await?;
            self.tally.wait_terminal(before + 1, crate::burst_timeout(1)).await?;
            let last = self.tally.last_terminal().ok_or("no terminal write seen")?;
            out.push((last - t0).as_secs_f64() * 1e3);
            self.check_done(&id).await?;
        }
        Ok(out)
    }

    /// Stop the workers and delete every key under the prefix.
    pub async fn close(self) -> Result<(), String> {
        let FloorBench { conns, keys, tally: _, stop, workers, subscriber } = self;
        let _ = stop.send(true);
        for w in workers {
            w.await.map_err(|e| format!("floor worker: {e}"))?;
        }
        subscriber.abort();
        let mut conn = conns[0].clone();
        let pattern = format!("{}:*", keys.prefix);
        let mut cursor: u64 = 0;
        loop {
            let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(PAGE)
                .query_async(&mut conn)
                .await
                .map_err(rerr("scan"))?;
            if !found.is_empty() {
                redis::cmd("DEL").arg(&found).query_async::<()>(&mut conn).await.map_err(rerr("delete"))?;
            }
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }
}

struct Worker {
    id: usize,
    conn: MultiplexedConnection,
    keys: Arc<Keys>,
    tally: Arc<Tally>,
    bell: Arc<Notify>,
    stop: watch::Receiver<bool>,
    seq: AtomicU64,
}

impl Worker {
    async fn run(mut self) {
        let bell = self.bell.clone();
        loop {
            if *self.stop.borrow() {
                return;
            }
            // Registered before the pop, so a doorbell rung during it is not lost.
            let notified = bell.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.pop().await {
                Ok(Some((id, token))) => {
                    if let Err(e) = self.run_steps(&id, &token).await {
                        eprintln!("floor worker {}: {e}", self.id);
                    }
                }
                Ok(None) => {
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = tokio::time::sleep(POLL) => {}
                        _ = self.stop.changed() => return,
                    }
                }
                Err(e) => {
                    eprintln!("floor worker {}: {e}", self.id);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    async fn pop(&mut self) -> Result<Option<(String, String)>, String> {
        let token = format!("f{}-{}", self.id, self.seq.fetch_add(1, Ordering::Relaxed));
        let mut inv = POP.prepare_invoke();
        inv.key(&self.keys.lane).arg(now_ms()).arg(&token).arg(LEASE_MS).arg(&self.keys.state_prefix);
        let id: Option<String> = inv.invoke_async(&mut self.conn).await.map_err(rerr("pop"))?;
        if id.is_some() {
            self.tally.writes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(id.map(|id| (id, token)))
    }

    async fn run_steps(&mut self, id: &str, token: &str) -> Result<(), String> {
        let state = self.keys.state(id);
        for step in 1..=STEPS {
            // The activity's output, serialized as the engine serializes its own.
            let output = serde_json::to_string(&serde_json::json!({ "step": step, "ok": true }))
                .map_err(|e| format!("output: {e}"))?;
            let mut inv = STEP.prepare_invoke();
            inv.key(&state).arg(token).arg(step).arg(output).arg(STEPS).arg(now_ms());
            match inv.invoke_async::<i64>(&mut self.conn).await.map_err(rerr("step"))? {
                0 => return Err(format!("{id}: step {step} refused (token or step mismatch)")),
                2 => {
                    self.tally.writes.fetch_add(1, Ordering::Relaxed);
                    self.tally.saw_terminal(WorkflowStatus::Completed);
                }
                _ => {
                    self.tally.writes.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recorded figures were measured against these scripts: a change to the floor is a
    /// deliberate one (SHA-1 of the script text, cross-checked with `sha1sum`).
    #[test]
    fn scripts_are_pinned() {
        let hashes = [START.get_hash(), POP.get_hash(), STEP.get_hash()];
        assert_eq!(hashes, [START_HASH, POP_HASH, STEP_HASH]);
    }

    const START_HASH: &str = "b56dce5c9f2c859532cf10782a5c6217d9cfca03";
    const POP_HASH: &str = "585cfe6afe868e87ae2c5e2ffe0ca6d46e18e1da";
    const STEP_HASH: &str = "1af069ab730ab6172fd86dcd09bedf888150b7b0";
}
