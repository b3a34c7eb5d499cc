//! Scenarios for the crash-window sweep ([`harness::sweep`](crate::harness::sweep)).

use super::business::{Business, FakeAsr};
use super::workflows;
use crate::harness::{BoxFuture, Scenario, ScenarioRun, ScenarioVerdict, World};
use crate::memory::ManualClock;
use kernel_core::ports::{Clock, DynStore};
use kernel_core::{ActivityContext, StepDef, StepOutcome, WorkflowId};
use kernel_core::{Definition, Engine, Priority, StartRequest, WorkflowInstance, WorkflowStatus};
use serde_json::json;
use std::sync::Arc;

fn peek<'a>(instances: &'a [WorkflowInstance], id: &str) -> Option<&'a WorkflowInstance> {
    instances.iter().find(|i| i.workflow_id == id)
}

struct Objects {
    biz: Arc<Business>,
    /// (workflow type, workflow id, object id, extra input)
    starts: Vec<(String, String, String, serde_json::Value)>,
}

impl Objects {
    fn start<'a>(&'a self, engine: &'a Engine) -> BoxFuture<'a, kernel_core::Result<()>> {
        Box::pin(async move {
            let p = engine.publisher();
            for (t, wf, obj, extra) in &self.starts {
                let mut input = json!({ "object_id": obj, "fencing_token": "f1" });
                if let (Some(m), Some(e)) = (input.as_object_mut(), extra.as_object()) {
                    m.extend(e.clone());
                }
                p.start_or_resume(
                    StartRequest::new(t.clone(), format!("{t}:{obj}"), input)
                        .workflow_id(wf.clone())
                        .priority(Priority::P1),
                )
                .await?;
            }
            Ok(())
        })
    }

    fn verdict(&self, instances: &[WorkflowInstance], done_status: &str) -> ScenarioVerdict {
        let mut v = ScenarioVerdict::default();
        for (t, wf, obj, _) in &self.starts {
            v.expected.push(format!("{t}:{obj}"));
            let inst = peek(instances, wf);
            let terminal_ok = inst.as_ref().is_some_and(|i| i.status.is_terminal());
            let biz_ok = self
                .biz
                .get(obj)
                .is_some_and(|o| o.fencing_token == "f1" && (o.status == done_status || done_status.is_empty()));
            if !terminal_ok || !biz_ok {
                v.unfinished.push(format!("{t}:{obj}"));
            }
        }
        v
    }
}

/// The seed's story: `subscribers` summary workflows wait for a live; a fan-out workflow
/// wakes them; each transcribes with one ASR job and composes a fenced result.
#[derive(Debug, Clone, Copy)]
pub struct LiveSummaryScenario {
    /// Subscriber workflows.
    pub subscribers: usize,
    /// Signals per fan-out page.
    pub page_size: usize,
}

struct LiveRun {
    objects: Objects,
    asr: Arc<FakeAsr>,
}

impl Scenario for LiveSummaryScenario {
    fn name(&self) -> String {
        "live_summary".into()
    }
    fn instantiate(&self, world: &World) -> Box<dyn ScenarioRun> {
        let biz = Arc::new(Business::default());
        let asr = Arc::new(FakeAsr::new(2, Some(world.durable.clone()), "transcribe"));
        let mut starts = vec![];
        for i in 1..=self.subscribers {
            let obj = format!("obj-{i}");
            let wf = format!("sum-{i}");
            biz.accept(&obj, "f1");
            biz.subscribe("live-7", &wf);
            starts.push((workflows::LIVE_SUMMARY.to_string(), wf, obj, json!({ "live_id": "live-7" })));
        }
        biz.accept("live-7", "f1");
        starts.push((
            workflows::LIVE_FANOUT.to_string(),
            "fan-live-7".into(),
            "live-7".into(),
            json!({ "live_id": "live-7", "page": self.page_size }),
        ));
        let run = LiveRun { objects: Objects { biz, starts }, asr };
        let _ = self.page_size;
        Box::new(LivePage { run, page_size: self.page_size })
    }
}

struct LivePage {
    run: LiveRun,
    page_size: usize,
}

