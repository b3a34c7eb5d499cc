//! The poll fallback carries reminders and the SLA path (K-17.5, K-9.5): a missed SLA escalates
//! and never approves, each level has its own token, reminders are sent once each.

use super::*;
use kernel_core::ports::*;
use kernel_core::*;
use kernel_tasks::{Concluded, Level, Notice, Notifier, SlaOutcome};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

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
