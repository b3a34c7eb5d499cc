//! The soak: many worker processes (separate OS processes, each an engine with its slots)
//! on one store (PostgreSQL in a fresh schema by default) and one Redis (lanes, wakeup,
//! permits) that the soak starts for itself, under a mixed load, while a chaos loop kills
//! processes with `SIGKILL` and restarts them, stops one with `SIGSTOP` past its claim
//! lease and its permit lease and continues it, and (with `--redis-restart`) kills and
//! restarts the Redis server. Judged from the store and the oracle file after every
//! process stopped; one line is printed (then a detail line):
//!
//! ```text
//! soak: processes=<n> workflows=<n> completed=<n> kills=<n> stops=<n> duplicate_effects=0 permit_breaches=0 permit_overshoot_max=<n> stale_writes_accepted=0 lost=0 redis_restarts=<n> elapsed_s=<n>
//! ```
//!
//! and the process exits non-zero when `completed` is not `workflows`, when a count that
//! must be zero is not, when fewer kills, stops or Redis restarts happened than asked for
//! (`--kills 3 --stops 1` by default), or when the wall-time cap (`--cap-secs`, 120 by
//! default) was reached: the run fails rather than hangs. Nothing asserts a duration.
//!
//! # The load
//!
//! Workflow `i` has shape `i % 4` ([`SHAPES`]): **linear** (`a` → `b` → `c`, `b` holding a
//! permit), **sleep** (`charge` → `nap`, a durable sleep of 0.2–1.2 s → `ship`), **signal**
//! (`charge` → `await_go` → `ship`; the supervisor delivers each `go` 0–1.5 s after the
//! start, some before the wait exists) and **fan-out** (`split` → `left`, `mid`, `right` in
//! one wave, `right` holding a permit → `join` after all three). Every other step is an
//! [`EffectStep`]: an effect line under its K-17.1 key in the oracle file, then
//! [`WORK_MS`] of work ([`HOLD_MS`] for the steps holding a permit). The permit resource
//! [`RESOURCE`] has a ceiling of [`CEILING`] holders shared by every process (K-14).
//!
//! # The chaos
//!
//! One action at a time, at least `--chaos-gap-ms` (1 000) apart, until the asked-for counts
//! are reached: a **kill** (`SIGKILL` of a random process caught inside a step, seen by a
//! fresh effect line of its pid; it is restarted at once), a **stop** (`SIGSTOP` of a random
//! process caught holding a permit, seen by a fresh hold line, for [`STOP_MS`], past both
//! the claim lease and the permit lease; it counts when, before the `SIGCONT`, the store
//! shows its claim taken over by another process) and a **Redis restart** (the dedicated
//! server killed, down for [`OUTAGE_MS`], started again empty on the same port: the engines
//! claim from the store meanwhile and the maintenance passes rebuild the lanes, K-13).
//! `--chaos-every-secs S` keeps going after that: a kill every S, a stop every 4 S, a Redis
//! restart every 10 S (with `--redis-restart`).
//!
//! # The figures
//!
//! - `completed`, `lost`, `duplicate_effects`, `stale_writes_accepted`: the store and the
//!   oracle file read after every process stopped, judged by [`kernel_examples::real::oracle::judge`] per
//!   shape.
//! - `permit_overshoot_max`: the most activities holding [`RESOURCE`] at once beyond
//!   [`CEILING`], from the hold lines' wall times (a span without an `end` ends when its
//!   process was killed, else at the end of the run). Raw: a holder frozen by `SIGSTOP`
//!   counts for as long as it is frozen, so a stop past the permit lease shows here (K-14
//!   allows it: the lease lapsed and the slot went to another holder).
//! - `permit_breaches`: the times the ceiling was exceeded for longer than one permit
//!   renewal interval ([`kernel_examples::real::engine_config`]'s `permit_renew_ms`), counted on the spans
//!   with the frozen stretches cut out (a frozen process puts no load on the resource; once
//!   continued, its lapsed permit may overshoot for at most one renewal interval).
//! - The detail line adds what a monitor sampled from Redis every 100 ms
//!   (`Permits::usage`): informational, the verdict comes from the file.
//!
//! # By hand: the long run and the throughput figures
//!
//! `--long` sets 100 000 workflows, at most 500 in flight (enough to keep 4 processes'
//! slots busy; more only lengthens the queue), chaos every 30 s, a 6 h cap and `--csv
//! soak-long.csv`: per `--window-secs` (10) window of the run, the workflows completed,
//! workflows/s, the p50/p99 latency of the effect steps completed in it, apart for those
//! holding a permit (from the step's readiness, its predecessors' completion or the
//! workflow's creation, to its own completion, as the store records them; a permit step's
//! includes its wait for the permit), and the kills, stops and Redis restarts begun in it.
//! `e2e-bench plot-soak` draws it. Throughput at 1, 2, 4 processes: `--kills 0 --stops 0
//! --in-flight 500 --processes N`; the detail line's `wf_s` is the workflows completed over
//! the span from the first creation to the last completion.

use compose::{Deployment, Role, Urls};
use futures::StreamExt;
use kernel_core::ports::{PermitLimits, PermitOwner, Signal};
use kernel_core::{Definition, Engine, StartRequest, StepDef, WorkflowId, WorkflowInstance};
use kernel_examples::real::oracle::{judge, Effect, Verdict, WorkflowView};
use kernel_examples::real::steps::{await_go, go_signal_id, nap, EffectStep};
use kernel_examples::real::{
    fresh_queue_url, fresh_store_url, queue_options, run_dir, take_flag, take_switch, wall_ms, Oracle, Tail, Worker,
    WorkerArgs, WorkerEnv, LEASE_MS, PERMIT_LEASE_MS,
};
use queue_redis::test_support::DedicatedRedis;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The store when neither `--store` nor `WFK_STORE` names one.
pub const DEFAULT_STORE: &str = "postgres://postgres@127.0.0.1:5432/test";
/// The permit resource every process shares.
pub const RESOURCE: &str = "soak_api";
/// Its ceiling: holders at once, over every process.
pub const CEILING: u32 = 3;
/// Work of a step after its effect.
pub const WORK_MS: u64 = 40;
/// Work of a step holding a permit after its effect.
pub const HOLD_MS: u64 = 20;
/// How long Redis is down in a Redis restart.
pub const OUTAGE_MS: u64 = 1_000;
/// How long a stopped process stays stopped at least: past its claim lease and its permit
/// lease.
pub const STOP_MS: u64 = (if LEASE_MS > PERMIT_LEASE_MS { LEASE_MS } else { PERMIT_LEASE_MS }) as u64 + 1_500;
/// How long a stopped process stays stopped at most, waiting for the store to show its
/// claim taken over (behind a deep ready queue that takes a while).
pub const STOP_MAX_MS: u64 = STOP_MS + 15_000;
/// A line in the oracle younger than this tells the supervisor its process is inside that
/// step now (a step works [`WORK_MS`] or [`HOLD_MS`] after its lines, then writes its completion).
const FRESH_MS: i64 = 30;
/// A stop waits this long for a process holding a permit before it takes one inside any step.
const HOLD_SEARCH: Duration = Duration::from_secs(10);

/// What a step of a shape does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An [`EffectStep`] of [`WORK_MS`].
    Effect,
    /// An [`EffectStep`] of [`HOLD_MS`] holding a permit of [`RESOURCE`].
    Holding,
    /// A durable sleep of the input's `sleep_ms`.
    Nap,
    /// A wait for the `go` signal.
    AwaitGo,
}

impl Kind {
    /// Whether the step writes an effect (and counts as work in the latency figures).
    pub fn is_effect(self) -> bool {
        matches!(self, Kind::Effect | Kind::Holding)
    }
}

