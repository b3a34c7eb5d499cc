//! Snapshots of the SQL of every `Guard`, every `Transition` constructor and every
//! statement of every port module (store, inbox, outbox, dead letters, task inbox, cache,
//! observation),
//! in both dialects (`tests/snapshots/postgres.txt`, `tests/snapshots/sqlite.txt`). The
//! stores' own snapshots check that each of their sections is one of these, byte for byte:
//! the two stores send this protocol. A change here changes what the stores write; update
//! it (`UPDATE_SNAPSHOTS=1 cargo test -p sql-protocol --test protocol`) only together with
//! the stores' snapshots and docs (docs/store-sqlite.md) and, for a schema change, a new
//! migration.

use kernel_core::domain::*;
use kernel_core::record::*;
use kernel_core::transition::{Guard, Patch, Transition};
use serde_json::json;
use sql_protocol::{Dialect, Limits, Param, Statement};
use std::fmt::Write as _;
use testkit::protocol_cases::{canonical, guards, history, record, transitions, NOW};

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

/// Every statement builder of every port, in `dialect`, with representative arguments:
/// the store's statements first (the same sections, in the same order, as store-postgres's
/// and store-sqlite's own snapshots), then one entry per statement of each port module.
fn render_statements(dialect: Dialect, out: &mut String) {
    use kernel_core::ports::{
        CacheKey, CacheVersions, DeadLetterAction, DeadLetterStatus, DueCursor, SignalStatus, TaskOutcome,
    };
    use sql_protocol::{cache, dead_letter, inbox, outbox, store, task_inbox};
    use testkit::conformance as fx;
    use testkit::time::TestTime;
    let limits = Limits::default();
    let mark = if dialect == Dialect::Sqlite { '?' } else { '$' };
    let d = dialect;
    let pg = d == Dialect::Postgres;
    let prefix = if pg { "\"wfk\"." } else { "" };
    let mut r = |name: &str, s: Statement| render(out, &format!("statement {name}"), &s, mark);

    // The workflow store.
    let inst = testkit::conformance::store::claimed("wf-1", "tok");
    r("create", store::insert(d, prefix, &inst, &limits).unwrap());
    let spec = kernel_core::ports::ClaimSpec {
        now: NOW,
        lease_ms: DurationMs::from_millis(30_000),
        token: "tok".into(),
        types: vec!["summary".into()],
    };
    let (g, t) = (spec.guard(), spec.transition().unwrap());
    r("claim", store::claim(d, prefix, Some("wf-1"), &g, &t, &limits).unwrap());
    r("claim_any", store::claim(d, prefix, None, &g, &t, &limits).unwrap());
    let (apply, max) = store::apply(
        d,
        prefix,
        "wf-1",
        &Guard::Running { token: "tok".into() },
        &Transition::mark_running(2, NOW),
        &limits,
    )
    .unwrap();
    assert_eq!(max, Some(2));
    r("apply mark_running(2) under Running", apply);
    let cursor = DueCursor { claimable_time: NOW.minus(5), workflow_id: "wf-7".into() };
    r("scan_due_waits", store::due_waits(d, prefix, NOW, None, 100));
    r("scan_due_waits after", store::due_waits(d, prefix, NOW, Some(&cursor), 100));
    r("scan_claimable", store::claimable(d, prefix, None, 100));
    r("scan_claimable after", store::claimable(d, prefix, Some("wf-7"), 100));
    r("store find", store::find(d, prefix, "biz_key", "order:7"));
    r("store list", store::list(d, prefix, 100));

    // The signal inbox.
    let t = format!("{prefix}signal_inbox");
    let wf: kernel_core::WorkflowId = "wf-1".to_string().into();
    r("inbox insert", inbox::insert(d, &t, &fx::inbox::record("sig-1", NOW)).unwrap());
    r("inbox get", inbox::get(d, &t, "sig-1").unwrap());
    r("inbox find_pending", inbox::find_pending(d, &t, &wf, "approved", "doc:42", 1).unwrap().unwrap());
    r("inbox mark_matched", inbox::mark_matched(d, &t, "sig-1", NOW).unwrap());
    r("inbox scan_pending", inbox::scan_pending(d, &t, None, Some(100)).unwrap().unwrap());
    r("inbox scan_pending after", inbox::scan_pending(d, &t, Some("sig-1"), Some(100)).unwrap().unwrap());
    r("inbox scan_created_before", inbox::scan_created_before(d, &t, NOW, Some("sig-1"), Some(100)).unwrap().unwrap());
    r("inbox scan_workflow", inbox::scan_workflow(d, &t, &wf, SignalStatus::Matched, Some(100)).unwrap().unwrap());
    let ids = vec!["sig-1".to_string(), "sig-2".to_string()];
    r("inbox delete_if", inbox::delete_if(d, &t, &ids, SignalStatus::Pending).unwrap().unwrap());
    r("inbox count_pending_orphans", inbox::count_pending_orphans(d, &t, None, 1000).unwrap().unwrap());
    r("inbox count_pending_orphans of one", inbox::count_pending_orphans(d, &t, Some(&wf), 1000).unwrap().unwrap());
    r("inbox clear_orphans", inbox::clear_orphans(d, &t, &wf).unwrap());

    // The outbox.
    let c = outbox::OutboxColumns {
        id: "id",
        status: "status",
        fields: "fields",
        dispatch: "dispatch",
        error_field: "last.error",
        failed_status: "failed",
    };
    let (ot, locks) = if pg {
        ("\"app\".\"orders\"".to_string(), "\"app\".\"orders_locks\"".to_string())
    } else {
        ("\"orders\"".to_string(), "\"orders_locks\"".to_string())
    };
    let o = outbox::OutboxSql::new(d, limits, ot, locks, &c).unwrap();
    let obj: kernel_core::ObjectId = "obj-1".into();
    let f1 = kernel_core::FencingToken::from("f1");
    let lease = kernel_core::LeaseToken::from("lease-1");
    let intent = fx::outbox::intent("f1", NOW);
    r("outbox accept", o.accept(&obj, json!({"title": "note", "n": 3}), "initial", &intent).unwrap());
    r("outbox get", o.get(&obj).unwrap());
    r("outbox confirm_dispatched", o.confirm_dispatched(&obj, &f1).unwrap());
    r("outbox defer_pending", o.defer_pending(&obj, &f1, NOW.plus(1_000)).unwrap());
    r("outbox try_lease", o.try_lease(&obj, NOW, &lease, NOW.plus(30_000)).unwrap());
    r("outbox renew_lease", o.renew_lease(&obj, &f1, &lease, NOW.plus(60_000)).unwrap());
    r("outbox confirm_leased", o.confirm_leased(&obj, &f1, &lease).unwrap());
    r("outbox revert_leased", o.revert_leased(&obj, &f1, &lease, NOW.plus(1_000)).unwrap());
    r("outbox scan_due", o.scan_due(NOW, None, Some(100)).unwrap().unwrap());
    r("outbox scan_due after", o.scan_due(NOW, Some(&obj), Some(100)).unwrap().unwrap());
    let next = fx::outbox::intent("f2", NOW);
    r("outbox retry_failed", o.retry_failed(&obj, &f1, &next, "initial").unwrap());
    let fields = json!({"title": "done", "meta.n": 4});
    r("outbox fenced_update", o.fenced_update(&obj, &f1, fields, Some("sent")).unwrap().unwrap());
    r("outbox try_lock", o.try_lock("recovery", "node-1", NOW, NOW.plus(30_000)).unwrap());

    // Dead letters.
    let t = format!("{prefix}dead_letters");
    r("dead_letter record", dead_letter::record(d, &t, &fx::dead_letter::letter("dl-1"), &limits).unwrap());
    r("dead_letter get", dead_letter::get(d, &t, "dl-1").unwrap());
    r("dead_letter list", dead_letter::list(d, &t, None, None, 100).unwrap());
    r(
        "dead_letter list open after",
        dead_letter::list(d, &t, Some(DeadLetterStatus::Open), Some("dl-1"), 100).unwrap(),
    );
    let dec = fx::dead_letter::decision("ops", DeadLetterAction::Complete { output: json!({"ok": true}) }, NOW);
    r("dead_letter decide", dead_letter::decide(d, &t, "dl-1", &dec, &limits).unwrap());
    r("dead_letter close", dead_letter::close(d, &t, "dl-1", NOW).unwrap());
    r("dead_letter purge_closed", dead_letter::purge_closed(d, &t, NOW, 100).unwrap());

    // The task inbox.
    let t = format!("{prefix}task_inbox");
    let task = fx::task_inbox::task("task-1");
    r("task_inbox open", task_inbox::open(d, &t, &task, &limits).unwrap());
    r("task_inbox get", task_inbox::get(d, &t, "task-1").unwrap());
    let actor = fx::task_inbox::member("ann");
    r("task_inbox list_open", task_inbox::list_open(d, &t, &actor, None, 100).unwrap());
    r("task_inbox list_open after", task_inbox::list_open(d, &t, &actor, Some("task-1"), 100).unwrap());
    let dec = fx::task_inbox::sensitive("ann", TaskOutcome::Approve, NOW, "salary data");
    r("task_inbox decide", task_inbox::decide(d, &t, "task-1", &task.token, &actor, &dec, &limits).unwrap());
    r("task_inbox close", task_inbox::close(d, &t, "task-1", NOW).unwrap());
    r("task_inbox purge_sensitive_reasons", task_inbox::purge_sensitive_reasons(d, &t, NOW, 100).unwrap());
    r("task_inbox purge_closed", task_inbox::purge_closed(d, &t, NOW, 100).unwrap());

    // The result cache.
    let t = format!("{prefix}result_cache");
    let v = CacheVersions { prompt: "p1".into(), model: "m1".into(), tool: "t1".into(), data: "d1".into() };
    let key = CacheKey::new("fetch", &v, &json!({"doc": 42})).unwrap();
    r("cache get", cache::get(d, &t, &key, NOW));
    r("cache put", cache::put(d, &t, &key, &json!({"doc": 42}), NOW, DurationMs::from_millis(60_000)).unwrap());
    r("cache purge_expired", cache::purge_expired(d, &t, NOW, 100).unwrap());

    // The observation projection.
    let o = sql_protocol::observation::ObservationSql::new(d, prefix);
    let ob = observer::conformance::obs(
        "order-7",
        3,
        kernel_core::transition::TransitionKind::MarkRunning,
        Some("fetch"),
        1,
    );
    let row = observer::AttemptRow::from_observation(&ob).expect("an attempt");
    r("observation attempt_get", o.attempt_get(&row).unwrap());
    r("observation attempt_upsert", o.attempt_upsert(&row).unwrap());
    r("observation snapshot_get", o.snapshot_get("order-7"));
    if pg {
        r("observation snapshot_upsert", o.snapshot_upsert(&ob).unwrap());
    } else {
        assert!(o.snapshot_upsert(&ob).is_err(), "SQLite merges in its transaction");
    }
    let snap = observer::Snapshot::from_observation(&ob);
    r("observation snapshot_put", o.snapshot_put(&snap).unwrap());
    r(
        "observation snapshots_query",
        o.snapshots_query(&observer::SnapshotQuery { limit: 50, ..Default::default() }).unwrap(),
    );
    let q = observer::SnapshotQuery {
        workflow_type: Some("summary".into()),
        status: Some(WorkflowStatus::Waiting),
        step_name: Some("fetch".into()),
        updated_from: Some(NOW),
        updated_to: Some(NOW.plus(60_000)),
        biz_key_prefix: Some("order-".into()),
        waiting_on: Some("approved".into()),
        before: Some((NOW.plus(30_000), "order-9".into())),
        limit: 50,
    };
    r("observation snapshots_query every filter", o.snapshots_query(&q).unwrap());
    let q = observer::AttemptQuery {
        biz_key: Some("order-7".into()),
        workflow_type: Some("summary".into()),
        step_name: Some("fetch".into()),
        outcome: Some(observer::AttemptOutcome::Failed),
        updated_from: Some(NOW),
        updated_to: Some(NOW.plus(60_000)),
        limit: 50,
    };
    r("observation attempts_query every filter", o.attempts_query(&q));
    let q = observer::AuditQuery {
        actor: Some("ann".into()),
        action: Some("retry".into()),
        target: Some("wf-1".into()),
        before: Some((NOW, "op-9".into())),
        limit: 50,
    };
    r("observation audit_query every filter", o.audit_query(&q).unwrap());
    r(
        "observation audit_insert",
        o.audit_insert(&observer::conformance::audit_entry("op-1", 0, "ann", "retry", "wf-1")).unwrap(),
    );
    r("observation audit_purge", o.audit_purge(NOW, 100).unwrap());
    r("observation finished_purge", o.finished_purge(NOW, 100).unwrap());
    r("observation attempts_delete", o.attempts_delete("order-7"));
}

