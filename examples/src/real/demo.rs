//! The README's first command for real: the live-summary story run by worker processes on
//! a durable store, with a real `SIGKILL` in the middle of a step and a real zombie.
//!
//! The supervisor (this process) accepts two business objects (the listeners' notes) and
//! the live they wait for, in the store's business table, with their dispatch intents,
//! and starts their summary workflows. Then:
//!
//! 1. worker **A** runs the summaries up to their "live ready" wait; the live ends (a
//!    fan-out workflow sets the business fact and signals every subscriber); A transcribes
//!    both (one ASR job per K-17.1 key, polled with durable sleeps) and enters compose of
//!    one of them: it writes the summary to the business object, fenced by the round, and
//!    holds before its `CompleteStep`. The supervisor sees the marker and **kills A with
//!    SIGKILL**;
//! 2. worker **B** starts; the killed summary is taken over once A's lease ran out, and
//!    compose finds the business result (it short-circuits: nothing is written twice).
//!    B enters compose of the other summary and holds after its business write too. The
//!    supervisor **stops B with SIGSTOP** and starts worker **C**;
//! 3. C takes over once B's lease ran out and completes compose under its own claim
//!    token; the supervisor then **continues B with SIGCONT**: B's late write carries the
//!    old token and the store refuses it (B records the miss; the supervisor prints it);
//! 4. everything completes; the supervisor stops B and C (SIGTERM) and reads the
//!    business table, the store and the oracle file: each summary written once.
//!
//! Every activity returns `{"attempt", "token"}` of its entry, so the run is also judged
//! by [`super::oracle::judge`].

use super::oracle::{self, Effect, WorkflowView};
use super::steps::{stamped, transient};
use super::{
    cleanup, fresh_queue_url, fresh_store_url, queue_options, read_lines, run_dir, urls_from_args, wall_ms, EventLog,
    Oracle, Tail, Worker, WorkerArgs, WorkerEnv,
};
use crate::story;
use compose::{Deployment, Urls};
use kernel_core::ports::{DispatchIntent, DynOutbox, Observation, Signal};
use kernel_core::{
    ActivityContext, ActivityError, Definition, Engine, FencingToken, Instant, ObjectId, Priority, StartRequest,
    StepDef, StepOutcome, WorkflowId, WorkflowStatus,
};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Type of the summary workflow.
pub const LIVE_SUMMARY: &str = "live_summary";
/// Type of the fan-out workflow.
pub const LIVE_FANOUT: &str = "live_fanout";
/// The live both listeners wait for.
pub const LIVE_ID: &str = "live-7";
/// The business round of every object of the demo.
pub const ROUND: &str = "f1";
/// The listeners' notes and their summary workflows.
pub const NOTES: [(&str, &str); 2] = [("note-li", "sum-li"), ("note-wang", "sum-wang")];
/// The fan-out workflow.
pub const FANOUT_ID: &str = "fan-live-7";
/// Polls of an ASR job until its transcript is ready.
pub const ASR_POLLS: u64 = 2;
/// Durable sleep between two polls of an ASR job.
pub const ASR_POLL_MS: i64 = 400;
/// Longest wall time of the whole demo; past it the demo fails rather than hangs.
pub const DEMO_CAP: Duration = Duration::from_secs(90);
/// Longest hold of the activity of the worker that is stopped; it returns as soon as it
/// notices it was stopped (its clock jumped by more than [`STOP_NOTICED_MS`]), so its late
/// `CompleteStep` is attempted right after the `SIGCONT`.
pub const ZOMBIE_HOLD_MS: u64 = 10_000;
/// A jump of the monotonic clock between two 20 ms ticks that means the process was stopped.
pub const STOP_NOTICED_MS: u64 = 1_000;
/// How long a held activity of the worker that is killed waits (it never returns).
pub const KILL_HOLD_MS: u64 = 60_000;

fn round_of(ctx: &ActivityContext) -> Result<(ObjectId, FencingToken), ActivityError> {
    let r = ctx.round();
    match (&r.object_id, &r.fencing_token) {
        (Some(o), Some(f)) => Ok((o.clone(), f.clone())),
        _ => Err(ActivityError::permanent("input.object_id / input.fencing_token missing")),
    }
}

