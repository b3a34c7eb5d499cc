//! A harness for the dispatch paths (K-11): an API process and recovery dispatchers on any
//! outbox, candidate index and durable store, crashes at every write boundary of both
//! paths, and a verdict computed from the stored facts alone.

use crate::faults::{CrashPlan, CrashPorts, CrashSwitch};
use crate::harness::{test_config, BoxFuture, World};
use kernel_core::dispatch::*;
use kernel_core::domain::DurationMs;
use kernel_core::ports::*;
use kernel_core::ObjectId;
use kernel_core::{Definition, Result};
use std::sync::Arc;

/// Definitions bound to an outbox (their activities write fenced business results).
pub type DefsFn = Arc<dyn Fn(Arc<DynOutbox>) -> Vec<Definition> + Send + Sync>;

/// The request for object number `i`.
pub type RequestFn = Arc<dyn Fn(usize) -> AcceptRequest + Send + Sync>;

/// Everything a dispatch test needs. Clones share state.
#[derive(Clone)]
pub struct DispatchEnv {
    /// Engines' world (store, inbox, queue, clock, ids).
    pub world: World,
    /// The business collection.
    pub outbox: Arc<DynOutbox>,
    /// The candidate index.
    pub candidates: Arc<DynCandidates>,
    /// Workflow definitions.
    pub defs: DefsFn,
}

/// Stored facts after a run (K-3.1, K-3.2).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DispatchVerdict {
    /// Objects in the business collection.
    pub accepted: usize,
    /// Of those, with a workflow instance.
    pub registered: usize,
    /// Instances above one per biz key.
    pub duplicate_instances: usize,
    /// Intents not dispatched.
    pub stuck_pending: usize,
    /// Instances whose input differs from the accepted snapshot (canonical bytes).
    pub input_mismatch: usize,
}

impl DispatchVerdict {
    /// Everything accepted is registered once with its exact snapshot.
    pub fn is_clean(&self) -> bool {
        self.registered == self.accepted && self.duplicate_instances + self.stuck_pending + self.input_mismatch == 0
    }
}

impl DispatchEnv {
    /// A dispatcher named `id` on the shared ports.
    pub fn dispatcher(&self, id: &str) -> Dispatch {
        let engine = self.world.engine(id, (self.defs)(self.outbox.clone()));
        self.build(id, self.outbox.clone(), self.candidates.clone(), engine.publisher())
    }

    /// The one way this harness builds a dispatcher: shared clock and ids, default config.
    fn build(
        &self,
        id: &str,
        outbox: Arc<DynOutbox>,
        candidates: Arc<DynCandidates>,
        publisher: kernel_core::Publisher,
    ) -> Dispatch {
        let config = DispatchConfig { dispatcher_id: id.into(), ..DispatchConfig::default() };
        Dispatch::builder()
            .outbox(outbox)
            .candidates(candidates)
            .publisher(publisher)
            .clock(self.world.clock.clone())
            .ids(self.world.ids.clone())
            .config(config)
            .build()
            .expect("valid dispatch config")
    }

    /// A dispatcher whose every port call (store, queue, outbox, candidates) goes through
    /// `switch`.
    pub fn gated(&self, id: &str, switch: Arc<CrashSwitch>) -> Dispatch {
        let p = self.world.ports();
        let gated = Arc::new(
            CrashPorts::new(
                switch,
                p.store.clone(),
                p.inbox.clone(),
                p.queue.clone(),
                p.permits.clone(),
                p.wakeup.clone(),
            )
            .with_dispatch(self.outbox.clone(), self.candidates.clone()),
        );
        let engine = self.world.engine_on(gated.wire(p), test_config(id), (self.defs)(self.outbox.clone()));
        self.build(id, gated.clone(), gated, engine.publisher())
    }

