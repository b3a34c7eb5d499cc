//! The claim, the store-fallback claim, the due-wait scan and the rebuild scan use an
//! index: ~20 000 instances, `ANALYZE`, then `EXPLAIN` of each statement as the adapter
//! sends it shows no sequential scan of the instances table. The inbox, the outbox and the
//! observation projection likewise, on ~20 000 rows each: their plans are those
//! `auto_explain` reports for the statements the adapters really run.

use crate::support::TestSchema;
use futures::future::BoxFuture;
use futures::StreamExt;
use kernel_core::domain::{DurationMs, WorkflowStatus};
use kernel_core::ports::{
    Actor, ClaimSpec, DispatchOutbox, DueCursor, SignalInbox, SignalStatus, TaskCloseOutcome, TaskDecideOutcome,
    TaskDecision, TaskInbox, TaskOutcome, TaskStatus, WorkflowStore,
};
use kernel_core::transition::TransitionKind;
use kernel_core::{ObjectId, WorkflowId};
use observer::{AttemptOutcome, AttemptQuery, ObservationRepository, OpsView, SnapshotQuery};
use std::sync::{Arc, Mutex};
use store_postgres::protocol::{self, ClaimSpecParts, Limits, Statement};
use store_postgres::{OutboxTable, PostgresObservationRepository, PostgresOutbox, PostgresSignalInbox};
use testkit::conformance::store::{LEASE_MS, T0, TYPE};
use testkit::time::TestTime;
use tokio_postgres::AsyncMessage;

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
    // claim_any's candidate is chosen inside `claim_candidate` (migration 4): its own plan,
    // reported as a nested statement, walks the per-type index.
    let ex = Explained::new(&db.config).await;
    let store = store_postgres::PostgresWorkflowStore::new(ex.pool.clone(), db.config.clone()).unwrap();
    let plans = ex.plans_of(store.claim_any(&spec)).await;
    let got = plans.0.unwrap().expect("a due instance");
    assert_eq!(got.workflow_type, TYPE);
    let inner = plans.1.iter().find(|p| p.contains("FOR UPDATE OF i SKIP LOCKED")).expect("the candidate's plan");
    assert!(inner.contains("workflow_instances_claim_by_type"), "claim_candidate uses another index:\n{inner}");
    ex.check_plans("claim_any", &plans.1);
    ex.pool.close();
    db.drop_schema().await;
}

/// A pool whose one connection runs `auto_explain` for every statement (`log_min_duration
/// = 0`, sent to the client as a NOTICE), collecting the plans: the plans of the statements
/// the adapters really send, with their real parameters.
struct Explained {
    pool: store_postgres::Pool,
    notices: Arc<Mutex<Vec<String>>>,
}

struct ExplainConnect(Arc<Mutex<Vec<String>>>);

impl deadpool_postgres::Connect for ExplainConnect {
    fn connect(
        &self,
        pg: &tokio_postgres::Config,
    ) -> BoxFuture<'_, Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>> {
        let (pg, notices) = (pg.clone(), self.0.clone());
        Box::pin(async move {
            let (client, mut conn) = pg.connect(tokio_postgres::NoTls).await?;
            let task = tokio::spawn(async move {
                let mut messages = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
                while let Some(Ok(m)) = messages.next().await {
                    if let AsyncMessage::Notice(n) = m {
                        notices.lock().unwrap().push(n.message().to_string());
                    }
                }
            });
            Ok((client, task))
        })
    }
}

