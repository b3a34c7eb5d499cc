//! The independent oracle of the real-process runs: what activities did to the outside
//! world, recorded by the activities themselves in an append-only file, judged against the
//! store after every process has stopped. Pure: reading files and stores happens elsewhere.
//!
//! # What is recorded
//!
//! Every execution of an effect step appends one line *before* it returns (the side
//! effect itself): its K-17.1 idempotency key, the workflow, the step, the workflow run,
//! the physical attempt the store gave the entry (`attempt`, moved only by mark-running),
//! the claim token it ran under and its process id. The line is one `write` on a file
//! opened for appending, so lines of several processes never interleave and a SIGKILL
//! leaves either the whole line or nothing.
//!
//! Every step of the workflows judged here also returns `{"attempt", "token"}` of its
//! entry as its output, so the store's committed output says which entry's completion
//! the store accepted.
//!
//! # What is judged
//!
//! - **applied effects**: the outside world deduplicates by key (as a payment API does
//!   with an idempotency key): the first line of a key is the effect, later lines of the
//!   same key are re-executions it recognised (`redelivered`, expected after a kill in
//!   the middle of a step).
//! - `duplicate_effects`: a step whose effect was applied under more than one key (the
//!   key was not stable across the re-executions of one run, so the outside world applied
//!   it twice).
//! - `lost`: a workflow the store does not show completed, or a completed one without an
//!   applied effect for one of its effect steps.
//! - `stale_writes_accepted`: a completed step whose committed output comes from an entry
//!   that was superseded before the completion was accepted. An entry `n` is superseded
//!   once entry `n+1` of the same step is marked running (by a claim that took over after
//!   the lease of `n` ran out); a completion the store accepts afterwards must carry the
//!   newest entry. So a step is counted when its output's `attempt` is below the store's
//!   `attempt` counter for the step or below an attempt the oracle saw entered. (Tokens
//!   are not compared: a step resumed after a durable sleep continues the same attempt
//!   under a new claim. A late write to a step the successor had not entered yet is not
//!   distinguishable here; the store's claim-token guard is tested for it by the
//!   conformance suites.)

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// One line of the oracle file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effect {
    /// The K-17.1 idempotency key the activity used.
    pub key: String,
    /// The workflow.
    pub workflow_id: String,
    /// The step (the activity type).
    pub step: String,
    /// The physical attempt of the entry.
    pub attempt: u64,
    /// The claim token of the entry.
    pub token: String,
    /// The process that ran it.
    pub pid: u64,
}

impl Effect {
    /// Read one line; `None` for a line that is not an effect.
    pub fn parse(v: &Value) -> Option<Effect> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        let n = |k: &str| v.get(k).and_then(Value::as_u64);
        Some(Effect {
            key: s("key")?,
            workflow_id: s("wf")?,
            step: s("step")?,
            attempt: n("attempt")?,
            token: s("token")?,
            pid: n("pid")?,
        })
    }
}

/// A step as the store holds it after the run.
#[derive(Debug, Clone, PartialEq)]
pub struct StepView {
    /// Step name.
    pub name: String,
    /// Whether its status is completed.
    pub completed: bool,
    /// The store's attempt counter.
    pub attempt: u64,
    /// The committed output (`{"attempt", "token", …}`), if any.
    pub output: Option<Value>,
}

/// A workflow as the store holds it after the run; `None` steps when it does not exist.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowView {
    /// The workflow.
    pub workflow_id: String,
    /// Whether its status is completed.
    pub completed: bool,
    /// Its steps.
    pub steps: Vec<StepView>,
}

impl WorkflowView {
    /// The view of an instance read from the store.
    pub fn of(inst: &kernel_core::WorkflowInstance) -> Self {
        WorkflowView {
            workflow_id: inst.workflow_id.to_string(),
            completed: inst.status == kernel_core::WorkflowStatus::Completed,
            steps: inst
                .steps
                .iter()
                .map(|s| StepView {
                    name: s.name.clone(),
                    completed: s.status == kernel_core::StepStatus::Completed,
                    attempt: u64::from(s.attempt),
                    output: inst.output.get(&s.name).cloned(),
                })
                .collect(),
        }
    }
}

