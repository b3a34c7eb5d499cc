//! Running invoices on the kernel in simulated time: a world (in memory or on a SQLite
//! file) with the manual clock, engines whose ports go through a crash switch (a restart
//! fault kills one and a fresh one recovers on the surviving state), a permit decorator
//! that counts the backlog, and a scripted approver deciding through the `TaskDesk`.

use crate::fakes::Timing;
use crate::pipeline::{self, Business};
use kernel_core::domain::{DurationMs, Instant, WorkflowInstance};
use kernel_core::engine::{Engine, EngineConfig, Ports, RoundOutcome};
use kernel_core::ports::{
    Actor, DynIds, DynPermits, DynTaskInbox, PermitDecision, PermitOwner, PermitUsage, Permits, Signal,
    TaskDecideOutcome, TaskOutcome, TaskReason,
};
use kernel_core::{StartRequest, WorkflowId};
use kernel_tasks::{TaskDesk, HUMAN_TASK_SIGNAL};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use testkit::faults::{CrashPlan, CrashPorts, CrashSwitch};
use testkit::harness::{test_config, Lister, World};
use testkit::memory::PermitLimits;

/// Where the durable state lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreKind {
    /// The in-memory store of the test kit.
    Memory,
    /// One SQLite file per batch in this directory.
    Sqlite(PathBuf),
    /// A PostgreSQL server (URL): one fresh schema per batch, dropped by [`drop_scratch`].
    Postgres(String),
    /// A MongoDB server (URI): one fresh database per batch, dropped by [`drop_scratch`].
    Mongo(String),
}

impl StoreKind {
    /// `memory` or `sqlite`.
    pub fn name(&self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::Sqlite(_) => "sqlite",
            StoreKind::Postgres(_) => "postgres",
            StoreKind::Mongo(_) => "mongo",
        }
    }
}

/// How the scripted approver treats one invoice's task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApproverPlan {
    /// Finance approves after 20 minutes.
    Prompt,
    /// Finance rejects after 30 minutes.
    Reject,
    /// Finance approves after 3 hours (after the reminder, within the SLA).
    Slow,
    /// Finance never answers; the CFO approves 2 hours into the escalation.
    AbsentThenCfo,
    /// Nobody answers: the task runs out of escalation levels.
    Absent,
}

impl ApproverPlan {
    /// When (after the task's opening) and how the level's actor decides, if at all.
    fn decision(self, level: u32) -> Option<(i64, TaskOutcome)> {
        match (self, level) {
            (ApproverPlan::Prompt, 0) => Some((20 * 60_000, TaskOutcome::Approve)),
            (ApproverPlan::Reject, 0) => Some((30 * 60_000, TaskOutcome::Reject)),
            (ApproverPlan::Slow, 0) => Some((3 * 3_600_000, TaskOutcome::Approve)),
            (ApproverPlan::AbsentThenCfo, 1) => Some((2 * 3_600_000, TaskOutcome::Approve)),
            _ => None,
        }
    }
    /// Whether this plan is an injected slow or absent approver.
    pub fn is_fault(self) -> bool {
        matches!(self, ApproverPlan::Slow | ApproverPlan::AbsentThenCfo | ApproverPlan::Absent)
    }
}

/// What the approver did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApproverCounts {
    /// Decisions stored.
    pub decided: u64,
    /// Duplicate callbacks delivered (a second ring, a second decision, a signal under a
    /// new id).
    pub duplicates: u64,
    /// Refusals of the duplicate decisions (already decided or closed).
    pub duplicates_refused: u64,
    /// Tasks the approver let wait past their reminder or SLA (slow or absent).
    pub delayed: u64,
}

/// A scripted approver: finance clerks and the CFO deciding through the `TaskDesk`.
pub struct Approver {
    desk: Mutex<Option<TaskDesk>>,
    plans: BTreeMap<String, ApproverPlan>,
    duplicate: BTreeSet<String>,
    counts: Mutex<ApproverCounts>,
    seen: Mutex<BTreeSet<String>>,
    next: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Approver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Approver").field("plans", &self.plans.len()).finish_non_exhaustive()
    }
}

