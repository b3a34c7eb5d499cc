//! The sink and its writer in simulated time (ManualClock) over a fault-injecting
//! repository (K-15, K-1.2), repair and the ops view.

use kernel_core::domain::DurationMs;
use kernel_core::domain::WorkflowStatus;
use kernel_core::ports::{DynClock, Observation, ObservationSink};
use kernel_core::transition::TransitionKind;
use kernel_core::{Definition, Priority, StartRequest, StepDef, StepOutcome};
use observer::conformance::{obs, poison};
use observer::faults::FaultyRepository;
use observer::{
    repair_snapshots, InMemoryObservationRepository, ObservationRepository, Observer, ObserverConfig, OpsView,
    Retention, SnapshotQuery,
};
use serde_json::json;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::harness::World;
use testkit::time::TestTime;

/// Wraps the observer as the engine sees it and proves `emit` returns at once: it counts
/// calls entered and returned (equal after every call: nothing is left suspended), the
/// slowest call, and the largest queue length seen right after an emit.
struct CountingSink {
    inner: Observer,
    entered: AtomicU64,
    returned: AtomicU64,
    slowest_ns: AtomicU64,
    queue_max: AtomicUsize,
}

impl ObservationSink for CountingSink {
    fn enabled(&self) -> bool {
        self.inner.enabled()
    }
    fn emit(&self, o: Observation) {
        self.entered.fetch_add(1, Ordering::SeqCst);
        let t = Instant::now();
        self.inner.emit(o);
        self.slowest_ns.fetch_max(t.elapsed().as_nanos() as u64, Ordering::SeqCst);
        self.queue_max.fetch_max(self.inner.queue_len(), Ordering::SeqCst);
        self.returned.fetch_add(1, Ordering::SeqCst);
    }
}

fn three_steps() -> Definition {
    let step = |name: &'static str| {
        StepDef::new(name, move |_ctx: kernel_core::ActivityContext| async move {
            Ok(StepOutcome::complete(json!({ "step": name })))
        })
    };
    Definition::builder("obs_demo").step(step("fetch")).step(step("compose")).step(step("publish")).build().unwrap()
}

/// Let the writer task run (it is driven by the manual clock, not by real time).
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn outage_never_blocks_emit_workflows_finish_queue_is_bounded_and_kept_batch_is_written() {
    let world = World::new(11);
    let repo = InMemoryObservationRepository::new();
    let faulty = FaultyRepository::new(Arc::new(repo.clone()));
    let config = ObserverConfig {
        queue_capacity: 40,
        batch_size_max: 16,
        flush_interval_ms: DurationMs::from_millis(200),
        retry_backoff_ms: DurationMs::from_millis(100),
        retry_backoff_max_ms: DurationMs::from_millis(1_000),
        drain_timeout_ms: DurationMs::from_millis(5_000),
        ..ObserverConfig::default()
    };
    let (observer, writer) =
        Observer::start(Arc::new(faulty.clone()), world.clock.clone() as Arc<DynClock>, config).unwrap();
    // The observer forwards everything, so the engine builds every observation for it.
    assert!(observer.enabled());
    let counting = Arc::new(CountingSink {
        inner: observer.clone(),
        entered: AtomicU64::new(0),
        returned: AtomicU64::new(0),
        slowest_ns: AtomicU64::new(0),
        queue_max: AtomicUsize::new(0),
    });
    let mut ports = world.ports();
    ports.observer = counting.clone();
    let engine = world.engine_on(ports, testkit::harness::test_config("A"), vec![three_steps()]);

    faulty.set_down(true);
    let publisher = engine.publisher();
    for i in 0..20 {
        let req = StartRequest::new("obs_demo", format!("order-{i}"), json!({})).priority(Priority::P1);
        publisher.start_or_resume(req).await.unwrap();
    }
    world.drive(&engine).await.unwrap();
    // Let the writer try (and fail) a few times in simulated time.
    for _ in 0..5 {
        world.clock.advance(300);
        settle().await;
    }

    // Every workflow finished although nothing could be written (K-1.2).
    let all = world.store.all();
    assert_eq!(all.len(), 20);
    assert!(all.iter().all(|i| i.status == WorkflowStatus::Completed));
    let emitted = counting.entered.load(Ordering::SeqCst);
    assert_eq!(emitted, counting.returned.load(Ordering::SeqCst), "no emit left suspended");
    assert!(
        counting.slowest_ns.load(Ordering::SeqCst) < Duration::from_millis(50).as_nanos() as u64,
        "emit returned at once"
    );
    let s = observer.stats();
    assert!(counting.queue_max.load(Ordering::SeqCst) <= 40, "queue never exceeds its capacity");
    assert!(s.queue_len <= 40);
    assert_eq!(s.accepted + s.dropped, emitted, "every event accepted or counted as dropped");
    assert!(s.dropped > 0, "the outage overflowed the queue: {s:?}");
    assert_eq!(s.written, 0);
    assert!(s.write_failures >= 2, "the writer retried while down: {s:?}");
    let attempted = faulty.batches();
    assert!(attempted.iter().all(|(ok, _)| !ok));
    let kept = attempted[0].1.clone();
    assert_eq!(kept.len(), 16);
    assert!(attempted.iter().all(|(_, b)| *b == kept), "the same batch is kept and retried");

    // The outage ends: the kept batch is written first, then the queue.
    faulty.set_down(false);
    world.clock.advance(1_000);
    settle().await;
    let accepted = s.accepted;
    let stats = writer.close().await;
    let after = faulty.batches();
    let first_ok = after.iter().find(|(ok, _)| *ok).expect("a write after the outage");
    assert_eq!(first_ok.1, kept, "the kept batch is written first");
    assert_eq!(stats.written, accepted, "{stats:?}");
    assert_eq!(stats.poison, 0);
    for o in &kept {
        let snap = repo.snapshot(&o.biz_key).await.unwrap().expect("snapshot of a kept event");
        assert!(snap.revision >= o.revision);
    }
}

