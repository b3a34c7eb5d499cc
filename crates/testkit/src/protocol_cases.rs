//! The cases the SQL stores' protocol snapshots render: every `Guard` and every `Transition`
//! constructor, named, with the fixed clock reading and records they use. sql-protocol's
//! snapshot test renders them in both dialects and store-postgres's renders them inside its
//! statements; one list keeps the two snapshots about the same cases (K-6.4).

use kernel_core::domain::*;
use kernel_core::operator_request::{OperatorRequest, RequestedAction};
use kernel_core::record::*;
use kernel_core::transition::{Guard, Patch, Transition, TransitionKind};
use serde_json::json;

use crate::time::TestTime;

/// The clock reading every case is built at.
pub const NOW: Instant = Instant::from_millis(1_700_000_000_000);

/// JSON text with every object's keys in sorted order.
pub fn canonical(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let fields: Vec<String> = keys.iter().map(|k| format!("{:?}: {}", k, canonical(&m[k.as_str()]))).collect();
            format!("{{{}}}", fields.join(", "))
        }
        serde_json::Value::Array(a) => format!("[{}]", a.iter().map(canonical).collect::<Vec<_>>().join(", ")),
        other => other.to_string(),
    }
}

fn err(class: ErrorClass) -> StepError {
    StepError { class, message: "boom".into() }
}

/// A step record of `run` and `epoch` holding one recorded value.
pub fn record(run: u32, epoch: u32) -> StepRecord {
    StepRecord {
        run,
        epoch,
        entries: vec![RecordEntry::Value(RecordedValue { label: "now".into(), value: json!(5), recorded_at: NOW })],
    }
}

/// A regeneration history entry of `epoch`.
pub fn history(epoch: u32) -> HistoryEntry {
    HistoryEntry {
        run: 0,
        epoch,
        reason: HistoryReason::Regenerate,
        output: Some(json!({"n": 1})),
        error: None,
        record: Some(record(0, epoch)),
        at: NOW,
    }
}

/// A history entry of one loop iteration (K-4 amendment).
pub fn loop_history(epoch: u32) -> HistoryEntry {
    HistoryEntry { reason: HistoryReason::Loop, ..history(epoch) }
}

/// Every `Guard` constructor, named as the SQL snapshots name it.
pub fn guards() -> Vec<(&'static str, Guard)> {
    let id = WaitIdentity { signal_type: "approved".into(), wait_key: "doc:42".into(), generation: 3, step_index: 1 };
    vec![
        ("guard Claimable", Guard::Claimable { now: NOW, types: vec!["summary".into(), "fanout".into()] }),
        ("guard Running", Guard::Running { token: "tok".into() }),
        ("guard Failing", Guard::Failing { token: "tok".into() }),
        ("guard Token", Guard::Token { token: "tok".into() }),
        ("guard Failed", Guard::Failed { unless_round: None }),
        ("guard Failed unless_round", Guard::Failed { unless_round: Some("f1".into()) }),
        ("guard DueWait", Guard::DueWait { now: NOW, step_index: 1 }),
        ("guard SignalWait", Guard::SignalWait(id)),
        ("guard Active", Guard::Active),
        ("guard PriorityBelow", Guard::PriorityBelow(Priority::P1)),
        ("guard Operator", Guard::Operator { revision: 7 }),
    ]
}

