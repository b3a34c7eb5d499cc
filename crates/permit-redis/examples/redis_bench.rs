//! Throughput of the Redis adapters against the raw `EVALSHA` of the same scripts, with
//! the same connections and concurrency, lanes prefilled and no pipelining on either side.
//! Run by hand, in release:
//!
//! ```text
//! cargo run --release -p permit-redis --example redis_bench
//! ```
//!
//! Server: `--queue <url>`, else `WFK_QUEUE`, else `REDIS_URL`, else `redis://127.0.0.1:6379`,
//! connected through `compose`. Environment: `BENCH_CONNECTIONS` (8), `BENCH_CONCURRENCY`
//! (32), `BENCH_OPS` (50000 pops or permit cycles per measured run). Keys live under a
//! fresh prefix (a `compose` scratch namespace) and are deleted at the end. Each side is measured twice,
//! alternating, and the better run counts.

use compose::{url_from_args, QueueOptions, QueueSide, Role};
use kernel_core::domain::Priority;
use kernel_core::ports::{PermitOwner, Permits, ReadyQueue};
use permit_redis::{PermitLimits, RedisPermits, RedisPermitsConfig};
use queue_redis::{connect_client, LaneWeights, RedisReadyQueue};
use redis::aio::ConnectionManager;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

const NOW: kernel_core::Instant = kernel_core::Instant::from_millis(1_700_000_000_000);
const RESOURCE: &str = "bench";

/// Shape of one benchmark run.
#[derive(Debug, Clone, Copy)]
pub struct BenchOptions {
    /// Connections shared by both sides.
    pub connections: usize,
    /// Concurrent tasks on both sides.
    pub concurrency: usize,
    /// Operations per measured run.
    pub ops: usize,
}

/// Operations per second of both sides.
#[derive(Debug, Clone, Copy)]
pub struct Throughput {
    /// Through the adapter.
    pub adapter_ops_s: f64,
    /// Raw `EVALSHA` of the same script.
    pub raw_evalsha_ops_s: f64,
}

impl Throughput {
    /// `adapter / raw`.
    pub fn ratio(&self) -> f64 {
        self.adapter_ops_s / self.raw_evalsha_ops_s
    }
    /// The report line.
    pub fn line(&self, name: &str) -> String {
        format!(
            "{name}: adapter_ops_s={:.0} raw_evalsha_ops_s={:.0} ratio={:.2}",
            self.adapter_ops_s,
            self.raw_evalsha_ops_s,
            self.ratio()
        )
    }
}

