//! Snapshot of the wire protocol: the filter of every `Guard` and the update of every
//! `Transition` constructor. A change here changes what is stored; update the expectation
//! only together with docs/store-mongo.md and a migration note. No server needed.

use kernel_core::domain::*;
use kernel_core::record::*;
use kernel_core::transition::{Guard, Patch, Transition, TransitionKind};
use mongodb::bson::{doc, Bson, DateTime, Document};
use serde_json::json;
use store_mongo::protocol::{guard_filter, transition_update, Limits, Update};
use testkit::protocol_cases::{history, record, NOW};
use testkit::time::TestTime;

fn d(t: Instant) -> Bson {
    Bson::DateTime(DateTime::from_millis(t.as_millis()))
}

fn update(t: &Transition) -> Update {
    transition_update(t, &Limits::default()).expect("valid transition")
}

/// Compare the update document (and that no array filters / step condition are present
/// unless expected).
fn check(t: Transition, expected: Document, step_index_max: Option<u32>) {
    let u = update(&t);
    assert_eq!(u.update, expected, "update of {:?}", t.kinds);
    assert_eq!(u.array_filters, None, "array filters of {:?}", t.kinds);
    assert_eq!(u.step_index_max, step_index_max, "step condition of {:?}", t.kinds);
}

fn err(class: ErrorClass) -> StepError {
    StepError { class, message: "boom".into() }
}

#[test]
fn guard_filters() {
    let f = |g: &Guard| guard_filter(Some("wf-1"), g).expect("valid guard");
    assert_eq!(
        f(&Guard::Claimable { now: NOW, types: vec!["summary".into(), "fanout".into()] }),
        doc! { "workflow_id": "wf-1", "status": { "$in": ["running", "failing"] }, "claimable_time": { "$lte": d(NOW) }, "type": { "$in": ["summary", "fanout"] } }
    );
    assert_eq!(
        f(&Guard::Running { token: "tok".into() }),
        doc! { "workflow_id": "wf-1", "status": "running", "claim_token": "tok" }
    );
    assert_eq!(
        f(&Guard::Failing { token: "tok".into() }),
        doc! { "workflow_id": "wf-1", "status": "failing", "claim_token": "tok" }
    );
    assert_eq!(f(&Guard::Token { token: "tok".into() }), doc! { "workflow_id": "wf-1", "claim_token": "tok" });
    assert_eq!(f(&Guard::Failed { unless_round: None }), doc! { "workflow_id": "wf-1", "status": "failed" });
    assert_eq!(
        f(&Guard::Failed { unless_round: Some("f1".into()) }),
        doc! { "workflow_id": "wf-1", "status": "failed", "input.fencing_token": { "$ne": "f1" } }
    );
    assert_eq!(
        f(&Guard::DueWait { now: NOW, step_index: 1 }),
        doc! { "workflow_id": "wf-1", "status": "waiting", "claimable_time": { "$lte": d(NOW) }, "wait.step_index": 1i32 }
    );
    let id = WaitIdentity { signal_type: "approved".into(), wait_key: "doc:42".into(), generation: 3, step_index: 1 };
    assert_eq!(
        f(&Guard::SignalWait(id)),
        doc! {
            "workflow_id": "wf-1", "status": "waiting", "wait.kind": "signal", "wait.signal_type": "approved",
            "wait.wait_key": "doc:42", "wait.generation": 3i64, "wait.step_index": 1i32,
        }
    );
    assert_eq!(
        f(&Guard::Active),
        doc! { "workflow_id": "wf-1", "status": { "$in": ["running", "waiting", "failing"] } }
    );
    assert_eq!(
        f(&Guard::PriorityBelow(Priority::P1)),
        doc! { "workflow_id": "wf-1", "status": { "$in": ["running", "waiting", "failing"] }, "business_priority": { "$gt": 1i32 } }
    );
    assert_eq!(
        f(&Guard::Operator { revision: 7 }),
        doc! {
            "workflow_id": "wf-1", "status": { "$in": ["running", "waiting", "failing"] }, "revision": 7i64,
            "claim_token": { "$exists": false },
        }
    );
    // claim_any: the guard alone.
    assert_eq!(
        guard_filter(None, &Guard::Claimable { now: NOW, types: vec!["summary".into()] }).unwrap(),
        doc! { "status": { "$in": ["running", "failing"] }, "claimable_time": { "$lte": d(NOW) }, "type": { "$in": ["summary"] } }
    );
}

