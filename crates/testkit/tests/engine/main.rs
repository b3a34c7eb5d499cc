//! Engine behaviour on the in-memory adapters, in simulated time.

mod agent;
mod bad_input;
mod behaviour;
mod bulk_start;
mod clock_skew;
mod compensation;
mod compensation_progress;
mod control;
mod dead_letter_decisions;
mod dispatch_lease;
mod events;
mod hardening;
mod harness;
mod health;
mod heartbeat_driver;
mod hot_path_counts;
mod human;
mod human_outcomes;
mod intercept;
mod lease_loss;
mod lost_attempts;
mod lost_replies;
mod maintenance_hardening;
mod mocks;
mod model;
mod model_steps;
mod operator_actions;
mod operator_races;
mod refused;
mod renewal;
mod round_trips;
mod side_ports;
mod standalone_publisher;
mod stored_errors;
mod stream_fencing;
mod undecodable_signals;
mod write_budget;

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
