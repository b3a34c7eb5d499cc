//! A wired in-memory world, a driver that runs engines to quiescence in simulated time, and
//! the crash-window sweep.
//!
//! [`World::drive`] runs one engine and reports how every claim ended;
//! [`World::drive_all`] runs several engines side by side on the same ports, so a test can
//! see them share the work:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use kernel_core::engine::ClaimEnd;
//! use kernel_core::{ActivityContext, Definition, StartRequest, StepDef, StepOutcome, WorkflowStatus};
//! use testkit::harness::World;
//!
//! let world = World::new(1);
//! let def = || {
//!     Definition::builder("t")
//!         .step(StepDef::new("a", |_c: ActivityContext| async { Ok(StepOutcome::complete(serde_json::json!(1))) }))
//!         .build()
//!         .unwrap()
//! };
//! let (a, b) = (world.engine("A", vec![def()]), world.engine("B", vec![def()]));
//! for i in 0..4 {
//!     let req = StartRequest::new("t", format!("b-{i}"), serde_json::json!({})).workflow_id(format!("wf-{i}"));
//!     a.publisher().start_or_resume(req).await.unwrap();
//! }
//! let report = world.drive_all(&[&a, &b]).await.unwrap();
//! assert_eq!(report.claims(), 4);
//! assert!(report.claims_by("A") > 0 && report.claims_by("B") > 0);
//! assert_eq!(report.last_end("wf-0"), Some(&ClaimEnd::Terminal(WorkflowStatus::Completed)));
//! # }
//! ```

use crate::faults::{AuditStore, BoundaryName, CrashPlan, CrashPorts, CrashSwitch};
use crate::memory::*;
use kernel_core::domain::*;
use kernel_core::engine::{ClaimEnd, Engine, EngineConfig, Ports, RoundOutcome, StartOutcome, StartRequest};
use kernel_core::ports::*;
use kernel_core::WorkflowId;
use kernel_core::{Definition, Result};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

/// Observations kept in memory (bounded; the newest are dropped beyond the cap).
#[derive(Debug, Clone, Default)]
pub struct RecordingSink {
    events: Arc<Mutex<Vec<Observation>>>,
}

impl RecordingSink {
    /// Most events kept.
    pub const CAPACITY: usize = 100_000;
    /// Everything recorded so far.
    pub fn events(&self) -> Vec<Observation> {
        self.events.lock().expect("sink lock").clone()
    }
}

impl ObservationSink for RecordingSink {
    /// Always: it records what it is given.
    fn enabled(&self) -> bool {
        true
    }
    fn emit(&self, obs: Observation) {
        let mut e = self.events.lock().expect("sink lock");
        if e.len() < Self::CAPACITY {
            e.push(obs);
        }
    }
}

/// One stream's recorded state.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordedStream {
    /// Resets so far.
    pub generation: u64,
    /// Frames of the current generation.
    pub frames: Vec<Frame>,
    /// Terminal summary, once written.
    pub terminal: Option<Value>,
    /// The greatest owner seen (K-16 fencing).
    pub owner: Option<StreamOwner>,
}

impl RecordedStream {
    /// Refuse a writer older than the stream's owner; otherwise it becomes the owner.
    fn fence(&mut self, owner: StreamOwner) -> Result<()> {
        if self.owner.is_some_and(|o| o > owner) {
            return Err(kernel_core::Error::Conflict("stream is owned by a newer writer".into()));
        }
        self.owner = Some(owner);
        Ok(())
    }
}

/// In-memory [`StreamSink`] that refuses frames after the terminal one and writes of an
/// owner older than the stream's (K-16).
#[derive(Debug, Clone, Default)]
pub struct InMemoryStreamSink {
    streams: Arc<Mutex<HashMap<StreamKey, RecordedStream>>>,
}

impl InMemoryStreamSink {
    /// The recorded state of a stream.
    pub fn get(&self, key: &StreamKey) -> Option<RecordedStream> {
        self.streams.lock().expect("stream lock").get(key).cloned()
    }
    /// All keys.
    pub fn keys(&self) -> Vec<StreamKey> {
        self.streams.lock().expect("stream lock").keys().cloned().collect()
    }
}

