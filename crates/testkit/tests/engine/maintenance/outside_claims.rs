//! The paths outside a claim: every committed transition is observed (K-15), an instance is
//! re-enqueued wherever it becomes claimable (K-13), and a maintenance pass survives a failing
//! timer activation and stops calling Redis after its first error (K-9.2, K-13).

use crate::intercept::{ApplyHook, Intercepted};

use kernel_core::engine::RoundOutcome;

use kernel_core::ports::*;

use kernel_core::transition::TransitionKind;

use kernel_core::WorkflowId;

use kernel_core::*;

use serde_json::json;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use std::sync::Arc;

use testkit::harness::World;

use crate::support::waits_for_approval;
use testkit::memory::InMemoryInbox;

fn failing(name: &str) -> Definition {
    Definition::builder(name)
        .step(StepDef::new("only", |_c: ActivityContext| async {
            Err::<StepOutcome, _>(ActivityError::permanent("schema mismatch"))
        }))
        .build()
        .unwrap()
}

/// An inbox whose `mark_matched` fails while `down` is set.
struct MarkFails {
    inner: InMemoryInbox,
    down: AtomicBool,
    marks: AtomicUsize,
}

#[async_trait::async_trait]
impl SignalInbox for MarkFails {
    async fn insert(&self, record: SignalRecord) -> Result<InsertOutcome> {
        self.inner.insert(record).await
    }
    async fn get(&self, signal_id: &str) -> Result<Option<SignalRecord>> {
        self.inner.get(signal_id).await
    }
    async fn find_pending(&self, w: &WorkflowId, t: &str, k: &str, g: u64) -> Result<Option<SignalRecord>> {
        self.inner.find_pending(w, t, k, g).await
    }
    async fn mark_matched(&self, signal_id: &str, now: Instant) -> Result<bool> {
        self.marks.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(Error::unavailable("inbox down"));
        }
        self.inner.mark_matched(signal_id, now).await
    }
    async fn scan_pending(&self, after: Option<&str>, limit: usize) -> Result<SignalPage> {
        self.inner.scan_pending(after, limit).await
    }
    async fn scan_created_before(&self, before: Instant, after: Option<&str>, limit: usize) -> Result<SignalPage> {
        self.inner.scan_created_before(before, after, limit).await
    }
    async fn scan_workflow(&self, w: &WorkflowId, status: SignalStatus, limit: usize) -> Result<Vec<SignalRecord>> {
        self.inner.scan_workflow(w, status, limit).await
    }
    async fn delete_if(&self, signal_ids: &[String], status: SignalStatus) -> Result<u64> {
        self.inner.delete_if(signal_ids, status).await
    }
    async fn count_pending_orphans(&self, w: Option<&WorkflowId>, limit: u64) -> Result<u64> {
        self.inner.count_pending_orphans(w, limit).await
    }
    async fn clear_orphans(&self, w: &WorkflowId) -> Result<u64> {
        self.inner.clear_orphans(w).await
    }
}

/// Redis during an outage with a reconnecting client: every call takes `delay_ms` of the
/// engine's clock, then fails. Counts the calls of both the lanes and the doorbell.
struct SlowDownRedis {
    clock: Arc<testkit::memory::ManualClock>,
    delay_ms: DurationMs,
    calls: AtomicUsize,
}

impl SlowDownRedis {
    fn fail(&self) -> Result<()> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.clock.advance(self.delay_ms);
        Err(Error::unavailable("redis reconnecting"))
    }
}

#[async_trait::async_trait]
impl ReadyQueue for SlowDownRedis {
    async fn enqueue(&self, _w: &WorkflowId, _p: Priority, _at: Instant) -> Result<()> {
        self.fail()
    }
    async fn enqueue_many(&self, _entries: &[LaneEntry]) -> Result<()> {
        self.fail()
    }
    async fn pop_due(&self, _now: Instant, _max: usize) -> Result<Vec<WorkflowId>> {
        self.fail().map(|()| Vec::new())
    }
    async fn stats(&self, _now: Instant) -> Result<[LaneStats; 4]> {
        self.fail().map(|()| Default::default())
    }
}

