//! A person decides through the desk and the decision rings a signal (K-17.5, K-9.3): refused
//! decisions change nothing, one of two concurrent decisions is stored, a lost signal is taken
//! at the next poll, and a canceled workflow's task is closed.

use super::*;
use kernel_core::ports::*;
use kernel_core::*;
use kernel_tasks::{task_id, Concluded, Level, Notice, Notifier, SlaOutcome, TaskDesk};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use testkit::memory::MemoryTaskInbox;

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
