//! A real Redis outage: a dedicated `redis-server` is killed mid-run, the engines keep
//! completing workflows through the store fallback (`claim_any`, K-6.7), the server comes
//! back empty and the rebuild scan restores the lanes (K-13).
//!
//! This test runs partly on wall time (the client's reconnects): short leases, a bounded
//! run, and assertions on counts only, never on durations. Every figure comes from an
//! oracle independent of the engines: the store read after the run, the audit of every
//! store write, and the lanes read from Redis.

use kernel_core::domain::*;
use kernel_core::engine::{Engine, EngineConfig, Ports, RunningEngine};
use kernel_core::ports::*;
use kernel_core::{ActivityContext, Definition, StartRequest, StepDef, StepOutcome};
use queue_redis::test_support::{unique_prefix, DedicatedRedis};
use queue_redis::{LaneWeights, RedisConnection};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use testkit::faults::{AuditOutcome, AuditStore, WriteOp};
use testkit::memory::{InMemoryInbox, InMemoryPermits, InMemoryStore};

/// Workflows started in each phase (Redis up, Redis down, Redis back).
const PER_PHASE: usize = 8;
/// Longest wait for a phase to finish: a bound on the run, not a measurement.
const PHASE_WAIT_MS: u64 = 60_000;

fn two_steps() -> Definition {
    Definition::builder("t")
        .step(StepDef::new("a", |_c: ActivityContext| async { Ok(StepOutcome::complete(json!(1))) }))
        .step(StepDef::new("b", |_c: ActivityContext| async { Ok(StepOutcome::complete(json!(2))) }))
        .build()
        .expect("valid")
}

fn config(worker: &str) -> EngineConfig {
    EngineConfig {
        worker_id: worker.into(),
        worker_slots: 2,
        lease_ms: DurationMs::from_millis(3_000),
        heartbeat_ms: DurationMs::from_millis(1_000),
        heartbeat_deadline_ms: DurationMs::from_millis(1_000),
        poll_interval_ms: DurationMs::from_millis(100),
        rebuild_interval_ms: DurationMs::from_millis(300),
        signal_repair_interval_ms: DurationMs::from_millis(1_000),
        shutdown_timeout_ms: DurationMs::from_millis(10_000),
        ..EngineConfig::default()
    }
}

struct Rig {
    store: InMemoryStore,
    audit: AuditStore,
    conn: RedisConnection,
    prefix: String,
    ports: Ports,
}

impl Rig {
    fn engine(&self, worker: &str) -> Engine {
        Engine::builder(self.ports.clone()).config(config(worker)).register(two_steps()).build().expect("engine")
    }

    fn completed(&self) -> usize {
        self.store.all().iter().filter(|i| i.status == WorkflowStatus::Completed).count()
    }

    /// Instances the rebuild scan must put in the lanes: running or failing with a
    /// `claimable_time`, read from the store alone.
    fn claimable_in_store(&self) -> usize {
        self.store
            .all()
            .iter()
            .filter(|i| matches!(i.status, WorkflowStatus::Running | WorkflowStatus::Failing))
            .filter(|i| i.claimable_time.is_some())
            .count()
    }

    /// Members of the four lanes, read from Redis alone.
    async fn lane_depth(&self) -> kernel_core::Result<u64> {
        let queue = self.conn.ready_queue(&self.prefix, LaneWeights::default())?;
        Ok(queue.stats(SystemClock.now()).await?.iter().map(|l| l.depth).sum())
    }

    /// Store-fallback claims that won an instance, from the audit of every store write.
    fn claim_any_won(&self) -> usize {
        self.audit
            .log()
            .iter()
            .filter(|w| w.op == WriteOp::ClaimAny && matches!(w.outcome, AuditOutcome::Applied { .. }))
            .count()
    }

    async fn start(&self, publisher: &kernel_core::Publisher, from: usize) {
        for k in from..from + PER_PHASE {
            let req = StartRequest::new("t", format!("b{k}"), json!({ "k": k })).workflow_id(format!("wf-{k:03}"));
            publisher.start_or_resume(req).await.expect("the store takes the start whatever Redis does");
        }
    }

