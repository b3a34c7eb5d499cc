//! Human-task steps on the engine (K-17.5): a person decides through the desk, the decision
//! rings a signal (K-9.3), the poll fallback (K-9.5) carries reminders and the SLA path, a
//! timeout never approves, and a sensitive reason stays on the task record.

use kernel_core::engine::RoundOutcome;
use kernel_core::ports::*;
use kernel_core::*;
use kernel_tasks::{
    task_id, Concluded, HumanResult, HumanTask, HumanTaskBuilder, Level, Notice, Notifier, SlaOutcome, TaskDesk,
    HUMAN_TASK_SIGNAL,
};
use serde_json::json;
use std::io::Write;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
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

/// K-17.5: a person with the role lists, fetches and approves the task; the signal wakes
/// the workflow (K-9.3) and the step's output records who approved and when.
#[tokio::test]
async fn a_person_with_the_role_approves_and_the_signal_wakes_the_workflow() {
    let r = Rig::new(1, |_, b| b.level(Level::roles(["finance"]).sla(mins(60))));
    let wf = r.start("inv-1").await;
    assert_eq!(r.settle().await, 1);
    let task = r.at_level(&wf, 0);
    let inst = r.instance(&wf).await;
    assert_parked(&inst, &task);
    assert_eq!(inst.claimable_time, Some(task.due_at), "the poll is the SLA deadline");
    assert_eq!(r.inbox.all().len(), 1, "one open task");
    assert_eq!(task.status, TaskStatus::Open);
    assert_eq!(task.step, "review");
    assert_eq!(task.workflow_type, "invoice");
    assert_eq!(task.roles, vec!["finance".to_string()]);
    assert_eq!(task.evidence, vec![Evidence { label: "The invoice".into(), reference: "doc:inv-1".into() }]);
    assert_eq!(task.due_at, task.created_at.checked_add(mins(60)).unwrap());
    assert!(task.token.len() >= TASK_TOKEN_BYTES_MIN, "token {:?} is too short", task.token);
    // The step's idempotency key (K-17.1) and the level.
    let key = task.id.strip_suffix("|h0").expect("level 0");
    assert!(key.starts_with(&format!("{}:{wf}|6:review|", wf.len())), "{key}");
    assert_eq!(task_id(key, 0), task.id);

    let alice = finance("alice");
    let (page, _) = r.desk.open_tasks(&alice, None, 10).await.unwrap();
    assert_eq!(page.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), vec![task.id.as_str()]);
    let (none, _) = r.desk.open_tasks(&Actor::new("sam", ["sales"]), None, 10).await.unwrap();
    assert!(none.is_empty(), "a task is listed only to those who may decide it");
    let fetched = r.desk.task(&task.id, &alice).await.unwrap().expect("visible to finance");
    assert_eq!(fetched.evidence, task.evidence);
    assert!(r.desk.task(&task.id, &Actor::new("sam", ["sales"])).await.unwrap().is_none());

    r.world.clock.advance(mins(7));
    let decided_at = r.now();
    let out = r.desk.decide(&task.id, &fetched.token, &alice, TaskOutcome::Approve, None).await.unwrap();
    assert_eq!(out, TaskDecideOutcome::Decided);
    let woken = r.instance(&wf).await;
    assert_eq!(woken.status, WorkflowStatus::Running, "the signal activated the wait");
    assert_eq!(woken.resume.as_ref().map(|x| x.kind), Some(ResumeKind::Signal));

    assert_eq!(r.settle().await, 1, "one claim takes the decision and runs `post`");
    let done = r.instance(&wf).await;
    assert_eq!(done.status, WorkflowStatus::Completed);
    let res = r.result(&wf).await;
    assert!(res.approved());
    assert_eq!(res.outcome(), TaskOutcome::Approve);
    assert_eq!((res.task.as_str(), res.level), (task.id.as_str(), 0));
    assert_eq!(
        res.concluded,
        Concluded::Person { outcome: TaskOutcome::Approve, actor: "alice".into(), decided_at, reason: None }
    );
    let closed = r.record(&task.id).await;
    assert_eq!(closed.status, TaskStatus::Closed);
    assert_eq!(closed.closed_at, Some(decided_at), "closed when the step took the decision");
    assert_eq!(closed.decision.as_ref().map(|d| d.actor.as_str()), Some("alice"));
    assert_eq!(r.posts.load(Ordering::SeqCst), 1, "`post` ran once");
    assert!(r.desk.open_tasks(&alice, None, 10).await.unwrap().0.is_empty(), "nothing left to decide");
}