#[async_trait::async_trait]
impl StreamSink for InMemoryStreamSink {
    async fn reset(&self, key: &StreamKey, owner: StreamOwner) -> Result<u64> {
        let mut s = self.streams.lock().expect("stream lock");
        let st = s.entry(key.clone()).or_default();
        st.fence(owner)?;
        st.generation += 1;
        st.frames.clear();
        st.terminal = None;
        Ok(st.generation)
    }
    async fn append(&self, key: &StreamKey, owner: StreamOwner, frame: Frame) -> Result<u64> {
        let mut s = self.streams.lock().expect("stream lock");
        let st = s.entry(key.clone()).or_default();
        if st.owner.is_some_and(|o| o > owner) {
            return Err(kernel_core::Error::Conflict("stream is owned by a newer writer".into()));
        }
        if st.terminal.is_some() {
            return Err(kernel_core::Error::Conflict("stream is terminal".into()));
        }
        st.owner = Some(owner);
        st.frames.push(frame);
        Ok(st.frames.len() as u64 - 1)
    }
    async fn terminal(&self, key: &StreamKey, owner: StreamOwner, summary: Value) -> Result<()> {
        let mut s = self.streams.lock().expect("stream lock");
        let st = s.entry(key.clone()).or_default();
        st.fence(owner)?;
        st.terminal.get_or_insert(summary);
        Ok(())
    }
}

/// Engine settings for simulated-time tests.
pub fn test_config(worker_id: &str) -> EngineConfig {
    EngineConfig { worker_id: worker_id.to_string(), ..EngineConfig::default() }
}

/// Lists every instance of a durable store (test inspection, not a port). Its future is
/// `Send`, so a drive can run on a multi-threaded runtime or be spawned.
pub type Lister = Arc<dyn Fn() -> futures::future::BoxFuture<'static, Result<Vec<WorkflowInstance>>> + Send + Sync>;

/// One claim a drive ran: who ran it, on which instance, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrivenClaim {
    /// The engine's `worker_id`.
    pub worker_id: String,
    /// The instance claimed.
    pub workflow_id: WorkflowId,
    /// How the claim ended (K-6.5): a zombie's fenced write shows as [`ClaimEnd::ClaimLost`].
    pub end: ClaimEnd,
}

/// What a drive did: every claim in the order it ended.
///
/// ```
/// use kernel_core::engine::ClaimEnd;
/// use testkit::harness::{DriveReport, DrivenClaim};
/// let report = DriveReport::from(vec![DrivenClaim {
///     worker_id: "A".into(),
///     workflow_id: "wf-1".into(),
///     end: ClaimEnd::ClaimLost,
/// }]);
/// assert_eq!(report.claims(), 1);
/// assert_eq!(report.ends_of("wf-1"), vec![ClaimEnd::ClaimLost]);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriveReport {
    claims: Vec<DrivenClaim>,
}

impl From<Vec<DrivenClaim>> for DriveReport {
    fn from(claims: Vec<DrivenClaim>) -> Self {
        DriveReport { claims }
    }
}

impl DriveReport {
    /// How many claims ran (what `drive` used to return).
    pub fn claims(&self) -> usize {
        self.claims.len()
    }
    /// Same as [`claims`](Self::claims).
    pub fn len(&self) -> usize {
        self.claims.len()
    }
    /// Whether no claim ran.
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }
    /// Every claim, in the order it ended.
    pub fn records(&self) -> &[DrivenClaim] {
        &self.claims
    }
    /// The ends of one instance's claims, in order.
    pub fn ends_of(&self, workflow_id: &str) -> Vec<ClaimEnd> {
        self.claims.iter().filter(|c| c.workflow_id == workflow_id).map(|c| c.end.clone()).collect()
    }
    /// How the last claim of an instance ended.
    pub fn last_end(&self, workflow_id: &str) -> Option<&ClaimEnd> {
        self.claims.iter().rev().find(|c| c.workflow_id == workflow_id).map(|c| &c.end)
    }
    /// Claims run by one engine.
    pub fn claims_by(&self, worker_id: &str) -> usize {
        self.claims.iter().filter(|c| c.worker_id == worker_id).count()
    }
    /// Claims that ended as `end`.
    pub fn count(&self, end: &ClaimEnd) -> usize {
        self.claims.iter().filter(|c| &c.end == end).count()
    }
}

/// A stop condition of a drive, checked between rounds.
pub type StopFn<'a> = &'a (dyn Fn() -> bool + Send + Sync);

