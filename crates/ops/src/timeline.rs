//! The attempt timeline of one workflow (the console's Gantt chart and `wfk show`): each
//! attempt of each step split into the time it waited for a worker (queue), for a permit
//! (traffic, K-14), for something outside (a timer, a signal, a person) and the time its
//! activity ran. Computed from the projection's attempt rows and the instance alone.

use kernel_core::domain::{Instant, WorkflowInstance};
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
/// `truncated`: the rows are only the newest of more, so the first bar's ready time is its
/// own start (its queue wait is unknown) rather than the workflow's creation.
pub fn timeline(inst: &WorkflowInstance, attempts: &[AttemptRow], truncated: bool) -> Vec<TimelineBar> {
    let mut bars: Vec<TimelineBar> = Vec::with_capacity(attempts.len());
    let mut cursor = match (truncated, attempts.first()) {
        (true, Some(first)) => started(first),
        _ => inst.created_at,
    };
    let mut run = attempts.first().map_or(0, |a| a.workflow_run);
    for (i, row) in attempts.iter().enumerate() {
        let start = started(row);
        if row.workflow_run != run {
            // A new run (a replay): it became ready when the operator or a dispatcher
            // replayed it, which no row records; its first bar starts at its own start.
            run = row.workflow_run;
            cursor = start;
        }
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
            // An attempt that waited (a signal, a timer, a person) and resumed keeps its
            // first start: what it did not spend running before it ended was the wait.
            _ => (row.updated_at.as_millis() - ran_until).max(0),
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

#[cfg(test)]
mod tests {
    use super::*;
    use kernel_core::domain::DurationMs;

    fn row(
        step: &str,
        run: u32,
        outcome: AttemptOutcome,
        start: i64,
        end: i64,
        elapsed: i64,
        permit: i64,
    ) -> AttemptRow {
        AttemptRow {
            biz_key: "b".into(),
            workflow_run: run,
            step_name: step.into(),
            attempt: 1,
            workflow_id: "wf-b".into(),
            workflow_type: "t".into(),
            outcome,
            revision: 1,
            started_at: Some(Instant::from_millis(start)),
            updated_at: Instant::from_millis(end),
            elapsed_ms: DurationMs::from_millis(elapsed),
            traffic_wait_ms: DurationMs::from_millis(permit),
            error_class: None,
            worker_id: None,
        }
    }

    fn inst(created: i64, updated: i64) -> WorkflowInstance {
        let mut i: WorkflowInstance = serde_json::from_value(serde_json::json!({
            "workflow_id": "wf-b", "workflow_type": "t", "biz_key": "b", "status": "completed",
            "steps": [], "input": {}, "definition_fingerprint": "f", "business_priority": 2,
            "retry_count": 1, "revision": 9, "created_at": 0, "updated_at": 0
        }))
        .expect("an instance");
        i.created_at = Instant::from_millis(created);
        i.updated_at = Instant::from_millis(updated);
        i
    }

    #[test]
    fn queue_permit_execution_and_external_wait_are_told_apart() {
        // created at 0; `a` waits 100 ms for a worker, 50 for a permit, runs 20;
        // `review` starts at 200, runs 10, waits for a person until 5 000, completes;
        // run 1 (a replay 60 s later) starts at 65 000: no queue wait invented.
        let rows = [
            row("a", 0, AttemptOutcome::Completed, 150, 170, 20, 50),
            row("review", 0, AttemptOutcome::Completed, 200, 5_000, 10, 0),
            row("a", 1, AttemptOutcome::Failed, 65_000, 65_030, 30, 0),
        ];
        let bars = timeline(&inst(0, 65_030), &rows, false);
        let spans: Vec<(i64, i64, i64, i64)> =
            bars.iter().map(|b| (b.queue_ms, b.permit_ms, b.execution_ms, b.external_ms)).collect();
        assert_eq!(spans, [(100, 50, 20, 0), (30, 0, 10, 4_790), (0, 0, 30, 0)]);
        assert!(bars.iter().all(|b| b.queue_ms >= 0 && b.external_ms >= 0));
        // Truncated: the first bar's queue wait is not the whole history before it.
        let bars = timeline(&inst(0, 65_030), &rows[1..], true);
        assert_eq!(bars[0].queue_ms, 0);
    }
}