/// K-17.5, K-9.5: past the SLA of a single level with `on_sla(Escalate)` the step concludes
/// by the SLA path, never approved.
#[tokio::test]
async fn a_missed_sla_escalates_and_never_approves() {
    let r = Rig::new(2, |_, b| b.level(Level::roles(["finance"]).sla(mins(60))).on_sla(SlaOutcome::Escalate));
    let wf = r.start("inv-2").await;
    r.settle().await;
    let task = r.at_level(&wf, 0);
    r.world.clock.advance(mins(59));
    assert_eq!(r.settle().await, 0, "the poll is not due before the deadline");
    assert_parked(&r.instance(&wf).await, &task);
    r.world.clock.advance(mins(1));
    let due = r.now();
    assert_eq!(due, task.due_at);
    assert_eq!(r.settle().await, 1, "the poll fallback wakes the step at the deadline");
    let res = r.result(&wf).await;
    assert!(!res.approved(), "a timeout never approves");
    assert_eq!(res.concluded, Concluded::Sla { outcome: SlaOutcome::Escalate, at: due });
    assert_eq!(res.outcome(), TaskOutcome::Escalate);
    let closed = r.record(&task.id).await;
    assert_eq!((closed.status, closed.decision, closed.closed_at), (TaskStatus::Closed, None, Some(due)));
    assert_eq!(r.inbox.all().len(), 1, "no level past the path was opened");
    // Too late for the person: the task is closed.
    let late = r.desk.decide(&task.id, &task.token, &finance("alice"), TaskOutcome::Approve, None).await.unwrap();
    assert_eq!(late, TaskDecideOutcome::Closed);
    assert!(!r.result(&wf).await.approved());
}

/// K-17.5: `on_sla(Reject)` concludes a missed SLA as a rejection.
#[tokio::test]
async fn a_missed_sla_with_on_sla_reject_concludes_reject() {
    let r = Rig::new(3, |_, b| b.level(Level::assignee("cfo").sla(mins(30))).on_sla(SlaOutcome::Reject));
    let wf = r.start("inv-3").await;
    r.settle().await;
    r.world.clock.advance(mins(30));
    r.settle().await;
    let res = r.result(&wf).await;
    assert_eq!(res.concluded, Concluded::Sla { outcome: SlaOutcome::Reject, at: r.now() });
    assert_eq!(res.outcome(), TaskOutcome::Reject);
    assert!(!res.approved());
}

/// K-17.5: with two levels, level 0's missed SLA opens level 1 with a new token and closes
/// level 0 without a decision; the old token opens nothing; level 1 rejects.
#[tokio::test]
async fn escalation_opens_the_next_level_with_a_new_token_and_the_old_one_is_refused() {
    let r = Rig::new(4, |_, b| {
        b.level(Level::roles(["finance"]).sla(mins(60)))
            .level(Level::assignee("cfo").sla(mins(120)))
            .on_sla(SlaOutcome::Escalate)
    });
    let wf = r.start("inv-4").await;
    r.settle().await;
    let first = r.at_level(&wf, 0);
    r.world.clock.advance(mins(60));
    let escalated_at = r.now();
    assert_eq!(r.settle().await, 1);
    let old = r.record(&first.id).await;
    assert_eq!((old.status, &old.decision, old.closed_at), (TaskStatus::Closed, &None, Some(escalated_at)));
    let second = r.at_level(&wf, 1);
    assert_eq!(second.status, TaskStatus::Open);
    assert_ne!(second.token, first.token, "a new level, a new token");
    assert!(second.token.len() >= TASK_TOKEN_BYTES_MIN);
    assert_eq!(second.assignee.as_deref(), Some("cfo"));
    assert_eq!((second.created_at, second.due_at), (escalated_at, escalated_at.checked_add(mins(120)).unwrap()));
    let inst = r.instance(&wf).await;
    assert_parked(&inst, &second);
    assert!(!inst.output.contains_key("review"), "escalation is not a conclusion");

    let cfo = Actor::new("cfo", Vec::<String>::new());
    // The old token: on its own task it finds the task closed, on the new one it is wrong.
    let on_old = r.desk.decide(&first.id, &first.token, &finance("alice"), TaskOutcome::Approve, None).await.unwrap();
    assert_eq!(on_old, TaskDecideOutcome::Closed);
    let on_new = r.desk.decide(&second.id, &first.token, &cfo, TaskOutcome::Approve, None).await.unwrap();
    assert_eq!(on_new, TaskDecideOutcome::WrongToken);
    assert_eq!(r.record(&first.id).await, old, "refusals change nothing");
    assert_eq!(r.record(&second.id).await, second);
    assert_eq!(r.settle().await, 0, "nothing rang");
    assert_eq!(r.instance(&wf).await.revision, inst.revision);

    let out = r.desk.decide(&second.id, &second.token, &cfo, TaskOutcome::Reject, None).await.unwrap();
    assert_eq!(out, TaskDecideOutcome::Decided);
    r.settle().await;
    let res = r.result(&wf).await;
    assert_eq!((res.task.as_str(), res.level, res.outcome()), (second.id.as_str(), 1, TaskOutcome::Reject));
    assert!(matches!(res.concluded, Concluded::Person { ref actor, .. } if actor == "cfo"));
}

