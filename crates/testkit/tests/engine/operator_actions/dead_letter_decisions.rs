//! Operators' decisions on dead letters (K-17.2 and its amendment): an output that carries
//! authority comes only from the authority — no operator completes a human-task step —,
//! every operator-supplied output is recorded, and a decision on a dead letter whose
//! attempt was superseded is refused. Simulated time on the world's manual clock.

use kernel_core::engine::{RoundOutcome, DEAD_LETTER_SIGNAL};
use kernel_core::ports::*;
use kernel_core::record::RecordEntry;
use kernel_core::*;
use kernel_tasks::{HumanTask, Level, Notice, Notifier};
use serde_json::{json, Value};
use sha2::Digest;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use testkit::harness::World;
use testkit::memory::SeqIds;

/// The mail relay of a human task: down until `up` is set (a transient error that, with no
/// retries left, dead-letters the step).
#[derive(Default)]
struct Relay {
    up: AtomicBool,
}

#[async_trait::async_trait]
impl Notifier for Relay {
    async fn notify(&self, _task: &TaskRecord, _notice: Notice) -> std::result::Result<(), ActivityError> {
        if self.up.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(ActivityError::transient("mail relay down"))
        }
    }
}

/// `approve` (a human task for `finance`, dead-lettered when its notice fails) then `pay`,
/// which counts the payments it makes.
struct Approval {
    world: World,
    relay: Arc<Relay>,
    payments: Arc<AtomicU32>,
    def: Definition,
}

impl Approval {
    fn new(seed: u64) -> Approval {
        let world = World::new(seed);
        let relay = Arc::new(Relay::default());
        let task = HumanTask::builder("Release payment of 12 400 EUR")
            .level(Level::roles(["finance"]).sla(DurationMs::from_millis(3_600_000)))
            .notifier(relay.clone())
            .ids(Arc::new(SeqIds::new("h", seed)))
            .build(Arc::new(world.task_inbox.clone()))
            .expect("valid human task");
        let payments = Arc::new(AtomicU32::new(0));
        let paid = payments.clone();
        let def = Definition::builder("payout")
            .step(StepDef::new("approve", task).on_failed(OnFailed::DeadLetter))
            .step(
                StepDef::new("pay", move |_: ActivityContext| {
                    let paid = paid.clone();
                    async move {
                        paid.fetch_add(1, Ordering::SeqCst);
                        Ok(StepOutcome::complete(json!({"paid": 12_400})))
                    }
                })
                .depends_on(["approve"]),
            )
            .build()
            .unwrap();
        Approval { world, relay, payments, def }
    }

    /// Started and settled: `approve` is dead-lettered; the open dead letter's id.
    async fn dead_lettered(&self, engine: &Engine) -> (WorkflowId, String) {
        let req = StartRequest::new("payout", "po-1", json!({"amount": 12_400})).workflow_id("wf-po-1");
        let wf = engine.publisher().start_or_resume(req).await.unwrap().instance.workflow_id;
        settle(engine).await;
        let open = self.world.dead_letters.list(Some(DeadLetterStatus::Open), None, 10).await.unwrap();
        assert_eq!(open.len(), 1, "{open:?}");
        assert_eq!(open[0].step, "approve");
        (wf, open[0].id.clone())
    }
}

/// Maintenance, then rounds until idle, without moving the clock.
async fn settle(engine: &Engine) {
    engine.maintain().await.unwrap();
    while let RoundOutcome::Ran { .. } = engine.tick().await.unwrap() {}
}

/// Whether the workflow waits on the operator signal of its dead letter.
fn on_dead_letter(inst: &WorkflowInstance) -> bool {
    inst.wait.as_ref().and_then(|w| w.signal_identity()).is_some_and(|w| w.signal_type == DEAD_LETTER_SIGNAL)
}

/// What an approval looks like, supplied by someone who is not a person the task allows.
fn forged_approval() -> Value {
    json!({"outcome": "approve", "actor": "ops:mallory", "task": "forged", "level": 0})
}

