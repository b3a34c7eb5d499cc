//! The raw PostgreSQL floor, the measure beside `store=postgres`: the same four-step shape
//! with nothing but what PostgreSQL needs, and no Redis.
//!
//! - Each workflow is one row of `floor_wf` in a scratch schema, inserted by one prepared
//!   autocommit `INSERT` (pipelined, up to `Publisher::START_MANY_MAX` per batch, at most
//!   `start_batches` batches at once on their own connections).
//! - `slots` workers, each on its own connection, claim a due row with one statement,
//!   `UPDATE … SET status = 'running', token = $1 WHERE id = (SELECT id … WHERE status =
//!   'ready' ORDER BY created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id, step`,
//!   then write each step with one prepared autocommit conditional
//!   `UPDATE … WHERE id = $1 AND step = $2 AND token = $3 RETURNING step, status`; the last
//!   one completes the row.
//! - An idle worker waits on an in-process wake-up rung after each insert batch (or 1 s).
//!
//! Per workflow: 1 insert, 1 claim, 4 step updates — 1.5 statements and 1.5 commits per
//! step, every one counted here (client side).

use crate::Burst;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify};
use tokio_postgres::{Client, NoTls, Statement};

const STEPS: i32 = crate::engine_side::STEPS as i32;

struct State {
    terminal: watch::Sender<u64>,
    last_terminal: Mutex<Option<Instant>>,
    statements: AtomicU64,
    writes: AtomicU64,
    stop: AtomicBool,
    wake: Notify,
}

impl State {
    fn sent(&self, n: u64) {
        self.statements.fetch_add(n, Ordering::Relaxed);
    }
}

/// The floor on its own connections and scratch schema, torn down by [`close`](Self::close).
pub struct PgFloor {
    schema: String,
    starters: Vec<(Client, Statement)>,
    state: Arc<State>,
    workers: Vec<tokio::task::JoinHandle<Result<(), String>>>,
}

