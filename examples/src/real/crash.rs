//! The real-crash run: several worker processes on one store, one of them killed with
//! `SIGKILL` again and again, another stopped with `SIGSTOP` past its lease and continued,
//! while hundreds of workflows with durable sleeps and signals run; then the store and the
//! oracle file are judged ([`super::oracle`]) and one line is printed:
//!
//! ```text
//! real-crash: store=<scheme> processes=<n> workflows=<n> kills=<n> stops=<n> completed=<n> duplicate_effects=0 stale_writes_accepted=0 lost=0
//! ```
//!
//! Each workflow ([`definition`]) is `charge` (a side effect under its K-17.1 key, then a
//! little work, so kills land inside the step) → `cool` (a durable sleep) → `await_go` (a
//! signal wait; the supervisor delivers the `go` signals through the inbox, spread over the
//! run, some before the wait exists) → `ship` (a second side effect). Every output carries
//! `{"attempt", "token"}` of the entry that wrote it.
//!
//! The kills are deterministic in what they hit: the victim is killed as soon as the
//! supervisor sees a new effect of it in the oracle file (polled every 25 ms; the step
//! works [`WORK_MS`] after its effect), so it dies inside a step after its side effect and
//! before its completion; it is restarted at once. The other worker is stopped the same
//! way, holding its claim, for its lease plus 1.5 s, then continued; the stop counts only
//! when, before the `SIGCONT`, the store shows its claim taken over by another process
//! (else it is retried). The run is bounded by a wall-time cap that fails
//! it rather than hangs; nothing asserts a duration.

use super::oracle::{judge, Effect, WorkflowView};
pub use super::steps::go_signal_id;
use super::steps::{await_go, nap, EffectStep};
use super::{
    cleanup, fresh_queue_url, fresh_store_url, queue_options, read_lines, run_dir, take_flag, take_switch,
    urls_from_args, wall_ms, Oracle, Tail, Worker, WorkerArgs, WorkerEnv, LEASE_MS,
};
use compose::{Deployment, Urls};
use futures::StreamExt;
use kernel_core::ports::Signal;
use kernel_core::{Definition, Engine, StartRequest, StepDef, WorkflowId};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Type of the workflow of the run.
pub const CRASH_JOB: &str = "crash_job";
/// The steps that write to the oracle.
pub const EFFECT_STEPS: [&str; 2] = ["charge", "ship"];
/// Simulated work after an effect, so a kill often lands inside the step.
pub const WORK_MS: u64 = 50;

/// The run's workflow, its effects recorded into `oracle`.
pub fn definition(oracle: Arc<Oracle>) -> Definition {
    Definition::builder(CRASH_JOB)
        .step(StepDef::new("charge", EffectStep::new(oracle.clone(), WORK_MS)).max_retry(3))
        .step(StepDef::new("cool", nap).depends_on(["charge"]))
        .step(StepDef::new("await_go", await_go).depends_on(["cool"]))
        .step(StepDef::new("ship", EffectStep::new(oracle, WORK_MS)).depends_on(["await_go"]).max_retry(3))
        .build()
        .expect("valid definition")
}

/// The worker process of the run.
pub async fn worker(args: WorkerArgs) -> Result<(), Box<dyn std::error::Error>> {
    super::run_worker(args, queue_options(HashMap::new()), |env: &WorkerEnv| {
        Box::pin(async move { Ok(vec![definition(env.oracle.clone())]) })
    })
    .await
}

/// Settings of a run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Worker processes (at least 2: one is killed, another stopped).
    pub processes: usize,
    /// Workflows started.
    pub workflows: usize,
    /// Kills of the victim.
    pub kills: usize,
    /// Stops of the other worker.
    pub stops: usize,
    /// The `go` signals are spread over this long after the starts.
    pub spread_ms: u64,
    /// Wall-time cap of the whole run.
    pub cap: Duration,
    /// Keep the run directory (oracle, event logs, a file store).
    pub keep: bool,
}