impl ScenarioRun for LivePage {
    fn definitions(&self) -> Vec<Definition> {
        let biz = self.run.objects.biz.clone();
        vec![
            workflows::live_summary(biz.clone(), self.run.asr.clone(), None),
            workflows::live_fanout(biz, self.page_size),
        ]
    }
    fn start<'a>(&'a self, engine: &'a Engine) -> BoxFuture<'a, kernel_core::Result<()>> {
        self.run.objects.start(engine)
    }
    fn verdict(&self, instances: &[WorkflowInstance]) -> ScenarioVerdict {
        let mut v = ScenarioVerdict::default();
        for (t, wf, obj, _) in &self.run.objects.starts {
            v.expected.push(format!("{t}:{obj}"));
            let inst = peek(instances, wf);
            let ok = if t == workflows::LIVE_FANOUT {
                inst.as_ref().is_some_and(|i| i.status == WorkflowStatus::Completed)
            } else {
                inst.as_ref().is_some_and(|i| i.status == WorkflowStatus::Completed)
                    && self
                        .run
                        .objects
                        .biz
                        .get(obj)
                        .is_some_and(|o| o.fencing_token == "f1" && o.status == "done" && o.result.is_some())
            };
            if !ok {
                v.unfinished.push(format!("{t}:{obj}"));
            }
        }
        v.effective_jobs_max = self.run.asr.effective_jobs_max();
        v.late_submissions = self.run.asr.late_submissions();
        v
    }
}

/// A workflow that fails for good after a transient retry; the failure finalizer must write
/// the business `failed` state.
#[derive(Debug, Clone, Copy)]
pub struct FailingScenario;

struct FailingRun(Objects);

impl Scenario for FailingScenario {
    fn name(&self) -> String {
        "failing_charge".into()
    }
    fn instantiate(&self, _world: &World) -> Box<dyn ScenarioRun> {
        let biz = Arc::new(Business::default());
        biz.accept("order-1", "f1");
        Box::new(FailingRun(Objects {
            biz,
            starts: vec![("failing_charge".into(), "pay-1".into(), "order-1".into(), json!({}))],
        }))
    }
}

impl ScenarioRun for FailingRun {
    fn definitions(&self) -> Vec<Definition> {
        vec![workflows::failing_charge(self.0.biz.clone())]
    }
    fn start<'a>(&'a self, engine: &'a Engine) -> BoxFuture<'a, kernel_core::Result<()>> {
        self.0.start(engine)
    }
    fn verdict(&self, instances: &[WorkflowInstance]) -> ScenarioVerdict {
        let mut v = self.0.verdict(instances, "failed");
        if peek(instances, "pay-1").is_some_and(|i| i.status != WorkflowStatus::Failed) {
            v.unfinished.push("failing_charge:order-1 (not failed)".into());
        }
        v
    }
}

/// A fan-out waking `waiters` waiting workflows, `page_size` signals per page.
#[derive(Debug, Clone, Copy)]
pub struct FanoutScenario {
    /// Waiting workflows.
    pub waiters: usize,
    /// Signals per page.
    pub page_size: usize,
}

struct FanoutRun {
    objects: Objects,
    page_size: usize,
}

impl Scenario for FanoutScenario {
    fn name(&self) -> String {
        "fanout".into()
    }
    fn instantiate(&self, _world: &World) -> Box<dyn ScenarioRun> {
        let biz = Arc::new(Business::default());
        let mut starts = vec![];
        for i in 1..=self.waiters {
            let (obj, wf) = (format!("w-{i}"), format!("wait-{i}"));
            biz.accept(&obj, "f1");
            biz.subscribe("live-9", &wf);
            starts.push(("waiter".to_string(), wf, obj, json!({ "live_id": "live-9" })));
        }
        biz.accept("live-9", "f1");
        starts.push((
            workflows::LIVE_FANOUT.to_string(),
            "fan-live-9".into(),
            "live-9".into(),
            json!({ "live_id": "live-9" }),
        ));
        Box::new(FanoutRun { objects: Objects { biz, starts }, page_size: self.page_size })
    }
}

impl ScenarioRun for FanoutRun {
    fn definitions(&self) -> Vec<Definition> {
        vec![
            workflows::waiter(self.objects.biz.clone()),
            workflows::live_fanout(self.objects.biz.clone(), self.page_size),
        ]
    }
    fn start<'a>(&'a self, engine: &'a Engine) -> BoxFuture<'a, kernel_core::Result<()>> {
        self.objects.start(engine)
    }
    fn verdict(&self, instances: &[WorkflowInstance]) -> ScenarioVerdict {
        let mut v = ScenarioVerdict::default();
        for (t, wf, obj, _) in &self.objects.starts {
            v.expected.push(format!("{t}:{obj}"));
            let completed = peek(instances, wf).is_some_and(|i| i.status == WorkflowStatus::Completed);
            let biz_ok = t == workflows::LIVE_FANOUT || self.objects.biz.get(obj).is_some_and(|o| o.status == "done");
            if !completed || !biz_ok {
                v.unfinished.push(format!("{t}:{obj}"));
            }
        }
        v
    }
}

