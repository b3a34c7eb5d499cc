//! Human-task steps on the engine (K-17.5): a person decides through the desk, the decision
//! rings a signal (K-9.3), the poll fallback (K-9.5) carries reminders and the SLA path, a
//! timeout never approves, and a sensitive reason stays on the task record.

mod decisions;
mod escalation;
mod outcomes;
mod sensitive_reasons;

use kernel_core::engine::RoundOutcome;
use kernel_core::ports::*;
use kernel_core::*;
use kernel_tasks::{HumanResult, HumanTask, HumanTaskBuilder, TaskDesk, HUMAN_TASK_SIGNAL};
use serde_json::json;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use testkit::harness::World;
use testkit::memory::{MemoryTaskInbox, SeqIds};

const MIN: i64 = 60_000;

fn mins(n: i64) -> DurationMs {
    DurationMs::from_millis(n * MIN)
}

fn finance(id: &str) -> Actor {
    Actor::new(id, ["finance"])
}

/// A workflow `review -> post` on the in-memory task inbox, its engine on the world's
/// manual clock and a desk ringing through the engine. The review routes its outcome
/// (`routes_outcomes`) and `post` is the branch that reads it, whatever it is, so these
/// tests see every conclusion as the step's output; a task that is not routed is
/// `human_outcomes.rs`'.
struct Rig {
    world: World,
    engine: Engine,
    inbox: MemoryTaskInbox,
    desk: TaskDesk,
    posts: Arc<AtomicU32>,
}

impl Rig {
    /// `build` adds the levels (and whatever else) to a task with evidence and seeded tokens.
    fn new(seed: u64, build: impl FnOnce(&World, HumanTaskBuilder) -> HumanTaskBuilder) -> Rig {
        Self::with_post(seed, build, false)
    }

    /// As [`new`](Self::new); a streaming `post` writes the review's output to the client
    /// stream.
    fn with_post(seed: u64, build: impl FnOnce(&World, HumanTaskBuilder) -> HumanTaskBuilder, stream: bool) -> Rig {
        let world = World::new(seed);
        let inbox = MemoryTaskInbox::new();
        let base = HumanTask::builder("Approve invoice 7 (12 400 EUR)")
            .evidence(|ctx| vec![Evidence { label: "The invoice".into(), reference: format!("doc:{}", ctx.biz_key()) }])
            .ids(Arc::new(SeqIds::new("h", seed)))
            .routes_outcomes();
        let task = build(&world, base).build(Arc::new(inbox.clone())).expect("valid human task");
        let posts = Arc::new(AtomicU32::new(0));
        let p = posts.clone();
        let mut post = StepDef::new("post", move |ctx: ActivityContext| {
            let p = p.clone();
            async move {
                p.fetch_add(1, Ordering::SeqCst);
                if let Some(s) = ctx.stream() {
                    let review = ctx.output("review").cloned().unwrap_or_default();
                    s.text(review.to_string()).await.map_err(|e| ActivityError::transient(e.to_string()))?;
                }
                Ok(StepOutcome::complete(json!("posted")))
            }
        })
        .depends_on(["review"])
        .when(["review"], |b| b.output("review").is_some());
        if stream {
            post = post.streaming();
        }
        let def =
            Definition::builder("invoice").step(StepDef::new("review", task).max_retry(3)).step(post).build().unwrap();
        let engine = world.engine("w", vec![def]);
        let desk = TaskDesk::new(Arc::new(inbox.clone()), engine.signal_sender(), world.clock.clone());
        Rig { world, engine, inbox, desk, posts }
    }

    async fn start(&self, biz: &str) -> String {
        let wf = format!("wf-{biz}");
        let req = StartRequest::new("invoice", biz, json!({ "amount": 12_400 })).workflow_id(wf.clone());
        self.engine.publisher().start_or_resume(req).await.unwrap();
        wf
    }

    /// Maintenance, then rounds until idle, without moving the clock; how many claims ran.
    async fn settle(&self) -> usize {
        self.engine.maintain().await.unwrap();
        let mut ran = 0;
        while let RoundOutcome::Ran { .. } = self.engine.tick().await.unwrap() {
            ran += 1;
        }
        ran
    }

    async fn instance(&self, wf: &str) -> WorkflowInstance {
        self.world.instance(wf).await.expect("stored instance")
    }

    /// The review step's result, once it completed.
    async fn result(&self, wf: &str) -> HumanResult {
        let inst = self.instance(wf).await;
        HumanResult::from_output(inst.output.get("review").expect("review completed")).unwrap()
    }

    async fn record(&self, id: &str) -> TaskRecord {
        self.inbox.get(id).await.unwrap().expect("task record")
    }

    /// The one record of `wf` at `level`.
    fn at_level(&self, wf: &str, level: u32) -> TaskRecord {
        let mut found: Vec<_> =
            self.inbox.all().into_iter().filter(|t| t.workflow_id.as_str() == wf && t.level == level).collect();
        assert_eq!(found.len(), 1, "one record of {wf} at level {level}: {found:?}");
        found.remove(0)
    }

    fn now(&self) -> Instant {
        self.world.now()
    }
}

/// The instance is parked on its human task: waiting, no claim, the wait on the task's signal.
fn assert_parked(inst: &WorkflowInstance, task: &TaskRecord) {
    assert_eq!(inst.status, WorkflowStatus::Waiting, "{:?}", inst.steps);
    assert_eq!(inst.steps[0].status, StepStatus::Waiting);
    assert!(inst.claim_token.is_none(), "no worker holds the instance while a person thinks");
    let wait = inst.wait.as_ref().expect("a stored wait");
    let id = wait.signal_identity().expect("a signal wait");
    assert_eq!((id.signal_type.as_str(), id.wait_key.as_str()), (HUMAN_TASK_SIGNAL, task.id.as_str()));
    assert!(wait.poll_time().is_some(), "a poll fallback (K-9.5)");
}

/// A signal delivery that is down: the decision is stored, its doorbell never rings.
#[derive(Default)]
struct Unreachable(AtomicU32);

#[async_trait::async_trait]
impl SignalDelivery for Unreachable {
    async fn deliver(&self, _signal: Signal) -> Result<DeliverOutcome> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err(Error::unavailable("signal inbox down"))
    }
}

fn deaf_desk(r: &Rig) -> (TaskDesk, Arc<Unreachable>) {
    let down = Arc::new(Unreachable::default());
    let desk = TaskDesk::new(Arc::new(r.inbox.clone()), SignalSender::new(down.clone()), r.world.clock.clone());
    (desk, down)
}
