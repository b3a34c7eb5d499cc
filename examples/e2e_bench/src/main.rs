//! # e2e-bench
//!
//! End to end, by hand (never in CI): the engine on a store with the Redis lanes and
//! doorbell, against a raw Lua-script floor doing the same four-step protocol on Redis alone,
//! on the same Redis, alternating; one `e2e-bench:` line per run and a `median:` line.
//!
//! ```text
//! cargo run --release -p e2e-bench -- --runs 3 | tee e2e.txt
//! cargo run --release -p e2e-bench -- --store mongo-wire      # MONGODB_URI from scripts/mongo-wire.sh
//! cargo run --release -p e2e-bench -- plot --input e2e.txt --out docs/bench/e2e.png
//! cargo run --release -p e2e-bench -- plot-soak --input soak-long.csv --scaling soak-scaling.txt --out docs/bench/soak.png
//! cargo run --release -p e2e-bench -- claim-latency            # store-postgres, 1k/100k/1M instances
//! ```
//!
//! What a run measures, per side:
//! - a burst: N workflows started at once (bounded concurrency), timed from the first start
//!   to the last terminal write, seen by a store decorator (engine) or by the worker that
//!   wrote the last step (floor); afterwards the store (or Redis) is read back and every
//!   workflow must be completed with all its steps;
//! - CPU per workflow over the burst: this process (getrusage) plus the Redis server
//!   (`INFO cpu`), since the floor works inside Redis; the process share alone is printed too;
//! - K one-at-a-time workflows: start → terminal write, p50 and p99;
//! - applied guarded writes per workflow (claim and steps, not the create).
//!
//! `--store postgres` puts the engine on store-postgres (a scratch schema via compose) and
//! replaces the Lua floor with the raw PostgreSQL floor ([`pgfloor`]), both in a fresh
//! database that is dropped at the end; its lines add statements and commits per step
//! (statements counted client side, commits from `pg_stat_database`).
//!
//! See BENCHMARKS.md ("End to end: engine vs raw Lua floor", "End to end on PostgreSQL")
//! for the recorded runs.

mod args;
mod claimlat;
mod counting;
mod cpu;
mod engine_side;
mod floor;
mod pgfloor;
mod pgstat;
mod plot;
mod report;
mod soakplot;

use args::{BenchArgs, Command, StoreKind};
use cpu::CpuSnapshot;
use engine_side::{EngineBench, STEPS};
use floor::FloorBench;
use pgfloor::PgFloor;
use pgstat::PgStat;
use report::{percentile, RunLine, Side};
use std::process::ExitCode;
use std::time::Duration;

/// What one burst measured.
#[derive(Debug, Clone, Copy)]
pub struct Burst {
    /// First start → last terminal write.
    pub elapsed: Duration,
    /// CPU over the burst.
    pub cpu: CpuSnapshot,
    /// Applied guarded writes.
    pub writes: u64,
    /// Statements sent (counted client side), where counted.
    pub statements: Option<u64>,
    /// Transactions the server committed in the bench database (`pg_stat_database`), where
    /// counted.
    pub commits: Option<u64>,
}

/// How long a burst of `n` may take before the run is declared stuck.
pub fn burst_timeout(n: usize) -> Duration {
    Duration::from_secs(60) + Duration::from_millis(50) * n as u32
}

fn side(n: usize, burst: Burst, singles: &[f64]) -> Side {
    let per = |v: f64| v / n as f64;
    Side {
        wf_s: n as f64 / burst.elapsed.as_secs_f64(),
        cpu_us_per_wf: per(burst.cpu.total_us()),
        proc_cpu_us_per_wf: per(burst.cpu.process_us),
        single_p50_ms: percentile(singles, 0.50).unwrap_or(f64::NAN),
        single_p99_ms: percentile(singles, 0.99).unwrap_or(f64::NAN),
        writes_per_wf: per(burst.writes as f64),
        stmts_per_step: burst.statements.map(|x| per(x as f64) / STEPS as f64),
        commits_per_step: burst.commits.map(|x| per(x as f64) / STEPS as f64),
    }
}

async fn measure_engine(
    a: &BenchArgs,
    tag: &str,
    n: usize,
    singles: usize,
    redis: &mut Conn,
    stat: Option<&PgStat>,
) -> Result<Side, String> {
    let bench = EngineBench::open(a).await?;
    let measured = async {
        // Commits and statements over the same window: from a settled counter before the
        // burst to a settled one after it.
        let c0 = match stat {
            Some(s) => Some((s.settled_commits().await?, bench.statements())),
            None => None,
        };
        let (mut burst, ids) = bench.burst(tag, n, a.start_batches, redis).await?;
        if let (Some(s), Some((c0, s0))) = (stat, c0) {
            burst.commits = Some(s.settled_commits().await? - c0);
            burst.statements = bench.statements().zip(s0).map(|(s1, s0)| s1 - s0);
        }
        // After the counters: the check reads every instance back, one statement each.
        bench.check_completed(&ids).await?;
        let lat = bench.singles(tag, singles).await?;
        Ok::<_, String>(side(n, burst, &lat))
    }
    .await;
    let closed = bench.close().await;
    let s = measured?;
    closed?;
    Ok(s)
}

