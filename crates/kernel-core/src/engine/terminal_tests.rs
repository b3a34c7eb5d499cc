//! Table tests of the way to a workflow's end (K-7.1, K-8, K-2.3), row by row.

use super::*;
use crate::compensation::{CompensationOutcome, InverseResult, InverseRun};
use crate::domain::Wait;
use crate::engine::test_fixtures::NOW;
use crate::transition::{Patch, TransitionKind};
use serde_json::json;

#[test]
fn k8_what_the_ready_steps_lead_to_row_by_row() {
    let rows: Vec<(&str, Vec<usize>, bool, bool, NextMove)> = vec![
        ("all done", vec![], true, false, NextMove::Succeed),
        ("all done wins over a failed step that was skipped by policy", vec![], true, true, NextMove::Succeed),
        ("nothing ready, a step failed", vec![], false, true, NextMove::Fail),
        ("nothing ready, nothing failed", vec![], false, false, NextMove::Stuck),
        ("one ready", vec![3], false, false, NextMove::Single(3)),
        ("one ready beside a failed step", vec![3], false, true, NextMove::Single(3)),
        ("several ready", vec![1, 2], false, false, NextMove::Wave(vec![1, 2])),
    ];
    for (name, ready, all_done, any_failed, want) in rows {
        assert_eq!(next_move(ready, all_done, any_failed), want, "{name}");
    }
}

fn completing(loops_back: bool, all_done: bool, success_finalizer: bool, next: Vec<usize>) -> Completing {
    Completing { loops_back, all_done, success_finalizer, next, next_conditional: false, stopping: false }
}

#[test]
fn k7_1_what_a_lone_completion_is_fused_with_row_by_row() {
    let conditional = Completing { next_conditional: true, ..completing(false, false, false, vec![4]) };
    let stopping = Completing { stopping: true, ..completing(false, false, false, vec![4]) };
    let rows: Vec<(&str, Completing, Fusion)> = vec![
        ("the last step, no finalizer", completing(false, true, false, vec![]), Fusion::Completed),
        ("the last step, a finalizer runs first", completing(false, true, true, vec![]), Fusion::Alone),
        ("one next step", completing(false, false, false, vec![4]), Fusion::StartNext(4)),
        ("one next step, a finalizer is no matter", completing(false, false, true, vec![4]), Fusion::StartNext(4)),
        ("several next steps: a wave", completing(false, false, false, vec![4, 5]), Fusion::Alone),
        ("nothing next yet", completing(false, false, false, vec![]), Fusion::Alone),
        ("a loop may go back: alone", completing(true, false, false, vec![4]), Fusion::Alone),
        ("a loop may go back, even as the last step", completing(true, true, false, vec![]), Fusion::Alone),
        ("a conditional next step: the control pass first", conditional, Fusion::Alone),
        ("stopping: nothing new starts", stopping, Fusion::Alone),
    ];
    for (name, c, want) in rows {
        assert_eq!(fusion(&c), want, "{name}");
    }
}

#[test]
fn k2_3_a_failed_prepare_context_counts_to_its_limit_row_by_row() {
    use WorkflowStatus::*;
    let rows = [
        ("first failure", Running, 0, 3, PrepareNext::Release { failures: 1 }),
        ("below the limit", Running, 1, 3, PrepareNext::Release { failures: 2 }),
        ("at the limit", Running, 2, 3, PrepareNext::Fail { failures: 3, mark_failing: true }),
        ("past the limit", Running, 7, 3, PrepareNext::Fail { failures: 8, mark_failing: true }),
        ("at the limit, already failing", Failing, 2, 3, PrepareNext::Fail { failures: 3, mark_failing: false }),
        ("below the limit while failing", Failing, 0, 3, PrepareNext::Release { failures: 1 }),
        ("a limit of one", Running, 0, 1, PrepareNext::Fail { failures: 1, mark_failing: true }),
        ("the count saturates", Running, u32::MAX, 3, PrepareNext::Fail { failures: u32::MAX, mark_failing: true }),
    ];
    for (name, status, before, max, want) in rows {
        assert_eq!(prepare_next(status, before, max), want, "{name}");
    }
}

