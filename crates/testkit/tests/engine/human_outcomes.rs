//! What a human task's conclusion lets happen next (K-17.5 and its amendment): a decision
//! written at or after the SLA deadline is refused whether or not a worker took the SLA
//! poll, and an outcome other than approve fails the step (its `on_failed` policy decides
//! what follows) unless the definition routes the outcome to a branch that reads it.

use kernel_core::engine::RoundOutcome;
use kernel_core::human::{Concluded, HumanResult, HumanTask, HumanTaskBuilder, Level, SlaOutcome, TaskDesk};
use kernel_core::ports::*;
use kernel_core::*;
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
    #[allow(dead_code)] // read once non-approvals stop their dependents
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
/// and the SLA path then concludes the task.
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
    let res = HumanResult::from_output(&inst.output["approve"]).expect("concluded");
    assert_eq!(res.concluded, Concluded::Sla { outcome: SlaOutcome::Reject, at: p.world.now() });
}
