//! Snapshot of the SQL protocol: the condition of every `Guard`, the `SET` list of every
//! `Transition` constructor and the full statements of create, claim, claim_any, apply and
//! the scans. A change here changes what is written; update the snapshot
//! (`UPDATE_SNAPSHOTS=1 cargo test -p store-postgres --test it protocol`) only together
//! with the crate docs and, for a schema change, a new migration. No server needed.

use kernel_core::model::*;
use kernel_core::ports::DueCursor;
use kernel_core::record::*;
use kernel_core::transition::{Guard, Patch, Transition, TransitionKind};
use serde_json::json;
use std::fmt::Write as _;
use store_postgres::protocol::{self, Limits, Param, Statement};
use testkit::time::TestTime;

const NOW: Instant = Instant::from_millis(1_700_000_000_000);
const SNAPSHOT: &str = "tests/it/snapshots/protocol.txt";

fn render(out: &mut String, name: &str, s: &Statement) {
    let _ = writeln!(out, "## {name}\n{}", s.sql);
    for (i, p) in s.params.iter().enumerate() {
        match p {
            // Keys sorted: serde_json's map order depends on its features, which another
            // package of the workspace may switch on.
            Param::Jsonb(v) => {
                let _ = writeln!(out, "  ${} = Jsonb({})", i + 1, canonical(v));
            }
            _ => {
                let _ = writeln!(out, "  ${} = {p:?}", i + 1);
            }
        }
    }
    out.push('\n');
}

/// JSON text with every object's keys in sorted order.
fn canonical(v: &serde_json::Value) -> String {
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

fn record(run: u32, epoch: u32) -> StepRecord {
    StepRecord {
        run,
        epoch,
        entries: vec![RecordEntry::Value(RecordedValue { label: "now".into(), value: json!(5), recorded_at: NOW })],
    }
}

fn history(epoch: u32) -> HistoryEntry {
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
fn loop_history(epoch: u32) -> HistoryEntry {
    HistoryEntry { reason: HistoryReason::Loop, ..history(epoch) }
}

fn guards() -> Vec<(&'static str, Guard)> {
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

fn transitions() -> Vec<(&'static str, Transition)> {
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
    ]
}

fn snapshot() -> String {
    let limits = Limits::default();
    let mut out =
        String::from("# The SQL of store-postgres (generated by tests/it/protocol.rs; do not edit by hand)\n\n");
    for (name, g) in guards() {
        render(&mut out, name, &protocol::guard_condition(&g).expect("valid guard"));
    }
    for (name, t) in transitions() {
        render(&mut out, name, &protocol::transition_assignments(&t, &limits).expect("valid transition"));
    }
    let s = "wfk";
    let inst = testkit::conformance::store::claimed("wf-1", "tok");
    render(&mut out, "statement create", &protocol::insert_statement(s, &inst, &limits).unwrap());
    let spec = kernel_core::ports::ClaimSpec {
        now: NOW,
        lease_ms: DurationMs::from_millis(30_000),
        token: "tok".into(),
        types: vec!["summary".into()],
    };
    let (g, t) = (spec.guard(), spec.transition().unwrap());
    let parts = protocol::ClaimSpecParts { guard: &g, transition: &t };
    render(&mut out, "statement claim", &protocol::claim_statement(s, Some("wf-1"), &parts, &limits).unwrap());
    render(&mut out, "statement claim_any", &protocol::claim_statement(s, None, &parts, &limits).unwrap());
    let (apply, max) = protocol::apply_statement(
        s,
        "wf-1",
        &Guard::Running { token: "tok".into() },
        &Transition::mark_running(2, NOW),
        &limits,
    )
    .unwrap();
    assert_eq!(max, Some(2));
    render(&mut out, "statement apply mark_running(2) under Running", &apply);
    let cursor = DueCursor { claimable_time: NOW.minus(5), workflow_id: "wf-7".into() };
    render(&mut out, "statement scan_due_waits", &protocol::due_waits_statement(s, NOW, None, 100));
    render(&mut out, "statement scan_due_waits after", &protocol::due_waits_statement(s, NOW, Some(&cursor), 100));
    render(&mut out, "statement scan_claimable", &protocol::claimable_statement(s, None, 100));
    render(&mut out, "statement scan_claimable after", &protocol::claimable_statement(s, Some("wf-7"), 100));
    out
}

/// Every guard and transition constructor, rendered, equals the committed snapshot.
#[test]
fn k6_4_sql_of_every_guard_and_transition_is_pinned() {
    let got = snapshot();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(SNAPSHOT);
    if std::env::var("UPDATE_SNAPSHOTS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &got).expect("write snapshot");
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    if got != want {
        let first = got.lines().zip(want.lines()).position(|(a, b)| a != b).unwrap_or(0);
        panic!(
            "the SQL differs from {SNAPSHOT} from line {}:\n  got:  {:?}\n  want: {:?}\n(UPDATE_SNAPSHOTS=1 rewrites it)",
            first + 1,
            got.lines().nth(first),
            want.lines().nth(first)
        );
    }
}

/// K-6.4: `revision` is incremented by the writes that bump it, never part of a guard but
/// the operator's (optimistic, K-17.3); the claim and the heartbeat leave it alone.
#[test]
fn k6_4_revision_is_never_a_guard() {
    for (name, g) in guards() {
        // The operator's guard is the one optimistic guard: it reads the revision.
        let reads = matches!(g, Guard::Operator { .. });
        assert_eq!(protocol::guard_condition(&g).unwrap().sql.contains("revision"), reads, "{name}");
    }
    for (name, t) in transitions() {
        let sql = protocol::transition_assignments(&t, &Limits::default()).unwrap().sql;
        assert_eq!(sql.contains("revision = revision + 1"), t.bump_revision, "{name}: {sql}");
    }
}

/// K-2.0: ids, tokens and payloads are bound values; text that looks like SQL or a Mongo
/// operator never reaches the statement text.
#[test]
fn user_values_are_bound_never_spliced() {
    let evil = "x'; DROP TABLE wfk.workflow_instances; --";
    let mut t = Transition::complete_step(1, "compose", json!({ "k": evil }), DurationMs::from_millis(0), NOW, false);
    t.claim_token = Some(Patch::Set(evil.into()));
    let (s, _) =
        protocol::apply_statement("wfk", evil, &Guard::Running { token: evil.into() }, &t, &Limits::default()).unwrap();
    assert!(!s.sql.contains("DROP"), "{}", s.sql);
    assert!(s.params.iter().filter(|p| format!("{p:?}").contains("DROP")).count() >= 3);
}

/// Strings PostgreSQL cannot store are refused before anything is built: NUL in a JSONB
/// string names the field — by kernel-core's K-2.0 rule for every store, and by the
/// adapter's own check for values that never pass through it.
#[test]
fn nul_in_a_jsonb_string_is_refused_naming_the_field() {
    let t = Transition::complete_step(1, "compose", json!({"a": ["x\u{0}y"]}), DurationMs::from_millis(0), NOW, false);
    assert!(kernel_core::validate::storable("output.compose", &json!({"a": ["x\u{0}y"]})).is_err());
    assert!(protocol::storable_in_postgres("output.compose", &json!({"a": ["x\u{0}y"]})).is_err());
    match protocol::transition_assignments(&t, &Limits::default()) {
        Err(kernel_core::Error::InvalidInput { field, .. }) => assert_eq!(field, "output.compose"),
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}
