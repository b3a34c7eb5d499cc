//! Values PostgreSQL cannot store are refused as `InvalidInput` before anything is sent,
//! naming the field, and nothing is written — on top of kernel-core's K-2.0 rule, which
//! runs first (the conformance suites check that part).

use crate::support::TestSchema;
use kernel_core::domain::*;
use kernel_core::ports::*;
use kernel_core::transition::{Guard, Patch, Transition, TransitionKind};
use kernel_core::Error;
use serde_json::json;
use store_postgres::{Limits, PostgresConfig, PostgresWorkflowStore};
use testkit::conformance::inbox::record;
use testkit::conformance::store::{claimed, instance, LEASE_MS, T0, TYPE};
use testkit::time::TestTime;

fn field<T: std::fmt::Debug>(r: kernel_core::Result<T>) -> String {
    match r {
        Err(Error::InvalidInput { field, .. }) => field,
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

/// NUL inside a JSON string (which kernel-core and MongoDB accept, and PostgreSQL's jsonb
/// refuses) in an input, an output, a checkpoint, a step error and a fingerprint; a
/// revision or generation beyond the signed 64-bit range.
#[tokio::test]
async fn unstorable_values_are_refused_and_nothing_is_written() {
    let Some(db) = TestSchema::new().await else { return };
    let (store, inbox) = (db.store(), db.inbox());
    let seeded = claimed("wf-1", "a");
    store.create(seeded.clone()).await.unwrap();
    let nul = json!({"text": "a\u{0}b"});
    let ms = DurationMs::from_millis;
    let running = Guard::Running { token: "a".into() };

    let mut i = instance("wf-bad");
    i.input = nul.clone();
    assert_eq!(field(store.create(i).await), "input");
    let mut i = instance("wf-bad");
    i.output.insert("fetch".into(), nul.clone());
    assert_eq!(field(store.create(i).await), "output.fetch");
    let mut i = instance("wf-bad");
    i.steps[0].error = Some(StepError { class: ErrorClass::Permanent, message: "x\u{0}".into() });
    assert_eq!(field(store.create(i).await), "steps");
    let mut i = instance("wf-bad");
    i.revision = u64::MAX;
    assert_eq!(field(store.create(i).await), "revision");

    let t = Transition::complete_step(1, "compose", nul.clone(), ms(0), T0, false);
    assert_eq!(field(store.apply(&"wf-1".into(), &running, &t).await), "output.compose");
    let t = Transition::yield_step(1, Some(nul.clone()), ms(0), T0);
    assert_eq!(field(store.apply(&"wf-1".into(), &running, &t).await), "steps.1.checkpoint");
    let t = Transition::step_retry(1, StepError { class: ErrorClass::Transient, message: "\u{0}".into() }, ms(0), T0);
    assert_eq!(field(store.apply(&"wf-1".into(), &running, &t).await), "steps.1.error");
    let t = Transition::fingerprint_push_back("fp\u{0}", "fp-2", T0, ms(1)).unwrap();
    assert_eq!(
        field(store.apply(&"wf-1".into(), &Guard::Token { token: "a".into() }, &t).await),
        "fingerprint_mismatch"
    );
    let mut t = Transition::failing(T0);
    t.input = Some(nul);
    assert_eq!(field(store.apply(&"wf-1".into(), &running, &t).await), "input");
    let id =
        WaitIdentity { signal_type: "approved".into(), wait_key: "doc:42".into(), generation: u64::MAX, step_index: 1 };
    let t = Transition::signal_activation(1, "sig-1", T0);
    assert_eq!(field(store.apply(&"wf-1".into(), &Guard::SignalWait(id), &t).await), "generation");

    let wait = Wait::Signal {
        signal_type: "approved".into(),
        wait_key: "doc:42".into(),
        generation: u64::MAX,
        step_index: 1,
        poll_time: None,
    };
    let t = Transition::suspend(1, wait.clone(), None, ms(0), T0);
    assert_eq!(field(store.apply(&"wf-1".into(), &running, &t).await), "wait.generation");
    let mut i = instance("wf-bad");
    i.status = WorkflowStatus::Waiting;
    i.wait = Some(wait);
    assert_eq!(field(store.create(i).await), "wait.generation");

    let r = SignalRecord { generation: u64::MAX, ..record("sig-1", T0) };
    assert_eq!(field(inbox.insert(r).await), "generation");

    assert_eq!(store.get(&"wf-1".into()).await.unwrap(), Some(seeded), "nothing written to wf-1");
    assert_eq!(store.get(&"wf-bad".into()).await.unwrap(), None, "nothing created");
    assert_eq!(db.scalar("SELECT count(*) FROM {s}.workflow_instances").await, 1);
    assert_eq!(db.scalar("SELECT count(*) FROM {s}.signal_inbox").await, 0);
    db.drop_schema().await;
}

/// A statement whose values exceed `Limits::document_bytes_max` is refused before it is
/// sent; the same write within the limit applies.
#[tokio::test]
async fn oversize_statements_are_refused() {
    let Some(db) = TestSchema::new().await else { return };
    let config =
        PostgresConfig { limits: Limits { payload_bytes_max: 1024, document_bytes_max: 2048 }, ..db.config.clone() };
    let store = PostgresWorkflowStore::new(db.pool.clone(), config).unwrap();
    let seeded = claimed("wf-1", "a");
    store.create(seeded.clone()).await.unwrap();
    let running = Guard::Running { token: "a".into() };
    let mut t = Transition::new(TransitionKind::CompleteStep, T0);
    for n in 0..3 {
        t.outputs.push((format!("o{n}"), json!("x".repeat(900))));
    }
    assert_eq!(field(store.apply(&"wf-1".into(), &running, &t).await), "transition");
    assert_eq!(store.get(&"wf-1".into()).await.unwrap(), Some(seeded));
    t.outputs.truncate(1);
    t.claim_token = Some(Patch::Unset);
    assert!(store.apply(&"wf-1".into(), &running, &t).await.unwrap().applied());
    db.drop_schema().await;
}

/// An instance that would grow past 16 MiB of JSON (kernel-core's `DOCUMENT_BYTES_MAX`,
/// checked by the table on the row a write would leave) is refused as `InvalidInput` on
/// `document`, as the in-memory store refuses it; nothing is written, and smaller writes
/// before it applied.
#[tokio::test]
async fn a_document_growing_past_16_mib_is_refused() {
    let Some(db) = TestSchema::new().await else { return };
    let store = db.store();
    store.create(claimed("wf-1", "a")).await.unwrap();
    let running = Guard::Running { token: "a".into() };
    let chunk = "x".repeat(250 * 1024);
    let mut refused = None;
    for round in 0..12 {
        let mut t = Transition::new(TransitionKind::CompleteStep, T0);
        for n in 0..15 {
            t.outputs.push((format!("o{round}_{n}"), json!(chunk)));
        }
        let before = db.scalar("SELECT revision FROM {s}.workflow_instances").await;
        match store.apply(&"wf-1".into(), &running, &t).await {
            Ok(o) => assert!(o.applied(), "round {round}"),
            Err(e) => {
                assert_eq!(db.scalar("SELECT revision FROM {s}.workflow_instances").await, before, "nothing written");
                refused = Some((round, e));
                break;
            }
        }
    }
    let (round, e) = refused.expect("refused before 12 × 3.7 MiB");
    assert!(matches!(&e, Error::InvalidInput { field, .. } if field == "document"), "{e:?}");
    assert_eq!(round, 4, "16 MiB is passed by the fifth write of 3.7 MiB");
    let bytes = db.scalar("SELECT octet_length(output::text)::bigint FROM {s}.workflow_instances").await;
    assert!(bytes <= 16 * 1024 * 1024 && bytes > 12 * 1024 * 1024, "{bytes}");
    db.drop_schema().await;
}

/// An instance kernel-core's `validate::document` accepts (its compact JSON is under 16 MiB)
/// is stored, even though PostgreSQL's JSONB text of it — with a space after every `,` and
/// `:` — is far over 16 MiB: the table's measure never refuses what kernel-core accepts.
#[tokio::test]
async fn a_document_kernel_core_accepts_is_stored() {
    let Some(db) = TestSchema::new().await else { return };
    // Writes of ~4 MB of small JSON values take seconds on a loaded machine.
    let config = PostgresConfig { statement_timeout_ms: 120_000, call_timeout_ms: 180_000, ..db.config.clone() };
    let pool = store_postgres::connect(&store_postgres::database_url(), &config).unwrap();
    let store = PostgresWorkflowStore::new(pool.clone(), config).unwrap();
    store.create(claimed("wf-1", "a")).await.unwrap();
    let running = Guard::Running { token: "a".into() };
    // 8 bytes per item in compact JSON (`"xxxxx",`), 9 in JSONB text (`"xxxxx", `).
    let items = json!(vec!["xxxxx"; 32_000]);
    for round in 0..4 {
        let mut t = Transition::new(TransitionKind::CompleteStep, T0);
        for n in 0..15 {
            t.outputs.push((format!("o{round}_{n}"), items.clone()));
        }
        let o = store.apply(&"wf-1".into(), &running, &t).await.unwrap_or_else(|e| panic!("round {round}: {e:?}"));
        assert!(o.applied(), "round {round}");
    }
    let stored = store.get(&"wf-1".into()).await.unwrap().expect("stored");
    assert_eq!(stored.output.len(), 1 + 60, "every output stored");
    let compact = serde_json::to_vec(&stored).unwrap().len();
    assert!(compact > 14 * 1024 * 1024, "near the bound: {compact}");
    kernel_core::validate::document("document", &stored, kernel_core::validate::DOCUMENT_BYTES_MAX)
        .expect("kernel-core accepts the instance");
    let text = db.scalar("SELECT octet_length(output::text)::bigint FROM {s}.workflow_instances").await;
    assert!(text > 16 * 1024 * 1024, "JSONB text over 16 MiB: {text}");
    pool.close();
    db.drop_schema().await;
}

/// The size check runs only on writes that set a JSON column of an instance whose JSON
/// columns hold more than 8 KiB as stored (migration 5): a claim and a heartbeat of a large
/// instance do not call it, a step write does, and neither the insert nor a step write of a
/// small instance calls it. Counted by the server's function statistics
/// (`track_functions = all` on the adapter's connection).
#[tokio::test]
async fn claims_and_heartbeats_do_not_measure_the_document() {
    let Some(db) = TestSchema::new().await else { return };
    let base = store_postgres::database_url();
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options=-c%20track_functions%3Dall");
    let config = PostgresConfig { pool_size_max: 1, ..db.config.clone() };
    let pool = store_postgres::connect(&url, &config).unwrap();
    let store = PostgresWorkflowStore::new(pool.clone(), config).unwrap();
    let mut big = instance("wf-1");
    // Hex of a xorshift sequence: PostgreSQL's compression cannot shrink it below 8 KiB.
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    let blob: String = (0..200 * 1024 / 16)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            format!("{x:016x}")
        })
        .collect();
    big.input = json!({ "blob": blob });
    store.create(big).await.unwrap();
    let calls = || async {
        let c = pool.get().await.unwrap();
        // Flush this backend's pending statistics when it next goes idle, then read them.
        c.batch_execute("SELECT pg_stat_force_next_flush()").await.unwrap();
        c.batch_execute("SELECT pg_stat_clear_snapshot()").await.unwrap();
        let row = c
            .query_opt(
                "SELECT calls FROM pg_stat_user_functions WHERE schemaname = $1 AND funcname = 'workflow_instances_document_size'",
                &[&db.config.schema],
            )
            .await
            .unwrap();
        row.map_or(0, |r| r.get::<_, i64>(0))
    };
    let after_create = calls().await;
    assert_eq!(after_create, 1, "the insert is measured");
    let spec = ClaimSpec { now: T0, lease_ms: LEASE_MS, token: "a".to_string().into(), types: vec![TYPE.to_string()] };
    store.claim(&"wf-1".into(), &spec).await.unwrap().expect("claimed");
    let hb = Transition::heartbeat(T0.plus(LEASE_MS), LEASE_MS).unwrap();
    assert!(store.apply(&"wf-1".into(), &Guard::Token { token: "a".into() }, &hb).await.unwrap().applied());
    assert_eq!(calls().await, after_create, "neither the claim nor the heartbeat measured the document");
    let step = Transition::mark_running(0, T0.plus(LEASE_MS).plus(LEASE_MS));
    assert!(store.apply(&"wf-1".into(), &Guard::Running { token: "a".into() }, &step).await.unwrap().applied());
    assert_eq!(calls().await, after_create + 1, "a step write is measured");
    store.create(claimed("wf-2", "b")).await.unwrap();
    let step = Transition::mark_running(0, T0);
    assert!(store.apply(&"wf-2".into(), &Guard::Running { token: "b".into() }, &step).await.unwrap().applied());
    assert_eq!(calls().await, after_create + 1, "neither the insert nor a step write of a small instance measured it");
    pool.close();
    db.drop_schema().await;
}