#[tokio::test]
async fn poison_in_a_batch_of_100_is_isolated_by_bisection() {
    let world = World::new(1);
    let repo = InMemoryObservationRepository::new();
    let faulty = FaultyRepository::new(Arc::new(repo.clone()));
    let config = ObserverConfig { queue_capacity: 200, batch_size_max: 100, ..ObserverConfig::default() };
    let (observer, writer) =
        Observer::start(Arc::new(faulty.clone()), world.clock.clone() as Arc<DynClock>, config).unwrap();
    for i in 0..100u64 {
        if i == 37 {
            observer.emit(poison(&format!("k{i}"), 1));
        } else {
            observer.emit(obs(&format!("k{i}"), 1, TransitionKind::MarkRunning, Some("s1"), 1));
        }
    }
    writer.flush().await.unwrap();
    let s = observer.stats();
    assert_eq!((s.written, s.poison), (99, 1), "{s:?}");
    assert_eq!(repo.snapshot_count(), 99);
    assert_eq!(repo.attempt_count(), 99);
    assert!(repo.snapshot("k37").await.unwrap().is_none());
    // One batch of 100, then a bisection: about 2·log2(100) writes, not 100.
    let writes = faulty.batches().len();
    assert!(writes <= 16, "bisection took {writes} writes");
    writer.close().await;
}

#[tokio::test]
async fn batches_are_written_by_size_or_by_interval_on_the_clock() {
    let world = World::new(2);
    let repo = InMemoryObservationRepository::new();
    let faulty = FaultyRepository::new(Arc::new(repo.clone()));
    let config = ObserverConfig {
        batch_size_max: 10,
        flush_interval_ms: DurationMs::from_millis(1_000),
        ..ObserverConfig::default()
    };
    let (observer, writer) =
        Observer::start(Arc::new(faulty.clone()), world.clock.clone() as Arc<DynClock>, config).unwrap();
    for i in 0..3u64 {
        observer.emit(obs("x", i + 1, TransitionKind::MarkRunning, Some("s1"), 1));
    }
    settle().await;
    assert_eq!(faulty.batches().len(), 0, "not due yet");
    world.clock.advance(999);
    settle().await;
    assert_eq!(faulty.batches().len(), 0);
    world.clock.advance(1);
    settle().await;
    assert_eq!(faulty.batches().iter().map(|(_, b)| b.len()).collect::<Vec<_>>(), [3], "interval flush");
    for i in 0..10u64 {
        observer.emit(obs("y", i + 1, TransitionKind::MarkRunning, Some("s1"), 1));
    }
    settle().await;
    assert_eq!(faulty.batches().iter().map(|(_, b)| b.len()).collect::<Vec<_>>(), [3, 10], "size flush");
    let stats = writer.close().await;
    assert_eq!(stats.written, 13);
}