fn clerk() -> Actor {
    Actor { id: "clerk".into(), roles: vec!["finance".into()] }
}
fn cfo() -> Actor {
    Actor { id: "cfo".into(), roles: vec![] }
}

impl Approver {
    /// An approver following `plans` per workflow id; for the workflows in `duplicate`
    /// every callback is delivered twice more. It decides at the desk given by
    /// [`use_desk`](Self::use_desk).
    pub fn new(plans: BTreeMap<String, ApproverPlan>, duplicate: BTreeSet<String>) -> Approver {
        Approver {
            desk: Mutex::default(),
            plans,
            duplicate,
            counts: Mutex::default(),
            seen: Mutex::default(),
            next: Mutex::default(),
        }
    }

    /// Decide at `desk` from now on (the desk of the engine now running).
    pub fn use_desk(&self, desk: TaskDesk) {
        *self.desk.lock().expect("approver lock") = Some(desk);
    }

    /// What it did.
    pub fn counts(&self) -> ApproverCounts {
        *self.counts.lock().expect("approver lock")
    }

    /// The next time it will decide something, as of its last turn.
    pub fn next_decision(&self) -> Option<Instant> {
        *self.next.lock().expect("approver lock")
    }

    /// Decide every open task whose scripted time has come; true when it decided one.
    pub async fn act(&self, now: Instant, engine: &Engine) -> kernel_core::Result<bool> {
        let Some(desk) = self.desk.lock().expect("approver lock").clone() else { return Ok(false) };
        let mut acted = false;
        let mut next: Option<Instant> = None;
        for actor in [clerk(), cfo()] {
            let mut after: Option<String> = None;
            loop {
                let (page, last) = desk.open_tasks(&actor, after.as_deref(), 100).await?;
                for t in page {
                    let plan = self.plans.get(t.workflow_id.as_str()).copied().unwrap_or(ApproverPlan::Prompt);
                    if plan.is_fault() && self.seen.lock().expect("approver lock").insert(t.id.clone()) {
                        self.counts.lock().expect("approver lock").delayed += 1;
                    }
                    let Some((after_ms, outcome)) = plan.decision(t.level) else { continue };
                    let at = t.created_at.saturating_add(DurationMs::from_millis(after_ms));
                    if at > now {
                        next = Some(next.map_or(at, |n| n.min(at)));
                        continue;
                    }
                    if now >= t.due_at {
                        continue;
                    }
                    let reason = Some(TaskReason { sensitive: false, text: Some(format!("scripted {plan:?}")) });
                    let out = desk.decide(&t.id, &t.token, &actor, outcome, reason.clone()).await?;
                    if out != TaskDecideOutcome::Decided {
                        continue;
                    }
                    acted = true;
                    self.counts.lock().expect("approver lock").decided += 1;
                    if self.duplicate.contains(t.workflow_id.as_str()) {
                        // The same callback again, three ways.
                        desk.ring(&t).await?;
                        let again = desk.decide(&t.id, &t.token, &actor, outcome, reason).await?;
                        let sig = Signal::builder(t.workflow_id.clone(), HUMAN_TASK_SIGNAL)
                            .wait_key(t.id.clone())
                            .signal_id(format!("{}|callback-again", t.id))
                            .build()?;
                        engine.deliver_signal(sig).await?;
                        let mut c = self.counts.lock().expect("approver lock");
                        c.duplicates += 3;
                        c.duplicates_refused += u64::from(again != TaskDecideOutcome::Decided);
                    }
                }
                match last {
                    Some(l) => after = Some(l),
                    None => break,
                }
            }
        }
        *self.next.lock().expect("approver lock") = next;
        Ok(acted)
    }
}

/// Counts permit denials and the backlog of posts waiting for one.
#[derive(Debug, Default)]
pub struct PermitGauge {
    denied: AtomicU64,
    waiting: Mutex<BTreeSet<String>>,
    peak: AtomicU64,
}

impl PermitGauge {
    /// Denials so far.
    pub fn denied(&self) -> u64 {
        self.denied.load(Ordering::SeqCst)
    }
    /// Most workflows waiting for a permit at once.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::SeqCst)
    }
}

/// The permit port, counted by a [`PermitGauge`].
struct CountingPermits {
    inner: Arc<DynPermits>,
    gauge: Arc<PermitGauge>,
}

