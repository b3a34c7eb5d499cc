//! The real-crash run: worker processes on one durable store, one killed with SIGKILL
//! repeatedly, one stopped with SIGSTOP past its lease and continued, while hundreds of
//! workflows with durable sleeps and signals run; judged from the store and an oracle
//! file after every process stopped (see `kernel_examples::real::crash`). Exits non-zero
//! when a count is wrong.
//!
//! Run: `cargo run -p kernel-examples --example real_crash -- [--store <url>] [--queue <url>] [--processes 3] [--workflows 200] [--kills 3] [--stops 1]`

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("real_crash: no runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        if args.first().map(String::as_str) == Some(kernel_examples::real::WORKER_ARG) {
            let worker = kernel_examples::real::WorkerArgs::parse(args.split_off(1))?;
            return kernel_examples::real::crash::worker(worker).await.map(|()| true);
        }
        kernel_examples::real::crash::run(args).await
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            let mut msg = e.to_string();
            let mut cause = e.source();
            while let Some(c) = cause {
                msg.push_str(&format!(": {c}"));
                cause = c.source();
            }
            eprintln!("real_crash: {msg}");
            ExitCode::FAILURE
        }
    }
}