/// One connection, its driver task spawned.
pub async fn connect(url: &str) -> Result<Client, String> {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.map_err(|e| format!("postgres connect: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

fn pg(what: &'static str) -> impl Fn(tokio_postgres::Error) -> String {
    move |e| format!("postgres floor {what}: {e}")
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

impl PgFloor {
    /// Create the scratch schema `floor_<tag>` with its table, open `workers` worker and
    /// `starters` starter connections and spawn the workers.
    pub async fn open(url: &str, tag: &str, workers: usize, starters: usize) -> Result<PgFloor, String> {
        let schema: String = format!("floor_{tag}")
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' })
            .take(63)
            .collect();
        let admin = connect(url).await?;
        admin
            .batch_execute(&format!(
                "CREATE SCHEMA \"{schema}\";
                 CREATE TABLE \"{schema}\".floor_wf (
                   id text COLLATE \"C\" PRIMARY KEY, status text NOT NULL, step int NOT NULL,
                   token text, input jsonb NOT NULL, output jsonb NOT NULL DEFAULT '{{}}',
                   created_at bigint NOT NULL, updated_at bigint NOT NULL);
                 CREATE INDEX floor_wf_ready ON \"{schema}\".floor_wf (created_at, id) WHERE status = 'ready';"
            ))
            .await
            .map_err(pg("create the table"))?;
        let state = Arc::new(State {
            terminal: watch::Sender::new(0),
            last_terminal: Mutex::new(None),
            statements: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            wake: Notify::new(),
        });
        let t = format!("\"{schema}\".floor_wf");
        let insert_sql = format!(
            "INSERT INTO {t} (id, status, step, input, created_at, updated_at) VALUES ($1, 'ready', 0, $2, $3, $3)"
        );
        let mut starter_conns = Vec::new();
        for _ in 0..starters.max(1) {
            let c = connect(url).await?;
            let s = c.prepare(&insert_sql).await.map_err(pg("prepare the insert"))?;
            starter_conns.push((c, s));
        }
        let claim_sql = format!(
            "UPDATE {t} SET status = 'running', token = $1, updated_at = $2 WHERE id = \
             (SELECT id FROM {t} WHERE status = 'ready' ORDER BY created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED) \
             RETURNING id, step"
        );
        let step_sql = format!(
            "UPDATE {t} SET step = step + 1, output = output || jsonb_build_object($4::text, $5::jsonb), \
             status = CASE WHEN step + 1 >= {STEPS} THEN 'completed' ELSE status END, updated_at = $6 \
             WHERE id = $1 AND step = $2 AND token = $3 RETURNING step, status"
        );
        let mut handles = Vec::new();
        for w in 0..workers.max(1) {
            let c = connect(url).await?;
            let claim = c.prepare(&claim_sql).await.map_err(pg("prepare the claim"))?;
            let step = c.prepare(&step_sql).await.map_err(pg("prepare the step"))?;
            let state = state.clone();
            handles.push(tokio::spawn(worker(w, c, claim, step, state)));
        }
        Ok(PgFloor { schema, starters: starter_conns, state, workers: handles })
    }

    fn terminal(&self) -> u64 {
        *self.state.terminal.borrow()
    }

    async fn wait_terminal(&self, n: u64, timeout: Duration) -> Result<(), String> {
        let mut rx = self.state.terminal.subscribe();
        let reached = matches!(tokio::time::timeout(timeout, rx.wait_for(|t| *t >= n)).await, Ok(Ok(_)));
        if reached {
            return Ok(());
        }
        Err(format!("postgres floor: {} of {n} workflows completed within {timeout:?}", self.terminal()))
    }

    /// Insert `ids` in pipelined batches, at most `batches_in_flight` at once.
    async fn start(&self, ids: &[String], batches_in_flight: usize) -> Result<(), String> {
        use futures::stream::{self, StreamExt, TryStreamExt};
        let chunks: Vec<&[String]> = ids.chunks(kernel_core::Publisher::START_MANY_MAX).collect();
        let n = self.starters.len();
        stream::iter(chunks.into_iter().enumerate())
            .map(|(k, chunk)| async move {
                let (client, insert) = &self.starters[k % n];
                let now = now_ms();
                let inserts = chunk.iter().enumerate().map(|(i, id)| {
                    let input = serde_json::json!({ "i": i });
                    async move { client.execute(insert, &[id, &input, &now]).await }
                });
                let done = futures::future::try_join_all(inserts).await.map_err(pg("insert"))?;
                self.state.sent(done.len() as u64);
                self.state.wake.notify_waiters();
                Ok::<_, String>(())
            })
            .buffer_unordered(batches_in_flight.max(1))
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    /// The table as the oracle: every id completed all its steps (one statement).
    pub async fn check_completed(&self, ids: &[String]) -> Result<(), String> {
        let (client, _) = &self.starters[0];
        let sql = format!(
            "SELECT count(*) FROM \"{}\".floor_wf WHERE id = ANY($1) AND status = 'completed' AND step = {STEPS} \
             AND output ?& array['s1','s2','s3','s4']",
            self.schema
        );
        let done: i64 = client.query_one(&sql, &[&ids]).await.map_err(pg("read back"))?.get(0);
        if done as usize != ids.len() {
            return Err(format!("postgres floor: {done} of {} workflows completed in the table", ids.len()));
        }
        Ok(())
    }

    /// Statements this floor sent so far (inserts, claims that found a row, step updates,
    /// claims that found none).
    pub fn statements(&self) -> Option<u64> {
        Some(self.sent())
    }

    fn sent(&self) -> u64 {
        self.state.statements.load(Ordering::Relaxed)
    }

    /// Start `n` rows at once; wait for the last completing write. Returns the ids, for
    /// [`check_completed`](Self::check_completed).
    pub async fn burst(
        &self,
        tag: &str,
        n: usize,
        concurrency: usize,
        redis: &mut redis::aio::MultiplexedConnection,
    ) -> Result<(Burst, Vec<String>), String> {
        let ids: Vec<String> = (0..n).map(|i| format!("{tag}-b{i}")).collect();
        let (terminal0, writes0, statements0) =
            (self.terminal(), self.state.writes.load(Ordering::Relaxed), self.sent());
        let cpu0 = crate::cpu::CpuSnapshot::take(redis).await?;
        let t0 = Instant::now();
        self.start(&ids, concurrency).await?;
        self.wait_terminal(terminal0 + n as u64, crate::burst_timeout(n)).await?;
        let cpu = crate::cpu::CpuSnapshot::take(redis).await?.since(cpu0);
        let last = (*self.state.last_terminal.lock().expect("floor lock")).ok_or("no terminal write seen")?;
        let writes = self.state.writes.load(Ordering::Relaxed) - writes0;
        let statements = self.sent() - statements0;
        Ok((Burst { elapsed: last - t0, cpu, writes, statements: Some(statements), commits: None }, ids))
    }

    /// `k` rows one at a time: milliseconds from the insert to the completing write.
    pub async fn singles(&self, tag: &str, k: usize) -> Result<Vec<f64>, String> {
        let mut out = Vec::with_capacity(k);
        for i in 0..k {
            let ids = vec![format!("{tag}-s{i}")];
            let before = self.terminal();
            let t0 = Instant::now();
            self.start(&ids, 1).await?;
            self.wait_terminal(before + 1, crate::burst_timeout(1)).await?;
            let last = (*self.state.last_terminal.lock().expect("floor lock")).ok_or("no terminal write seen")?;
            out.push((last - t0).as_secs_f64() * 1e3);
            self.check_completed(&ids).await?;
        }
        Ok(out)
    }

    /// Stop the workers and drop the schema.
    pub async fn close(self) -> Result<(), String> {
        self.state.stop.store(true, Ordering::SeqCst);
        self.state.wake.notify_waiters();
        let mut first_err = None;
        for h in self.workers {
            match h.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => first_err = first_err.or(Some(e)),
                Err(e) => first_err = first_err.or(Some(format!("postgres floor worker: {e}"))),
            }
        }
        let (client, _) = &self.starters[0];
        client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.schema))
            .await
            .map_err(pg("drop the schema"))?;
        first_err.map_or(Ok(()), Err)
    }
}

async fn worker(w: usize, client: Client, claim: Statement, step: Statement, state: Arc<State>) -> Result<(), String> {
    let mut round = 0u64;
    while !state.stop.load(Ordering::SeqCst) {
        let notified = state.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        round += 1;
        let token = format!("w{w}-{round}");
        let row = client.query_opt(&claim, &[&token, &now_ms()]).await.map_err(pg("claim"))?;
        state.sent(1);
        let Some(row) = row else {
            // The wake-up was enabled before the claim, so no ring is lost; the timeout is
            // only a safety net, long enough to add nothing to the counts.
            let _ = tokio::time::timeout(Duration::from_secs(1), notified).await;
            continue;
        };
        state.writes.fetch_add(1, Ordering::Relaxed);
        let id: String = row.get(0);
        let mut at: i32 = row.get(1);
        while at < STEPS {
            let name = format!("s{}", at + 1);
            let output = serde_json::json!({ "step": at + 1, "ok": true });
            let written =
                client.query_opt(&step, &[&id, &at, &token, &name, &output, &now_ms()]).await.map_err(pg("step"))?;
            state.sent(1);
            let Some(r) = written else {
                return Err(format!("postgres floor: the step write of {id} at {at} missed its guard"));
            };
            state.writes.fetch_add(1, Ordering::Relaxed);
            at = r.get(0);
            let status: String = r.get(1);
            if status == "completed" {
                let now = Instant::now();
                {
                    let mut last = state.last_terminal.lock().expect("floor lock");
                    if last.is_none_or(|l| l < now) {
                        *last = Some(now);
                    }
                }
                state.terminal.send_modify(|t| *t += 1);
            }
        }
    }
    Ok(())
}
