//! Engine behaviour on the in-memory adapters, in simulated time, one module per behaviour.

mod agents;
mod claims_and_leases;
mod compensation;
mod control;
mod costs;
mod dispatch;
mod events;
mod harness;
mod human_tasks;
mod intercept;
mod interleavings;
mod maintenance;
mod model_steps;
mod operator_actions;
mod permits;
mod port_deadlines;
mod retries_and_errors;
mod starts_and_queues;
mod support;
mod waits_and_signals;

use kernel_core::{ActivityContext, Definition, StepDef, StepOutcome};
use serde_json::json;

/// A linear workflow of `n` steps that complete at once.
pub fn linear(name: &str, n: usize, success_finalizer: bool) -> Definition {
    let mut b = Definition::builder(name);
    for i in 0..n {
        b = b.step(StepDef::new(format!("s{i}"), move |_ctx: ActivityContext| async move {
            Ok(StepOutcome::complete(json!(i)))
        }));
    }
    if success_finalizer {
        b = b.success_finalizer(|_ctx: ActivityContext| async { Ok(StepOutcome::complete(json!(null))) });
    }
    b.build().expect("valid")
}
