//! Hardening of the paths outside a claim: observations of every committed transition
//! (K-15), re-enqueue wherever an instance becomes claimable (K-13), maintenance that
//! survives undecodable documents and a Redis outage (K-9.2, K-13), and inbox retention
//! that never deletes a signal a wait may still need (K-9.3, K-9.4).

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
use testkit::memory::InMemoryInbox;

fn failing(name: &str) -> Definition {
    Definition::builder(name)
        .step(StepDef::new("only", |_c: ActivityContext| async {
            Err::<StepOutcome, _>(ActivityError::permanent("schema mismatch"))
        }))
        .build()
        .unwrap()
}

#[tokio::test]
async fn hardening_08_replay_and_priority_raise_are_observed() {
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

fn waits_for_approval(name: &str) -> Definition {
    Definition::builder(name)
        .step(StepDef::new("ask", |c: ActivityContext| async move {
            if c.resume().is_some() {
                return Ok(StepOutcome::complete(json!("approved")));
            }
            Ok(StepOutcome::wait_for_signal("approved", "doc:1").into())
        }))
        .build()
        .unwrap()
}

#[tokio::test]
async fn hardening_09_an_activated_wait_is_enqueued_even_when_the_inbox_mark_fails() {
    // K-9.3, K-13: the activation committed, so the instance is claimable; it must be in the
    // lanes and the doorbell rung although marking the record matched failed.
    let world = World::new(1);
    let inbox = Arc::new(MarkFails { inner: InMemoryInbox::new(), down: AtomicBool::new(true), marks: 0.into() });
    let mut ports = world.ports();
    ports.inbox = inbox.clone();
    let engine = world.engine_on(ports, testkit::harness::test_config("w"), vec![waits_for_approval("t")]);
    engine.publisher().start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf-b")).await.unwrap();
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
async fn hardening_15_maintenance_stops_calling_redis_after_its_first_error_in_a_pass() {
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

const DAY_MS: i64 = 24 * 3_600_000;

fn signal(workflow_id: &str, signal_type: &str, generation: u64, id: &str) -> Signal {
    Signal::builder(workflow_id, signal_type).wait_key("doc:1").generation(generation).signal_id(id).build().unwrap()
}

#[tokio::test]
async fn hardening_06_retention_keeps_pending_signals_and_the_duplicate_memory_of_live_workflows() {
    // K-9.3, K-9.4: an early signal for a workflow still busy and the matched record that
    // recognises a producer's redelivery outlive the retention period while the workflow
    // lives.
    let world = World::new(1);
    let engine = world.engine("w", vec![waits_for_approval("t")]);
    let publisher = engine.publisher();
    publisher.start_or_resume(StartRequest::new("t", "a", json!({})).workflow_id("wf-a")).await.unwrap();
    publisher.start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf-b")).await.unwrap();
    world.drive(&engine).await.unwrap();
    // wf-a's wait is matched; the producer keeps the id and may redeliver.
    assert_eq!(engine.deliver_signal(signal("wf-a", "approved", 0, "sig-a")).await.unwrap(), DeliverOutcome::Activated);
    // An early signal for wf-b's next wait (another type): pending until that wait starts.
    assert_eq!(engine.deliver_signal(signal("wf-b", "reviewed", 0, "sig-b")).await.unwrap(), DeliverOutcome::Pending);
    // wf-a runs on (still live: parked on a long claim lease), wf-b waits.
    world.clock.advance(8 * DAY_MS);
    engine.maintain().await.unwrap();
    assert_eq!(
        world.inbox.get("sig-b").await.unwrap().map(|r| r.status),
        Some(SignalStatus::Pending),
        "a pending signal of a live workflow is kept"
    );
    assert_eq!(world.store.peek("wf-a").unwrap().status, WorkflowStatus::Running, "wf-a is live");
    assert!(world.inbox.get("sig-a").await.unwrap().is_some(), "the duplicate memory of a live workflow is kept");
    assert_eq!(
        engine.deliver_signal(signal("wf-a", "approved", 0, "sig-a")).await.unwrap(),
        DeliverOutcome::Duplicate,
        "the redelivery is recognised"
    );
    assert_eq!(
        engine.deliver_signal(signal("wf-b", "approved", 0, "sig-b2")).await.unwrap(),
        DeliverOutcome::Activated,
        "the waiting workflow still wakes"
    );
}

#[tokio::test]
async fn hardening_06_retention_deletes_only_terminal_absent_stale_and_over_cap_records() {
    // K-9.4: what retention may delete, and only once past the retention period.
    let world = World::new(1);
    let config = EngineConfig { matched_signals_per_workflow_max: 2, ..testkit::harness::test_config("w") };
    let engine = world.engine_on(world.ports(), config, vec![waits_for_approval("t")]);
    let publisher = engine.publisher();
    for id in ["wf-done", "wf-live", "wf-many"] {
        publisher.start_or_resume(StartRequest::new("t", id, json!({})).workflow_id(id)).await.unwrap();
    }
    world.drive(&engine).await.unwrap();
    // wf-done: matched, then completed; a stray pending record too.
    engine.deliver_signal(signal("wf-done", "approved", 0, "done-1")).await.unwrap();
    engine.deliver_signal(signal("wf-done", "reviewed", 0, "done-2")).await.unwrap();
    // An orphan: no such workflow.
    assert_eq!(
        engine.deliver_signal(signal("wf-ghost", "approved", 0, "ghost-1")).await.unwrap(),
        DeliverOutcome::Pending
    );
    world.drive(&engine).await.unwrap();
    assert_eq!(world.store.peek("wf-done").unwrap().status, WorkflowStatus::Completed);
    // wf-many: five old matched records (inserted as facts) and its wait on generation 0.
    for k in 0..5 {
        let r = SignalRecord {
            signal_id: format!("many-{k}"),
            workflow_id: "wf-many".into(),
            signal_type: "approved".into(),
            wait_key: "doc:1".into(),
            generation: 0,
            status: SignalStatus::Matched,
            created_at: world.now().saturating_sub(DurationMs::from_millis(k)),
            match_time: Some(world.now()),
            orphan: false,
        };
        world.inbox.insert(r).await.unwrap();
    }
    let before = world.inbox.all().len();
    engine.maintain().await.unwrap();
    assert_eq!(world.inbox.all().len(), before, "nothing is deleted within the retention period");

    world.clock.advance(8 * DAY_MS);
    let report = engine.maintain().await.unwrap();
    let mut left: Vec<String> = world.inbox.all().into_iter().map(|r| r.signal_id).collect();
    left.sort();
    assert_eq!(left, ["many-0", "many-1"], "terminal, absent and over-cap records deleted: {report:?}");
    assert_eq!(report.signals_purged, 6);
    // wf-live's wait is still there and a new signal wakes it.
    assert_eq!(
        engine.deliver_signal(signal("wf-live", "approved", 0, "live-1")).await.unwrap(),
        DeliverOutcome::Activated
    );
}

#[tokio::test]
async fn hardening_06_retention_deletes_pending_records_of_an_older_generation() {
    // K-9.6, K-9.4: a pending record older than the workflow's current wait generation can
    // never match; one of the current or a newer generation is kept.
    let world = World::new(1);
    let def = Definition::builder("t")
        .step(StepDef::new("ask", |c: ActivityContext| async move {
            if c.resume().is_some() {
                return Ok(StepOutcome::complete(json!("ok")));
            }
            Ok(StepOutcome::wait_for_signal("approved", "doc:1").generation(3).into())
        }))
        .build()
        .unwrap();
    let engine = world.engine("w", vec![def]);
    engine.publisher().start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf-b")).await.unwrap();
    world.drive(&engine).await.unwrap();
    for (id, g) in [("old-1", 1), ("old-2", 2), ("next-4", 4)] {
        assert_eq!(engine.deliver_signal(signal("wf-b", "approved", g, id)).await.unwrap(), DeliverOutcome::Pending);
    }
    world.clock.advance(8 * DAY_MS);
    let report = engine.maintain().await.unwrap();
    assert_eq!(report.signals_purged, 2);
    let left: Vec<String> = world.inbox.all().into_iter().map(|r| r.signal_id).collect();
    assert_eq!(left, ["next-4"]);
}

#[tokio::test]
async fn hardening_12_signals_for_an_unknown_workflow_id_are_capped_per_id() {
    // Bounded inbox: pending signals for a workflow id that does not exist are accepted
    // up to orphan_signals_per_workflow_max; one more is a typed error and writes nothing.
    let world = World::new(1);
    let config = EngineConfig { orphan_signals_per_workflow_max: 3, ..testkit::harness::test_config("w") };
    let engine = world.engine_on(world.ports(), config, vec![waits_for_approval("t")]);
    for k in 0..3 {
        let out = engine.deliver_signal(signal("wf-ghost", "approved", 0, &format!("g-{k}"))).await.unwrap();
        assert_eq!(out, DeliverOutcome::Pending);
    }
    let r = engine.deliver_signal(signal("wf-ghost", "approved", 0, "g-3")).await;
    assert!(
        matches!(&r, Err(Error::LimitExceeded { what, max: 3 }) if what == "orphan_signals_per_workflow_max"),
        "{r:?}"
    );
    assert!(world.inbox.get("g-3").await.unwrap().is_none(), "nothing written");
    // A redelivery of a stored one is not a new signal; another id has its own budget.
    assert_eq!(engine.deliver_signal(signal("wf-ghost", "approved", 0, "g-0")).await.unwrap(), DeliverOutcome::Pending);
    assert_eq!(engine.deliver_signal(signal("wf-other", "approved", 0, "o-0")).await.unwrap(), DeliverOutcome::Pending);
    // Signals for an existing workflow are never orphans and never capped this way.
    engine.publisher().start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf-b")).await.unwrap();
    for k in 0..5 {
        engine.deliver_signal(signal("wf-b", "reviewed", 0, &format!("b-{k}"))).await.unwrap();
    }
}

#[tokio::test]
async fn hardening_12_signals_for_unknown_workflow_ids_are_capped_in_total() {
    // Bounded inbox: in total at most orphan_signals_max pending orphans; retention purges
    // them after the retention period, which frees the budget.
    let world = World::new(1);
    let config = EngineConfig { orphan_signals_max: 4, ..testkit::harness::test_config("w") };
    let engine = world.engine_on(world.ports(), config, vec![waits_for_approval("t")]);
    for k in 0..4 {
        engine.deliver_signal(signal(&format!("wf-ghost-{k}"), "approved", 0, &format!("g-{k}"))).await.unwrap();
    }
    let r = engine.deliver_signal(signal("wf-ghost-9", "approved", 0, "g-9")).await;
    assert!(matches!(&r, Err(Error::LimitExceeded { what, max: 4 }) if what == "orphan_signals_max"), "{r:?}");
    assert_eq!(world.inbox.all().len(), 4, "nothing written");
    world.clock.advance(8 * DAY_MS);
    assert_eq!(engine.maintain().await.unwrap().signals_purged, 4, "orphans are purged after retention");
    assert_eq!(
        engine.deliver_signal(signal("wf-ghost-9", "approved", 0, "g-9")).await.unwrap(),
        DeliverOutcome::Pending
    );
}

#[tokio::test]
async fn hardening_12_early_signals_of_a_workflow_that_now_exists_leave_the_orphan_budget() {
    // Bounded inbox: the orphan budget counts signals for workflow ids that do not exist.
    // Early signals kept for a workflow created since (never consumed: its wait is of
    // another type) must not use up the budget of every other unknown id for good.
    let world = World::new(1);
    let config = EngineConfig { orphan_signals_max: 2, ..testkit::harness::test_config("w") };
    let engine = world.engine_on(world.ports(), config, vec![waits_for_approval("t")]);
    for k in 0..2 {
        let out = engine.deliver_signal(signal("wf-x", "reviewed", 0, &format!("x-{k}"))).await.unwrap();
        assert_eq!(out, DeliverOutcome::Pending);
    }
    engine.publisher().start_or_resume(StartRequest::new("t", "x", json!({})).workflow_id("wf-x")).await.unwrap();
    world.drive(&engine).await.unwrap();
    engine.maintain().await.unwrap();
    assert_eq!(
        world.inbox.get("x-0").await.unwrap().map(|r| r.status),
        Some(SignalStatus::Pending),
        "the early signals of the live workflow are kept"
    );
    assert_eq!(
        engine.deliver_signal(signal("wf-y", "approved", 0, "y-0")).await.map_err(|e| e.to_string()),
        Ok(DeliverOutcome::Pending),
        "the budget is free again for an id that does not exist"
    );
}

#[tokio::test]
async fn hardening_06_pending_signals_of_a_live_workflow_are_capped() {
    // K-9.4: pending records of a live workflow that no wait consumes (another type, never
    // awaited) are kept up to pending_signals_per_workflow_max; past retention the oldest
    // beyond it are deleted, the newest kept, and the workflow still wakes.
    let world = World::new(1);
    let config = EngineConfig { pending_signals_per_workflow_max: 2, ..testkit::harness::test_config("w") };
    let engine = world.engine_on(world.ports(), config, vec![waits_for_approval("t")]);
    engine.publisher().start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf-b")).await.unwrap();
    world.drive(&engine).await.unwrap();
    for k in 0..4 {
        let out = engine.deliver_signal(signal("wf-b", "reviewed", 0, &format!("p-{k}"))).await.unwrap();
        assert_eq!(out, DeliverOutcome::Pending);
        world.clock.advance(1);
    }
    engine.maintain().await.unwrap();
    assert_eq!(world.inbox.all().len(), 4, "nothing is deleted within the retention period");
    world.clock.advance(8 * DAY_MS);
    let report = engine.maintain().await.unwrap();
    let mut left: Vec<String> = world.inbox.all().into_iter().map(|r| r.signal_id).collect();
    left.sort();
    assert_eq!(left, ["p-2", "p-3"], "the oldest beyond the cap deleted: {report:?}");
    assert_eq!(report.signals_purged, 2);
    assert_eq!(
        engine.deliver_signal(signal("wf-b", "approved", 0, "a-0")).await.unwrap(),
        DeliverOutcome::Activated,
        "the waiting workflow still wakes"
    );
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