#[async_trait::async_trait]
impl Permits for CountingPermits {
    async fn acquire(&self, resource: &str, owner: &PermitOwner) -> kernel_core::Result<PermitDecision> {
        let d = self.inner.acquire(resource, owner).await?;
        let mut w = self.gauge.waiting.lock().expect("gauge lock");
        match d {
            PermitDecision::Denied { .. } => {
                self.gauge.denied.fetch_add(1, Ordering::SeqCst);
                w.insert(owner.workflow_id.to_string());
                self.gauge.peak.fetch_max(w.len() as u64, Ordering::SeqCst);
            }
            PermitDecision::Granted { .. } => {
                w.remove(owner.workflow_id.as_str());
            }
        }
        Ok(d)
    }
    async fn renew(&self, resource: &str, owner: &PermitOwner) -> kernel_core::Result<PermitDecision> {
        self.inner.renew(resource, owner).await
    }
    async fn release(&self, resource: &str, owner: &PermitOwner) -> kernel_core::Result<()> {
        self.inner.release(resource, owner).await
    }
    async fn usage(&self, resource: &str) -> kernel_core::Result<PermitUsage> {
        self.inner.usage(resource).await
    }
    async fn resources(&self) -> kernel_core::Result<Vec<String>> {
        self.inner.resources().await
    }
    async fn set_limits(&self, resource: &str, limits: PermitLimits) -> kernel_core::Result<()> {
        self.inner.set_limits(resource, limits).await
    }
}

/// One upload to run.
#[derive(Debug, Clone)]
pub struct Upload {
    /// The file.
    pub file: String,
    /// How the approver treats its task.
    pub approver: ApproverPlan,
    /// Deliver every callback of it twice more (the upload, the approval).
    pub duplicate: bool,
}

/// What a batch left behind.
pub struct BatchRun {
    /// The world (clock, store).
    pub world: World,
    /// The fakes it ran against.
    pub business: Business,
    /// Every instance at the end.
    pub instances: Vec<WorkflowInstance>,
    /// Engines killed by a restart fault.
    pub restarts: u64,
    /// Duplicate uploads delivered.
    pub duplicate_uploads: u64,
    /// The approver's counts.
    pub approver: ApproverCounts,
    /// The permit gauge.
    pub permits: Arc<PermitGauge>,
    /// Whether the drive stopped with live instances and nothing scheduled.
    pub stalled: bool,
}

impl std::fmt::Debug for BatchRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchRun").field("instances", &self.instances.len()).finish_non_exhaustive()
    }
}

/// The settings every engine of a batch runs with.
pub fn engine_config(worker: &str) -> EngineConfig {
    EngineConfig { compensation_escalation_roles: vec!["controller".into()], ..test_config(worker) }
}

