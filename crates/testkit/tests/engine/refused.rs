//! A write the store refuses (`InvalidInput`) or could not reach (`Unavailable`) is not an
//! uncertain outcome (K-6.4): a refused completion fails its step once, through the normal
//! failure path; an unavailable store hands the claim back with a delay.

use kernel_core::engine::ClaimEnd;
use kernel_core::model::*;
use kernel_core::ports::*;
use kernel_core::transition::{Guard, Transition, TransitionKind};
use kernel_core::{ActivityContext, Definition, Error, Result, StartRequest, StepDef, StepOutcome, WorkflowId};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use testkit::harness::{test_config, World};

/// A two-step workflow whose first step returns `output`, counting its executions.
fn def(output: Value, runs: Arc<AtomicUsize>) -> Definition {
    Definition::builder("t")
        .step(StepDef::new("produce", move |_ctx: ActivityContext| {
            let (output, runs) = (output.clone(), runs.clone());
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(StepOutcome::complete(output))
            }
        }))
        .step(StepDef::new("after", |_ctx: ActivityContext| async { Ok(StepOutcome::complete(json!(1))) }))
        .build()
        .expect("valid")
}

/// `levels` nested objects around a scalar.
fn nested(levels: usize) -> Value {
    (0..levels).fold(json!(1), |v, _| json!({ "n": v }))
}

/// The failed step's error, checked to be a permanent one.
fn permanent_error(inst: &WorkflowInstance) -> StepError {
    assert_eq!(inst.status, WorkflowStatus::Failed, "{inst:?}");
    assert_eq!(inst.steps[0].status, StepStatus::Failed);
    let e = inst.steps[0].error.clone().expect("the failed step keeps its error");
    assert_eq!(e.class, ErrorClass::Permanent);
    e
}

/// Outputs no store can hold end the workflow `failed` after one execution, with a typed,
/// permanent step error naming the reason (before the fix the in-memory store stored them,
/// so the workflow completed, while MongoDB refused them and the step re-ran forever).
#[tokio::test]
async fn hardening_02_outputs_the_store_cannot_represent_fail_the_step_once() {
    let cases: [(&str, Value, &str); 3] = [
        ("integer above i64::MAX", json!({ "amount": u64::MAX }), "integer"),
        ("NUL in a nested key", json!({ "a": { "b\u{0}c": 1 } }), "NUL"),
        ("nesting too deep", nested(150), "nest"),
    ];
    for (what, output, reason) in cases {
        let world = World::new(1);
        let runs = Arc::new(AtomicUsize::new(0));
        let engine = world.engine("w", vec![def(output, runs.clone())]);
        engine.publisher().start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf")).await.unwrap();
        world.drive_until(&engine, 50, &|| false).await.unwrap();
        let inst = world.store.peek("wf").unwrap();
        assert_eq!(inst.status, WorkflowStatus::Failed, "{what}: {inst:?}");
        let e = permanent_error(&inst);
        assert!(e.message.contains(reason), "{what}: {}", e.message);
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{what}: executions");
    }
}

/// How [`Refusing`] answers the first completion write of step 0.
#[derive(Clone, Copy, Debug)]
enum Answer {
    Refused,
    Unavailable,
}

/// Forwards to the world's store, except the first write that completes step 0, which it
/// answers with `answer` without writing.
struct Refusing {
    inner: Arc<DynStore>,
    answer: Answer,
    fired: Mutex<bool>,
}

#[deny(clippy::missing_trait_methods)]
#[async_trait::async_trait]
impl WorkflowStore for Refusing {
    async fn create(&self, instance: WorkflowInstance) -> Result<CreateOutcome> {
        self.inner.create(instance).await
    }
    async fn get(&self, workflow_id: &WorkflowId) -> Result<Option<WorkflowInstance>> {
        self.inner.get(workflow_id).await
    }
    async fn get_by_biz_key(&self, biz_key: &str) -> Result<Option<WorkflowInstance>> {
        self.inner.get_by_biz_key(biz_key).await
    }
    async fn claim(&self, workflow_id: &WorkflowId, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        self.inner.claim(workflow_id, spec).await
    }
    async fn claim_any(&self, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        self.inner.claim_any(spec).await
    }
    async fn apply(&self, workflow_id: &WorkflowId, guard: &Guard, transition: &Transition) -> Result<WriteOutcome> {
        if transition.completed_steps().any(|i| i == 0) {
            let mut fired = self.fired.lock().unwrap();
            if !*fired {
                *fired = true;
                return Err(match self.answer {
                    Answer::Refused => Error::invalid("document", "the document would exceed the size limit"),
                    Answer::Unavailable => Error::unavailable("primary stepped down"),
                });
            }
        }
        self.inner.apply(workflow_id, guard, transition).await
    }
    async fn scan_due_waits(&self, now: Instant, after: Option<&DueCursor>, limit: usize) -> Result<ScanPage<DueWait>> {
        self.inner.scan_due_waits(now, after, limit).await
    }
    async fn scan_claimable(&self, after: Option<&WorkflowId>, limit: usize) -> Result<ScanPage<Candidate>> {
        self.inner.scan_claimable(after, limit).await
    }
}

async fn run_with(answer: Answer) -> (World, Vec<ClaimEnd>, usize, Vec<TransitionKind>) {
    let world = World::new(1);
    let runs = Arc::new(AtomicUsize::new(0));
    let mut ports = world.ports();
    ports.store = Arc::new(Refusing { inner: ports.store.clone(), answer, fired: Mutex::new(false) });
    let engine = world.engine_on(ports, test_config("w"), vec![def(json!({"ok": true}), runs.clone())]);
    engine.publisher().start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf")).await.unwrap();
    let report = world.drive_until(&engine, 50, &|| false).await.unwrap();
    let kinds = world.audit.log_of("wf").iter().flat_map(|w| w.kinds.clone()).collect();
    (world, report.ends_of("wf"), runs.load(Ordering::SeqCst), kinds)
}

/// A completion the store refuses fails the completing step for good through the normal
/// failure path (step failed → failing → failed), after exactly one execution; the claim
/// is not left to expire and the step is never re-run.
#[tokio::test]
async fn hardening_02_a_refused_completion_fails_the_step_once() {
    let (world, ends, runs, kinds) = run_with(Answer::Refused).await;
    assert_eq!(runs, 1, "executions; claim ends {ends:?}");
    assert_eq!(ends, vec![ClaimEnd::Terminal(WorkflowStatus::Failed)]);
    let e = permanent_error(&world.store.peek("wf").unwrap());
    assert!(e.message.contains("refused"), "{}", e.message);
    assert!(e.message.contains("size limit"), "the store's reason is kept: {}", e.message);
    assert!(kinds.contains(&TransitionKind::StepFailed) && kinds.contains(&TransitionKind::Failed), "{kinds:?}");
}

/// A completion write that certainly had no effect (`Unavailable`) hands the claim back
/// with a delay instead of leaving the lease to expire; the step runs again later.
#[tokio::test]
async fn hardening_02_an_unavailable_store_hands_the_claim_back() {
    let (world, ends, runs, _) = run_with(Answer::Unavailable).await;
    assert_eq!(ends.first(), Some(&ClaimEnd::Released), "{ends:?}");
    assert_eq!(ends.last(), Some(&ClaimEnd::Terminal(WorkflowStatus::Completed)), "{ends:?}");
    assert_eq!(runs, 2, "the lost output is produced again, once");
    assert_eq!(world.store.peek("wf").unwrap().status, WorkflowStatus::Completed);
}