/// An effect line (see [`super::steps`]) naming which `effect` it is.
fn effect_line(ctx: &ActivityContext, effect: &str) -> Value {
    let mut line = super::steps::effect_line(ctx);
    line["effect"] = json!(effect);
    line
}

/// Where a worker's activities hold: `compose` (for [`KILL_HOLD_MS`]) or `compose:<ms>`;
/// only the first business write of the process holds.
#[derive(Debug, Clone, Copy)]
struct Hold {
    ms: u64,
}

impl Hold {
    fn parse(spec: Option<&str>) -> Option<Hold> {
        let spec = spec?;
        let (step, ms) = spec.split_once(':').unwrap_or((spec, ""));
        (step == "compose").then(|| Hold { ms: ms.parse().unwrap_or(KILL_HOLD_MS) })
    }
}

/// Wait `max`, or until the process notices it was stopped and continued.
async fn hold_until_stopped_or(max: Duration) {
    let start = std::time::Instant::now();
    let mut last = start;
    while last.duration_since(start) < max {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = std::time::Instant::now();
        if now.duration_since(last) > Duration::from_millis(STOP_NOTICED_MS) {
            return;
        }
        last = now;
    }
}

/// The story's definitions on the business table `outbox`, recording effects into
/// `oracle` and hold markers into `events`.
pub fn definitions(
    outbox: Arc<DynOutbox>,
    oracle: Arc<Oracle>,
    events: Arc<EventLog>,
    hold: Option<&str>,
) -> Vec<Definition> {
    let hold = Hold::parse(hold);
    let held = Arc::new(AtomicBool::new(false));

    let o1 = outbox.clone();
    let preprocess = move |ctx: ActivityContext| {
        let outbox = o1.clone();
        async move {
            let (object, f) = round_of(&ctx)?;
            let live = ctx.input().get("live_id").and_then(Value::as_str).unwrap_or(LIVE_ID).to_string();
            // The business fact is the truth; the signal is only a doorbell (K-9.3).
            let ended = outbox.get(&ObjectId::from(live.as_str())).await.map_err(transient)?;
            if ended.and_then(|r| r.business_status).as_deref() != Some("ended") {
                return Ok(StepOutcome::wait_for_signal("live_ready", live).poll_after_ms(5_000).into());
            }
            if !outbox
                .fenced_update(&object, &f, json!({ "quota_held": true }), Some("processing"))
                .await
                .map_err(transient)?
            {
                return Err(ActivityError::canceled("the business round moved on"));
            }
            Ok(StepOutcome::complete(stamped(&ctx, json!({ "live_id": live }))))
        }
    };
    let a1 = oracle.clone();
    let transcribe = move |ctx: ActivityContext| {
        let oracle = a1.clone();
        async move {
            let task = ctx.checkpoint().and_then(|c| c.get("task_id")).and_then(Value::as_str).map(str::to_string);
            if let Some(task_id) = task {
                // Reuse the committed task id; never submit again.
                let polls = ctx.checkpoint().and_then(|c| c.get("polls")).and_then(Value::as_u64).unwrap_or(0) + 1;
                if polls >= ASR_POLLS {
                    let out = json!({ "task_id": task_id, "transcript": format!("transcript of {task_id}") });
                    return Ok(StepOutcome::complete(stamped(&ctx, out)));
                }
                return Ok(StepOutcome::sleep(ASR_POLL_MS, json!({ "task_id": task_id, "polls": polls })));
            }
            // Submit one job to the ASR service under the K-17.1 key: a re-execution after
            // a crash submits the same key, which the service recognises.
            oracle.append(&effect_line(&ctx, "asr_submit")).map_err(transient)?;
            let task_id = format!("asr-{}", ctx.workflow_id());
            Ok(StepOutcome::sleep(ASR_POLL_MS, json!({ "task_id": task_id, "polls": 0 })))
        }
    };
    let (o2, a2, e2) = (outbox.clone(), oracle.clone(), events.clone());
    let compose = move |ctx: ActivityContext| {
        let (outbox, oracle, events, held) = (o2.clone(), a2.clone(), e2.clone(), held.clone());
        async move {
            let (object, f) = round_of(&ctx)?;
            // Short-circuit when this round's result already exists (K-12).
            let rec = outbox.get(&object).await.map_err(transient)?;
            if rec.as_ref().is_some_and(|r| r.fields.get("result").is_some_and(|v| !v.is_null())) {
                return Ok(StepOutcome::complete(stamped(&ctx, json!({ "reused": true }))));
            }
            let transcript = ctx.output("transcribe").and_then(|o| o.get("transcript")).and_then(Value::as_str);
            let summary = format!("summary({})", transcript.unwrap_or_default());
            let written =
                outbox.fenced_update(&object, &f, json!({ "result": summary }), None).await.map_err(transient)?;
            if !written {
                return Err(ActivityError::canceled("the business round moved on"));
            }
            oracle.append(&effect_line(&ctx, "summary")).map_err(transient)?;
            if let Some(h) = hold {
                if !held.swap(true, Ordering::SeqCst) {
                    events.record(
                        "hold",
                        json!({ "wf": ctx.workflow_id(), "step": ctx.step_name(), "token": ctx.claim_token() }),
                    );
                    hold_until_stopped_or(Duration::from_millis(h.ms)).await;
                }
            }
            Ok(StepOutcome::complete(stamped(&ctx, json!({ "chars": summary.len() }))))
        }
    };
    let o3 = outbox.clone();
    let finalize = move |ctx: ActivityContext| {
        let outbox = o3.clone();
        async move {
            let (object, f) = round_of(&ctx)?;
            if !outbox
                .fenced_update(&object, &f, json!({ "quota_held": false }), Some("done"))
                .await
                .map_err(transient)?
            {
                return Err(ActivityError::canceled("the business round moved on"));
            }
            Ok(StepOutcome::complete(stamped(&ctx, json!({ "status": "done" }))))
        }
    };
    let summary = Definition::builder(LIVE_SUMMARY)
        .step(StepDef::new("preprocess", preprocess).timeout_ms(30_000).max_retry(2))
        .step(StepDef::new("transcribe", transcribe).timeout_ms(60_000).resource("speech_recognition"))
        .step(StepDef::new("compose", compose).timeout_ms(120_000).max_retry(1).resource("content_generation"))
        .step(StepDef::new("finalize", finalize).timeout_ms(30_000).max_retry(2))
        .build()
        .expect("valid definition");

    let o4 = outbox;
    let announce = move |ctx: ActivityContext| {
        let outbox = o4.clone();
        async move {
            let (live, f) = round_of(&ctx)?;
            // The fact first, then the doorbells (each with a stable id, K-9.3).
            outbox.fenced_update(&live, &f, json!({ "ended": true }), Some("ended")).await.map_err(transient)?;
            let subs: Vec<String> = ctx
                .input()
                .get("subscribers")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
                .unwrap_or_default();
            for wf in &subs {
                let s = Signal::builder(wf.clone(), "live_ready")
                    .wait_key(live.to_string())
                    .signal_id(format!("live-ready:{live}:{wf}"))
                    .build()
                    .map_err(transient)?;
                ctx.signals().deliver(s).await.map_err(transient)?;
            }
            Ok(StepOutcome::complete(stamped(&ctx, json!({ "delivered": subs.len() }))))
        }
    };
    let fanout = Definition::builder(LIVE_FANOUT)
        .step(StepDef::new("announce", announce).max_retry(5))
        .build()
        .expect("valid definition");
    vec![summary, fanout]
}