/// A diamond DAG with a parallel wave, a suspending sibling and a skipped step.
#[derive(Debug, Clone, Copy)]
pub struct DagScenario;

struct DagRun(Objects);

impl Scenario for DagScenario {
    fn name(&self) -> String {
        "diamond".into()
    }
    fn instantiate(&self, _world: &World) -> Box<dyn ScenarioRun> {
        let biz = Arc::new(Business::default());
        biz.accept("doc-1", "f1");
        Box::new(DagRun(Objects { biz, starts: vec![("diamond".into(), "dag-1".into(), "doc-1".into(), json!({}))] }))
    }
}

impl ScenarioRun for DagRun {
    fn definitions(&self) -> Vec<Definition> {
        vec![workflows::diamond(self.0.biz.clone())]
    }
    fn start<'a>(&'a self, engine: &'a Engine) -> BoxFuture<'a, kernel_core::Result<()>> {
        self.0.start(engine)
    }
    fn verdict(&self, instances: &[WorkflowInstance]) -> ScenarioVerdict {
        let mut v = self.0.verdict(instances, "done");
        if peek(instances, "dag-1").is_some_and(|i| i.status != WorkflowStatus::Completed) {
            v.unfinished.push("diamond:doc-1 (not completed)".into());
        }
        v
    }
}

/// The document-review loop with a branch (K-4 amendment): two iterations back, a branch
/// not taken; the loop's body runs once per iteration key and the run ends as a crash-free
/// one would.
pub struct ReviewLoopScenario;

struct ReviewLoopRun {
    objects: Objects,
    handed_in: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
}

impl Scenario for ReviewLoopScenario {
    fn name(&self) -> String {
        "review_loop".into()
    }
    fn instantiate(&self, _world: &World) -> Box<dyn ScenarioRun> {
        let biz = Arc::new(Business::default());
        biz.accept("file-1", "f1");
        let starts = vec![("review_loop".into(), "review-1".into(), "file-1".into(), json!({}))];
        Box::new(ReviewLoopRun { objects: Objects { biz, starts }, handed_in: Default::default() })
    }
}

impl ScenarioRun for ReviewLoopRun {
    fn definitions(&self) -> Vec<Definition> {
        vec![workflows::review_loop(self.objects.biz.clone(), self.handed_in.clone())]
    }
    fn start<'a>(&'a self, engine: &'a Engine) -> BoxFuture<'a, kernel_core::Result<()>> {
        self.objects.start(engine)
    }
    fn verdict(&self, instances: &[WorkflowInstance]) -> ScenarioVerdict {
        let mut v = self.objects.verdict(instances, "done");
        let keys = self.handed_in.lock().map(|h| h.len()).unwrap_or(0);
        let ok = peek(instances, "review-1").is_some_and(|i| {
            i.status == WorkflowStatus::Completed
                && i.steps[1].iterations == 2
                && i.steps[0].epoch == 2
                && i.steps[2].not_taken()
                && i.output.get("check") == Some(&json!({"complete": true, "documents": 3}))
        });
        if !ok || keys != 3 {
            v.unfinished.push(format!("review_loop:file-1 (iterations or keys wrong: {keys} keys)"));
        }
        v
    }
}

/// Waiters that are already suspended on their signal wait when the fan-out reaches them:
/// the fan-out settles first (a durable sleep), so every delivery activates a stored wait
/// and marks the inbox record matched (K-9.3, K-9.4).
#[derive(Debug, Clone, Copy)]
pub struct EarlyWaitScenario {
    /// Waiting workflows.
    pub waiters: usize,
    /// Signals per page.
    pub page_size: usize,
}

/// How long the late fan-out settles before it announces, in ms.
const SETTLE_MS: i64 = 2_000;