fn parse_settings(mut rest: Vec<String>) -> Result<Settings, Box<dyn std::error::Error>> {
    let mut num = |name: &str, default: u64| -> Result<u64, Box<dyn std::error::Error>> {
        match take_flag(&mut rest, name) {
            Some(v) => v.parse().map_err(|_| format!("--{name} {v}: not a number").into()),
            None => Ok(default),
        }
    };
    let s = Settings {
        processes: num("processes", 3)? as usize,
        workflows: num("workflows", 200)? as usize,
        kills: num("kills", 3)? as usize,
        stops: num("stops", 1)? as usize,
        spread_ms: num("spread-ms", 4_000)?,
        cap: Duration::from_secs(num("cap-secs", 180)?),
        keep: false,
    };
    let keep = take_switch(&mut rest, "keep");
    if let Some(unknown) = rest.first() {
        return Err(format!(
            "unknown argument {unknown} (flags: --store, --queue, --processes, --workflows, --kills, --stops, --spread-ms, --cap-secs, --keep)"
        )
        .into());
    }
    if s.processes < 2 || s.workflows == 0 {
        return Err("--processes must be at least 2 and --workflows at least 1".into());
    }
    Ok(Settings { keep, ..s })
}

/// The counts the line reports.
#[derive(Debug, Clone, Default)]
pub struct Line {
    /// `store=`.
    pub store: String,
    /// `processes=`.
    pub processes: usize,
    /// `workflows=`.
    pub workflows: usize,
    /// `kills=`.
    pub kills: usize,
    /// `stops=`.
    pub stops: usize,
    /// `completed=`.
    pub completed: usize,
    /// `duplicate_effects=`.
    pub duplicate_effects: usize,
    /// `stale_writes_accepted=`.
    pub stale_writes_accepted: usize,
    /// `lost=`.
    pub lost: usize,
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "real-crash: store={} processes={} workflows={} kills={} stops={} completed={} duplicate_effects={} stale_writes_accepted={} lost={}",
            self.store,
            self.processes,
            self.workflows,
            self.kills,
            self.stops,
            self.completed,
            self.duplicate_effects,
            self.stale_writes_accepted,
            self.lost
        )
    }
}

