//! Dead-letter resolution as plain values (K-17.2, K-17.3): whether a step can be
//! dead-lettered, where the record of a resumed step stands, and what an operator's
//! decision writes — the step's record entry, the step's transition and what follows. The
//! claim reads the record, calls these functions and performs the writes they describe.

use crate::definition::{OnFailed, OutcomeAuthority, StepDef};
use crate::domain::{DurationMs, ErrorClass, Instant, Step, StepError};
use crate::ports::{DeadLetter, DeadLetterAction, DeadLetterDecision, DeadLetterStatus};
use crate::record::{
    HistoryEntry, HistoryLimits, HistoryReason, OperatorAction, OperatorEntry, RecordEntry, StepRecord,
};
use crate::transition::Transition;

/// Whether a step of `sd` can be dead-lettered: its policy says so, or it asks a query hook
/// after unknown outcomes and the engine keeps dead letters (`has_port`).
pub(crate) fn dead_letters(sd: &StepDef, has_port: bool) -> bool {
    sd.get_on_failed() == OnFailed::DeadLetter || (sd.query.is_some() && has_port)
}

/// The error a dead-lettered step keeps (its stored one; a permanent one without text when
/// none is stored).
pub(crate) fn kept_error(step: &Step) -> StepError {
    step.error.clone().unwrap_or(StepError { class: ErrorClass::Permanent, message: String::new() })
}

/// Where the dead letter of a step that woke from its dead-letter wait stands.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Found {
    /// An operator decided: apply it.
    Decided(DeadLetterDecision),
    /// Still open (or closed without a decision): the step waits again.
    Undecided,
    /// The record was lost after the wait was stored: write it, then wait again.
    Lost,
}

/// What the record read for a woken dead-lettered step means.
pub(crate) fn found(record: Option<DeadLetter>) -> Found {
    match record {
        Some(dl) if dl.status != DeadLetterStatus::Open => dl.decision.map_or(Found::Undecided, Found::Decided),
        Some(_) => Found::Undecided,
        None => Found::Lost,
    }
}

/// What the claim applies for an operator's decision on a dead-lettered step, and the
/// entry it records with the step (K-17.2 amendment): the decision as made, except a
/// `Complete` of a step whose outcome only its own activity may supply — decided where the
/// step's definition was unknown — which is applied as a `Retry` (a human task re-opens)
/// and recorded as [`OperatorAction::CompleteRefused`]. A supplied output is recorded as
/// [`OperatorEntry::with_output`] does: its digest always, a bounded copy.
pub(crate) fn resolve(
    decision: &DeadLetterDecision,
    authority: OutcomeAuthority,
    now: Instant,
) -> (DeadLetterAction, OperatorEntry) {
    let actor = decision.actor.as_str();
    let plain = |action| OperatorEntry { action, actor: actor.to_string(), output: None, output_digest: None, at: now };
    match &decision.action {
        DeadLetterAction::Retry => (DeadLetterAction::Retry, plain(OperatorAction::Retry)),
        DeadLetterAction::Fail => (DeadLetterAction::Fail, plain(OperatorAction::Fail)),
        DeadLetterAction::Complete { output } if authority == OutcomeAuthority::ActivityOnly => {
            (DeadLetterAction::Retry, OperatorEntry::with_output(OperatorAction::CompleteRefused, actor, output, now))
        }
        DeadLetterAction::Complete { output } => (
            DeadLetterAction::Complete { output: output.clone() },
            OperatorEntry::with_output(OperatorAction::Complete, actor, output, now),
        ),
    }
}

/// What follows an applied decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterDecision {
    /// The claim goes on: the step is pending in its next epoch, or completed with the
    /// operator's output.
    Continue,
    /// The step failed: the workflow goes the failure path.
    Fail,
}

/// An operator decision turned into one write of step `idx`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Applied {
    /// The write, under the claim's running guard.
    pub(crate) transition: Transition,
    /// What the claim does once it is committed (and the record closed).
    pub(crate) then: AfterDecision,
}

/// The write that applies `decision` to dead-lettered step `idx` (`step`, of run `run`),
/// as [`resolve`] turns it for the step's outcome `authority`: the operator's entry is
/// appended to the step's record of this logical attempt, then a
/// retry starts the next epoch (the attempt, record included, goes to the history), a
/// completion completes the step with the operator's output, and a failure fails it for
/// good with the actor and reason as its error.
pub(crate) fn apply(
    idx: usize,
    step: &Step,
    run: u32,
    decision: &DeadLetterDecision,
    authority: OutcomeAuthority,
    limits: HistoryLimits,
    now: Instant,
) -> Applied {
    let (action, entry) = resolve(decision, authority, now);
    let mut record = step.record_of(run).cloned().unwrap_or_else(|| StepRecord::new(run, step.epoch));
    record.entries.push(RecordEntry::Operator(entry));
    match &action {
        DeadLetterAction::Retry => {
            let h = HistoryEntry {
                run,
                epoch: step.epoch,
                reason: HistoryReason::DeadLetterRetry,
                output: None,
                error: step.error.clone(),
                record: Some(record),
                at: now,
            };
            let history = limits.push(step.history.clone(), h);
            let transition = Transition::step_epoch(idx, step.epoch.saturating_add(1), history, now);
            Applied { transition, then: AfterDecision::Continue }
        }
        DeadLetterAction::Complete { output } => {
            let complete = Transition::complete_step(idx, &step.name, output.clone(), DurationMs::ZERO, now, true);
            Applied {
                transition: Transition::record_step(idx, record, None, now).fuse(complete),
                then: AfterDecision::Continue,
            }
        }
        DeadLetterAction::Fail => {
            let message = format!(
                "failed by {}{}",
                decision.actor,
                decision.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default()
            );
            let error = StepError { class: ErrorClass::Permanent, message };
            let failed = Transition::step_failed(idx, error, DurationMs::ZERO, now);
            Applied {
                transition: Transition::record_step(idx, record, None, now).fuse(failed),
                then: AfterDecision::Fail,
            }
        }
    }
}

#[cfg(test)]
#[path = "dead_letter_decision_tests.rs"]
mod tests;
