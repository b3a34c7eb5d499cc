//! What an operator action writes, and where (K-6.8, K-8, K-17.3): pure decisions, no port.
//!
//! [`route`] says whether an action goes to the instance directly (no claim holds it), as a
//! request to the claim holder (a claim token is set, so a lease may still run), or not at
//! all (the instance has ended). [`action_write`] computes the action's own write from the
//! instance as read; [`request_write`] computes, for the worker that applies a recorded
//! request, the one write that applies it (or drops it, when it no longer applies) and
//! clears the claim.

use super::operator::Regenerated;
use crate::definition::Plan;
use crate::domain::*;
use crate::error::{Error, Result};
use crate::id::ClaimToken;
use crate::operator_request::{OperatorRequest, RequestedAction};
use crate::record::{HistoryEntry, HistoryLimits, HistoryReason};
use crate::transition::Transition;

/// Where an operator action goes (K-6.8).
#[derive(Debug, PartialEq)]
pub(crate) enum Route<'a> {
    /// The instance is completed, failed or canceled: nothing to act on.
    Ended,
    /// No claim token is set: the action is written under `Guard::Operator` with the
    /// revision read.
    Direct,
    /// A claim token is set: the action is recorded as a request under `Guard::Token`
    /// with this token (the holder's), which the request replaces.
    Request {
        /// The holder's token.
        holder: &'a ClaimToken,
    },
    /// A request is already recorded; `token` is the token it put in place.
    Pending {
        /// The recorded request.
        request: &'a OperatorRequest,
        /// The instance's current claim token.
        token: &'a ClaimToken,
    },
}

/// Where an action on `inst` goes.
pub(crate) fn route(inst: &WorkflowInstance) -> Route<'_> {
    if inst.status.is_terminal() {
        return Route::Ended;
    }
    match (&inst.claim_token, &inst.operator_request) {
        (None, _) => Route::Direct,
        (Some(token), Some(request)) => Route::Pending { request, token },
        (Some(holder), None) => Route::Request { holder },
    }
}

/// What a second action does while a request is pending: the same action is the same
/// request (idempotent); a cancel replaces a pending regenerate (cancel wins: the
/// regenerated steps would never run); anything else waits for the pending one.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum WhilePending {
    /// Report the pending request.
    Same,
    /// Write the new action in its place, under the token the pending one put in place.
    Replace,
    /// Refuse: [`Error::Conflict`].
    Refuse,
}

/// [`WhilePending`] for `new` while `pending` is recorded.
pub(crate) fn while_pending(pending: &RequestedAction, new: &RequestedAction) -> WhilePending {
    match (pending, new) {
        (p, n) if p == n => WhilePending::Same,
        (RequestedAction::Regenerate { .. }, RequestedAction::Cancel) => WhilePending::Replace,
        _ => WhilePending::Refuse,
    }
}

/// What an action does once written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ActionEffect {
    /// `→ canceled`.
    Canceled,
    /// The step was regenerated.
    Regenerated(Regenerated),
}

/// The action's own write from `inst` as read (no claim holds it, or the holder applies
/// it): a supersede for a cancel; for a regenerate, a new logical attempt of the step and
/// of every step that depends on it and has run.
///
/// Refused, nothing to write: [`Error::Conflict`] for an ended instance, a regenerate of a
/// failing instance or of a step that has not completed; [`Error::InvalidInput`] for a
/// step the plan does not have.
pub(crate) fn action_write(
    inst: &WorkflowInstance,
    action: &RequestedAction,
    plan: Option<&Plan>,
    limits: HistoryLimits,
    now: Instant,
) -> Result<(Transition, ActionEffect)> {
    if inst.status.is_terminal() {
        return Err(Error::Conflict(format!("{} is {}: nothing to act on", inst.workflow_id, inst.status.as_str())));
    }
    match action {
        RequestedAction::Cancel => Ok((Transition::supersede(now), ActionEffect::Canceled)),
        RequestedAction::Regenerate { step } => {
            let plan = plan.ok_or_else(|| Error::UnregisteredType(inst.workflow_type.clone()))?;
            let (t, r) = regenerate_write(inst, plan, step, limits, now)?;
            Ok((t, ActionEffect::Regenerated(r)))
        }
    }
}

