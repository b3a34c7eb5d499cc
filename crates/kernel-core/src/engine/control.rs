//! Control beyond a DAG as plain values (K-4 amendment): which loop goes back or stops,
//! which conditional steps are not taken, what a loop-back writes and when it supersedes a
//! wave's halts. No locks, no ports, no clock: the claim reads its committed document,
//! calls these functions and performs the writes they describe.

use super::outcome::Halt;
use crate::definition::{BranchInputs, Definition, StepDef};
use crate::domain::{DurationMs, Instant, Step, StepError, StepStatus, WorkflowInstance};
use crate::record::{HistoryEntry, HistoryLimits, HistoryReason, RecordEntry};
use crate::transition::{Transition, TransitionKind};
use serde_json::Value;
use std::collections::BTreeMap;

/// What the control pass decides (K-4 amendment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Control {
    /// `sender`'s loop goes back to `target`.
    LoopBack { sender: usize, target: usize },
    /// Step `i` fails by its policy with this message (a loop at its maximum, a panicking
    /// predicate).
    Stop(usize, String),
    /// These conditional steps are not taken.
    Skip(Vec<usize>),
}

/// The message of a caught panic, when it is a string.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic.downcast_ref::<&str>().copied().or_else(|| panic.downcast_ref::<String>().map(String::as_str)).unwrap_or("")
}

/// Whether `step`'s completion in its current epoch was an operator's (a dead letter decided
/// "complete", K-17.2) — in whatever run: a replay keeps a completed step as it is (K-5).
pub(crate) fn completed_by_operator(step: &Step) -> bool {
    step.record
        .as_ref()
        .filter(|r| r.epoch == step.epoch)
        .is_some_and(|r| r.entries.iter().any(|e| matches!(e, RecordEntry::Operator(o) if o.action == "complete")))
}

/// What the control pass decides from the committed steps and outputs (K-4 amendment), or
/// `None` when there is nothing to decide: the first completed loop sender (in step order)
/// whose predicate holds on its recorded output — or panics — loops back or, at its
/// maximum, stops; otherwise the fresh ready conditional steps whose predicate does not
/// hold are skipped. The one decision both the control pass and the wave's
/// [`supersedes`] act on.
pub(crate) fn decide(def: &Definition, steps: &[Step], outputs: &BTreeMap<String, Value>) -> Option<Control> {
    let plan = def.plan();
    if !plan.steps().iter().any(|p| p.loop_to.is_some() || p.reads.is_some()) {
        // A plain DAG: nothing to decide.
        return None;
    }
    for (i, sd) in def.steps().iter().enumerate() {
        let (Some(l), Some(target)) = (sd.loop_to.as_ref(), plan.steps()[i].loop_to) else { continue };
        let step = &steps[i];
        if step.status != StepStatus::Completed || completed_by_operator(step) {
            // An operator's output for this logical attempt (a dead letter decided
            // "complete") leaves the loop: it is not asked again.
            continue;
        }
        let out = outputs.get(&step.name).unwrap_or(&Value::Null);
        return match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (l.again)(out))) {
            Ok(false) => continue,
            Ok(true) => {
                let max = l.max_iterations.unwrap_or(0);
                Some(if step.iterations >= max {
                    Control::Stop(
                        i,
                        format!(
                            "loop from {} to {} reached its maximum of {max} iterations",
                            sd.name(),
                            plan.steps()[target].name
                        ),
                    )
                } else {
                    Control::LoopBack { sender: i, target }
                })
            }
            Err(panic) => Some(Control::Stop(i, format!("the loop predicate panicked: {}", panic_message(&*panic)))),
        };
    }
    let mut skip = Vec::new();
    for i in plan.ready(steps) {
        let Some(b) = def.steps()[i].when.as_ref() else { continue };
        if steps[i].status != StepStatus::Pending {
            // A running leftover was taken before it started.
            continue;
        }
        let inputs = BranchInputs { reads: &b.reads, outputs };
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (b.holds)(&inputs))) {
            Ok(true) => {}
            Ok(false) => skip.push(i),
            Err(panic) => {
                return Some(Control::Stop(i, format!("the branch predicate panicked: {}", panic_message(&*panic))))
            }
        }
    }
    (!skip.is_empty()).then_some(Control::Skip(skip))
}

/// Whether completing step `sd` with `output` may send the workflow back (its loop's
/// predicate holds, or panicked): such a completion is written alone, never fused.
pub(crate) fn may_loop_back(sd: &StepDef, output: &Value) -> bool {
    let Some(l) = sd.loop_to.as_ref() else { return false };
    !matches!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (l.again)(output))), Ok(false))
}