/// The counts of a run, read from the store and the oracle only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Workflows the store shows completed.
    pub completed: usize,
    /// Steps whose effect was applied under more than one key (each extra key counts).
    pub duplicate_effects: usize,
    /// Completed steps whose accepted completion came from a superseded entry.
    pub stale_writes_accepted: usize,
    /// Workflows not completed, or completed without an applied effect of an effect step.
    pub lost: usize,
    /// Effect lines whose key was already applied (re-executions the outside world
    /// recognised by the key).
    pub redelivered: usize,
    /// Distinct keys applied.
    pub applied: usize,
}

impl std::ops::AddAssign for Verdict {
    /// The counts of two disjoint sets of workflows (judged apart because their effect
    /// steps differ) added up.
    fn add_assign(&mut self, o: Verdict) {
        self.completed += o.completed;
        self.duplicate_effects += o.duplicate_effects;
        self.stale_writes_accepted += o.stale_writes_accepted;
        self.lost += o.lost;
        self.redelivered += o.redelivered;
        self.applied += o.applied;
    }
}

/// Judge a run: `expected` are the workflow ids started, `store` what the store holds
/// (missing ids count as lost), `effects` the oracle's lines, `effect_steps` the steps
/// that write to the oracle.
pub fn judge(expected: &[String], store: &[WorkflowView], effects: &[Effect], effect_steps: &[&str]) -> Verdict {
    let mut v = Verdict::default();
    let mut keys_of: BTreeMap<(&str, &str), BTreeSet<&str>> = BTreeMap::new();
    let mut seen_keys: BTreeSet<&str> = BTreeSet::new();
    let mut max_entered: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for e in effects {
        if !seen_keys.insert(&e.key) {
            v.redelivered += 1;
        }
        keys_of.entry((&e.workflow_id, &e.step)).or_default().insert(&e.key);
        let m = max_entered.entry((&e.workflow_id, &e.step)).or_insert(0);
        *m = (*m).max(e.attempt);
    }
    v.applied = seen_keys.len();
    v.duplicate_effects = keys_of.values().map(|k| k.len().saturating_sub(1)).sum();
    let by_id: BTreeMap<&str, &WorkflowView> = store.iter().map(|w| (w.workflow_id.as_str(), w)).collect();
    for id in expected {
        let Some(w) = by_id.get(id.as_str()) else {
            v.lost += 1;
            continue;
        };
        let missing_effect = effect_steps.iter().any(|s| keys_of.get(&(id.as_str(), *s)).is_none_or(|k| k.is_empty()));
        if w.completed && !missing_effect {
            v.completed += 1;
        } else if w.completed {
            v.completed += 1;
            v.lost += 1;
        } else {
            v.lost += 1;
        }
        for s in w.steps.iter().filter(|s| s.completed) {
            let out = s.output.as_ref();
            let Some(attempt) = out.and_then(|o| o.get("attempt")).and_then(Value::as_u64) else {
                // A completion that does not say which entry wrote it cannot be judged
                // fresh: count it.
                v.stale_writes_accepted += 1;
                continue;
            };
            let entered = max_entered.get(&(id.as_str(), s.name.as_str())).copied().unwrap_or(0);
            if attempt < s.attempt || attempt < entered {
                v.stale_writes_accepted += 1;
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn effect(wf: &str, step: &str, key: &str, attempt: u64, token: &str) -> Effect {
        Effect { key: key.into(), workflow_id: wf.into(), step: step.into(), attempt, token: token.into(), pid: 1 }
    }

    fn step(name: &str, attempt: u64, out_attempt: u64, token: &str) -> StepView {
        StepView {
            name: name.into(),
            completed: true,
            attempt,
            output: Some(json!({ "attempt": out_attempt, "token": token })),
        }
    }

    fn wf(id: &str, steps: Vec<StepView>) -> WorkflowView {
        WorkflowView { workflow_id: id.into(), completed: true, steps }
    }

    #[test]
    fn a_clean_run_with_a_re_execution_counts_nothing_wrong() {
        // Entry 1 of `pay` was killed after its effect; entry 2 re-ran it under the same
        // key and completed: one applied effect, one recognised redelivery.
        let effects = [effect("w1", "pay", "k1", 1, "t1"), effect("w1", "pay", "k1", 2, "t2")];
        let store = [wf("w1", vec![step("pay", 2, 2, "t2")])];
        let v = judge(&["w1".into()], &store, &effects, &["pay"]);
        assert_eq!(
            v,
            Verdict {
                completed: 1,
                duplicate_effects: 0,
                stale_writes_accepted: 0,
                lost: 0,
                redelivered: 1,
                applied: 1
            }
        );
    }

    #[test]
    fn a_completion_from_a_superseded_entry_is_a_stale_write() {
        // Entry 2 (token t2) was entered after t1's lease ran out, yet the store holds
        // entry 1's completion.
        let effects = [effect("w1", "pay", "k1", 1, "t1"), effect("w1", "pay", "k1", 2, "t2")];
        let by_counter = [wf("w1", vec![step("pay", 2, 1, "t1")])];
        assert_eq!(judge(&["w1".into()], &by_counter, &effects, &["pay"]).stale_writes_accepted, 1);
        // Even if the store's counter had not moved, the oracle saw entry 2 entered.
        let by_oracle = [wf("w1", vec![step("pay", 1, 1, "t1")])];
        assert_eq!(judge(&["w1".into()], &by_oracle, &effects, &["pay"]).stale_writes_accepted, 1);
        // A step resumed after a durable sleep completes its attempt under a new claim.
        let resumed = [wf("w1", vec![step("pay", 2, 2, "t9")])];
        assert_eq!(judge(&["w1".into()], &resumed, &effects, &["pay"]).stale_writes_accepted, 0);
        // A completion that does not say which entry wrote it cannot be judged fresh.
        let mut unmarked = wf("w1", vec![step("pay", 2, 2, "t2")]);
        unmarked.steps[0].output = Some(json!({}));
        assert_eq!(judge(&["w1".into()], &[unmarked], &effects, &["pay"]).stale_writes_accepted, 1);
    }

    #[test]
    fn an_effect_under_two_keys_is_a_duplicate_and_a_missing_one_is_lost() {
        let effects = [effect("w1", "pay", "k1", 1, "t1"), effect("w1", "pay", "k1-bis", 2, "t2")];
        let store = [wf("w1", vec![step("pay", 2, 2, "t2")]), wf("w2", vec![step("pay", 1, 1, "t3")])];
        let v = judge(&["w1".into(), "w2".into(), "w3".into()], &store, &effects, &["pay"]);
        assert_eq!(v.duplicate_effects, 1);
        // w2 completed without an effect line; w3 does not exist.
        assert_eq!((v.completed, v.lost), (2, 2));
    }

    #[test]
    fn a_workflow_not_completed_is_lost() {
        let mut w = wf("w1", vec![]);
        w.completed = false;
        assert_eq!(judge(&["w1".into()], &[w], &[], &[]).lost, 1);
    }

    #[test]
    fn effect_lines_parse_and_other_lines_do_not() {
        let line = json!({ "key": "k", "wf": "w", "step": "s", "attempt": 2, "token": "t", "pid": 7 });
        assert_eq!(Effect::parse(&line), Some(effect("w", "s", "k", 2, "t")).map(|e| Effect { pid: 7, ..e }));
        assert_eq!(Effect::parse(&json!({ "kind": "summary" })), None);
    }
}
