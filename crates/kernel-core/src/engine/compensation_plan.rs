//! The compensation of a failing workflow as plain values (K-17.6): which inverses run and
//! in which order, whether a failed inverse is tried again, the error it keeps, the task
//! that escalates it, and the report. The claim runs the inverses these functions name and
//! writes what they build.

use crate::compensation::{CompensationReport, InverseResult, InverseRun, INVERSE_ERROR_BYTES_MAX};
use crate::definition::Definition;
use crate::id::WorkflowId;
use crate::model::{ErrorClass, Instant, Step, StepStatus};
use crate::ports::{TaskRecord, TaskStatus, TASK_TEXT_BYTES_MAX};

/// A completed step whose inverse will run, with what the ordering rule reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// The step's index.
    pub(crate) index: usize,
    /// Its stored completion time (`Instant::ZERO` when none is stored).
    pub(crate) finished_at: Instant,
    /// How many steps it depends on, transitively.
    pub(crate) dependencies: usize,
}

/// The inverses to run for `steps`, in order, or `None` when the definition declares no
/// inverse at all (then nothing is compensated and no report is written): the completed
/// steps that declare one, ordered by [`order_inverses`].
pub(crate) fn plan(def: &Definition, steps: &[Step]) -> Option<Vec<usize>> {
    let defs = def.steps();
    if defs.iter().all(|s| s.get_inverse().is_none()) {
        return None;
    }
    let dependents: Vec<Vec<bool>> = (0..defs.len()).map(|k| def.plan().dependents(k)).collect();
    let dependencies = |i: usize| dependents.iter().enumerate().filter(|(k, d)| *k != i && d[i]).count();
    let candidates = defs
        .iter()
        .enumerate()
        .filter(|(i, sd)| sd.get_inverse().is_some() && steps[*i].status == StepStatus::Completed)
        .map(|(i, _)| Candidate {
            index: i,
            finished_at: steps[i].finished_at.unwrap_or(Instant::ZERO),
            dependencies: dependencies(i),
        })
        .collect();
    Some(order_inverses(candidates))
}

/// The order rule of the inverses: reverse completion order; on a tie (one millisecond, or
/// the clocks of two workers) a step with more transitive dependencies first, so a
/// dependent is undone before what it depends on (a dependent always has more); then the
/// later step first.
pub(crate) fn order_inverses(mut candidates: Vec<Candidate>) -> Vec<usize> {
    candidates.sort_by(|a, b| {
        b.finished_at.cmp(&a.finished_at).then(b.dependencies.cmp(&a.dependencies)).then(b.index.cmp(&a.index))
    });
    candidates.into_iter().map(|c| c.index).collect()
}

/// Whether an inverse that failed with `class` after `attempts` attempts is tried again: a
/// transient error, while attempts remain (a permanent error, or an inverse that does not
/// complete, stops at once).
pub(crate) fn retries_inverse(class: ErrorClass, attempts: u32, attempts_max: u32) -> bool {
    class == ErrorClass::Transient && attempts < attempts_max
}

/// The error an inverse that kept failing keeps: control characters become spaces (no
/// store holds NUL everywhere, and the report and the task title must be written), cut to
/// [`INVERSE_ERROR_BYTES_MAX`] bytes.
pub(crate) fn inverse_error(message: &str) -> String {
    super::outcome::stored_text(message, INVERSE_ERROR_BYTES_MAX)
}

/// The escalation task id of a step's inverse, from the step's idempotency key: one per
/// logical attempt.
pub(crate) fn escalation_task_id(idempotency_key: &str) -> String {
    crate::human::task_id(&format!("{idempotency_key}|c"), 0)
}

/// What an escalation task is about: the workflow and its step.
pub(crate) struct Escalated<'a> {
    /// The escalation task id ([`escalation_task_id`]).
    pub(crate) id: String,
    pub(crate) workflow_id: &'a str,
    pub(crate) workflow_type: &'a str,
    pub(crate) step: &'a str,
    /// The inverse's kept error ([`inverse_error`]).
    pub(crate) error: &'a str,
}

/// The human task (K-17.5) that asks someone holding `roles` to undo a step by hand, open
/// from `now` until `now + sla`, decided with `token` (the id port's task token).
pub(crate) fn escalation_task(
    e: Escalated<'_>,
    roles: Vec<String>,
    token: String,
    now: Instant,
    sla: crate::model::DurationMs,
) -> TaskRecord {
    let title = super::outcome::truncate(
        format!("Undo step `{}` by hand: its inverse kept failing ({})", e.step, e.error),
        TASK_TEXT_BYTES_MAX,
    );
    TaskRecord {
        id: e.id,
        workflow_id: WorkflowId::from(e.workflow_id),
        workflow_type: e.workflow_type.to_string(),
        step: e.step.to_string(),
        level: 0,
        title,
        assignee: None,
        roles,
        evidence: Vec::new(),
        token,
        created_at: now,
        due_at: now.saturating_add(sla),
        status: TaskStatus::Open,
        decision: None,
        closed_at: None,
    }
}

/// How an inverse that did not complete ended: escalated when a task was opened for it,
/// else failed — recorded either way, never dropped.
pub(crate) fn kept_failing(step: &str, attempts: u32, error: String, task: Option<String>) -> InverseRun {
    InverseRun {
        step: step.to_string(),
        result: if task.is_some() { InverseResult::Escalated } else { InverseResult::Failed },
        attempts,
        error: Some(error),
        task,
    }
}

/// The report of the inverses run (in order) at `now`, and the steps they undid.
pub(crate) fn report(runs: Vec<(usize, InverseRun)>, now: Instant) -> (CompensationReport, Vec<usize>) {
    let undone = runs.iter().filter(|(_, r)| r.result == InverseResult::Compensated).map(|(i, _)| *i).collect();
    let steps: Vec<InverseRun> = runs.into_iter().map(|(_, r)| r).collect();
    (CompensationReport { outcome: CompensationReport::outcome_of(&steps), steps, at: now }, undone)
}

#[cfg(test)]
#[path = "compensation_plan_tests.rs"]
mod tests;