/// The worker process of the demo.
pub async fn worker(args: WorkerArgs) -> Result<(), Box<dyn std::error::Error>> {
    let options = queue_options(story::limits());
    super::run_worker(args, options, |env: &WorkerEnv| {
        Box::pin(async move {
            let outbox = env.deployment.store.dispatch_outbox().await.map_err(|e| e.to_string())?;
            Ok(definitions(outbox, env.oracle.clone(), env.events.clone(), env.args.hold.as_deref()))
        })
    })
    .await
}

/// Prints the workers' events in the order they happened.
struct Timeline {
    tails: Vec<Tail>,
    t0: i64,
}

impl Timeline {
    fn follow(&mut self, path: &Path) {
        self.tails.push(Tail::new(path));
    }

    /// Print and return the events appended since the last call.
    fn pump(&mut self) -> Vec<Value> {
        let mut new: Vec<Value> = self.tails.iter_mut().flat_map(|t| t.read_new().unwrap_or_default()).collect();
        new.sort_by_key(|v| v.get("t").and_then(Value::as_i64).unwrap_or(0));
        for e in &new {
            if let Some(text) = describe(e) {
                self.say_at(e.get("t").and_then(Value::as_i64).unwrap_or_else(wall_ms), &text);
            }
        }
        new
    }

