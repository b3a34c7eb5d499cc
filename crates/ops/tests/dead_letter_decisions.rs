//! Dead-letter decisions through the operator surface (K-17.2 and its amendment): the audit
//! entry of a decision carries the supplied output's SHA-256 and size, and a decision on a
//! dead letter whose attempt was superseded is refused (and audited as refused).

use kernel_core::ports::{DeadLetterAction, DeadLetterStatus, DeadLetters};
use kernel_core::*;
use observer::InMemoryObservationRepository;
use ops::{Actor, AuditResult, Ops, OpsError, OpsParts};
use serde_json::{json, Value};
use sha2::Digest;
use std::sync::Arc;
use testkit::harness::World;

/// `fetch` completes; `post` always fails and is dead-lettered.
fn ledger() -> Definition {
    Definition::builder("ledger")
        .step(StepDef::new("fetch", |_: ActivityContext| async { Ok(StepOutcome::complete(json!({"rows": 3}))) }))
        .step(
            StepDef::new("post", |_: ActivityContext| async { Err(ActivityError::transient("ledger down")) })
                .on_failed(OnFailed::DeadLetter),
        )
        .build()
        .unwrap()
}

fn ops_on(world: &World) -> Ops {
    Ops::from_parts(OpsParts {
        ports: world.ports(),
        repo: Arc::new(InMemoryObservationRepository::new()),
        definitions: vec![ledger()],
        dispatch: None,
        schema: "memory".into(),
    })
    .unwrap()
}

/// An independent SHA-256 of the canonical JSON (keys sorted, no whitespace) and its size.
fn digest(v: &Value) -> Value {
    let canonical = kernel_core::model_call::canonical_json(v);
    let hash: String = sha2::Sha256::digest(canonical.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    json!({"sha256": hash, "bytes": canonical.len()})
}

/// K-17.2 amendment: the audit entry of `dlq-complete` records who supplied which output —
/// its SHA-256 and size —, not only the reason.
#[tokio::test]
async fn the_audit_of_a_dead_letter_completion_carries_the_outputs_hash_and_size() {
    let world = World::new(1);
    let worker = world.engine("w", vec![ledger()]);
    let req = StartRequest::new("ledger", "l-1", json!({})).workflow_id("wf-l-1");
    worker.publisher().start_or_resume(req).await.unwrap();
    world.drive(&worker).await.unwrap();
    let id = kernel_core::activity::idempotency_key_at("wf-l-1", "post", 0, 0);
    let ops = ops_on(&world);
    let output = json!({"posting_id": "P-9", "memo": "x".repeat(5_000), "a": [1, 2]});
    let done = ops
        .decide_dead_letter(
            &Actor::operator("ops-alice"),
            &id,
            DeadLetterAction::Complete { output: output.clone() },
            Some("by hand"),
        )
        .await
        .unwrap();
    assert_eq!(done.detail["outcome"], "decided");
    let audit = ops.audit(Some("ops-alice"), Some("dlq-complete"), 10).await.unwrap();
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert_eq!(audit[0].result, AuditResult::Ok);
    assert_eq!(audit[0].detail["request"]["output"], digest(&output), "{}", audit[0].detail);
    assert_eq!(audit[0].detail["request"]["reason"], "by hand");
    world.drive(&worker).await.unwrap();
    assert_eq!(world.instance("wf-l-1").await.unwrap().output["post"], output);
    ops.close().await;
}

/// K-17.2 amendment: `dlq retry` on the epoch-0 dead letter of a workflow a regenerate moved
/// on is refused (before, it reported `decided` and nothing ever applied it); the refusal
/// is audited, and the record stays undecided.
#[tokio::test]
async fn a_decision_on_a_dead_letter_superseded_by_a_regenerate_is_refused() {
    let world = World::new(2);
    let worker = world.engine("w", vec![ledger()]);
    let req = StartRequest::new("ledger", "l-2", json!({})).workflow_id("wf-l-2");
    worker.publisher().start_or_resume(req).await.unwrap();
    world.drive(&worker).await.unwrap();
    let old = kernel_core::activity::idempotency_key_at("wf-l-2", "post", 0, 0);
    let ops = ops_on(&world);
    let alice = Actor::operator("ops-alice");
    ops.regenerate(&alice, "wf-l-2", "fetch").await.unwrap();
    world.drive(&worker).await.unwrap();
    assert_eq!(world.instance("wf-l-2").await.unwrap().steps[1].epoch, 1);

    let stale = ops.decide_dead_letter(&alice, &old, DeadLetterAction::Retry, None).await;
    assert!(matches!(&stale, Err(OpsError::Refused(m)) if m.contains("stale")), "{stale:?}");
    let audit = ops.audit(Some("ops-alice"), Some("dlq-retry"), 10).await.unwrap();
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert_eq!(audit[0].result, AuditResult::Refused);
    let record = world.dead_letters.get(&old).await.unwrap().unwrap();
    assert_eq!((record.status, record.decision), (DeadLetterStatus::Open, None));
    ops.close().await;
}