impl Explained {
    async fn new(config: &store_postgres::PostgresConfig) -> Explained {
        let url = crate::support::server_url().await.expect("the server answered before");
        let mut pg: tokio_postgres::Config = url.parse().expect("url");
        let options = format!(
            "{} -c statement_timeout={} -c session_preload_libraries=auto_explain \
             -c auto_explain.log_min_duration=0 -c auto_explain.log_level=notice \
             -c auto_explain.log_nested_statements=on",
            pg.get_options().unwrap_or_default(),
            config.statement_timeout_ms
        );
        pg.options(&options);
        let notices = Arc::new(Mutex::new(Vec::new()));
        let manager = deadpool_postgres::Manager::from_connect(
            pg,
            ExplainConnect(notices.clone()),
            deadpool_postgres::ManagerConfig { recycling_method: deadpool_postgres::RecyclingMethod::Fast },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(1)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .expect("pool");
        Explained { pool, notices }
    }

    /// Run `call`, then check every plan it produced: at least one, each using an index and
    /// none scanning a table sequentially.
    async fn check<T, F: std::future::Future<Output = T>>(&self, name: &str, call: F) -> T {
        let (out, plans) = self.plans_of(call).await;
        self.check_plans(name, &plans);
        out
    }

    /// Run `call`; its result and the plans reported meanwhile.
    async fn plans_of<T, F: std::future::Future<Output = T>>(&self, call: F) -> (T, Vec<String>) {
        self.notices.lock().unwrap().clear();
        let out = call.await;
        let notices: Vec<String> = std::mem::take(&mut *self.notices.lock().unwrap());
        (out, notices.into_iter().filter(|n| n.contains("plan:")).collect())
    }

    fn check_plans(&self, name: &str, plans: &[String]) {
        assert!(!plans.is_empty(), "{name}: no plan was reported (is auto_explain loaded?)");
        for plan in plans {
            assert!(!plan.contains("Seq Scan"), "{name} scans a table sequentially:\n{plan}");
            assert!(plan.contains("Index"), "{name} uses no index:\n{plan}");
            let index = plan.lines().find(|l| l.contains("Index")).unwrap_or_default().trim().to_string();
            println!("explain: store=postgres rows={ROWS} query={name:?} plan={index:?}");
        }
    }
}

/// The inbox's queries and writes, on ~20 000 signals after `ANALYZE`, as the adapter sends
/// them: no sequential scan.
#[tokio::test]
async fn inbox_queries_use_an_index() {
    let Some(db) = TestSchema::new().await else { return };
    let s = format!("\"{}\"", db.schema());
    // 2 000 workflows with 10 signals each: most matched, one in ten pending, a few orphans.
    let fill = format!(
        "INSERT INTO {s}.signal_inbox (signal_id, workflow_id, signal_type, wait_key, generation, status, \
           created_at, match_time, orphan) \
         SELECT 'sig-' || lpad(i::text, 6, '0'), 'wf-' || lpad((i % 2000)::text, 6, '0'), 'approve', 'k' || (i % 7), \
           i % 3, CASE WHEN i % 10 = 0 THEN 'pending' ELSE 'matched' END, {t0} + i * 1000, \
           CASE WHEN i % 10 <> 0 THEN {t0} + i * 1000 END, i % 500 = 0 \
         FROM generate_series(1, {ROWS}) AS i; ANALYZE {s}.signal_inbox",
        t0 = T0.as_millis()
    );
    db.client().await.batch_execute(&fill).await.expect("fill");
    let ex = Explained::new(&db.config).await;
    let inbox = PostgresSignalInbox::new(ex.pool.clone(), db.config.clone()).unwrap();
    let wf: WorkflowId = "wf-000010".into();
    let mid = T0.checked_add(DurationMs::from_secs(10_000)).unwrap();
    let got = ex.check("inbox get", inbox.get("sig-000010")).await.unwrap();
    assert!(got.is_some());
    ex.check("inbox find_pending", inbox.find_pending(&wf, "approve", "k3", 1)).await.unwrap();
    ex.check("inbox mark_matched", inbox.mark_matched("sig-000020", mid)).await.unwrap();
    let page = ex.check("inbox scan_pending", inbox.scan_pending(None, 100)).await.unwrap();
    assert_eq!(page.records.len(), 100);
    ex.check("inbox scan_pending after", inbox.scan_pending(Some("sig-010000"), 100)).await.unwrap();
    ex.check("inbox scan_created_before", inbox.scan_created_before(mid, None, 100)).await.unwrap();
    ex.check("inbox scan_created_before after", inbox.scan_created_before(mid, Some("sig-005000"), 100)).await.unwrap();
    let mine = ex.check("inbox scan_workflow", inbox.scan_workflow(&wf, SignalStatus::Pending, 100)).await.unwrap();
    assert!(!mine.is_empty());
    ex.check("inbox delete_if", inbox.delete_if(&["sig-000011".into(), "sig-000012".into()], SignalStatus::Matched))
        .await
        .unwrap();
    ex.check("inbox count_pending_orphans", inbox.count_pending_orphans(None, 100)).await.unwrap();
    ex.check("inbox count_pending_orphans of one", inbox.count_pending_orphans(Some(&wf), 100)).await.unwrap();
    ex.check("inbox clear_orphans", inbox.clear_orphans(&"wf-000500".into())).await.unwrap();
    ex.pool.close();
    db.drop_schema().await;
}

/// The outbox's scan and conditional writes, on a business table of ~20 000 objects (most
/// dispatched) after `ANALYZE`: no sequential scan.
#[tokio::test]
async fn outbox_queries_use_an_index() {
    let Some(db) = TestSchema::new().await else { return };
    let table = OutboxTable { schema: db.schema().to_string(), ..OutboxTable::default() };
    let setup = PostgresOutbox::new(db.pool.clone(), db.config.clone(), table.clone()).unwrap();
    setup.ensure_table().await.unwrap();
    // One object in twenty pending (due or not), one in forty processing, the rest dispatched.
    let t = format!("\"{}\".\"{}\"", table.schema, table.table);
    let fill = format!(
        "INSERT INTO {t} (object_id, business_status, fields, workflow_dispatch) \
         SELECT 'obj-' || lpad(i::text, 6, '0'), 'submitted', '{{}}'::jsonb, jsonb_build_object( \
           'workflow_type', 'order', 'biz_key', 'order:' || i, 'priority', 2, 'fencing_token', 'f-' || i, \
           'status', CASE WHEN i % 20 = 0 THEN 'pending' WHEN i % 40 = 1 THEN 'processing' ELSE 'dispatched' END, \
           'next_attempt_time', {t0} + (i % 3 - 1) * 60000, 'lease_token', 'l-' || i, 'lease_until', {t0} - 1000) \
         FROM generate_series(1, {ROWS}) AS i; ANALYZE {t}",
        t0 = T0.as_millis()
    );
    db.client().await.batch_execute(&fill).await.expect("fill");
    let ex = Explained::new(&db.config).await;
    let outbox = PostgresOutbox::new(ex.pool.clone(), db.config.clone(), table).unwrap();
    let later = T0.checked_add(DurationMs::from_secs(60)).unwrap();
    let due = ex.check("outbox scan_due", outbox.scan_due(T0, None, 100)).await.unwrap();
    assert!(!due.is_empty());
    ex.check("outbox scan_due after", outbox.scan_due(T0, Some(&"obj-010000".into()), 100)).await.unwrap();
    let obj: ObjectId = "obj-000020".into();
    ex.check("outbox get", outbox.get(&obj)).await.unwrap();
    ex.check("outbox defer_pending", outbox.defer_pending(&obj, &"f-20".into(), later)).await.unwrap();
    let leased =
        ex.check("outbox try_lease", outbox.try_lease(&"obj-000041".into(), T0, &"l-new".into(), later)).await.unwrap();
    assert!(leased.is_some(), "an expired lease is taken");
    ex.check("outbox renew_lease", outbox.renew_lease(&"obj-000041".into(), &"f-41".into(), &"l-new".into(), later))
        .await
        .unwrap();
    ex.check("outbox confirm_leased", outbox.confirm_leased(&"obj-000041".into(), &"f-41".into(), &"l-new".into()))
        .await
        .unwrap();
    ex.check("outbox revert_leased", outbox.revert_leased(&"obj-000081".into(), &"f-81".into(), &"l-81".into(), later))
        .await
        .unwrap();
    ex.check("outbox confirm_dispatched", outbox.confirm_dispatched(&"obj-000040".into(), &"f-40".into()))
        .await
        .unwrap();
    ex.check(
        "outbox fenced_update",
        outbox.fenced_update(&"obj-000060".into(), &"f-60".into(), serde_json::json!({"note": "x"}), None),
    )
    .await
    .unwrap();
    ex.pool.close();
    db.drop_schema().await;
}

/// The observation projection's upserts and the ops view's queries, on ~20 000 attempt rows
/// and snapshots after `ANALYZE`: no sequential scan.
#[tokio::test]
async fn observation_queries_use_an_index() {
    let Some(db) = TestSchema::new().await else { return };
    let s = format!("\"{}\"", db.schema());
    let outcomes = "ARRAY['completed','completed','completed','running','retrying','failed','deferred','suspended']";
    let statuses = "ARRAY['completed','completed','completed','completed','running','waiting','failed','canceled']";
    // 20 types, 8 steps; one snapshot and one attempt row per workflow. The documents are
    // those of one real observation, with the queried fields varied per row.
    let o = observer::conformance::obs("x", 3, TransitionKind::MarkRunning, Some("step0"), 1);
    let snapshot = serde_json::to_value(observer::Snapshot::from_observation(&o)).unwrap();
    let attempt = serde_json::to_value(observer::AttemptRow::from_observation(&o).unwrap()).unwrap();
    let fill = format!(
        "INSERT INTO {s}.observation_snapshots (biz_key, workflow_type, status, step_name, revision, updated_at, doc) \
         SELECT 'biz-' || i, 'type' || (i % 20), ({statuses})[1 + i % 8], 'step' || (i % 8), 3, {t0} + i * 1000, \
           $1::jsonb || jsonb_build_object('biz_key', 'biz-' || i, 'workflow_type', 'type' || (i % 20), \
             'status', ({statuses})[1 + i % 8], 'step_name', 'step' || (i % 8), 'updated_at', {t0} + i * 1000) \
         FROM generate_series(1, {ROWS}) AS i",
        t0 = T0.as_millis()
    );
    db.client().await.execute(fill.as_str(), &[&snapshot]).await.expect("fill snapshots");
    let fill = format!(
        "INSERT INTO {s}.observation_attempts (biz_key, workflow_run, step_name, attempt, workflow_type, outcome, \
           revision, updated_at, doc) \
         SELECT 'biz-' || i, 0, 'step' || (i % 8), 1, 'type' || (i % 20), ({outcomes})[1 + i % 8], 3, \
           {t0} + i * 1000, $1::jsonb || jsonb_build_object('biz_key', 'biz-' || i, 'step_name', 'step' || (i % 8), \
             'workflow_type', 'type' || (i % 20), 'outcome', ({outcomes})[1 + i % 8], 'updated_at', {t0} + i * 1000) \
         FROM generate_series(1, {ROWS}) AS i",
        t0 = T0.as_millis()
    );
    db.client().await.execute(fill.as_str(), &[&attempt]).await.expect("fill attempts");
    let fill = format!("ANALYZE {s}.observation_snapshots; ANALYZE {s}.observation_attempts");
    db.client().await.batch_execute(&fill).await.expect("fill");
    let ex = Explained::new(&db.config).await;
    let repo = PostgresObservationRepository::new(ex.pool.clone(), db.config.clone()).unwrap();
    let view = OpsView::new(
        Arc::new(repo.clone()),
        Arc::new(testkit::memory::InMemoryQueue::default()),
        Arc::new(testkit::memory::ManualClock::default()),
    );
    let batch = [
        observer::conformance::obs("biz-17", 9, TransitionKind::MarkRunning, Some("step1"), 2),
        observer::conformance::obs("biz-new", 1, TransitionKind::Create, None, 0),
    ];
    ex.check("observation write_batch", repo.write_batch(&batch)).await.unwrap();
    let snap = ex.check("observation snapshot", repo.snapshot("biz-17")).await.unwrap().expect("snapshot");
    ex.check("observation put_snapshot", repo.put_snapshot(&snap)).await.unwrap();
    let from = T0.checked_add(DurationMs::from_secs(5_000)).unwrap();
    let to = T0.checked_add(DurationMs::from_secs(5_500)).unwrap();
    let typed = ex.check("ops by_type", view.by_type("type3", None)).await.unwrap();
    assert_eq!(typed.len(), ROWS as usize / 20);
    ex.check("ops by_type and status", view.by_type("type3", Some(WorkflowStatus::Running))).await.unwrap();
    ex.check("ops by_step", view.by_step("step5")).await.unwrap();
    ex.check("ops by_status", view.by_status(WorkflowStatus::Waiting)).await.unwrap();
    let window = ex.check("ops in_window", view.in_window(from, to)).await.unwrap();
    assert_eq!(window.len(), 500);
    ex.check("ops snapshots, newest", view.snapshots(&SnapshotQuery { limit: 50, ..Default::default() }))
        .await
        .unwrap();
    ex.check("ops attempts_of_step", view.attempts_of_step("step2", Some(AttemptOutcome::Retrying))).await.unwrap();
    ex.check("ops attempts of step", view.attempts_of_step("step2", None)).await.unwrap();
    let q = AttemptQuery { biz_key: Some("biz-17".into()), ..Default::default() };
    let rows = ex.check("ops attempts of biz_key", view.attempts(&q)).await.unwrap();
    assert_eq!(rows.len(), 2);
    let q = AttemptQuery { workflow_type: Some("type4".into()), ..Default::default() };
    ex.check("ops attempts of type", view.attempts(&q)).await.unwrap();
    let q = AttemptQuery { updated_from: Some(from), updated_to: Some(to), ..Default::default() };
    ex.check("ops attempts in window", view.attempts(&q)).await.unwrap();
    // Retention: one page of finished snapshots, with their attempt rows.
    ex.check("observation purge_finished", repo.purge_finished(from, 100)).await.unwrap();
    ex.pool.close();
    db.drop_schema().await;
}

/// The task inbox's list, reads, conditional writes and purges, on ~20 000 tasks (one in
/// ten open, one in ten decided with a sensitive reason, the rest closed) after `ANALYZE`:
/// no sequential scan.
#[tokio::test]
async fn task_inbox_queries_use_an_index() {
    let Some(db) = TestSchema::new().await else { return };
    let s = format!("\"{}\"", db.schema());
    let fill = format!(
        "INSERT INTO {s}.task_inbox (id, workflow_id, workflow_type, step, level, title, assignee, roles, evidence, \
           token, created_at, due_at, status, decision, closed_at) \
         SELECT 'task-' || lpad(i::text, 6, '0'), 'wf-' || lpad(i::text, 6, '0'), 'invoice', 'approve', 0, \
           'Approve ' || i, CASE WHEN i % 3 = 0 THEN 'u' || (i % 100) END, ARRAY['r' || (i % 50)], '[]'::jsonb, \
           'tok-' || lpad(i::text, 12, '0'), {t0}, {t0} + 3600000, \
           CASE i % 10 WHEN 0 THEN 'open' WHEN 1 THEN 'decided' ELSE 'closed' END, \
           CASE WHEN i % 10 <> 0 THEN jsonb_build_object('outcome', 'approve', 'actor', 'u1', 'reason', \
             jsonb_build_object('sensitive', true, 'text', 'why ' || i), 'decided_at', {t0} + i) END, \
           CASE WHEN i % 10 > 1 THEN {t0} + i END \
         FROM generate_series(1, {ROWS}) AS i; ANALYZE {s}.task_inbox",
        t0 = T0.as_millis()
    );
    db.client().await.batch_execute(&fill).await.expect("fill");
    let ex = Explained::new(&db.config).await;
    let inbox = store_postgres::PostgresTaskInbox::new(ex.pool.clone(), db.config.clone()).unwrap();
    let actor = Actor::new("u30", ["r20"]);
    let page = ex.check("task list_open", inbox.list_open(&actor, None, 100)).await.unwrap();
    assert!(!page.is_empty() && page.iter().all(|t| t.status == TaskStatus::Open && t.eligible(&actor)));
    ex.check("task list_open after", inbox.list_open(&actor, Some("task-010000"), 100)).await.unwrap();
    assert!(ex.check("task get", inbox.get("task-000010")).await.unwrap().is_some());
    let d = TaskDecision { outcome: TaskOutcome::Reject, actor: "u30".into(), reason: None, decided_at: T0 };
    let r = ex.check("task decide", inbox.decide("task-000020", "tok-000000000020", &actor, &d)).await.unwrap();
    assert_eq!(r, TaskDecideOutcome::Decided);
    let r = ex.check("task close", inbox.close("task-000021", T0.plus(50_000))).await.unwrap();
    assert!(matches!(r, TaskCloseOutcome::Closed(Some(_))), "{r:?}");
    let mid = T0.plus(ROWS / 2);
    assert_eq!(ex.check("task purge_sensitive_reasons", inbox.purge_sensitive_reasons(mid, 100)).await.unwrap(), 100);
    assert_eq!(ex.check("task purge_closed", inbox.purge_closed(mid, 100)).await.unwrap(), 100);
    ex.pool.close();
    db.drop_schema().await;
}