#[test]
fn k7_4_the_fallback_ladder_of_a_refused_write_row_by_row() {
    let reason = StepError { class: ErrorClass::Permanent, message: "the store refused the step's outcome: x".into() };
    let wait = Wait::Timer { step_index: 0, due: Some(NOW) };
    let rows: Vec<(&str, AfterWave, Vec<&str>)> = vec![
        (
            "a retry carried the step's error",
            AfterWave::Released { at: NOW },
            vec!["the store refused the step's outcome: x", "refused by the store"],
        ),
        (
            "a wait carried a checkpoint",
            AfterWave::Suspended { wait },
            vec!["the store refused the step's outcome: x", "refused by the store"],
        ),
        (
            "a yield",
            AfterWave::Yielded { at: NOW },
            vec!["the store refused the step's outcome: x", "refused by the store"],
        ),
        ("already the step's failure", AfterWave::Failing, vec!["refused by the store"]),
        ("a cancellation", AfterWave::Canceled, vec!["refused by the store"]),
    ];
    for (name, then, want) in rows {
        let ladder = refusal_ladder(RefusedWrite::of(&then), reason.clone());
        assert!(ladder.iter().all(|e| e.class == ErrorClass::Permanent), "{name}");
        assert_eq!(ladder.iter().map(|e| e.message.as_str()).collect::<Vec<_>>(), want, "{name}");
    }
}

fn report() -> CompensationReport {
    let run = InverseRun { step: "a".into(), result: InverseResult::Compensated, attempts: 1, error: None, task: None };
    CompensationReport { outcome: CompensationOutcome::Recovered, steps: vec![run], at: NOW }
}

#[test]
fn k8_k17_6_the_failed_write_and_the_terminal_frame_row_by_row() {
    let plain = failed_write(None, NOW);
    assert_eq!(
        (plain.kind(), plain.status, plain.compensation.clone()),
        (TransitionKind::Failed, Some(WorkflowStatus::Failed), None)
    );
    let compensated = failed_write(Some((report(), vec![0])), NOW);
    assert_eq!(compensated.kind(), TransitionKind::Failed);
    assert_eq!(compensated.compensation, Some(Patch::Set(report())));
    assert_eq!(compensated, Transition::failed_compensated(NOW, report(), &[0]), "the undone steps are marked");
    assert_ne!(compensated, Transition::failed_compensated(NOW, report(), &[]));

    let rows = [
        ("completed", WorkflowStatus::Completed, 7, None, json!({"status": "completed", "revision": 7})),
        ("canceled", WorkflowStatus::Canceled, 3, None, json!({"status": "canceled", "revision": 3})),
        (
            "failed and compensated",
            WorkflowStatus::Failed,
            9,
            Some(report()),
            json!({"status": "failed", "revision": 9, "compensation": "recovered"}),
        ),
    ];
    for (name, status, revision, comp, want) in rows {
        assert_eq!(terminal_summary(status, revision, comp.as_ref()), want, "{name}");
    }
}

#[test]
fn k6_4_what_a_refused_plain_write_leads_to_row_by_row() {
    use AfterRefusedPlain as A;
    use RefusedPlain as K;
    let max = REFUSED_WRITES_MAX;
    let rows: Vec<(&str, u32, Option<usize>, K, A)> = vec![
        ("the first refusal: handed back", 1, Some(2), K::Running, A::HandBack),
        ("below the limit, failing: handed back", max - 1, None, K::InFailing, A::HandBack),
        ("at the limit, a step's write: the step fails", max, Some(2), K::Running, A::FailStep(2)),
        ("at the limit, no step: the workflow goes failing", max, None, K::Running, A::FailWorkflow),
        ("past the limit (a count from before): the same", max + 5, None, K::Running, A::FailWorkflow),
        ("at the limit without context: no business code", max, None, K::Prepare, A::FailWithoutContext),
        ("at the limit on `failed`: without the report", max, Some(1), K::Failed, A::FailedWithoutReport),
        ("at the limit mid-compensation: the rest escalated", max, None, K::InFailing, A::EscalateAndFail),
        ("a push-back never fails the workflow", max + 5, None, K::PushBack, A::HandBack),
    ];
    for (name, refused, step, kind, want) in rows {
        assert_eq!(after_refused_plain(refused, step, kind), want, "{name}");
    }
}
