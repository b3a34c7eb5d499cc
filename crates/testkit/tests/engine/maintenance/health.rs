//! `RunningEngine::health`: wakeup or polling, the last maintenance pass, running claims,
//! in simulated time.

use crate::support::settle;
use kernel_core::engine::{EngineHealth, MaintenancePass, MaintenanceReport, WakeupState};
use kernel_core::ports::*;
use kernel_core::WorkflowId;
use kernel_core::*;
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use testkit::harness::{test_config, World};
use testkit::memory::InMemoryInbox;

/// A doorbell nobody can subscribe to (Redis pub/sub down at start).
struct DeafWakeup;

#[async_trait::async_trait]
impl Wakeup for DeafWakeup {
    async fn notify(&self) -> Result<()> {
        Ok(())
    }
    async fn subscribe(&self) -> Result<WakeupReceiver> {
        Err(Error::unavailable("pub/sub down"))
    }
}

/// An inbox whose scans fail while `down` is set.
struct FlakyInbox {
    inner: InMemoryInbox,
    down: AtomicBool,
}

#[async_trait::async_trait]
impl SignalInbox for FlakyInbox {
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
        self.inner.mark_matched(signal_id, now).await
    }
    async fn scan_pending(&self, after: Option<&str>, limit: usize) -> Result<SignalPage> {
        if self.down.load(Ordering::SeqCst) {
            return Err(Error::unavailable("inbox down"));
        }
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

#[tokio::test]
async fn health_reports_polling_fallback_maintenance_passes_and_running_claims() {
    // K-13 (wakeup, poll fallback, maintenance), K-6.1 (slots), K-6.6 (stopping)
    let world = World::new(1);
    let gate = Arc::new(tokio::sync::Notify::new());
    let g = gate.clone();
    let activity = move |_c: ActivityContext| {
        let g = g.clone();
        async move {
            g.notified().await;
            Ok(StepOutcome::complete(json!(1)))
        }
    };
    let def = Definition::builder("t").step(StepDef::new("only", activity).timeout_ms(3_600_000)).build().unwrap();
    let inbox = Arc::new(FlakyInbox { inner: InMemoryInbox::new(), down: AtomicBool::new(false) });
    let mut ports = world.ports();
    ports.wakeup = Arc::new(DeafWakeup);
    ports.inbox = inbox.clone();
    let engine = world.engine_on(ports, test_config("w"), vec![def]);
    let config = engine.config().clone();
    let running = engine.spawn();
    settle().await;
    assert_eq!(
        running.health(),
        EngineHealth {
            wakeup: WakeupState::Polling,
            last_maintenance: None,
            claims_running: 0,
            stopping: false,
            quarantined: vec![],
            undecodable_signals: vec![],
        }
    );

    world.clock.advance(config.rebuild_interval_ms);
    settle().await;
    let pass = MaintenancePass { finished_at: world.now(), outcome: Ok(MaintenanceReport::default()) };
    assert_eq!(running.health().last_maintenance, Some(pass));

    // A pass whose inbox parts failed is reported with the parts it skipped (the rest of
    // the pass ran); the next good one replaces it.
    inbox.down.store(true, Ordering::SeqCst);
    world.clock.advance(config.rebuild_interval_ms);
    settle().await;
    let last = running.health().last_maintenance.unwrap();
    assert_eq!(last.finished_at, world.now());
    assert_eq!(last.outcome.unwrap().phases_failed, ["signal_repair"]);
    inbox.down.store(false, Ordering::SeqCst);

    // Without the doorbell, a start is noticed at the next poll.
    world.start_as(&engine, "t", "b", "wf-b").await;
    settle().await;
    assert_eq!(running.health().claims_running, 0, "not noticed before the poll");
    world.clock.advance(config.poll_interval_ms);
    settle().await;
    assert_eq!(running.health().claims_running, 1);
    gate.notify_one();
    settle().await;
    assert_eq!(running.health().claims_running, 0);
    assert_eq!(world.store.peek("wf-b").unwrap().status, WorkflowStatus::Completed);
    assert!(running.shutdown().await);
}

#[tokio::test]
async fn health_reports_a_subscribed_wakeup() {
    // K-13
    let world = World::new(1);
    let engine = world.engine("w", vec![crate::linear("t", 1, false)]);
    let running = engine.spawn();
    settle().await;
    let h = running.health();
    assert_eq!((h.wakeup, h.claims_running, h.stopping), (WakeupState::Subscribed, 0, false));
    // The doorbell alone (no clock move) gets a start claimed and run.
    world.start_as(&engine, "t", "b", "wf-b").await;
    settle().await;
    assert_eq!(world.store.peek("wf-b").unwrap().status, WorkflowStatus::Completed);
    assert!(running.shutdown().await);
}