/// K-17.5, K-9.3: every refused decision (wrong token, ineligible actor, the desk's rule,
/// a reused token, a closed task) changes neither the record nor the workflow.
#[tokio::test]
async fn refused_decisions_change_nothing() {
    let r = Rig::new(5, |_, b| b.level(Level::roles(["finance"]).sla(mins(60))));
    let desk = r.desk.clone().rule("invoice", "review", |a: &Actor, _t: &TaskRecord| a.id != "mallory");
    let wf = r.start("inv-5").await;
    r.settle().await;
    let task = r.at_level(&wf, 0);
    let parked = r.instance(&wf).await;
    let unchanged = |label: &'static str| {
        let (r, task, parked, wf) = (&r, &task, &parked, &wf);
        async move {
            assert_eq!(&r.record(&task.id).await, task, "{label}: the record is unchanged");
            assert_eq!(r.settle().await, 0, "{label}: nothing woke");
            let inst = r.instance(wf).await;
            assert_parked(&inst, task);
            assert_eq!(inst.revision, parked.revision, "{label}: the instance is unchanged");
        }
    };
    let alice = finance("alice");
    let mut wrong = task.token.clone();
    wrong.replace_range(0..1, if wrong.starts_with('x') { "y" } else { "x" });
    let out = desk.decide(&task.id, &wrong, &alice, TaskOutcome::Approve, None).await.unwrap();
    assert_eq!(out, TaskDecideOutcome::WrongToken);
    unchanged("wrong token").await;

    let sam = Actor::new("sam", ["sales"]);
    let out = desk.decide(&task.id, &task.token, &sam, TaskOutcome::Approve, None).await.unwrap();
    assert_eq!(out, TaskDecideOutcome::NotEligible);
    unchanged("no role").await;

    let mallory = finance("mallory");
    assert!(desk.open_tasks(&mallory, None, 10).await.unwrap().0.is_empty(), "the rule hides the task");
    assert!(desk.task(&task.id, &mallory).await.unwrap().is_none());
    let out = desk.decide(&task.id, &task.token, &mallory, TaskOutcome::Approve, None).await.unwrap();
    assert_eq!(out, TaskDecideOutcome::NotEligible);
    unchanged("the desk's rule").await;

    let out = desk.decide("no-such-task|h0", &task.token, &alice, TaskOutcome::Approve, None).await.unwrap();
    assert_eq!(out, TaskDecideOutcome::NotFound);
    assert!(matches!(
        desk.decide(&task.id, "short", &alice, TaskOutcome::Approve, None).await,
        Ok(TaskDecideOutcome::WrongToken) | Err(Error::InvalidInput { .. })
    ));
    unchanged("bad input").await;

    // Decided once; the same token again gets the stored decision, not a second one.
    r.world.clock.advance(mins(1));
    let at = r.now();
    assert_eq!(desk.decide(&task.id, &task.token, &alice, TaskOutcome::Reject, None).await.unwrap(), {
        TaskDecideOutcome::Decided
    });
    let decided = r.record(&task.id).await;
    let stored = TaskDecision { outcome: TaskOutcome::Reject, actor: "alice".into(), reason: None, decided_at: at };
    assert_eq!((decided.status, decided.decision.as_ref()), (TaskStatus::Decided, Some(&stored)));
    r.world.clock.advance(mins(1));
    let again = desk.decide(&task.id, &task.token, &finance("bob"), TaskOutcome::Approve, None).await.unwrap();
    assert_eq!(again, TaskDecideOutcome::AlreadyDecided(stored.clone()));
    assert_eq!(r.record(&task.id).await, decided, "a reused token changes nothing");

    r.settle().await;
    let res = r.result(&wf).await;
    assert_eq!(res.outcome(), TaskOutcome::Reject, "the first decision holds");
    assert!(!res.approved());
    let closed = r.record(&task.id).await;
    assert_eq!(closed.status, TaskStatus::Closed);
    // Closed: the right token learns it is closed; a wrong one learns nothing.
    let out = desk.decide(&task.id, &task.token, &alice, TaskOutcome::Approve, None).await.unwrap();
    assert_eq!(out, TaskDecideOutcome::Closed);
    let out = desk.decide(&task.id, &wrong, &alice, TaskOutcome::Approve, None).await.unwrap();
    assert_eq!(out, TaskDecideOutcome::WrongToken);
    assert_eq!(r.record(&task.id).await, closed);
    assert_eq!(r.result(&wf).await, res);
    assert_eq!(r.posts.load(Ordering::SeqCst), 1);
}

