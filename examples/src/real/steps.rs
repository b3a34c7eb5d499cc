//! The activities the real-process runs build their workflows from ([`super::crash`],
//! the soak in `examples/soak`): a side effect recorded in the oracle file, a durable sleep and a
//! signal wait. Every one returns `{"attempt", "token"}` of the entry that wrote its output,
//! which [`super::oracle::judge`] reads to tell a fresh completion from a stale one.
//!
//! # Oracle lines
//!
//! - an **effect** (`{"key", "wf", "step", "attempt", "token", "pid", "t"}`): written by
//!   [`EffectStep`] before it returns, the side effect itself under the K-17.1 key;
//! - a **hold** (`{"hold": "start"|"end", "id", "res", "pid", "t", …}`): written by an
//!   [`EffectStep`] that runs under a traffic permit (K-14), at its first instruction and
//!   when it ends however it ends (returned, failed or dropped). The activity runs inside
//!   the permit (acquired before the call, released after it), so the spans of these lines
//!   never exceed what the permit covered. A process killed inside the activity writes no
//!   `end`: the reader takes the kill time. Hold lines carry no `key`, so they are never
//!   read as effects.

use super::{wall_ms, Oracle};
use kernel_core::{ActivityContext, ActivityError, ResumeKind, StepOutcome};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A transient activity error from anything displayable.
pub fn transient(e: impl std::fmt::Display) -> ActivityError {
    ActivityError::transient(e.to_string())
}

/// `extra` (a JSON object) with `{"attempt", "token"}` of the entry added.
pub fn stamped(ctx: &ActivityContext, extra: Value) -> Value {
    let mut v = json!({ "attempt": ctx.attempt(), "token": ctx.claim_token() });
    if let (Some(m), Value::Object(e)) = (v.as_object_mut(), extra) {
        m.extend(e);
    }
    v
}

/// The oracle line of an effect of this entry (see the module's docs).
pub fn effect_line(ctx: &ActivityContext) -> Value {
    json!({
        "key": ctx.idempotency_key(),
        "wf": ctx.workflow_id(),
        "step": ctx.step_name(),
        "attempt": ctx.attempt(),
        "token": ctx.claim_token(),
        "pid": std::process::id(),
        "t": wall_ms(),
    })
}

/// The signal id of workflow `wf`'s `go` signal (stable: a redelivery reuses it).
pub fn go_signal_id(wf: &str) -> String {
    format!("go:{wf}")
}

/// A side effect under the step's K-17.1 key, recorded in the oracle, then `work` of
/// simulated work (so a kill often lands inside the step, after its effect). With a
/// resource, the activity also records its span as a holder of that resource's permit.
pub struct EffectStep {
    oracle: Arc<Oracle>,
    work: Duration,
    hold: Option<String>,
}

impl EffectStep {
    /// An effect followed by `work_ms` of work.
    pub fn new(oracle: Arc<Oracle>, work_ms: u64) -> Self {
        EffectStep { oracle, work: Duration::from_millis(work_ms), hold: None }
    }

    /// Record the activity's span as a holder of `resource` (the step must declare it).
    pub fn holding(mut self, resource: &str) -> Self {
        self.hold = Some(resource.to_string());
        self
    }
}

/// The `end` of a hold line, written when dropped.
struct HoldMark {
    oracle: Arc<Oracle>,
    id: String,
}

impl HoldMark {
    fn start(oracle: &Arc<Oracle>, resource: &str, ctx: &ActivityContext) -> std::io::Result<HoldMark> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let id = format!("{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        oracle.append(&json!({
            "hold": "start",
            "id": id,
            "res": resource,
            "wf": ctx.workflow_id(),
            "step": ctx.step_name(),
            "token": ctx.claim_token(),
            "pid": std::process::id(),
            "t": wall_ms(),
        }))?;
        Ok(HoldMark { oracle: oracle.clone(), id })
    }
}

impl Drop for HoldMark {
    fn drop(&mut self) {
        let line = json!({ "hold": "end", "id": self.id, "pid": std::process::id(), "t": wall_ms() });
        // Nothing to do about a failed write here: the reader then ends the span at the
        // process's end, which only lengthens it.
        let _ = self.oracle.append(&line);
    }
}

#[async_trait::async_trait]
impl kernel_core::Activity for EffectStep {
    async fn run(&self, ctx: ActivityContext) -> Result<StepOutcome, ActivityError> {
        let _held = match &self.hold {
            Some(resource) => Some(HoldMark::start(&self.oracle, resource, &ctx).map_err(transient)?),
            None => None,
        };
        // The side effect, under the K-17.1 key; then some work.
        self.oracle.append(&effect_line(&ctx)).map_err(transient)?;
        tokio::time::sleep(self.work).await;
        Ok(StepOutcome::complete(stamped(&ctx, json!({}))))
    }
}

/// A durable sleep of the input's `sleep_ms` (default 300), completed on the next entry.
pub async fn nap(ctx: ActivityContext) -> Result<StepOutcome, ActivityError> {
    if ctx.checkpoint().is_none() {
        let ms = ctx.input().get("sleep_ms").and_then(Value::as_i64).unwrap_or(300);
        return Ok(StepOutcome::sleep(ms, json!({ "slept": ms })));
    }
    Ok(StepOutcome::complete(stamped(&ctx, json!({}))))
}

/// A wait for the workflow's `go` signal (keyed by the workflow id); its output carries the
/// signal id that woke it.
pub async fn await_go(ctx: ActivityContext) -> Result<StepOutcome, ActivityError> {
    let woken = ctx
        .resume()
        .filter(|r| r.kind == ResumeKind::Signal && r.step_index as usize == ctx.step_index())
        .and_then(|r| r.signal_id.clone());
    match woken {
        Some(signal_id) => Ok(StepOutcome::complete(stamped(&ctx, json!({ "signal_id": signal_id })))),
        None => Ok(StepOutcome::wait_for_signal("go", ctx.workflow_id()).into()),
    }
}