/// The operator entries of a step's current record and history, as stored (JSON).
fn operator_entries(step: &Step) -> Vec<Value> {
    let records = step.record.iter().chain(step.history.iter().filter_map(|h| h.record.as_ref()));
    records
        .flat_map(|r| r.entries.iter())
        .filter(|e| matches!(e, RecordEntry::Operator(_)))
        .map(|e| serde_json::to_value(e).unwrap())
        .collect()
}

/// An independent SHA-256 of the canonical JSON (keys sorted, no whitespace) and its size.
fn digest(v: &Value) -> (String, u64) {
    let canonical = kernel_core::model_call::canonical_json(v);
    let hash = sha2::Sha256::digest(canonical.as_bytes());
    (hash.iter().map(|b| format!("{b:02x}")).collect(), canonical.len() as u64)
}

/// K-17.2 amendment, K-17.5: an operator's `Complete` on a dead-lettered human-task step is
/// refused (nothing written, the payment never runs); the operator retries instead, which
/// re-opens the task, and only an eligible person's approval lets the payment run.
#[tokio::test]
async fn an_operator_cannot_complete_a_human_task_step_and_the_payment_waits_for_a_person() {
    let a = Approval::new(1);
    let engine = a.world.engine("w", vec![a.def.clone()]);
    let (wf, id) = a.dead_lettered(&engine).await;
    let before = a.world.instance(wf.as_str()).await.unwrap();
    assert!(on_dead_letter(&before), "{:?}", before.wait);

    let forged = engine
        .decide_dead_letter(&id, DeadLetterAction::Complete { output: forged_approval() }, "ops:mallory", None)
        .await;
    assert!(matches!(&forged, Err(Error::Conflict(m)) if m.contains("retry")), "{forged:?}");
    assert_eq!(a.world.dead_letters.get(&id).await.unwrap().unwrap().status, DeadLetterStatus::Open, "not decided");
    a.world.clock.advance(engine.config().dead_letter_poll_ms);
    settle(&engine).await;
    let inst = a.world.instance(wf.as_str()).await.unwrap();
    assert_eq!(a.payments.load(Ordering::SeqCst), 0, "no payment without a person's approval");
    assert!(!inst.output.contains_key("approve") && on_dead_letter(&inst), "{:?}", inst.steps);

    // Retry re-opens the task; an eligible person approves; then, only then, the payment.
    a.relay.up.store(true, Ordering::SeqCst);
    let retried = engine.decide_dead_letter(&id, DeadLetterAction::Retry, "ops:mallory", None).await.unwrap();
    assert_eq!(retried, DecideOutcome::Decided);
    settle(&engine).await;
    assert_eq!(a.payments.load(Ordering::SeqCst), 0, "the re-opened task waits for a person");
    // The desk closes the task of the superseded attempt (epoch 0) when it lists it.
    let desk = kernel_tasks::TaskDesk::new(
        Arc::new(a.world.task_inbox.clone()),
        engine.signal_sender(),
        a.world.clock.clone(),
    )
    .with_store(a.world.ports().store);
    let alice = Actor::new("alice", ["finance"]);
    let (tasks, _) = desk.open_tasks(&alice, None, 10).await.unwrap();
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    let task = desk.task(&tasks[0].id, &alice).await.unwrap().unwrap();
    let decided = desk.decide(&task.id, &task.token, &alice, TaskOutcome::Approve, None).await.unwrap();
    assert_eq!(decided, TaskDecideOutcome::Decided);
    settle(&engine).await;
    let done = a.world.instance(wf.as_str()).await.unwrap();
    assert_eq!((done.status, a.payments.load(Ordering::SeqCst)), (WorkflowStatus::Completed, 1));
    let result = kernel_tasks::HumanResult::from_output(&done.output["approve"]).unwrap();
    assert!(result.approved(), "{result:?}");
    assert!(
        matches!(&result.concluded, kernel_tasks::Concluded::Person { actor, .. } if actor == "alice"),
        "{result:?}"
    );
}

