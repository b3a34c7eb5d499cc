//! Table tests of the compensation plan (K-17.6), row by row.

use super::*;
use crate::compensation::CompensationOutcome;
use crate::domain::DurationMs;
use crate::engine::test_fixtures::{at, def, step, NOW};

fn inverse() -> impl crate::activity::Activity {
    |_ctx: crate::activity::ActivityContext| async {
        Ok::<_, crate::activity::ActivityError>(crate::activity::StepOutcome::Complete(serde_json::Value::Null))
    }
}

/// A step standing at `status`, completed by the write of revision `rev` when given, and
/// finished at a stored time that must not matter (a later step is stamped earlier).
fn done(name: &str, status: StepStatus, rev: Option<u64>) -> Step {
    let mut s = at(name, status);
    s.completed_revision = rev;
    s.finished_at = rev.map(|r| Instant::from_millis(1_000 - r as i64));
    s
}

#[test]
fn k17_6_which_inverses_run_row_by_row() {
    use StepStatus::*;
    // a ← b ← c; a and b declare an inverse, c does not.
    let d = def(vec![
        step("a").compensate_with(inverse()),
        step("b").depends_on(["a"]).compensate_with(inverse()),
        step("c").depends_on(["b"]),
    ]);
    type Row = (&'static str, [(StepStatus, Option<u64>); 3], Option<Vec<usize>>);
    let rows: Vec<Row> = vec![
        (
            "every completed compensable step, latest first",
            [(Completed, Some(10)), (Completed, Some(20)), (Completed, Some(30))],
            Some(vec![1, 0]),
        ),
        (
            "a step that did not complete is not undone",
            [(Completed, Some(10)), (Failed, Some(20)), (Pending, None)],
            Some(vec![0]),
        ),
        ("a skipped step is not undone", [(Completed, Some(10)), (Skipped, Some(20)), (Pending, None)], Some(vec![0])),
        (
            "nothing completed: a plan of nothing, still a report",
            [(Failed, Some(1)), (Pending, None), (Pending, None)],
            Some(vec![]),
        ),
        (
            "the dependent first whatever the stamps say",
            [(Completed, Some(30)), (Completed, Some(10)), (Completed, Some(40))],
            Some(vec![1, 0]),
        ),
        (
            "completed before the stamp existed: dependency order",
            [(Completed, None), (Completed, None), (Completed, None)],
            Some(vec![1, 0]),
        ),
    ];
    for (name, stands, want) in rows {
        let steps: Vec<Step> = ["a", "b", "c"].iter().zip(stands).map(|(n, (st, rev))| done(n, st, rev)).collect();
        assert_eq!(plan(&d, &steps), want, "{name}");
    }
    let none = def(vec![step("a"), step("b").depends_on(["a"])]);
    let steps = vec![done("a", Completed, Some(1)), done("b", Completed, Some(2))];
    assert_eq!(plan(&none, &steps), None, "no inverse declared: no compensation at all");
}

/// K-17.6 amendment: a dependency through a step without an inverse still orders: a ← b
/// ← c, a and c compensable, b not; x independent of all.
#[test]
fn k17_6_a_dependency_through_a_plain_step_still_orders() {
    use StepStatus::*;
    let d = def(vec![
        step("a").compensate_with(inverse()),
        step("b").depends_on(["a"]),
        step("c").depends_on(["b"]).compensate_with(inverse()),
        step("x").compensate_with(inverse()),
    ]);
    let steps = vec![
        done("a", Completed, Some(9)),
        done("b", Completed, Some(3)),
        done("c", Completed, Some(4)),
        done("x", Completed, Some(6)),
    ];
    // `a` is stamped last (9) but waits for `c`, which depends on it through `b`.
    assert_eq!(plan(&d, &steps), Some(vec![3, 2, 0]));
}

fn c(index: usize, rev: Option<u64>, depends_on: &[usize]) -> Candidate {
    Candidate { index, completed_revision: rev, depends_on: depends_on.to_vec() }
}

#[test]
fn k17_6_the_order_rule_of_the_inverses_row_by_row() {
    let rows: Vec<(&str, Vec<Candidate>, Vec<usize>)> = vec![
        ("nothing to order", vec![], vec![]),
        (
            "independent: reverse completion order",
            vec![c(0, Some(10), &[]), c(1, Some(30), &[]), c(2, Some(20), &[])],
            vec![1, 2, 0],
        ),
        (
            "a dependent before its dependency, even stamped earlier",
            vec![c(0, Some(20), &[]), c(1, Some(10), &[0])],
            vec![1, 0],
        ),
        (
            "transitively: the dependency waits for every dependent",
            vec![c(0, Some(50), &[]), c(1, Some(10), &[0]), c(2, Some(5), &[0, 1]), c(3, Some(30), &[])],
            vec![3, 2, 1, 0],
        ),
        (
            "reserve, capture and two independent steps: refund before unreserve",
            vec![c(0, Some(4), &[]), c(1, Some(3), &[0]), c(2, Some(2), &[]), c(3, Some(6), &[])],
            vec![3, 1, 0, 2],
        ),
        ("a tie of stamps: the later step first", vec![c(0, Some(7), &[]), c(1, Some(7), &[])], vec![1, 0]),
        (
            "no stamp: dependency order, then the later step",
            vec![c(0, None, &[]), c(1, None, &[0]), c(2, None, &[])],
            vec![2, 1, 0],
        ),
        (
            "no stamp counts as earlier than any stamp",
            vec![c(0, None, &[]), c(1, Some(1), &[]), c(2, None, &[])],
            vec![1, 2, 0],
        ),
        ("a stored cycle still yields every step once", vec![c(0, Some(1), &[1]), c(1, Some(2), &[0])], vec![1, 0]),
    ];
    for (name, candidates, want) in rows {
        assert_eq!(order_inverses(candidates), want, "{name}");
    }
}

#[test]
fn k17_6_a_failed_inverse_is_retried_only_while_transient_and_attempts_remain() {
    use ErrorClass::*;
    let rows = [
        (Transient, 1, 3, true),
        (Transient, 2, 3, true),
        (Transient, 3, 3, false),
        (Permanent, 1, 3, false),
        (UnknownOutcome, 1, 3, false),
        (Canceled, 1, 3, false),
        (Transient, 1, 1, false),
    ];
    for (class, attempts, max, want) in rows {
        assert_eq!(retries_inverse(class, attempts, max), want, "{class:?} after {attempts} of {max}");
    }
}

#[test]
fn k17_6_the_kept_error_is_printable_and_bounded() {
    let long = "é".repeat(INVERSE_ERROR_BYTES_MAX);
    let rows: Vec<(&str, String, String)> = vec![
        ("plain", "refund refused".into(), "refund refused".into()),
        ("control characters become spaces", "a\0b\nc\td".into(), "a b c d".into()),
        ("cut at a character boundary", long.clone(), "é".repeat(INVERSE_ERROR_BYTES_MAX / 2)),
    ];
    for (name, message, want) in rows {
        assert_eq!(inverse_error(&message), want, "{name}");
    }
}

#[test]
fn k17_5_k17_6_the_escalation_task_of_an_inverse() {
    assert_eq!(escalation_task_id("wf-1|2:pay|0"), "wf-1|2:pay|0|c|h0");
    let e = Escalated {
        id: "id-1".into(),
        workflow_id: "wf-1",
        workflow_type: "order",
        step: "pay",
        error: "gateway down",
    };
    let task = escalation_task(e, vec!["finance".into()], "f".repeat(32), NOW, DurationMs::from_millis(60_000));
    assert_eq!(task.title, "Undo step `pay` by hand: its inverse kept failing (gateway down)");
    assert_eq!((task.id.as_str(), task.workflow_id.as_str(), task.workflow_type.as_str()), ("id-1", "wf-1", "order"));
    assert_eq!((task.step.as_str(), task.level, task.assignee.clone()), ("pay", 0, None));
    assert_eq!((task.roles.clone(), task.token.clone()), (vec!["finance".to_string()], "f".repeat(32)));
    assert_eq!((task.created_at, task.due_at, task.status), (NOW, Instant::from_millis(1_060_000), TaskStatus::Open));
    assert!(task.validate().is_ok(), "{:?}", task.validate());
    let long = "x".repeat(TASK_TEXT_BYTES_MAX);
    let e = Escalated { id: "id-1".into(), workflow_id: "wf-1", workflow_type: "order", step: "pay", error: &long };
    let task = escalation_task(e, Vec::new(), "f".repeat(32), NOW, DurationMs::ZERO);
    assert_eq!(task.title.len(), TASK_TEXT_BYTES_MAX);
}

fn run(result: InverseResult) -> InverseRun {
    let task = (result == InverseResult::Escalated).then(|| "task-1".to_string());
    let error = (result != InverseResult::Compensated).then(|| "e".to_string());
    InverseRun { step: "s".into(), result, attempts: 1, error, task }
}

#[test]
fn k17_6_the_report_and_the_steps_undone_row_by_row() {
    use InverseResult::*;
    type Row = (&'static str, Vec<(usize, InverseResult)>, CompensationOutcome, Vec<usize>);
    let rows: Vec<Row> = vec![
        ("none to run", vec![], CompensationOutcome::Recovered, vec![]),
        ("all undone", vec![(2, Compensated), (0, Compensated)], CompensationOutcome::Recovered, vec![2, 0]),
        ("one escalated", vec![(2, Compensated), (0, Escalated)], CompensationOutcome::Escalated, vec![2]),
        ("one failed", vec![(2, Failed), (0, Compensated)], CompensationOutcome::PartiallyRecovered, vec![0]),
        ("all failed", vec![(2, Failed)], CompensationOutcome::CompensationFailed, vec![]),
    ];
    for (name, runs, outcome, undone) in rows {
        let n = runs.len();
        let (r, u) = report(runs.into_iter().map(|(i, res)| (i, run(res))).collect(), NOW);
        assert_eq!((r.outcome, u, r.steps.len(), r.at), (outcome, undone, n, NOW), "{name}");
    }
    assert_eq!(kept_failing("s", 3, "e".into(), Some("task-1".into())).result, Escalated);
    assert_eq!(kept_failing("s", 3, "e".into(), None).result, Failed);
}

/// K-17.6 amendment: without a prepared context no inverse runs; each is reported with no
/// attempt and the reason, under the one task that escalates all of them, or failed
/// without a task; the report says so.
#[test]
fn k17_6_inverses_without_a_prepared_context_row_by_row() {
    use InverseResult::{Escalated, Failed};
    let error = no_context_error(5);
    assert_eq!(error, "not run: no prepared context (PrepareContext failed 5 times)");
    type Row = (&'static str, Option<&'static str>, InverseResult, CompensationOutcome);
    let rows: Vec<Row> = vec![
        ("one task for all of them", Some("t-1"), Escalated, CompensationOutcome::Escalated),
        ("no inbox: failed, recorded", None, Failed, CompensationOutcome::CompensationFailed),
    ];
    for (name, task, result, outcome) in rows {
        let runs = not_run(vec![(3, "capture"), (0, "reserve")], &error, task.map(String::from));
        assert_eq!(runs.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![3, 0], "{name}: the plan's order");
        for (_, r) in &runs {
            assert_eq!((r.result, r.attempts, r.error.as_deref(), r.task.as_deref()), (result, 0, Some(&*error), task));
        }
        let (report, undone) = report(runs, NOW);
        assert_eq!((report.outcome, undone), (outcome, vec![]), "{name}: nothing undone");
    }
    let e = super::Escalated {
        id: "id-1".into(),
        workflow_id: "wf-1",
        workflow_type: "order",
        step: "capture",
        error: &error,
    };
    let task = no_context_task(e, 2, vec!["finance".into()], "f".repeat(32), NOW, DurationMs::ZERO);
    assert_eq!(
        task.title,
        "Undo 2 step(s) by hand, starting with `capture`: no inverse ran (not run: no prepared context \
         (PrepareContext failed 5 times))"
    );
    assert!(task.validate_new().is_ok());
}

fn entry(step: &str, result: InverseResult, attempts: u32) -> InverseRun {
    InverseRun { step: step.into(), result, attempts, error: None, task: None }
}

#[test]
fn k17_6_where_a_recorded_compensation_stands_row_by_row() {
    use crate::compensation::{CompensationOutcome as O, CompensationReport};
    let at = Instant::from_millis(5_000);
    let report = |outcome, steps| CompensationReport { outcome, steps, at };
    let ongoing = report(O::InProgress, vec![entry("b", InverseResult::Retrying, 1)]);
    let finished = report(O::Recovered, vec![entry("b", InverseResult::Compensated, 1)]);
    assert_eq!(progress_of(None), Progress::Fresh);
    assert_eq!(progress_of(Some(&ongoing)), Progress::Ongoing { runs: ongoing.steps.clone(), due: at });
    assert_eq!(progress_of(Some(&finished)), Progress::Finished(finished.clone()));
}

#[test]
fn k17_6_what_happens_to_each_inverse_given_the_progress_row_by_row() {
    let due = Instant::from_millis(5_000);
    let runs = vec![
        entry("done", InverseResult::Compensated, 2),
        entry("gave-up", InverseResult::Escalated, 3),
        entry("retrying", InverseResult::Retrying, 2),
    ];
    let rows: Vec<(&str, &str, Option<Instant>, Instant, NextInverse)> = vec![
        ("not run yet", "fresh", Some(due), due, NextInverse::Run { attempts: 0 }),
        ("finished: kept", "done", Some(due), due, NextInverse::Recorded(runs[0].clone())),
        ("escalated: kept, never escalated again", "gave-up", Some(due), due, NextInverse::Recorded(runs[1].clone())),
        (
            "retrying, not due",
            "retrying",
            Some(due),
            Instant::from_millis(4_999),
            NextInverse::NotYet { run: runs[2].clone(), until: due },
        ),
        ("retrying, due", "retrying", Some(due), due, NextInverse::Run { attempts: 2 }),
        ("retrying, no due time", "retrying", None, Instant::ZERO, NextInverse::Run { attempts: 2 }),
    ];
    for (name, step, due, now, want) in rows {
        assert_eq!(next_inverse(&runs, due, step, now, 3), want, "{name}");
    }
    // Every attempt made and the last one never reported (its process ended): given up,
    // due or not.
    assert_eq!(next_inverse(&runs, Some(due), "retrying", Instant::ZERO, 2), NextInverse::GiveUp { attempts: 2 });
    assert_eq!(started("b", 3), entry("b", InverseResult::Retrying, 3));
}

#[test]
fn k17_6_when_a_failed_inverse_is_tried_again_row_by_row() {
    use crate::definition::RetryPolicy;
    use crate::domain::{DurationMs, ErrorClass as C};
    let now = Instant::from_millis(10_000);
    let policy =
        RetryPolicy::Exponential { base_ms: DurationMs::from_millis(1_000), cap_ms: DurationMs::from_millis(60_000) };
    let rows: Vec<(&str, C, u32, u64, Option<Instant>)> = vec![
        ("transient, first attempt: up to base", C::Transient, 1, 999, Some(Instant::from_millis(10_999))),
        ("transient, second attempt: up to twice base", C::Transient, 2, 1_500, Some(Instant::from_millis(11_500))),
        ("the last attempt: given up", C::Transient, 3, 0, None),
        ("permanent: given up at once", C::Permanent, 1, 0, None),
    ];
    for (name, class, attempts, random, want) in rows {
        assert_eq!(next_try(class, attempts, 3, &policy, random, now), want, "{name}");
    }
    assert_eq!(retrying("b", 2, "e".into()).result, InverseResult::Retrying);
}