    fn say_at(&self, t: i64, text: &str) {
        println!("{:>7.2}s  {text}", (t - self.t0) as f64 / 1000.0);
    }

    fn say(&self, text: &str) {
        self.say_at(wall_ms(), text);
    }
}

fn describe(e: &Value) -> Option<String> {
    let w = e.get("w").and_then(Value::as_str).unwrap_or("?");
    let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
    match e.get("kind").and_then(Value::as_str)? {
        "obs" => serde_json::from_value::<Observation>(e.get("obs")?.clone()).ok().map(|o| story::describe(&o)),
        "missed" if e.get("token").is_none_or(Value::is_null) => Some(format!(
            "{w} {} on {} missed: another worker's write came first (a guarded write, nothing changed)",
            e.get("kinds").map(Value::to_string).unwrap_or_default(),
            s("wf")
        )),
        "missed" => Some(format!(
            "{w} [{}] late write {} on {} REFUSED by the store: the claim token was superseded (K-3.4)",
            s("token"),
            e.get("kinds").map(Value::to_string).unwrap_or_default(),
            s("wf")
        )),
        "hold" => Some(format!(
            "{w} [{}] inside {} of {}: summary written to the business object (fenced by the round), CompleteStep not written yet",
            s("token"),
            s("step"),
            s("wf")
        )),
        "started" => Some(format!("{w} worker process started (pid {})", e.get("pid").unwrap_or(&Value::Null))),
        "stopped" => Some(format!("{w} worker process shut down (graceful: {})", e.get("clean").unwrap_or(&Value::Null))),
        _ => None,
    }
}

/// Everything one run of the demo uses.
struct Run {
    urls: Urls,
    dir: PathBuf,
    oracle: PathBuf,
    deadline: std::time::Instant,
    timeline: Timeline,
    workers: Vec<Worker>,
}

impl Run {
    fn spawn(&mut self, name: &str, hold: Option<String>) -> Result<usize, Box<dyn std::error::Error>> {
        let events = self.dir.join(format!("events-{name}.jsonl"));
        self.timeline.follow(&events);
        let args = WorkerArgs { hold, ..WorkerArgs::in_run(&self.urls, &self.dir, &self.oracle, name) };
        self.workers.push(Worker::spawn(args)?);
        Ok(self.workers.len() - 1)
    }

