//! Table tests of where an operator action goes and what it writes (K-6.8, K-8, K-17.3),
//! row by row.

use super::operator_decision::*;
use crate::domain::{StepStatus as S, WorkflowStatus};
use crate::engine::test_fixtures::{at, def, instance, step, NOW};
use crate::operator_request::{OperatorRequest, RequestedAction};
use crate::record::HistoryLimits;
use crate::transition::{Guard, Patch, TransitionKind};

fn request(action: RequestedAction) -> OperatorRequest {
    OperatorRequest { id: "req-1".into(), action, holder: "tok-old".into(), requested_at: NOW }
}

fn regenerate(step: &str) -> RequestedAction {
    RequestedAction::Regenerate { step: step.into() }
}

#[test]
fn k6_8_where_an_action_goes_row_by_row() {
    let d = def(vec![step("a")]);
    let base = instance(&d, vec![at("a", S::Completed)]);
    let unclaimed = WorkflowInstance { claim_token: None, ..base.clone() };
    let pending = WorkflowInstance { operator_request: Some(request(RequestedAction::Cancel)), ..base.clone() };
    let waiting = WorkflowInstance { status: WorkflowStatus::Waiting, claim_token: None, ..base.clone() };
    let rows: Vec<(&str, &WorkflowInstance, &str)> = vec![
        ("a claim token is set: a request to its holder", &base, "request"),
        ("no claim token: direct", &unclaimed, "direct"),
        ("waiting (never a token): direct", &waiting, "direct"),
        ("a request is recorded already", &pending, "pending"),
    ];
    for (name, inst, want) in rows {
        let got = match route(inst) {
            Route::Ended => "ended",
            Route::Direct => "direct",
            Route::Request { holder } => {
                assert_eq!(Some(holder), inst.claim_token.as_ref(), "{name}");
                "request"
            }
            Route::Pending { request, token } => {
                assert_eq!((Some(request), Some(token)), (inst.operator_request.as_ref(), inst.claim_token.as_ref()));
                "pending"
            }
        };
        assert_eq!(got, want, "{name}");
    }
    for status in [WorkflowStatus::Completed, WorkflowStatus::Failed, WorkflowStatus::Canceled] {
        let ended = WorkflowInstance { status, ..base.clone() };
        assert_eq!(route(&ended), Route::Ended, "{status:?}");
    }
}

use crate::domain::WorkflowInstance;

#[test]
fn k6_8_a_second_action_while_one_is_pending_row_by_row() {
    let rows = vec![
        ("the same cancel", RequestedAction::Cancel, RequestedAction::Cancel, WhilePending::Same),
        ("the same regenerate", regenerate("a"), regenerate("a"), WhilePending::Same),
        ("a cancel replaces a regenerate", regenerate("a"), RequestedAction::Cancel, WhilePending::Replace),
        ("a regenerate waits for a cancel", RequestedAction::Cancel, regenerate("a"), WhilePending::Refuse),
        ("another step waits", regenerate("a"), regenerate("b"), WhilePending::Refuse),
    ];
    for (name, pending, new, want) in rows {
        assert_eq!(while_pending(&pending, &new), want, "{name}");
    }
}