/// A task inbox whose reads meet at a barrier: two deciders both read the task open, both
/// pass the desk's checks, and race on the inbox's conditional write.
struct ReadBarrier {
    inner: MemoryTaskInbox,
    barrier: tokio::sync::Barrier,
}

#[async_trait::async_trait]
impl TaskInbox for ReadBarrier {
    async fn open(&self, task: &TaskRecord) -> Result<Option<TaskRecord>> {
        self.inner.open(task).await
    }
    async fn get(&self, id: &str) -> Result<Option<TaskRecord>> {
        let read = self.inner.get(id).await;
        self.barrier.wait().await;
        read
    }
    async fn list_open(&self, actor: &Actor, after: Option<&str>, limit: usize) -> Result<Vec<TaskRecord>> {
        self.inner.list_open(actor, after, limit).await
    }
    async fn decide(&self, id: &str, token: &str, actor: &Actor, decision: &TaskDecision) -> Result<TaskDecideOutcome> {
        self.inner.decide(id, token, actor, decision).await
    }
    async fn close(&self, id: &str, now: Instant) -> Result<TaskCloseOutcome> {
        self.inner.close(id, now).await
    }
    async fn purge_sensitive_reasons(&self, before: Instant, limit: usize) -> Result<u64> {
        self.inner.purge_sensitive_reasons(before, limit).await
    }
    async fn purge_closed(&self, before: Instant, limit: usize) -> Result<u64> {
        self.inner.purge_closed(before, limit).await
    }
}