/// One workflow type of the load: its steps in order, each with its dependencies.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// The workflow type.
    pub workflow_type: &'static str,
    /// `(name, depends_on, kind)`; the last step is the one that ends the workflow.
    pub steps: &'static [(&'static str, &'static [&'static str], Kind)],
}

impl Shape {
    /// The steps that write effects.
    pub fn effect_steps(&self) -> Vec<&'static str> {
        self.steps.iter().filter(|(_, _, k)| k.is_effect()).map(|(n, _, _)| *n).collect()
    }
    /// The step that ends the workflow.
    pub fn last_step(&self) -> &'static str {
        self.steps.last().map_or("", |(n, _, _)| n)
    }
}

/// The four shapes of the load; workflow `i` has shape `i % 4`.
pub const SHAPES: [Shape; 4] = [
    Shape {
        workflow_type: "soak_linear",
        steps: &[("a", &[], Kind::Effect), ("b", &["a"], Kind::Holding), ("c", &["b"], Kind::Effect)],
    },
    Shape {
        workflow_type: "soak_sleep",
        steps: &[("charge", &[], Kind::Effect), ("nap", &["charge"], Kind::Nap), ("ship", &["nap"], Kind::Effect)],
    },
    Shape {
        workflow_type: "soak_signal",
        steps: &[
            ("charge", &[], Kind::Effect),
            ("await_go", &["charge"], Kind::AwaitGo),
            ("ship", &["await_go"], Kind::Effect),
        ],
    },
    Shape {
        workflow_type: "soak_fanout",
        steps: &[
            ("split", &[], Kind::Effect),
            ("left", &["split"], Kind::Effect),
            ("mid", &["split"], Kind::Effect),
            ("right", &["split"], Kind::Effect),
            ("join", &["left", "mid", "right"], Kind::Effect),
        ],
    },
];

/// The shape of the signal workflows.
const SIGNAL_SHAPE: usize = 2;

/// The id of workflow `i`.
pub fn workflow_id(i: usize) -> String {
    format!("soak-{i:06}")
}

/// The shape index of a workflow id made by [`workflow_id`].
pub fn shape_of(id: &str) -> Option<usize> {
    id.strip_prefix("soak-")?.parse::<usize>().ok().map(|i| i % SHAPES.len())
}

/// The permit limits of every process: [`CEILING`] holders of [`RESOURCE`].
pub fn limits() -> HashMap<String, PermitLimits> {
    HashMap::from([(RESOURCE.to_string(), PermitLimits { max_concurrency: CEILING, max_starts_per_second: 0 })])
}

/// The definitions of the four shapes, their effects recorded into `oracle`.
pub fn definitions(oracle: &Arc<Oracle>) -> Vec<Definition> {
    SHAPES
        .iter()
        .map(|shape| {
            let mut b = Definition::builder(shape.workflow_type);
            for (name, deps, kind) in shape.steps {
                let step = match kind {
                    Kind::Effect => StepDef::new(*name, EffectStep::new(oracle.clone(), WORK_MS)).max_retry(3),
                    Kind::Holding => StepDef::new(*name, EffectStep::new(oracle.clone(), HOLD_MS).holding(RESOURCE))
                        .resource(RESOURCE)
                        .max_retry(3),
                    Kind::Nap => StepDef::new(*name, nap),
                    Kind::AwaitGo => StepDef::new(*name, await_go),
                };
                b = b.step(if deps.is_empty() { step } else { step.depends_on(deps.iter().copied()) });
            }
            b.build().expect("valid definition")
        })
        .collect()
}

/// The worker process of the soak.
pub async fn worker(args: WorkerArgs) -> Result<(), Box<dyn std::error::Error>> {
    kernel_examples::real::run_worker(args, queue_options(limits()), |env: &WorkerEnv| {
        Box::pin(async move { Ok(definitions(&env.oracle)) })
    })
    .await
}

// ---------------------------------------------------------------------------------------
// Settings and the line
// ---------------------------------------------------------------------------------------

/// Settings of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Worker processes.
    pub processes: usize,
    /// Workflows started.
    pub workflows: usize,
    /// Kills required (and made before any periodic chaos).
    pub kills: usize,
    /// Stops required.
    pub stops: usize,
    /// Redis restarts required (`--redis-restart` is 1).
    pub redis_restarts: usize,
    /// Least time between two chaos actions.
    pub chaos_gap: Duration,
    /// Periodic chaos once the required counts are reached.
    pub chaos_every: Option<Duration>,
    /// Most workflows started and not yet finished at once.
    pub in_flight: usize,
    /// Wall-time cap of the whole run.
    pub cap: Duration,
    /// Window of the CSV.
    pub window: Duration,
    /// Where to write the CSV of windows.
    pub csv: Option<PathBuf>,
    /// Seed of the chaos's choices.
    pub seed: u64,
    /// Progress lines on stderr every window.
    pub progress: bool,
    /// Keep the run directory (oracle, event logs, worker logs).
    pub keep: bool,
}

/// The flags, for the usage message.
pub const FLAGS: &str = "--store <url>, --processes 4, --workflows 2000, --kills 3, --stops 1, --redis-restart | --redis-restarts <n>, \
--chaos-gap-ms 1000, --chaos-every-secs <s>, --in-flight <n>, --cap-secs 120, --window-secs 10, --csv <path>, --seed <n>, \
--progress, --long, --keep";

/// Read the settings from the arguments left after `--store`.
pub fn parse_settings(mut rest: Vec<String>) -> Result<Settings, String> {
    let long = take_switch(&mut rest, "long");
    let redis_flag = take_switch(&mut rest, "redis-restart");
    let keep = take_switch(&mut rest, "keep");
    let progress = take_switch(&mut rest, "progress") || long;
    let csv = take_flag(&mut rest, "csv").map(PathBuf::from).or_else(|| long.then(|| "soak-long.csv".into()));
    let mut num = |name: &str, default: u64| -> Result<u64, String> {
        match take_flag(&mut rest, name) {
            Some(v) => v.parse().map_err(|_| format!("--{name} {v}: not a number")),
            None => Ok(default),
        }
    };
    let workflows = num("workflows", if long { 100_000 } else { 2_000 })? as usize;
    let s = Settings {
        processes: num("processes", 4)? as usize,
        workflows,
        kills: num("kills", 3)? as usize,
        stops: num("stops", 1)? as usize,
        redis_restarts: num("redis-restarts", u64::from(redis_flag))? as usize,
        chaos_gap: Duration::from_millis(num("chaos-gap-ms", 1_000)?),
        chaos_every: Some(num("chaos-every-secs", if long { 30 } else { 0 })?)
            .filter(|s| *s > 0)
            .map(Duration::from_secs),
        in_flight: num("in-flight", if long { 500 } else { workflows as u64 })? as usize,
        cap: Duration::from_secs(num("cap-secs", if long { 6 * 3_600 } else { 120 })?),
        window: Duration::from_secs(num("window-secs", 10)?.max(1)),
        csv,
        seed: num("seed", wall_ms() as u64)?,
        progress,
        keep,
    };
    if let Some(unknown) = rest.first() {
        return Err(format!("unknown argument {unknown} (flags: {FLAGS})"));
    }
    if s.processes == 0 || s.workflows == 0 || s.in_flight == 0 {
        return Err("--processes, --workflows and --in-flight must be at least 1".into());
    }
    if s.processes < 2 && s.stops > 0 {
        return Err("a stop needs another process to take over: --processes 2 or more, or --stops 0".into());
    }
    Ok(s)
}