/// Every adapter of a test, wired: in-memory by default, or with another durable store and
/// inbox ([`World::with_durable`]) so the same harness runs against a real database.
/// Clones share state.
#[derive(Clone)]
pub struct World {
    /// The manual clock.
    pub clock: Arc<ManualClock>,
    /// Durable instances of an in-memory world (empty and unused with another backend).
    pub store: InMemoryStore,
    /// The durable store engines use (below the audit).
    pub durable: Arc<DynStore>,
    /// The durable inbox engines use.
    pub durable_inbox: Arc<DynInbox>,
    lister: Lister,
    /// The store as engines see it, audited.
    pub audit: AuditStore,
    /// Durable inbox of an in-memory world.
    pub inbox: InMemoryInbox,
    /// Ready lanes.
    pub queue: InMemoryQueue,
    /// Doorbell.
    pub wakeup: InMemoryWakeup,
    /// Permits on the manual clock.
    pub permits: InMemoryPermits,
    /// Deterministic ids.
    pub ids: Arc<SeqIds>,
    /// Observations.
    pub observations: RecordingSink,
    /// Client streams.
    pub streams: InMemoryStreamSink,
    /// The dead-letter records (K-17.2) every engine of this world shares.
    pub dead_letters: crate::memory::MemoryDeadLetters,
    /// Human tasks (K-17.5), where the compensation escalates (K-17.6).
    pub task_inbox: crate::memory::MemoryTaskInbox,
    /// The result cache (K-17.7) every engine of this world shares.
    pub result_cache: crate::memory::MemoryResultCache,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World").field("now", &kernel_core::ports::Clock::now(&*self.clock)).finish_non_exhaustive()
    }
}

impl World {
    /// A world whose ids and jitter derive from `seed`.
    pub fn new(seed: u64) -> Self {
        Self::with_limits(seed, HashMap::new())
    }

    /// A world with configured permit limits.
    pub fn with_limits(seed: u64, limits: HashMap<String, PermitLimits>) -> Self {
        Self::with_memory_store(seed, limits, InMemoryStore::new())
    }

    /// An in-memory world on `store` (e.g. one with a smaller document limit,
    /// [`InMemoryStore::with_document_bytes_max`]).
    pub fn with_memory_store(seed: u64, limits: HashMap<String, PermitLimits>, store: InMemoryStore) -> Self {
        let inbox = InMemoryInbox::new();
        let listed = store.clone();
        let lister: Lister = Arc::new(move || {
            let all = listed.all();
            Box::pin(async move { Ok(all) })
        });
        Self::assemble(seed, limits, store.clone(), Arc::new(store), inbox.clone(), Arc::new(inbox), lister)
    }

    /// A world on another durable store and inbox (e.g. MongoDB); `lister` lists its
    /// instances for the driver and the verdicts.
    pub fn with_durable(
        seed: u64,
        limits: HashMap<String, PermitLimits>,
        store: Arc<DynStore>,
        inbox: Arc<DynInbox>,
        lister: Lister,
    ) -> Self {
        Self::assemble(seed, limits, InMemoryStore::new(), store, InMemoryInbox::new(), inbox, lister)
    }

    fn assemble(
        seed: u64,
        limits: HashMap<String, PermitLimits>,
        store: InMemoryStore,
        durable: Arc<DynStore>,
        inbox: InMemoryInbox,
        durable_inbox: Arc<DynInbox>,
        lister: Lister,
    ) -> Self {
        let clock = Arc::new(ManualClock::default());
        World {
            permits: InMemoryPermits::new(clock.clone(), limits, DurationMs::from_secs(30)),
            clock,
            audit: AuditStore::new(durable.clone()),
            durable,
            durable_inbox,
            lister,
            store,
            inbox,
            queue: InMemoryQueue::default(),
            wakeup: InMemoryWakeup::new(),
            ids: Arc::new(SeqIds::new("t", seed)),
            observations: RecordingSink::default(),
            streams: InMemoryStreamSink::default(),
            dead_letters: crate::memory::MemoryDeadLetters::new(),
            task_inbox: crate::memory::MemoryTaskInbox::new(),
            result_cache: crate::memory::MemoryResultCache::new(),
        }
    }

    /// Every instance of the durable store.
    pub async fn instances(&self) -> Result<Vec<WorkflowInstance>> {
        (self.lister)().await
    }

    /// One instance, read from the durable store without auditing.
    pub async fn instance(&self, workflow_id: &str) -> Option<WorkflowInstance> {
        self.durable.get(&WorkflowId::from(workflow_id)).await.ok().flatten()
    }

    /// Current simulated time.
    pub fn now(&self) -> Instant {
        kernel_core::ports::Clock::now(&*self.clock)
    }

    /// The ports, store audited.
    pub fn ports(&self) -> Ports {
        Ports {
            store: Arc::new(self.audit.clone()),
            inbox: self.durable_inbox.clone(),
            queue: Arc::new(self.queue.clone()),
            wakeup: Arc::new(self.wakeup.clone()),
            permits: Arc::new(self.permits.clone()),
            clock: self.clock.clone(),
            ids: self.ids.clone(),
            observer: Arc::new(self.observations.clone()),
            stream: Arc::new(self.streams.clone()),
            result_cache: Some(Arc::new(self.result_cache.clone())),
            dead_letters: Some(Arc::new(self.dead_letters.clone())),
            task_inbox: Some(Arc::new(self.task_inbox.clone())),
        }
    }

