//! The harness for people who test their own workflows: drive reports, several engines in
//! simulated time, a crash switch that fires over one engine's life, the audit's per-write
//! log, builders, and permit renewal under crash tests (K-14).

use kernel_core::engine::ClaimEnd;
use kernel_core::ports::*;
use kernel_core::transition::{Guard, Transition, TransitionKind};
use kernel_core::WorkflowId;
use kernel_core::*;
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use testkit::faults::{AuditOutcome, AuditStore, CrashPlan, CrashPorts, CrashSide, CrashSwitch, WriteOp};
use testkit::harness::World;
use testkit::memory::{InMemoryPermits, ManualClock, PermitLimits};

async fn start(engine: &Engine, t: &str, biz: &str) {
    let req = StartRequest::new(t, biz, json!({})).workflow_id(format!("wf-{biz}"));
    engine.publisher().start_or_resume(req).await.unwrap();
}

#[tokio::test]
async fn drive_reports_a_zombies_claim_lost_next_to_the_successors_completion() {
    // K-6.5, K-3.4: A's activity outlives its lease, B takes over and finishes, A's write is
    // fenced. The drive's report shows both ends without a hand-written tick loop.
    let world = World::new(1);
    let lease_ms = world.engine("probe", vec![]).config().lease_ms;
    let first = Arc::new(AtomicBool::new(true));
    let done = Arc::new(tokio::sync::Notify::new());
    let def = {
        let (clock, first, done) = (world.clock.clone(), first.clone(), done.clone());
        let activity = move |_c: ActivityContext| {
            let (clock, first, done) = (clock.clone(), first.clone(), done.clone());
            async move {
                if first.swap(false, Ordering::SeqCst) {
                    // A long pause: the lease runs out while the activity still runs.
                    clock.advance(lease_ms + DurationMs::from_millis(1));
                    done.notified().await;
                } else {
                    done.notify_one();
                }
                Ok(StepOutcome::complete(json!(1)))
            }
        };
        move || Definition::builder("t").step(StepDef::new("only", activity.clone())).build().unwrap()
    };
    let (a, b) = (world.engine("A", vec![def()]), world.engine("B", vec![def()]));
    start(&a, "t", "z").await;
    let report = world.drive_all(&[&a, &b]).await.unwrap();
    // Both claims end in the same pass; which one ends first is up to the scheduler.
    let mut ends = report.ends_of("wf-z");
    ends.sort_by_key(|e| format!("{e:?}"));
    assert_eq!(ends, vec![ClaimEnd::ClaimLost, ClaimEnd::Terminal(WorkflowStatus::Completed)]);
    let by = |w: &str| report.records().iter().find(|c| c.worker_id == w).map(|c| c.end.clone());
    assert_eq!(by("A"), Some(ClaimEnd::ClaimLost), "the zombie's write was fenced");
    assert_eq!(by("B"), Some(ClaimEnd::Terminal(WorkflowStatus::Completed)));
    assert_eq!((report.claims(), report.claims_by("A"), report.claims_by("B")), (2, 1, 1));
    assert_eq!(world.store.peek("wf-z").unwrap().status, WorkflowStatus::Completed);
    assert_eq!(world.audit.counts().duplicate_step_completions(), 0);
}

#[tokio::test]
async fn two_engines_share_the_work_and_the_report_shows_both() {
    let world = World::new(2);
    let (a, b) =
        (world.engine("A", vec![crate::linear("t", 2, false)]), world.engine("B", vec![crate::linear("t", 2, false)]));
    for i in 0..6 {
        start(&a, "t", &format!("b{i}")).await;
    }
    let report = world.drive_all(&[&a, &b]).await.unwrap();
    assert_eq!(report.claims(), 6, "{report:?}");
    assert!(report.claims_by("A") > 0 && report.claims_by("B") > 0, "{report:?}");
    assert_eq!(report.claims_by("A") + report.claims_by("B"), 6);
    assert_eq!(report.count(&ClaimEnd::Terminal(WorkflowStatus::Completed)), 6);
    for i in 0..6 {
        assert_eq!(world.store.peek(&format!("wf-b{i}")).unwrap().status, WorkflowStatus::Completed);
    }
    assert_eq!(world.audit.counts().duplicate_step_completions(), 0);
}

#[tokio::test]
async fn one_engine_drive_reports_each_end_and_the_old_count() {
    let world = World::new(3);
    let engine = world.engine("w", vec![crate::linear("t", 3, false)]);
    start(&engine, "t", "one").await;
    start(&engine, "t", "two").await;
    let report = world.drive(&engine).await.unwrap();
    assert_eq!((report.claims(), report.len(), report.is_empty()), (2, 2, false));
    assert_eq!(report.ends_of("wf-one"), vec![ClaimEnd::Terminal(WorkflowStatus::Completed)]);
    assert!(world.drive(&engine).await.unwrap().is_empty(), "nothing left to claim");
}