#[test]
fn user_values_stay_values() {
    let evil = r#"{"$ne": null}"#;
    let f = guard_filter(Some(evil), &Guard::Token { token: evil.into() }).unwrap();
    assert_eq!(f, doc! { "workflow_id": evil, "claim_token": evil });
    assert!(matches!(f.get("workflow_id"), Some(Bson::String(_))));
    let u = update(&Transition::complete_step(
        0,
        "fetch",
        json!({"$ne": null, "$numberLong": "5"}),
        DurationMs::from_millis(0),
        NOW,
        false,
    ));
    let set = u.update.get_document("$set").unwrap();
    assert_eq!(set.get("output.fetch"), Some(&Bson::Document(doc! { "$ne": Bson::Null, "$numberLong": "5" })));
}

#[test]
fn step_writes_require_the_step_to_exist() {
    let u = update(&Transition::mark_running(2, NOW));
    assert_eq!(
        u.filter("wf-1", &Guard::Running { token: "tok".into() }).unwrap(),
        doc! { "workflow_id": "wf-1", "status": "running", "claim_token": "tok", "steps.2": { "$exists": true } }
    );
}

#[test]
fn claim_and_heartbeat_do_not_bump_revision() {
    check(
        Transition::claim(&"tok".into(), NOW, DurationMs::from_millis(30_000)).unwrap(),
        doc! { "$set": { "claimable_time": d(NOW.plus(30_000)), "claim_token": "tok", "updated_at": d(NOW) } },
        None,
    );
    check(
        Transition::heartbeat(NOW, DurationMs::from_millis(30_000)).unwrap(),
        doc! { "$set": { "claimable_time": d(NOW.plus(30_000)), "updated_at": d(NOW) } },
        None,
    );
}