/// The counts the line reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Line {
    /// `processes=`.
    pub processes: usize,
    /// `workflows=`.
    pub workflows: usize,
    /// `completed=`.
    pub completed: usize,
    /// `kills=`.
    pub kills: usize,
    /// `stops=`.
    pub stops: usize,
    /// `duplicate_effects=`.
    pub duplicate_effects: usize,
    /// `permit_breaches=`.
    pub permit_breaches: usize,
    /// `permit_overshoot_max=`.
    pub permit_overshoot_max: usize,
    /// `stale_writes_accepted=`.
    pub stale_writes_accepted: usize,
    /// `lost=`.
    pub lost: usize,
    /// `redis_restarts=`.
    pub redis_restarts: usize,
    /// `elapsed_s=`.
    pub elapsed_s: u64,
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "soak: processes={} workflows={} completed={} kills={} stops={} duplicate_effects={} permit_breaches={} permit_overshoot_max={} stale_writes_accepted={} lost={} redis_restarts={} elapsed_s={}",
            self.processes,
            self.workflows,
            self.completed,
            self.kills,
            self.stops,
            self.duplicate_effects,
            self.permit_breaches,
            self.permit_overshoot_max,
            self.stale_writes_accepted,
            self.lost,
            self.redis_restarts,
            self.elapsed_s
        )
    }
}

// ---------------------------------------------------------------------------------------
// Permit figures (pure)
// ---------------------------------------------------------------------------------------

/// One activity's span as a permit holder, from its hold lines (wall ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoldSpan {
    /// The process that ran it.
    pub pid: u64,
    /// Its `start` line.
    pub start: i64,
    /// Its `end` line, if one was written.
    pub end: Option<i64>,
}

/// What the supervisor did to a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChaosKind {
    /// `SIGKILL`.
    Kill,
    /// `SIGSTOP`.
    Stop,
    /// `SIGCONT`.
    Cont,
}

/// One chaos action, at wall time `t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChaosEvent {
    /// The process.
    pub pid: u64,
    /// When (wall ms).
    pub t: i64,
    /// What.
    pub kind: ChaosKind,
}

/// The permit figures of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PermitFigures {
    /// Hold spans read.
    pub holds: usize,
    /// Most holders at once, frozen holders included.
    pub peak: usize,
    /// `peak` beyond the ceiling.
    pub overshoot_max: usize,
    /// Most holders at once with the frozen stretches cut out.
    pub effective_peak: usize,
    /// Stretches above the ceiling (frozen stretches cut out) longer than the renewal
    /// interval.
    pub breaches: usize,
    /// The longest such stretch, ms.
    pub over_ms_max: i64,
}

/// Most intervals open at once, and the stretches during which more than `ceiling` were.
/// Intervals are half-open: one ending where another starts does not overlap it.
fn sweep(intervals: &[(i64, i64)], ceiling: usize) -> (usize, Vec<(i64, i64)>) {
    let mut events: Vec<(i64, i32)> = intervals.iter().flat_map(|(s, e)| [(*s, 1), (*e, -1)]).collect();
    events.sort_unstable();
    let (mut open, mut peak, mut over_since, mut over) = (0usize, 0usize, None, Vec::new());
    for (t, d) in events {
        if d > 0 {
            open += 1;
        } else {
            open = open.saturating_sub(1);
        }
        peak = peak.max(open);
        match over_since {
            None if open > ceiling => over_since = Some(t),
            Some(from) if open <= ceiling => {
                over.push((from, t));
                over_since = None;
            }
            _ => {}
        }
    }
    (peak, over)
}

/// Judge the hold spans against `ceiling`: `chaos` says when each process was killed
/// (a span without an `end` ends there, else at `run_end`) and frozen (cut out of the
/// effective spans); a breach is a stretch above the ceiling longer than `renew_ms`.
pub fn permit_figures(
    holds: &[HoldSpan],
    chaos: &[ChaosEvent],
    run_end: i64,
    ceiling: usize,
    renew_ms: i64,
) -> PermitFigures {
    let mut frozen: HashMap<u64, Vec<(i64, i64)>> = HashMap::new();
    let mut stopped_at: HashMap<u64, i64> = HashMap::new();
    let mut sorted = chaos.to_vec();
    sorted.sort_by_key(|c| c.t);
    for c in &sorted {
        match c.kind {
            ChaosKind::Stop => {
                stopped_at.insert(c.pid, c.t);
            }
            ChaosKind::Cont | ChaosKind::Kill => {
                if let Some(from) = stopped_at.remove(&c.pid) {
                    frozen.entry(c.pid).or_default().push((from, c.t));
                }
            }
        }
    }
    for (pid, from) in stopped_at {
        frozen.entry(pid).or_default().push((from, run_end));
    }
    let mut raw = Vec::with_capacity(holds.len());
    let mut effective = Vec::with_capacity(holds.len());
    for h in holds {
        let killed = sorted.iter().find(|c| c.kind == ChaosKind::Kill && c.pid == h.pid && c.t >= h.start);
        let end = h.end.or(killed.map(|c| c.t)).unwrap_or(run_end).max(h.start);
        raw.push((h.start, end));
        let mut from = h.start;
        let mut cuts = frozen.get(&h.pid).cloned().unwrap_or_default();
        cuts.sort_unstable();
        for (a, b) in cuts {
            if b <= from || a >= end {
                continue;
            }
            if a > from {
                effective.push((from, a));
            }
            from = from.max(b);
        }
        if from < end {
            effective.push((from, end));
        }
    }
    let (peak, _) = sweep(&raw, ceiling);
    let (effective_peak, over) = sweep(&effective, ceiling);
    PermitFigures {
        holds: holds.len(),
        peak,
        overshoot_max: peak.saturating_sub(ceiling),
        effective_peak,
        breaches: over.iter().filter(|(a, b)| b - a > renew_ms).count(),
        over_ms_max: over.iter().map(|(a, b)| b - a).max().unwrap_or(0),
    }
}

// ---------------------------------------------------------------------------------------
// Throughput and latency windows (pure)
// ---------------------------------------------------------------------------------------

/// When a workflow was created and finished, and each of its effect steps became ready
/// and completed (wall ms, as the store records them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Timing {
    /// `created_at`.
    pub created: i64,
    /// `finished_at` of a completed workflow.
    pub finished: Option<i64>,
    /// `(ready, completed, holds a permit)` of each completed effect step.
    pub steps: Vec<(i64, i64, bool)>,
}

impl Timing {
    /// The timing of `inst` of `shape`: a step is ready when its dependencies completed
    /// (the workflow's creation for a first step).
    pub fn of(inst: &WorkflowInstance, shape: &Shape) -> Timing {
        let created = inst.created_at.as_millis();
        let finished_of =
            |name: &str| inst.steps.iter().find(|s| s.name == name).and_then(|s| s.finished_at).map(|t| t.as_millis());
        let mut steps = Vec::new();
        for (name, deps, kind) in shape.steps {
            let done =
                inst.steps.iter().find(|s| s.name == *name).filter(|s| s.status == kernel_core::StepStatus::Completed);
            let (Some(finished), true) = (done.and_then(|s| s.finished_at), kind.is_effect()) else { continue };
            let ready: Option<i64> = deps.iter().try_fold(created, |r, d| finished_of(d).map(|t| r.max(t)));
            if let Some(ready) = ready {
                steps.push((ready, finished.as_millis(), *kind == Kind::Holding));
            }
        }
        Timing {
            created,
            finished: (inst.status == kernel_core::WorkflowStatus::Completed)
                .then(|| inst.finished_at.map(|t| t.as_millis()))
                .flatten(),
            steps,
        }
    }
}

/// How many latencies, and their p50 and p99 (ms).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Latency {
    /// How many.
    pub count: usize,
    /// p50, ms (0 for none).
    pub p50_ms: i64,
    /// p99, ms (0 for none).
    pub p99_ms: i64,
}