#[test]
fn k6_8_the_write_that_applies_a_request_row_by_row() {
    let d = def(vec![step("a"), step("b").depends_on(["a"]), step("c").depends_on(Vec::<String>::new())]);
    let limits = HistoryLimits::default();
    let held = |steps, action| WorkflowInstance {
        claim_token: Some("tok-new".into()),
        operator_request: Some(request(action)),
        ..instance(&d, steps)
    };
    // A regenerate of a completed step under a running dependent: both start anew.
    let inst = held(vec![at("a", S::Completed), at("b", S::Running), at("c", S::Completed)], regenerate("a"));
    let (t, end) = request_write(&inst, d.plan(), limits, NOW).expect("a request is recorded");
    let RequestEnd::Applied(ActionEffect::Regenerated(r)) = end else { panic!("applied: {end:?}") };
    assert_eq!((r.epoch, r.steps), (1, vec!["a".to_string(), "b".into()]), "c does not depend on a");
    assert_eq!(t.kinds().collect::<Vec<_>>(), vec![TransitionKind::RequestApplied, TransitionKind::Regenerate]);
    assert_eq!((t.operator_request.clone(), t.claim_token.clone()), (Some(Patch::Unset), Some(Patch::Unset)));
    assert_eq!(t.claimable_time, Some(Patch::Set(NOW)), "claimable at once");
    let mut after = inst.clone();
    assert!(Guard::Token { token: "tok-new".into() }.matches(&after));
    t.apply_to(&mut after);
    assert!(after.operator_request.is_none() && after.claim_token.is_none());
    assert_eq!((after.steps[0].epoch, after.steps[1].status, after.steps[2].epoch), (1, S::Pending, 0));

    // A cancel: canceled, the claim and the lease cleared.
    let inst = held(vec![at("a", S::Running), at("b", S::Pending), at("c", S::Pending)], RequestedAction::Cancel);
    let (t, end) = request_write(&inst, d.plan(), limits, NOW).unwrap();
    assert_eq!(end, RequestEnd::Applied(ActionEffect::Canceled));
    let mut after = inst.clone();
    t.apply_to(&mut after);
    assert_eq!((after.status, after.claimable_time, after.claim_token.clone()), (WorkflowStatus::Canceled, None, None));

    // Rows that no longer apply: dropped, the claim released at once, nothing else.
    let failing = WorkflowInstance {
        status: WorkflowStatus::Failing,
        ..held(vec![at("a", S::Completed), at("b", S::Failed), at("c", S::Pending)], regenerate("a"))
    };
    let rows: Vec<(&str, WorkflowInstance)> = vec![
        (
            "the step runs again now",
            held(vec![at("a", S::Running), at("b", S::Pending), at("c", S::Pending)], regenerate("a")),
        ),
        ("the workflow is failing", failing),
        ("no such step", held(vec![at("a", S::Completed), at("b", S::Pending), at("c", S::Pending)], regenerate("zz"))),
    ];
    for (name, inst) in rows {
        let (t, end) = request_write(&inst, d.plan(), limits, NOW).unwrap();
        assert!(matches!(end, RequestEnd::Dropped(_)), "{name}: {end:?}");
        assert_eq!(t.kinds().collect::<Vec<_>>(), vec![TransitionKind::RequestApplied], "{name}");
        let mut after = inst.clone();
        t.apply_to(&mut after);
        assert_eq!(after.steps, inst.steps, "{name}: no step changed");
        assert_eq!(
            (after.claim_token, after.operator_request, after.claimable_time),
            (None, None, Some(NOW)),
            "{name}"
        );
    }
    let none = instance(&d, vec![at("a", S::Completed), at("b", S::Pending), at("c", S::Pending)]);
    assert!(request_write(&none, d.plan(), limits, NOW).is_none(), "no request, no write");
}

#[test]
fn k6_8_a_direct_write_is_guarded_on_no_claim_row_by_row() {
    let d = def(vec![step("a")]);
    let inst = WorkflowInstance { claim_token: None, ..instance(&d, vec![at("a", S::Completed)]) };
    let g = Guard::Operator { revision: inst.revision };
    let claimed = WorkflowInstance { claim_token: Some("t".into()), ..inst.clone() };
    let moved = WorkflowInstance { revision: inst.revision + 1, ..inst.clone() };
    let failing = WorkflowInstance { status: WorkflowStatus::Failing, ..inst.clone() };
    let done = WorkflowInstance { status: WorkflowStatus::Completed, ..inst.clone() };
    let rows = vec![
        ("as read, no claim", &inst, true),
        ("claimed since the read", &claimed, false),
        ("changed since the read", &moved, false),
        ("failing, no claim", &failing, true),
        ("ended", &done, false),
    ];
    for (name, i, want) in rows {
        assert_eq!(g.matches(i), want, "{name}");
    }
}