impl Scenario for EarlyWaitScenario {
    fn name(&self) -> String {
        "early_wait".into()
    }
    fn instantiate(&self, _world: &World) -> Box<dyn ScenarioRun> {
        let biz = Arc::new(Business::default());
        let mut starts = vec![];
        for i in 1..=self.waiters {
            let (obj, wf) = (format!("e-{i}"), format!("early-{i}"));
            biz.accept(&obj, "f1");
            biz.subscribe("live-5", &wf);
            starts.push(("waiter".to_string(), wf, obj, json!({ "live_id": "live-5" })));
        }
        biz.accept("live-5", "f1");
        starts.push((
            workflows::LATE_FANOUT.to_string(),
            "late-live-5".into(),
            "live-5".into(),
            json!({ "live_id": "live-5" }),
        ));
        Box::new(EarlyWaitRun(FanoutRun { objects: Objects { biz, starts }, page_size: self.page_size }))
    }
}

struct EarlyWaitRun(FanoutRun);

impl ScenarioRun for EarlyWaitRun {
    fn definitions(&self) -> Vec<Definition> {
        let biz = self.0.objects.biz.clone();
        vec![workflows::waiter(biz.clone()), workflows::late_fanout(biz, self.0.page_size, SETTLE_MS)]
    }
    fn start<'a>(&'a self, engine: &'a Engine) -> BoxFuture<'a, kernel_core::Result<()>> {
        self.0.start(engine)
    }
    fn verdict(&self, instances: &[WorkflowInstance]) -> ScenarioVerdict {
        let mut v = ScenarioVerdict::default();
        for (t, wf, obj, _) in &self.0.objects.starts {
            v.expected.push(format!("{t}:{obj}"));
            let completed = peek(instances, wf).is_some_and(|i| i.status == WorkflowStatus::Completed);
            let biz_ok = t == workflows::LATE_FANOUT || self.0.objects.biz.get(obj).is_some_and(|o| o.status == "done");
            if !completed || !biz_ok {
                v.unfinished.push(format!("{t}:{obj}"));
            }
        }
        v
    }
}

/// Type of the long-running job of [`HeartbeatScenario`].
pub const LONG_JOB: &str = "long_job";

/// A step that runs longer than the heartbeat interval: while it is in flight the manual
/// clock moves past the interval, so the claim's heartbeat writes (K-6.3) happen inside
/// the crash window.
#[derive(Debug, Clone, Copy)]
pub struct HeartbeatScenario {
    /// Heartbeat intervals the step stays in flight (each one a heartbeat write).
    pub beats: u32,
}

struct HeartbeatRun {
    objects: Objects,
    clock: Arc<ManualClock>,
    durable: Arc<DynStore>,
    beats: u32,
}

impl Scenario for HeartbeatScenario {
    fn name(&self) -> String {
        "heartbeat".into()
    }
    fn instantiate(&self, world: &World) -> Box<dyn ScenarioRun> {
        let biz = Arc::new(Business::default());
        biz.accept("batch-1", "f1");
        Box::new(HeartbeatRun {
            objects: Objects { biz, starts: vec![(LONG_JOB.into(), "long-1".into(), "batch-1".into(), json!({}))] },
            clock: world.clock.clone(),
            durable: world.durable.clone(),
            beats: self.beats,
        })
    }
}

impl ScenarioRun for HeartbeatRun {
    fn definitions(&self) -> Vec<Definition> {
        let (clock, durable, beats) = (self.clock.clone(), self.durable.clone(), self.beats);
        let cfg = kernel_core::engine::EngineConfig::default();
        let (heartbeat_ms, lease_ms) = (cfg.heartbeat_ms.as_millis(), cfg.lease_ms.as_millis());
        let crunch = move |ctx: ActivityContext| {
            let (clock, durable) = (clock.clone(), durable.clone());
            async move {
                let id = WorkflowId::from(ctx.workflow_id());
                // Let the claim's heartbeat task start its wait before time moves.
                for _ in 0..8 {
                    tokio::task::yield_now().await;
                }
                for _ in 0..beats {
                    clock.advance(heartbeat_ms + 1);
                    // Wait (boundedly: a crashed process never writes it) until the lease
                    // was extended from the new now.
                    for _ in 0..200 {
                        tokio::task::yield_now().await;
                        let lease_end = durable.get(&id).await.ok().flatten().and_then(|i| i.claimable_time);
                        if lease_end.is_some_and(|t| t.as_millis() >= clock.now().as_millis() + lease_ms) {
                            break;
                        }
                    }
                }
                Ok(StepOutcome::complete(json!({ "crunched": beats })))
            }
        };
        let biz = self.objects.biz.clone();
        let publish = move |ctx: ActivityContext| {
            let biz = biz.clone();
            async move {
                let object_id = ctx.round().object_id.clone().unwrap_or_default();
                biz.fenced(&object_id, ctx.fencing_token().unwrap_or_default(), |o| {
                    o.result = Some("crunched".into());
                    o.status = "done".into();
                });
                Ok(StepOutcome::complete(json!({ "published": true })))
            }
        };
        vec![Definition::builder(LONG_JOB)
            .step(StepDef::new("crunch", crunch).timeout_ms(600_000))
            .step(StepDef::new("publish", publish))
            .build()
            .expect("valid definition")]
    }
    fn start<'a>(&'a self, engine: &'a Engine) -> BoxFuture<'a, kernel_core::Result<()>> {
        self.objects.start(engine)
    }
    fn verdict(&self, instances: &[WorkflowInstance]) -> ScenarioVerdict {
        let mut v = self.objects.verdict(instances, "done");
        if peek(instances, "long-1").is_some_and(|i| i.status != WorkflowStatus::Completed) {
            v.unfinished.push("long_job:batch-1 (not completed)".into());
        }
        v
    }
}