#[tokio::test]
async fn close_abandons_only_after_the_drain_timeout_while_down() {
    let world = World::new(3);
    let faulty = FaultyRepository::new(Arc::new(InMemoryObservationRepository::new()));
    let config = ObserverConfig {
        drain_timeout_ms: DurationMs::from_millis(2_000),
        retry_backoff_ms: DurationMs::from_millis(100),
        ..ObserverConfig::default()
    };
    let (observer, writer) =
        Observer::start(Arc::new(faulty.clone()), world.clock.clone() as Arc<DynClock>, config).unwrap();
    faulty.set_down(true);
    for i in 0..5u64 {
        observer.emit(obs("z", i + 1, TransitionKind::MarkRunning, Some("s1"), 1));
    }
    let clock = world.clock.clone();
    let ticker = tokio::spawn(async move {
        for _ in 0..100 {
            clock.advance(100);
            settle().await;
        }
    });
    let stats = writer.close().await;
    ticker.await.unwrap();
    assert_eq!((stats.written, stats.abandoned), (0, 5), "{stats:?}");
}

#[tokio::test]
async fn repair_rebuilds_finished_snapshots_and_ops_view_never_needs_the_store() {
    let world = World::new(4);
    let engine = world.engine("A", vec![three_steps()]);
    let publisher = engine.publisher();
    let mut ids = Vec::new();
    for i in 0..3 {
        let out = publisher.start_or_resume(StartRequest::new("obs_demo", format!("r-{i}"), json!({}))).await.unwrap();
        ids.push(out.instance.workflow_id);
    }
    world.drive(&engine).await.unwrap();
    // One more that has not run: repair leaves it alone.
    let pending = publisher.start_or_resume(StartRequest::new("obs_demo", "r-pending", json!({}))).await.unwrap();
    ids.push(pending.instance.workflow_id);
    ids.push("no-such-id".into());
    let repo = InMemoryObservationRepository::new();
    // A stale live snapshot of r-0 is replaced; a newer one would not be.
    repo.write_batch(&[obs("r-0", 1, TransitionKind::Create, None, 0)]).await.unwrap();
    let report = repair_snapshots(&world.store, &repo, &ids).await.unwrap();
    assert_eq!((report.rebuilt, report.current, report.unfinished, report.missing), (3, 0, 1, 1));
    let s = repo.snapshot("r-0").await.unwrap().unwrap();
    assert_eq!(s.status, WorkflowStatus::Completed);
    assert_eq!(s.steps.len(), 3);
    // Idempotent: repairing again writes the same snapshots.
    repair_snapshots(&world.store, &repo, &ids).await.unwrap();
    assert_eq!(repo.snapshot("r-0").await.unwrap().unwrap(), s);
    // A live snapshot newer than the instance read is never overwritten.
    let mut newer = obs("r-1", 1_000, TransitionKind::Create, None, 0);
    newer.workflow_id = ids[1].clone();
    repo.write_batch(&[newer]).await.unwrap();
    assert_eq!(repair_snapshots(&world.store, &repo, &ids[1..2]).await.unwrap().current, 1);

    // The ops view: projection + queue statistics only (it holds no store handle).
    let view = OpsView::new(Arc::new(repo.clone()), Arc::new(world.queue.clone()), world.clock.clone());
    assert_eq!(view.by_status(WorkflowStatus::Completed).await.unwrap().len(), 2);
    assert_eq!(view.by_type("obs_demo", None).await.unwrap().len(), 2);
    assert_eq!(view.by_type("summary", None).await.unwrap().len(), 1);
    assert_eq!(view.by_step("publish").await.unwrap().len(), 2);
    let now = world.now();
    assert_eq!(view.in_window(now.plus(1), now.plus(2)).await.unwrap().len(), 0);
    assert_eq!(view.snapshots(&SnapshotQuery { limit: 1, ..Default::default() }).await.unwrap().len(), 1);
    let lanes = view.lane_stats().await.unwrap();
    assert_eq!(lanes[2].depth, 1, "the pending instance waits in P2");
}

