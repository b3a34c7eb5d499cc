//! Hardware-independent costs of the happy path, pinned so a regression fails without a
//! timing: store calls per method, whole-instance copies and observations per completed
//! four-step linear workflow (K-7.1, K-15).
//!
//! The engine runs on a current-thread runtime (the instance copy counter is per thread)
//! through [`Engine::tick`] on a manual clock that never moves, so no heartbeat falls due
//! and no maintenance pass runs: only the claims' own work is counted.

use kernel_core::domain::instance_clones_on_this_thread;
use kernel_core::engine::{ClaimEnd, Engine, RoundOutcome};
use kernel_core::ports::*;
use kernel_core::transition::{Guard, Transition};
use kernel_core::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use testkit::harness::{test_config, World};

/// Workflows run per measurement; every total is divided by it (and must divide evenly).
const WORKFLOWS: u64 = 4;

/// Counts every store call by method, and the instance copies made inside the store (the
/// in-memory adapter copies a document on every write and read), so the engine's own
/// copies are the rest.
struct CountingStore {
    inner: Arc<DynStore>,
    calls: Mutex<BTreeMap<&'static str, u64>>,
    store_clones: AtomicU64,
}

impl CountingStore {
    fn new(inner: Arc<DynStore>) -> Self {
        CountingStore { inner, calls: Mutex::default(), store_clones: AtomicU64::new(0) }
    }
    async fn count<T>(&self, method: &'static str, call: impl std::future::Future<Output = T>) -> T {
        *self.calls.lock().unwrap().entry(method).or_insert(0) += 1;
        let before = instance_clones_on_this_thread();
        let r = call.await;
        self.store_clones.fetch_add(instance_clones_on_this_thread() - before, Ordering::SeqCst);
        r
    }
    fn reset(&self) {
        self.calls.lock().unwrap().clear();
        self.store_clones.store(0, Ordering::SeqCst);
    }
    fn calls(&self) -> BTreeMap<&'static str, u64> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl WorkflowStore for CountingStore {
    async fn create(&self, instance: WorkflowInstance) -> Result<CreateOutcome> {
        self.count("create", self.inner.create(instance)).await
    }
    async fn get(&self, workflow_id: &WorkflowId) -> Result<Option<WorkflowInstance>> {
        self.count("get", self.inner.get(workflow_id)).await
    }
    async fn get_by_biz_key(&self, biz_key: &str) -> Result<Option<WorkflowInstance>> {
        self.count("get_by_biz_key", self.inner.get_by_biz_key(biz_key)).await
    }
    async fn claim(&self, workflow_id: &WorkflowId, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        self.count("claim", self.inner.claim(workflow_id, spec)).await
    }
    async fn claim_any(&self, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        self.count("claim_any", self.inner.claim_any(spec)).await
    }
    async fn apply(&self, workflow_id: &WorkflowId, guard: &Guard, transition: &Transition) -> Result<WriteOutcome> {
        self.count("apply", self.inner.apply(workflow_id, guard, transition)).await
    }
    async fn scan_due_waits(&self, now: Instant, after: Option<&DueCursor>, limit: usize) -> Result<ScanPage<DueWait>> {
        self.count("scan_due_waits", self.inner.scan_due_waits(now, after, limit)).await
    }
    async fn scan_claimable(&self, after: Option<&WorkflowId>, limit: usize) -> Result<ScanPage<Candidate>> {
        self.count("scan_claimable", self.inner.scan_claimable(after, limit)).await
    }
}

/// Counts the observations handed to it; `enabled` is its answer to the engine.
struct CountingSink {
    enabled: bool,
    emitted: AtomicU64,
}

impl CountingSink {
    fn new(enabled: bool) -> Arc<Self> {
        Arc::new(CountingSink { enabled, emitted: AtomicU64::new(0) })
    }
}

impl ObservationSink for CountingSink {
    fn enabled(&self) -> bool {
        self.enabled
    }
    fn emit(&self, _obs: Observation) {
        self.emitted.fetch_add(1, Ordering::SeqCst);
    }
}

/// What `WORKFLOWS` happy-path workflows cost, in total.
#[derive(Debug)]
struct Costs {
    store_calls: BTreeMap<&'static str, u64>,
    engine_clones: u64,
    store_clones: u64,
    observations: u64,
}