    /// Pump the timeline until `found` picks something out of the new events.
    async fn until_event<T>(
        &mut self,
        what: &str,
        mut found: impl FnMut(&Value) -> Option<T>,
    ) -> Result<T, Box<dyn std::error::Error>> {
        loop {
            for e in self.timeline.pump() {
                if let Some(t) = found(&e) {
                    return Ok(t);
                }
            }
            self.check_deadline(what)?;
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    }

    fn check_deadline(&self, what: &str) -> Result<(), Box<dyn std::error::Error>> {
        if std::time::Instant::now() > self.deadline {
            return Err(format!("the demo did not finish within {DEMO_CAP:?} (waiting for {what})").into());
        }
        Ok(())
    }
}

fn is_kind(e: &Value, kind: &str, worker: &str) -> bool {
    e.get("kind").and_then(Value::as_str) == Some(kind) && e.get("w").and_then(Value::as_str) == Some(worker)
}

/// Run the real demo: `args` may name `--store`/`--queue` (else `WFK_STORE`/`WFK_QUEUE`,
/// else the defaults of [`super`]).
pub async fn run(args: Vec<String>) -> Result<(), Box<dyn std::error::Error>> {
    let (given, rest) = urls_from_args(args)?;
    if let Some(unknown) = rest.first() {
        return Err(format!("unknown argument {unknown} (flags: --store, --queue, --simulated)").into());
    }
    if given.store.starts_with("memory:") || given.queue.starts_with("memory:") {
        return Err("`memory:` is not shared between processes; the real demo needs a durable store".into());
    }
    let dir = run_dir("live-summary")?;
    let store = fresh_store_url(&given.store, &dir, "live_summary");
    let urls = Urls { queue: fresh_queue_url(&given.queue, &store, "live_summary"), store };
    let deployment = match Deployment::from_urls(&urls, &queue_options(story::limits())).await {
        Ok(d) => d,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e.into());
        }
    };
    println!("== real processes on {} (run directory {})", deployment.describe(), dir.display());
    if let Some(file) = urls.store.strip_prefix("sqlite:") {
        println!("   the database file: {file}");
    } else {
        println!("   the store: {} (a fresh namespace, deleted at the end)", compose::redact(&urls.store));
    }
    let outcome = scenario(&deployment, urls.clone(), &dir).await;
    if let Err(e) = cleanup(deployment, &urls).await {
        eprintln!("cleanup failed: {e}");
    }
    // The directory holds the database file of a file store: kept. With a server store it
    // holds only the workers' events and logs and the oracle: kept when the run failed.
    if outcome.is_err() || !super::is_server(&urls.store) {
        println!("   kept for a look: {} (the workers' events and logs, the oracle file)", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    if let Some(file) = urls.store.strip_prefix("sqlite:") {
        println!("   the database file: {file}");
    }
    if outcome.is_ok() {
        println!(
            "== every summary written once; the killed worker's step resumed from the store; the zombie's late writes were refused"
        );
    }
    outcome
}

async fn scenario(deployment: &Deployment, urls: Urls, dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let outbox = deployment.store.dispatch_outbox().await?;
    let oracle_path = dir.join("effects.jsonl");
    let sup_log = EventLog::open(&dir.join("events-supervisor.jsonl"), "supervisor")?;
    let defs = definitions(outbox.clone(), Oracle::open(&oracle_path)?, sup_log, None);
    let mut builder = Engine::builder(deployment.ports().build()?).config(super::engine_config("supervisor"));
    for d in defs {
        builder = builder.register(d);
    }
    // Never spawned: the supervisor only starts workflows and reads.
    let engine = builder.build()?;
    let publisher = engine.publisher();
    let store = deployment.store.store.clone();
    let mut run = Run {
        urls,
        dir: dir.to_path_buf(),
        oracle: oracle_path.clone(),
        deadline: std::time::Instant::now() + DEMO_CAP,
        timeline: Timeline { tails: Vec::new(), t0: wall_ms() },
        workers: Vec::new(),
    };
    let f = FencingToken::from(ROUND);
    let now = Instant::from_millis(wall_ms());

    println!("== accept: two listeners subscribe to the summary of {LIVE_ID} (not ended yet)");
    let subscribers: Vec<&str> = NOTES.iter().map(|(_, wf)| *wf).collect();
    let fan_input = json!({ "object_id": LIVE_ID, "fencing_token": ROUND, "subscribers": subscribers });
    let live_intent = DispatchIntent::pending(LIVE_FANOUT, "fanout:live-7", &f, fan_input.clone(), Priority::P1, now);
    outbox.accept(&ObjectId::from(LIVE_ID), json!({}), "live", live_intent).await?;
    let mut starts = Vec::new();
    for (obj, wf) in NOTES {
        let input = json!({ "object_id": obj, "live_id": LIVE_ID, "fencing_token": ROUND });
        let biz_key = format!("summary:{obj}");
        let intent = DispatchIntent::pending(LIVE_SUMMARY, &biz_key, &f, input.clone(), Priority::P0, now);
        outbox.accept(&ObjectId::from(obj), json!({}), "initial", intent).await?;
        starts.push((obj, wf, StartRequest::new(LIVE_SUMMARY, biz_key, input).workflow_id(wf).priority(Priority::P0)));
    }
    run.spawn("A", Some("compose".into()))?;
    for (obj, wf, req) in starts {
        let out = publisher.start_or_resume(req).await?;
        outbox.confirm_dispatched(&ObjectId::from(obj), &f).await?;
        run.timeline.say(&format!("StartOrResume {wf}: created={} activated={}", out.created, out.execution_activated));
    }

    // Both summaries park on their "live ready" wait, holding no worker.
    loop {
        run.timeline.pump();
        let mut waiting = 0;
        for (_, wf) in NOTES {
            if store.get(&WorkflowId::from(wf)).await?.is_some_and(|i| i.status == WorkflowStatus::Waiting) {
                waiting += 1;
            }
        }
        if waiting == NOTES.len() {
            break;
        }
        run.check_deadline("both summaries to wait for the live")?;
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    println!("== the live ends: a fan-out workflow sets the fact and signals every subscriber");
    let fan = StartRequest::new(LIVE_FANOUT, "fanout:live-7", fan_input).workflow_id(FANOUT_ID);
    publisher.start_or_resume(fan).await?;
    outbox.confirm_dispatched(&ObjectId::from(LIVE_ID), &f).await?;

    // Kill A in the middle of compose, after its business write.
    let killed_wf = run
        .until_event("worker A to enter compose", |e| {
            is_kind(e, "hold", "A").then(|| e.get("wf").and_then(Value::as_str).unwrap_or_default().to_string())
        })
        .await?;
    run.workers[0].kill()?;
    run.timeline.say(&format!(
        "!! SIGKILL worker A (pid {}) inside compose of {killed_wf}, before its CompleteStep",
        run.workers[0].pid
    ));
    run.timeline.say(&format!("-- nobody runs {killed_wf} until A's lease expires; worker B starts"));
    let b = run.spawn("B", Some(format!("compose:{ZOMBIE_HOLD_MS}")))?;

    // Stop B in the middle of compose; C takes over.
    let (stopped_wf, b_token) = run
        .until_event("worker B to enter compose", |e| {
            is_kind(e, "hold", "B").then(|| {
                let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
                (s("wf"), s("token"))
            })
        })
        .await?;
    run.workers[b].stop()?;
    run.timeline.say(&format!(
        "!! SIGSTOP worker B (pid {}) inside compose of {stopped_wf}: it holds claim [{b_token}] and stops heartbeating",
        run.workers[b].pid
    ));
    run.timeline.say("-- worker C starts; it may take the claim once B's lease has expired");
    run.spawn("C", None)?;
    let compose_at = 2;
    loop {
        run.timeline.pump();
        let inst = store.get(&WorkflowId::from(stopped_wf.as_str())).await?;
        if inst.is_some_and(|i| i.steps.get(compose_at).is_some_and(|s| s.status == kernel_core::StepStatus::Completed))
        {
            break;
        }
        run.check_deadline("worker C to complete compose")?;
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    let inst = store.get(&WorkflowId::from(stopped_wf.as_str())).await?.ok_or("instance vanished")?;
    let by = inst.output.get("compose").and_then(|o| o.get("token")).and_then(Value::as_str).unwrap_or("?").to_string();
    run.timeline
        .say(&format!("-- the store: compose of {stopped_wf} completed under claim [{by}], not B's [{b_token}]"));
    run.workers[b].cont()?;
    run.timeline.say(&format!("!! SIGCONT worker B: it wakes up late, still holding [{b_token}] in its memory"));
    run.until_event("worker B's late write to be refused", |e| {
        (is_kind(e, "missed", "B") && e.get("token").and_then(Value::as_str) == Some(b_token.as_str())).then_some(())
    })
    .await?;

    // Everything completes.
    let ids: Vec<&str> = NOTES.iter().map(|(_, wf)| *wf).chain([FANOUT_ID]).collect();
    loop {
        run.timeline.pump();
        let mut done = 0;
        for id in &ids {
            if store.get(&WorkflowId::from(*id)).await?.is_some_and(|i| i.status.is_terminal()) {
                done += 1;
            }
        }
        if done == ids.len() {
            break;
        }
        run.check_deadline("every workflow to finish")?;
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    for w in run.workers.iter_mut() {
        w.terminate(Duration::from_secs(5))?;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    run.timeline.pump();

    report(&*outbox, &store, &ids, &oracle_path, (&stopped_wf, &b_token)).await
}

/// Read the business table, the store and the oracle after every worker stopped, print
/// the result, and fail unless each summary was written exactly once and every workflow
/// completed.
async fn report(
    outbox: &DynOutbox,
    store: &Arc<kernel_core::ports::DynStore>,
    ids: &[&str],
    oracle_path: &Path,
    (zombie_wf, zombie_token): (&str, &str),
) -> Result<(), Box<dyn std::error::Error>> {
    println!("== result (read from the store and the oracle after every worker stopped)");
    let effects: Vec<(Value, Effect)> =
        read_lines(oracle_path)?.into_iter().filter_map(|v| Effect::parse(&v).map(|e| (v, e))).collect();
    let mut ok = true;
    for (obj, wf) in NOTES {
        let rec = outbox.get(&ObjectId::from(obj)).await?.ok_or_else(|| format!("{obj} vanished"))?;
        let status = rec.business_status.unwrap_or_default();
        let result = rec.fields.get("result").and_then(Value::as_str).unwrap_or("-").to_string();
        let writes: Vec<&Effect> =
            effects.iter().filter(|(v, e)| v["effect"] == "summary" && e.workflow_id == wf).map(|(_, e)| e).collect();
        println!("   {obj}: status={status} round={ROUND} result={result:?} summary_writes={}", writes.len());
        ok &= status == "done" && writes.len() == 1 && result != "-";
    }
    let mut views = Vec::new();
    for id in ids {
        let i = store.get(&WorkflowId::from(*id)).await?.ok_or_else(|| format!("{id} vanished"))?;
        let attempts: Vec<String> = i.steps.iter().map(|s| format!("{}:{}", s.name, s.attempt)).collect();
        let waits: i64 = i.steps.iter().map(|s| s.traffic_wait_ms.as_millis()).sum();
        println!(
            "   {} {} revision={} attempts=[{}] permit_wait_ms={waits}",
            i.workflow_id,
            i.status.as_str(),
            i.revision,
            attempts.join(" ")
        );
        views.push(WorkflowView::of(&i));
    }
    let all: Vec<Effect> = effects.iter().map(|(_, e)| e.clone()).collect();
    let asr: Vec<Effect> =
        effects.iter().filter(|(v, _)| v["effect"] == "asr_submit").map(|(_, e)| e.clone()).collect();
    let summaries: Vec<String> = NOTES.iter().map(|(_, wf)| wf.to_string()).collect();
    let verdict = oracle::judge(&summaries, &views, &all, &["transcribe", "compose"]);
    // The step the zombie held: its committed completion must not be the zombie's.
    let zombie_accepted = views
        .iter()
        .filter(|w| w.workflow_id == zombie_wf)
        .flat_map(|w| w.steps.iter().filter(|s| s.name == "compose"))
        .filter(|s| s.output.as_ref().and_then(|o| o.get("token")).and_then(Value::as_str) == Some(zombie_token))
        .count();
    println!(
        "   ASR submissions={} distinct_jobs={} summary_writes={} duplicate_effects={} stale_writes_accepted={} zombie_outputs_accepted={zombie_accepted} lost={}",
        asr.len(),
        asr.iter().map(|e| e.key.as_str()).collect::<std::collections::BTreeSet<_>>().len(),
        effects.iter().filter(|(v, _)| v["effect"] == "summary").count(),
        verdict.duplicate_effects,
        verdict.stale_writes_accepted,
        verdict.lost
    );
    ok &= verdict.duplicate_effects == 0 && verdict.stale_writes_accepted == 0 && verdict.lost == 0;
    ok &= verdict.completed == summaries.len() && zombie_accepted == 0;
    if !ok {
        return Err("the real demo did not end with every summary written once".into());
    }
    Ok(())
}
