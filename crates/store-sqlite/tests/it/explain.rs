//! The query plans of the store's and inbox's statements on 20 000 instances and signals
//! (after `ANALYZE`): each uses an index, none scans a whole table.

use crate::support::TestDb;
use kernel_core::domain::*;
use kernel_core::ports::{ClaimSpec, DueCursor};
use kernel_core::transition::{Guard, Transition};
use store_sqlite::protocol::{self, Limits, Param, Statement};

const T0: Instant = Instant::from_millis(1_700_000_000_000);

fn plan(c: &rusqlite::Connection, s: &Statement) -> Vec<String> {
    let mut st = c.prepare(&format!("EXPLAIN QUERY PLAN {}", s.sql)).unwrap();
    let values = protocol::values(s);
    let rows = st
        .query_map(rusqlite::params_from_iter(values.iter()), |r| {
            Ok(format!("{}<{} {}", r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(3)?))
        })
        .unwrap();
    rows.map(Result::unwrap).collect()
}

fn assert_indexed(name: &str, lines: &[String]) {
    let full: Vec<&String> = lines
        .iter()
        .filter(|l| {
            let detail = l.split_once(' ').map_or(l.as_str(), |(_, d)| d);
            (detail.starts_with("SCAN workflow_instances") || detail.starts_with("SCAN signal_inbox"))
                && !detail.contains("USING")
        })
        .collect();
    assert!(full.is_empty(), "{name} scans a table: {lines:?}");
    assert!(lines.iter().any(|l| l.contains("USING") && l.contains("INDEX")), "{name} uses no index: {lines:?}");
}

#[tokio::test]
async fn every_statement_uses_an_index_on_20_000_rows() {
    let t = TestDb::new().await;
    let mut c = rusqlite::Connection::open(t.db.path()).unwrap();
    let tx = c.transaction().unwrap();
    let statuses =
        [WorkflowStatus::Running, WorkflowStatus::Waiting, WorkflowStatus::Completed, WorkflowStatus::Failed];
    for i in 0..20_000u32 {
        let mut w = testkit::conformance::store::claimed(&format!("wf-{i:05}"), "tok");
        w.biz_key = format!("biz-{i:05}");
        w.workflow_type = format!("type-{}", i % 10);
        w.status = statuses[(i % 4) as usize];
        if w.status.is_terminal() {
            w.claimable_time = None;
            w.claim_token = None;
        }
        let s = protocol::insert_statement(&w, &Limits::default()).unwrap();
        let mut ins = tx.prepare_cached(&s.sql).unwrap();
        let mut rows = ins.query(rusqlite::params_from_iter(protocol::values(&s).iter())).unwrap();
        assert!(rows.next().unwrap().is_some(), "inserted");
        drop(rows);
        drop(ins);
        let sig = format!(
            "INSERT INTO signal_inbox VALUES ('sig-{i:05}', 'wf-{i:05}', 'approved', 'k', 0, '{}', {}, NULL, {})",
            if i % 3 == 0 { "pending" } else { "matched" },
            T0.as_millis() + i64::from(i),
            i % 7 == 0
        );
        tx.execute(&sig, []).unwrap();
    }
    tx.commit().unwrap();
    c.execute_batch("ANALYZE").unwrap();

    let limits = Limits::default();
    let spec = ClaimSpec {
        now: T0,
        lease_ms: DurationMs::from_millis(30_000),
        token: "t2".into(),
        types: vec!["type-1".into(), "type-3".into()],
    };
    let (g, tr) = (spec.guard(), spec.transition().unwrap());
    let cursor = DueCursor { claimable_time: T0, workflow_id: "wf-00100".into() };
    let (apply, _) = protocol::apply_statement(
        "wf-00001",
        &Guard::Running { token: "tok".into() },
        &Transition::mark_running(0, T0),
        &limits,
    )
    .unwrap();
    let inbox = |sql: &str, params: Vec<Param>| Statement { sql: sql.to_string(), params };
    let cases: Vec<(&str, Statement)> = vec![
        ("claim", protocol::claim_statement(Some("wf-00001"), &g, &tr, &limits).unwrap()),
        ("claim_any", protocol::claim_statement(None, &g, &tr, &limits).unwrap()),
        ("apply", apply),
        ("scan_due_waits", protocol::due_waits_statement(T0, None, 100)),
        ("scan_due_waits after", protocol::due_waits_statement(T0, Some(&cursor), 100)),
        ("scan_claimable", protocol::claimable_statement(None, 100)),
        ("scan_claimable after", protocol::claimable_statement(Some("wf-00100"), 100)),
        (
            "find_pending",
            inbox(
                "SELECT * FROM signal_inbox WHERE workflow_id = ?1 AND status = 'pending' AND signal_type = ?2 \
                 AND wait_key = ?3 AND generation = ?4 ORDER BY created_at, signal_id LIMIT 1",
                vec![
                    Param::Text("wf-00003".into()),
                    Param::Text("approved".into()),
                    Param::Text("k".into()),
                    Param::Int8(0),
                ],
            ),
        ),
        (
            "scan_pending",
            inbox(
                "SELECT * FROM signal_inbox WHERE status = 'pending' AND signal_id > ?2 ORDER BY signal_id LIMIT ?1",
                vec![Param::Int8(100), Param::Text("sig-00100".into())],
            ),
        ),
        (
            "scan_created_before",
            inbox(
                "SELECT * FROM signal_inbox WHERE created_at < ?2 ORDER BY signal_id LIMIT ?1",
                vec![Param::Int8(100), Param::Int8(T0.as_millis() + 50)],
            ),
        ),
        (
            "count_pending_orphans",
            inbox(
                "SELECT count(*) AS n FROM (SELECT 1 FROM signal_inbox WHERE orphan = 1 AND status = 'pending' \
                 AND workflow_id = ?2 LIMIT ?1)",
                vec![Param::Int8(10), Param::Text("wf-00007".into())],
            ),
        ),
    ];
    for (name, s) in &cases {
        let lines = plan(&c, s);
        println!("{name}: {lines:?}");
        assert_indexed(name, &lines);
    }
    // claim_any seeks its candidate per claimed type in the type-led index (no sort of every
    // due instance: the one sort is over one candidate per type).
    let lines = plan(&c, &cases[1].1);
    let per_type = lines
        .iter()
        .find(|l| l.contains("USING INDEX workflow_instances_claim_by_type (workflow_type=? AND claimable_time<?)"))
        .expect("a seek per type");
    let parent = per_type.split_once('<').unwrap().1.split_once(' ').unwrap().0;
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("TEMP B-TREE") && l.split_once('<').unwrap().1.starts_with(&format!("{parent} "))),
        "the per-type seek sorts: {lines:?}"
    );
}
