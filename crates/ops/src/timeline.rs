//! The attempt timeline of one workflow (the console's Gantt chart and `wfk show`): each
//! attempt of each step split into the time it waited for a worker (queue), for a permit
//! (traffic, K-14), for something outside (a timer, a signal, a person) and the time its
//! activity ran. Computed from the projection's attempt rows and the instance alone.

use kernel_core::model::{Instant, WorkflowInstance};
use observer::{AttemptOutcome, AttemptRow};
use serde::Serialize;

/// One attempt of one step on the timeline; every span in milliseconds, all ≥ 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TimelineBar {
    /// Step.
    pub step: String,
    /// Run (replays).
    pub run: u32,
    /// Physical attempt.
    pub attempt: u32,
    /// Latest outcome of the attempt.
    pub outcome: AttemptOutcome,
    /// When the step became ready for this attempt: the end of the bar before it in the
    /// run, or the workflow's creation.
    pub ready_at: Instant,
    /// Ready → running, less the permit wait: waiting for a worker.
    pub queue_ms: i64,
    /// Waiting for a traffic permit.
    pub permit_ms: i64,
    /// The activity running.
    pub execution_ms: i64,
    /// After the activity: waiting on a timer, a signal or a person until the next attempt
    /// started (or until now, for the last one still waiting).
    pub external_ms: i64,
}

/// When an attempt started: its mark-running time, or — when that write was fused with
/// another and never observed alone (K-7.1) — its last change less its activity time.
pub fn started(row: &AttemptRow) -> Instant {
    row.started_at.unwrap_or_else(|| row.updated_at.saturating_sub(row.elapsed_ms))
}

/// Sort attempt rows into timeline order: run, start, the step's place in the instance,
/// attempt.
pub fn sort_attempts(inst: &WorkflowInstance, attempts: &mut [AttemptRow]) {
    let place = |name: &str| inst.steps.iter().position(|s| s.name == name).unwrap_or(usize::MAX);
    attempts.sort_by(|a, b| {
        (a.workflow_run, started(a), place(&a.step_name), a.attempt).cmp(&(
            b.workflow_run,
            started(b),
            place(&b.step_name),
            b.attempt,
        ))
    });
}

/// The bars of `inst` from its attempt rows in [`sort_attempts`] order, one per row.
pub fn timeline(inst: &WorkflowInstance, attempts: &[AttemptRow]) -> Vec<TimelineBar> {
    let mut bars: Vec<TimelineBar> = Vec::with_capacity(attempts.len());
    let mut cursor = inst.created_at;
    let mut run = 0;
    for (i, row) in attempts.iter().enumerate() {
        if row.workflow_run != run {
            run = row.workflow_run;
        }
        let start = started(row);
        let permit_ms = row.traffic_wait_ms.as_millis().max(0);
        let ready_at = if cursor <= start { cursor } else { start };
        let queue_ms = (start.as_millis() - ready_at.as_millis() - permit_ms).max(0);
        let execution_ms = row.elapsed_ms.as_millis().max(0);
        let ran_until = start.as_millis().saturating_add(execution_ms);
        let external_ms = match row.outcome {
            AttemptOutcome::Suspended
            | AttemptOutcome::Yielded
            | AttemptOutcome::Deferred
            | AttemptOutcome::Retrying => {
                let next = attempts[i + 1..]
                    .iter()
                    .find(|r| r.step_name == row.step_name && r.workflow_run == row.workflow_run)
                    .map(|r| started(r).as_millis())
                    .unwrap_or_else(|| inst.updated_at.as_millis());
                (next - ran_until).max(0)
            }
            _ => 0,
        };
        cursor = Instant::from_millis(ran_until.saturating_add(external_ms).max(cursor.as_millis()));
        bars.push(TimelineBar {
            step: row.step_name.clone(),
            run: row.workflow_run,
            attempt: row.attempt,
            outcome: row.outcome,
            ready_at,
            queue_ms,
            permit_ms,
            execution_ms,
            external_ms,
        });
    }
    bars
}