/// A crash switch over one engine's whole life: every n-th boundary fails, the engine
/// lives on, and the workflows still finish with every step completed once (K-3).
async fn every_nth(n: u64, side: CrashSide) {
    let world = World::new(4);
    let (engine, switch) = world.crashing_engine("w", vec![crate::linear("t", 4, false)], CrashPlan::Every { n, side });
    let api = world.engine("api", vec![crate::linear("t", 4, false)]);
    for i in 0..3 {
        start(&api, "t", &format!("e{i}")).await;
    }
    let report = world.drive_until(&engine, 1_000, &|| false).await.unwrap();
    let fired = switch.fired();
    assert!(fired.len() >= 3, "fired {} times: {fired:?}", fired.len());
    assert!(fired.iter().all(|f| f.side == side && (f.index + 1) % n == 0), "{fired:?}");
    assert!(!switch.is_crashed(), "the process never died");
    match side {
        CrashSide::After => {
            assert!(report.count(&ClaimEnd::Uncertain) > 0, "a write whose result was lost ended its claim: {report:?}")
        }
        // A write that certainly had no effect (`Unavailable`) hands the claim back with a
        // delay (K-6.4); it never leaves the lease to expire.
        CrashSide::Before => {
            assert_eq!(report.count(&ClaimEnd::Uncertain), 0, "{report:?}");
            assert!(
                report.count(&ClaimEnd::Released) > 0,
                "a write that never happened released its claim: {report:?}"
            );
        }
    }
    for i in 0..3 {
        let inst = world.store.peek(&format!("wf-e{i}")).unwrap();
        assert_eq!(inst.status, WorkflowStatus::Completed, "{inst:?}");
    }
    assert_eq!(world.audit.counts().duplicate_step_completions(), 0);
}

#[tokio::test]
async fn crash_switch_fires_after_every_seventh_boundary_over_one_engines_life() {
    // A claim's retry cycle is five boundaries now that a retention pass with nothing to
    // delete is no boundary: a period of five would fail the claim of every cycle.
    every_nth(7, CrashSide::After).await;
}

#[tokio::test]
async fn crash_switch_fires_before_every_ninth_boundary_over_one_engines_life() {
    // A period equal to the length of a claim's retry cycle would fail the same write on
    // every cycle (see `CrashPlan::Every`); nine is not one for this workflow.
    every_nth(9, CrashSide::Before).await;
}

fn owner(w: &str) -> PermitOwner {
    PermitOwner { workflow_id: w.into(), step: "s".into(), claim_token: "tok".into() }
}

fn gated_permits(plan: CrashPlan, permits: &InMemoryPermits) -> (CrashPorts, Arc<CrashSwitch>) {
    let world = World::new(5);
    let p = world.ports();
    let switch = CrashSwitch::new(plan);
    let gated = CrashPorts::new(switch.clone(), p.store, p.inbox, p.queue, Arc::new(permits.clone()), p.wakeup);
    (gated, switch)
}

#[tokio::test]
async fn a_renewal_under_crash_ports_is_not_a_start() {
    // K-14: a lost permit is re-registered by its running owner without a limit check and
    // without a start; under CrashPorts it is the boundary `permits.renew`, never an acquire.
    let clock = Arc::new(ManualClock::default());
    let limits = HashMap::from([("r".to_string(), PermitLimits { max_concurrency: 1, max_starts_per_second: 1 })]);
    let permits = InMemoryPermits::new(clock.clone(), limits, 30_000);
    let (gated, switch) = gated_permits(CrashPlan::Never, &permits);
    let granted = |d: PermitDecision| matches!(d, PermitDecision::Granted { .. });
    assert!(granted(gated.acquire("r", &owner("a")).await.unwrap()));
    clock.advance(31_000); // a's permit expired; b takes the only slot
    assert!(granted(gated.acquire("r", &owner("b")).await.unwrap()));
    // a's activity is still running: its renewal re-registers above the limit.
    assert!(granted(gated.renew("r", &owner("a")).await.unwrap()), "a renewal is never denied for capacity");
    assert!(permits.is_held("r", &owner("a")) && permits.is_held("r", &owner("b")));
    // No start was counted for it: once both are gone and the 1 s window has moved past
    // b's start, one new start is allowed, not refused by a phantom one.
    gated.release("r", &owner("a")).await.unwrap();
    gated.release("r", &owner("b")).await.unwrap();
    clock.advance(1_000);
    assert!(granted(gated.renew("r", &owner("c")).await.unwrap()), "renewing a permit never held re-registers");
    gated.release("r", &owner("c")).await.unwrap();
    assert!(granted(gated.acquire("r", &owner("d")).await.unwrap()), "c's renewal counted no start");
    assert_eq!(
        switch.log(),
        vec![
            "permits.acquire",
            "permits.acquire",
            "permits.renew",
            "permits.release",
            "permits.release",
            "permits.renew",
            "permits.release",
            "permits.acquire"
        ]
    );
}