impl Latency {
    /// The figures of `values` (sorted here).
    pub fn of(mut values: Vec<i64>) -> Latency {
        values.sort_unstable();
        Latency { count: values.len(), p50_ms: percentile(&values, 0.50), p99_ms: percentile(&values, 0.99) }
    }
}

/// One window of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    /// Its start, seconds after the first creation.
    pub start_s: u64,
    /// Workflows completed in it.
    pub workflows: usize,
    /// Workflows completed per second.
    pub wf_s: f64,
    /// The effect steps without a permit completed in it: latency from ready to completed.
    pub steps: Latency,
    /// The same of the steps holding a permit (their wait for it included).
    pub permit_steps: Latency,
    /// Kills, stops and Redis restarts begun in it.
    pub chaos: [usize; 3],
}

/// The whole run's figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// Workflows completed over the span from the first creation to the last completion.
    pub wf_s: f64,
    /// That span, ms.
    pub span_ms: i64,
    /// Every effect step without a permit.
    pub steps: Latency,
    /// Every step holding a permit.
    pub permit_steps: Latency,
}

/// The nearest-rank percentile `p` (0..=1) of sorted values; 0 for none.
pub fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Cut the run into windows of `window_ms` from the first creation; `chaos` are the wall
/// times of the kills, stops and Redis restarts (`[kill, stop, redis]` by index 0, 1, 2).
pub fn windows(timings: &[Timing], chaos: &[(i64, usize)], window_ms: i64) -> (Vec<Window>, Summary) {
    let Some(t0) = timings.iter().map(|t| t.created).min() else { return (Vec::new(), Summary::default()) };
    let window_ms = window_ms.max(1);
    let last = timings.iter().filter_map(|t| t.finished).max().unwrap_or(t0);
    let n = ((last - t0) / window_ms + 1) as usize;
    let mut done = vec![0usize; n];
    // Per window, then for the whole run: [without a permit, holding one].
    let mut lat: Vec<[Vec<i64>; 2]> = vec![Default::default(); n];
    let mut all: [Vec<i64>; 2] = Default::default();
    let at = |t: i64| (((t - t0).max(0) / window_ms) as usize).min(n - 1);
    for t in timings {
        if let Some(f) = t.finished {
            done[at(f)] += 1;
        }
        for (ready, finished, permit) in &t.steps {
            lat[at(*finished)][usize::from(*permit)].push(finished - ready);
            all[usize::from(*permit)].push(finished - ready);
        }
    }
    let mut acts = vec![[0usize; 3]; n];
    for (t, kind) in chaos.iter().filter(|(_, k)| *k < 3) {
        acts[at(*t)][*kind] += 1;
    }
    let out = lat
        .into_iter()
        .enumerate()
        .map(|(i, [free, permit])| Window {
            start_s: (i as i64 * window_ms / 1000) as u64,
            workflows: done[i],
            wf_s: done[i] as f64 * 1000.0 / window_ms as f64,
            steps: Latency::of(free),
            permit_steps: Latency::of(permit),
            chaos: acts[i],
        })
        .collect();
    let completed = done.iter().sum::<usize>();
    let span_ms = (last - t0).max(1);
    let [free, permit] = all;
    let summary = Summary {
        wf_s: completed as f64 * 1000.0 / span_ms as f64,
        span_ms,
        steps: Latency::of(free),
        permit_steps: Latency::of(permit),
    };
    (out, summary)
}

/// The header of the CSV of windows.
pub const CSV_HEADER: &str = "window_start_s,workflows,workflows_per_s,steps,step_p50_ms,step_p99_ms,permit_steps,permit_step_p50_ms,permit_step_p99_ms,kills,stops,redis_restarts";

/// The CSV of the windows: [`CSV_HEADER`], then one row per window.
pub fn csv(windows: &[Window]) -> String {
    let mut out = format!("{CSV_HEADER}\n");
    for w in windows {
        let (s, p) = (w.steps, w.permit_steps);
        out.push_str(&format!(
            "{},{},{:.1},{},{},{},{},{},{},{},{},{}\n",
            w.start_s,
            w.workflows,
            w.wf_s,
            s.count,
            s.p50_ms,
            s.p99_ms,
            p.count,
            p.p50_ms,
            p.p99_ms,
            w.chaos[0],
            w.chaos[1],
            w.chaos[2]
        ));
    }
    out
}

// ---------------------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------------------