/// K-17.5: two people decide one open task at once through the desk, both having read it
/// open: exactly one decision is stored, the other is told the stored one, and the step
/// takes the stored one.
#[tokio::test]
async fn two_concurrent_decisions_store_exactly_one() {
    let r = Rig::new(6, |_, b| b.level(Level::roles(["finance"]).sla(mins(60))));
    let wf = r.start("inv-6").await;
    r.settle().await;
    let task = r.at_level(&wf, 0);
    let racing = Arc::new(ReadBarrier { inner: r.inbox.clone(), barrier: tokio::sync::Barrier::new(2) });
    let desk = TaskDesk::new(racing, r.engine.signal_sender(), r.world.clock.clone());
    let (alice, bob) = (finance("alice"), finance("bob"));
    let (a, b) = futures::join!(
        desk.decide(&task.id, &task.token, &alice, TaskOutcome::Approve, None),
        desk.decide(&task.id, &task.token, &bob, TaskOutcome::Reject, None),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let outs = [&a, &b];
    assert_eq!(outs.iter().filter(|o| ***o == TaskDecideOutcome::Decided).count(), 1, "{a:?} {b:?}");
    let stored = r.record(&task.id).await.decision.expect("one decision stored");
    let loser = outs.iter().find(|o| ***o != TaskDecideOutcome::Decided).unwrap();
    assert_eq!(**loser, TaskDecideOutcome::AlreadyDecided(stored.clone()));
    r.settle().await;
    let res = r.result(&wf).await;
    assert_eq!(res.outcome(), stored.outcome);
    assert!(matches!(res.concluded, Concluded::Person { ref actor, .. } if *actor == stored.actor));
    assert_eq!(r.posts.load(Ordering::SeqCst), 1);
}

/// K-17.5, K-9.3, K-9.5: a decision whose doorbell never rang is on the record; the step
/// takes it at its next poll, even the SLA deadline's — the person's decision, not the SLA path.
#[tokio::test]
async fn a_decision_whose_signal_was_lost_is_taken_at_the_next_poll() {
    let r = Rig::new(7, |_, b| b.level(Level::roles(["finance"]).sla(mins(60))).on_sla(SlaOutcome::Reject));
    let wf = r.start("inv-7").await;
    r.settle().await;
    let task = r.at_level(&wf, 0);
    let (deaf, down) = deaf_desk(&r);
    r.world.clock.advance(mins(5));
    let decided_at = r.now();
    let out = deaf.decide(&task.id, &task.token, &finance("alice"), TaskOutcome::Approve, None).await.unwrap();
    assert_eq!(out, TaskDecideOutcome::Decided, "the decision happened though the signal did not ring");
    assert_eq!(down.0.load(Ordering::SeqCst), 1, "the ring was tried once");
    assert_eq!(r.record(&task.id).await.status, TaskStatus::Decided);
    assert_eq!(r.settle().await, 0, "nothing rang");
    assert_parked(&r.instance(&wf).await, &task);
    r.world.clock.set(task.due_at);
    assert_eq!(r.settle().await, 1);
    let res = r.result(&wf).await;
    assert!(res.approved(), "the stored decision wins over the SLA path: {res:?}");
    assert_eq!(
        res.concluded,
        Concluded::Person { outcome: TaskOutcome::Approve, actor: "alice".into(), decided_at, reason: None }
    );
    assert_eq!(r.record(&task.id).await.status, TaskStatus::Closed);
}

/// Decides the task the moment it is told the task was opened: before the step has
/// returned its wait.
struct EagerReviewer {
    desk: Arc<OnceLock<TaskDesk>>,
    outcomes: Arc<Mutex<Vec<TaskDecideOutcome>>>,
}

#[async_trait::async_trait]
impl Notifier for EagerReviewer {
    async fn notify(&self, task: &TaskRecord, notice: Notice) -> std::result::Result<(), ActivityError> {
        if notice == Notice::Opened {
            let desk = self.desk.get().expect("desk set");
            let out = desk
                .decide(&task.id, &task.token, &finance("alice"), TaskOutcome::Approve, None)
                .await
                .map_err(|e| ActivityError::transient(e.to_string()))?;
            self.outcomes.lock().unwrap().push(out);
        }
        Ok(())
    }
}

/// K-17.5, K-9.3, K-9.4: a decision (and its signal) arriving while the step is still
/// running, before its wait is stored, is not lost: the step is woken at once.
#[tokio::test]
async fn a_decision_before_the_wait_is_stored_is_not_lost() {
    let desk = Arc::new(OnceLock::new());
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let reviewer = Arc::new(EagerReviewer { desk: desk.clone(), outcomes: outcomes.clone() });
    let r = Rig::new(8, |_, b| b.level(Level::roles(["finance"]).sla(mins(60))).notifier(reviewer));
    desk.set(r.desk.clone()).unwrap();
    let wf = r.start("inv-8").await;
    let opened_at = r.now();
    r.settle().await;
    assert_eq!(*outcomes.lock().unwrap(), vec![TaskDecideOutcome::Decided]);
    assert_eq!(r.now(), opened_at, "no time passed: the early signal woke the wait, not the poll");
    let inst = r.instance(&wf).await;
    assert_eq!(inst.status, WorkflowStatus::Completed, "{:?}", inst.steps);
    let res = r.result(&wf).await;
    assert!(res.approved());
    assert_eq!(r.record(&res.task).await.status, TaskStatus::Closed);
    assert_eq!(r.posts.load(Ordering::SeqCst), 1);
}

/// Records every notice with the clock's reading.
#[derive(Clone)]
struct Notices {
    clock: Arc<testkit::memory::ManualClock>,
    log: Arc<Mutex<Vec<(Notice, u32, Instant)>>>,
}

#[async_trait::async_trait]
impl Notifier for Notices {
    async fn notify(&self, task: &TaskRecord, notice: Notice) -> std::result::Result<(), ActivityError> {
        self.log.lock().unwrap().push((notice, task.level, Clock::now(&*self.clock)));
        Ok(())
    }
}

/// K-17.5, K-9.5: reminders at 10 and 20 minutes are each sent once at their time, with no
/// worker held in between; the SLA follows at 60 minutes.
#[tokio::test]
async fn reminders_are_sent_once_each_at_their_time_without_holding_a_worker() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    let r = Rig::new(9, move |w, b| {
        b.level(Level::roles(["finance"]).sla(mins(60)))
            .reminders([mins(10), mins(20)])
            .notifier(Arc::new(Notices { clock: w.clock.clone(), log: l }))
    });
    let wf = r.start("inv-9").await;
    let t0 = r.now();
    let at = |m: i64| t0.checked_add(mins(m)).unwrap();
    assert_eq!(r.settle().await, 1);
    let task = r.at_level(&wf, 0);
    let check = |expect: Vec<(Notice, u32, Instant)>, poll: Instant| {
        let (r, task, wf, log) = (&r, &task, &wf, &log);
        async move {
            assert_eq!(*log.lock().unwrap(), expect);
            let inst = r.instance(wf).await;
            assert_parked(&inst, task);
            assert_eq!(inst.claimable_time, Some(poll));
        }
    };
    check(vec![(Notice::Opened, 0, t0)], at(10)).await;
    r.world.clock.set(at(9));
    assert_eq!(r.settle().await, 0, "no claim before the reminder is due");
    r.world.clock.set(at(10));
    assert_eq!(r.settle().await, 1);
    check(vec![(Notice::Opened, 0, t0), (Notice::Reminder(1), 0, at(10))], at(20)).await;
    r.world.clock.set(at(15));
    assert_eq!(r.settle().await, 0);
    r.world.clock.set(at(20));
    assert_eq!(r.settle().await, 1);
    let all = vec![(Notice::Opened, 0, t0), (Notice::Reminder(1), 0, at(10)), (Notice::Reminder(2), 0, at(20))];
    check(all.clone(), at(60)).await;
    r.world.clock.set(at(59));
    assert_eq!(r.settle().await, 0);
    r.world.clock.set(at(60));
    assert_eq!(r.settle().await, 1);
    assert_eq!(*log.lock().unwrap(), all, "no notice repeats, the SLA sends none");
    assert_eq!(r.result(&wf).await.concluded, Concluded::Sla { outcome: SlaOutcome::Escalate, at: at(60) });
    assert_eq!(r.inbox.all().len(), 1);
}