#[async_trait::async_trait]
impl Wakeup for SlowDownRedis {
    async fn notify(&self) -> Result<()> {
        self.fail()
    }
    async fn subscribe(&self) -> Result<WakeupReceiver> {
        self.fail().map(|()| unreachable!())
    }
}

fn sleeper(name: &str) -> Definition {
    Definition::builder(name)
        .step(StepDef::new("nap", |c: ActivityContext| async move {
            if c.resume().is_some() {
                return Ok(StepOutcome::complete(json!("rested")));
            }
            Ok(StepOutcome::sleep(60_000, json!({})))
        }))
        .build()
        .unwrap()
}

#[tokio::test]
async fn replay_and_priority_raise_are_observed() {
    // K-15: every committed transition is observed, the replay and the raise included.
    let world = World::new(1);
    let engine = world.engine("w", vec![failing("t")]);
    let publisher = engine.publisher();
    publisher.start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf-b")).await.unwrap();
    world.drive(&engine).await.unwrap();
    assert_eq!(world.store.peek("wf-b").unwrap().status, WorkflowStatus::Failed);
    let out = publisher.start_or_resume(StartRequest::new("t", "b", json!({})).priority(Priority::P0)).await.unwrap();
    assert!(out.execution_activated);
    let events = world.observations.events();
    let kinds: Vec<(TransitionKind, WorkflowStatus)> =
        events.iter().rev().take(2).rev().map(|o| (o.kind, o.status)).collect();
    assert_eq!(
        kinds,
        [(TransitionKind::Replay, WorkflowStatus::Running), (TransitionKind::PriorityRaise, WorkflowStatus::Running)],
        "the replay and the raise are the last observations"
    );
    let stored = world.store.peek("wf-b").unwrap();
    let last = events.last().unwrap();
    assert_eq!((last.revision, last.workflow_run), (stored.revision, stored.retry_count));
}

#[tokio::test]
async fn an_activated_wait_is_enqueued_even_when_the_inbox_mark_fails() {
    // K-9.3, K-13: the activation committed, so the instance is claimable; it must be in the
    // lanes and the doorbell rung although marking the record matched failed.
    let world = World::new(1);
    let inbox = Arc::new(MarkFails { inner: InMemoryInbox::new(), down: AtomicBool::new(true), marks: 0.into() });
    let mut ports = world.ports();
    ports.inbox = inbox.clone();
    let engine = world.engine_on(ports, testkit::harness::test_config("w"), vec![waits_for_approval("t")]);
    world.start_as(&engine, "t", "b", "wf-b").await;
    world.drive(&engine).await.unwrap();
    assert_eq!(world.store.peek("wf-b").unwrap().status, WorkflowStatus::Waiting);
    world.queue.flush();
    let signal = Signal::builder("wf-b", "approved").wait_key("doc:1").signal_id("sig-1").build().unwrap();
    let r = engine.deliver_signal(signal.clone()).await;
    assert!(r.is_err(), "the failed mark is reported to the producer: {r:?}");
    assert_eq!(world.store.peek("wf-b").unwrap().status, WorkflowStatus::Running, "activation committed");
    assert!(world.queue.lane_of("wf-b").is_some(), "the activated instance is enqueued");

    // The producer's retry finds the half-done match: it is finished and the instance is
    // enqueued again (a crash between activation and enqueue leaves it out of the lanes).
    inbox.down.store(false, Ordering::SeqCst);
    world.queue.flush();
    assert_eq!(engine.deliver_signal(signal).await.unwrap(), DeliverOutcome::Activated);
    assert_eq!(inbox.inner.get("sig-1").await.unwrap().unwrap().status, SignalStatus::Matched);
    assert!(world.queue.lane_of("wf-b").is_some(), "the half-done delivery enqueues the instance");
    world.drive(&engine).await.unwrap();
    assert_eq!(world.store.peek("wf-b").unwrap().status, WorkflowStatus::Completed);
}

