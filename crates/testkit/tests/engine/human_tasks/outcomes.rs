//! What a human task's conclusion lets happen next (K-17.5 and its amendment): a decision
//! written at or after the SLA deadline is refused whether or not a worker took the SLA
//! poll, and an outcome other than approve fails the step (its `on_failed` policy decides
//! what follows) unless the definition routes the outcome to a branch that reads it.

use kernel_core::engine::RoundOutcome;
use kernel_core::ports::*;
use kernel_core::*;
use kernel_tasks::{HumanResult, HumanTask, HumanTaskBuilder, Level, SlaOutcome, TaskDesk};
use serde_json::json;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use testkit::harness::World;
use testkit::memory::SeqIds;

const MIN: i64 = 60_000;

fn mins(n: i64) -> DurationMs {
    DurationMs::from_millis(n * MIN)
}

fn finance(id: &str) -> Actor {
    Actor::new(id, ["finance"])
}

/// A step that counts its runs.
fn counted(name: &str, runs: &Arc<AtomicU32>) -> StepDef {
    let runs = runs.clone();
    StepDef::new(name, move |_ctx: ActivityContext| {
        let runs = runs.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(StepOutcome::complete(json!("done")))
        }
    })
}

/// `approve` (a human task of finance, 60 minutes) `-> pay`, on the world's task inbox and
/// manual clock; `shape` finishes the task and the two steps.
struct Payment {
    world: World,
    engine: Engine,
    desk: TaskDesk,
    pays: Arc<AtomicU32>,
}

impl Payment {
    fn new(
        seed: u64,
        task: impl FnOnce(HumanTaskBuilder) -> HumanTaskBuilder,
        shape: impl FnOnce(StepDef, StepDef, &Arc<AtomicU32>) -> Vec<StepDef>,
    ) -> Payment {
        let world = World::new(seed);
        let inbox: Arc<DynTaskInbox> = Arc::new(world.task_inbox.clone());
        let base = HumanTask::builder("Pay invoice 7 (12 400 EUR)")
            .level(Level::roles(["finance"]).sla(mins(60)))
            .ids(Arc::new(SeqIds::new("h", seed)));
        let approve = StepDef::new("approve", task(base).build(inbox.clone()).expect("valid human task"));
        let pays = Arc::new(AtomicU32::new(0));
        let pay = counted("pay", &pays).depends_on(["approve"]);
        let mut def = Definition::builder("payment");
        for s in shape(approve, pay, &pays) {
            def = def.step(s);
        }
        let engine = world.engine("w", vec![def.build().expect("valid definition")]);
        let desk = TaskDesk::new(inbox, engine.signal_sender(), world.clock.clone());
        Payment { world, engine, desk, pays }
    }

    /// `approve -> pay` as declared.
    fn plain(seed: u64, task: impl FnOnce(HumanTaskBuilder) -> HumanTaskBuilder) -> Payment {
        Self::new(seed, task, |approve, pay, _| vec![approve, pay])
    }

    async fn start(&self) -> String {
        let wf = "wf-pay-7".to_string();
        let req = StartRequest::new("payment", "inv-7", json!({ "amount": 12_400 })).workflow_id(wf.clone());
        self.engine.publisher().start_or_resume(req).await.unwrap();
        wf
    }

    /// Maintenance, then rounds until idle, without moving the clock.
    async fn settle(&self) {
        self.engine.maintain().await.unwrap();
        while let RoundOutcome::Ran { .. } = self.engine.tick().await.unwrap() {}
    }

    async fn instance(&self, wf: &str) -> WorkflowInstance {
        self.world.instance(wf).await.expect("stored instance")
    }

    /// The open task of level `level`.
    fn task(&self, level: u32) -> TaskRecord {
        let mut found: Vec<_> = self.world.task_inbox.all().into_iter().filter(|t| t.level == level).collect();
        assert_eq!(found.len(), 1, "one record at level {level}: {found:?}");
        found.remove(0)
    }

    async fn decide(&self, task: &TaskRecord, outcome: TaskOutcome) -> TaskDecideOutcome {
        self.desk.decide(&task.id, &task.token, &finance("alice"), outcome, None).await.unwrap()
    }
}

/// K-17.5 (amended): an approval written a minute after the SLA deadline is refused even
/// though no worker has taken the SLA poll yet; the record stays open without a decision,
/// and the SLA path then concludes the task — a rejection, so `pay` never runs.
#[tokio::test]
async fn an_approval_after_the_deadline_is_refused_though_no_worker_took_the_sla_poll() {
    let p = Payment::plain(81, |b| b.on_sla(SlaOutcome::Reject));
    let wf = p.start().await;
    p.settle().await;
    let task = p.task(0);
    // Workers are late: nobody has taken the poll due at the deadline.
    p.world.clock.set(task.due_at.checked_add(mins(1)).unwrap());
    let out = p.decide(&task, TaskOutcome::Approve).await;
    assert_ne!(out, TaskDecideOutcome::Decided, "a decision after the deadline must not count");
    assert_eq!(out, TaskDecideOutcome::PastDeadline { due_at: task.due_at });
    let stored = p.world.task_inbox.get(&task.id).await.unwrap().expect("the record");
    assert_eq!((stored.status, &stored.decision), (TaskStatus::Open, &None), "a refusal writes nothing");

    p.settle().await;
    let inst = p.instance(&wf).await;
    let closed = p.world.task_inbox.get(&task.id).await.unwrap().expect("the record");
    assert_eq!((closed.status, closed.decision), (TaskStatus::Closed, None), "the SLA path closed it");
    assert_eq!(p.pays.load(Ordering::SeqCst), 0, "a late approval never pays");
    assert_eq!(inst.status, WorkflowStatus::Failed, "{:?}", inst.steps);
    let error = inst.steps[0].error.as_ref().expect("the SLA path's rejection is recorded");
    assert!(error.message.starts_with("not approved: reject (the SLA path"), "{}", error.message);
}