/// The signal type a workflow waits on reaches its snapshot through the engine's own
/// observations and leaves it once the signal wakes the workflow (K-15, K-9.3); a snapshot
/// rebuilt from the instance says the same.
#[tokio::test]
async fn the_snapshot_knows_which_signal_a_workflow_waits_on() {
    let world = World::new(5);
    let ask = StepDef::new("ask", |c: kernel_core::ActivityContext| async move {
        if c.resume().is_some() {
            return Ok(StepOutcome::complete(json!("approved")));
        }
        Ok(StepOutcome::wait_for_signal("approved", "doc-1").into())
    });
    let engine = world.engine("A", vec![Definition::builder("approval").step(ask).build().unwrap()]);
    let out = engine.publisher().start_or_resume(StartRequest::new("approval", "doc-1", json!({}))).await.unwrap();
    let id = out.instance.workflow_id.clone();
    world.drive(&engine).await.unwrap();
    let inst = world.store.peek(id.as_str()).unwrap();
    assert_eq!(inst.status, WorkflowStatus::Waiting);

    let events = world.observations.events();
    let waits: Vec<(TransitionKind, Option<&str>)> =
        events.iter().map(|o| (o.kind, o.wait_signal.as_deref())).collect();
    assert!(waits.contains(&(TransitionKind::SuspendClaim, Some("approved"))), "{waits:?}");
    assert!(waits.iter().all(|(k, w)| (*k == TransitionKind::SuspendClaim) == w.is_some()), "{waits:?}");
    let repo = InMemoryObservationRepository::new();
    repo.write_batch(&events).await.unwrap();
    let snap = repo.snapshot("doc-1").await.unwrap().unwrap();
    assert_eq!(snap.wait_signal.as_deref(), Some("approved"));
    assert_eq!(observer::Snapshot::from_instance(&inst).wait_signal.as_deref(), Some("approved"));
    let q = SnapshotQuery { waiting_on: Some("approved".into()), ..Default::default() };
    assert_eq!(repo.find_snapshots(&q).await.unwrap().len(), 1);
    let view = OpsView::new(Arc::new(repo.clone()), Arc::new(world.queue.clone()), world.clock.clone());
    let waiting = view.waiting_on("approved").await.unwrap();
    assert_eq!(waiting.iter().map(|s| s.workflow_id.as_str()).collect::<Vec<_>>(), [id.as_str()]);
    assert!(view.waiting_on("paid").await.unwrap().is_empty());
    // The console records what the operator does about it; the view reads it back.
    let entry = observer::conformance::audit_entry("op-1", 0, "alice", "signal.deliver", id.as_str());
    repo.append_audit(&entry).await.unwrap();
    let by_target = observer::AuditQuery { target: Some(id.as_str().into()), ..Default::default() };
    assert_eq!(view.audit(&by_target).await.unwrap(), [entry]);

    let signal = kernel_core::ports::Signal {
        signal_id: "sig-1".into(),
        workflow_id: id.clone(),
        signal_type: "approved".into(),
        wait_key: "doc-1".into(),
        generation: 0,
    };
    engine.deliver_signal(signal).await.unwrap();
    world.drive(&engine).await.unwrap();
    let inst = world.store.peek(id.as_str()).unwrap();
    assert_eq!(inst.status, WorkflowStatus::Completed);
    repo.write_batch(&world.observations.events()).await.unwrap();
    let snap = repo.snapshot("doc-1").await.unwrap().unwrap();
    assert_eq!((snap.status, snap.wait_signal), (WorkflowStatus::Completed, None));
    assert!(repo.find_snapshots(&q).await.unwrap().is_empty());
    assert_eq!(observer::Snapshot::from_instance(&inst).wait_signal, None);
}

