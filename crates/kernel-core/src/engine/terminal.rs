//! The way to a workflow's end as plain values (K-7.1, K-8, K-2.3): what the claim does
//! when the ready steps are read, what a lone completion is fused with, how a failed
//! PrepareContext counts, the fallback ladder of a refused write, and what the terminal
//! write and the terminal frame carry. The claim calls these functions and performs the
//! writes and runs they name.

use super::outcome::AfterWave;
use crate::compensation::CompensationReport;
use crate::domain::{ErrorClass, Instant, StepError, WorkflowStatus};
use crate::transition::Transition;
use serde_json::Value;

/// What the claim does with the ready steps of the committed document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NextMove {
    /// Every step is done: the success path (K-8).
    Succeed,
    /// Nothing is ready and a step failed: `running → failing`, then the failure path.
    Fail,
    /// Nothing is ready, nothing failed, not all done: a document the plan cannot move on;
    /// released with the finalizer delay.
    Stuck,
    /// One ready step: the fusion path (K-7.1).
    Single(usize),
    /// Several: a wave (K-4.5).
    Wave(Vec<usize>),
}

/// [`NextMove`] from the ready steps, whether every step is done and whether one failed.
pub(crate) fn next_move(ready: Vec<usize>, all_done: bool, any_failed: bool) -> NextMove {
    match ready.len() {
        0 if all_done => NextMove::Succeed,
        0 if any_failed => NextMove::Fail,
        0 => NextMove::Stuck,
        1 => NextMove::Single(ready[0]),
        _ => NextMove::Wave(ready),
    }
}

/// The facts a lone step's completion is fused by (K-7.1), read as if it were committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Completing {
    /// Its loop may send the workflow back: the control pass decides that from the
    /// committed output (the same path as after a crash), so the completion goes alone.
    pub(crate) loops_back: bool,
    /// Every step is done once it is written.
    pub(crate) all_done: bool,
    /// The definition has a success finalizer.
    pub(crate) success_finalizer: bool,
    /// The steps ready once it is written.
    pub(crate) next: Vec<usize>,
    /// Whether the only next step is conditional (decided by the control pass first).
    pub(crate) next_conditional: bool,
    /// The engine is stopping or the claim ended: start nothing new.
    pub(crate) stopping: bool,
}

/// What a lone completion is written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fusion {
    /// The completion alone; the claim goes on.
    Alone,
    /// With `→ completed`: the last step without a success finalizer.
    Completed,
    /// With the next step's start (its permit first: granted, it is marked running in the
    /// same write; deferred, the deferral is fused instead; refused, the completion goes
    /// alone).
    StartNext(usize),
}

/// [`Fusion`] of a lone completion.
pub(crate) fn fusion(c: &Completing) -> Fusion {
    if c.loops_back {
        Fusion::Alone
    } else if c.all_done && !c.success_finalizer {
        Fusion::Completed
    } else if c.next.len() == 1 && !c.next_conditional && !c.stopping {
        Fusion::StartNext(c.next[0])
    } else {
        Fusion::Alone
    }
}

/// What a failed PrepareContext leads to (K-2.3), with the failures counted so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PrepareNext {
    /// Below the limit: release, counting `failures`, for a growing delay.
    Release { failures: u32 },
    /// At the limit: the workflow fails through its failure path (K-8); `mark_failing`
    /// when it is not `failing` yet (the `→ failing` write counts `failures`).
    Fail { failures: u32, mark_failing: bool },
}

/// [`PrepareNext`] after one more failure of an instance at `status` that failed
/// `prepare_failures` times before, under `attempts_max`.
pub(crate) fn prepare_next(status: WorkflowStatus, prepare_failures: u32, attempts_max: u32) -> PrepareNext {
    let failures = prepare_failures.saturating_add(1);
    if failures < attempts_max {
        PrepareNext::Release { failures }
    } else {
        PrepareNext::Fail { failures, mark_failing: status != WorkflowStatus::Failing }
    }
}

/// What a wave's write that the store refused was going to do to the step it blamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RefusedWrite {
    /// It carried an outcome of the step (a retry, a wait, a checkpoint…): the step's
    /// failure may carry the store's reason.
    Outcome,
    /// It was already the step's end (the workflow was going `failing` or canceled): its
    /// error was refused, so only the short fixed message is tried.
    Failure,
}

