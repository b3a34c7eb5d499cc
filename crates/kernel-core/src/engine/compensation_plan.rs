//! The compensation of a failing workflow as plain values (K-17.6): which inverses run and
//! in which order, whether a failed inverse is tried again, the error it keeps, the task
//! that escalates it, and the report. The claim runs the inverses these functions name and
//! writes what they build.

use crate::compensation::{
    CompensationOutcome, CompensationReport, InverseResult, InverseRun, INVERSE_ERROR_BYTES_MAX,
};
use crate::definition::Definition;
use crate::definition::RetryPolicy;
use crate::domain::{ErrorClass, Instant, Step, StepStatus};
use crate::id::WorkflowId;
use crate::ports::{TaskRecord, TaskStatus, TASK_TEXT_BYTES_MAX};

/// A completed step whose inverse will run, with what the ordering rule reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// The step's index.
    pub(crate) index: usize,
    /// The revision of the write that completed it (`None`: completed before the field
    /// existed).
    pub(crate) completed_revision: Option<u64>,
    /// The steps it depends on, directly or transitively (any step, compensable or not).
    pub(crate) depends_on: Vec<usize>,
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
    let depends_on = |i: usize| (0..defs.len()).filter(|&k| k != i && dependents[k][i]).collect();
    let candidates = defs
        .iter()
        .enumerate()
        .filter(|(i, sd)| sd.get_inverse().is_some() && steps[*i].status == StepStatus::Completed)
        .map(|(i, _)| Candidate {
            index: i,
            completed_revision: steps[i].completed_revision,
            depends_on: depends_on(i),
        })
        .collect();
    Some(order_inverses(candidates))
}

/// The order rule of the inverses (K-17.6 amendment): the reverse of the dependency order
/// — a step's inverse runs only after the inverses of every step that depends on it,
/// directly or transitively — and, among the steps free to go, the latest completed
/// first by the store-assigned completion order (the revision of the completing write);
/// a step completed before that order was stored (`None`) counts as earlier than any
/// stamped one; on a tie the later step first. No stored time is read: the clocks of two
/// processes never decide.
pub(crate) fn order_inverses(mut candidates: Vec<Candidate>) -> Vec<usize> {
    let mut order = Vec::with_capacity(candidates.len());
    while !candidates.is_empty() {
        // Free to go: no remaining candidate depends on it. The graph is acyclic, so one
        // always is; should a stored document say otherwise, the latest goes anyway.
        let blocked = |c: &Candidate| candidates.iter().any(|d| d.depends_on.contains(&c.index));
        let rank = |c: &Candidate| (c.completed_revision, c.index);
        let free = candidates.iter().enumerate().filter(|(_, c)| !blocked(c)).max_by_key(|(_, c)| rank(c));
        let pos = match free {
            Some((pos, _)) => pos,
            None => candidates.iter().enumerate().max_by_key(|(_, c)| rank(c)).map(|(pos, _)| pos).unwrap_or(0),
        };
        order.push(candidates.swap_remove(pos).index);
    }
    order
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
    crate::ports::task_id(&format!("{idempotency_key}|c"), 0)
}

/// The id of the one task that escalates every inverse left when no further inverse may
/// run, from the first one's idempotency key: distinct from that inverse's own escalation.
pub(crate) fn remaining_task_id(idempotency_key: &str) -> String {
    crate::ports::task_id(&format!("{idempotency_key}|cr"), 0)
}

/// The entries of inverses that ended (compensated, failed, escalated) in a recorded
/// report, in progress or finished; a retrying one has not ended.
pub(crate) fn ended_runs(stored: Option<&CompensationReport>) -> Vec<InverseRun> {
    stored.map_or_else(Vec::new, |r| r.steps.iter().filter(|s| s.result != InverseResult::Retrying).cloned().collect())
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
    sla: crate::domain::DurationMs,
) -> TaskRecord {
    let title = format!("Undo step `{}` by hand: its inverse kept failing ({})", e.step, e.error);
    task(e, title, roles, token, now, sla)
}

/// Why no inverse ran after PrepareContext failed `failures` times (K-17.6 amendment:
/// inverses run only with their prepared context).
pub(crate) fn no_context_error(failures: u32) -> String {
    format!("not run: no prepared context (PrepareContext failed {failures} times)")
}

/// The one human task (K-17.5) that asks someone holding `roles` to undo by hand the
/// `count` completed steps whose inverses could not run without a prepared context,
/// starting with `e.step` (the first of them in the compensation's order).
pub(crate) fn no_context_task(
    e: Escalated<'_>,
    count: usize,
    roles: Vec<String>,
    token: String,
    now: Instant,
    sla: crate::domain::DurationMs,
) -> TaskRecord {
    let title = format!("Undo {count} step(s) by hand, starting with `{}`: no inverse ran ({})", e.step, e.error);
    task(e, title, roles, token, now, sla)
}

