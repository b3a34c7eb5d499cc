//! The soak: worker processes on PostgreSQL and a Redis of its own under a mixed load
//! (linear, durable sleeps, signals, fan-out, a permit ceiling shared by every process)
//! while processes are killed and restarted, one is stopped past its leases, and (with
//! `--redis-restart`) Redis is restarted; judged from the store and an oracle file after
//! every process stopped (see the `soak` module). Exits non-zero when a count
//! is wrong.
//!
//! Run: `cargo run -p soak -- [--store postgres://postgres@127.0.0.1:5432/test] [--processes 4] [--workflows 2000] [--redis-restart] [--cap-secs 120]`
//! By hand: `--long` (100 000 workflows, a CSV of throughput and step latency per 10 s).

use std::process::ExitCode;

mod soak;

fn main() -> ExitCode {
    kernel_examples::real::supervisor_main("soak", soak::worker, soak::run)
}