/// K-17.2 amendment: a `Complete` decided where the step's definition is unknown (an
/// operator's process that registered no definitions) is not applied by the worker that
/// knows the step is a human task: the step runs again in its next epoch (its task
/// re-opened), the payment never runs, and the refused output is recorded by its digest.
#[tokio::test]
async fn a_worker_refuses_a_human_task_completion_decided_without_the_definition() {
    let a = Approval::new(2);
    let worker = a.world.engine("w", vec![a.def.clone()]);
    let (wf, id) = a.dead_lettered(&worker).await;
    let operator = a.world.engine("ops", vec![]);
    let output = forged_approval();
    let decided = operator
        .decide_dead_letter(&id, DeadLetterAction::Complete { output: output.clone() }, "ops:mallory", None)
        .await
        .unwrap();
    assert_eq!(decided, DecideOutcome::Decided, "this engine cannot know the step");
    a.relay.up.store(true, Ordering::SeqCst);
    settle(&worker).await;

    let inst = a.world.instance(wf.as_str()).await.unwrap();
    assert_eq!(a.payments.load(Ordering::SeqCst), 0, "the forged approval paid: {:?}", inst.steps);
    assert!(!inst.output.contains_key("approve"), "{}", inst.output["approve"]);
    let step = &inst.steps[0];
    assert_eq!((step.epoch, step.status), (1, StepStatus::Waiting), "re-run in its next epoch, waiting on a person");
    let entries = operator_entries(step);
    assert_eq!(entries.len(), 1, "{entries:?}");
    let (sha, bytes) = digest(&output);
    assert_eq!(entries[0]["action"], "complete_refused", "{}", entries[0]);
    assert_eq!(entries[0]["actor"], "ops:mallory");
    assert_eq!(
        (&entries[0]["output_digest"]["sha256"], &entries[0]["output_digest"]["bytes"]),
        (&json!(sha), &json!(bytes))
    );
    assert_eq!(a.world.dead_letters.get(&id).await.unwrap().unwrap().status, DeadLetterStatus::Closed);
    let current =
        kernel_core::ports::task_id(&kernel_core::activity::idempotency_key_at(wf.as_str(), "approve", 0, 1), 0);
    let task = a.world.task_inbox.get(&current).await.unwrap();
    assert_eq!(task.map(|t| t.status), Some(TaskStatus::Open), "the task is open again for a person");
}

/// A step that always fails (a transient error, no retries left), after one that completes.
fn flaky(runs: Arc<AtomicU32>) -> Definition {
    Definition::builder("ledger")
        .step(StepDef::new("fetch", |_: ActivityContext| async { Ok(StepOutcome::complete(json!({"rows": 3}))) }))
        .step(
            StepDef::new("post", move |_: ActivityContext| {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Err(ActivityError::transient("ledger down"))
                }
            })
            .on_failed(OnFailed::DeadLetter),
        )
        .build()
        .unwrap()
}