    /// Two recovery dispatchers and a worker until every intent among `objects` is
    /// dispatched and every workflow finished, in simulated time.
    pub async fn recover(&self, objects: &[ObjectId]) -> Result<()> {
        let (r1, r2) = (self.dispatcher("R1"), self.dispatcher("R2"));
        let worker = self.world.engine("W", (self.defs)(self.outbox.clone()));
        for _ in 0..200 {
            for r in [&r1, &r2] {
                r.scan().await?;
                r.recover_round().await?;
            }
            self.world.drive(&worker).await?;
            let mut pending = false;
            for id in objects {
                if let Some(rec) = self.outbox.get(id).await? {
                    pending |= rec.dispatch.is_some_and(|d| d.status != DispatchStatus::Dispatched);
                }
            }
            if !pending {
                return Ok(());
            }
            self.world.clock.advance(5_000);
        }
        Ok(())
    }

    /// The verdict over `objects`, from the outbox and the store alone.
    pub async fn verdict(&self, objects: &[ObjectId]) -> Result<DispatchVerdict> {
        let mut v = DispatchVerdict::default();
        let instances = self.world.instances().await?;
        for id in objects {
            let Some(rec) = self.outbox.get(id).await? else { continue };
            let Some(d) = rec.dispatch else { continue };
            v.accepted += 1;
            if d.status != DispatchStatus::Dispatched {
                v.stuck_pending += 1;
            }
            let mine: Vec<_> = instances.iter().filter(|i| i.biz_key == d.biz_key).collect();
            if let Some(first) = mine.first() {
                v.registered += 1;
                v.duplicate_instances += mine.len() - 1;
                let snapshot = d.input.as_ref().map(|i| serde_json::to_vec(i).unwrap_or_default());
                if snapshot.as_deref() != Some(serde_json::to_vec(&first.input).unwrap_or_default().as_slice()) {
                    v.input_mismatch += 1;
                }
            }
        }
        Ok(v)
    }
}

/// Makes a fresh environment per run (a fresh database, say).
pub type EnvFactory<'a> = &'a dyn Fn(u64) -> BoxFuture<'static, DispatchEnv>;

/// Totals of a crash-window run over both paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DispatchSweep {
    /// Crash runs.
    pub runs: usize,
    /// Write boundaries of the realtime path (first seed).
    pub realtime_boundaries: usize,
    /// Write boundaries of the recovery path (first seed).
    pub recovery_boundaries: usize,
    /// Runs whose verdict was not clean.
    pub dirty_runs: usize,
    /// Late writes of dead dispatchers, attempted.
    pub stale_writes_attempted: u64,
    /// … and accepted (must be 0).
    pub stale_writes_accepted: u64,
    /// The first dirty verdict, for the message.
    pub first_dirty: Option<(u64, String, DispatchVerdict)>,
}

impl std::fmt::Display for DispatchSweep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "dispatch-crash-windows: runs={} realtime_boundaries={} recovery_boundaries={} dirty_runs={} stale_writes_attempted={} stale_writes_accepted={}",
            self.runs,
            self.realtime_boundaries,
            self.recovery_boundaries,
            self.dirty_runs,
            self.stale_writes_attempted,
            self.stale_writes_accepted
        )
    }
}

/// The value of a step of a crash run, or a failure naming the run: an error is never read
/// as a clean verdict or a finished recovery.
fn must<T>(r: Result<T>, seed: u64, path: &str, plan: CrashPlan) -> T {
    r.unwrap_or_else(|e| panic!("{path} {plan:?} (seed {seed}): {e}"))
}

fn objects(n: usize, req: &RequestFn) -> Vec<ObjectId> {
    (0..n).map(|i| req(i).object_id).collect()
}