/// K-17.5 (amended): a human task that does not conclude in approval — a person's reject
/// or cancel, an escalation past the last level by a person or by the SLA path, the SLA
/// path's reject — fails its step permanently with `not approved: <outcome>`; under the
/// default `on_failed` (stop) the workflow fails and the dependent `pay` never runs.
#[tokio::test]
async fn a_task_not_approved_fails_its_step_and_its_dependent_never_runs() {
    type Conclude = Option<TaskOutcome>; // a person's decision, or `None`: the SLA passes
    let cases: [(&str, SlaOutcome, Conclude, &str); 5] = [
        ("person rejects", SlaOutcome::Escalate, Some(TaskOutcome::Reject), "reject"),
        ("person cancels", SlaOutcome::Escalate, Some(TaskOutcome::Cancel), "cancel"),
        ("person escalates past the last level", SlaOutcome::Escalate, Some(TaskOutcome::Escalate), "escalate"),
        ("SLA rejects", SlaOutcome::Reject, None, "reject"),
        ("SLA escalates past the last level", SlaOutcome::Escalate, None, "escalate"),
    ];
    for (seed, (label, on_sla, conclude, outcome)) in (82..).zip(cases) {
        let p = Payment::plain(seed, |b| b.on_sla(on_sla));
        let wf = p.start().await;
        p.settle().await;
        let task = p.task(0);
        match conclude {
            Some(o) => assert_eq!(p.decide(&task, o).await, TaskDecideOutcome::Decided, "{label}"),
            None => p.world.clock.set(task.due_at),
        }
        p.settle().await;
        let inst = p.instance(&wf).await;
        assert_eq!(p.pays.load(Ordering::SeqCst), 0, "{label}: `pay` never runs");
        assert_eq!(inst.status, WorkflowStatus::Failed, "{label}: {:?}", inst.steps);
        let step = &inst.steps[0];
        assert_eq!(step.status, StepStatus::Failed, "{label}");
        let error = step.error.as_ref().expect("the failure is recorded");
        assert_eq!(error.class, ErrorClass::Permanent, "{label}");
        assert!(error.message.starts_with(&format!("not approved: {outcome}")), "{label}: {}", error.message);
        assert!(!inst.output.contains_key("approve"), "{label}: a failed step has no output");
        assert_eq!(inst.steps[1].status, StepStatus::Pending, "{label}");
        assert_eq!(p.task(0).status, TaskStatus::Closed, "{label}: the task is closed");
    }
}

/// K-17.5 (amended): a non-approval follows the step's `on_failed` policy like any
/// permanent error — here `dead_letter`: the step is parked for an operator, `pay` has not
/// run.
#[tokio::test]
async fn a_rejection_follows_the_steps_on_failed_policy() {
    let p = Payment::new(90, |b| b, |approve, pay, _| vec![approve.on_failed(OnFailed::DeadLetter), pay]);
    let wf = p.start().await;
    p.settle().await;
    assert_eq!(p.decide(&p.task(0), TaskOutcome::Reject).await, TaskDecideOutcome::Decided);
    p.settle().await;
    let inst = p.instance(&wf).await;
    assert_eq!(inst.status, WorkflowStatus::Waiting, "parked on the operator's decision: {:?}", inst.steps);
    let dls = p.world.dead_letters.list(None, None, 10).await.unwrap();
    assert_eq!(dls.iter().map(|d| d.step.as_str()).collect::<Vec<_>>(), ["approve"]);
    assert_eq!(p.pays.load(Ordering::SeqCst), 0);
}

/// K-17.5 (amended): a definition that routes the outcome (`routes_outcomes`) completes
/// the step with a rejection, and the branch that reads it runs: `pay` (taken on approval
/// only) is skipped as not taken, `return_invoice` (taken on anything else) runs once, the
/// workflow completes.
#[tokio::test]
async fn a_routed_rejection_runs_the_branch_that_reads_it() {
    let approved = |b: &BranchInputs<'_>| {
        b.output("approve").and_then(|o| HumanResult::from_output(o).ok()).is_some_and(|r| r.approved())
    };
    let returns = Arc::new(AtomicU32::new(0));
    let r = returns.clone();
    let p = Payment::new(
        91,
        |b| b.routes_outcomes(),
        move |approve, pay, _| {
            vec![
                approve,
                pay.when(["approve"], approved),
                counted("return_invoice", &r).depends_on(["approve"]).when(["approve"], move |b| !approved(b)),
            ]
        },
    );
    let wf = p.start().await;
    p.settle().await;
    assert_eq!(p.decide(&p.task(0), TaskOutcome::Reject).await, TaskDecideOutcome::Decided);
    p.settle().await;
    let inst = p.instance(&wf).await;
    assert_eq!(inst.status, WorkflowStatus::Completed, "{:?}", inst.steps);
    let res = HumanResult::from_output(&inst.output["approve"]).expect("the outcome is the step's output");
    assert_eq!((res.outcome(), res.approved()), (TaskOutcome::Reject, false));
    assert_eq!(p.pays.load(Ordering::SeqCst), 0, "`pay` is taken on approval only");
    assert!(inst.steps[1].not_taken(), "{:?}", inst.steps[1]);
    assert_eq!(returns.load(Ordering::SeqCst), 1, "the branch that reads the rejection ran");
}