/// The regenerate of `step` (K-17.3) from `inst` as read.
fn regenerate_write(
    inst: &WorkflowInstance,
    plan: &Plan,
    step: &str,
    limits: HistoryLimits,
    now: Instant,
) -> Result<(Transition, Regenerated)> {
    let workflow_id = &inst.workflow_id;
    if inst.definition_fingerprint != plan.fingerprint() {
        return Err(Error::Conflict(format!(
            "{workflow_id} runs another version of {} than this engine's: regenerate it where that version is \
             registered",
            inst.workflow_type
        )));
    }
    let idx = plan
        .steps()
        .iter()
        .position(|s| s.name == step)
        .ok_or_else(|| Error::invalid("step", format_args!("{} has no step {step:?}", inst.workflow_type)))?;
    if inst.status == WorkflowStatus::Failing {
        return Err(Error::Conflict(format!(
            "{workflow_id} is failing: only a running or waiting workflow can be regenerated"
        )));
    }
    let Some(s) = inst.steps.get(idx).filter(|s| s.name == step) else {
        return Err(Error::corrupt(format!("{workflow_id}'s steps do not follow its plan at {step:?}")));
    };
    if s.status != StepStatus::Completed {
        return Err(Error::Conflict(format!(
            "step {step} of {workflow_id} is {}: only a completed step can be regenerated",
            s.status.as_str()
        )));
    }
    // The step and its transitive dependents.
    let reset = plan.dependents(idx);
    let mut resets = Vec::new();
    let mut names = Vec::new();
    let mut outputs = Vec::new();
    for (j, s) in inst.steps.iter().enumerate().filter(|(j, _)| reset[*j]) {
        let ran = j == idx || s.status != StepStatus::Pending || s.attempt > 0 || s.record.is_some();
        if !ran {
            continue;
        }
        let output = inst.output.get(&s.name).cloned();
        if output.is_some() {
            outputs.push(s.name.clone());
        }
        let entry = HistoryEntry {
            run: inst.retry_count,
            epoch: s.epoch,
            reason: if j == idx { HistoryReason::Regenerate } else { HistoryReason::Upstream },
            output,
            error: s.error.clone(),
            record: s.record.clone(),
            at: now,
        };
        resets.push((j, s.epoch.saturating_add(1), limits.push(s.history.clone(), entry)));
        names.push(s.name.clone());
    }
    let wake = match (&inst.status, &inst.wait) {
        (WorkflowStatus::Waiting, Some(w)) => reset.get(w.step_index() as usize).copied().unwrap_or(false),
        _ => true,
    };
    let epoch = inst.steps[idx].epoch.saturating_add(1);
    // A loop sender that runs again enters its loop afresh: its counter starts over.
    let counters: Vec<usize> = resets.iter().map(|r| r.0).filter(|&j| inst.steps[j].iterations > 0).collect();
    let mut t = Transition::regenerate(resets, outputs, wake, now);
    for j in counters {
        t.step_mut(j).iterations = Some(0);
    }
    if inst.resume.as_ref().is_some_and(|r| !reset.get(r.step_index as usize).copied().unwrap_or(false)) {
        // The resume belongs to a step that is not reset (a signal that woke it, K-9.4):
        // it stays.
        t.resume = None;
    }
    Ok((t, Regenerated { epoch, steps: names, woken: wake }))
}

/// Whether a worker that just claimed `inst` applies its recorded request before anything
/// runs: always a cancel; a regenerate only when the worker's plan is the instance's (a
/// worker of another version pushes the instance back and leaves the request pending).
pub(crate) fn applies_at_claim(inst: &WorkflowInstance, plan: &Plan) -> bool {
    match &inst.operator_request {
        None => false,
        Some(r) => match r.action {
            RequestedAction::Cancel => true,
            RequestedAction::Regenerate { .. } => inst.definition_fingerprint == plan.fingerprint(),
        },
    }
}

/// How a recorded request ends when a worker applies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RequestEnd {
    /// The action was applied with the request.
    Applied(ActionEffect),
    /// The action no longer applies to the instance as it is now (why): the request is
    /// cleared and the claim released at once, nothing else written.
    Dropped(String),
}

/// The one write that applies `inst`'s recorded request (K-6.8), under `Guard::Token` with
/// the instance's current token, by the holder at the end of its claim or by a later
/// claimer before it starts anything. `None` when no request is recorded.
pub(crate) fn request_write(
    inst: &WorkflowInstance,
    plan: &Plan,
    limits: HistoryLimits,
    now: Instant,
) -> Option<(Transition, RequestEnd)> {
    let request = inst.operator_request.as_ref()?;
    Some(match action_write(inst, &request.action, Some(plan), limits, now) {
        Ok((t, effect)) => (Transition::request_applied(Some(t), now), RequestEnd::Applied(effect)),
        Err(e) => (Transition::request_applied(None, now), RequestEnd::Dropped(e.to_string())),
    })
}