impl RefusedWrite {
    /// What the refused write of a wave resolved to `then` was.
    pub(crate) fn of(then: &AfterWave) -> RefusedWrite {
        match then {
            AfterWave::Failing | AfterWave::Canceled => RefusedWrite::Failure,
            _ => RefusedWrite::Outcome,
        }
    }
}

/// How many plain writes of one run the store may refuse before the workflow fails (K-6.4:
/// a refusal is deterministic, so handing the claim back again and again would never end).
pub const REFUSED_WRITES_MAX: u32 = 3;

/// Which plain write the store refused, as far as what follows depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RefusedPlain {
    /// A fingerprint push-back: the instance is another version's; never business code.
    PushBack,
    /// The release after a failed PrepareContext: no context, so no business code either.
    Prepare,
    /// `failing → failed` with the compensation's report.
    Failed,
    /// Another write of a `failing` instance (a compensation or finalizer release).
    InFailing,
    /// A write of a running instance (mark running, release, `failing`, `completed`).
    Running,
}

/// What a claim does after the store refused a plain write, the `refused`-th of its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterRefusedPlain {
    /// Hand the claim back with a delay, the count recorded.
    HandBack,
    /// The limit is reached and the write concerned step `idx`: fail that step for good
    /// through the refusal ladder (its failure then fails the workflow).
    FailStep(usize),
    /// The limit is reached, no step concerned, the workflow still running: `→ failing`.
    FailWorkflow,
    /// The limit is reached without a prepared context: fail as after PrepareContext's
    /// own limit (no business code; the compensable steps escalated).
    FailWithoutContext,
    /// The limit is reached while failing, before the end: no further inverse runs; the
    /// ones left are escalated to a person, then `→ failed` with that report.
    EscalateAndFail,
    /// The limit is reached on `failed` itself: `→ failed` without the report (the steps
    /// the compensation undid are still marked).
    FailedWithoutReport,
}

/// [`AfterRefusedPlain`] for the `refused`-th refused plain write of a run, of kind `kind`,
/// which concerned `step` (its first step, if any). A push-back is always handed back: it
/// runs no business code and the instance is another worker's to run.
pub(crate) fn after_refused_plain(refused: u32, step: Option<usize>, kind: RefusedPlain) -> AfterRefusedPlain {
    if refused < REFUSED_WRITES_MAX || kind == RefusedPlain::PushBack {
        return AfterRefusedPlain::HandBack;
    }
    match (kind, step) {
        (RefusedPlain::Prepare, _) => AfterRefusedPlain::FailWithoutContext,
        (RefusedPlain::Failed, _) => AfterRefusedPlain::FailedWithoutReport,
        (RefusedPlain::InFailing, _) => AfterRefusedPlain::EscalateAndFail,
        (RefusedPlain::Running | RefusedPlain::PushBack, Some(idx)) => AfterRefusedPlain::FailStep(idx),
        (RefusedPlain::Running | RefusedPlain::PushBack, None) => AfterRefusedPlain::FailWorkflow,
    }
}

/// The step failures to try, one after the other, when a write carrying a value of the
/// step was refused (K-7.4): each carries less of it — the store's reason (`reason`) unless
/// the refused write was already a failure, then a short fixed message. When every one is
/// refused too, `failing` alone follows, which carries nothing from the step.
pub(crate) fn refusal_ladder(refused: RefusedWrite, reason: StepError) -> Vec<StepError> {
    let short = StepError { class: ErrorClass::Permanent, message: "refused by the store".into() };
    match refused {
        RefusedWrite::Failure => vec![short],
        RefusedWrite::Outcome => vec![reason, short],
    }
}

/// The terminal write of the failure path (K-8): `failed`, with the compensation's report
/// and the steps it undid when the definition compensates (K-17.6).
pub(crate) fn failed_write(report: Option<(CompensationReport, Vec<usize>)>, now: Instant) -> Transition {
    match report {
        Some((r, undone)) => Transition::failed_compensated(now, r, &undone),
        None => Transition::failed(now),
    }
}

/// The client stream's terminal frame (K-16): the status and revision, and the
/// compensation's outcome when there was one (K-17.6).
pub(crate) fn terminal_summary(
    status: WorkflowStatus,
    revision: u64,
    compensation: Option<&CompensationReport>,
) -> Value {
    let mut summary = serde_json::json!({ "status": status.as_str(), "revision": revision });
    if let Some(c) = compensation {
        summary["compensation"] = serde_json::json!(c.outcome.as_str());
    }
    summary
}

#[cfg(test)]
#[path = "terminal_tests.rs"]
mod tests;
