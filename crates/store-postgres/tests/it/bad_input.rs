//! Values PostgreSQL cannot store are refused as `InvalidInput` before anything is sent,
//! naming the field, and nothing is written — on top of kernel-core's K-2.0 rule, which
//! runs first (the conformance suites check that part).

use crate::support::TestSchema;
use kernel_core::model::*;
use kernel_core::ports::*;
use kernel_core::transition::{Guard, Patch, Transition, TransitionKind};
use kernel_core::Error;
use serde_json::json;
use store_postgres::{Limits, PostgresConfig, PostgresWorkflowStore};
use testkit::conformance::inbox::record;
use testkit::conformance::store::{claimed, instance, T0};

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