    /// An engine on these ports.
    pub fn engine(&self, worker_id: &str, defs: Vec<Definition>) -> Engine {
        self.engine_on(self.ports(), test_config(worker_id), defs)
    }

    /// An engine on the given ports and settings.
    pub fn engine_on(&self, ports: Ports, config: EngineConfig, defs: Vec<Definition>) -> Engine {
        let mut b = Engine::builder(ports).config(config);
        for d in defs {
            b = b.register(d);
        }
        b.build().expect("valid test engine")
    }

    /// An engine whose store, inbox, queue, permits, wakeup, stream, dead-letter, task-inbox
    /// and result-cache calls go through a crash switch following `plan`.
    pub fn crashing_engine(
        &self,
        worker_id: &str,
        defs: Vec<Definition>,
        plan: CrashPlan,
    ) -> (Engine, Arc<CrashSwitch>) {
        let switch = CrashSwitch::new(plan);
        let p = self.ports();
        let gated = Arc::new(
            CrashPorts::new(
                switch.clone(),
                p.store.clone(),
                p.inbox.clone(),
                p.queue.clone(),
                p.permits.clone(),
                p.wakeup.clone(),
            )
            .with_stream(p.stream.clone())
            .with_side_ports(p.dead_letters.clone(), p.task_inbox.clone(), p.result_cache.clone()),
        );
        let ports = gated.wire(p);
        (self.engine_on(ports, test_config(worker_id), defs), switch)
    }

    /// Start `workflow_type` for `biz_key` on `engine` with the input `{}` and an id the
    /// engine generates; the instance's id. Panics when the start fails.
    pub async fn start(&self, engine: &Engine, workflow_type: &str, biz_key: &str) -> WorkflowId {
        let req = StartRequest::new(workflow_type, biz_key, serde_json::json!({}));
        engine.publisher().start_or_resume(req).await.unwrap().instance.workflow_id
    }

    /// [`start`](Self::start) under the workflow id `workflow_id`; the start's outcome.
    pub async fn start_as(
        &self,
        engine: &Engine,
        workflow_type: &str,
        biz_key: &str,
        workflow_id: &str,
    ) -> StartOutcome {
        let req = StartRequest::new(workflow_type, biz_key, serde_json::json!({})).workflow_id(workflow_id);
        engine.publisher().start_or_resume(req).await.unwrap()
    }

    /// One workflow of `def` on a new engine `A` of this world: [`start`](Self::start)ed,
    /// [`drive`](Self::drive)n until nothing is left to do; the last stored instance
    /// afterwards (the workflow's, in a world that held no other).
    pub async fn run_to_rest(&self, def: Definition, workflow_type: &str, biz_key: &str) -> WorkflowInstance {
        let engine = self.engine("A", vec![def]);
        self.start(&engine, workflow_type, biz_key).await;
        self.drive(&engine).await.unwrap();
        self.instances().await.unwrap().pop().unwrap()
    }

    /// Run `engine` to quiescence: maintenance, scheduling rounds until idle, then move the
    /// clock to the next `claimable_time` of a non-terminal instance; stop when there is
    /// none, when `stop` says so, or after `iterations_max` passes.
    pub async fn drive_until(&self, engine: &Engine, iterations_max: usize, stop: StopFn<'_>) -> Result<DriveReport> {
        self.drive_all_until(&[engine], iterations_max, stop).await
    }

    /// [`drive_until`](Self::drive_until) without a stop condition, 10 000 passes at most.
    /// The report lists every claim's end; `report.claims()` is the old count.
    pub async fn drive(&self, engine: &Engine) -> Result<DriveReport> {
        self.drive_until(engine, 10_000, &|| false).await
    }

    /// Several engines on this world's ports, concurrently in simulated time: each pass
    /// runs every engine's maintenance and scheduling rounds side by side (one claim each in
    /// turn), and the clock moves only when all are idle, as in [`drive`](Self::drive).
    /// The report says which engine ran which claim.
    pub async fn drive_all(&self, engines: &[&Engine]) -> Result<DriveReport> {
        self.drive_all_until(engines, 10_000, &|| false).await
    }