/// The loop-back write of sender `sender` to `target` (K-4 amendment, K-17.1), from the
/// committed instance `inst` (its steps, resume and run) and `outputs`. The loop's body is
/// the target and every step that depends on it (transitively), except the steps after the
/// sender (they run once the loop is left): each starts its next epoch, whether or not it
/// ran in this iteration — so a step's epoch counts the iterations that covered it,
/// whatever a crash interleaved — and each that ran keeps its attempt (output, error,
/// record) in its history. The sender's iteration counter goes up by one, an enclosed
/// loop's counter back to 0.
pub(crate) fn loop_back(
    def: &Definition,
    inst: &WorkflowInstance,
    outputs: &BTreeMap<String, Value>,
    limits: HistoryLimits,
    (sender, target): (usize, usize),
    now: Instant,
) -> Transition {
    let plan = def.plan();
    let body = plan.loop_body(sender).unwrap_or_else(|| {
        let mut only = vec![false; plan.steps().len()];
        only[target] = true;
        only
    });
    // A loop whose body lies strictly inside this one is entered again: its counter
    // starts over. No other counter is touched, so two loops never reset each other
    // and every loop stays bounded (by the product of the maximums around it).
    let enclosed = |j: usize| {
        plan.loop_body(j).is_some_and(|inner| inner != body && inner.iter().zip(&body).all(|(i, o)| !*i || *o))
    };
    let run = inst.retry_count;
    let mut resets = Vec::new();
    let mut outputs_unset = Vec::new();
    for (j, s) in inst.steps.iter().enumerate().filter(|(j, _)| body[*j]) {
        let ran = s.status != StepStatus::Pending || s.attempt > 0 || s.record.is_some();
        let output = outputs.get(&s.name).cloned();
        if output.is_some() {
            outputs_unset.push(s.name.clone());
        }
        let history = if ran {
            let entry = HistoryEntry {
                run,
                epoch: s.epoch,
                reason: HistoryReason::Loop,
                output,
                error: s.error.clone(),
                record: s.record.clone(),
                at: now,
            };
            limits.push(s.history.clone(), entry)
        } else {
            s.history.clone()
        };
        let iterations = if j == sender {
            Some(s.iterations.saturating_add(1))
        } else if s.iterations > 0 && enclosed(j) {
            Some(0)
        } else {
            None
        };
        resets.push((j, s.epoch.saturating_add(1), history, iterations));
    }
    let clear_resume = inst.resume.as_ref().is_some_and(|r| body.get(r.step_index as usize).copied().unwrap_or(false));
    Transition::loop_back(sender, resets, outputs_unset, clear_resume, now)
}

/// The skip of step `idx` that a control stop classified as skipped (its policy skips a
/// failed step): a skipped step has no output (K-4.4, `BranchInputs::output`), so a sender
/// skipped at its maximum loses the output it completed with.
pub(crate) fn stop_skip(
    def: &Definition,
    idx: usize,
    outputs: &BTreeMap<String, Value>,
    error: StepError,
    elapsed_ms: DurationMs,
    now: Instant,
) -> Transition {
    let mut t = Transition::skip_step(idx, error, elapsed_ms, now);
    let name = def.steps()[idx].name();
    if outputs.contains_key(name) {
        t.outputs_unset.push(name.to_string());
    }
    t
}

/// Whether the committed control write `t` sends a streaming step round again, so the
/// client stream starts over (K-16).
pub(crate) fn resets_stream(def: &Definition, t: &Transition) -> bool {
    t.kind() == TransitionKind::LoopBack && t.steps.iter().any(|p| def.steps()[p.index as usize].is_streaming())
}

/// Whether the control pass's next decision (`decide`, asked only when it matters) is a
/// loop-back whose body holds every halted member of `wave`, each halted only for now (a
/// wait, a yield, a retry, a park, a deferral — never a failure, a cancellation or a dead
/// letter, which stand). Then the halts belong to an iteration that is over: the loop-back
/// is taken now and they run again in the next one.
pub(crate) fn supersedes(
    def: &Definition,
    wave: &[(usize, Option<Halt>)],
    decide: impl FnOnce() -> Option<Control>,
) -> bool {
    let halted: Vec<usize> = wave.iter().filter(|(_, h)| h.is_some()).map(|(i, _)| *i).collect();
    if halted.is_empty()
        || wave
            .iter()
            .any(|(_, h)| matches!(h, Some(Halt::Failed { .. } | Halt::Canceled { .. } | Halt::DeadLetter { .. })))
    {
        return false;
    }
    // Exactly what the control pass will do next: only a loop-back whose body holds
    // every halted member supersedes them (a stop, a skip or another sender's loop
    // leaves their halts to stand).
    match decide() {
        Some(Control::LoopBack { sender, .. }) => def
            .plan()
            .loop_body(sender)
            .is_some_and(|body| halted.iter().all(|&h| body.get(h).copied().unwrap_or(false))),
        _ => false,
    }
}

#[cfg(test)]
#[path = "control_tests.rs"]
mod tests;