/// Run it: `args` as on the command line. Returns whether every count is right (the line
/// has been printed either way).
pub async fn run(args: Vec<String>) -> Result<bool, Box<dyn std::error::Error>> {
    let (given, rest) = urls_from_args(args)?;
    let settings = parse_settings(rest)?;
    if given.store.starts_with("memory:") || given.queue.starts_with("memory:") {
        return Err("`memory:` is not shared between processes; the real-crash run needs a durable store".into());
    }
    let dir = run_dir("real-crash")?;
    let store = fresh_store_url(&given.store, &dir, "real_crash");
    let urls = Urls { queue: fresh_queue_url(&given.queue, &store, "real_crash"), store };
    let deployment = match Deployment::from_urls(&urls, &queue_options(HashMap::new())).await {
        Ok(d) => d,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e.into());
        }
    };
    let outcome = supervise(&deployment, &urls, &dir, &settings).await;
    if let Err(e) = cleanup(deployment, &urls).await {
        eprintln!("cleanup failed: {e}");
    }
    if settings.keep {
        eprintln!("real-crash: run directory kept: {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    outcome
}

async fn supervise(
    deployment: &Deployment,
    urls: &Urls,
    dir: &Path,
    s: &Settings,
) -> Result<bool, Box<dyn std::error::Error>> {
    let started = std::time::Instant::now();
    let cap_at = started + s.cap;
    let oracle_path = dir.join("effects.jsonl");
    let oracle = Oracle::open(&oracle_path)?;
    // Never spawned: the supervisor only starts workflows, delivers signals and reads.
    let engine = Engine::builder(deployment.ports().build()?)
        .config(super::engine_config("supervisor"))
        .register(definition(oracle))
        .build()?;
    let spawn = |name: &str| Worker::spawn(WorkerArgs::in_run(urls, dir, &oracle_path, name));
    let mut workers: Vec<Worker> = Vec::new();
    for i in 1..=s.processes {
        workers.push(spawn(&format!("w{i}"))?);
    }
    let (victim, zombie) = (0usize, 1usize);

    let ids: Vec<String> = (0..s.workflows).map(|i| format!("job-{i:04}")).collect();
    let publisher = engine.publisher();
    let starts = futures::stream::iter(ids.iter().enumerate().map(|(i, id)| {
        let publisher = publisher.clone();
        let sleep_ms = 200 + (i as i64 * 37) % 900;
        let req =
            StartRequest::new(CRASH_JOB, format!("job:{id}"), json!({ "sleep_ms": sleep_ms })).workflow_id(id.as_str());
        async move { publisher.start_or_resume(req).await }
    }))
    .buffer_unordered(16)
    .collect::<Vec<_>>()
    .await;
    if let Some(Err(e)) = starts.into_iter().find(|r| r.is_err()) {
        return Err(format!("a start failed: {e}").into());
    }

    // The signaller: one `go` per workflow, spread over the run, retried on errors with the
    // same signal id.
    let signaller = {
        let (engine, ids, spread) = (engine.clone(), ids.clone(), s.spread_ms);
        tokio::spawn(async move {
            let t0 = std::time::Instant::now();
            let mut failed = 0usize;
            for (i, id) in ids.iter().enumerate() {
                let at = t0 + Duration::from_millis(spread * i as u64 / ids.len().max(1) as u64);
                tokio::time::sleep_until(at.into()).await;
                let signal = Signal::builder(id.as_str(), "go")
                    .wait_key(id.as_str())
                    .signal_id(go_signal_id(id))
                    .build()
                    .expect("valid signal");
                let mut tries = 0;
                while engine.deliver_signal(signal.clone()).await.is_err() {
                    tries += 1;
                    if tries >= 50 {
                        failed += 1;
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            failed
        })
    };

    let mut line = Line {
        store: deployment.store.scheme.kind().to_string(),
        processes: s.processes,
        workflows: s.workflows,
        ..Line::default()
    };
    let mut oracle_tail = Tail::new(&oracle_path);
    // How many workflows are terminal, counted in the background so the chaos loop
    // reacts within its 25 ms period.
    let terminal = Arc::new(AtomicUsize::new(0));
    let counter = {
        let (store, ids, terminal) = (engine.ports().store.clone(), ids.clone(), terminal.clone());
        tokio::spawn(async move {
            loop {
                let mut n = 0;
                for id in &ids {
                    if store
                        .get(&WorkflowId::from(id.as_str()))
                        .await
                        .ok()
                        .flatten()
                        .is_some_and(|i| i.status.is_terminal())
                    {
                        n += 1;
                    }
                }
                terminal.store(n, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let mut victim_since = std::time::Instant::now();
    // The stopped worker's claim: until when, on which workflow, under which token.
    let mut stopped: Option<(std::time::Instant, String, String)> = None;
    let mut stops_without_takeover = 0usize;
    let mut capped = false;
    loop {
        // Effects recorded in the last 30 ms: their process is inside that step now (an
        // effect is followed by WORK_MS of work before the step's completion).
        let fresh_after = wall_ms() - 30;
        let fresh: Vec<Value> = oracle_tail
            .read_new()?
            .into_iter()
            .filter(|v| v.get("t").and_then(Value::as_i64).is_some_and(|t| t >= fresh_after))
            .collect();
        let inside = |w: &Worker| fresh.iter().find(|v| v.get("pid").and_then(Value::as_u64) == Some(u64::from(w.pid)));
        let now = std::time::Instant::now();
        if line.kills < s.kills
            && inside(&workers[victim]).is_some()
            && now >= victim_since + Duration::from_millis(300)
        {
            workers[victim].kill()?;
            line.kills += 1;
            workers[victim] = spawn(&workers[victim].name.clone())?;
            victim_since = std::time::Instant::now();
        }
        match &stopped {
            None if line.stops < s.stops && line.kills >= 1 => {
                if let Some(v) = inside(&workers[zombie]) {
                    let field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
                    let (wf, token) = (field("wf"), field("token"));
                    workers[zombie].stop()?;
                    stopped = Some((now + Duration::from_millis(LEASE_MS as u64 + 1_500), wf, token));
                }
            }
            Some((until, wf, token)) if now >= *until => {
                // Counted only when another process took the claim over meanwhile (the
                // instance no longer carries the stopped worker's token); the stopped
                // worker could not have changed it.
                let inst = engine.ports().store.get(&WorkflowId::from(wf.as_str())).await?;
                let taken_over =
                    inst.is_some_and(|i| i.claim_token.as_ref().map(|t| t.as_str()) != Some(token.as_str()));
                workers[zombie].cont()?;
                if taken_over {
                    line.stops += 1;
                } else {
                    stops_without_takeover += 1;
                }
                stopped = None;
            }
            _ => {}
        }
        // Done once every workflow finished and no worker is stopped; a run that finished
        // before every kill or stop happened fails its counts below.
        if terminal.load(Ordering::SeqCst) == ids.len() && stopped.is_none() {
            break;
        }
        if now > cap_at {
            capped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    counter.abort();
    for w in workers.iter_mut() {
        w.terminate(Duration::from_secs(5))?;
    }
    // Every workflow waited for its signal, so the signaller is done unless the run was
    // capped; a signaller still running counts as failed signals.
    let signals_failed = match tokio::time::timeout(Duration::from_secs(2), signaller).await {
        Ok(Ok(failed)) => failed,
        _ => ids.len(),
    };

    // The judgement: the store and the oracle only, after every process stopped.
    let mut views = Vec::new();
    let mut signalled = 0;
    for id in &ids {
        if let Some(i) = engine.ports().store.get(&WorkflowId::from(id.as_str())).await? {
            let go = i.output.get("await_go").and_then(|o| o.get("signal_id")).and_then(Value::as_str);
            signalled += usize::from(go == Some(go_signal_id(id).as_str()));
            views.push(WorkflowView::of(&i));
        }
    }
    let effects: Vec<Effect> = read_lines(&oracle_path)?.iter().filter_map(Effect::parse).collect();
    let verdict = judge(&ids, &views, &effects, &EFFECT_STEPS);
    line.completed = verdict.completed;
    line.duplicate_effects = verdict.duplicate_effects;
    line.stale_writes_accepted = verdict.stale_writes_accepted;
    line.lost = verdict.lost;
    let (refused, zombie_refused) = count_refused(dir, &workers, &[workers[zombie].name.as_str()]);
    println!("{line}");
    println!(
        "real-crash detail: applied_effects={} redelivered={} signalled={signalled} stops_without_takeover={stops_without_takeover} refused_writes={refused} zombie_token_writes_refused={zombie_refused} wall_ms={}{}",
        verdict.applied,
        verdict.redelivered,
        started.elapsed().as_millis(),
        if capped { format!(" CAPPED at {:?}", s.cap) } else { String::new() }
    );
    let ok = !capped
        && line.kills >= s.kills.max(1)
        && line.stops >= s.stops
        && line.completed == s.workflows
        && line.duplicate_effects == 0
        && line.stale_writes_accepted == 0
        && line.lost == 0
        && signalled == line.completed
        && signals_failed == 0;
    Ok(ok)
}

/// Guarded writes the workers saw refused, and those of them the stopped workers
/// (`zombies`) made under a claim token (their late writes): the workers' own reports,
/// informational only. Most refusals are races lost on purpose (several workers'
/// maintenance passes activating the same due timer; one wins).
pub fn count_refused(dir: &Path, workers: &[Worker], zombies: &[&str]) -> (usize, usize) {
    let (mut all, mut late) = (0, 0);
    for w in workers {
        for v in read_lines(&dir.join(format!("events-{}.jsonl", w.name))).unwrap_or_default() {
            if v.get("kind").and_then(Value::as_str) == Some("missed") {
                all += 1;
                late += usize::from(zombies.contains(&w.name.as_str()) && v.get("token").is_some_and(|t| !t.is_null()));
            }
        }
    }
    (all, late)
}
