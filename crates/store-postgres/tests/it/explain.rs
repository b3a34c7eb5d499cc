//! The claim, the store-fallback claim, the due-wait scan and the rebuild scan use an
//! index: ~20 000 instances, `ANALYZE`, then `EXPLAIN` of each statement as the adapter
//! sends it shows no sequential scan of the instances table.

use crate::support::TestSchema;
use kernel_core::ports::{ClaimSpec, DueCursor};
use store_postgres::protocol::{self, ClaimSpecParts, Limits, Statement};
use testkit::conformance::store::{LEASE_MS, T0, TYPE};
use testkit::time::TestTime;

const ROWS: i64 = 20_000;

#[tokio::test]
async fn store_queries_use_an_index() {
    let Some(db) = TestSchema::new().await else { return };
    let client = db.client().await;
    let s = format!("\"{}\"", db.schema());
    // A realistic mix: most instances finished, the rest running, waiting or failing,
    // due times spread over a day around T0.
    let fill = format!(
        "INSERT INTO {s}.workflow_instances (workflow_id, biz_key, workflow_type, status, claimable_time, \
           business_priority, revision, retry_count, prepare_failures, definition_fingerprint, created_at, \
           updated_at, steps, input, output, wait) \
         SELECT 'wf-' || lpad(i::text, 6, '0'), 'biz:' || i, '{TYPE}', \
           (ARRAY['completed','completed','completed','completed','canceled','failed','running','running','waiting','failing'])[1 + i % 10], \
           CASE WHEN i % 10 IN (0, 4, 5) AND i % 7 <> 0 THEN NULL ELSE {t0} + (i % 2000 - 1000) * 43200 END, \
           i % 4, 1, 0, 0, 'fp', {t0}, {t0}, '[]'::jsonb, '{{}}'::jsonb, '{{}}'::jsonb, \
           CASE WHEN i % 10 = 8 THEN jsonb_build_object('kind', 'timer', 'generation', 0, 'step_index', 0) END \
         FROM generate_series(1, {ROWS}) AS i",
        t0 = T0.as_millis()
    );
    client.batch_execute(&fill).await.expect("fill");
    client.batch_execute(&format!("ANALYZE {s}.workflow_instances")).await.expect("analyze");

    let limits = Limits::default();
    let spec = ClaimSpec { now: T0, lease_ms: LEASE_MS, token: "tok".into(), types: vec![TYPE.into()] };
    let (guard, transition) = (spec.guard(), spec.transition().unwrap());
    let parts = ClaimSpecParts { guard: &guard, transition: &transition };
    let cursor = DueCursor { claimable_time: T0.minus(3_600_000), workflow_id: "wf-010008".into() };
    let statements: Vec<(&str, Statement)> = vec![
        ("claim", protocol::claim_statement(db.schema(), Some("wf-000007"), &parts, &limits).unwrap()),
        ("claim_any", protocol::claim_statement(db.schema(), None, &parts, &limits).unwrap()),
        ("scan_due_waits", protocol::due_waits_statement(db.schema(), T0, None, 100)),
        ("scan_due_waits after", protocol::due_waits_statement(db.schema(), T0, Some(&cursor), 100)),
        ("scan_claimable", protocol::claimable_statement(db.schema(), None, 100)),
        ("scan_claimable after", protocol::claimable_statement(db.schema(), Some("wf-010000"), 100)),
    ];
    for (name, stmt) in statements {
        let rows = client.query(format!("EXPLAIN {}", stmt.sql).as_str(), &stmt.values()).await.expect("explain");
        let plan: Vec<String> = rows.iter().map(|r| r.get::<_, String>(0)).collect();
        let plan = plan.join("\n");
        assert!(!plan.contains("Seq Scan"), "{name} scans the table sequentially:\n{plan}");
        assert!(plan.contains("Index"), "{name} uses no index:\n{plan}");
        let index = plan.lines().find(|l| l.contains("Index")).unwrap_or_default().trim().to_string();
        println!("explain: store=postgres rows={ROWS} query={name:?} plan={index:?}");
    }
    drop(client);
    db.drop_schema().await;
}