    /// [`drive_all`](Self::drive_all) with a stop condition and a pass limit.
    pub async fn drive_all_until(
        &self,
        engines: &[&Engine],
        iterations_max: usize,
        stop: StopFn<'_>,
    ) -> Result<DriveReport> {
        let mut report = DriveReport::default();
        // One engine never yields between rounds, so a single drive interleaves with other
        // tasks exactly as it always has; several take turns claim by claim.
        let take_turns = engines.len() > 1;
        for _ in 0..iterations_max {
            if stop() {
                return Ok(report);
            }
            let passes = engines.iter().map(|e| Self::pass(e, stop, take_turns));
            let mut stopped = false;
            let mut failed = None;
            for (claims, r) in futures::future::join_all(passes).await {
                report.claims.extend(claims);
                match r {
                    Ok(s) => stopped |= s,
                    Err(e) => {
                        failed.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = failed {
                return Err(e);
            }
            if stopped {
                return Ok(report);
            }
            let now = self.now();
            let all = self.instances().await?;
            // A workflow parked on a dead letter waits for an operator: its poll fallback
            // is not a reason to move the clock (a test that wants the poll moves it).
            let on_operator = |i: &WorkflowInstance| {
                i.wait
                    .as_ref()
                    .and_then(|w| w.signal_identity())
                    .is_some_and(|w| w.signal_type == kernel_core::engine::DEAD_LETTER_SIGNAL)
            };
            let live = || all.iter().filter(|i| !i.status.is_terminal() && !on_operator(i));
            let next = live().filter_map(|i| i.claimable_time).filter(|t| *t > now).min();
            let due_now = live().any(|i| i.claimable_time.is_some_and(|t| t <= now));
            match next {
                _ if due_now => self.clock.advance(1),
                Some(t) => self.clock.set(t),
                None => return Ok(report),
            }
        }
        Ok(report)
    }

    /// One engine's pass: maintenance, then rounds until idle. Returns the claims it ran and
    /// whether `stop` cut it short.
    async fn pass(engine: &Engine, stop: StopFn<'_>, take_turns: bool) -> (Vec<DrivenClaim>, Result<bool>) {
        let mut claims = Vec::new();
        if let Err(e) = engine.maintain().await {
            return (claims, Err(e));
        }
        loop {
            if stop() {
                return (claims, Ok(true));
            }
            match engine.tick().await {
                Ok(RoundOutcome::Ran { workflow_id, end }) => {
                    claims.push(DrivenClaim { worker_id: engine.config().worker_id.clone(), workflow_id, end });
                    if take_turns {
                        tokio::task::yield_now().await;
                    }
                }
                Ok(_) => return (claims, Ok(false)),
                Err(e) => return (claims, Err(e)),
            }
        }
    }
}

/// A boxed future, as scenarios hand them out.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// Business-side facts a scenario reports after a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScenarioVerdict {
    /// biz keys the scenario expected to exist.
    pub expected: Vec<String>,
    /// biz keys whose current round has no business result.
    pub unfinished: Vec<String>,
    /// Most effective external jobs created for one (instance, run).
    pub effective_jobs_max: u64,
    /// Submissions the external system saw after the job id was committed.
    pub late_submissions: u64,
}

/// One instantiated scenario: definitions bound to its fake business world.
pub trait ScenarioRun {
    /// Definitions to register on every engine of the run.
    fn definitions(&self) -> Vec<Definition>;
    /// Issue the start requests. Idempotent: after a crash it is issued again, as a client
    /// retry or a recovery dispatcher would.
    fn start<'a>(&'a self, engine: &'a Engine) -> BoxFuture<'a, Result<()>>;
    /// Business-side verdict after the final drain, given every stored instance.
    fn verdict(&self, instances: &[WorkflowInstance]) -> ScenarioVerdict;
    /// An operator's turn once the engine is idle (decide a dead letter, regenerate a
    /// step): `Ok(true)` when it changed something, so the harness drives again. Called
    /// again after a crash, on the new engine; make it idempotent. Default: nothing.
    fn operate<'a>(&'a self, engine: &'a Engine, world: &'a World) -> BoxFuture<'a, Result<bool>> {
        let _ = (engine, world);
        Box::pin(async { Ok(false) })
    }
}

/// Drive `engine` to quiescence, then let the scenario's operator act and drive again,
/// at most `OPERATOR_TURNS` times.
async fn drive_with_operator(run: &dyn ScenarioRun, world: &World, engine: &Engine, stop: StopFn<'_>) -> Result<()> {
    const OPERATOR_TURNS: usize = 6;
    world.drive_until(engine, 10_000, stop).await?;
    for _ in 0..OPERATOR_TURNS {
        if stop() || !run.operate(engine, world).await? {
            break;
        }
        world.drive_until(engine, 10_000, stop).await?;
    }
    Ok(())
}

/// A workflow story the sweep can replay with a crash anywhere.
pub trait Scenario {
    /// Name in reports.
    fn name(&self) -> String;
    /// Fresh business world for one run.
    fn instantiate(&self, world: &World) -> Box<dyn ScenarioRun>;
}

