//! `claim-latency`: how the store's claims on PostgreSQL scale with the size of the instance
//! table (issue 12: the largest size's latency at most 1.5× the smallest's).
//!
//! For each size N, in a fresh schema migrated by store-postgres and dropped afterwards:
//!
//! 1. fill: N instances in the adapter's own row shape (the JSON columns are the kernel
//!    types' serde form), written by `INSERT … SELECT … FROM generate_series` in chunks of
//!    [`FILL_CHUNK`] rows: 5 % claimable by this claimer (running, due, of the two claimed
//!    types out of four), 5 % claimable by others (running, due, the other two types), 10 %
//!    waiting on a timer due in an hour, 80 % completed; then `ANALYZE`;
//! 2. [`WARMUP`] untimed calls of each kind;
//! 3. `claims` timed calls of [`WorkflowStore::claim`] (the Claimable guard on a given id,
//!    ids taken round-robin from a shuffled list of the claimable ones, so a row is claimed
//!    again only after every other one), then `claims` timed calls of
//!    [`WorkflowStore::claim_any`] (the store-fallback claim). The lease is 1 ms, so every
//!    claimed row is due again by its next turn.
//!
//! Calls are sequential on one connection; each is timed around the port call (statement,
//! round trip and decoding of the claimed document). Each claim is a durable commit unless
//! the URL says otherwise (`?options=-c%20synchronous_commit%3Doff` isolates the index and
//! plan from the disk's commit latency); the line states what the connection ran with.

use kernel_core::domain::{DurationMs, Instant, Step, StepStatus, Wait, WorkflowStatus};
use kernel_core::ports::{ClaimSpec, WorkflowStore};
use kernel_core::WorkflowId;
use serde_json::json;
use std::time::Duration;
use store_postgres::{PostgresConfig, PostgresWorkflowStore};

/// Rows per fill statement.
pub const FILL_CHUNK: usize = 100_000;
/// Untimed calls of each kind before the timed ones.
pub const WARMUP: usize = 200;
/// Instance types in the table; the claimer claims the first two.
const TYPES: [&str; 4] = ["type_0", "type_1", "type_2", "type_3"];

/// Settings of `claim-latency`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimLatencyArgs {
    /// Table sizes, measured in this order.
    pub sizes: Vec<usize>,
    /// Timed calls of each kind per size.
    pub claims: usize,
    /// The PostgreSQL server.
    pub postgres_url: String,
}

/// What one size measured.
#[derive(Debug, Clone)]
pub struct SizeLine {
    instances: usize,
    claimable: usize,
    fill: Duration,
    claim: Vec<f64>,
    claim_any: Vec<f64>,
    misses: usize,
    /// `synchronous_commit` and `fsync` as the store's connection sees them.
    durability: String,
}

fn pct(v: &[f64], p: f64) -> f64 {
    crate::report::percentile(v, p).unwrap_or(f64::NAN)
}

impl SizeLine {
    fn line(&self) -> String {
        format!(
            "claim-latency: instances={} claimable={} fill_s={:.1} claims={} claim_p50_us={:.0} claim_p99_us={:.0} \
             claim_any_p50_us={:.0} claim_any_p99_us={:.0} missed={} {}",
            self.instances,
            self.claimable,
            self.fill.as_secs_f64(),
            self.claim.len(),
            pct(&self.claim, 0.50),
            pct(&self.claim, 0.99),
            pct(&self.claim_any, 0.50),
            pct(&self.claim_any, 0.99),
            self.misses,
            self.durability,
        )
    }
}

fn pg(what: &'static str) -> impl Fn(tokio_postgres::Error) -> String {
    move |e| format!("postgres {what}: {e}")
}

fn now() -> Instant {
    Instant::from_millis(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64),
    )
}

/// Run every size, printing one line each and a ratio line.
pub async fn run(a: &ClaimLatencyArgs) -> Result<(), String> {
    let admin = crate::pgfloor::connect(&a.postgres_url).await?;
    let version: String =
        admin.query_one("SELECT current_setting('server_version')", &[]).await.map_err(pg("version"))?.get(0);
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    eprintln!(
        "claim-latency setup: postgres_server_version={version} cores={cores} sizes={:?} claims={} warmup={WARMUP}",
        a.sizes, a.claims
    );
    let mut lines = Vec::new();
    for &n in &a.sizes {
        let line = measure(&admin, a, n).await?;
        println!("{}", line.line());
        lines.push(line);
    }
    if let (Some(small), Some(large)) = (lines.first(), lines.last()) {
        println!(
            "claim-latency ratio: largest/smallest instances={}/{} claim_p50={:.2} claim_p99={:.2} claim_any_p50={:.2} \
             claim_any_p99={:.2}",
            large.instances,
            small.instances,
            pct(&large.claim, 0.5) / pct(&small.claim, 0.5),
            pct(&large.claim, 0.99) / pct(&small.claim, 0.99),
            pct(&large.claim_any, 0.5) / pct(&small.claim_any, 0.5),
            pct(&large.claim_any, 0.99) / pct(&small.claim_any, 0.99),
        );
    }
    Ok(())
}

