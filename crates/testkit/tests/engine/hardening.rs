//! Regression tests of the hardening issue: a held lease or permit lives exactly as long as
//! the work it covers, store calls have deadlines on the clock, PrepareContext converges,
//! and a step's resource can be derived per workflow (K-6, K-14, K-2.3).

use kernel_core::engine::{ClaimEnd, RoundOutcome};
use kernel_core::ports::*;
use kernel_core::transition::{Guard, Transition, TransitionKind};
use kernel_core::*;
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use testkit::harness::{test_config, World};

async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

fn limits(pairs: &[(&str, u32)]) -> HashMap<String, PermitLimits> {
    pairs.iter().map(|(r, n)| (r.to_string(), PermitLimits { max_concurrency: *n, max_starts_per_second: 0 })).collect()
}

fn other_owner(step: &str) -> PermitOwner {
    PermitOwner { workflow_id: "wf-other".into(), step: step.into(), claim_token: "tok-other".into() }
}

#[tokio::test]
async fn hardening_05_a_timed_out_activity_keeps_its_permit_until_it_returns() {
    // max_concurrency = 1. The activity ignores its cancellation and returns only when the
    // gate opens, long after its timeout and after the permit lease would have run out.
    let world = World::with_limits(5, limits(&[("r", 1)]));
    let gate = Arc::new(tokio::sync::Notify::new());
    let returned = Arc::new(AtomicU32::new(0));
    let (g, ret) = (gate.clone(), returned.clone());
    let activity = move |_c: ActivityContext| {
        let (g, ret) = (g.clone(), ret.clone());
        async move {
            g.notified().await;
            ret.fetch_add(1, Ordering::SeqCst);
            Ok(StepOutcome::complete(json!("late")))
        }
    };
    let def = Definition::builder("t")
        .step(StepDef::new("call", activity).resource("r").timeout_ms(5_000).max_retry(3))
        .build()
        .unwrap();
    let engine = world.engine("w", vec![def]);
    let every = engine.config().permit_renew_ms;
    engine.publisher().start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf-5")).await.unwrap();
    let e = engine.clone();
    let claim = tokio::spawn(async move { e.tick().await });
    settle().await;
    assert_eq!(world.permits.holders("r"), 1, "the step holds its permit");
    world.clock.advance(5_000);
    settle().await;
    // Well past the permit lease (30 s), one renewal interval at a time.
    for _ in 0..6 {
        world.clock.advance(every);
        settle().await;
    }
    assert_eq!(returned.load(Ordering::SeqCst), 0, "the timed-out call is still in flight");
    let second = world.permits.acquire("r", &other_owner("call")).await.unwrap();
    assert!(
        matches!(second, PermitDecision::Denied { .. }),
        "max_concurrency exceeded while the timed-out call is in flight: {second:?}"
    );
    gate.notify_one();
    let out = claim.await.unwrap().unwrap();
    assert!(matches!(out, RoundOutcome::Ran { .. }), "{out:?}");
    assert_eq!(world.permits.holders("r"), 0, "released once the call returned");
}

/// How a [`TroubledStore`] answers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Trouble {
    None,
    /// A heartbeat write's outcome is unknown (a timeout, a lost connection).
    HeartbeatUncertain,
    /// Every call hangs forever: a primary that stopped answering.
    Hung,
}

/// A store decorator whose calls fail or hang on demand, counting the calls made since the
/// trouble started.
struct TroubledStore {
    inner: Arc<DynStore>,
    trouble: std::sync::Mutex<Trouble>,
    calls_in_trouble: AtomicU32,
    writes_after_uncertain: AtomicU32,
}

impl TroubledStore {
    fn new(inner: Arc<DynStore>) -> Arc<Self> {
        Arc::new(TroubledStore {
            inner,
            trouble: std::sync::Mutex::new(Trouble::None),
            calls_in_trouble: AtomicU32::new(0),
            writes_after_uncertain: AtomicU32::new(0),
        })
    }
    fn set(&self, t: Trouble) {
        *self.trouble.lock().unwrap() = t;
    }
    /// Hang if the store is hung; count the call otherwise in trouble.
    async fn gate(&self) {
        let t = *self.trouble.lock().unwrap();
        if t != Trouble::None {
            self.calls_in_trouble.fetch_add(1, Ordering::SeqCst);
        }
        if t == Trouble::Hung {
            std::future::pending::<()>().await;
        }
    }
}