/// K-17.2 amendment: an operator-supplied output past the 4 096 bytes a step's record
/// copies is kept whole on the dead-letter record and by SHA-256 and size in the step's
/// operator entry (before, the entry dropped every trace of it) — read back from the
/// stores after the run.
#[tokio::test]
async fn a_large_operator_output_is_recorded_on_the_dead_letter_and_by_digest_on_the_step() {
    let world = World::new(3);
    let runs = Arc::new(AtomicU32::new(0));
    let engine = world.engine("w", vec![flaky(runs.clone())]);
    let req = StartRequest::new("ledger", "l-1", json!({})).workflow_id("wf-l-1");
    let wf = engine.publisher().start_or_resume(req).await.unwrap().instance.workflow_id;
    world.drive(&engine).await.unwrap();
    let id = kernel_core::activity::idempotency_key_at(wf.as_str(), "post", 0, 0);
    let lines: Vec<Value> = (0..200).map(|k| json!({"line": k, "memo": format!("posted by hand ü {k:03}")})).collect();
    let output = json!({"posting_id": "P-77", "lines": lines});
    let (sha, bytes) = digest(&output);
    assert!(bytes > 4_096, "{bytes}");
    let decided = engine
        .decide_dead_letter(&id, DeadLetterAction::Complete { output: output.clone() }, "ops@example", Some("by hand"))
        .await
        .unwrap();
    assert_eq!(decided, DecideOutcome::Decided);
    world.drive(&engine).await.unwrap();

    let inst = world.instance(wf.as_str()).await.unwrap();
    assert_eq!((inst.status, &inst.output["post"]), (WorkflowStatus::Completed, &output));
    let stored = world.dead_letters.get(&id).await.unwrap().expect("kept until retention");
    assert_eq!(stored.status, DeadLetterStatus::Closed);
    let Some(DeadLetterDecision { action: DeadLetterAction::Complete { output: kept }, actor, .. }) = stored.decision
    else {
        panic!("a complete decision: {stored:?}")
    };
    assert_eq!((kept, actor.as_str()), (output.clone(), "ops@example"), "the output, whole, on the record");
    let entries = operator_entries(&inst.steps[1]);
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["action"], "complete");
    assert!(entries[0].get("output").is_none(), "no copy past the limit: {}", entries[0]);
    assert_eq!(entries[0]["output_digest"], json!({"sha256": sha, "bytes": bytes}), "{}", entries[0]);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the operator's output, not a new run");
}

/// K-17.2 amendment: a decision on a dead letter whose attempt a regenerate superseded
/// (epoch 0, while the step is in epoch 1) is refused — before, it was stored as decided
/// and never applied — and nothing is written; the current attempt's dead letter is
/// decided as usual.
#[tokio::test]
async fn a_decision_on_a_superseded_dead_letter_is_refused() {
    let world = World::new(4);
    let runs = Arc::new(AtomicU32::new(0));
    let engine = world.engine("w", vec![flaky(runs.clone())]);
    let req = StartRequest::new("ledger", "l-2", json!({})).workflow_id("wf-l-2");
    let wf = engine.publisher().start_or_resume(req).await.unwrap().instance.workflow_id;
    world.drive(&engine).await.unwrap();
    let old = kernel_core::activity::idempotency_key_at(wf.as_str(), "post", 0, 0);
    assert_eq!(world.dead_letters.get(&old).await.unwrap().unwrap().status, DeadLetterStatus::Open);
    let regenerated = engine.regenerate(&wf, "fetch").await.unwrap().applied().expect("no claim holds it");
    assert_eq!(regenerated.steps, vec!["fetch".to_string(), "post".to_string()]);
    world.drive(&engine).await.unwrap();
    let current = kernel_core::activity::idempotency_key_at(wf.as_str(), "post", 0, 1);
    assert_eq!(world.dead_letters.get(&current).await.unwrap().unwrap().status, DeadLetterStatus::Open);
    let before = world.instance(wf.as_str()).await.unwrap();
    assert_eq!(before.steps[1].epoch, 1);

    for action in [DeadLetterAction::Retry, DeadLetterAction::Fail, DeadLetterAction::Complete { output: json!({}) }] {
        let stale = engine.decide_dead_letter(&old, action.clone(), "ops", None).await;
        assert!(matches!(&stale, Err(Error::Conflict(m)) if m.contains("stale")), "{action:?}: {stale:?}");
    }
    assert_eq!(world.dead_letters.get(&old).await.unwrap().unwrap().decision, None, "nothing decided");
    assert_eq!(world.instance(wf.as_str()).await.unwrap(), before, "nothing written");

    let ok = engine.decide_dead_letter(&current, DeadLetterAction::Fail, "ops", None).await.unwrap();
    assert_eq!(ok, DecideOutcome::Decided);
    world.drive(&engine).await.unwrap();
    assert_eq!(world.instance(wf.as_str()).await.unwrap().status, WorkflowStatus::Failed);
    assert_eq!(runs.load(Ordering::SeqCst), 2, "one run per epoch");
}
