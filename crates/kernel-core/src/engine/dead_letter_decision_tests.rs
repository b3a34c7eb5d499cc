//! Table tests of dead-letter resolution (K-17.2, K-17.3), row by row: each decision is
//! applied to a copy of the instance and the resulting step is read back.

use super::*;
use crate::domain::{StepStatus, WorkflowInstance};
use crate::engine::test_fixtures::{at, def, instance, step, NOW};
use crate::record::RecordEntry;
use serde_json::{json, Value};

fn decision(action: DeadLetterAction, reason: Option<&str>) -> DeadLetterDecision {
    DeadLetterDecision { action, actor: "alice".into(), reason: reason.map(Into::into), decided_at: NOW }
}

fn record(status: DeadLetterStatus, decided: Option<DeadLetterDecision>) -> DeadLetter {
    DeadLetter {
        id: "wf-1:b:0".into(),
        workflow_id: "wf-1".into(),
        workflow_type: "t".into(),
        step: "b".into(),
        step_index: 1,
        run: 0,
        epoch: 0,
        error: StepError { class: ErrorClass::Permanent, message: "boom".into() },
        inputs: Value::Null,
        created_at: NOW,
        status,
        decision: decided,
        closed_at: None,
    }
}

#[test]
fn k17_2_a_woken_step_reads_its_record_row_by_row() {
    let retry = decision(DeadLetterAction::Retry, None);
    let rows = [
        ("no record: lost, write it", None, Found::Lost),
        ("open: wait again", Some(record(DeadLetterStatus::Open, None)), Found::Undecided),
        ("decided: apply", Some(record(DeadLetterStatus::Decided, Some(retry.clone()))), Found::Decided(retry.clone())),
        (
            "closed with its decision: apply",
            Some(record(DeadLetterStatus::Closed, Some(retry.clone()))),
            Found::Decided(retry),
        ),
        ("decided without a decision: wait again", Some(record(DeadLetterStatus::Decided, None)), Found::Undecided),
    ];
    for (name, found_record, want) in rows {
        assert_eq!(found(found_record), want, "{name}");
    }
}

#[test]
fn k17_2_which_steps_are_dead_lettered_row_by_row() {
    let query = |_ctx: crate::activity::ActivityContext| async { Ok(crate::definition::QueryAnswer::NotDone) };
    let d = def(vec![
        step("plain"),
        step("policy").on_failed(OnFailed::DeadLetter),
        step("queried").on_unknown_outcome(query),
    ]);
    let rows = [
        ("plain, with the port", 0, true, false),
        ("dead-letter policy, without the port", 1, false, true),
        ("query hook, with the port", 2, true, true),
        ("query hook, without the port", 2, false, false),
    ];
    for (name, i, has_port, want) in rows {
        assert_eq!(dead_letters(&d.steps()[i], has_port), want, "{name}");
    }
}

/// The instance with `applied`'s write applied, and the operator entry it recorded (from
/// the step's record, or from the history entry a retry moved it to).
fn applied_to(inst: &WorkflowInstance, a: &Applied) -> (WorkflowInstance, Option<OperatorEntry>) {
    let mut inst = inst.clone();
    a.transition.apply_to(&mut inst);
    let s = &inst.steps[1];
    let record = s.record.as_ref().or_else(|| s.history.last().and_then(|h| h.record.as_ref()));
    let entry = record.and_then(|r| {
        r.entries.iter().rev().find_map(|e| match e {
            RecordEntry::Operator(o) => Some(o.clone()),
            _ => None,
        })
    });
    (inst, entry)
}