/// The diamond DAG while the ready queue is down (a Redis outage): every pop fails, so the
/// engine claims through the store fallback (`claim_any`), and enqueues fail as well.
#[derive(Debug, Clone, Copy)]
pub struct QueueDownScenario;

impl Scenario for QueueDownScenario {
    fn name(&self) -> String {
        "queue_down".into()
    }
    fn instantiate(&self, world: &World) -> Box<dyn ScenarioRun> {
        world.queue.set_down(true);
        DagScenario.instantiate(world)
    }
}

/// The refund (`workflows::refund`): a cached lookup, a dead letter the operator fails,
/// and an inverse escalated to a person — the sweep's crash points on the result cache,
/// the dead letters and the task inbox.
#[derive(Debug, Clone, Copy)]
pub struct RefundScenario;

struct RefundRun {
    objects: Objects,
    dead_letters: crate::memory::MemoryDeadLetters,
    tasks: crate::memory::MemoryTaskInbox,
}

impl Scenario for RefundScenario {
    fn name(&self) -> String {
        "refund".into()
    }
    fn instantiate(&self, world: &World) -> Box<dyn ScenarioRun> {
        let biz = Arc::new(Business::default());
        biz.accept("refund-1", "f1");
        let starts = vec![("refund".into(), "refund-1".into(), "refund-1".into(), json!({}))];
        Box::new(RefundRun {
            objects: Objects { biz, starts },
            dead_letters: world.dead_letters.clone(),
            tasks: world.task_inbox.clone(),
        })
    }
}

impl ScenarioRun for RefundRun {
    fn definitions(&self) -> Vec<Definition> {
        vec![workflows::refund(self.objects.biz.clone())]
    }
    fn start<'a>(&'a self, engine: &'a Engine) -> BoxFuture<'a, kernel_core::Result<()>> {
        self.objects.start(engine)
    }
    /// The operator fails every open dead letter (idempotent: a decided one is skipped, and
    /// a decision repeated after a crash is `AlreadyDecided` with its signal rung again).
    fn operate<'a>(&'a self, engine: &'a Engine, _world: &'a World) -> BoxFuture<'a, kernel_core::Result<bool>> {
        use kernel_core::ports::{DeadLetterAction, DeadLetterStatus, DeadLetters};
        Box::pin(async move {
            let open = self.dead_letters.list(Some(DeadLetterStatus::Open), None, 10).await?;
            let mut acted = false;
            for dl in open.into_iter().filter(|d| d.decision.is_none()) {
                engine
                    .decide_dead_letter(&dl.id, DeadLetterAction::Fail, "ops@example", Some("vendor unknown"))
                    .await?;
                acted = true;
            }
            Ok(acted)
        })
    }
    fn verdict(&self, instances: &[WorkflowInstance]) -> ScenarioVerdict {
        use kernel_core::compensation::CompensationOutcome;
        let mut v = self.objects.verdict(instances, "failed");
        let escalated = peek(instances, "refund-1").is_some_and(|i| {
            i.status == WorkflowStatus::Failed
                && i.compensation.as_ref().is_some_and(|c| c.outcome == CompensationOutcome::Escalated)
        });
        let tasks = self.tasks.all().len();
        if !escalated || tasks != 1 {
            v.unfinished.push(format!("refund:refund-1 (not failed with its inverse escalated: {tasks} tasks)"));
        }
        v
    }
}