#[test]
fn step_transitions() {
    check(
        Transition::mark_running(2, NOW),
        doc! {
            "$set": { "steps.2.status": "running", "steps.2.started_at": d(NOW), "updated_at": d(NOW) },
            "$inc": { "steps.2.attempt": 1i32, "revision": 1i64 },
        },
        Some(2),
    );
    check(
        Transition::complete_step(1, "compose", json!({"s": "ok", "n": 2}), DurationMs::from_millis(250), NOW, true),
        doc! {
            "$set": { "steps.1.status": "completed", "steps.1.finished_at": d(NOW), "output.compose": { "n": 2i64, "s": "ok" }, "updated_at": d(NOW) },
            "$unset": { "resume": "" },
            "$inc": { "steps.1.elapsed_ms": 250i64, "revision": 1i64 },
        },
        Some(1),
    );
    let wait = Wait::Signal {
        signal_type: "approved".into(),
        wait_key: "doc:42".into(),
        generation: 3,
        step_index: 1,
        poll_time: Some(NOW.plus(60_000)),
    };
    check(
        Transition::suspend(1, wait, Some(json!({"c": 1})), DurationMs::from_millis(40), NOW),
        doc! {
            "$set": {
                "steps.1.status": "waiting", "steps.1.checkpoint": { "c": 1i64 }, "status": "waiting",
                "claimable_time": d(NOW.plus(60_000)),
                "wait": { "kind": "signal", "generation": 3i64, "step_index": 1i32, "signal_type": "approved", "wait_key": "doc:42", "poll_time": d(NOW.plus(60_000)) },
                "updated_at": d(NOW),
            },
            "$unset": { "claim_token": "", "resume": "" },
            "$inc": { "steps.1.attempt": -1i32, "steps.1.elapsed_ms": 40i64, "revision": 1i64 },
        },
        Some(1),
    );
    let timer = Wait::Timer { step_index: 0, due: None };
    check(
        Transition::suspend(0, timer, None, DurationMs::from_millis(0), NOW),
        doc! {
            "$set": { "steps.0.status": "waiting", "status": "waiting", "wait": { "kind": "timer", "generation": 0i64, "step_index": 0i32 }, "updated_at": d(NOW) },
            "$unset": { "steps.0.checkpoint": "", "claimable_time": "", "claim_token": "", "resume": "" },
            "$inc": { "steps.0.attempt": -1i32, "revision": 1i64 },
        },
        Some(0),
    );
    check(
        Transition::yield_step(1, None, DurationMs::from_millis(0), NOW),
        doc! {
            "$set": { "steps.1.status": "pending", "claimable_time": d(NOW), "updated_at": d(NOW) },
            "$unset": { "steps.1.checkpoint": "", "claim_token": "", "resume": "" },
            "$inc": { "steps.1.attempt": -1i32, "revision": 1i64 },
        },
        Some(1),
    );
    check(
        Transition::park_sibling(2, Some(json!([1])), DurationMs::from_millis(5), NOW),
        doc! {
            "$set": { "steps.2.status": "pending", "steps.2.checkpoint": [1i64], "updated_at": d(NOW) },
            "$inc": { "steps.2.attempt": -1i32, "steps.2.elapsed_ms": 5i64, "revision": 1i64 },
        },
        Some(2),
    );
    check(
        Transition::step_retry(1, err(ErrorClass::Transient), DurationMs::from_millis(33), NOW)
            .release_until(NOW.plus(2_000)),
        doc! {
            "$set": { "steps.1.status": "pending", "steps.1.error": { "class": "transient", "message": "boom" }, "claimable_time": d(NOW.plus(2_000)), "updated_at": d(NOW) },
            "$unset": { "steps.1.checkpoint": "", "claim_token": "" },
            "$inc": { "steps.1.elapsed_ms": 33i64, "revision": 1i64 },
        },
        Some(1),
    );
    check(
        Transition::permit_deferral(1, DurationMs::from_millis(500), NOW).release_until(NOW.plus(500)),
        doc! {
            "$set": { "steps.1.status": "pending", "claimable_time": d(NOW.plus(500)), "updated_at": d(NOW) },
            "$unset": { "claim_token": "" },
            "$inc": { "steps.1.traffic_wait_ms": 500i64, "steps.1.traffic_waits": 1i32, "revision": 1i64 },
        },
        Some(1),
    );
    check(
        Transition::skip_step(1, err(ErrorClass::Permanent), DurationMs::from_millis(7), NOW),
        doc! {
            "$set": { "steps.1.status": "skipped", "steps.1.error": { "class": "permanent", "message": "boom" }, "steps.1.finished_at": d(NOW), "updated_at": d(NOW) },
            "$unset": { "steps.1.checkpoint": "" },
            "$inc": { "steps.1.elapsed_ms": 7i64, "revision": 1i64 },
        },
        Some(1),
    );
    check(
        Transition::step_failed(1, err(ErrorClass::Permanent), DurationMs::from_millis(7), NOW),
        doc! {
            "$set": { "status": "failing", "steps.1.status": "failed", "steps.1.error": { "class": "permanent", "message": "boom" }, "steps.1.finished_at": d(NOW), "updated_at": d(NOW) },
            "$unset": { "steps.1.checkpoint": "" },
            "$inc": { "steps.1.elapsed_ms": 7i64, "revision": 1i64 },
        },
        Some(1),
    );
    check(
        Transition::activity_canceled(1, err(ErrorClass::Canceled), DurationMs::from_millis(3), NOW),
        doc! {
            "$set": { "status": "canceled", "steps.1.status": "skipped", "steps.1.error": { "class": "canceled", "message": "boom" }, "steps.1.finished_at": d(NOW), "finished_at": d(NOW), "updated_at": d(NOW) },
            "$unset": { "claimable_time": "", "claim_token": "", "wait": "", "resume": "" },
            "$inc": { "steps.1.elapsed_ms": 3i64, "revision": 1i64 },
        },
        Some(1),
    );
    check(
        Transition::complete_step(1, "compose", json!("done"), DurationMs::from_millis(20), NOW, false)
            .fuse(Transition::mark_running(2, NOW)),
        doc! {
            "$set": { "steps.1.status": "completed", "steps.1.finished_at": d(NOW), "steps.2.status": "running", "steps.2.started_at": d(NOW), "output.compose": "done", "updated_at": d(NOW) },
            "$inc": { "steps.1.elapsed_ms": 20i64, "steps.2.attempt": 1i32, "revision": 1i64 },
        },
        Some(2),
    );
}