fn task(
    e: Escalated<'_>,
    title: String,
    roles: Vec<String>,
    token: String,
    now: Instant,
    sla: crate::domain::DurationMs,
) -> TaskRecord {
    TaskRecord {
        id: e.id,
        workflow_id: WorkflowId::from(e.workflow_id),
        workflow_type: e.workflow_type.to_string(),
        step: e.step.to_string(),
        level: 0,
        title: super::outcome::truncate(title, TASK_TEXT_BYTES_MAX),
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

/// The report entries of the inverses that did not run for lack of a prepared context:
/// each with no attempt, `error`, and the one task escalating all of them (`Escalated`),
/// or `Failed` without one.
pub(crate) fn not_run(steps: Vec<(usize, &str)>, error: &str, task: Option<String>) -> Vec<(usize, InverseRun)> {
    steps.into_iter().map(|(i, name)| (i, kept_failing(name, 0, error.to_string(), task.clone()))).collect()
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

/// Where a failing instance's compensation stands, from the report recorded on it (K-17.6
/// amendment: the progress is persisted, so a later claim neither runs a finished inverse
/// again nor retries one before its time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Nothing recorded: every inverse is still to run.
    Fresh,
    /// Some inverses ended (or one is retrying); the compensation may go on at `due`.
    Ongoing {
        /// The entries so far.
        runs: Vec<InverseRun>,
        /// When the retrying inverse is tried again.
        due: Instant,
    },
    /// Every inverse ended: only the failure finalizer (which failed before) and the
    /// terminal write remain.
    Finished(CompensationReport),
}

/// [`Progress`] of the report stored on a `failing` instance.
pub(crate) fn progress_of(stored: Option<&CompensationReport>) -> Progress {
    match stored {
        None => Progress::Fresh,
        Some(r) if r.outcome == CompensationOutcome::InProgress => {
            Progress::Ongoing { runs: r.steps.clone(), due: r.at }
        }
        Some(r) => Progress::Finished(r.clone()),
    }
}

/// What the compensation does with step `name`'s inverse, given the recorded `runs` and
/// when the compensation may go on (`due`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NextInverse {
    /// It ended in an earlier claim: keep its entry, run nothing.
    Recorded(InverseRun),
    /// It is retrying and its next try is not due yet: hand the claim back until then.
    NotYet {
        /// Its recorded entry.
        run: InverseRun,
        /// Its next try.
        until: Instant,
    },
    /// Run one attempt, after `attempts` recorded ones.
    Run {
        /// Attempts made by earlier claims.
        attempts: u32,
    },
    /// Every attempt was made and the last never reported (its process ended during it):
    /// it kept failing, with an unknown last outcome.
    GiveUp {
        /// Attempts made.
        attempts: u32,
    },
}

/// [`NextInverse`] for `name` at `now`, with at most `attempts_max` attempts in all.
pub(crate) fn next_inverse(
    runs: &[InverseRun],
    due: Option<Instant>,
    name: &str,
    now: Instant,
    attempts_max: u32,
) -> NextInverse {
    match runs.iter().find(|r| r.step == name) {
        None => NextInverse::Run { attempts: 0 },
        Some(r) if r.result != InverseResult::Retrying => NextInverse::Recorded(r.clone()),
        Some(r) if r.attempts >= attempts_max => NextInverse::GiveUp { attempts: r.attempts },
        Some(r) => match due {
            Some(until) if now < until => NextInverse::NotYet { run: r.clone(), until },
            _ => NextInverse::Run { attempts: r.attempts },
        },
    }
}

/// The entry of an inverse's attempt now starting (recorded before it runs, so a process
/// that ends during it still counts it).
pub(crate) fn started(step: &str, attempts: u32) -> InverseRun {
    InverseRun { step: step.to_string(), result: InverseResult::Retrying, attempts, error: None, task: None }
}

/// The error of an inverse whose last attempt never reported.
pub(crate) const LAST_ATTEMPT_UNKNOWN: &str = "its last attempt never reported (the process running it ended)";

/// When an inverse whose attempt number `attempts` failed with `class` is tried again: a
/// transient error while attempts remain, after the compensated step's retry delay with
/// jitter (`random`), from `now` — durably, by another claim (`None`: it kept failing).
pub(crate) fn next_try(
    class: ErrorClass,
    attempts: u32,
    attempts_max: u32,
    policy: &RetryPolicy,
    random: u64,
    now: Instant,
) -> Option<Instant> {
    retries_inverse(class, attempts, attempts_max).then(|| now.saturating_add(policy.delay_ms(attempts, random)))
}

/// The entry of an inverse that failed and is tried again.
pub(crate) fn retrying(step: &str, attempts: u32, error: String) -> InverseRun {
    InverseRun { step: step.to_string(), result: InverseResult::Retrying, attempts, error: Some(error), task: None }
}

/// The progress to record when a claim hands the compensation back: the entries so far,
/// going on at `due`.
pub(crate) fn in_progress(runs: &[(usize, InverseRun)], due: Instant) -> CompensationReport {
    CompensationReport {
        outcome: CompensationOutcome::InProgress,
        steps: runs.iter().map(|(_, r)| r.clone()).collect(),
        at: due,
    }
}

/// The steps a finished report undid, by name in `def`.
pub(crate) fn undone_in(def: &Definition, report: &CompensationReport) -> Vec<usize> {
    let names: Vec<&str> =
        report.steps.iter().filter(|r| r.result == InverseResult::Compensated).map(|r| r.step.as_str()).collect();
    def.steps().iter().enumerate().filter(|(_, s)| names.contains(&s.name())).map(|(i, _)| i).collect()
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