#[tokio::test]
async fn the_permits_renew_boundary_can_fire() {
    let clock = Arc::new(ManualClock::default());
    let permits = InMemoryPermits::new(clock, HashMap::new(), 30_000);
    // Before: the process dies before the renewal reaches the port.
    let (gated, switch) = gated_permits(CrashPlan::BeforeNamed("permits.renew", 0), &permits);
    gated.acquire("r", &owner("a")).await.unwrap();
    let b = owner("b");
    let renew = gated.renew("r", &b);
    tokio::select! {
        _ = renew => panic!("a renewal after the crash must park"),
        _ = switch.wait_crashed() => {}
    }
    assert_eq!(switch.crashed_at(), Some((1, "permits.renew")));
    assert!(!permits.is_held("r", &b), "the renewal never reached the port");
    // Every: the renewal takes effect and its answer is lost.
    let (gated, switch) = gated_permits(CrashPlan::Every { n: 1, side: CrashSide::After }, &permits);
    assert!(matches!(gated.renew("r", &owner("c")).await, Err(Error::Uncertain { .. })));
    assert!(permits.is_held("r", &owner("c")));
    assert_eq!(switch.fired().iter().map(|f| f.name).collect::<Vec<_>>(), vec!["permits.renew"]);
}

#[tokio::test]
async fn the_engine_renews_through_crash_ports_as_permits_renew() {
    // K-14: while a long activity holds its permit, the engine renews it; under a crash
    // test that is its own boundary, so the sweep never sees a renewal as a start.
    let limits = HashMap::from([("r".to_string(), PermitLimits { max_concurrency: 1, max_starts_per_second: 0 })]);
    let world = World::with_limits(6, limits);
    let renew_ms = world.engine("probe", vec![]).config().permit_renew_ms;
    let clock = world.clock.clone();
    let activity = move |_c: ActivityContext| {
        let clock = clock.clone();
        async move {
            // Let the renewal timer start, then pass its deadline.
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            clock.advance(renew_ms + DurationMs::from_millis(1));
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            Ok(StepOutcome::complete(json!(1)))
        }
    };
    let def = Definition::builder("t").step(StepDef::new("only", activity).resource("r")).build().unwrap();
    let (engine, switch) = world.crashing_engine("w", vec![def], CrashPlan::Never);
    start(&engine, "t", "p").await;
    world.drive(&engine).await.unwrap();
    let log = switch.log();
    let count = |name: &str| log.iter().filter(|b| **b == name).count();
    assert_eq!((count("permits.acquire"), count("permits.renew"), count("permits.release")), (1, 1, 1), "{log:?}");
    assert_eq!(world.store.peek("wf-p").unwrap().status, WorkflowStatus::Completed);
}

/// Counts `get` calls; implements every store method, as every wrapper must.
struct CountingGets {
    inner: Arc<DynStore>,
    gets: Arc<AtomicU64>,
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl WorkflowStore for CountingGets {
    async fn create(&self, instance: WorkflowInstance) -> Result<CreateOutcome> {
        self.inner.create(instance).await
    }
    async fn get(&self, workflow_id: &WorkflowId) -> Result<Option<WorkflowInstance>> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.inner.get(workflow_id).await
    }
    async fn get_by_biz_key(&self, biz_key: &str) -> Result<Option<WorkflowInstance>> {
        self.inner.get_by_biz_key(biz_key).await
    }
    async fn claim(&self, workflow_id: &WorkflowId, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        self.inner.claim(workflow_id, spec).await
    }
    async fn claim_any(&self, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        self.inner.claim_any(spec).await
    }
    async fn apply(&self, workflow_id: &WorkflowId, guard: &Guard, transition: &Transition) -> Result<WriteOutcome> {
        self.inner.apply(workflow_id, guard, transition).await
    }
    async fn scan_due_waits(&self, now: Instant, after: Option<&DueCursor>, limit: usize) -> Result<ScanPage<DueWait>> {
        self.inner.scan_due_waits(now, after, limit).await
    }
    async fn scan_claimable(&self, after: Option<&WorkflowId>, limit: usize) -> Result<ScanPage<Candidate>> {
        self.inner.scan_claimable(after, limit).await
    }
}