#[test]
fn workflow_transitions() {
    let terminal = |status: &str| {
        doc! {
            "$set": { "status": status, "finished_at": d(NOW), "updated_at": d(NOW) },
            "$unset": { "claimable_time": "", "claim_token": "", "wait": "", "resume": "" },
            "$inc": { "revision": 1i64 },
        }
    };
    check(
        Transition::failing(NOW),
        doc! { "$set": { "status": "failing", "updated_at": d(NOW) }, "$inc": { "revision": 1i64 } },
        None,
    );
    check(Transition::failed(NOW), terminal("failed"), None);
    check(Transition::completed(NOW), terminal("completed"), None);
    check(Transition::supersede(NOW), terminal("canceled"), None);
    check(
        Transition::finalizer_release(NOW, DurationMs::from_millis(5_000)).unwrap(),
        doc! { "$set": { "claimable_time": d(NOW.plus(5_000)), "updated_at": d(NOW) }, "$unset": { "claim_token": "" }, "$inc": { "revision": 1i64 } },
        None,
    );
    check(
        Transition::release(NOW),
        doc! { "$set": { "claimable_time": d(NOW), "updated_at": d(NOW) }, "$unset": { "claim_token": "" }, "$inc": { "revision": 1i64 } },
        None,
    );
    check(
        Transition::fingerprint_push_back("fp-1", "fp-2", NOW, DurationMs::from_millis(3_600_000)).unwrap(),
        doc! {
            "$set": { "claimable_time": d(NOW.plus(3_600_000)), "fingerprint_mismatch": { "persisted": "fp-1", "worker": "fp-2" }, "updated_at": d(NOW) },
            "$unset": { "claim_token": "" },
            "$inc": { "revision": 1i64 },
        },
        None,
    );
    check(
        Transition::timer_activation(1, ResumeKind::Timer, NOW),
        doc! {
            "$set": { "status": "running", "steps.1.status": "pending", "resume": { "kind": "timer", "step_index": 1i32 }, "updated_at": d(NOW) },
            "$unset": { "claim_token": "", "wait": "" },
            "$inc": { "revision": 1i64 },
        },
        Some(1),
    );
    check(
        Transition::timer_activation(1, ResumeKind::Poll, NOW),
        doc! {
            "$set": { "status": "running", "steps.1.status": "pending", "resume": { "kind": "poll", "step_index": 1i32 }, "updated_at": d(NOW) },
            "$unset": { "claim_token": "", "wait": "" },
            "$inc": { "revision": 1i64 },
        },
        Some(1),
    );
    check(
        Transition::signal_activation(1, "sig-1", NOW),
        doc! {
            "$set": { "status": "running", "steps.1.status": "pending", "claimable_time": d(NOW), "resume": { "kind": "signal", "step_index": 1i32, "signal_id": "sig-1" }, "updated_at": d(NOW) },
            "$unset": { "claim_token": "", "wait": "" },
            "$inc": { "revision": 1i64 },
        },
        Some(1),
    );
    check(
        Transition::prepare_release(2, NOW, DurationMs::from_millis(5_000)).unwrap(),
        doc! {
            "$set": { "claimable_time": d(NOW.plus(5_000)), "prepare_failures": 2i32, "updated_at": d(NOW) },
            "$unset": { "claim_token": "" },
            "$inc": { "revision": 1i64 },
        },
        None,
    );
    check(
        Transition::priority_raise(Priority::P1, NOW),
        doc! { "$set": { "business_priority": 1i32, "updated_at": d(NOW) }, "$inc": { "revision": 1i64 } },
        None,
    );
}