/// A log buffer for a subscriber of this test's thread.
#[derive(Clone, Default)]
struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl Write for LogBuf {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogBuf {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

const SECRET: &str = "medical leave";

/// A workflow whose review a person rejects with a sensitive reason while the doorbell is
/// down (the desk logs the failed ring; the step takes the decision at its poll), run to
/// its end with every log line captured.
struct Sensitive {
    r: Rig,
    wf: String,
    task: TaskRecord,
    logs: LogBuf,
    decided_at: Instant,
    reason: TaskReason,
    _guard: tracing::subscriber::DefaultGuard,
}

async fn sensitive_run(seed: u64) -> Sensitive {
    let logs = LogBuf::default();
    let w = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || w.clone())
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    let r = Rig::with_post(seed, |_, b| b.level(Level::roles(["finance"]).sla(mins(60))), true);
    let wf = r.start("inv-10").await;
    r.settle().await;
    let task = r.at_level(&wf, 0);
    let (deaf, _) = deaf_desk(&r);
    r.world.clock.advance(mins(3));
    let decided_at = r.now();
    let reason = TaskReason { sensitive: true, text: Some(SECRET.into()) };
    let out = deaf.decide(&task.id, &task.token, &finance("alice"), TaskOutcome::Reject, Some(reason.clone())).await;
    assert_eq!(out.unwrap(), TaskDecideOutcome::Decided);
    r.world.clock.set(task.due_at);
    r.settle().await;
    assert_eq!(r.instance(&wf).await.status, WorkflowStatus::Completed);
    Sensitive { r, wf, task, logs, decided_at, reason, _guard: guard }
}

/// K-17.5, place 1: the instance (the step's output) says a sensitive reason was given,
/// never its text.
#[tokio::test]
async fn a_sensitive_reason_is_not_in_the_instance() {
    let s = sensitive_run(10).await;
    let res = s.r.result(&s.wf).await;
    assert_eq!(
        res.concluded,
        Concluded::Person {
            outcome: TaskOutcome::Reject,
            actor: "alice".into(),
            decided_at: s.decided_at,
            reason: Some(TaskReason { sensitive: true, text: None }),
        }
    );
    let inst = serde_json::to_string(&s.r.instance(&s.wf).await).unwrap();
    assert!(inst.contains("\"sensitive\":true"), "the instance says a sensitive reason was given");
    assert!(!inst.contains(SECRET), "not in the instance: {inst}");
}

/// K-17.5, place 2: the observer's rows and snapshots never carry the text.
#[tokio::test]
async fn a_sensitive_reason_is_not_in_the_observations() {
    let s = sensitive_run(12).await;
    let events = s.r.world.observations.events();
    assert!(!events.is_empty());
    assert!(!format!("{events:?}").contains(SECRET), "not in the observations");
}

/// K-17.5, place 3: the progress stream carries the review's output without the text.
#[tokio::test]
async fn a_sensitive_reason_is_not_in_the_stream() {
    let s = sensitive_run(13).await;
    let keys = s.r.world.streams.keys();
    assert_eq!(keys.len(), 1, "post streamed");
    let streamed = format!("{:?}", keys.iter().map(|k| s.r.world.streams.get(k)).collect::<Vec<_>>());
    assert!(streamed.contains("sensitive"), "the stream carried the review's output: {streamed}");
    assert!(!streamed.contains(SECRET), "not in the stream: {streamed}");
}

/// K-17.5, place 4: no log line carries a reason (the failed ring is logged by task id).
#[tokio::test]
async fn a_sensitive_reason_is_never_logged() {
    let s = sensitive_run(14).await;
    let logged = s.logs.text();
    assert!(logged.contains("did not ring") && logged.contains(&s.task.id), "the failed ring is logged: {logged}");
    assert!(!logged.contains(SECRET), "not in the logs: {logged}");
}

/// K-17.5, place 5: the task record keeps the text until the retention purge removes it;
/// the decision (outcome, actor, time, the sensitive flag) stays.
#[tokio::test]
async fn a_sensitive_reason_is_purged_from_the_task_record_after_retention() {
    let s = sensitive_run(15).await;
    let (r, task) = (&s.r, &s.task);
    let rec = r.record(&task.id).await;
    assert_eq!(
        rec.decision.as_ref().and_then(|d| d.reason.clone()),
        Some(s.reason.clone()),
        "the record keeps the text"
    );
    let retention = DurationMs::from_millis(30 * 24 * 60 * MIN);
    assert_eq!(r.desk.purge_sensitive_reasons(retention, 100).await.unwrap(), 0, "too recent");
    assert_eq!(r.record(&task.id).await, rec);
    r.world.clock.advance(retention);
    r.world.clock.advance(1);
    assert_eq!(r.desk.purge_sensitive_reasons(retention, 100).await.unwrap(), 1);
    let purged = r.record(&task.id).await;
    let d = purged.decision.as_ref().expect("the decision stays");
    assert_eq!((d.outcome, d.actor.as_str(), d.decided_at), (TaskOutcome::Reject, "alice", s.decided_at));
    assert_eq!(d.reason, Some(TaskReason { sensitive: true, text: None }), "the text is gone");
    assert_eq!(TaskRecord { decision: rec.decision.as_ref().map(TaskDecision::redacted), ..rec }, purged);
    assert_eq!(r.desk.purge_sensitive_reasons(retention, 100).await.unwrap(), 0, "idempotent");
}

/// K-17.5: a reason that is not sensitive is recorded in the step's output.
#[tokio::test]
async fn a_plain_reason_is_in_the_step_output() {
    let r = Rig::new(11, |_, b| b.level(Level::roles(["finance"]).sla(mins(60))));
    let wf = r.start("inv-11").await;
    r.settle().await;
    let task = r.at_level(&wf, 0);
    let reason = TaskReason { sensitive: false, text: Some("duplicate of invoice 6".into()) };
    let out = r.desk.decide(&task.id, &task.token, &finance("alice"), TaskOutcome::Reject, Some(reason.clone())).await;
    assert_eq!(out.unwrap(), TaskDecideOutcome::Decided);
    r.settle().await;
    assert!(matches!(r.result(&wf).await.concluded, Concluded::Person { reason: Some(ref x), .. } if *x == reason));
    // The purge leaves it alone.
    r.world.clock.advance(mins(60 * 24 * 400));
    assert_eq!(r.desk.purge_sensitive_reasons(mins(1), 100).await.unwrap(), 0);
    assert_eq!(r.record(&task.id).await.decision.and_then(|d| d.reason), Some(reason));
}

/// A notifier whose first `Opened` fails; counts the `Opened` notices it accepted.
#[derive(Default)]
struct FlakyOnce {
    calls: AtomicU32,
    accepted: AtomicU32,
}

#[async_trait::async_trait]
impl Notifier for FlakyOnce {
    async fn notify(&self, _task: &TaskRecord, notice: Notice) -> std::result::Result<(), ActivityError> {
        if notice != Notice::Opened {
            return Ok(());
        }
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(ActivityError::transient("mail relay down"));
        }
        self.accepted.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// K-17.5: notices are at least once — an `Opened` notice that failed is sent again when
/// the step is retried, though the task record was already opened.
#[tokio::test]
async fn a_failed_opened_notice_is_sent_again_on_retry() {
    let flaky = Arc::new(FlakyOnce::default());
    let n = flaky.clone();
    let r = Rig::new(12, move |_, b| b.level(Level::roles(["finance"]).sla(mins(60))).notifier(n));
    let wf = r.start("inv-12").await;
    r.settle().await;
    assert_eq!(flaky.calls.load(Ordering::SeqCst), 1);
    assert_eq!(r.inbox.all().len(), 1, "the record was opened before the notice failed");
    // The retry's backoff is short next to the SLA.
    for _ in 0..30 {
        if r.instance(&wf).await.status == WorkflowStatus::Waiting {
            break;
        }
        r.world.clock.advance(DurationMs::from_millis(1_000));
        r.settle().await;
    }
    let task = r.at_level(&wf, 0);
    assert_parked(&r.instance(&wf).await, &task);
    assert_eq!(flaky.accepted.load(Ordering::SeqCst), 1, "the opened notice reached people once the relay was back");
    // Once sent, it is not sent again at later polls.
    r.world.clock.set(task.due_at);
    r.settle().await;
    assert_eq!(flaky.calls.load(Ordering::SeqCst), 2);
}

/// K-17.5: a task whose workflow ended (here canceled while it waited) is stale for a desk
/// that checks the store: not listed, a decision with the right token is `Closed`, and the
/// record is closed on the spot; a desk without the store check would still take it.
#[tokio::test]
async fn a_task_of_a_canceled_workflow_is_closed_not_decided() {
    let rig = Rig::new(41, |_, b| b.level(Level::roles(["finance"]).sla(mins(60))));
    let wf = rig.start("stale").await;
    rig.settle().await;
    let task = rig.at_level(&wf, 0);
    assert_eq!(rig.engine.cancel(&wf.as_str().into()).await.unwrap(), kernel_core::CancelOutcome::Canceled);
    let checking = rig.desk.clone().with_store(rig.world.durable.clone());
    let (listed, _) = checking.open_tasks(&finance("alice"), None, 10).await.unwrap();
    assert!(listed.is_empty(), "a stale task is not listed: {listed:?}");
    let out = checking.decide(&task.id, &task.token, &finance("alice"), TaskOutcome::Approve, None).await.unwrap();
    assert_eq!(out, TaskDecideOutcome::Closed);
    let rec = rig.record(&task.id).await;
    assert_eq!((rec.status, rec.decision), (TaskStatus::Closed, None), "closed without a decision");
    assert_eq!(rig.posts.load(Ordering::SeqCst), 0);
}

/// K-17.5: the store check leaves a live task alone — listed and decided as usual.
#[tokio::test]
async fn a_live_task_passes_the_store_check() {
    let rig = Rig::new(42, |_, b| b.level(Level::roles(["finance"]).sla(mins(60))));
    let wf = rig.start("live").await;
    rig.settle().await;
    let task = rig.at_level(&wf, 0);
    let checking = rig.desk.clone().with_store(rig.world.durable.clone());
    let (listed, _) = checking.open_tasks(&finance("alice"), None, 10).await.unwrap();
    assert_eq!(listed.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), [task.id.as_str()]);
    let out = checking.decide(&task.id, &task.token, &finance("alice"), TaskOutcome::Approve, None).await.unwrap();
    assert_eq!(out, TaskDecideOutcome::Decided);
    rig.settle().await;
    assert!(rig.result(&wf).await.approved());
}