/// Retention (nothing grows without bound): on the clock, the writer deletes snapshots and
/// attempt rows of workflows finished longer ago than `finished_ms` and audit entries older
/// than `audit_ms`, a page per pass, bringing the next pass forward while pages come back
/// full; live workflows stay; a failed pass is counted apart from the writes and retried at
/// the next interval; batches are written as before.
#[tokio::test]
async fn retention_purges_finished_workflows_and_old_audit_on_the_clock() {
    let clock = Arc::new(testkit::memory::ManualClock::new(observer::conformance::T0));
    let repo = InMemoryObservationRepository::new();
    let faulty = FaultyRepository::new(Arc::new(repo.clone()));
    // Five finished workflows (at T0+2s..T0+6s), one still running since T0+1s, each with
    // one attempt row; two audit entries (T0, T0+1s).
    let mut seed = vec![obs("live", 1, TransitionKind::MarkRunning, Some("s1"), 0)];
    for (i, key) in ["f1", "f2", "f3", "f4", "f5"].into_iter().enumerate() {
        seed.push(obs(key, 1, TransitionKind::MarkRunning, Some("s1"), 0));
        seed.push(obs(key, 2 + i as u64, TransitionKind::Completed, Some("s1"), 0));
    }
    repo.write_batch(&seed).await.unwrap();
    for (id, ms) in [("a1", 0), ("a2", 1_000)] {
        repo.append_audit(&observer::conformance::audit_entry(id, ms, "alice", "task.decide", "t")).await.unwrap();
    }
    assert_eq!((repo.snapshot_count(), repo.attempt_count()), (6, 6));
    let hour = DurationMs::from_millis(3_600_000);
    let retention = Retention {
        finished_ms: DurationMs::from_millis(10_000),
        audit_ms: DurationMs::from_millis(20_000),
        interval_ms: hour,
        page: 2,
    };
    let config = ObserverConfig {
        flush_interval_ms: DurationMs::from_millis(200),
        retention: Some(retention),
        ..ObserverConfig::default()
    };
    let (observer, writer) = Observer::start(Arc::new(faulty.clone()), clock.clone() as Arc<DynClock>, config).unwrap();
    settle().await;
    let stats = observer.stats();
    assert_eq!((stats.purged_finished, stats.purged_audit, stats.retention_failures), (0, 0, 0), "nothing old at T0");

    faulty.set_down(true);
    clock.advance(hour);
    settle().await;
    assert_eq!(observer.stats().retention_failures, 2, "both purges of the pass failed");
    assert_eq!(observer.stats().write_failures, 0, "and no write failed");
    assert_eq!(repo.snapshot_count(), 6);

    faulty.set_down(false);
    clock.advance(hour);
    settle().await;
    let stats = observer.stats();
    assert_eq!((stats.purged_finished, stats.purged_audit), (2, 2), "one page of each");
    // Full pages: the next passes follow after one flush interval, not an hour.
    clock.advance(DurationMs::from_millis(200));
    settle().await;
    assert_eq!(observer.stats().purged_finished, 4);
    observer.emit(obs("new", 1, TransitionKind::MarkRunning, Some("s1"), 0));
    clock.advance(DurationMs::from_millis(200));
    settle().await;
    assert_eq!(observer.stats().purged_finished, 5);
    clock.advance(DurationMs::from_millis(200));
    settle().await;
    assert_eq!(observer.stats().written, 1, "the batch between passes was written");
    clock.advance(DurationMs::from_millis(200));
    settle().await;
    let stats = writer.close().await;
    assert_eq!((stats.purged_finished, stats.purged_audit, stats.retention_failures), (5, 2, 2));
    // Read back from the repository itself: only the live workflows and their rows remain.
    assert_eq!((repo.snapshot_count(), repo.attempt_count()), (2, 2));
    assert!(repo.snapshot("live").await.unwrap().is_some() && repo.snapshot("new").await.unwrap().is_some());
    let audit = repo.find_audit(&observer::AuditQuery::default()).await.unwrap();
    assert!(audit.is_empty(), "{audit:?}");
}

/// A retention page or time the repository could not honour is refused when the observer
/// starts, naming the field.
#[test]
fn retention_limits_are_checked() {
    let bad = |r: Retention| ObserverConfig { retention: Some(r), ..ObserverConfig::default() }.validate();
    let field = |r: observer::Result<()>| match r {
        Err(observer::Error::InvalidInput { field, .. }) => field,
        other => panic!("expected InvalidInput, got {other:?}"),
    };
    assert_eq!(field(bad(Retention { page: 0, ..Retention::default() })), "retention.page");
    assert_eq!(field(bad(Retention { page: 1_001, ..Retention::default() })), "retention.page");
    assert_eq!(field(bad(Retention { interval_ms: DurationMs::ZERO, ..Retention::default() })), "retention");
    assert_eq!(field(bad(Retention { finished_ms: DurationMs::from_millis(-1), ..Retention::default() })), "retention");
    assert!(ObserverConfig { retention: None, ..ObserverConfig::default() }.validate().is_ok());
}