#[test]
fn replay_resets_failed_steps_through_array_filters() {
    let u = update(&Transition::replay(json!({"fencing_token": "f2"}), NOW));
    assert_eq!(
        u.update,
        doc! {
            "$set": {
                "status": "running",
                "steps.$[f].status": "pending", "steps.$[f].attempt": 0i32, "steps.$[f].elapsed_ms": 0i64,
                "steps.$[f].traffic_wait_ms": 0i64, "steps.$[f].traffic_waits": 0i32,
                "input": { "fencing_token": "f2" }, "claimable_time": d(NOW), "prepare_failures": 0i32, "refused_writes": 0i32,
                "updated_at": d(NOW),
            },
            "$unset": {
                "steps.$[f].error": "", "steps.$[f].checkpoint": "", "steps.$[f].started_at": "", "steps.$[f].finished_at": "",
                "steps.$[f].retrying_since": "", "steps.$[f].iterations": "", "steps.$[f].completed_revision": "",
                "claim_token": "", "wait": "", "resume": "",
                "finished_at": "", "compensation": "",
            },
            "$inc": { "retry_count": 1i32, "revision": 1i64 },
        }
    );
    assert_eq!(u.array_filters, Some(vec![doc! { "f.status": "failed" }]));
    assert_eq!(u.step_index_max, None);
}

/// The BSON of `record(run, epoch)`: its JSON form node by node, times as milliseconds.
fn record_doc(run: u32, epoch: u32) -> Document {
    doc! {
        "run": i64::from(run), "epoch": i64::from(epoch),
        "entries": [{ "kind": "value", "label": "now", "value": 5i64, "recorded_at": NOW.as_millis() }],
    }
}

fn history_doc(epoch: u32) -> Document {
    doc! {
        "run": 0i64, "epoch": i64::from(epoch), "reason": "regenerate", "output": { "n": 1i64 },
        "record": record_doc(0, epoch), "at": NOW.as_millis(),
    }
}

/// K-17.3: a record and a history are stored whole under the step; no history patch leaves
/// the stored one.
#[test]
fn record_step_sets_the_record_and_the_history() {
    check(
        Transition::record_step(1, record(0, 0), Some(vec![history(0)]), NOW),
        doc! {
            "$set": { "steps.1.record": record_doc(0, 0), "steps.1.history": [history_doc(0)], "updated_at": d(NOW) },
            "$inc": { "revision": 1i64 },
        },
        Some(1),
    );
    check(
        Transition::record_step(1, record(1, 2), None, NOW),
        doc! { "$set": { "steps.1.record": record_doc(1, 2), "updated_at": d(NOW) }, "$inc": { "revision": 1i64 } },
        Some(1),
    );
}

/// A retry release remembers when the attempt first failed, as a DateTime.
#[test]
fn a_retry_release_remembers_retrying_since() {
    check(
        Transition::step_retry(1, err(ErrorClass::Transient), DurationMs::from_millis(9), NOW)
            .retrying_since(1, NOW)
            .release_until(NOW.plus(1_000)),
        doc! {
            "$set": {
                "steps.1.status": "pending", "steps.1.error": { "class": "transient", "message": "boom" },
                "steps.1.retrying_since": d(NOW), "claimable_time": d(NOW.plus(1_000)), "updated_at": d(NOW),
            },
            "$unset": { "steps.1.checkpoint": "", "claim_token": "" },
            "$inc": { "steps.1.elapsed_ms": 9i64, "revision": 1i64 },
        },
        Some(1),
    );
}

/// K-17.2: dead letter parks the step with its error and the workflow on the operator
/// signal; the operator's retry starts the next epoch.
#[test]
fn dead_letter_and_step_epoch() {
    let wait = Wait::Signal {
        signal_type: "kernel.dead_letter".into(),
        wait_key: "compose".into(),
        generation: 0,
        step_index: 1,
        poll_time: Some(NOW.plus(3_600_000)),
    };
    check(
        Transition::dead_letter(1, wait, err(ErrorClass::Permanent), DurationMs::from_millis(7), NOW),
        doc! {
            "$set": {
                "status": "waiting", "steps.1.status": "waiting", "steps.1.error": { "class": "permanent", "message": "boom" },
                "claimable_time": d(NOW.plus(3_600_000)),
                "wait": { "kind": "signal", "generation": 0i64, "step_index": 1i32, "signal_type": "kernel.dead_letter", "wait_key": "compose", "poll_time": d(NOW.plus(3_600_000)) },
                "updated_at": d(NOW),
            },
            "$unset": { "claim_token": "", "resume": "" },
            "$inc": { "steps.1.elapsed_ms": 7i64, "revision": 1i64 },
        },
        Some(1),
    );
    check(
        Transition::step_epoch(1, 2, vec![history(1)], NOW),
        doc! {
            "$set": { "steps.1.status": "pending", "steps.1.attempt": 0i32, "steps.1.epoch": 2i64, "steps.1.history": [history_doc(1)], "updated_at": d(NOW) },
            "$unset": {
                "steps.1.error": "", "steps.1.checkpoint": "", "steps.1.finished_at": "", "steps.1.record": "",
                "steps.1.retrying_since": "", "resume": "",
            },
            "$inc": { "revision": 1i64 },
        },
        Some(1),
    );
}