/// An insert that conflicts with a record deleted before it is read back (retention,
/// concurrently) wrote nothing: it is tried again and inserts, instead of reporting an
/// uncertain outcome. The deletion is made deterministic by a statement trigger of the
/// test schema that deletes the record once, right after the conflicting insert.
#[tokio::test]
async fn an_insert_conflicting_with_a_deleted_record_is_retried() {
    let Some(db) = TestSchema::new().await else { return };
    let inbox = db.inbox();
    let r = record("sig-1", T0);
    assert_eq!(inbox.insert(r.clone()).await.unwrap(), InsertOutcome::Inserted);
    let s = format!("\"{}\"", db.schema());
    db.client()
        .await
        .batch_execute(&format!(
            "CREATE TABLE {s}.delete_once (n int);
             INSERT INTO {s}.delete_once VALUES (1);
             CREATE FUNCTION {s}.delete_once() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF EXISTS (SELECT 1 FROM {s}.delete_once) THEN
                     DELETE FROM {s}.delete_once;
                     DELETE FROM {s}.signal_inbox WHERE signal_id = 'sig-1';
                 END IF;
                 RETURN NULL;
             END $$;
             CREATE TRIGGER delete_once AFTER INSERT ON {s}.signal_inbox
                 FOR EACH STATEMENT EXECUTE FUNCTION {s}.delete_once();"
        ))
        .await
        .unwrap();
    let got = inbox.insert(r.clone()).await;
    assert_eq!(got.unwrap(), InsertOutcome::Inserted, "retried after the conflict's record vanished");
    assert_eq!(inbox.get("sig-1").await.unwrap(), Some(r));
    db.drop_schema().await;
}