async fn measure(sink: Arc<CountingSink>) -> Costs {
    let world = World::new(1);
    let store = Arc::new(CountingStore::new(world.durable.clone()));
    let mut ports = world.ports();
    ports.store = store.clone();
    ports.observer = sink.clone();
    let engine: Engine = world.engine_on(ports, test_config("w"), vec![crate::linear("linear4", 4, false)]);
    for i in 0..WORKFLOWS {
        let req = StartRequest::new("linear4", format!("b-{i}"), json!({"n": i})).workflow_id(format!("wf-{i}"));
        engine.publisher().start_or_resume(req).await.unwrap();
    }
    // Count from the claims on: the creates belong to the publisher.
    store.reset();
    sink.emitted.store(0, Ordering::SeqCst);
    let clones_before = instance_clones_on_this_thread();
    let mut completed = 0;
    loop {
        match engine.tick().await.unwrap() {
            RoundOutcome::Ran { end, .. } => {
                assert_eq!(end, ClaimEnd::Terminal(WorkflowStatus::Completed));
                completed += 1;
            }
            RoundOutcome::Idle { stale: 0 } => break,
            other => panic!("unexpected round {other:?}"),
        }
    }
    let clones = instance_clones_on_this_thread() - clones_before;
    assert_eq!(completed, WORKFLOWS);
    for inst in world.store.all() {
        assert_eq!(inst.status, WorkflowStatus::Completed);
        assert!(inst.steps.iter().all(|s| s.attempt == 1));
    }
    let store_clones = store.store_clones.load(Ordering::SeqCst);
    Costs {
        store_calls: store.calls(),
        engine_clones: clones - store_clones,
        store_clones,
        observations: sink.emitted.load(Ordering::SeqCst),
    }
}

/// `total / WORKFLOWS`, which must be exact.
fn per_workflow(total: u64) -> u64 {
    assert_eq!(total % WORKFLOWS, 0, "{total} is not a whole cost per workflow");
    total / WORKFLOWS
}

/// The costs per completed workflow, printed for the record.
fn per_workflow_costs(c: &Costs) -> (BTreeMap<&'static str, u64>, u64, u64, u64) {
    let calls = c.store_calls.iter().map(|(m, n)| (*m, per_workflow(*n))).collect();
    let costs = (calls, per_workflow(c.engine_clones), per_workflow(c.store_clones), per_workflow(c.observations));
    println!(
        "hot-path: workflows={WORKFLOWS} store_calls={:?} engine_clones={} store_clones={} observations={}",
        costs.0, costs.1, costs.2, costs.3
    );
    costs
}

#[tokio::test(flavor = "current_thread")]
async fn happy_path_costs_per_completed_workflow() {
    // Before: the same 6 store calls, 18 copies of the instance by the engine (a snapshot per
    // loop turn, per invocation and per fused completion, one more per committed write) and
    // 10 observations.
    let (calls, engine_clones, store_clones, observations) =
        per_workflow_costs(&measure(CountingSink::new(true)).await);
    // One claim, then mark-running, three fused complete+start and the fused last
    // completion + completed (K-7.1): nothing else reaches the store.
    assert_eq!(calls, BTreeMap::from([("apply", 5), ("claim", 1)]));
    // The claim keeps one copy, taken from the claimed document, and applies each write to
    // it: the engine itself never copies the instance.
    assert_eq!(engine_clones, 0);
    // The in-memory store copies the document once per claim (what it returns) and once per
    // write (it validates the result before replacing the stored one).
    assert_eq!(store_clones, 6);
    // One per logical transition after the create (K-15): claim, 4 × (mark running,
    // complete) and completed.
    assert_eq!(observations, 10);
}

#[tokio::test(flavor = "current_thread")]
async fn a_disabled_sink_gets_no_observation_and_costs_nothing_more() {
    // Before `ObservationSink::enabled`, all 10 were built and handed over to be dropped.
    let (calls, engine_clones, _, observations) = per_workflow_costs(&measure(CountingSink::new(false)).await);
    assert_eq!(observations, 0);
    assert_eq!(calls, BTreeMap::from([("apply", 5), ("claim", 1)]));
    assert_eq!(engine_clones, 0);
}