/// Run `ops` operations over `concurrency` tasks; `op(task)` performs one. Returns ops/s.
async fn measure<F, Fut>(opts: BenchOptions, op: F) -> f64
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let left = Arc::new(AtomicUsize::new(opts.ops));
    let started = Instant::now();
    let tasks: Vec<_> = (0..opts.concurrency)
        .map(|t| {
            let (op, left) = (op.clone(), left.clone());
            tokio::spawn(async move {
                while left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_ok() {
                    op(t).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("bench task");
    }
    opts.ops as f64 / started.elapsed().as_secs_f64()
}

async fn prefill(conn: &ConnectionManager, queue: &RedisReadyQueue, members: usize) {
    let weights = queue.weights().weights;
    let total: u32 = weights.iter().sum();
    let mut conn = conn.clone();
    for (lane, w) in weights.iter().enumerate() {
        // Each lane gets its share plus slack, so no lane runs dry and the mix stays 8:6:4:2.
        let n = members * *w as usize / total as usize + 1_000;
        for chunk in (0..n).collect::<Vec<_>>().chunks(1_000) {
            let mut cmd = redis::cmd("ZADD");
            cmd.arg(queue.lane_key(Priority::ALL[lane]));
            for i in chunk {
                cmd.arg(NOW.as_millis()).arg(format!("m{lane}-{i}"));
            }
            cmd.query_async::<i64>(&mut conn).await.expect("prefill");
        }
    }
}

/// Measure both benchmarks on `url`; returns (lane-pop, permit-cycle).
pub async fn run_bench(url: &str, opts: BenchOptions) -> (Throughput, Throughput) {
    assert!(opts.connections > 0 && opts.concurrency > 0 && opts.ops > 0);
    // One scratch namespace; the adapters under test get their own connections to it.
    let side = QueueSide::connect_scratch(url, &QueueOptions::default(), "bench").await.expect("connect");
    let prefix = side.key_prefix().expect("a redis:// url").to_string();
    let client = side.redis_connection().expect("a redis:// url").client().clone();
    let mut conns = Vec::new();
    for _ in 0..opts.connections {
        conns.push(connect_client(client.clone()).await.expect("connect"));
    }
    let queues: Vec<RedisReadyQueue> = conns
        .iter()
        .map(|c| RedisReadyQueue::new(c.clone(), &prefix, LaneWeights::default()).expect("queue"))
        .collect();
    let permits: Vec<RedisPermits> = conns
        .iter()
        .map(|c| {
            RedisPermits::new(c.clone(), RedisPermitsConfig::new(prefix.clone(), PermitLimits::default()))
                .expect("permits")
        })
        .collect();
    queues[0].load_scripts().await.expect("load");
    permits[0].load_scripts().await.expect("load");
    permits[0].set_limits(RESOURCE, PermitLimits::default()).await.expect("limits");

    const RUNS_PER_SIDE: usize = 2;
    let warmup = BenchOptions { ops: (opts.ops / 10).max(1), ..opts };
    // Four measured runs, two warm-ups.
    prefill(&conns[0], &queues[0], opts.ops * 2 * RUNS_PER_SIDE + warmup.ops * 2).await;

    let adapter_pop = |o: BenchOptions| {
        let queues = queues.clone();
        measure(o, move |t| {
            let q = queues[t % queues.len()].clone();
            async move {
                assert_eq!(q.pop_due(NOW, 1).await.expect("pop").len(), 1, "prefilled");
            }
        })
    };
    let raw_pop = |o: BenchOptions| {
        let conns = conns.clone();
        let cmd = Arc::new(queues[0].raw_pop_command(NOW, 1));
        measure(o, move |t| {
            let mut c = conns[t % conns.len()].clone();
            let cmd = cmd.clone();
            async move {
                assert_eq!(cmd.query_async::<Vec<String>>(&mut c).await.expect("evalsha").len(), 1, "prefilled");
            }
        })
    };
    let owners: Arc<Vec<PermitOwner>> = Arc::new(
        (0..opts.concurrency)
            .map(|t| PermitOwner {
                workflow_id: format!("wf-{t}").into(),
                step: "call".into(),
                claim_token: format!("c-{t}").into(),
            })
            .collect(),
    );
    let adapter_cycle = |o: BenchOptions| {
        let (permits, owners) = (permits.clone(), owners.clone());
        measure(o, move |t| {
            let p = permits[t % permits.len()].clone();
            let owners = owners.clone();
            async move {
                let owner = &owners[t];
                p.acquire(RESOURCE, owner).await.expect("acquire");
                p.release(RESOURCE, owner).await.expect("release");
            }
        })
    };
    let raw_cycle = |o: BenchOptions| {
        let conns = conns.clone();
        let cmds: Arc<Vec<(redis::Cmd, redis::Cmd)>> = Arc::new(
            owners
                .iter()
                .map(|ow| (permits[0].raw_acquire_command(RESOURCE, ow), permits[0].raw_release_command(RESOURCE, ow)))
                .collect(),
        );
        measure(o, move |t| {
            let mut c = conns[t % conns.len()].clone();
            let cmds = cmds.clone();
            async move {
                let (acquire, release) = &cmds[t];
                acquire.query_async::<redis::Value>(&mut c).await.expect("evalsha acquire");
                release.query_async::<i64>(&mut c).await.expect("evalsha release");
            }
        })
    };

    adapter_pop(warmup).await;
    raw_pop(warmup).await;
    let (mut a, mut r) = (0f64, 0f64);
    for _ in 0..RUNS_PER_SIDE {
        a = a.max(adapter_pop(opts).await);
        r = r.max(raw_pop(opts).await);
    }
    let pop = Throughput { adapter_ops_s: a, raw_evalsha_ops_s: r };

    adapter_cycle(warmup).await;
    raw_cycle(warmup).await;
    let (mut a, mut r) = (0f64, 0f64);
    for _ in 0..RUNS_PER_SIDE {
        a = a.max(adapter_cycle(opts).await);
        r = r.max(raw_cycle(opts).await);
    }
    let cycle = Throughput { adapter_ops_s: a, raw_evalsha_ops_s: r };
    assert!(permits[0].holders(RESOURCE).await.expect("holders").is_empty(), "every permit released");
    side.destroy().await.expect("delete the bench keys");
    (pop, cycle)
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[allow(dead_code)]
#[tokio::main]
async fn main() {
    let opts = BenchOptions {
        connections: env_usize("BENCH_CONNECTIONS", 8),
        concurrency: env_usize("BENCH_CONCURRENCY", 32),
        ops: env_usize("BENCH_OPS", 50_000),
    };
    let (url, _) = url_from_args(Role::Queue, std::env::args().skip(1), |k| std::env::var(k).ok(), &["REDIS_URL"])
        .expect("--queue <url>");
    let url = url.unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    println!(
        "redis_bench: {} connections, {} tasks, {} ops per run, best of 2 alternating runs per side",
        opts.connections, opts.concurrency, opts.ops
    );
    let (pop, cycle) = run_bench(&url, opts).await;
    println!("{}", pop.line("lane-pop"));
    println!("{}", cycle.line("permit-cycle"));
}
