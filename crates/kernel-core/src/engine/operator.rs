//! Operator actions on live workflows (K-17.2, K-17.3): regenerate a step, list dead
//! letters, and decide one (retry in the next epoch, complete with a supplied output, fail).
//!
//! Regenerate and cancel go through the one operator door of K-6.8
//! ([`operator_write`](super::operator_write)). A dead-letter decision is written to the dead-letter record first (one
//! conditional `open → decided` write), then the workflow's operator signal is delivered
//! (K-9.3: the fact before the doorbell); the engine that claims the woken workflow applies
//! the decision. A lost doorbell is covered by the dead-letter wait's poll fallback.

use super::Engine;
use crate::definition::OutcomeAuthority;
use crate::domain::*;
use crate::error::{Error, Result};
use crate::ports::*;
use serde_json::Value;

/// The signal type of a dead-letter wait; its wait key is the step name and its
/// generation [`dead_letter_generation`] of the logical attempt.
pub const DEAD_LETTER_SIGNAL: &str = "kernel.dead_letter";

/// The generation of a dead-letter wait: the logical attempt `(run, epoch)` in one number,
/// so a decision about an earlier attempt never wakes a later one (K-9.6).
pub fn dead_letter_generation(run: u32, epoch: u32) -> u64 {
    crate::activity::logical_generation(run, epoch)
}

/// The dead-letter record of step `idx` of `inst` (whose input was moved to `input`).
pub(crate) fn dead_letter_of(
    inst: &WorkflowInstance,
    idx: usize,
    input: &Value,
    error: StepError,
    now: Instant,
) -> DeadLetter {
    let step = &inst.steps[idx];
    let run = inst.retry_count;
    let mut error = error;
    if error.message.len() > DEAD_LETTER_MESSAGE_BYTES_MAX {
        let mut cut = DEAD_LETTER_MESSAGE_BYTES_MAX;
        while !error.message.is_char_boundary(cut) {
            cut -= 1;
        }
        error.message.truncate(cut);
    }
    DeadLetter {
        id: crate::activity::idempotency_key_at(&inst.workflow_id, &step.name, run, step.epoch),
        workflow_id: inst.workflow_id.clone(),
        workflow_type: inst.workflow_type.clone(),
        step: step.name.clone(),
        step_index: idx as u32,
        run,
        epoch: step.epoch,
        error,
        inputs: bounded_inputs(input, step.record_of(run)),
        created_at: now,
        status: DeadLetterStatus::Open,
        decision: None,
        closed_at: None,
    }
}

/// The recorded inputs of a dead letter: the workflow's input and the step's record, each
/// left out (replaced by a note) when the whole would not fit a stored payload.
fn bounded_inputs(input: &Value, record: Option<&crate::record::StepRecord>) -> Value {
    let fits = |v: &Value| crate::validate::payload("inputs", v, crate::validate::STORE_PAYLOAD_BYTES_MAX).is_ok();
    let full = serde_json::json!({"input": input, "record": record});
    if fits(&full) {
        return full;
    }
    let without_record = serde_json::json!({"input": input, "record": "left out: too large; see the step's record"});
    if fits(&without_record) {
        return without_record;
    }
    serde_json::json!({"input": "left out: too large; see the workflow's input", "record": "left out: too large"})
}

/// Why an open dead letter no longer stands for the attempt its workflow waits on (K-17.2
/// amendment: a decision on it is refused), or `None` when it still does: the workflow is
/// gone, ended or failing, or step `dl.step` is in another run or epoch than the record's.
pub(crate) fn superseded(dl: &DeadLetter, inst: Option<&WorkflowInstance>) -> Option<String> {
    let Some(inst) = inst else {
        return Some(format!("workflow {} no longer exists", dl.workflow_id));
    };
    if inst.status.is_terminal() || inst.status == WorkflowStatus::Failing {
        return Some(format!("workflow {} is {}", dl.workflow_id, inst.status.as_str()));
    }
    match inst.steps.get(dl.step_index as usize) {
        Some(s) if s.name == dl.step && s.epoch == dl.epoch && inst.retry_count == dl.run => None,
        Some(s) if s.name == dl.step => Some(format!(
            "step {} is in run {} epoch {} now, the dead letter is of run {} epoch {}",
            dl.step, inst.retry_count, s.epoch, dl.run, dl.epoch
        )),
        _ => Some(format!("workflow {} has no step {} at index {}", dl.workflow_id, dl.step, dl.step_index)),
    }
}

/// What a regenerate did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Regenerated {
    /// The regenerated step's new epoch.
    pub epoch: u32,
    /// Every step that starts a new logical attempt: the regenerated one, then the steps
    /// that depend on it and had run.
    pub steps: Vec<String>,
    /// Whether the instance became claimable now (`false`: it keeps waiting in a step that
    /// was not reset, and the reset steps run once that wait ends).
    pub woken: bool,
}