/// Totals of a sweep, computed by the harness from the store and the business fakes,
/// independently of the engine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Persistence boundaries discovered (sum over scenarios).
    pub boundaries: u64,
    /// Crash runs executed.
    pub runs: u64,
    /// Expected instances missing.
    pub lost: u64,
    /// Accepted completions above one per (instance, run, step).
    pub duplicate_step_completions: u64,
    /// Token-guarded writes zombies attempted after release.
    pub stale_writes_attempted: u64,
    /// Of those, accepted.
    pub stale_writes_accepted: u64,
    /// Instances not terminal, or without their current round's business result.
    pub unfinished: u64,
    /// Most effective external jobs of one (instance, run).
    pub effective_asr_jobs_max: u64,
    /// External submissions after the job id was committed.
    pub late_asr_submissions: u64,
    /// Runs where the zombie did not finish (hang detector).
    pub hung_zombies: u64,
    /// Boundary names with how many crash points each produced.
    pub by_boundary: BTreeMap<String, u64>,
    /// Crash runs whose planned crash happened (must equal `runs`).
    pub crashes_fired: u64,
    /// The crash points whose planned crash never happened: `scenario plan boundary`.
    pub unfired: Vec<String>,
    /// Crash points before a boundary call.
    pub points_before: u64,
    /// Crash points after a boundary call.
    pub points_after: u64,
    /// Boundary calls that changed nothing (a purge that deleted no record), left out of
    /// `boundaries` and of the crash points.
    pub idle_skipped: u64,
    /// Per scenario, its crash points `[before, after]`.
    pub by_scenario: BTreeMap<String, [u64; 2]>,
}

impl SweepReport {
    /// Panic unless the sweep kept every K-3 promise: nothing lost, no step completed
    /// twice, zombies tried stale writes and none was accepted, everything finished, one
    /// effective external job per run, no late submission, no hung zombie.
    ///
    /// Also panics when a planned crash never happened: such a run tested nothing.
    pub fn assert_clean(&self) {
        assert!(self.unfired.is_empty(), "planned crashes that never happened: {:?}", self.unfired);
        assert_eq!(self.crashes_fired, self.runs, "{self:?}");
        assert_eq!(self.lost, 0, "{self:?}");
        assert_eq!(self.duplicate_step_completions, 0, "{self:?}");
        assert_eq!(self.stale_writes_accepted, 0, "{self:?}");
        assert!(self.stale_writes_attempted > 0, "{self:?}");
        assert_eq!(self.unfinished, 0, "{self:?}");
        assert_eq!(self.effective_asr_jobs_max, 1, "{self:?}");
        assert_eq!(self.late_asr_submissions, 0, "{self:?}");
        assert_eq!(self.hung_zombies, 0, "{self:?}");
    }
}

impl SweepReport {
    /// `by_boundary` on one line: `name:points,name:points,…` (names contain no comma).
    pub fn boundary_map(&self) -> String {
        self.by_boundary.iter().map(|(k, v)| format!("{k}:{v}")).collect::<Vec<_>>().join(",")
    }
    /// Crash points on boundaries whose name starts with `prefix`.
    pub fn points_at(&self, prefix: &str) -> u64 {
        self.by_boundary.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(_, v)| v).sum()
    }
}

impl std::fmt::Display for SweepReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "crash-sweep: boundaries={} runs={} lost={} duplicate_step_completions={} stale_writes_attempted={} stale_writes_accepted={} unfinished={} effective_asr_jobs_max={} crashes_fired={} points_before={} points_after={} idle_skipped={} boundary_map={}",
            self.boundaries,
            self.runs,
            self.lost,
            self.duplicate_step_completions,
            self.stale_writes_attempted,
            self.stale_writes_accepted,
            self.unfinished,
            self.effective_asr_jobs_max,
            self.crashes_fired,
            self.points_before,
            self.points_after,
            self.idle_skipped,
            self.boundary_map()
        )
    }
}

/// Which crash points to visit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepSample {
    /// Every boundary, before and after.
    All,
    /// At most this many points per scenario, spread evenly over its boundaries, the side
    /// alternating (before, after, before, …) so both sides are visited.
    AtMost(usize),
    /// About `points` points over all scenarios, chosen by `seed`: each scenario gets an
    /// equal share (at least two: one before, one after a boundary), its points go to
    /// distinct boundary names, the names the fewest scenarios cross first (what only this
    /// scenario reaches, e.g. `store.claim_any` when the queue is down), and the sides
    /// alternate.
    Seeded {
        /// Points over all scenarios.
        points: usize,
        /// Seed of the choice.
        seed: u64,
    },
}

