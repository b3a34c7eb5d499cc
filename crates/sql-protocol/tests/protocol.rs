//! Snapshots of the SQL of every `Guard` and every `Transition` constructor, in both
//! dialects. The PostgreSQL text is compared with the guard and transition part of
//! store-postgres's own snapshot (`tests/snapshots/postgres.txt` is a copy of it): the
//! two stores send the same protocol. A change to the SQLite text changes what store-sqlite
//! writes; update it (`UPDATE_SNAPSHOTS=1 cargo test -p sql-protocol --test protocol`) only
//! together with docs/store-sqlite.md.

use kernel_core::model::*;
use kernel_core::record::*;
use kernel_core::transition::{Guard, Patch, Transition, TransitionKind};
use serde_json::json;
use sql_protocol::{Dialect, Limits, Param, Statement};
use std::fmt::Write as _;
use testkit::time::TestTime;

const NOW: Instant = Instant::from_millis(1_700_000_000_000);

fn render(out: &mut String, name: &str, s: &Statement, mark: char) {
    let _ = writeln!(out, "## {name}\n{}", s.sql);
    for (i, p) in s.params.iter().enumerate() {
        match p {
            // Keys sorted: serde_json's map order depends on its features, which another
            // package of the workspace may switch on.
            Param::Jsonb(v) => {
                let _ = writeln!(out, "  {mark}{} = Jsonb({})", i + 1, canonical(v));
            }
            _ => {
                let _ = writeln!(out, "  {mark}{} = {p:?}", i + 1);
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

fn render_all(dialect: Dialect, out: &mut String) {
    let limits = Limits::default();
    let mark = if dialect == Dialect::Sqlite { '?' } else { '$' };
    for (name, g) in guards() {
        render(out, name, &sql_protocol::guard_condition(dialect, &g).expect("valid guard"), mark);
    }
    for (name, t) in transitions() {
        render(out, name, &sql_protocol::transition_assignments(dialect, &t, &limits).expect("valid transition"), mark);
    }
}

fn compare(path: &str, got: &str, want: &str) {
    if got != want {
        let first = got.lines().zip(want.lines()).position(|(a, b)| a != b).unwrap_or(0);
        panic!(
            "the SQL differs from {path} from line {}:\n  got:  {:?}\n  want: {:?}",
            first + 1,
            got.lines().nth(first),
            want.lines().nth(first)
        );
    }
}

/// K-6.4: the PostgreSQL dialect renders exactly what store-postgres sends today: the
/// guard and transition sections of its pinned snapshot, byte for byte.
#[test]
fn k6_4_postgres_dialect_equals_the_store_postgres_snapshot() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/postgres.txt");
    let file = std::fs::read_to_string(&path).expect("the copied snapshot");
    let cut = file.find("## statement ").expect("statement sections follow the guards and transitions");
    let mut got =
        String::from("# The SQL of store-postgres (generated by tests/it/protocol.rs; do not edit by hand)\n\n");
    render_all(Dialect::Postgres, &mut got);
    compare("tests/snapshots/postgres.txt", &got, &file[..cut]);
    assert_eq!(got.matches("## ").count(), guards().len() + transitions().len(), "every case rendered");
}

/// K-6.4: the SQLite text of every guard and transition is pinned.
#[test]
fn k6_4_sqlite_dialect_is_pinned() {
    let mut got =
        String::from("# The SQL of the SQLite dialect (generated by tests/protocol.rs; do not edit by hand)\n\n");
    render_all(Dialect::Sqlite, &mut got);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/sqlite.txt");
    if std::env::var("UPDATE_SNAPSHOTS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &got).expect("write snapshot");
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    compare("tests/snapshots/sqlite.txt", &got, &want);
}

/// K-6.4: `revision` is never part of a guard but the operator's (optimistic, K-17.3); the
/// writes that bump it say so, in both dialects.
#[test]
fn k6_4_revision_is_never_a_guard() {
    for d in [Dialect::Postgres, Dialect::Sqlite] {
        for (name, g) in guards() {
            // The operator's guard is the one optimistic guard: it reads the revision.
            let reads = matches!(g, Guard::Operator { .. });
            assert_eq!(sql_protocol::guard_condition(d, &g).unwrap().sql.contains("revision"), reads, "{name}");
        }
        for (name, t) in transitions() {
            let sql = sql_protocol::transition_assignments(d, &t, &Limits::default()).unwrap().sql;
            assert_eq!(sql.contains("revision = revision + 1"), t.bump_revision, "{name}: {sql}");
        }
    }
}

/// K-2.0: values are bound, never spliced, in both dialects.
#[test]
fn user_values_are_bound_never_spliced() {
    let evil = "x'; DROP TABLE workflow_instances; --";
    for d in [Dialect::Postgres, Dialect::Sqlite] {
        let mut t =
            Transition::complete_step(1, "compose", json!({ "k": evil }), DurationMs::from_millis(0), NOW, false);
        t.claim_token = Some(Patch::Set(evil.into()));
        let g = sql_protocol::guard_condition(d, &Guard::Running { token: evil.into() }).unwrap();
        let s = sql_protocol::transition_assignments(d, &t, &Limits::default()).unwrap();
        assert!(!g.sql.contains("DROP") && !s.sql.contains("DROP"), "{d:?}");
        let bound = g.params.iter().chain(&s.params).filter(|p| format!("{p:?}").contains("DROP")).count();
        assert!(bound >= 3, "{d:?}");
    }
}

/// What a database cannot store is refused naming the field: NUL in a JSON string (K-2.0,
/// every store, because PostgreSQL cannot hold it), an output name SQLite's JSON path cannot
/// address (SQLite only).
#[test]
fn unstorable_values_are_refused_naming_the_field() {
    let nul =
        Transition::complete_step(1, "compose", json!({"a": ["x\u{0}y"]}), DurationMs::from_millis(0), NOW, false);
    for dialect in [Dialect::Postgres, Dialect::Sqlite] {
        match sql_protocol::transition_assignments(dialect, &nul, &Limits::default()) {
            Err(kernel_core::Error::InvalidInput { field, .. }) => assert_eq!(field, "output.compose"),
            other => panic!("{dialect:?}: expected InvalidInput, got {other:?}"),
        }
    }
    let quote = Transition::complete_step(1, "say \"hi\"", json!(1), DurationMs::from_millis(0), NOW, false);
    assert!(sql_protocol::transition_assignments(Dialect::Postgres, &quote, &Limits::default()).is_ok());
    match sql_protocol::transition_assignments(Dialect::Sqlite, &quote, &Limits::default()) {
        Err(kernel_core::Error::InvalidInput { field, .. }) => assert_eq!(field, "output.say \"hi\""),
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

/// A NUL or an integer beyond the signed 64-bit range in a recorded value or in the
/// history is refused naming the step's field, in both dialects, as in an output (K-2.0).
#[test]
fn unstorable_record_and_history_values_are_refused_naming_the_field() {
    let mut r = record(0, 0);
    r.entries.push(RecordEntry::Value(RecordedValue {
        label: "v".into(),
        value: json!({"k": "a\u{0}b"}),
        recorded_at: NOW,
    }));
    let mut h = history(0);
    h.output = Some(json!(["\u{0}"]));
    let mut big = record(0, 0);
    big.entries.push(RecordEntry::Value(RecordedValue { label: "v".into(), value: json!(u64::MAX), recorded_at: NOW }));
    let cases = [
        ("steps.1.record", Transition::record_step(1, r, None, NOW)),
        ("steps.1.record", Transition::record_step(1, big, None, NOW)),
        ("steps.1.history", Transition::record_step(1, record(0, 0), Some(vec![h.clone()]), NOW)),
        ("steps.2.history", Transition::step_epoch(2, 1, vec![h], NOW)),
    ];
    for (want, t) in cases {
        for d in [Dialect::Postgres, Dialect::Sqlite] {
            match sql_protocol::transition_assignments(d, &t, &Limits::default()) {
                Err(kernel_core::Error::InvalidInput { field, .. }) => assert_eq!(field, want, "{d:?}"),
                other => panic!("{want} {d:?}: expected InvalidInput, got {other:?}"),
            }
        }
    }
}

/// A created instance whose step carries an unstorable record or history is refused naming
/// the step's field, in both dialects, as a checkpoint is.
#[test]
fn an_instance_with_an_unstorable_record_is_refused() {
    let mut w = testkit::conformance::store::instance("wf-1");
    let mut r = record(0, 0);
    r.entries.push(RecordEntry::Value(RecordedValue { label: "v".into(), value: json!(u64::MAX), recorded_at: NOW }));
    w.steps[0].record = Some(r);
    for d in [Dialect::Postgres, Dialect::Sqlite] {
        match sql_protocol::insert_instance(d, "t", &w, &Limits::default()) {
            Err(kernel_core::Error::InvalidInput { field, .. }) => assert_eq!(field, "steps[0].record", "{d:?}"),
            other => panic!("{d:?}: expected InvalidInput, got {other:?}"),
        }
    }
    w.steps[0].record = None;
    let mut h = history(0);
    h.output = Some(json!("a\u{0}b"));
    w.steps[0].history = vec![h];
    for d in [Dialect::Postgres, Dialect::Sqlite] {
        match sql_protocol::insert_instance(d, "t", &w, &Limits::default()) {
            Err(kernel_core::Error::InvalidInput { field, .. }) => assert_eq!(field, "steps[0].history", "{d:?}"),
            other => panic!("{d:?}: expected InvalidInput, got {other:?}"),
        }
    }
    w.steps[0].history = vec![history(0)];
    assert!(sql_protocol::insert_instance(Dialect::Sqlite, "t", &w, &Limits::default()).is_ok());
}

/// The operator guard's revision must fit the signed 64-bit column: beyond it the guard is
/// refused (typed), never sent.
#[test]
fn an_operator_revision_beyond_i64_is_refused() {
    for d in [Dialect::Postgres, Dialect::Sqlite] {
        match sql_protocol::guard_condition(d, &Guard::Operator { revision: u64::MAX }) {
            Err(kernel_core::Error::InvalidInput { field, .. }) => assert_eq!(field, "revision"),
            other => panic!("{d:?}: expected InvalidInput, got {other:?}"),
        }
    }
}

/// The API fits store-postgres's statements: its apply and claim statements, composed from
/// `Binds` (the id bound first), `guard_sql`, `set_sql` and `steps_exist_sql`, equal the
/// statement sections of its snapshot, text and values.
#[test]
fn postgres_statements_compose_from_the_api() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/postgres.txt");
    let file = std::fs::read_to_string(&path).expect("the copied snapshot");
    let section = |name: &str| -> String {
        let start = file.find(&format!("## {name}\n")).unwrap_or_else(|| panic!("section {name}"));
        let rest = &file[start..];
        rest[..rest.find("\n\n").map_or(rest.len(), |e| e + 2)].to_string()
    };
    let limits = Limits::default();
    let table = "\"wfk\".workflow_instances";
    let mut b = sql_protocol::Binds::new(Dialect::Postgres);
    let id = b.bind(Param::Text("wf-1".into()));
    let cond = sql_protocol::guard_sql(&mut b, &Guard::Running { token: "tok".into() }).unwrap();
    let sets = sql_protocol::set_sql(&mut b, &Transition::mark_running(2, NOW), &limits).unwrap();
    let exist = sql_protocol::steps_exist_sql(&mut b, 2);
    let sql = format!("UPDATE {table} SET {sets} WHERE workflow_id = {id} AND {cond} AND {exist} RETURNING revision");
    let mut got = String::new();
    render(&mut got, "statement apply mark_running(2) under Running", &b.statement(sql), '$');
    assert_eq!(got, section("statement apply mark_running(2) under Running"));

    let spec = kernel_core::ports::ClaimSpec {
        now: NOW,
        lease_ms: DurationMs::from_millis(30_000),
        token: "tok".into(),
        types: vec!["summary".into()],
    };
    let mut b = sql_protocol::Binds::new(Dialect::Postgres);
    let id = b.bind(Param::Text("wf-1".into()));
    let cond = sql_protocol::guard_sql(&mut b, &spec.guard()).unwrap();
    let sets = sql_protocol::set_sql(&mut b, &spec.transition().unwrap(), &limits).unwrap();
    let columns = "workflow_id, workflow_type, biz_key, status, steps, input, output, claimable_time, claim_token, \
                   wait, resume, definition_fingerprint, fingerprint_mismatch, business_priority, retry_count, \
                   prepare_failures, revision, created_at, updated_at, finished_at, compensation";
    let sql = format!("UPDATE {table} SET {sets} WHERE workflow_id = {id} AND {cond} RETURNING {columns}");
    let mut got = String::new();
    render(&mut got, "statement claim", &b.statement(sql), '$');
    assert_eq!(got, section("statement claim"));
}