async fn measure(admin: &tokio_postgres::Client, a: &ClaimLatencyArgs, n: usize) -> Result<SizeLine, String> {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let schema = format!("claim_latency_{:x}", (nanos as u64) ^ u64::from(std::process::id()));
    let config = PostgresConfig { schema: schema.clone(), pool_size_max: 2, ..PostgresConfig::default() };
    let pool = store_postgres::connect(&a.postgres_url, &config).map_err(|e| format!("connect: {e}"))?;
    let result = async {
        store_postgres::migrate(&pool, &schema).await.map_err(|e| format!("migrate: {e}"))?;
        let store = PostgresWorkflowStore::new(pool.clone(), config.clone()).map_err(|e| e.to_string())?;
        let durability = {
            let c = pool.get().await.map_err(|e| format!("connect: {e}"))?;
            let r = c
                .query_one("SELECT current_setting('synchronous_commit'), current_setting('fsync')", &[])
                .await
                .map_err(pg("settings"))?;
            format!("synchronous_commit={} fsync={}", r.get::<_, String>(0), r.get::<_, String>(1))
        };
        let t0 = now();
        let started = std::time::Instant::now();
        fill(admin, &schema, n, t0).await?;
        admin.batch_execute(&format!("ANALYZE \"{schema}\".workflow_instances")).await.map_err(pg("analyze"))?;
        let fill_time = started.elapsed();
        let mut ids: Vec<WorkflowId> = admin
            .query(
                &format!(
                    "SELECT workflow_id FROM \"{schema}\".workflow_instances WHERE status = 'running' \
                     AND workflow_type = ANY($1)"
                ),
                &[&TYPES[..2].to_vec()],
            )
            .await
            .map_err(pg("claimable ids"))?
            .iter()
            .map(|r| WorkflowId::from(r.get::<_, String>(0)))
            .collect();
        shuffle(&mut ids, nanos as u64);
        if ids.is_empty() {
            return Err(format!("{n} instances hold no claimable one"));
        }
        let claimable = ids.len();
        let mut misses = 0;
        let mut claim = Vec::with_capacity(a.claims);
        for i in 0..WARMUP + a.claims {
            let id = &ids[i % ids.len()];
            let spec = spec(i as u64, i >= WARMUP);
            let t = std::time::Instant::now();
            let won = store.claim(id, &spec).await.map_err(|e| format!("claim {id}: {e}"))?;
            if i >= WARMUP {
                claim.push(t.elapsed().as_secs_f64() * 1e6);
                misses += usize::from(won.is_none());
            }
        }
        let mut claim_any = Vec::with_capacity(a.claims);
        for i in 0..WARMUP + a.claims {
            let spec = spec(i as u64, true);
            let t = std::time::Instant::now();
            let won = store.claim_any(&spec).await.map_err(|e| format!("claim_any: {e}"))?;
            if i >= WARMUP {
                claim_any.push(t.elapsed().as_secs_f64() * 1e6);
                misses += usize::from(won.is_none());
            }
        }
        Ok(SizeLine { instances: n, claimable, fill: fill_time, claim, claim_any, misses, durability })
    }
    .await;
    pool.close();
    let dropped = admin
        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .await
        .map_err(pg("drop the schema"));
    let line = result?;
    dropped?;
    Ok(line)
}

/// A claim by the claimer of the first two types, with a fresh token and a 1 ms lease.
fn spec(k: u64, timed: bool) -> ClaimSpec {
    ClaimSpec {
        now: now(),
        lease_ms: DurationMs::from_millis(1),
        token: format!("tok-{}-{k}", if timed { "t" } else { "w" }).into(),
        types: TYPES[..2].iter().map(|t| t.to_string()).collect(),
    }
}

