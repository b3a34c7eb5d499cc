//! The README's first command: the live-summary story.
//!
//! By default (with this package's `durable` feature) it runs **for real**: worker
//! processes (this binary re-executed with the argument `worker`) on a durable store, one
//! killed with SIGKILL in the middle of a step, another stopped with SIGSTOP past its lease
//! and continued, whose late write the store refuses. `--store <url>`/`--queue <url>` (or
//! `WFK_STORE`/`WFK_QUEUE`) choose where; see `kernel_examples::real`.
//!
//! `--simulated` plays the same story in memory, in simulated time, in one process: four
//! workers A–D share the work; the worker composing the first summary dies mid-compose,
//! after its business write but before its CompleteStep; another worker takes over after
//! the lease, the compose activity short-circuits on the business fact, and the dead
//! worker's late write is fenced.
//!
//! Run: `cargo run -p kernel-examples --example live_summary [-- --simulated]`

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let simulated = match args.iter().position(|a| a == "--simulated") {
        Some(i) => {
            args.remove(i);
            true
        }
        // Without a durable driver in this build, the story can only be told in memory.
        None => !cfg!(feature = "durable"),
    };
    // The simulated story replays exactly on one thread; real processes use all cores.
    let runtime = if simulated {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().enable_all().build()
    };
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("live_summary: no runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        if args.first().map(String::as_str) == Some(kernel_examples::real::WORKER_ARG) {
            let worker = kernel_examples::real::WorkerArgs::parse(args.split_off(1))?;
            return kernel_examples::real::demo::worker(worker).await;
        }
        if simulated {
            if !cfg!(feature = "durable") {
                println!("(this build has no durable driver: the story in memory, in simulated time; build with `--features durable` for real processes)");
            }
            let world = testkit::harness::World::with_limits(42, kernel_examples::story::limits());
            return kernel_examples::story::run(world).await;
        }
        kernel_examples::real::demo::run(args).await
    });
    kernel_examples::real::exit_code("live_summary", result.map(|()| true))
}