/// Run it: `args` as on the command line. Returns whether every count is right (the line
/// has been printed either way).
pub async fn run(args: Vec<String>) -> Result<bool, Box<dyn std::error::Error>> {
    let env = |k: &str| std::env::var(k).ok();
    let (store, rest) = compose::url_from_args(Role::Store, args, env, &[])?;
    let store = store.unwrap_or_else(|| DEFAULT_STORE.to_string());
    let settings = parse_settings(rest)?;
    if store.starts_with("memory:") {
        return Err("`memory:` is not shared between processes; the soak needs a durable store".into());
    }
    let mut redis = DedicatedRedis::start("soak").ok_or("the soak needs its own redis-server (is it installed?)")?;
    let dir = run_dir("soak")?;
    let store = fresh_store_url(&store, &dir, "soak");
    let urls = Urls { queue: fresh_queue_url(&redis.url, &store, "soak"), store };
    let deployment = match Deployment::from_urls(&urls, &queue_options(limits())).await {
        Ok(d) => d,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e.into());
        }
    };
    let outcome = supervise(&deployment, &urls, &dir, &settings, &mut redis).await;
    // The fresh schema is dropped; the key prefix goes with the dedicated server, which
    // `redis` stops when dropped.
    if let Err(e) = deployment.store.destroy().await {
        eprintln!("soak: dropping the schema failed: {e}");
    }
    drop(redis);
    if settings.keep || outcome.is_err() {
        eprintln!("soak: run directory kept: {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    outcome
}

/// What the supervisor reads from the oracle file while the run goes on.
struct Watch {
    tail: Tail,
    /// Newest effect line of each process.
    last_effect: HashMap<u64, (i64, String, String)>,
    /// Hold lines without their `end` yet: id → (pid, t, wf, step, token).
    open_holds: HashMap<String, (u64, i64, String, String, String)>,
    /// Workflows whose last step wrote its effect.
    last_seen: HashSet<String>,
    to_confirm: tokio::sync::mpsc::UnboundedSender<String>,
}

impl Watch {
    fn pump(&mut self) -> std::io::Result<()> {
        for v in self.tail.read_new()? {
            let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
            let n = |k: &str| v.get(k).and_then(Value::as_i64).unwrap_or(0);
            match v.get("hold").and_then(Value::as_str) {
                Some("start") => {
                    self.open_holds.insert(s("id"), (n("pid") as u64, n("t"), s("wf"), s("step"), s("token")));
                }
                Some(_) => {
                    self.open_holds.remove(&s("id"));
                }
                None => {
                    let Some(e) = Effect::parse(&v) else { continue };
                    self.last_effect.insert(e.pid, (n("t"), e.workflow_id.clone(), e.token.clone()));
                    let last = shape_of(&e.workflow_id).map(|k| SHAPES[k].last_step());
                    if last == Some(e.step.as_str()) && self.last_seen.insert(e.workflow_id.clone()) {
                        let _ = self.to_confirm.send(e.workflow_id);
                    }
                }
            }
        }
        Ok(())
    }

    /// The step `pid` is inside now (an effect line younger than [`FRESH_MS`]): wf, token.
    fn inside(&self, pid: u32, now: i64) -> Option<(String, String)> {
        let (t, wf, token) = self.last_effect.get(&u64::from(pid))?;
        (*t >= now - FRESH_MS).then(|| (wf.clone(), token.clone()))
    }

    /// The permit `pid` holds now (a hold started less than [`FRESH_MS`] ago): wf, step, token.
    fn holding(&self, pid: u32, now: i64) -> Option<(String, String, String)> {
        self.open_holds
            .values()
            .find(|(p, t, ..)| *p == u64::from(pid) && *t >= now - FRESH_MS)
            .map(|(_, _, wf, step, token)| (wf.clone(), step.clone(), token.clone()))
    }
}

/// Check the workflows whose last step wrote its effect until the store shows each
/// terminal; `shared.confirmed` counts those.
async fn confirm(
    store: Arc<kernel_core::ports::DynStore>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<String>,
    shared: Arc<Shared>,
) {
    let mut pending: VecDeque<(std::time::Instant, String)> = VecDeque::new();
    loop {
        while let Ok(id) = rx.try_recv() {
            pending.push_back((std::time::Instant::now(), id));
        }
        let now = std::time::Instant::now();
        let mut due = Vec::new();
        while pending.front().is_some_and(|(at, _)| *at <= now) && due.len() < 64 {
            due.extend(pending.pop_front().map(|(_, id)| id));
        }
        if due.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let checked: Vec<(String, bool)> = futures::stream::iter(due)
            .map(|id| {
                let store = store.clone();
                async move {
                    let inst = store.get(&WorkflowId::from(id.as_str())).await;
                    let terminal = inst.ok().flatten().is_some_and(|i| i.status.is_terminal());
                    (id, terminal)
                }
            })
            .buffer_unordered(16)
            .collect()
            .await;
        for (id, terminal) in checked {
            if terminal {
                shared.confirmed.fetch_add(1, Ordering::SeqCst);
            } else {
                pending.push_back((std::time::Instant::now() + Duration::from_millis(200), id));
            }
        }
    }
}

/// A process the chaos loop stopped: worker `w` since `since`, holding the claim `token`
/// of `wf` (inside `step`; `holding`: a permit of it); the store is looked at again at
/// `check`.
struct Stopped {
    w: usize,
    since: std::time::Instant,
    check: std::time::Instant,
    wf: String,
    step: String,
    token: String,
    holding: bool,
}

/// The chaos loop's state: the worker processes and what was done to them.
struct Chaos<'a> {
    s: &'a Settings,
    workers: Vec<Worker>,
    born: Vec<std::time::Instant>,
    spawn: &'a dyn Fn(&str) -> std::io::Result<Worker>,
    rng: rand::rngs::SmallRng,
    events: Vec<ChaosEvent>,
    redis_events: Vec<(i64, &'static str)>,
    stopped: Option<Stopped>,
    redis_up_at: Option<std::time::Instant>,
    last_action: std::time::Instant,
    last_kill: std::time::Instant,
    last_stop: std::time::Instant,
    last_redis: std::time::Instant,
    stop_search_since: Option<std::time::Instant>,
    kills: usize,
    stops: usize,
    redis_restarts: usize,
    stops_without_takeover: usize,
    stops_holding: usize,
    stops_permit_lapsed: usize,
    stopped_names: Vec<String>,
}

impl Chaos<'_> {
    fn note(&mut self, w: usize, kind: ChaosKind) {
        self.events.push(ChaosEvent { pid: u64::from(self.workers[w].pid), t: wall_ms(), kind });
    }

    /// A random worker among those running (not stopped), started at least `age` ago, whose
    /// process id `pick` says yes to.
    fn choose(&mut self, now: std::time::Instant, age: Duration, pick: impl Fn(u32) -> bool) -> Option<usize> {
        let found: Vec<usize> = (0..self.workers.len())
            .filter(|i| !self.workers[*i].stopped && now >= self.born[*i] + age && pick(self.workers[*i].pid))
            .collect();
        (!found.is_empty()).then(|| found[self.rng.gen_range(0..found.len())])
    }

    /// Whether the required counts are reached.
    fn required_done(&self) -> bool {
        self.kills >= self.s.kills && self.stops >= self.s.stops && self.redis_restarts >= self.s.redis_restarts
    }

    /// Whether nothing is stopped or down.
    fn settled(&self) -> bool {
        self.stopped.is_none() && self.redis_up_at.is_none()
    }

    /// One pass: continue a stopped process once the store shows its claim taken over,
    /// start Redis again after its outage, then at most one new action.
    async fn tick(
        &mut self,
        watch: &Watch,
        store: &Arc<kernel_core::ports::DynStore>,
        permits: &Arc<kernel_core::ports::DynPermits>,
        redis: &mut DedicatedRedis,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let (now, wall) = (std::time::Instant::now(), wall_ms());
        if let Some(st) = self.stopped.as_mut().filter(|st| now >= st.check) {
            // Counted only when another process took the claim over meanwhile (the
            // instance no longer carries the stopped worker's token); the stopped worker
            // could not have changed it. Until then it stays stopped, up to STOP_MAX_MS.
            let inst = store.get(&WorkflowId::from(st.wf.as_str())).await?;
            let taken_over =
                inst.is_some_and(|i| i.claim_token.as_ref().map(|t| t.as_str()) != Some(st.token.as_str()));
            if !taken_over && now < st.since + Duration::from_millis(STOP_MAX_MS) {
                st.check = now + Duration::from_millis(250);
            } else if let Some(st) = self.stopped.take() {
                let owner = PermitOwner {
                    workflow_id: WorkflowId::from(st.wf.as_str()),
                    step: st.step,
                    claim_token: st.token.as_str().into(),
                };
                let lapsed = st.holding
                    && permits.usage(RESOURCE).await.is_ok_and(|u| !u.holders.iter().any(|h| h.owner == owner));
                self.workers[st.w].cont()?;
                self.note(st.w, ChaosKind::Cont);
                if taken_over {
                    self.stops += 1;
                    self.stops_holding += usize::from(st.holding);
                    self.stops_permit_lapsed += usize::from(lapsed);
                    self.stopped_names.push(self.workers[st.w].name.clone());
                } else {
                    self.stops_without_takeover += 1;
                }
                (self.last_action, self.last_stop) = (now, now);
            }
        }
        if self.redis_up_at.is_some_and(|at| now >= at) {
            tokio::task::block_in_place(|| redis.restart())?;
            self.redis_events.push((wall_ms(), "up"));
            self.redis_restarts += 1;
            self.redis_up_at = None;
            (self.last_action, self.last_redis) = (now, now);
        }
        if now < self.last_action + self.s.chaos_gap {
            return Ok(());
        }
        let s = self.s;
        let every = s.chaos_every.filter(|_| self.required_done());
        let want_stop = self.stopped.is_none()
            && ((self.stops < s.stops && self.kills >= 1)
                || every.is_some_and(|e| s.stops > 0 && now >= self.last_stop + 4 * e));
        let want_redis = self.redis_up_at.is_none()
            && ((self.redis_restarts < s.redis_restarts && self.kills >= 2)
                || every.is_some_and(|e| s.redis_restarts > 0 && now >= self.last_redis + 10 * e));
        let want_kill = self.kills < s.kills || every.is_some_and(|e| s.kills > 0 && now >= self.last_kill + e);
        if want_stop {
            // A process caught holding a permit; after HOLD_SEARCH without one, any
            // process caught inside a step.
            let since = *self.stop_search_since.get_or_insert(now);
            let age = Duration::from_secs(1);
            let pick = match self.choose(now, age, |pid| watch.holding(pid, wall).is_some()) {
                Some(w) => watch.holding(self.workers[w].pid, wall).map(|(wf, step, token)| (w, wf, step, token, true)),
                None if now >= since + HOLD_SEARCH => {
                    self.choose(now, age, |pid| watch.inside(pid, wall).is_some()).and_then(|w| {
                        watch.inside(self.workers[w].pid, wall).map(|(wf, token)| (w, wf, String::new(), token, false))
                    })
                }
                None => None,
            };
            if let Some((w, wf, step, token, holding)) = pick {
                self.workers[w].stop()?;
                self.note(w, ChaosKind::Stop);
                let check = now + Duration::from_millis(STOP_MS);
                self.stopped = Some(Stopped { w, since: now, check, wf, step, token, holding });
                self.stop_search_since = None;
                self.last_action = now;
                return Ok(());
            }
        }
        if want_redis {
            redis.kill();
            self.redis_events.push((wall_ms(), "down"));
            self.redis_up_at = Some(now + Duration::from_millis(OUTAGE_MS));
            self.last_action = now;
        } else if want_kill {
            if let Some(w) = self.choose(now, Duration::from_millis(300), |pid| watch.inside(pid, wall).is_some()) {
                self.workers[w].kill()?;
                self.note(w, ChaosKind::Kill);
                self.kills += 1;
                self.workers[w] = (self.spawn)(&self.workers[w].name.clone())?;
                self.born[w] = std::time::Instant::now();
                (self.last_action, self.last_kill) = (now, now);
            }
        }
        Ok(())
    }

    /// Leave nothing stopped or down.
    fn settle(&mut self, redis: &mut DedicatedRedis) -> Result<(), Box<dyn std::error::Error>> {
        if let Some(st) = self.stopped.take() {
            self.workers[st.w].cont()?;
            self.note(st.w, ChaosKind::Cont);
        }
        if self.redis_up_at.take().is_some() {
            tokio::task::block_in_place(|| redis.restart())?;
            self.redis_events.push((wall_ms(), "up"));
        }
        Ok(())
    }
}