/// Fisher–Yates with a xorshift generator: a fixed order per seed, no extra crate.
fn shuffle<T>(v: &mut [T], seed: u64) {
    let mut x = seed | 1;
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
}

/// Insert `n` instances in chunks: row `g` is claimable when `g % 20 == 0` (the claimer's
/// types) or `g % 20 == 10` (the other two), waiting when `g % 10 == 1`, else completed.
async fn fill(admin: &tokio_postgres::Client, schema: &str, n: usize, t0: Instant) -> Result<(), String> {
    let names = ["s1", "s2", "s3", "s4"];
    let pending: Vec<Step> = names.iter().map(|s| Step::pending(*s)).collect();
    let done = |s: &str| Step {
        status: StepStatus::Completed,
        attempt: 1,
        elapsed_ms: DurationMs::from_millis(3),
        started_at: Some(t0),
        finished_at: Some(t0),
        ..Step::pending(s)
    };
    let completed: Vec<Step> = names.iter().map(|s| done(s)).collect();
    let mut waiting = completed.clone();
    waiting[1] = Step { status: StepStatus::Waiting, ..Step::pending("s2") };
    waiting[2] = Step::pending("s3");
    waiting[3] = Step::pending("s4");
    let due = Instant::from_millis(t0.as_millis() + 3_600_000);
    let wait = serde_json::to_value(Wait::Timer { step_index: 1, due: Some(due) }).map_err(|e| e.to_string())?;
    let outputs = json!({ "s1": { "ok": true, "step": 1 }, "s2": { "ok": true, "step": 2 },
                          "s3": { "ok": true, "step": 3 }, "s4": { "ok": true, "step": 4 } });
    let json = |v: &Vec<Step>| serde_json::to_value(v).map_err(|e| e.to_string());
    let (pending, completed, waiting) = (json(&pending)?, json(&completed)?, json(&waiting)?);
    let (running_s, waiting_s, completed_s) =
        (WorkflowStatus::Running.as_str(), WorkflowStatus::Waiting.as_str(), WorkflowStatus::Completed.as_str());
    let sql = format!(
        "INSERT INTO \"{schema}\".workflow_instances (workflow_id, biz_key, workflow_type, status, claimable_time, \
           claim_token, business_priority, revision, retry_count, prepare_failures, definition_fingerprint, \
           created_at, updated_at, finished_at, steps, input, output, wait)
         SELECT 'wf-' || g, 'bk-' || g,
           CASE WHEN g % 20 = 0 THEN 'type_' || ((g / 20) % 2) WHEN g % 20 = 10 THEN 'type_' || (2 + (g / 20) % 2)
                ELSE 'type_' || (g % 4) END,
           CASE WHEN g % 10 = 0 THEN '{running_s}' WHEN g % 10 = 1 THEN '{waiting_s}' ELSE '{completed_s}' END,
           CASE WHEN g % 10 = 0 THEN $1::bigint - 60000 - g WHEN g % 10 = 1 THEN $2::bigint END,
           NULL, 2, CASE WHEN g % 10 = 0 THEN 0 WHEN g % 10 = 1 THEN 3 ELSE 5 END, 0, 0, 'fp-claim-latency',
           $1::bigint - 60000, $1::bigint - 60000, CASE WHEN g % 10 > 1 THEN $1::bigint END,
           CASE WHEN g % 10 = 0 THEN $3::jsonb WHEN g % 10 = 1 THEN $4::jsonb ELSE $5::jsonb END,
           jsonb_build_object('i', g),
           CASE WHEN g % 10 = 0 THEN '{{}}'::jsonb WHEN g % 10 = 1 THEN $6::jsonb - 's2' - 's3' - 's4' ELSE $6::jsonb END,
           CASE WHEN g % 10 = 1 THEN $7::jsonb END
         FROM generate_series($8::bigint, $9::bigint) AS g"
    );
    admin.batch_execute("SET statement_timeout = 0").await.map_err(pg("fill settings"))?;
    let stmt = admin.prepare(&sql).await.map_err(pg("prepare the fill"))?;
    let mut lo = 1i64;
    while lo <= n as i64 {
        let hi = (lo + FILL_CHUNK as i64 - 1).min(n as i64);
        admin
            .execute(
                &stmt,
                &[&t0.as_millis(), &due.as_millis(), &pending, &waiting, &completed, &outputs, &wait, &lo, &hi],
            )
            .await
            .map_err(pg("fill"))?;
        lo = hi + 1;
    }
    Ok(())
}