/// The snapshot of `dialect`: its header, every guard, every transition, every statement.
fn snapshot(dialect: Dialect) -> String {
    let name = if dialect == Dialect::Sqlite { "SQLite" } else { "PostgreSQL" };
    let mut got = format!("# The SQL of the {name} dialect (generated by tests/protocol.rs; do not edit by hand)\n\n");
    render_all(dialect, &mut got);
    render_statements(dialect, &mut got);
    got
}

fn pinned(dialect: Dialect, file: &str) {
    let got = snapshot(dialect);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    if std::env::var("UPDATE_SNAPSHOTS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &got).expect("write snapshot");
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    compare(file, &got, &want);
    let names: Vec<&str> = got.lines().filter(|l| l.starts_with("## ")).collect();
    let unique: std::collections::BTreeSet<&&str> = names.iter().collect();
    assert_eq!(names.len(), unique.len(), "one entry per name");
}

/// K-6.4: the PostgreSQL text of every guard, transition and statement of every port is
/// pinned; store-postgres checks that every section of its own snapshot is one of these.
#[test]
fn k6_4_postgres_dialect_is_pinned() {
    pinned(Dialect::Postgres, "tests/snapshots/postgres.txt");
}

/// K-6.4: the SQLite text of every guard, transition and statement of every port is
/// pinned; store-sqlite checks that every section of its own snapshot is one of these.
#[test]
fn k6_4_sqlite_dialect_is_pinned() {
    pinned(Dialect::Sqlite, "tests/snapshots/sqlite.txt");
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
/// every store, because PostgreSQL cannot hold it).
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
}

/// K-2.0 (amendment): every output name K-2.0 admits is data in both dialects, in the
/// written and in the removed outputs and in a created instance: PostgreSQL binds the name
/// itself, SQLite binds a JSON path in which the name is a JSON string literal, so SQLite's
/// decoding of the path's escapes yields exactly the name (`x\u0041` stays `x\u0041`, never
/// `xA`; `tail\` closes its label).
#[test]
fn output_names_are_bound_and_escaped_in_both_dialects() {
    let names = ["x\\u0041", "tail\\", "say \"hi\"", "a\\\"b", "it's", "名前"];
    let mut t = Transition::complete_step(1, names[0], json!(0), DurationMs::from_millis(0), NOW, false);
    t.outputs.extend(names[1..3].iter().map(|n| (n.to_string(), json!(1))));
    t.outputs_unset.extend(names[3..].iter().map(|n| n.to_string()));
    let texts = |s: &sql_protocol::Statement| -> Vec<String> {
        s.params.iter().filter_map(|p| if let Param::Text(t) = p { Some(t.clone()) } else { None }).collect()
    };
    let pg = sql_protocol::transition_assignments(Dialect::Postgres, &t, &Limits::default()).unwrap();
    let sqlite = sql_protocol::transition_assignments(Dialect::Sqlite, &t, &Limits::default()).unwrap();
    for n in names {
        assert!(!pg.sql.contains(n) && !sqlite.sql.contains(n), "{n:?} is never spliced");
        assert!(texts(&pg).contains(&n.to_string()), "PostgreSQL binds {n:?} itself");
        let path = format!("$.{}", serde_json::to_string(n).unwrap());
        assert!(texts(&sqlite).contains(&path), "SQLite binds {path:?} for {n:?}: {:?}", texts(&sqlite));
    }
    assert!(texts(&sqlite).contains(&r#"$."x\\u0041""#.to_string()), "the backslash is escaped, not decoded");
    assert!(texts(&sqlite).contains(&r#"$."tail\\""#.to_string()), "a trailing backslash cannot escape the quote");
    let mut w = testkit::conformance::store::instance("wf-1");
    w.output = names.iter().map(|n| (n.to_string(), json!(n))).collect();
    for d in [Dialect::Postgres, Dialect::Sqlite] {
        let ins = sql_protocol::insert_instance(d, "workflow_instances", &w, &Limits::default());
        assert!(ins.is_ok(), "{d:?}: every admitted name is created: {ins:?}");
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
    let file = std::fs::read_to_string(&path).expect("the PostgreSQL snapshot");
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
                   prepare_failures, refused_writes, revision, created_at, updated_at, finished_at, compensation, \
                   trace_parent, operator_request";
    let sql = format!("UPDATE {table} SET {sets} WHERE workflow_id = {id} AND {cond} RETURNING {columns}");
    let mut got = String::new();
    render(&mut got, "statement claim", &b.statement(sql), '$');
    assert_eq!(got, section("statement claim"));
}