#[test]
fn k17_2_k17_3_each_decision_becomes_one_write_row_by_row() {
    let d = def(vec![step("a"), step("b").depends_on(["a"]).on_failed(OnFailed::DeadLetter)]);
    let mut b = at("b", StepStatus::Pending);
    b.epoch = 2;
    b.error = Some(StepError { class: ErrorClass::Permanent, message: "boom".into() });
    let inst = instance(&d, vec![at("a", StepStatus::Completed), b]);
    let big = json!("x".repeat(5_000));
    type Row = (&'static str, DeadLetterDecision, StepStatus, u32, Option<&'static str>, AfterDecision);
    let rows: Vec<Row> = vec![
        (
            "retry: the next epoch",
            decision(DeadLetterAction::Retry, None),
            StepStatus::Pending,
            3,
            None,
            AfterDecision::Continue,
        ),
        (
            "complete: the operator's output",
            decision(DeadLetterAction::Complete { output: json!({"ok": 1}) }, None),
            StepStatus::Completed,
            2,
            None,
            AfterDecision::Continue,
        ),
        (
            "fail without a reason",
            decision(DeadLetterAction::Fail, None),
            StepStatus::Failed,
            2,
            Some("failed by alice"),
            AfterDecision::Fail,
        ),
        (
            "fail with a reason",
            decision(DeadLetterAction::Fail, Some("card stolen")),
            StepStatus::Failed,
            2,
            Some("failed by alice: card stolen"),
            AfterDecision::Fail,
        ),
        (
            "complete with a large output",
            decision(DeadLetterAction::Complete { output: big.clone() }, None),
            StepStatus::Completed,
            2,
            None,
            AfterDecision::Continue,
        ),
    ];
    for (name, dec, status, epoch, message, then) in rows {
        let a = apply(1, &inst.steps[1], 0, &dec, OutcomeAuthority::ActivityOrOperator, HistoryLimits::default(), NOW);
        assert_eq!(a.then, then, "{name}");
        let (after, entry) = applied_to(&inst, &a);
        let s = &after.steps[1];
        assert_eq!((s.status, s.epoch), (status, epoch), "{name}");
        let entry = entry.unwrap_or_else(|| panic!("{name}: the operator's entry is recorded"));
        assert_eq!((entry.actor.as_str(), entry.at), ("alice", NOW), "{name}");
        if let Some(m) = message {
            assert_eq!(
                s.error.as_ref().map(|e| (e.class, e.message.as_str())),
                Some((ErrorClass::Permanent, m)),
                "{name}"
            );
        }
        match &dec.action {
            DeadLetterAction::Complete { output } => {
                assert_eq!(after.output.get("b"), Some(output), "{name}: the output is the step's");
                let small = output != &big;
                assert_eq!(entry.output.is_some(), small, "{name}: the record keeps only a small output");
            }
            DeadLetterAction::Retry => {
                let h = s.history.last().expect("the attempt goes to the history");
                assert_eq!(
                    (h.epoch, h.reason, h.error.clone()),
                    (2, HistoryReason::DeadLetterRetry, inst.steps[1].error.clone())
                );
                assert!(s.record.is_none() && s.error.is_none(), "{name}: a fresh attempt");
            }
            DeadLetterAction::Fail => assert!(entry.output.is_none(), "{name}"),
        }
    }
}

#[test]
fn k17_3_the_entry_joins_the_record_of_this_logical_attempt_only() {
    let d = def(vec![step("a"), step("b").depends_on(["a"])]);
    let mut b = at("b", StepStatus::Pending);
    let mut current = StepRecord::new(0, 0);
    current.entries.push(RecordEntry::Value(crate::record::RecordedValue {
        label: "x".into(),
        value: json!(1),
        recorded_at: NOW,
    }));
    b.record = Some(current);
    let inst = instance(&d, vec![at("a", StepStatus::Completed), b]);
    let fail = decision(DeadLetterAction::Fail, None);
    // Same run: the entry is appended to the existing record.
    let (after, _) = applied_to(
        &inst,
        &apply(1, &inst.steps[1], 0, &fail, OutcomeAuthority::ActivityOrOperator, HistoryLimits::default(), NOW),
    );
    assert_eq!(after.steps[1].record.as_ref().map(|r| r.entries.len()), Some(2));
    // Another run: a fresh record of that run holds the entry alone.
    let (after, _) = applied_to(
        &inst,
        &apply(1, &inst.steps[1], 1, &fail, OutcomeAuthority::ActivityOrOperator, HistoryLimits::default(), NOW),
    );
    let r = after.steps[1].record.as_ref().expect("a record");
    assert_eq!((r.entries.len(), r.run), (1, 1));
}

/// K-17.2 amendment: a `Complete` of a step whose outcome only its own activity may supply
/// (a human task) is applied as a retry — the next epoch, so the task re-opens — and
/// recorded as refused with the output's digest; any other step takes it as decided.
#[test]
fn k17_2_an_operator_output_never_completes_a_step_of_activity_only_authority() {
    let d = def(vec![step("a"), step("b").depends_on(["a"])]);
    let inst = instance(&d, vec![at("a", StepStatus::Completed), at("b", StepStatus::Waiting)]);
    let forged = decision(DeadLetterAction::Complete { output: json!({"approved": true}) }, None);
    let rows = [
        (OutcomeAuthority::ActivityOrOperator, StepStatus::Completed, 0, "complete"),
        (OutcomeAuthority::ActivityOnly, StepStatus::Pending, 1, "complete_refused"),
    ];
    for (authority, status, epoch, recorded) in rows {
        let a = apply(1, &inst.steps[1], 0, &forged, authority, HistoryLimits::default(), NOW);
        assert_eq!(a.then, AfterDecision::Continue, "{authority:?}");
        let (after, entry) = applied_to(&inst, &a);
        assert_eq!((after.steps[1].status, after.steps[1].epoch), (status, epoch), "{authority:?}");
        let entry = entry.unwrap_or_else(|| {
            after.steps[1]
                .history
                .last()
                .and_then(|h| h.record.as_ref())
                .and_then(|r| {
                    r.entries.iter().find_map(|e| match e {
                        RecordEntry::Operator(o) => Some(o.clone()),
                        _ => None,
                    })
                })
                .expect("the entry is recorded")
        });
        assert_eq!(entry.action.to_string(), recorded, "{authority:?}");
        assert!(entry.output_digest.is_some(), "{authority:?}: the output leaves its digest");
        assert_eq!(after.output.contains_key("b"), status == StepStatus::Completed, "{authority:?}");
    }
}