/// K-17.3: regenerate starts a new epoch of each reset step (an empty history removed),
/// removes their outputs and clears the claim token; waking makes the instance claimable.
#[test]
fn regenerate_resets_steps_and_removes_outputs() {
    let fresh = |i: u32| {
        let k = |f: &str| format!("steps.{i}.{f}");
        [k("error"), k("checkpoint"), k("finished_at"), k("record")]
    };
    let mut unset = Document::new();
    for k in fresh(0) {
        unset.insert(k, "");
    }
    unset.insert("steps.0.retrying_since", "");
    for k in fresh(1) {
        unset.insert(k, "");
    }
    unset.insert("steps.1.history", "");
    unset.insert("steps.1.retrying_since", "");
    for k in ["output.draft", "output.compose", "claim_token", "wait", "resume"] {
        unset.insert(k, "");
    }
    check(
        Transition::regenerate(
            vec![(0, 1, vec![history(0)]), (1, 1, vec![])],
            vec!["draft".into(), "compose".into()],
            true,
            NOW,
        ),
        doc! {
            "$set": {
                "status": "running",
                "steps.0.status": "pending", "steps.0.attempt": 0i32, "steps.0.epoch": 1i64, "steps.0.history": [history_doc(0)],
                "steps.1.status": "pending", "steps.1.attempt": 0i32, "steps.1.epoch": 1i64,
                "claimable_time": d(NOW), "updated_at": d(NOW),
            },
            "$unset": unset,
            "$inc": { "revision": 1i64 },
        },
        Some(1),
    );
    check(
        Transition::regenerate(vec![(2, 3, vec![])], vec![], false, NOW),
        doc! {
            "$set": { "steps.2.status": "pending", "steps.2.attempt": 0i32, "steps.2.epoch": 3i64, "updated_at": d(NOW) },
            "$unset": {
                "steps.2.error": "", "steps.2.checkpoint": "", "steps.2.finished_at": "", "steps.2.record": "",
                "steps.2.history": "", "steps.2.retrying_since": "", "claim_token": "",
            },
            "$inc": { "revision": 1i64 },
        },
        Some(2),
    );
}

/// Epoch 0 is not stored (a document without it reads as 0): setting it unsets the key.
#[test]
fn epoch_zero_is_unset() {
    let mut t = Transition::new(TransitionKind::Release, NOW);
    t.step_mut(2).epoch = Some(0);
    t.step_mut(2).record = Some(Patch::Unset);
    check(
        t,
        doc! { "$set": { "updated_at": d(NOW) }, "$unset": { "steps.2.epoch": "", "steps.2.record": "" }, "$inc": { "revision": 1i64 } },
        Some(2),
    );
}

fn loop_history(epoch: u32) -> HistoryEntry {
    HistoryEntry { reason: HistoryReason::Loop, ..history(epoch) }
}

fn loop_history_doc(epoch: u32) -> Document {
    let mut d = history_doc(epoch);
    d.insert("reason", "loop");
    d
}