/// A fresh world for one batch, and its task inbox.
///
/// # Errors
/// The SQLite file could not be opened.
pub async fn world(
    store: &StoreKind,
    seed: u64,
    batch: usize,
    limits: HashMap<String, PermitLimits>,
) -> kernel_core::Result<(World, Arc<DynTaskInbox>)> {
    match store {
        StoreKind::Memory => {
            let w = World::with_limits(seed, limits);
            let inbox: Arc<DynTaskInbox> = Arc::new(w.task_inbox.clone());
            Ok((w, inbox))
        }
        StoreKind::Sqlite(dir) => {
            std::fs::create_dir_all(dir)
                .map_err(|e| kernel_core::Error::unavailable(format!("create {}: {e}", dir.display())))?;
            let path = dir.join(format!("batch-{seed}-{batch}.db"));
            let _ = std::fs::remove_file(&path);
            let config = store_sqlite::SqliteConfig {
                synchronous: store_sqlite::Synchronous::Normal,
                ..store_sqlite::SqliteConfig::default()
            };
            let db = store_sqlite::SqliteDb::open(&path, config).await?;
            let st = store_sqlite::SqliteWorkflowStore::new(db.clone());
            let inbox = store_sqlite::SqliteSignalInbox::new(db.clone());
            let listed = st.clone();
            let lister: Lister = Arc::new(move || {
                let s = listed.clone();
                Box::pin(async move { s.list(1_000).await })
            });
            let w = World::with_durable(seed, limits, Arc::new(st), Arc::new(inbox), lister);
            Ok((w, Arc::new(store_sqlite::SqliteTaskInbox::new(db))))
        }
        StoreKind::Postgres(url) => {
            let schema = format!("invoice_eval_{}_{seed}_{batch}", std::process::id());
            let config = store_postgres::PostgresConfig { schema: schema.clone(), ..Default::default() };
            let pool = store_postgres::connect(url, &config)?;
            keep_scratch(Scratch::Postgres(pool.clone(), schema.clone()));
            store_postgres::migrate(&pool, &schema).await?;
            let st = store_postgres::PostgresWorkflowStore::new(pool.clone(), config.clone())?;
            let inbox = store_postgres::PostgresSignalInbox::new(pool.clone(), config.clone())?;
            let tasks = store_postgres::PostgresTaskInbox::new(pool, config)?;
            let listed = st.clone();
            let lister: Lister = Arc::new(move || {
                let s = listed.clone();
                Box::pin(async move { s.list(1_000).await })
            });
            let w = World::with_durable(seed, limits, Arc::new(st), Arc::new(inbox), lister);
            Ok((w, Arc::new(tasks)))
        }
        StoreKind::Mongo(uri) => {
            let db = store_mongo::connect(uri, &format!("invoice_eval_{}_{seed}_{batch}", std::process::id())).await?;
            keep_scratch(Scratch::Mongo(db.clone()));
            let config = store_mongo::MongoConfig::default();
            let st = store_mongo::MongoWorkflowStore::open(&db, config.clone()).await?;
            let inbox = store_mongo::MongoSignalInbox::open(&db, config.clone()).await?;
            let tasks = store_mongo::MongoTaskInbox::open(&db, config).await?;
            let listed = st.clone();
            let lister: Lister = Arc::new(move || {
                let s = listed.clone();
                Box::pin(async move { s.list(1_000).await })
            });
            let w = World::with_durable(seed, limits, Arc::new(st), Arc::new(inbox), lister);
            Ok((w, Arc::new(tasks)))
        }
    }
}

/// A schema or database made for a batch on a server.
enum Scratch {
    Postgres(store_postgres::Pool, String),
    Mongo(mongodb::Database),
}

/// What [`drop_scratch`] drops.
static SCRATCH: std::sync::Mutex<Vec<Scratch>> = std::sync::Mutex::new(Vec::new());

fn keep_scratch(s: Scratch) {
    SCRATCH.lock().expect("scratch list").push(s);
}

/// Drop every schema and database the batches on a server made (a run on memory or SQLite
/// made none). Best effort: a failure is printed, not returned.
pub async fn drop_scratch() {
    let all = std::mem::take(&mut *SCRATCH.lock().expect("scratch list"));
    for s in all {
        let dropped = match &s {
            Scratch::Postgres(pool, schema) => match pool.get().await {
                Ok(c) => c
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            },
            Scratch::Mongo(db) => db.drop().await.map_err(|e| e.to_string()),
        };
        if let Err(e) = dropped {
            eprintln!("scratch space not dropped: {e}");
        }
    }
}

fn ports(world: &World, tasks: &Arc<DynTaskInbox>, gauge: &Arc<PermitGauge>, switch: Arc<CrashSwitch>) -> Ports {
    let mut p = world.ports();
    p.task_inbox = Some(tasks.clone());
    p.permits = Arc::new(CountingPermits { inner: p.permits.clone(), gauge: gauge.clone() });
    let gated = Arc::new(
        CrashPorts::new(switch, p.store.clone(), p.inbox.clone(), p.queue.clone(), p.permits.clone(), p.wakeup.clone())
            .with_stream(p.stream.clone()),
    );
    gated.wire(p)
}

/// Passes of one drive at most.
const PASSES_MAX: usize = 20_000;
/// Engines of one batch at most (each restart fault kills one).
const ENGINES_MAX: usize = 200;