async fn measure_pg_floor(
    a: &BenchArgs,
    tag: &str,
    n: usize,
    singles: usize,
    redis: &mut Conn,
    stat: &PgStat,
) -> Result<Side, String> {
    let bench = PgFloor::open(&a.postgres_url, tag, a.slots, a.start_batches).await?;
    let measured = async {
        let (c0, s0) = (stat.settled_commits().await?, bench.statements());
        let (mut burst, ids) = bench.burst(tag, n, a.start_batches, redis).await?;
        burst.commits = Some(stat.settled_commits().await? - c0);
        burst.statements = bench.statements().zip(s0).map(|(s1, s0)| s1 - s0);
        bench.check_completed(&ids).await?;
        let lat = bench.singles(tag, singles).await?;
        Ok::<_, String>(side(n, burst, &lat))
    }
    .await;
    let closed = bench.close().await;
    let s = measured?;
    closed?;
    Ok(s)
}

async fn measure_floor(
    a: &BenchArgs,
    tag: &str,
    n: usize,
    singles: usize,
    redis: &mut Conn,
    stat: Option<&PgStat>,
) -> Result<Side, String> {
    if let Some(stat) = stat {
        return measure_pg_floor(a, tag, n, singles, redis, stat).await;
    }
    let bench = FloorBench::open(&a.redis_url, a.floor_connections, a.slots).await?;
    let measured = async {
        let burst = bench.burst(tag, n, a.start_batches, redis).await?;
        let lat = bench.singles(tag, singles).await?;
        Ok::<_, String>(side(n, burst, &lat))
    }
    .await;
    let closed = bench.close().await;
    let s = measured?;
    closed?;
    Ok(s)
}

type Conn = redis::aio::MultiplexedConnection;

async fn bench(mut a: BenchArgs) -> Result<(), String> {
    // `--store postgres`: everything in a fresh database, so that its commit counter counts
    // only this run's transactions; dropped at the end.
    let stat = match a.store {
        StoreKind::Postgres => {
            let (stat, url) = PgStat::create(&a.postgres_url).await?;
            a.postgres_url = url;
            Some(stat)
        }
        _ => None,
    };
    let result = bench_in(&a, stat.as_ref()).await;
    if let Some(stat) = stat {
        let dropped = stat.drop_database().await;
        result?;
        return dropped;
    }
    result
}

async fn bench_in(a: &BenchArgs, stat: Option<&PgStat>) -> Result<(), String> {
    let client = redis::Client::open(a.redis_url.as_str()).map_err(|e| format!("redis url: {e}"))?;
    let mut redis = floor::connect(&client).await?;
    let info: String =
        redis::cmd("INFO").arg("server").query_async(&mut redis).await.map_err(|e| format!("redis INFO: {e}"))?;
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    eprintln!(
        "e2e-bench setup: store={} redis_version={} cores={cores} workflows={} slots={} singles={} runs={} \
         floor={} floor_connections={} start_batches={} warmup={}{} ({})",
        a.store.label(),
        cpu::info_field(&info, "redis_version").unwrap_or("?"),
        a.workflows,
        a.slots,
        a.singles,
        a.runs,
        a.floor,
        a.floor_connections,
        a.start_batches,
        a.warmup,
        match stat {
            Some(s) => s.setup_fields().await?,
            None => String::new(),
        },
        match a.store {
            StoreKind::Sqlite =>
                "engine: store and local coordination in one SQLite file, synchronous=FULL; Redis idle",
            _ => "engine: one multiplexed Redis connection + one pub/sub",
        },
    );
    let run_id = format!(
        "{:x}",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis())
    );
    if a.warmup > 0 {
        let n = a.warmup.min(a.workflows);
        measure_engine(a, &format!("w{run_id}-e"), n, 0, &mut redis, stat).await?;
        if a.floor {
            measure_floor(a, &format!("w{run_id}-f"), n, 0, &mut redis, stat).await?;
        }
    }
    let mut lines = Vec::new();
    for run in 1..=a.runs {
        // Alternate which side goes first, so neither always inherits the other's leftovers.
        let floor_first = run % 2 == 0;
        let (etag, ftag) = (format!("r{run_id}-{run}-e"), format!("r{run_id}-{run}-f"));
        let mut floor = None;
        if a.floor && floor_first {
            floor = Some(measure_floor(a, &ftag, a.workflows, a.singles, &mut redis, stat).await?);
        }
        let engine = measure_engine(a, &etag, a.workflows, a.singles, &mut redis, stat).await?;
        if a.floor && !floor_first {
            floor = Some(measure_floor(a, &ftag, a.workflows, a.singles, &mut redis, stat).await?);
        }
        let line = RunLine {
            store: a.store.label().to_string(),
            workflows: a.workflows,
            steps: STEPS,
            slots: a.slots,
            engine,
            floor,
        };
        println!("{}", line.line());
        lines.push(line);
    }
    if let Some(m) = RunLine::median_line(&lines) {
        println!("{m}");
    }
    Ok(())
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let command = match args::parse(&argv, |k| std::env::var(k).ok()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("e2e-bench: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match command {
        Command::Help => {
            print!("{}", args::USAGE);
            Ok(())
        }
        Command::Plot(p) => plot::run(&p).map(|n| eprintln!("e2e-bench: plotted {n} lines into {}", p.out.display())),
        Command::PlotSoak(p) => soakplot::run(&p).map(|(windows, runs)| {
            eprintln!("e2e-bench: plotted {windows} windows and {runs} scaling runs into {}", p.out.display())
        }),
        Command::Bench(b) => match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
            Ok(rt) => rt.block_on(bench(b)),
            Err(e) => Err(format!("runtime: {e}")),
        },
        Command::ClaimLatency(c) => match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
            Ok(rt) => rt.block_on(claimlat::run(&c)),
            Err(e) => Err(format!("runtime: {e}")),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("e2e-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