impl Engine {
    /// Dead letters, ordered by id, after `after`, at most `limit` (1..=1 000), optionally
    /// of one status. Reads the dead-letter records only, never the instances (K-17.2).
    pub async fn dead_letters(
        &self,
        status: Option<DeadLetterStatus>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>> {
        self.dead_letter_port()?.list(status, after, limit).await
    }

    /// Decide dead letter `id` (K-17.2): retry the step in its next epoch, complete it with
    /// `output` (validated against the step's output schema first), or fail the workflow.
    /// The decision is recorded (one conditional write on an open record; a `Complete`
    /// keeps the supplied output whole there), then the workflow's operator signal is
    /// delivered; a decision already recorded is returned as
    /// [`DecideOutcome::AlreadyDecided`] with its signal delivered again (idempotent).
    ///
    /// Errors, nothing written: [`Error::NotFound`] for an unknown id;
    /// [`Error::InvalidInput`] for a bad actor or reason, an output over the payload limit
    /// or one that fails the step's schema, or an engine without a `DeadLetters` port;
    /// [`Error::Conflict`] for a `Complete` of a step whose outcome only its own activity
    /// may supply ([`OutcomeAuthority::ActivityOnly`], a human task: retry it instead), and
    /// for an open dead letter whose attempt is superseded — its workflow is gone or ended,
    /// or the step moved to another run or epoch (a replay, a regenerate, a loop).
    ///
    /// The authority check needs this engine to know the step's definition; where it does
    /// not, the worker that applies the decision refuses the output instead (see
    /// [`OperatorAction::CompleteRefused`](crate::record::OperatorAction::CompleteRefused)).
    /// A regenerate that lands between the staleness check and the decision's write leaves
    /// a decision nobody applies: the claim reads only the record of the attempt it waits on.
    pub async fn decide_dead_letter(
        &self,
        id: &str,
        action: DeadLetterAction,
        actor: &str,
        reason: Option<&str>,
    ) -> Result<DecideOutcome> {
        let dls = self.dead_letter_port()?;
        let dl = dls.get(id).await?.ok_or_else(|| Error::NotFound(format!("dead letter {id}")))?;
        let step_def = self.inner.defs.get(&dl.workflow_type).and_then(|d| d.steps().get(dl.step_index as usize));
        if let DeadLetterAction::Complete { output } = &action {
            crate::validate::payload("output", output, self.inner.config.payload_bytes_max)?;
            if step_def.is_some_and(|s| s.get_outcome_authority() == OutcomeAuthority::ActivityOnly) {
                return Err(Error::Conflict(format!(
                    "dead letter {id}: step {} of {} takes its outcome only from its own activity (a human task: an \
                     eligible person's decision or its SLA path), never from an operator's output; retry the step \
                     instead, which re-opens its task",
                    dl.step, dl.workflow_id
                )));
            }
            if let Some(schema) = step_def.and_then(|s| s.get_output_schema()) {
                let errors = schema.errors(output);
                if !errors.is_empty() {
                    return Err(Error::invalid(
                        "output",
                        format_args!("fails schema {}: {}", schema.version(), errors.join("; ")),
                    ));
                }
            }
        }
        if dl.status == DeadLetterStatus::Open {
            let inst = self.inner.ports.store.get(&dl.workflow_id).await?;
            if let Some(why) = superseded(&dl, inst.as_ref()) {
                return Err(Error::Conflict(format!("dead letter {id} is stale: {why}; nothing decided")));
            }
        }
        let decision = DeadLetterDecision {
            action,
            actor: actor.to_string(),
            reason: reason.map(str::to_string),
            decided_at: self.inner.ports.clock.now(),
        };
        decision.validate()?;
        let outcome = dls.decide(id, &decision).await?;
        if matches!(outcome, DecideOutcome::Decided | DecideOutcome::AlreadyDecided(_)) {
            use sha2::Digest;
            let signal = Signal::builder(dl.workflow_id.clone(), DEAD_LETTER_SIGNAL)
                .wait_key(dl.step.clone())
                .generation(dead_letter_generation(dl.run, dl.epoch))
                .signal_id(format!("dl-{}", crate::model_call::hex(&sha2::Sha256::digest(id.as_bytes()))))
                .build()?;
            self.deliver_signal(signal).await?;
        }
        Ok(outcome)
    }

    fn dead_letter_port(&self) -> Result<&std::sync::Arc<DynDeadLetters>> {
        self.inner
            .ports
            .dead_letters
            .as_ref()
            .ok_or_else(|| Error::invalid("ports.dead_letters", "this engine has no DeadLetters port"))
    }
}