/// Counters the supervisor's tasks share.
#[derive(Default)]
struct Shared {
    started: AtomicUsize,
    confirmed: AtomicUsize,
    start_errors: AtomicUsize,
    signals_pending: AtomicUsize,
    signals_failed: AtomicUsize,
    monitor_samples: AtomicUsize,
    monitor_errors: AtomicUsize,
    monitor_max: AtomicUsize,
}

/// The request starting workflow `i`.
fn start_request(i: usize) -> StartRequest {
    let id = workflow_id(i);
    let shape = &SHAPES[i % SHAPES.len()];
    let input = json!({ "sleep_ms": 200 + (i as i64 * 37) % 1_000 });
    StartRequest::new(shape.workflow_type, format!("soak:{id}"), input).workflow_id(id)
}

/// Start the workflows, at most `in_flight` unfinished at once; deliver each signal
/// workflow's `go` 0–1.5 s after its start (retried with the same signal id).
async fn feed(engine: Engine, s: Settings, shared: Arc<Shared>) {
    let publisher = engine.publisher();
    let mut next = 0;
    while next < s.workflows {
        let unfinished = shared.started.load(Ordering::SeqCst) - shared.confirmed.load(Ordering::SeqCst);
        let room = s.in_flight.saturating_sub(unfinished).min(64).min(s.workflows - next);
        if room == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let batch = next..next + room;
        next += room;
        futures::stream::iter(batch)
            .for_each_concurrent(16, |i| {
                let (publisher, engine, shared) = (publisher.clone(), engine.clone(), shared.clone());
                async move {
                    let mut tries = 0;
                    while publisher.start_or_resume(start_request(i)).await.is_err() {
                        tries += 1;
                        if tries >= 50 {
                            shared.start_errors.fetch_add(1, Ordering::SeqCst);
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    if i % SHAPES.len() == SIGNAL_SHAPE {
                        shared.signals_pending.fetch_add(1, Ordering::SeqCst);
                        tokio::spawn(signal(engine, workflow_id(i), (i as u64 * 7_919) % 1_500, shared.clone()));
                    }
                }
            })
            .await;
        shared.started.fetch_add(room, Ordering::SeqCst);
    }
}

async fn signal(engine: Engine, id: String, delay_ms: u64, shared: Arc<Shared>) {
    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    let signal =
        Signal::builder(id.as_str(), "go").wait_key(id.as_str()).signal_id(go_signal_id(&id)).build().expect("valid");
    let mut tries = 0;
    while engine.deliver_signal(signal.clone()).await.is_err() {
        tries += 1;
        if tries >= 100 {
            shared.signals_failed.fetch_add(1, Ordering::SeqCst);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shared.signals_pending.fetch_sub(1, Ordering::SeqCst);
}

/// Sample the holders of [`RESOURCE`] from the permits backend every 100 ms.
async fn monitor(permits: Arc<kernel_core::ports::DynPermits>, shared: Arc<Shared>) {
    loop {
        match permits.usage(RESOURCE).await {
            Ok(u) => {
                shared.monitor_samples.fetch_add(1, Ordering::Relaxed);
                shared.monitor_max.fetch_max(u.holders.len(), Ordering::Relaxed);
            }
            Err(_) => {
                shared.monitor_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One workflow as the store holds it after the run.
struct Read {
    shape: usize,
    view: WorkflowView,
    timing: Timing,
    /// Whether its `await_go` was completed by its own `go` signal.
    signalled: bool,
}

/// Read workflows `0..n` from the store (`None`: absent or unreadable, judged lost).
async fn read_store(store: &Arc<kernel_core::ports::DynStore>, n: usize) -> Vec<Option<Read>> {
    futures::stream::iter(0..n)
        .map(|i| {
            let store = store.clone();
            async move {
                let shape = i % SHAPES.len();
                let id = workflow_id(i);
                let inst = store.get(&WorkflowId::from(id.as_str())).await.ok().flatten()?;
                let go = inst.output.get("await_go").and_then(|o| o.get("signal_id")).and_then(Value::as_str);
                Some(Read {
                    shape,
                    view: WorkflowView::of(&inst),
                    timing: Timing::of(&inst, &SHAPES[shape]),
                    signalled: go == Some(go_signal_id(&id).as_str()),
                })
            }
        })
        .buffered(32)
        .collect()
        .await
}

/// The oracle file's effects and hold spans, read line by line.
fn read_oracle(path: &Path) -> std::io::Result<(Vec<Effect>, Vec<HoldSpan>)> {
    let file = std::fs::File::open(path)?;
    let mut effects = Vec::new();
    let mut holds: HashMap<String, HoldSpan> = HashMap::new();
    for line in std::io::BufReader::new(file).lines() {
        let Ok(v) = serde_json::from_str::<Value>(&line?) else { continue };
        let t = v.get("t").and_then(Value::as_i64).unwrap_or(0);
        let id = v.get("id").and_then(Value::as_str).unwrap_or_default().to_string();
        match v.get("hold").and_then(Value::as_str) {
            Some("start") => {
                let pid = v.get("pid").and_then(Value::as_u64).unwrap_or(0);
                holds.entry(id).or_insert(HoldSpan { pid, start: t, end: None }).start = t;
            }
            Some(_) => {
                holds.entry(id).or_insert(HoldSpan { pid: 0, start: t, end: None }).end = Some(t);
            }
            None => effects.extend(Effect::parse(&v)),
        }
    }
    Ok((effects, holds.into_values().collect()))
}

#[allow(clippy::too_many_lines)]
async fn supervise(
    deployment: &Deployment,
    urls: &Urls,
    dir: &Path,
    s: &Settings,
    redis: &mut DedicatedRedis,
) -> Result<bool, Box<dyn std::error::Error>> {
    let started = std::time::Instant::now();
    let cap_at = started + s.cap;
    let oracle_path = dir.join("effects.jsonl");
    // Never spawned: the supervisor only starts workflows, delivers signals and reads.
    let mut builder =
        Engine::builder(deployment.ports().build()?).config(kernel_examples::real::engine_config("supervisor"));
    for d in definitions(&Oracle::open(&oracle_path)?) {
        builder = builder.register(d);
    }
    let engine = builder.build()?;
    let store = engine.ports().store.clone();
    let spawn =
        |name: &str| Worker::spawn(WorkerArgs { quiet: true, ..WorkerArgs::in_run(urls, dir, &oracle_path, name) });
    let mut workers: Vec<Worker> = Vec::new();
    for i in 1..=s.processes {
        workers.push(spawn(&format!("w{i}"))?);
    }

    let shared = Arc::new(Shared::default());
    let (to_confirm, confirm_rx) = tokio::sync::mpsc::unbounded_channel();
    let confirmer = tokio::spawn(confirm(store.clone(), confirm_rx, shared.clone()));
    let feeder = tokio::spawn(feed(engine.clone(), s.clone(), shared.clone()));
    let monitor = tokio::spawn(monitor(deployment.queue.permits.clone(), shared.clone()));

    let mut watch = Watch {
        tail: Tail::new(&oracle_path),
        last_effect: HashMap::new(),
        open_holds: HashMap::new(),
        last_seen: HashSet::new(),
        to_confirm,
    };
    let mut chaos = Chaos {
        s,
        born: vec![std::time::Instant::now(); workers.len()],
        workers,
        spawn: &spawn,
        rng: rand::rngs::SmallRng::seed_from_u64(s.seed),
        events: Vec::new(),
        redis_events: Vec::new(),
        stopped: None,
        redis_up_at: None,
        last_action: started,
        last_kill: started,
        last_stop: started,
        last_redis: started,
        stop_search_since: None,
        kills: 0,
        stops: 0,
        redis_restarts: 0,
        stops_without_takeover: 0,
        stops_holding: 0,
        stops_permit_lapsed: 0,
        stopped_names: Vec::new(),
    };
    let mut next_progress = started + s.window;
    let mut capped = false;
    loop {
        watch.pump()?;
        chaos.tick(&watch, &store, &deployment.queue.permits, redis).await?;
        let now = std::time::Instant::now();
        let confirmed = shared.confirmed.load(Ordering::SeqCst);
        if s.progress && now >= next_progress {
            next_progress += s.window;
            eprintln!(
                "soak progress: t={}s started={} finished={confirmed} kills={} stops={} redis_restarts={}",
                started.elapsed().as_secs(),
                shared.started.load(Ordering::SeqCst),
                chaos.kills,
                chaos.stops,
                chaos.redis_restarts
            );
        }
        if confirmed >= s.workflows && chaos.settled() {
            break;
        }
        if now > cap_at {
            capped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    chaos.settle(redis)?;
    let mut workers = std::mem::take(&mut chaos.workers);
    feeder.abort();
    for w in workers.iter_mut() {
        w.terminate(Duration::from_secs(5))?;
    }
    let run_end = wall_ms();
    // What the chaos did, for a look at a kept run directory.
    let mut notes: Vec<String> = chaos
        .events
        .iter()
        .map(|c| json!({ "t": c.t, "pid": c.pid, "kind": format!("{:?}", c.kind) }).to_string())
        .collect();
    notes.extend(chaos.redis_events.iter().map(|(t, what)| json!({ "t": t, "redis": what }).to_string()));
    std::fs::write(dir.join("chaos.jsonl"), notes.join("\n") + "\n")?;
    monitor.abort();
    confirmer.abort();
    // Every signal workflow completed only after its signal, so nothing is pending unless
    // the run was capped; what is still pending counts as failed.
    let wait_signals = std::time::Instant::now() + Duration::from_secs(2);
    while shared.signals_pending.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < wait_signals {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let signals_failed = shared.signals_failed.load(Ordering::SeqCst) + shared.signals_pending.load(Ordering::SeqCst);
    let elapsed = started.elapsed();

    // The judgement: the store and the oracle only, after every process stopped.
    let reads = read_store(&store, s.workflows).await;
    let (effects, holds) = read_oracle(&oracle_path)?;
    let mut verdict = Verdict::default();
    for (k, shape) in SHAPES.iter().enumerate() {
        let ids: Vec<String> = (k..s.workflows).step_by(SHAPES.len()).map(workflow_id).collect();
        let mine: HashSet<&str> = ids.iter().map(String::as_str).collect();
        let views: Vec<WorkflowView> =
            reads.iter().flatten().filter(|r| r.shape == k).map(|r| r.view.clone()).collect();
        let effects: Vec<Effect> = effects.iter().filter(|e| mine.contains(e.workflow_id.as_str())).cloned().collect();
        verdict += judge(&ids, &views, &effects, &shape.effect_steps());
    }
    let timings: Vec<Timing> = reads.iter().flatten().map(|r| r.timing.clone()).collect();
    let unfinished = reads.iter().filter(|r| r.as_ref().is_none_or(|r| !r.view.completed)).count();
    let completed_signal = |r: &&Read| r.shape == SIGNAL_SHAPE && r.view.completed;
    let signal_completed = reads.iter().flatten().filter(completed_signal).count();
    let signalled = reads.iter().flatten().filter(completed_signal).filter(|r| r.signalled).count();
    let renew_ms = kernel_examples::real::engine_config("soak").permit_renew_ms.as_millis();
    let permits = permit_figures(&holds, &chaos.events, run_end, CEILING as usize, renew_ms);
    let mut acts: Vec<(i64, usize)> = chaos
        .events
        .iter()
        .filter_map(|c| match c.kind {
            ChaosKind::Kill => Some((c.t, 0)),
            ChaosKind::Stop => Some((c.t, 1)),
            ChaosKind::Cont => None,
        })
        .collect();
    acts.extend(chaos.redis_events.iter().filter(|(_, what)| *what == "down").map(|(t, _)| (*t, 2)));
    let (wins, summary) = windows(&timings, &acts, s.window.as_millis() as i64);
    let zombies: Vec<&str> = chaos.stopped_names.iter().map(String::as_str).collect();
    let (refused, late_refused) = kernel_examples::real::crash::count_refused(dir, &workers, &zombies);

    let mut line = Line {
        processes: s.processes,
        workflows: s.workflows,
        kills: chaos.kills,
        stops: chaos.stops,
        redis_restarts: chaos.redis_restarts,
        ..Line::default()
    };
    line.completed = verdict.completed;
    line.duplicate_effects = verdict.duplicate_effects;
    line.stale_writes_accepted = verdict.stale_writes_accepted;
    line.lost = verdict.lost;
    line.permit_breaches = permits.breaches;
    line.permit_overshoot_max = permits.overshoot_max;
    line.elapsed_s = elapsed.as_secs();
    println!("{line}");
    println!(
        "soak detail: store={} applied_effects={} redelivered={} signalled={signalled} signals_failed={signals_failed} start_errors={} \
permit_ceiling={CEILING} permit_holds={} permit_peak={} permit_effective_peak={} permit_over_ms_max={} renew_ms={renew_ms} \
monitor_holders_max={} monitor_samples={} monitor_errors={} stops_holding_permit={} stops_permit_lapsed={} \
stops_without_takeover={} refused_writes={refused} stopped_token_writes_refused={late_refused} \
wf_s={:.1} step_p50_ms={} step_p99_ms={} permit_step_p50_ms={} permit_step_p99_ms={} unfinished={} seed={}{}",
        deployment.store.scheme.kind(),
        verdict.applied,
        verdict.redelivered,
        shared.start_errors.load(Ordering::SeqCst),
        permits.holds,
        permits.peak,
        permits.effective_peak,
        permits.over_ms_max,
        shared.monitor_max.load(Ordering::Relaxed),
        shared.monitor_samples.load(Ordering::Relaxed),
        shared.monitor_errors.load(Ordering::Relaxed),
        chaos.stops_holding,
        chaos.stops_permit_lapsed,
        chaos.stops_without_takeover,
        summary.wf_s,
        summary.steps.p50_ms,
        summary.steps.p99_ms,
        summary.permit_steps.p50_ms,
        summary.permit_steps.p99_ms,
        unfinished,
        s.seed,
        if capped { format!(" CAPPED at {:?}", s.cap) } else { String::new() }
    );
    if let Some(path) = &s.csv {
        std::fs::write(path, csv(&wins))?;
        eprintln!("soak: {} windows of {:?} written to {}", wins.len(), s.window, path.display());
    }
    let ok = !capped
        && line.kills >= s.kills
        && line.stops >= s.stops
        && line.redis_restarts >= s.redis_restarts
        && line.completed == s.workflows
        && line.duplicate_effects == 0
        && line.stale_writes_accepted == 0
        && line.lost == 0
        && line.permit_breaches == 0
        && signalled == signal_completed
        && signals_failed == 0
        && shared.start_errors.load(Ordering::SeqCst) == 0;
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(pid: u64, start: i64, end: Option<i64>) -> HoldSpan {
        HoldSpan { pid, start, end }
    }

    #[test]
    fn holders_within_the_ceiling_are_no_overshoot() {
        // Three at once, then a fourth starting exactly when one ends (half-open spans).
        let holds = [hold(1, 0, Some(100)), hold(2, 10, Some(200)), hold(3, 20, Some(300)), hold(4, 100, Some(400))];
        let f = permit_figures(&holds, &[], 1_000, 3, 500);
        assert_eq!((f.peak, f.overshoot_max, f.breaches, f.over_ms_max), (3, 0, 0, 0));
    }

    #[test]
    fn a_long_overshoot_is_a_breach_and_a_short_one_is_not() {
        let base = [hold(1, 0, Some(2_000)), hold(2, 0, Some(2_000)), hold(3, 0, Some(2_000))];
        let short: Vec<HoldSpan> = base.iter().copied().chain([hold(4, 100, Some(400))]).collect();
        let f = permit_figures(&short, &[], 3_000, 3, 500);
        assert_eq!((f.overshoot_max, f.breaches, f.over_ms_max), (1, 0, 300));
        let long: Vec<HoldSpan> = base.iter().copied().chain([hold(4, 100, Some(900))]).collect();
        let f = permit_figures(&long, &[], 3_000, 3, 500);
        assert_eq!((f.overshoot_max, f.breaches, f.over_ms_max), (1, 1, 800));
    }

    #[test]
    fn a_frozen_holder_counts_raw_but_not_while_frozen() {
        // pid 9 holds from 0, is stopped at 100 and continued at 3 100, ends at 3 150;
        // three others hold 2 000..3 000 meanwhile.
        let holds = [
            hold(9, 0, Some(3_150)),
            hold(1, 2_000, Some(3_000)),
            hold(2, 2_000, Some(3_000)),
            hold(3, 2_000, Some(3_000)),
        ];
        let chaos = [
            ChaosEvent { pid: 9, t: 100, kind: ChaosKind::Stop },
            ChaosEvent { pid: 9, t: 3_100, kind: ChaosKind::Cont },
        ];
        let f = permit_figures(&holds, &chaos, 5_000, 3, 500);
        assert_eq!((f.peak, f.overshoot_max, f.effective_peak, f.breaches), (4, 1, 3, 0));
        // Without the stop on record the same spans are a breach.
        assert_eq!(permit_figures(&holds, &[], 5_000, 3, 500).breaches, 1);
    }

    #[test]
    fn a_span_without_an_end_ends_at_its_process_kill_or_the_run_end() {
        let holds = [hold(5, 0, None), hold(6, 0, None), hold(7, 0, Some(50)), hold(8, 0, Some(50))];
        let chaos = [ChaosEvent { pid: 5, t: 40, kind: ChaosKind::Kill }];
        let f = permit_figures(&holds, &chaos, 10_000, 2, 500);
        // 0..40 four holders, 40..50 three, then pid 6 alone until the run end.
        assert_eq!((f.peak, f.over_ms_max, f.breaches), (4, 50, 0));
    }

    #[test]
    fn windows_count_completions_and_step_latencies() {
        let t = |created, finished: Option<i64>, steps: Vec<(i64, i64, bool)>| Timing { created, finished, steps };
        let timings = [
            t(1_000, Some(5_000), vec![(1_000, 1_100, false), (1_100, 5_000, true)]),
            t(2_000, Some(12_000), vec![(2_000, 2_300, false), (11_000, 12_000, false)]),
            t(3_000, None, vec![(3_000, 3_050, false)]),
        ];
        let (w, sum) = windows(&timings, &[(1_500, 0), (2_500, 0), (11_000, 2), (9_000, 1)], 10_000);
        assert_eq!(w.len(), 2);
        assert_eq!((w[0].start_s, w[0].workflows), (0, 1));
        assert_eq!(w[0].steps, Latency { count: 3, p50_ms: 100, p99_ms: 300 });
        assert_eq!(w[0].permit_steps, Latency { count: 1, p50_ms: 3_900, p99_ms: 3_900 });
        assert_eq!((w[1].start_s, w[1].workflows, w[1].steps.count, w[1].steps.p50_ms), (10, 1, 1, 1_000));
        assert_eq!(w[1].permit_steps, Latency::default());
        assert_eq!(sum.span_ms, 11_000);
        assert_eq!(sum.steps, Latency { count: 4, p50_ms: 100, p99_ms: 1_000 });
        assert!((sum.wf_s - 2.0 / 11.0).abs() < 1e-9);
        let text = csv(&w);
        assert!(
            text.starts_with(&format!(
                "{CSV_HEADER}\n0,1,0.1,3,100,300,1,3900,3900,2,1,0\n10,1,0.1,1,1000,1000,0,0,0,0,0,1\n"
            )),
            "{text}"
        );
        assert_eq!(percentile(&[], 0.5), 0);
        assert_eq!(percentile(&[1, 2, 3, 4], 0.5), 2);
    }

    #[test]
    fn shapes_have_effects_a_last_step_and_a_permit_step() {
        for (i, shape) in SHAPES.iter().enumerate() {
            assert_eq!(shape_of(&workflow_id(i + 8)), Some(i));
            assert!(shape.effect_steps().contains(&shape.last_step()), "{}", shape.workflow_type);
        }
        assert!(SHAPES.iter().any(|s| s.steps.iter().any(|(_, _, k)| *k == Kind::Holding)));
        assert_eq!(SHAPES[SIGNAL_SHAPE].steps[1].2, Kind::AwaitGo);
        assert!(STOP_MS as i64 > LEASE_MS.max(PERMIT_LEASE_MS));
    }

    #[test]
    fn settings_have_short_and_long_defaults() {
        let s = parse_settings(vec!["--redis-restart".into(), "--seed".into(), "7".into()]).unwrap();
        assert_eq!((s.processes, s.workflows, s.kills, s.stops, s.redis_restarts), (4, 2_000, 3, 1, 1));
        assert_eq!((s.in_flight, s.cap, s.chaos_every, s.csv.clone()), (2_000, Duration::from_secs(120), None, None));
        let l = parse_settings(vec!["--long".into(), "--processes".into(), "2".into()]).unwrap();
        assert_eq!((l.processes, l.workflows, l.in_flight), (2, 100_000, 500));
        assert_eq!((l.chaos_every, l.csv), (Some(Duration::from_secs(30)), Some(PathBuf::from("soak-long.csv"))));
        assert!(parse_settings(vec!["--processes".into(), "1".into()]).unwrap_err().contains("--stops 0"));
        assert!(parse_settings(vec!["--queue".into(), "redis://x".into()]).unwrap_err().contains("unknown argument"));
    }
}