async fn drive(world: &World, engine: &Engine, approver: &Approver) -> kernel_core::Result<bool> {
    for _ in 0..PASSES_MAX {
        engine.maintain().await?;
        while let RoundOutcome::Ran { .. } = engine.tick().await? {}
        let now = world.now();
        if approver.act(now, engine).await? {
            continue;
        }
        let all = world.instances().await?;
        let live: Vec<&WorkflowInstance> = all.iter().filter(|i| !i.status.is_terminal()).collect();
        if live.is_empty() {
            return Ok(false);
        }
        let due_now = live.iter().any(|i| i.claimable_time.is_some_and(|t| t <= now));
        let next = live
            .iter()
            .filter_map(|i| i.claimable_time)
            .filter(|t| *t > now)
            .chain(approver.next_decision().filter(|t| *t > now))
            .min();
        match next {
            _ if due_now => world.clock.advance(1),
            Some(t) => world.clock.set(t),
            None => return Ok(true),
        }
    }
    Ok(true)
}

/// Run `uploads` on a fresh world, against the fakes `make` scripts on the world's clock
/// (with `upgrade`, the first engine runs the previous build and dies after the first
/// extraction; the current build resumes it from its `invoice@1` record) to the end: start them (duplicates twice), drive engines
/// in simulated time, replacing an engine a restart fault killed, then upload the
/// duplicates once more.
///
/// # Errors
/// A port's error (not an injected fault).
pub async fn run_batch(
    store: &StoreKind,
    seed: u64,
    batch: usize,
    limits: HashMap<String, PermitLimits>,
    make: &dyn Fn(Timing) -> Business,
    uploads: &[Upload],
    upgrade: bool,
) -> kernel_core::Result<BatchRun> {
    let (world, tasks) = world(store, seed, batch, limits).await?;
    let ids: Arc<DynIds> = world.ids.clone();
    let business = make(Timing::on(world.clock.clone()));
    let def = |n: usize| {
        let build = if upgrade && n == 0 { pipeline::Build::Previous } else { pipeline::Build::Current };
        pipeline::definition_of(build, &business, tasks.clone(), ids.clone())
    };
    if upgrade {
        business.restarts.plan_first("extract");
    }
    let plans =
        uploads.iter().map(|u| (pipeline::workflow_id(&crate::fakes::file_hash(&u.file)), u.approver)).collect();
    let duplicate = uploads
        .iter()
        .filter(|u| u.duplicate)
        .map(|u| pipeline::workflow_id(&crate::fakes::file_hash(&u.file)))
        .collect();
    let approver = Approver::new(plans, duplicate);
    let gauge = Arc::new(PermitGauge::default());
    let mut duplicate_uploads = 0;
    let start = |u: &Upload| {
        let hash = crate::fakes::file_hash(&u.file);
        StartRequest::new(pipeline::WORKFLOW_TYPE, hash.clone(), pipeline::start_input(&u.file))
            .workflow_id(WorkflowId::from(pipeline::workflow_id(&hash)))
    };
    let mut restarts = 0;
    let mut stalled = true;
    for n in 0..ENGINES_MAX {
        let switch = CrashSwitch::new(CrashPlan::Never);
        business.restarts.arm(switch.clone());
        let engine = world.engine_on(
            ports(&world, &tasks, &gauge, switch.clone()),
            engine_config(&format!("e{n}")),
            vec![def(n)?],
        );
        approver.use_desk(TaskDesk::new(tasks.clone(), engine.signal_sender(), world.clock.clone()));
        if n == 0 {
            for u in uploads {
                engine.publisher().start_or_resume(start(u)).await?;
                if u.duplicate {
                    engine.publisher().start_or_resume(start(u)).await?;
                    duplicate_uploads += 1;
                }
            }
        }
        let crashed = {
            let run = drive(&world, &engine, &approver);
            tokio::pin!(run);
            tokio::select! {
                r = &mut run => { stalled = r?; false }
                _ = switch.wait_crashed() => true,
            }
        };
        if !crashed {
            // The same uploads once more, after the end: nothing runs again.
            for u in uploads.iter().filter(|u| u.duplicate) {
                engine.publisher().start_or_resume(start(u)).await?;
                duplicate_uploads += 1;
            }
            break;
        }
        restarts += 1;
    }
    let instances = world.instances().await?;
    Ok(BatchRun {
        world,
        business,
        instances,
        restarts,
        duplicate_uploads,
        approver: approver.counts(),
        permits: gauge,
        stalled,
    })
}
