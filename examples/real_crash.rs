//! The real-crash run: worker processes on one durable store, one killed with SIGKILL
//! repeatedly, one stopped with SIGSTOP past its lease and continued, while hundreds of
//! workflows with durable sleeps and signals run; judged from the store and an oracle
//! file after every process stopped (see `kernel_examples::real::crash`). Exits non-zero
//! when a count is wrong.
//!
//! Run: `cargo run -p kernel-examples --example real_crash -- [--store <url>] [--queue <url>] [--processes 3] [--workflows 200] [--kills 3] [--stops 1]`

use std::process::ExitCode;

fn main() -> ExitCode {
    use kernel_examples::real::{crash, supervisor_main};
    supervisor_main("real_crash", crash::worker, crash::run)
}
