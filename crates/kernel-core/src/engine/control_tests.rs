//! Table tests of the control decisions (K-4 amendment): loops, branches, loop-back writes
//! and superseded halts, row by row.

use super::*;
use crate::domain::{ErrorClass, Resume, ResumeKind};
use crate::engine::test_fixtures::{at, def, instance, outputs, step, NOW};
use crate::transition::Patch;
use serde_json::json;

/// `a → b → c`, `b` loops back to `a` while its output says `again`, at most twice.
fn loop_def() -> Definition {
    def(vec![
        step("a"),
        step("b").depends_on(["a"]).loop_to("a", |o| o["again"] == json!(true)).max_iterations(2),
        step("c").depends_on(["b"]),
    ])
}

/// An entry saying an operator completed the step (K-17.2), in its serialized form.
fn operator_completed(s: &mut Step) {
    let mut record = crate::record::StepRecord::new(0, s.epoch);
    record.entries.push(
        serde_json::from_value(json!({"kind": "operator", "action": "complete", "actor": "op", "at": 0}))
            .expect("an operator entry"),
    );
    s.record = Some(record);
}

#[test]
fn k4_loop_decisions_row_by_row() {
    use StepStatus::*;
    type Row = (&'static str, StepStatus, u32, Option<Value>, bool, Option<Control>);
    let rows: Vec<Row> = vec![
        ("sender not completed", Pending, 0, None, false, None),
        ("predicate false", Completed, 0, Some(json!({"again": false})), false, None),
        (
            "predicate true",
            Completed,
            0,
            Some(json!({"again": true})),
            false,
            Some(Control::LoopBack { sender: 1, target: 0 }),
        ),
        (
            "below its maximum",
            Completed,
            1,
            Some(json!({"again": true})),
            false,
            Some(Control::LoopBack { sender: 1, target: 0 }),
        ),
        (
            "at its maximum",
            Completed,
            2,
            Some(json!({"again": true})),
            false,
            Some(Control::Stop(1, "loop from b to a reached its maximum of 2 iterations".into())),
        ),
        ("completed by an operator", Completed, 0, Some(json!({"again": true})), true, None),
        ("no recorded output reads null", Completed, 0, None, false, None),
    ];
    let d = loop_def();
    for (name, status, iterations, output, by_operator, want) in rows {
        let mut b = at("b", status);
        b.iterations = iterations;
        if by_operator {
            operator_completed(&mut b);
        }
        let steps = vec![at("a", Completed), b, at("c", Pending)];
        let outs = outputs(&output.iter().map(|o| ("b", o.clone())).collect::<Vec<_>>());
        assert_eq!(decide(&d, &steps, &outs), want, "{name}");
    }
}

#[test]
fn k4_a_panicking_loop_predicate_stops_its_sender_and_a_plain_dag_decides_nothing() {
    let d = def(vec![step("a"), step("b").depends_on(["a"]).loop_to("a", |_| panic!("no answer")).max_iterations(1)]);
    let steps = vec![at("a", StepStatus::Completed), at("b", StepStatus::Completed)];
    assert_eq!(
        decide(&d, &steps, &outputs(&[])),
        Some(Control::Stop(1, "the loop predicate panicked: no answer".into()))
    );
    let dag = def(vec![step("a"), step("b").depends_on(["a"])]);
    assert_eq!(decide(&dag, &steps, &outputs(&[("b", json!({"again": true}))])), None);
}

#[test]
fn k4_branch_decisions_row_by_row() {
    use StepStatus::*;
    let d = def(vec![
        step("a"),
        step("b").depends_on(["a"]).when(["a"], |i| i.output("a") == Some(&json!("yes"))),
        step("c").depends_on(["a"]).when(["a"], |i| i.output("a").is_some()),
        step("d").depends_on(["a"]),
    ]);
    type Row = (&'static str, StepStatus, Option<Value>, StepStatus, Option<Control>);
    let rows: Vec<Row> = vec![
        ("both hold", Completed, Some(json!("yes")), Pending, None),
        ("one does not hold", Completed, Some(json!("no")), Pending, Some(Control::Skip(vec![1]))),
        ("a skipped step has no output", Skipped, None, Pending, Some(Control::Skip(vec![1, 2]))),
        ("a running leftover is not skipped", Completed, Some(json!("no")), Running, None),
        ("nothing ready yet", Running, None, Pending, None),
    ];
    for (name, a, out, b, want) in rows {
        let steps = vec![at("a", a), at("b", b), at("c", Pending), at("d", Pending)];
        let outs = outputs(&out.iter().map(|o| ("a", o.clone())).collect::<Vec<_>>());
        assert_eq!(decide(&d, &steps, &outs), want, "{name}");
    }
    let panics = def(vec![step("a"), step("b").depends_on(["a"]).when(["a"], |_| panic!("unreadable"))]);
    let steps = vec![at("a", Completed), at("b", Pending)];
    assert_eq!(
        decide(&panics, &steps, &outputs(&[])),
        Some(Control::Stop(1, "the branch predicate panicked: unreadable".into())),
    );
}

#[test]
fn k4_a_loop_back_is_decided_before_any_branch() {
    let d = def(vec![
        step("a"),
        step("b").depends_on(["a"]).loop_to("a", |_| true).max_iterations(3),
        step("c").depends_on(["a"]).when(["a"], |_| false),
    ]);
    let steps = vec![at("a", StepStatus::Completed), at("b", StepStatus::Completed), at("c", StepStatus::Pending)];
    assert_eq!(decide(&d, &steps, &outputs(&[])), Some(Control::LoopBack { sender: 1, target: 0 }));
}

#[test]
fn k4_a_completion_may_loop_back_row_by_row() {
    let d = def(vec![
        step("a"),
        step("b").depends_on(["a"]).loop_to("a", |o| o == &json!(1)).max_iterations(1),
        step("c").depends_on(["a"]).loop_to("a", |_| panic!("boom")).max_iterations(1),
    ]);
    let rows = [
        ("no loop", 0, json!(1), false),
        ("predicate false", 1, json!(2), false),
        ("predicate true", 1, json!(1), true),
        ("a panic may loop back", 2, json!(1), true),
    ];
    for (name, i, out, want) in rows {
        assert_eq!(may_loop_back(&d.steps()[i], &out), want, "{name}");
    }
}

/// The patched step indices of `t`, with their epoch and iteration changes.
fn resets(t: &Transition) -> Vec<(u32, Option<u32>, Option<u32>)> {
    t.steps.iter().map(|p| (p.index, p.epoch, p.iterations)).collect()
}

#[test]
fn k4_k17_1_the_loop_back_write_row_by_row() {
    let d = loop_def();
    let limits = HistoryLimits::default();
    let mut a = at("a", StepStatus::Completed);
    a.epoch = 3;
    let mut b = at("b", StepStatus::Completed);
    b.iterations = 1;
    let mut inst = instance(&d, vec![a, b, at("c", StepStatus::Pending)]);
    let outs = outputs(&[("a", json!("A")), ("b", json!({"again": true}))]);

    // The body is the target and the sender, never the step after the sender.
    let t = loop_back(&d, &inst, &outs, limits, (1, 0), NOW);
    assert_eq!(t.kind(), TransitionKind::LoopBack);
    assert_eq!(resets(&t), vec![(0, Some(4), None), (1, Some(1), Some(2))]);
    assert_eq!(t.outputs_unset, vec!["a".to_string(), "b".to_string()]);
    assert_eq!(t.resume, None, "no resume to clear");
    // Each step that ran keeps its attempt (its output) in its history.
    let Some(Patch::Set(history)) = &t.steps[0].history else { panic!("a's history is set: {:?}", t.steps[0]) };
    assert_eq!(history.len(), 1);
    assert_eq!(
        (history[0].epoch, history[0].reason, history[0].output.clone()),
        (3, HistoryReason::Loop, Some(json!("A")))
    );

    // A resume of a body step is cleared; one of the step after the sender is kept.
    for (index, cleared) in [(0, true), (2, false)] {
        inst.resume = Some(Resume { kind: ResumeKind::Timer, step_index: index, signal_id: None });
        let t = loop_back(&d, &inst, &outs, limits, (1, 0), NOW);
        assert_eq!(t.resume == Some(Patch::Unset), cleared, "resume of step {index}");
    }

    // A body step that never ran starts its next epoch without a history entry.
    inst.steps[0] = at("a", StepStatus::Pending);
    let t = loop_back(&d, &inst, &outs, limits, (1, 0), NOW);
    assert_eq!(t.steps[0].epoch, Some(1));
    assert_eq!(t.steps[0].history, Some(Patch::Unset), "nothing to keep");
}

#[test]
fn k4_an_enclosed_loop_counter_starts_over_and_no_other() {
    // Inner loop c → b inside outer loop d → a.
    let d = def(vec![
        step("a"),
        step("b").depends_on(["a"]),
        step("c").depends_on(["b"]).loop_to("b", |_| true).max_iterations(5),
        step("d").depends_on(["c"]).loop_to("a", |_| true).max_iterations(5),
    ]);
    let mut steps: Vec<Step> = ["a", "b", "c", "d"].iter().map(|n| at(n, StepStatus::Completed)).collect();
    steps[2].iterations = 2;
    steps[3].iterations = 1;
    let inst = instance(&d, steps);
    let outer = loop_back(&d, &inst, &outputs(&[]), HistoryLimits::default(), (3, 0), NOW);
    let iterations: Vec<_> = outer.steps.iter().map(|p| (p.index, p.iterations)).collect();
    assert_eq!(iterations, vec![(0, None), (1, None), (2, Some(0)), (3, Some(2))]);
    let inner = loop_back(&d, &inst, &outputs(&[]), HistoryLimits::default(), (2, 1), NOW);
    let iterations: Vec<_> = inner.steps.iter().map(|p| (p.index, p.iterations)).collect();
    assert_eq!(iterations, vec![(1, None), (2, Some(3))], "the outer counter is not touched");
}

#[test]
fn k4_a_sender_skipped_at_its_maximum_loses_its_output() {
    let d = loop_def();
    let error = StepError { class: ErrorClass::Permanent, message: "max".into() };
    let with = stop_skip(&d, 1, &outputs(&[("b", json!(1))]), error.clone(), DurationMs::ZERO, NOW);
    assert_eq!(with.outputs_unset, vec!["b".to_string()]);
    assert_eq!(with.steps[0].status, Some(StepStatus::Skipped));
    let without = stop_skip(&d, 1, &outputs(&[("a", json!(1))]), error, DurationMs::ZERO, NOW);
    assert!(without.outputs_unset.is_empty());
}

#[test]
fn k16_only_a_loop_back_over_a_streaming_step_resets_the_stream() {
    let streaming =
        def(vec![step("a").streaming(), step("b").depends_on(["a"]).loop_to("a", |_| true).max_iterations(1)]);
    let plain = loop_def();
    let inst = instance(&streaming, vec![at("a", StepStatus::Completed), at("b", StepStatus::Completed)]);
    let back = loop_back(&streaming, &inst, &outputs(&[]), HistoryLimits::default(), (1, 0), NOW);
    assert!(resets_stream(&streaming, &back));
    assert!(!resets_stream(&streaming, &Transition::branch_skip(&[0], NOW)));
    let inst = instance(
        &plain,
        vec![at("a", StepStatus::Completed), at("b", StepStatus::Completed), at("c", StepStatus::Pending)],
    );
    let back = loop_back(&plain, &inst, &outputs(&[]), HistoryLimits::default(), (1, 0), NOW);
    assert!(!resets_stream(&plain, &back));
}

#[test]
fn k4_5_a_loop_back_supersedes_only_passing_halts_inside_its_body_row_by_row() {
    let d = loop_def();
    let yielded = || Some(Halt::Yield { checkpoint: None, elapsed_ms: DurationMs::ZERO });
    let failed = || {
        Some(Halt::Failed {
            error: StepError { class: ErrorClass::Permanent, message: "x".into() },
            elapsed_ms: DurationMs::ZERO,
        })
    };
    let back = Some(Control::LoopBack { sender: 1, target: 0 });
    type Row = (&'static str, Vec<(usize, Option<Halt>)>, Option<Control>, bool);
    let rows: Vec<Row> = vec![
        ("a passing halt inside the body", vec![(0, yielded()), (1, None)], back.clone(), true),
        ("a halt after the sender", vec![(2, yielded())], back.clone(), false),
        ("a failure stands", vec![(0, failed()), (1, None)], back.clone(), false),
        ("a skip decision", vec![(0, yielded())], Some(Control::Skip(vec![2])), false),
        ("a stop decision", vec![(0, yielded())], Some(Control::Stop(1, "max".into())), false),
        ("nothing to decide", vec![(0, yielded())], None, false),
    ];
    for (name, wave, decision, want) in rows {
        assert_eq!(supersedes(&d, &wave, || decision), want, "{name}");
    }
    // Without a halt the control pass is not asked.
    assert!(!supersedes(&d, &[(0, None), (1, None)], || panic!("not asked")));
}