/// Every `Transition` constructor (and the variants the stores render differently), named
/// as the SQL snapshots name it.
pub fn transitions() -> Vec<(&'static str, Transition)> {
    let ms = DurationMs::from_millis;
    let timer = Wait::Timer { step_index: 1, due: Some(NOW.plus(ms(60_000))) };
    let signal = Wait::Signal {
        signal_type: "approved".into(),
        wait_key: "doc:42".into(),
        generation: 2,
        step_index: 1,
        poll_time: None,
    };
    vec![
        ("transition claim", Transition::claim(&"tok".into(), NOW, ms(30_000)).unwrap()),
        ("transition heartbeat", Transition::heartbeat(NOW, ms(30_000)).unwrap()),
        ("transition mark_running", Transition::mark_running(1, NOW)),
        ("transition complete_step", Transition::complete_step(1, "compose", json!({"n": 1}), ms(120), NOW, true)),
        ("transition suspend timer", Transition::suspend(1, timer, Some(json!({"c": 7})), ms(5), NOW)),
        ("transition suspend signal", Transition::suspend(1, signal, None, ms(0), NOW)),
        ("transition yield_step", Transition::yield_step(1, Some(json!([1])), ms(3), NOW)),
        ("transition park_sibling", Transition::park_sibling(2, None, ms(0), NOW)),
        (
            "transition step_retry release_until",
            Transition::step_retry(1, err(ErrorClass::Transient), ms(9), NOW).release_until(NOW.plus(ms(1_000))),
        ),
        (
            "transition permit_deferral release_until",
            Transition::permit_deferral(1, ms(500), NOW).release_until(NOW.plus(ms(500))),
        ),
        ("transition skip_step", Transition::skip_step(1, err(ErrorClass::Permanent), ms(1), NOW)),
        ("transition step_failed", Transition::step_failed(1, err(ErrorClass::Permanent), ms(1), NOW)),
        ("transition failing", Transition::failing(NOW)),
        ("transition failed", Transition::failed(NOW)),
        ("transition completed", Transition::completed(NOW)),
        ("transition activity_canceled", Transition::activity_canceled(1, err(ErrorClass::Canceled), ms(2), NOW)),
        ("transition supersede", Transition::supersede(NOW)),
        ("transition finalizer_release", Transition::finalizer_release(NOW, ms(1_000)).unwrap()),
        ("transition prepare_release", Transition::prepare_release(2, NOW, ms(1_000)).unwrap()),
        ("transition refused_release", Transition::refused_release(2, NOW, ms(1_000)).unwrap()),
        ("transition release", Transition::release(NOW)),
        ("transition release_after", Transition::release_after(NOW, ms(250)).unwrap()),
        (
            "transition fingerprint_push_back",
            Transition::fingerprint_push_back("fp-a", "fp-b", NOW, ms(1_000)).unwrap(),
        ),
        ("transition timer_activation", Transition::timer_activation(1, ResumeKind::Timer, NOW)),
        ("transition signal_activation", Transition::signal_activation(1, "sig-1", NOW)),
        ("transition replay", Transition::replay(json!({"fencing_token": "f2"}), NOW)),
        ("transition priority_raise", Transition::priority_raise(Priority::P0, NOW)),
        (
            "transition fused complete_step + completed",
            Transition::complete_step(2, "publish", json!(true), ms(4), NOW, false).fuse(Transition::completed(NOW)),
        ),
        ("transition attempt reset", {
            let mut t = Transition::new(TransitionKind::Release, NOW);
            t.step_mut(0).attempt = Some(kernel_core::transition::AttemptChange::Reset);
            t.step_mut(0).finished_at = Some(Patch::Unset);
            t
        }),
        ("transition record_step", Transition::record_step(1, record(0, 0), Some(vec![history(0)]), NOW)),
        ("transition record_step without history", Transition::record_step(1, record(1, 2), None, NOW)),
        (
            "transition step_retry retrying_since release_until",
            Transition::step_retry(1, err(ErrorClass::Transient), ms(9), NOW)
                .retrying_since(1, NOW)
                .release_until(NOW.plus(ms(1_000))),
        ),
        (
            "transition dead_letter",
            Transition::dead_letter(
                1,
                Wait::Signal {
                    signal_type: "kernel.dead_letter".into(),
                    wait_key: "compose".into(),
                    generation: 0,
                    step_index: 1,
                    poll_time: Some(NOW.plus(ms(3_600_000))),
                },
                err(ErrorClass::Permanent),
                ms(7),
                NOW,
            ),
        ),
        ("transition step_epoch", Transition::step_epoch(1, 2, vec![history(1)], NOW)),
        (
            "transition regenerate wake",
            Transition::regenerate(
                vec![(0, 1, vec![history(0)]), (1, 1, vec![])],
                vec!["draft".into(), "compose".into()],
                true,
                NOW,
            ),
        ),
        ("transition regenerate waiting", Transition::regenerate(vec![(2, 3, vec![])], vec![], false, NOW)),
        ("transition epoch 0 and output set and unset", {
            let mut t = Transition::complete_step(1, "compose", json!(1), ms(0), NOW, false);
            t.step_mut(2).epoch = Some(0);
            t.outputs_unset.push("draft".into());
            t
        }),
        // K-4 amendment: the loop's target keeps its counter (none given), an enclosed
        // loop's counter goes back to 0 (the key removed), the sender's is set.
        (
            "transition loop_back",
            Transition::loop_back(
                2,
                vec![
                    (0, 1, vec![loop_history(0)], None),
                    (1, 4, vec![], Some(0)),
                    (2, 2, vec![loop_history(1)], Some(2)),
                ],
                vec!["fetch".into(), "publish".into()],
                true,
                NOW,
            ),
        ),
        (
            "transition loop_back keeping the resume",
            Transition::loop_back(1, vec![(1, 1, vec![], Some(1))], vec![], false, NOW),
        ),
        ("transition branch_skip", Transition::branch_skip(&[1, 2], NOW)),
        // K-6.8: the request replaces the holder's token and leaves the lease alone; the
        // step name is data, whatever it holds.
        (
            "transition operator_request regenerate",
            Transition::operator_request(
                OperatorRequest {
                    id: "req-1".into(),
                    action: RequestedAction::Regenerate { step: "x\\u0041\"é'\\".into() },
                    holder: "tok".into(),
                    requested_at: NOW,
                },
                "tok-2".into(),
                NOW,
            ),
        ),
        (
            "transition operator_request cancel",
            Transition::operator_request(
                OperatorRequest {
                    id: "req-2".into(),
                    action: RequestedAction::Cancel,
                    holder: "tok".into(),
                    requested_at: NOW,
                },
                "tok-2".into(),
                NOW,
            ),
        ),
        ("transition request_applied", Transition::request_applied(None, NOW)),
        ("transition request_applied supersede", Transition::request_applied(Some(Transition::supersede(NOW)), NOW)),
    ]
}