impl SweepSample {
    /// The crash points of scenario number `nth` of `scenarios` whose clean run crossed
    /// `log`, leaving out the `idle` indices; `spread` says how many scenarios cross each
    /// boundary name.
    fn points(
        self,
        log: &[BoundaryName],
        idle: &std::collections::BTreeSet<u64>,
        nth: usize,
        scenarios: usize,
        spread: &BTreeMap<BoundaryName, usize>,
    ) -> Vec<CrashPlan> {
        let live: Vec<u64> = (0..log.len() as u64).filter(|i| !idle.contains(i)).collect();
        let side = |k: usize, i: u64| if k.is_multiple_of(2) { CrashPlan::Before(i) } else { CrashPlan::After(i) };
        match self {
            SweepSample::All => live.iter().flat_map(|&i| [CrashPlan::Before(i), CrashPlan::After(i)]).collect(),
            SweepSample::AtMost(n) => {
                if n == 0 || live.len() * 2 <= n {
                    return SweepSample::All.points(log, idle, nth, scenarios, spread);
                }
                let step = live.len() as f64 / n as f64;
                (0..n).map(|k| side(k, live[((k as f64 * step) as usize).min(live.len() - 1)])).collect()
            }
            SweepSample::Seeded { points, seed } => {
                use rand::seq::SliceRandom;
                use rand::SeedableRng;
                let scenarios = scenarios.max(1);
                let share = (points / scenarios + usize::from(nth < points % scenarios)).max(2);
                if live.len() * 2 <= share {
                    return SweepSample::All.points(log, idle, nth, scenarios, spread);
                }
                let mut rng =
                    rand::rngs::SmallRng::seed_from_u64(seed ^ (nth as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                // Indices grouped by boundary name, names and indices in random order;
                // take one index per name in turn, so the share reaches as many names as it can.
                let mut by_name: BTreeMap<BoundaryName, Vec<u64>> = BTreeMap::new();
                for &i in &live {
                    by_name.entry(log[i as usize]).or_default().push(i);
                }
                let mut groups: Vec<(BoundaryName, Vec<u64>)> = by_name.into_iter().collect();
                groups.shuffle(&mut rng);
                for (_, g) in &mut groups {
                    g.shuffle(&mut rng);
                }
                // Rarest names first (a stable sort keeps the seeded order among equals).
                groups.sort_by_key(|(name, _)| spread.get(name).copied().unwrap_or(0));
                let first_side = usize::from(rand::Rng::gen_bool(&mut rng, 0.5));
                let mut picked = Vec::new();
                let mut round = 0;
                while picked.len() < share {
                    let mut any = false;
                    for (_, g) in &groups {
                        if let Some(&i) = g.get(round) {
                            any = true;
                            if picked.len() < share {
                                picked.push(side(picked.len() + first_side, i));
                            }
                        }
                    }
                    if !any {
                        break;
                    }
                    round += 1;
                }
                picked
            }
        }
    }
}

/// The crash-window sweep: discover every persistence boundary a scenario's engine crosses
/// in a clean run, then for each boundary and each side (before / after the call) replay
/// the scenario with a crash there, recover with a fresh engine on the surviving state,
/// resume the crashed engine as a zombie that tries its pending write, drain, and count.
pub async fn sweep(scenarios: &[&dyn Scenario], seed: u64, sample: SweepSample) -> SweepReport {
    sweep_on(scenarios, seed, sample, &|seed| Box::pin(async move { World::new(seed) })).await
}

/// Makes a fresh world for one run of a sweep (a fresh database, say).
pub type WorldFactory<'a> = &'a dyn Fn(u64) -> BoxFuture<'static, World>;

/// [`sweep`] on worlds made by `factory`, e.g. on MongoDB.
pub async fn sweep_on(
    scenarios: &[&dyn Scenario],
    seed: u64,
    sample: SweepSample,
    factory: WorldFactory<'_>,
) -> SweepReport {
    let mut report = SweepReport::default();
    let mut found = Vec::with_capacity(scenarios.len());
    for sc in scenarios {
        found.push(discover(*sc, factory(seed).await).await);
    }
    let mut spread: BTreeMap<BoundaryName, usize> = BTreeMap::new();
    for (log, idle) in &found {
        let names: std::collections::BTreeSet<BoundaryName> =
            log.iter().enumerate().filter(|(i, _)| !idle.contains(&(*i as u64))).map(|(_, n)| *n).collect();
        for n in names {
            *spread.entry(n).or_insert(0) += 1;
        }
    }
    for (nth, (sc, (log, idle))) in scenarios.iter().zip(&found).enumerate() {
        report.boundaries += (log.len() - idle.len()) as u64;
        report.idle_skipped += idle.len() as u64;
        for plan in sample.points(log, idle, nth, scenarios.len(), &spread) {
            let sides = report.by_scenario.entry(sc.name()).or_default();
            let idx = match plan {
                CrashPlan::Before(i) => {
                    report.points_before += 1;
                    sides[0] += 1;
                    i as usize
                }
                CrashPlan::After(i) => {
                    report.points_after += 1;
                    sides[1] += 1;
                    i as usize
                }
                _ => 0,
            };
            *report.by_boundary.entry(log[idx].to_string()).or_insert(0) += 1;
            let r = crash_run_on(*sc, factory(seed).await, plan).await;
            report.runs += 1;
            report.crashes_fired += r.crashes_fired;
            if r.crashes_fired == 0 {
                report.unfired.push(format!("{} {plan:?} {}", sc.name(), log[idx]));
            }
            report.lost += r.lost;
            report.duplicate_step_completions += r.duplicate_step_completions;
            report.stale_writes_attempted += r.stale_writes_attempted;
            report.stale_writes_accepted += r.stale_writes_accepted;
            report.unfinished += r.unfinished;
            report.effective_asr_jobs_max = report.effective_asr_jobs_max.max(r.effective_asr_jobs_max);
            report.late_asr_submissions += r.late_asr_submissions;
            report.hung_zombies += r.hung_zombies;
        }
    }
    report
}

/// The boundaries a scenario's clean run crosses, and the idle ones among them.
async fn discover(sc: &dyn Scenario, world: World) -> (Vec<BoundaryName>, std::collections::BTreeSet<u64>) {
    let run = sc.instantiate(&world);
    let (engine, switch) = world.crashing_engine("A", run.definitions(), CrashPlan::Never);
    run.start(&engine).await.expect("clean start");
    drive_with_operator(&*run, &world, &engine, &|| false).await.expect("clean drive");
    (switch.log(), switch.idle())
}
/// One crash run; public so a failing point can be replayed alone.
pub async fn crash_run(sc: &dyn Scenario, seed: u64, plan: CrashPlan) -> SweepReport {
    crash_run_on(sc, World::new(seed), plan).await
}

/// [`crash_run`] on a given world.
pub async fn crash_run_on(sc: &dyn Scenario, world: World, plan: CrashPlan) -> SweepReport {
    let run = sc.instantiate(&world);
    let defs = run.definitions();
    let (e1, switch) = world.crashing_engine("A", defs.clone(), plan);
    let stop_switch = switch.clone();
    let stop = move || stop_switch.is_crashed();
    let mut first: BoxFuture<'_, ()> = Box::pin(async {
        if run.start(&e1).await.is_ok() && !stop() {
            let _ = drive_with_operator(&*run, &world, &e1, &stop).await;
        }
    });
    let crashed = tokio::select! {
        _ = &mut first => false,
        _ = switch.wait_crashed() => true,
    };
    let mut out = SweepReport { crashes_fired: u64::from(crashed), runs: 1, ..SweepReport::default() };
    if crashed {
        // A fresh process on the surviving durable state; the client retries its request.
        // It pauses right after its first takeover of a leased instance, so the zombie's
        // pending write meets an instance that is running under the new token.
        let pause = Arc::new(crate::faults::TakeoverPause::new(world.ports().store, world.durable.clone()));
        let mut ports = world.ports();
        ports.store = pause.clone();
        let e2 = world.engine_on(ports, test_config("B"), defs.clone());
        let mut second: BoxFuture<'_, ()> = Box::pin(async {
            let _ = run.start(&e2).await;
            let _ = world.drive(&e2).await;
        });
        let took_over = tokio::select! {
            _ = &mut second => false,
            _ = pause.wait_paused() => true,
        };
        // The crashed process comes back late and tries its pending write.
        switch.release();
        if tokio::time::timeout(std::time::Duration::from_secs(20), &mut first).await.is_err() {
            out.hung_zombies += 1;
        }
        pause.resume();
        if took_over {
            second.await;
        }
        let _ = drive_with_operator(&*run, &world, &e2, &|| false).await;
        let z = switch.zombie_stats();
        out.stale_writes_attempted = z.stale_writes_attempted;
        out.stale_writes_accepted = z.stale_writes_accepted;
    }
    let instances = world.instances().await.unwrap_or_default();
    let verdict = run.verdict(&instances);
    out.lost = verdict.expected.iter().filter(|k| !instances.iter().any(|i| &i.biz_key == *k)).count() as u64;
    let not_terminal = instances.iter().filter(|i| !i.status.is_terminal()).count() as u64;
    out.unfinished = not_terminal.max(verdict.unfinished.len() as u64);
    out.duplicate_step_completions = world.audit.counts().duplicate_step_completions();
    out.effective_asr_jobs_max = verdict.effective_jobs_max;
    out.late_asr_submissions = verdict.late_submissions;
    out
}