/// K-4 amendment: a loop's back-edge starts the next epoch of each reset step with its
/// history, removes their outputs and the resume; the iteration counter is set as an Int64
/// on the sender, removed where it goes back to 0, and left where none is given.
#[test]
fn loop_back_sets_and_resets_the_iterations() {
    let fresh = |i: u32, extra: &[&str]| {
        let mut d = Document::new();
        for f in ["error", "checkpoint", "finished_at", "record"].iter().chain(extra) {
            d.insert(format!("steps.{i}.{f}"), "");
        }
        d
    };
    let mut unset = fresh(0, &["retrying_since"]);
    unset.extend(fresh(1, &["history", "retrying_since", "iterations"]));
    unset.extend(fresh(2, &["retrying_since"]));
    for k in ["output.fetch", "output.publish", "resume"] {
        unset.insert(k, "");
    }
    check(
        Transition::loop_back(
            2,
            vec![(0, 1, vec![loop_history(0)], None), (1, 4, vec![], Some(0)), (2, 2, vec![loop_history(1)], Some(2))],
            vec!["fetch".into(), "publish".into()],
            true,
            NOW,
        ),
        doc! {
            "$set": {
                "steps.0.status": "pending", "steps.0.attempt": 0i32, "steps.0.epoch": 1i64, "steps.0.history": [loop_history_doc(0)],
                "steps.1.status": "pending", "steps.1.attempt": 0i32, "steps.1.epoch": 4i64,
                "steps.2.status": "pending", "steps.2.attempt": 0i32, "steps.2.epoch": 2i64, "steps.2.history": [loop_history_doc(1)],
                "steps.2.iterations": 2i64,
                "updated_at": d(NOW),
            },
            "$unset": unset,
            "$inc": { "revision": 1i64 },
        },
        Some(2),
    );
    // The resume kept when it belongs to no reset step.
    let unset = fresh(1, &["history", "retrying_since"]);
    check(
        Transition::loop_back(1, vec![(1, 1, vec![], Some(1))], vec![], false, NOW),
        doc! {
            "$set": { "steps.1.status": "pending", "steps.1.attempt": 0i32, "steps.1.epoch": 1i64, "steps.1.iterations": 1i64, "updated_at": d(NOW) },
            "$unset": unset,
            "$inc": { "revision": 1i64 },
        },
        Some(1),
    );
}

/// K-4 amendment: a step not taken is skipped without an error, its finish time set.
#[test]
fn branch_skip_skips_without_an_error() {
    check(
        Transition::branch_skip(&[1, 2], NOW),
        doc! {
            "$set": {
                "steps.1.status": "skipped", "steps.1.finished_at": d(NOW),
                "steps.2.status": "skipped", "steps.2.finished_at": d(NOW), "updated_at": d(NOW),
            },
            "$unset": { "steps.1.error": "", "steps.2.error": "" },
            "$inc": { "revision": 1i64 },
        },
        Some(2),
    );
}

/// K-6.8: a request is set under the holder's token, which it replaces (the lease left
/// alone); the step name is a string value, never a key. Applying it unsets both.
#[test]
fn operator_request_sets_and_request_applied_unsets() {
    use kernel_core::operator_request::{OperatorRequest, RequestedAction};
    let step = "x\\u0041\"é'$[0]\\";
    let req = OperatorRequest {
        id: "req-1".into(),
        action: RequestedAction::Regenerate { step: step.into() },
        holder: "tok".into(),
        requested_at: NOW.minus(5),
    };
    check(
        Transition::operator_request(req, "tok-2".into(), NOW),
        doc! {
            "$set": {
                "claim_token": "tok-2",
                "operator_request": {
                    "id": "req-1", "action": { "kind": "regenerate", "step": step }, "holder": "tok",
                    "requested_at": d(NOW.minus(5)),
                },
                "updated_at": d(NOW),
            },
            "$inc": { "revision": 1i64 },
        },
        None,
    );
    let cancel = OperatorRequest {
        id: "req-2".into(),
        action: RequestedAction::Cancel,
        holder: "tok".into(),
        requested_at: NOW,
    };
    check(
        Transition::operator_request(cancel, "tok-2".into(), NOW),
        doc! {
            "$set": {
                "claim_token": "tok-2",
                "operator_request": { "id": "req-2", "action": { "kind": "cancel" }, "holder": "tok", "requested_at": d(NOW) },
                "updated_at": d(NOW),
            },
            "$inc": { "revision": 1i64 },
        },
        None,
    );
    check(
        Transition::request_applied(None, NOW),
        doc! {
            "$set": { "claimable_time": d(NOW), "updated_at": d(NOW) },
            "$unset": { "claim_token": "", "operator_request": "" },
            "$inc": { "revision": 1i64 },
        },
        None,
    );
}