/// The realtime path — accept, StartOrResume, confirm for `n` requests — killed at every
/// write boundary (before and after), recovered by two dispatchers, then the dead process
/// resumed. Then the recovery path: requests whose API died after accept, a dispatcher
/// killed at every boundary, recovered after its lease expired, then resumed as a late
/// lease holder. `sample` bounds the crash points per path and seed (0 = all).
pub async fn crash_windows(
    factory: EnvFactory<'_>,
    seeds: &[u64],
    n: usize,
    req: RequestFn,
    sample: usize,
) -> DispatchSweep {
    let mut out = DispatchSweep::default();
    let ids = objects(n, &req);
    let api = |d: Dispatch, req: RequestFn| -> BoxFuture<'static, ()> {
        Box::pin(async move {
            for i in 0..n {
                let r = req(i);
                let id = r.object_id.clone();
                if d.accept(r).await.is_ok() {
                    let _ = d.dispatch_now(&id).await;
                }
            }
        })
    };
    let accept_only = |env: &DispatchEnv, req: &RequestFn| {
        let (env, req) = (env.clone(), req.clone());
        async move {
            let d = env.dispatcher("api");
            for i in 0..n {
                d.accept(req(i)).await.expect("accept");
            }
            env.world.clock.advance(DispatchConfig::default().realtime_grace_ms);
        }
    };
    let pick = |len: usize| -> Vec<u64> {
        if sample == 0 || len <= sample {
            (0..len as u64).collect()
        } else {
            (0..sample).map(|k| (k * len / sample) as u64).collect()
        }
    };
    let judge = |out: &mut DispatchSweep, seed: u64, plan: String, v: DispatchVerdict| {
        out.runs += 1;
        if !v.is_clean() {
            out.dirty_runs += 1;
            out.first_dirty.get_or_insert((seed, plan, v));
        }
    };
    for &seed in seeds {
        // Realtime path.
        let env = factory(seed).await;
        let switch = CrashSwitch::new(CrashPlan::Never);
        api(env.gated("api", switch.clone()), req.clone()).await;
        let boundaries = switch.log().len();
        if out.realtime_boundaries == 0 {
            out.realtime_boundaries = boundaries;
        }
        for k in pick(boundaries) {
            for plan in [CrashPlan::Before(k), CrashPlan::After(k)] {
                let env = factory(seed).await;
                let switch = CrashSwitch::new(plan);
                let mut fut = api(env.gated("api", switch.clone()), req.clone());
                let crashed = tokio::select! { _ = &mut fut => false, _ = switch.wait_crashed() => true };
                assert!(crashed, "realtime {plan:?} (seed {seed}): the planned crash never happened");
                must(env.recover(&ids).await, seed, "realtime", plan);
                switch.release();
                fut.await;
                must(env.recover(&ids).await, seed, "realtime", plan);
                let v = must(env.verdict(&ids).await, seed, "realtime", plan);
                judge(&mut out, seed, format!("realtime {plan:?}"), v);
            }
        }
        // Recovery path.
        let env = factory(seed).await;
        accept_only(&env, &req).await;
        let switch = CrashSwitch::new(CrashPlan::Never);
        let _ = env.gated("R0", switch.clone()).recover_round().await;
        let boundaries = switch.log().len();
        if out.recovery_boundaries == 0 {
            out.recovery_boundaries = boundaries;
        }
        for k in pick(boundaries) {
            for plan in [CrashPlan::Before(k), CrashPlan::After(k)] {
                let env = factory(seed).await;
                accept_only(&env, &req).await;
                let switch = CrashSwitch::new(plan);
                let r0 = env.gated("R0", switch.clone());
                let mut fut: BoxFuture<'static, ()> = Box::pin(async move {
                    let _ = r0.recover_round().await;
                });
                let crashed = tokio::select! { _ = &mut fut => false, _ = switch.wait_crashed() => true };
                assert!(crashed, "recovery {plan:?} (seed {seed}): the planned crash never happened");
                env.world.clock.advance(DispatchConfig::default().lease_ms + DurationMs::from_millis(1_000));
                must(env.recover(&ids).await, seed, "recovery", plan);
                switch.release();
                fut.await;
                let z = switch.zombie_stats();
                out.stale_writes_attempted += z.stale_writes_attempted;
                out.stale_writes_accepted += z.stale_writes_accepted;
                must(env.recover(&ids).await, seed, "recovery", plan);
                let v = must(env.verdict(&ids).await, seed, "recovery", plan);
                judge(&mut out, seed, format!("recovery {plan:?}"), v);
            }
        }
    }
    out
}
