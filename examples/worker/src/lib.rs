//! A production-shaped deployment of the kernel: a worker process, a separate publisher
//! and a status reader, all configured by `--store <url>` and `--queue <url>` (or
//! `WFK_STORE` / `WFK_QUEUE`) through [`compose`].
//!
//! ```text
//! cargo run -p worker --bin worker  -- --store mongodb://127.0.0.1:27017/wfk --queue redis://127.0.0.1:6379
//! cargo run -p worker --bin publish -- --store mongodb://127.0.0.1:27017/wfk --queue redis://127.0.0.1:6379
//! cargo run -p worker --bin status  -- --store mongodb://127.0.0.1:27017/wfk --queue redis://127.0.0.1:6379 --workflow <id>
//! ```
//!
//! The worker runs [`definition`] on the wall clock with the observer as its observation
//! sink (drained by a shutdown hook, K-6.6) and stops gracefully on SIGTERM or Ctrl-C
//! (K-6.6): it exits 0 when every running claim finished within the shutdown timeout.

use kernel_core::domain::DurationMs;
use kernel_core::engine::EngineConfig;
use kernel_core::PlanRegistry;
use kernel_core::{ActivityContext, Definition, StepDef, StepOutcome};
use serde_json::json;

/// The workflow type the worker registers and the publisher starts.
pub const WORKFLOW_TYPE: &str = "parcel";
/// The durable sleep of the `cool_off` step.
pub const COOL_OFF_MS: i64 = 2_000;

/// A parcel: `reserve` → `cool_off` (one durable sleep of [`COOL_OFF_MS`]; the worker
/// holds no claim meanwhile, K-8) → `ship`.
pub fn definition() -> Definition {
    let reserve = |ctx: ActivityContext| async move {
        tracing::info!(workflow = ctx.workflow_id(), "reserving the parcel");
        Ok(StepOutcome::complete(json!({ "reserved": ctx.input().get("parcel").cloned() })))
    };
    let cool_off = |ctx: ActivityContext| async move {
        if ctx.checkpoint().is_none() {
            tracing::info!(workflow = ctx.workflow_id(), sleep_ms = COOL_OFF_MS, "cooling off (durable sleep)");
            return Ok(StepOutcome::sleep(COOL_OFF_MS, json!({ "slept": true })));
        }
        Ok(StepOutcome::complete(json!("cooled")))
    };
    let ship = |ctx: ActivityContext| async move {
        tracing::info!(workflow = ctx.workflow_id(), "shipping the parcel");
        Ok(StepOutcome::complete(json!({ "shipped": true })))
    };
    Definition::builder(WORKFLOW_TYPE)
        .step(StepDef::new("reserve", reserve))
        .step(StepDef::new("cool_off", cool_off).depends_on(["reserve"]))
        .step(StepDef::new("ship", ship).depends_on(["cool_off"]))
        .build()
        .expect("the parcel definition is valid")
}

/// The plans a publisher needs: [`definition`]'s, no activities (K-4.1).
pub fn plans() -> PlanRegistry {
    let mut plans = PlanRegistry::default();
    plans.register(definition().plan().clone());
    plans
}

/// The worker's settings: polling every second and a maintenance pass (timers, rebuild scan) every two, so a demo
/// finishes in seconds; everything else as [`EngineConfig::default`].
pub fn config(worker_id: &str) -> EngineConfig {
    EngineConfig {
        worker_id: worker_id.to_string(),
        poll_interval_ms: DurationMs::from_millis(1_000),
        rebuild_interval_ms: DurationMs::from_millis(2_000),
        ..EngineConfig::default()
    }
}

/// Log to stderr (`RUST_LOG` filters; default `info`), so stdout holds only results.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).init();
}

/// Read `--<name> <value>` (or `--<name>=<value>`) out of `args`.
pub fn take_flag(args: &mut Vec<String>, name: &str) -> Option<String> {
    let flag = format!("--{name}");
    let at = args.iter().position(|a| *a == flag || a.starts_with(&format!("{flag}=")))?;
    let arg = args.remove(at);
    match arg.split_once('=') {
        Some((_, v)) => Some(v.to_string()),
        None if at < args.len() => Some(args.remove(at)),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_publisher_knows_the_workers_plan() {
        let plan = plans().get(WORKFLOW_TYPE).unwrap().clone();
        assert_eq!(plan.fingerprint(), definition().plan().fingerprint());
        assert_eq!(plan.steps().len(), 3);
    }

    #[test]
    fn flags_are_taken_out() {
        let mut args: Vec<String> = ["--workflow", "wf-1", "--destroy", "--x=1"].map(String::from).to_vec();
        assert_eq!(take_flag(&mut args, "workflow").as_deref(), Some("wf-1"));
        assert_eq!(take_flag(&mut args, "x").as_deref(), Some("1"));
        assert_eq!(take_flag(&mut args, "absent"), None);
        assert_eq!(args, ["--destroy"]);
    }
}