/// Engine → counter (above) → audit → counter (below) → store; returns the gets seen
/// above and below, the audit and the instance.
async fn audited_run(read_back: bool) -> (u64, u64, AuditStore, WorkflowInstance) {
    let world = World::new(7);
    let (above, below) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let lower = CountingGets { inner: world.durable.clone(), gets: below.clone() };
    let audit = AuditStore::new(Arc::new(lower)).read_back(read_back);
    let mut ports = world.ports();
    ports.store = Arc::new(CountingGets { inner: Arc::new(audit.clone()), gets: above.clone() });
    let engine = world.engine_on(ports, testkit::harness::test_config("w"), vec![crate::linear("t", 4, false)]);
    start(&engine, "t", "a").await;
    world.drive(&engine).await.unwrap();
    let inst = world.store.peek("wf-a").unwrap();
    (above.load(Ordering::SeqCst), below.load(Ordering::SeqCst), audit, inst)
}

#[tokio::test]
async fn audit_store_logs_every_write_and_reads_back_only_when_asked() {
    let (above, below, audit, inst) = audited_run(false).await;
    assert_eq!(inst.status, WorkflowStatus::Completed);
    assert_eq!(above, below, "no read-back by default");
    let log = audit.log();
    let ops: Vec<WriteOp> = log.iter().map(|w| w.op).collect();
    assert_eq!(ops[..2], [WriteOp::Create, WriteOp::Claim]);
    assert!(ops[2..].iter().all(|o| *o == WriteOp::Apply), "{ops:?}");
    assert_eq!(log.len() as u64, audit.counts().writes);
    assert_eq!(log[1].guard.as_ref().map(|g| matches!(g, Guard::Claimable { .. })), Some(true));
    let applies: Vec<_> = log.iter().filter(|w| w.op == WriteOp::Apply).collect();
    assert!(applies.iter().all(|w| matches!(w.guard, Some(Guard::Running { .. }))), "{applies:?}");
    let revisions: Vec<u64> = applies
        .iter()
        .map(|w| match w.outcome {
            AuditOutcome::Applied { revision } => revision,
            ref other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(revisions, (1..=revisions.len() as u64).collect::<Vec<_>>());
    assert_eq!(*revisions.last().unwrap(), inst.revision);
    let completed: Vec<u32> = applies.iter().flat_map(|w| w.completed_steps.clone()).collect();
    assert_eq!(completed, vec![0, 1, 2, 3]);
    assert!(applies.iter().filter(|w| !w.completed_steps.is_empty()).all(|w| w.run == Some(0)));
    assert!(applies.last().unwrap().kinds.contains(&TransitionKind::Completed));
    assert_eq!(audit.log_of("wf-a").len(), log.len());
    assert_eq!(audit.log_dropped(), 0);

    // Asked to read back: one extra read per accepted write, and the same figures.
    let (above2, below2, audit2, _) = audited_run(true).await;
    assert_eq!(below2 - above2, applies.len() as u64);
    assert_eq!(audit2.counts(), audit.counts());
    audit2.reset_traffic();
    assert!(audit2.log().is_empty());
}

#[test]
fn drive_futures_are_send() {
    fn require_send<T: Send>(_: &T) {}
    let world = World::new(8);
    let engine = world.engine("w", vec![]);
    let one = world.drive(&engine);
    require_send(&one);
    let engines = [&engine, &engine];
    let all = world.drive_all(&engines);
    require_send(&all);
    let until = world.drive_until(&engine, 1, &|| true);
    require_send(&until);
}

#[tokio::test]
async fn a_signal_built_with_the_builder_wakes_its_wait() {
    // K-9.3: the builder names every part; the struct it builds is the same value.
    let world = World::new(9);
    let def = Definition::builder("t")
        .step(StepDef::new("wait", |c: ActivityContext| async move {
            if c.resume().is_some() {
                Ok(StepOutcome::complete(json!("woken")))
            } else {
                Ok(StepOutcome::wait_for_signal("go", "key-1").into())
            }
        }))
        .build()
        .unwrap();
    let engine = world.engine("w", vec![def]);
    start(&engine, "t", "s").await;
    world.drive(&engine).await.unwrap();
    let built = Signal::builder("wf-s", "go").wait_key("key-1").signal_id("sig-1").build().unwrap();
    let literal = Signal {
        signal_id: "sig-1".into(),
        workflow_id: "wf-s".into(),
        signal_type: "go".into(),
        wait_key: "key-1".into(),
        generation: 0,
    };
    assert_eq!(built, literal);
    assert_eq!(engine.deliver_signal(built).await.unwrap(), DeliverOutcome::Activated);
    world.drive(&engine).await.unwrap();
    assert_eq!(world.store.peek("wf-s").unwrap().status, WorkflowStatus::Completed);
    let err = Signal::builder("wf-s", "go").wait_key("k\0").signal_id("s").build().unwrap_err();
    assert!(matches!(err, Error::InvalidInput { ref field, .. } if field == "wait_key"), "{err:?}");
}