#[async_trait::async_trait]
impl WorkflowStore for TroubledStore {
    async fn create(&self, instance: WorkflowInstance) -> Result<CreateOutcome> {
        self.gate().await;
        self.inner.create(instance).await
    }
    async fn get(&self, workflow_id: &WorkflowId) -> Result<Option<WorkflowInstance>> {
        self.gate().await;
        self.inner.get(workflow_id).await
    }
    async fn get_by_biz_key(&self, biz_key: &str) -> Result<Option<WorkflowInstance>> {
        self.gate().await;
        self.inner.get_by_biz_key(biz_key).await
    }
    async fn claim(&self, workflow_id: &WorkflowId, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        self.gate().await;
        self.inner.claim(workflow_id, spec).await
    }
    async fn claim_any(&self, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        self.gate().await;
        self.inner.claim_any(spec).await
    }
    async fn apply(&self, workflow_id: &WorkflowId, guard: &Guard, transition: &Transition) -> Result<WriteOutcome> {
        self.gate().await;
        if *self.trouble.lock().unwrap() == Trouble::HeartbeatUncertain {
            if transition.kinds().any(|k| k == TransitionKind::Heartbeat) {
                return Err(Error::uncertain("heartbeat: connection lost after send"));
            }
            self.writes_after_uncertain.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.apply(workflow_id, guard, transition).await
    }
    async fn scan_due_waits(&self, now: Instant, after: Option<&DueCursor>, limit: usize) -> Result<ScanPage<DueWait>> {
        self.gate().await;
        self.inner.scan_due_waits(now, after, limit).await
    }
    async fn scan_claimable(&self, after: Option<&WorkflowId>, limit: usize) -> Result<ScanPage<Candidate>> {
        self.gate().await;
        self.inner.scan_claimable(after, limit).await
    }
}

/// A one-step workflow whose activity runs until it is cancelled, counting cancellations;
/// a second step counts its entries.
fn until_cancelled(cancelled: Arc<AtomicU32>, second: Arc<AtomicU32>) -> Definition {
    let first = move |c: ActivityContext| {
        let cancelled = cancelled.clone();
        async move {
            c.cancellation().cancelled().await;
            cancelled.fetch_add(1, Ordering::SeqCst);
            Err(ActivityError::transient("cancelled"))
        }
    };
    let next = move |_c: ActivityContext| {
        let second = second.clone();
        async move {
            second.fetch_add(1, Ordering::SeqCst);
            Ok(StepOutcome::complete(json!(2)))
        }
    };
    Definition::builder("t")
        .step(StepDef::new("long", first).timeout_ms(3_600_000).max_retry(3))
        .step(StepDef::new("after", next))
        .build()
        .unwrap()
}

#[tokio::test]
async fn hardening_03_a_shutdown_timeout_leaves_the_lease_to_expire() {
    // K-6.6: a shutdown that times out behaves like a crash. The claim's activity never
    // returns; after the timeout nothing may extend the lease any more.
    let world = World::new(3);
    let never = |_c: ActivityContext| async move {
        std::future::pending::<()>().await;
        Ok(StepOutcome::complete(json!(null)))
    };
    let def = Definition::builder("t").step(StepDef::new("stuck", never).timeout_ms(3_600_000)).build().unwrap();
    let config = EngineConfig { shutdown_timeout_ms: DurationMs::from_secs(20), ..test_config("w") };
    let engine = world.engine_on(world.ports(), config, vec![def]);
    let hb = engine.config().heartbeat_ms;
    engine.publisher().start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf-3")).await.unwrap();
    let running = engine.spawn();
    settle().await;
    assert_eq!(world.store.peek("wf-3").unwrap().steps[0].status, StepStatus::Running);
    let shutdown = tokio::spawn(running.shutdown());
    settle().await;
    for _ in 0..2 {
        world.clock.advance(hb);
        settle().await;
    }
    assert!(!shutdown.await.unwrap(), "the shutdown timed out");
    let lease_end = world.store.peek("wf-3").unwrap().claimable_time.unwrap();
    for _ in 0..6 {
        world.clock.advance(hb);
        settle().await;
    }
    let after = world.store.peek("wf-3").unwrap().claimable_time.unwrap();
    assert_eq!(after, lease_end, "the lease was extended after the shutdown timed out");
    assert!(world.now() > after, "the lease has run out");
}

#[tokio::test]
async fn hardening_03_an_uncertain_heartbeat_ends_the_claim_and_cancels_the_activity() {
    // K-6.4: an uncertain outcome ends the claim: the running activity is cancelled, no
    // new activity starts and nothing more is written.
    let world = World::new(3);
    let (cancelled, second) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let store = TroubledStore::new(world.ports().store);
    let mut ports = world.ports();
    ports.store = store.clone();
    let engine = world.engine_on(ports, test_config("w"), vec![until_cancelled(cancelled.clone(), second.clone())]);
    engine.publisher().start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf-3")).await.unwrap();
    let e = engine.clone();
    let claim = tokio::spawn(async move { e.tick().await });
    settle().await;
    store.set(Trouble::HeartbeatUncertain);
    world.clock.advance(engine.config().heartbeat_ms);
    settle().await;
    assert_eq!(cancelled.load(Ordering::SeqCst), 1, "the running activity was not cancelled");
    let out = claim.await.unwrap().unwrap();
    assert!(matches!(out, RoundOutcome::Ran { end: ClaimEnd::Uncertain, .. }), "{out:?}");
    assert_eq!(second.load(Ordering::SeqCst), 0, "no new activity started");
    assert_eq!(store.writes_after_uncertain.load(Ordering::SeqCst), 0, "nothing written after it");
}

#[tokio::test]
async fn hardening_10_a_hung_store_ends_the_claim_before_its_lease_can_be_taken_over() {
    // The heartbeat's deadline is shorter than the lease: a process that cannot renew
    // cancels its activity before another worker could claim the instance.
    let world = World::new(10);
    let (cancelled, second) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let store = TroubledStore::new(world.ports().store);
    let mut ports = world.ports();
    ports.store = store.clone();
    let engine = world.engine_on(ports, test_config("w"), vec![until_cancelled(cancelled.clone(), second.clone())]);
    engine.publisher().start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf-10")).await.unwrap();
    let e = engine.clone();
    let claim = tokio::spawn(async move { e.tick().await });
    settle().await;
    let lease_end = world.store.peek("wf-10").unwrap().claimable_time.unwrap();
    store.set(Trouble::Hung);
    while cancelled.load(Ordering::SeqCst) == 0 && world.now() < lease_end {
        world.clock.advance(1_000);
        settle().await;
    }
    assert_eq!(cancelled.load(Ordering::SeqCst), 1, "the activity was not cancelled before the lease ran out");
    assert!(world.now() < lease_end, "cancelled at {} with the lease ending at {lease_end}", world.now());
    let out = claim.await.unwrap().unwrap();
    assert!(matches!(out, RoundOutcome::Ran { end: ClaimEnd::Uncertain, .. }), "{out:?}");
    assert_eq!(store.calls_in_trouble.load(Ordering::SeqCst), 1, "only the heartbeat reached the hung store");
    assert_eq!(second.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn hardening_10_a_hung_store_call_returns_at_its_deadline() {
    // A claim against a hung store gives up at the store deadline of the engine's clock.
    let world = World::new(10);
    let store = TroubledStore::new(world.ports().store);
    let mut ports = world.ports();
    ports.store = store.clone();
    let engine = world.engine_on(ports, test_config("w"), vec![crate::linear("t", 1, false)]);
    engine.publisher().start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf-10")).await.unwrap();
    store.set(Trouble::Hung);
    let e = engine.clone();
    let round = tokio::spawn(async move { e.tick().await });
    for _ in 0..120 {
        if round.is_finished() {
            break;
        }
        world.clock.advance(1_000);
        settle().await;
    }
    assert!(round.is_finished(), "the scheduling round still waits on the hung store");
    let out = round.await.unwrap();
    assert!(matches!(out, Ok(RoundOutcome::Idle { .. }) | Err(_)), "{out:?}");
    assert_eq!(store.calls_in_trouble.load(Ordering::SeqCst), 1, "one claim call, not retried");
    assert_eq!(world.store.peek("wf-10").unwrap().steps[0].status, StepStatus::Pending);
}

#[tokio::test]
async fn hardening_13_two_tenants_are_each_held_to_their_own_ceiling_through_the_engine() {
    // K-14: `tenant:<t>:asr` falls back to the limit configured for `asr` (1 at a time).
    // The step's resource is derived from the workflow's input, so each tenant has its own
    // ceiling: one call per tenant runs, the second of each tenant waits.
    let world = World::with_limits(13, limits(&[("asr", 1)]));
    let (open, gate) = tokio::sync::watch::channel(false);
    let running: Arc<std::sync::Mutex<HashMap<String, u32>>> = Arc::default();
    let peak: Arc<std::sync::Mutex<HashMap<String, u32>>> = Arc::default();
    let (g, r, p) = (gate, running.clone(), peak.clone());
    let activity = move |c: ActivityContext| {
        let (g, r, p) = (g.clone(), r.clone(), p.clone());
        async move {
            let tenant = c.input()["tenant"].as_str().unwrap().to_string();
            {
                let mut r = r.lock().unwrap();
                let n = r.entry(tenant.clone()).or_default();
                *n += 1;
                let mut p = p.lock().unwrap();
                let m = p.entry(tenant.clone()).or_default();
                *m = (*m).max(*n);
            }
            let mut g = g;
            let _ = g.wait_for(|open| *open).await;
            *r.lock().unwrap().get_mut(&tenant).unwrap() -= 1;
            Ok(StepOutcome::complete(json!(tenant)))
        }
    };
    let def = Definition::builder("t")
        .step(StepDef::new("asr", activity).timeout_ms(3_600_000).resource_from(
            |input: &serde_json::Value, _prepared: &serde_json::Value| {
                format!("tenant:{}:asr", input["tenant"].as_str().unwrap_or("none"))
            },
        ))
        .build()
        .unwrap();
    let config = EngineConfig { worker_slots: 4, ..test_config("w") };
    let engine = world.engine_on(world.ports(), config, vec![def]);
    for (i, tenant) in ["a", "a", "b", "b"].iter().enumerate() {
        let req = StartRequest::new("t", format!("b{i}"), json!({ "tenant": tenant })).workflow_id(format!("wf-{i}"));
        engine.publisher().start_or_resume(req).await.unwrap();
    }
    let rounds: Vec<_> = (0..4)
        .map(|_| {
            let e = engine.clone();
            tokio::spawn(async move { e.tick().await })
        })
        .collect();
    settle().await;
    assert_eq!(world.permits.holders("tenant:a:asr"), 1);
    assert_eq!(world.permits.holders("tenant:b:asr"), 1);
    let at_once: u32 = running.lock().unwrap().values().sum();
    assert_eq!(at_once, 2, "one call per tenant at once, both tenants progressing");
    let deferred = world.instances().await.unwrap().iter().filter(|i| i.steps[0].traffic_waits == 1).count();
    assert_eq!(deferred, 2, "the second workflow of each tenant waits for its tenant's permit");
    open.send(true).unwrap();
    for r in rounds {
        r.await.unwrap().unwrap();
    }
    world.drive(&engine).await.unwrap();
    for i in world.instances().await.unwrap() {
        assert_eq!(i.status, WorkflowStatus::Completed, "{}", i.workflow_id);
    }
    assert!(
        peak.lock().unwrap().values().all(|&m| m == 1),
        "a tenant exceeded its ceiling: {:?}",
        peak.lock().unwrap()
    );
}

#[tokio::test]
async fn hardening_13_an_invalid_derived_resource_fails_the_step_without_entering_it() {
    let world = World::new(13);
    let entries = Arc::new(AtomicU32::new(0));
    let n = entries.clone();
    let activity = move |_c: ActivityContext| {
        let n = n.clone();
        async move {
            n.fetch_add(1, Ordering::SeqCst);
            Ok(StepOutcome::complete(json!(1)))
        }
    };
    let def = Definition::builder("t")
        .step(StepDef::new("asr", activity).resource_from(|input: &serde_json::Value, _: &serde_json::Value| {
            format!("tenant:{}:asr", input["tenant"].as_str().unwrap_or_default())
        }))
        .build()
        .unwrap();
    let engine = world.engine("w", vec![def]);
    let req = StartRequest::new("t", "b", json!({ "tenant": "a.b" })).workflow_id("wf-13");
    engine.publisher().start_or_resume(req).await.unwrap();
    world.drive(&engine).await.unwrap();
    let i = world.store.peek("wf-13").unwrap();
    assert_eq!((i.status, i.steps[0].status), (WorkflowStatus::Failed, StepStatus::Failed));
    let msg = &i.steps[0].error.as_ref().unwrap().message;
    assert!(msg.contains("resource"), "{msg}");
    assert_eq!(entries.load(Ordering::SeqCst), 0, "the activity was never entered");
}

#[tokio::test]
async fn hardening_07_a_failing_prepare_context_converges_to_failed_without_business_code() {
    // K-2.3 + K-8: a PrepareContext that keeps failing is tried a bounded number of times,
    // across claims (the count is persisted), with growing delays; then the workflow fails
    // through `failing`. No business code runs without its context (K-17.6 amendment): no
    // step, and not the failure finalizer.
    let world = World::new(7);
    let (steps, finalizer) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let (s, f) = (steps.clone(), finalizer.clone());
    let def = Definition::builder("t")
        .step(StepDef::new("only", move |_c: ActivityContext| {
            let s = s.clone();
            async move {
                s.fetch_add(1, Ordering::SeqCst);
                Ok(StepOutcome::complete(json!(1)))
            }
        }))
        .failure_finalizer(move |_c: ActivityContext| {
            let f = f.clone();
            async move {
                f.fetch_add(1, Ordering::SeqCst);
                Ok(StepOutcome::complete(json!(null)))
            }
        })
        .build()
        .unwrap();
    let calls: Arc<std::sync::Mutex<Vec<Instant>>> = Arc::default();
    let (c, clock) = (calls.clone(), world.clock.clone());
    let config = test_config("w");
    let attempts_max = config.prepare_attempts_max;
    let engine = kernel_core::Engine::builder(world.ports())
        .config(config)
        .register(def)
        .prepare_context(Arc::new(move |_i: &WorkflowInstance| {
            c.lock().unwrap().push(kernel_core::ports::Clock::now(&*clock));
            Err("tenant directory refused the input".to_string())
        }))
        .build()
        .unwrap();
    engine.publisher().start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf-7")).await.unwrap();
    let report = world.drive_until(&engine, 200, &|| false).await.unwrap();
    let i = world.store.peek("wf-7").unwrap();
    assert_eq!(i.status, WorkflowStatus::Failed, "after {} claims", report.claims());
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len() as u32, attempts_max, "PrepareContext attempts");
    let gaps: Vec<_> = calls.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.windows(2).all(|g| g[1] > g[0]), "the delays grow: {gaps:?}");
    assert_eq!(finalizer.load(Ordering::SeqCst), 0, "the failure finalizer does not run without its context");
    assert_eq!(steps.load(Ordering::SeqCst), 0, "no step ran");
    assert_eq!(i.steps[0].status, StepStatus::Pending);
}

#[tokio::test]
async fn hardening_09_a_shutdown_release_between_waves_enqueues_the_instance() {
    // K-6.6 + K-13: a graceful shutdown hands a claimed instance back between waves; the
    // instance is claimable at once, so it is also put in its lane (and the doorbell rung),
    // not left for the next lane rebuild.
    let world = World::new(9);
    let gate = Arc::new(tokio::sync::Notify::new());
    let g = gate.clone();
    let first = move |_c: ActivityContext| {
        let g = g.clone();
        async move {
            g.notified().await;
            Ok(StepOutcome::complete(json!(1)))
        }
    };
    let second = |_c: ActivityContext| async move { Ok(StepOutcome::complete(json!(2))) };
    let def = Definition::builder("t")
        .step(StepDef::new("first", first).timeout_ms(3_600_000))
        .step(StepDef::new("second", second))
        .build()
        .unwrap();
    let engine = world.engine_on(world.ports(), test_config("w"), vec![def]);
    engine.publisher().start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf-9")).await.unwrap();
    let running = engine.spawn();
    settle().await;
    assert_eq!(world.store.peek("wf-9").unwrap().steps[0].status, StepStatus::Running);
    world.queue.flush();
    let shutdown = tokio::spawn(running.shutdown());
    settle().await;
    gate.notify_one();
    assert!(shutdown.await.unwrap(), "a clean shutdown");
    let inst = world.store.peek("wf-9").unwrap();
    assert_eq!(inst.status, WorkflowStatus::Running);
    assert_eq!(inst.steps[1].status, StepStatus::Pending, "the second wave did not start");
    assert!(inst.claim_token.is_none(), "handed back");
    assert!(world.queue.lane_of("wf-9").is_some(), "the released instance is enqueued");
}

/// An inbox whose every call hangs (a primary that stopped answering), counting calls.
#[derive(Default)]
struct HungInbox {
    calls: AtomicU32,
}

impl HungInbox {
    async fn hang<T>(&self) -> T {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::future::pending().await
    }
}

#[async_trait::async_trait]
impl SignalInbox for HungInbox {
    async fn insert(&self, _record: SignalRecord) -> Result<InsertOutcome> {
        self.hang().await
    }
    async fn get(&self, _signal_id: &str) -> Result<Option<SignalRecord>> {
        self.hang().await
    }
    async fn find_pending(&self, _w: &WorkflowId, _t: &str, _k: &str, _g: u64) -> Result<Option<SignalRecord>> {
        self.hang().await
    }
    async fn mark_matched(&self, _signal_id: &str, _now: Instant) -> Result<bool> {
        self.hang().await
    }
    async fn scan_pending(&self, _after: Option<&str>, _limit: usize) -> Result<SignalPage> {
        self.hang().await
    }
    async fn scan_created_before(&self, _b: Instant, _a: Option<&str>, _l: usize) -> Result<SignalPage> {
        self.hang().await
    }
    async fn scan_workflow(&self, _w: &WorkflowId, _s: SignalStatus, _l: usize) -> Result<Vec<SignalRecord>> {
        self.hang().await
    }
    async fn delete_if(&self, _ids: &[String], _status: SignalStatus) -> Result<u64> {
        self.hang().await
    }
    async fn count_pending_orphans(&self, _w: Option<&WorkflowId>, _limit: u64) -> Result<u64> {
        self.hang().await
    }
    async fn clear_orphans(&self, _w: &WorkflowId) -> Result<u64> {
        self.hang().await
    }
}

#[tokio::test]
async fn hardening_10_a_hung_inbox_call_returns_at_its_deadline() {
    // The inbox lives on the durable store too: a signal delivery against a hung primary
    // gives up at the store deadline of the engine's clock, as an uncertain write (the
    // producer retries; the signal id makes the retry idempotent, K-9).
    let world = World::new(10);
    let inbox = Arc::new(HungInbox::default());
    let mut ports = world.ports();
    ports.inbox = inbox.clone();
    let engine = world.engine_on(ports, test_config("w"), vec![crate::linear("t", 1, false)]);
    let signal = Signal::builder("wf-10", "approve").wait_key("doc:1").generation(1).signal_id("s-1").build().unwrap();
    let e = engine.clone();
    let delivery = tokio::spawn(async move { e.deliver_signal(signal).await });
    for _ in 0..120 {
        if delivery.is_finished() {
            break;
        }
        world.clock.advance(1_000);
        settle().await;
    }
    assert!(delivery.is_finished(), "the delivery still waits on the hung inbox");
    let out = delivery.await.unwrap();
    assert!(matches!(out, Err(Error::Uncertain { .. }) | Err(Error::Unavailable { .. })), "{out:?}");
    assert_eq!(inbox.calls.load(Ordering::SeqCst), 1, "one inbox call, not retried");
}

#[tokio::test]
async fn hardening_10_a_standalone_publisher_gives_up_on_a_hung_store_at_its_deadline() {
    // An API process that only starts workflows has store deadlines too: a start against
    // a hung primary answers (uncertain: the create may still land; the caller retries,
    // StartOrResume is idempotent on the business key, K-5).
    let world = World::new(10);
    let store = TroubledStore::new(world.ports().store);
    let ports = world.ports();
    let plan = crate::linear("t", 1, false).plan().clone();
    let publisher = Publisher::builder(store.clone(), ports.queue.clone(), ports.wakeup.clone())
        .clock(ports.clock.clone())
        .plan(plan)
        .store_call_deadline_ms(5_000)
        .build()
        .unwrap();
    store.set(Trouble::Hung);
    let start = tokio::spawn(async move {
        publisher.start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf-10")).await
    });
    for _ in 0..120 {
        if start.is_finished() {
            break;
        }
        world.clock.advance(1_000);
        settle().await;
    }
    assert!(start.is_finished(), "the start still waits on the hung store");
    let out = start.await.unwrap();
    assert!(matches!(out, Err(Error::Uncertain { .. }) | Err(Error::Unavailable { .. })), "{out:?}");
    assert_eq!(store.calls_in_trouble.load(Ordering::SeqCst), 1, "one store call, not retried");
}

/// A dispatch outbox whose every call hangs (a primary that stopped answering), counting
/// calls.
#[derive(Default)]
struct HungOutbox {
    calls: AtomicU32,
}

impl HungOutbox {
    async fn hang<T>(&self) -> T {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::future::pending().await
    }
}

#[async_trait::async_trait]
impl DispatchOutbox for HungOutbox {
    async fn accept(
        &self,
        _o: &ObjectId,
        _f: serde_json::Value,
        _s: &str,
        _i: DispatchIntent,
    ) -> Result<AcceptOutcome> {
        self.hang().await
    }
    async fn get(&self, _o: &ObjectId) -> Result<Option<DispatchRecord>> {
        self.hang().await
    }
    async fn confirm_dispatched(&self, _o: &ObjectId, _f: &FencingToken) -> Result<bool> {
        self.hang().await
    }
    async fn defer_pending(&self, _o: &ObjectId, _f: &FencingToken, _at: Instant) -> Result<bool> {
        self.hang().await
    }
    async fn try_lease(
        &self,
        _o: &ObjectId,
        _n: Instant,
        _l: &LeaseToken,
        _u: Instant,
    ) -> Result<Option<DispatchRecord>> {
        self.hang().await
    }
    async fn renew_lease(&self, _o: &ObjectId, _f: &FencingToken, _l: &LeaseToken, _u: Instant) -> Result<bool> {
        self.hang().await
    }
    async fn confirm_leased(&self, _o: &ObjectId, _f: &FencingToken, _l: &LeaseToken) -> Result<bool> {
        self.hang().await
    }
    async fn revert_leased(&self, _o: &ObjectId, _f: &FencingToken, _l: &LeaseToken, _at: Instant) -> Result<bool> {
        self.hang().await
    }
    async fn scan_due(&self, _n: Instant, _a: Option<&ObjectId>, _l: usize) -> Result<Vec<(ObjectId, Instant)>> {
        self.hang().await
    }
    async fn retry_failed(&self, _o: &ObjectId, _p: &FencingToken, _n: DispatchIntent, _s: &str) -> Result<bool> {
        self.hang().await
    }
    async fn fenced_update(
        &self,
        _o: &ObjectId,
        _f: &FencingToken,
        _fields: serde_json::Value,
        _s: Option<&str>,
    ) -> Result<bool> {
        self.hang().await
    }
    async fn try_lock(&self, _n: &str, _h: &str, _now: Instant, _u: Instant) -> Result<bool> {
        self.hang().await
    }
}

#[tokio::test]
async fn hardening_10_a_dispatch_gives_up_on_a_hung_outbox_at_its_deadline() {
    // The dispatch outbox lives on the durable store: an accept against a hung primary
    // answers at the deadline of the dispatch's clock, as an uncertain write (accept is
    // idempotent per object and round, K-11, so the caller may retry).
    let world = World::new(10);
    let outbox = Arc::new(HungOutbox::default());
    let engine = world.engine("w", vec![crate::linear("t", 1, false)]);
    let dispatch = kernel_core::dispatch::Dispatch::builder()
        .outbox(outbox.clone())
        .candidates(Arc::new(testkit::memory::InMemoryCandidates::new()))
        .publisher(engine.publisher())
        .clock(world.clock.clone())
        .build()
        .unwrap();
    let req = kernel_core::dispatch::AcceptRequest {
        object_id: "o-1".into(),
        fields: json!({}),
        workflow_type: "t".into(),
        biz_key: "b".into(),
        fencing_token: "f1".into(),
        input: json!({"object_id": "o-1", "fencing_token": "f1"}),
        priority: Priority::P1,
    };
    let accept = tokio::spawn(async move { dispatch.accept(req).await });
    for _ in 0..120 {
        if accept.is_finished() {
            break;
        }
        world.clock.advance(1_000);
        settle().await;
    }
    assert!(accept.is_finished(), "the accept still waits on the hung outbox");
    let out = accept.await.unwrap();
    assert!(matches!(out, Err(Error::Uncertain { .. })), "{out:?}");
    assert_eq!(outbox.calls.load(Ordering::SeqCst), 1, "one outbox call, not retried");
}

#[tokio::test]
async fn hardening_07_a_panicking_prepare_context_counts_as_a_failure_and_converges() {
    // A PrepareContext that panics is a failed PrepareContext (K-2.3): counted, retried a
    // bounded number of times, then the workflow fails. Before, the panic ended the claim's
    // task; the lease expired and the claim repeated forever.
    let world = World::new(7);
    let steps = Arc::new(AtomicU32::new(0));
    let s = steps.clone();
    let def = Definition::builder("t")
        .step(StepDef::new("only", move |_c: ActivityContext| {
            let s = s.clone();
            async move {
                s.fetch_add(1, Ordering::SeqCst);
                Ok(StepOutcome::complete(json!(1)))
            }
        }))
        .build()
        .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let config = test_config("w");
    let attempts_max = config.prepare_attempts_max;
    let engine = kernel_core::Engine::builder(world.ports())
        .config(config)
        .register(def)
        .prepare_context(Arc::new(move |_i: &WorkflowInstance| {
            c.fetch_add(1, Ordering::SeqCst);
            panic!("tenant directory client bug")
        }))
        .build()
        .unwrap();
    engine.publisher().start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf-7p")).await.unwrap();
    let report = tokio::spawn({
        let (world, engine) = (world.clone(), engine.clone());
        async move { world.drive_until(&engine, 200, &|| false).await }
    })
    .await
    .expect("the driver survives a panicking PrepareContext")
    .unwrap();
    let i = world.store.peek("wf-7p").unwrap();
    assert_eq!(i.status, WorkflowStatus::Failed, "after {} claims", report.claims());
    assert_eq!(calls.load(Ordering::SeqCst), attempts_max, "PrepareContext attempts");
    assert_eq!(steps.load(Ordering::SeqCst), 0, "no step ran");
}

#[tokio::test]
async fn hardening_13_a_panicking_resource_function_fails_the_step_without_entering_it() {
    // A derive function that panics fails the step for good without entering it, like an
    // invalid derived resource; the claim is not killed and repeated.
    let world = World::new(13);
    let entries = Arc::new(AtomicU32::new(0));
    let n = entries.clone();
    let activity = move |_c: ActivityContext| {
        let n = n.clone();
        async move {
            n.fetch_add(1, Ordering::SeqCst);
            Ok(StepOutcome::complete(json!(1)))
        }
    };
    let def = Definition::builder("t")
        .step(StepDef::new("asr", activity).resource_from(|input: &serde_json::Value, _: &serde_json::Value| {
            format!("tenant:{}:asr", input["tenant"].as_str().expect("a tenant"))
        }))
        .build()
        .unwrap();
    let engine = world.engine("w", vec![def]);
    let req = StartRequest::new("t", "b", json!({ "no_tenant": true })).workflow_id("wf-13p");
    engine.publisher().start_or_resume(req).await.unwrap();
    let report = tokio::spawn({
        let (world, engine) = (world.clone(), engine.clone());
        async move { world.drive_until(&engine, 50, &|| false).await }
    })
    .await
    .expect("the driver survives a panicking resource function")
    .unwrap();
    let i = world.store.peek("wf-13p").unwrap();
    assert_eq!((i.status, i.steps[0].status), (WorkflowStatus::Failed, StepStatus::Failed));
    let msg = &i.steps[0].error.as_ref().unwrap().message;
    assert!(msg.contains("resource") && msg.contains("panicked"), "{msg}");
    assert_eq!(entries.load(Ordering::SeqCst), 0, "the activity was never entered");
    assert_eq!(report.claims(), 1, "one claim");
}

#[tokio::test]
async fn hardening_09_a_fingerprint_push_back_is_enqueued_at_its_claimable_time() {
    // K-4.3 + K-13: a pushed-back instance becomes claimable at now + push-back; it is put
    // in its lane at that time, not left for the next lane rebuild.
    let world = World::new(9);
    let one = |name: &str| {
        Definition::builder("t")
            .step(StepDef::new(name, |_c: ActivityContext| async { Ok(StepOutcome::complete(json!(1))) }))
            .build()
            .unwrap()
    };
    let old = world.engine("old", vec![one("a")]);
    let new = world.engine("new", vec![one("b")]);
    new.publisher().start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf-9f")).await.unwrap();
    let out = old.tick().await.unwrap();
    assert!(matches!(out, RoundOutcome::Ran { end: ClaimEnd::PushedBack, .. }), "{out:?}");
    let at = world.store.peek("wf-9f").unwrap().claimable_time.expect("claimable later");
    assert_eq!(at, world.now().saturating_add(old.config().fingerprint_pushback_ms));
    assert!(world.queue.lane_of("wf-9f").is_some(), "the pushed-back instance is enqueued");
    let before = Instant::from_millis(at.as_millis() - 1);
    assert!(world.queue.pop_due(before, 1).await.unwrap().is_empty(), "not due before the push-back ends");
    assert_eq!(world.queue.pop_due(at, 1).await.unwrap(), [WorkflowId::from("wf-9f")]);
}