    async fn wait_completed(&self, n: usize, what: &str) {
        let deadline = std::time::Instant::now() + Duration::from_millis(PHASE_WAIT_MS);
        while self.completed() < n {
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: {} of {n} completed within the bound; claim_any={}",
                self.completed(),
                self.claim_any_won()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn stop_all(engines: Vec<RunningEngine>) {
    for e in engines {
        assert!(e.shutdown().await, "a clean shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_engines_complete_through_the_store_and_lanes_are_rebuilt() {
    let Some(mut redis) = DedicatedRedis::start("redis_outage") else { return };
    let conn = RedisConnection::open(&redis.url).await.expect("connect");
    let prefix = unique_prefix("outage");
    let store = InMemoryStore::new();
    let audit = AuditStore::new(Arc::new(store.clone()));
    let clock: Arc<DynClock> = Arc::new(SystemClock);
    let ports = Ports::builder()
        .store(Arc::new(audit.clone()))
        .inbox(Arc::new(InMemoryInbox::new()))
        .queue(Arc::new(conn.ready_queue(&prefix, LaneWeights::default()).expect("queue")))
        .wakeup(Arc::new(conn.wakeup(&prefix).expect("wakeup")))
        .permits(Arc::new(InMemoryPermits::new(clock.clone(), HashMap::new(), DurationMs::from_secs(30))))
        .clock(clock)
        .build()
        .expect("ports");
    let rig = Rig { store, audit, conn, prefix, ports };
    let publisher = rig.engine("api").publisher();

    // Redis up: the lanes carry the work.
    let engines = vec![rig.engine("w1").spawn(), rig.engine("w2").spawn()];
    rig.start(&publisher, 0).await;
    rig.wait_completed(PER_PHASE, "redis up").await;
    let claim_any_before = rig.claim_any_won();

    // Redis killed mid-run: starts still land in the store, the engines claim from it.
    redis.kill();
    rig.start(&publisher, PER_PHASE).await;
    rig.wait_completed(2 * PER_PHASE, "redis down").await;
    let claim_any_down = rig.claim_any_won() - claim_any_before;
    assert!(claim_any_down >= PER_PHASE, "the store fallback claimed the work: {claim_any_down}");
    stop_all(engines).await;

    // Redis back, empty. Instances whose enqueue was lost wait in the store only.
    redis.restart().expect("restart redis-server");
    let lost = 2 * PER_PHASE..3 * PER_PHASE;
    for k in lost.clone() {
        let req = StartRequest::new("t", format!("b{k}"), json!({ "k": k })).workflow_id(format!("wf-{k:03}"));
        // A publisher whose queue is gone: the instance is a fact in the store only.
        let offline = kernel_core::Publisher::builder(
            rig.ports.store.clone(),
            Arc::new(testkit::memory::InMemoryQueue::default()),
            Arc::new(testkit::memory::InMemoryWakeup::new()),
        )
        .plan(two_steps().plan().clone())
        .build()
        .expect("publisher");
        offline.start_or_resume(req).await.expect("start");
    }
    // One maintenance pass after the client reconnected rebuilds the lanes (bounded tries:
    // a pass while the client still reconnects reports the queue unavailable).
    let maintainer = rig.engine("maint");
    let mut tries = 0;
    loop {
        tries += 1;
        let report = maintainer.maintain().await.expect("maintenance pass");
        if !report.queue_unavailable && report.enqueued == PER_PHASE {
            break;
        }
        assert!(tries < 200, "the lanes were never rebuilt: {report:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lane_depth = rig.lane_depth().await.expect("lane stats");
    let claimable_in_store = rig.claimable_in_store();
    assert_eq!(lane_depth as usize, claimable_in_store, "the rebuilt lanes hold exactly the claimable instances");
    assert_eq!(claimable_in_store, PER_PHASE);

    // And the engines run them from the rebuilt lanes.
    let engines = vec![rig.engine("w1").spawn(), rig.engine("w2").spawn()];
    rig.wait_completed(3 * PER_PHASE, "redis back").await;
    stop_all(engines).await;

    let workflows = rig.store.all().len();
    let completed = rig.completed();
    let duplicate_completions = rig.audit.counts().duplicate_step_completions();
    assert_eq!(rig.audit.log_dropped(), 0, "every write audited");
    println!(
        "redis-down: workflows={workflows} completed={completed} duplicate_completions={duplicate_completions} \
         claim_any={claim_any_down} lane_depth={lane_depth} claimable_in_store={claimable_in_store}"
    );
    assert_eq!((workflows, completed), (3 * PER_PHASE, 3 * PER_PHASE));
    assert_eq!(duplicate_completions, 0);
    let _ = rig.conn.purge_prefix(&rig.prefix).await;
}