#[tokio::test]
async fn maintenance_stops_calling_redis_after_its_first_error_in_a_pass() {
    // K-9.2, K-13: timers are facts in the store; with Redis down a pass activates them all
    // there and makes one Redis call, not one per instance; the next pass probes again.
    const N: usize = 20;
    let world = World::new(1);
    let engine = world.engine("w", vec![sleeper("t")]);
    for k in 0..N {
        let req = StartRequest::new("t", format!("b{k}"), json!({})).workflow_id(format!("wf-{k:02}"));
        engine.publisher().start_or_resume(req).await.unwrap();
    }
    let store = world.store.clone();
    let all_waiting = move || store.all().iter().all(|i| i.status == WorkflowStatus::Waiting);
    world.drive_until(&engine, 1_000, &all_waiting).await.unwrap();
    assert!(world.store.all().iter().all(|i| i.status == WorkflowStatus::Waiting));
    world.clock.advance(60_000);

    let redis =
        Arc::new(SlowDownRedis { clock: world.clock.clone(), delay_ms: DurationMs::from_millis(500), calls: 0.into() });
    let mut ports = world.ports();
    ports.queue = redis.clone();
    ports.wakeup = redis.clone();
    let down = world.engine_on(ports, testkit::harness::test_config("w2"), vec![sleeper("t")]);
    let started = world.now();
    let report = down.maintain().await.unwrap();
    assert_eq!(report.activated, N, "every due timer is activated in the store");
    assert!(world.store.all().iter().all(|i| i.status == WorkflowStatus::Running));
    assert_eq!(redis.calls.load(Ordering::SeqCst), 1, "one Redis call per pass during an outage");
    assert!(report.queue_unavailable, "the report says the lanes were skipped");
    assert_eq!(world.now(), started.saturating_add(DurationMs::from_millis(500)), "one slow call of clock time");

    // The next pass probes Redis again (once), and the store fallback claims the work.
    let report = down.maintain().await.unwrap();
    assert!(report.queue_unavailable);
    assert_eq!(redis.calls.load(Ordering::SeqCst), 2, "probed again on the next pass");
    for _ in 0..N {
        assert!(matches!(down.tick_from_store().await.unwrap(), RoundOutcome::Ran { .. }));
    }
    assert!(world.store.all().iter().all(|i| i.status == WorkflowStatus::Completed));
}

/// One failing timer-activation write does not end the maintenance pass: the other due
/// timers are activated, the failure is counted and reported, and the next pass activates
/// the one that failed (K-9.2).
#[tokio::test]
async fn one_failing_timer_activation_does_not_stop_the_pass() {
    let world = World::new(2);
    let engine = world.engine("w", vec![sleeper("t")]);
    for k in 0..3 {
        let req = StartRequest::new("t", format!("b{k}"), json!({})).workflow_id(format!("wf-{k:02}"));
        engine.publisher().start_or_resume(req).await.unwrap();
    }
    let store = world.store.clone();
    let all_waiting = move || store.all().iter().all(|i| i.status == WorkflowStatus::Waiting);
    world.drive_until(&engine, 1_000, &all_waiting).await.unwrap();
    world.clock.advance(60_000);
    let mut ports = world.ports();
    let victim = WorkflowId::from("wf-01");
    ports.store = Arc::new(ApplyHook {
        inner: ports.store.clone(),
        intercept: Box::new(move |id, guard, _| {
            let activation = matches!(guard, kernel_core::transition::Guard::DueWait { .. });
            (*id == victim && activation)
                .then(|| Intercepted::Fail(Error::unavailable("the primary refused this one write")))
        }),
    });
    let troubled = world.engine_on(ports, testkit::harness::test_config("w2"), vec![sleeper("t")]);
    let report = troubled.maintain().await.expect("the pass goes on past one failing write");
    assert_eq!((report.activated, report.item_failures), (2, 1), "{report:?}");
    let waiting: Vec<String> = world
        .store
        .all()
        .iter()
        .filter(|i| i.status == WorkflowStatus::Waiting)
        .map(|i| i.workflow_id.to_string())
        .collect();
    assert_eq!(waiting, ["wf-01"], "only the failed activation is left for the next pass");
    let report = engine.maintain().await.unwrap();
    assert_eq!((report.activated, report.item_failures), (1, 0));
}
