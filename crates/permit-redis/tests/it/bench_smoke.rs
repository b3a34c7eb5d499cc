//! A debug smoke run of the benchmark with tiny counts: it runs end to end, pops only
//! prefilled members and leaves no permit held. Its numbers mean nothing.

#[allow(dead_code)]
#[path = "../../examples/redis_bench.rs"]
mod redis_bench;

use redis_conn::test_support::require_redis;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_runs_end_to_end() {
    let Some(url) = require_redis("bench_runs_end_to_end") else { return };
    let opts = redis_bench::BenchOptions { connections: 2, concurrency: 4, ops: 200 };
    let (pop, cycle) = redis_bench::run_bench(&url, opts).await;
    for t in [pop, cycle] {
        assert!(t.adapter_ops_s > 0.0 && t.raw_evalsha_ops_s > 0.0 && t.ratio().is_finite());
    }
    assert!(pop.line("lane-pop").starts_with("lane-pop: adapter_ops_s="));
}
