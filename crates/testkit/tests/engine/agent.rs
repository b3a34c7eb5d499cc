//! Bounded agents (K-17 amendment, sub-steps `K ∥ subStep`): a crash anywhere resumes from
//! the last recorded sub-step without re-sampling a recorded proposal or re-running a
//! recorded tool call; the limits stop the loop with a typed, recorded outcome that the
//! step's `on_failed` policy handles; an agent without limits is refused.
//!
//! The oracles are the fakes themselves: on every ask the scripted model reads the store
//! and counts a *re-sample* when the proposal it is asked for is already recorded there
//! (its output, or a sample at or above the index asked); on every execution a tool reads
//! the store and counts a *re-execution* when its sub-step's label is already recorded.

use kernel_agents::*;
use kernel_core::model_call::{Model, ModelAnswer, ModelRequest, OutputSchema};
use kernel_core::ports::*;
use kernel_core::record::{RecordEntry, StepRecord, Usage, VersionRef};
use kernel_core::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use testkit::harness::{sweep, BoxFuture, Scenario, ScenarioRun, ScenarioVerdict, SweepSample, World};
use testkit::memory::ManualClock;

/// Counts of the fakes, over every run that shares them.
#[derive(Default, Debug)]
struct Oracle {
    /// Samples the model drew.
    asks: AtomicU64,
    /// Asks for a proposal (or a sample of one) the store already held.
    proposal_resamples: AtomicU64,
    /// Tool executions.
    tool_runs: AtomicU64,
    /// Tool executions of a sub-step the store already held.
    tool_reexecutions: AtomicU64,
    /// Invocations of the agent step (wrapper activities only).
    invocations: AtomicU64,
    /// Invocations that entered with agent sub-steps already recorded in the store.
    resumes: AtomicU64,
}

fn get(a: &AtomicU64) -> u64 {
    a.load(Ordering::SeqCst)
}

/// The current logical attempt's record of the step `ctx` runs, as the store holds it.
async fn stored_record(store: &Arc<DynStore>, ctx: &ActivityContext) -> Option<StepRecord> {
    let inst = store.get(&WorkflowId::from(ctx.workflow_id())).await.ok()??;
    inst.steps.get(ctx.step_index())?.record_of(inst.retry_count).cloned()
}

type Script = Arc<dyn Fn(&ModelRequest, usize) -> Value + Send + Sync>;

/// A scripted model: `script(request, sample)` is the raw JSON answer.
struct ScriptedModel {
    script: Script,
    usage: Usage,
    store: Arc<DynStore>,
    oracle: Arc<Oracle>,
}

#[async_trait::async_trait]
impl Model for ScriptedModel {
    fn version(&self) -> VersionRef {
        VersionRef::new("planner", "1")
    }
    async fn generate(&self, req: &ModelRequest, ctx: &ActivityContext) -> Result<ModelAnswer, ActivityError> {
        self.oracle.asks.fetch_add(1, Ordering::SeqCst);
        let sample: usize =
            req.sample_key.rsplit('|').next().and_then(|s| s.parse().ok()).expect("sample key ends with the index");
        if let Some(rec) = stored_record(&self.store, ctx).await {
            let recorded = rec.model_calls().find(|c| c.label == req.label);
            if recorded.is_some_and(|c| c.output.is_some() || sample < c.samples.len()) {
                self.oracle.proposal_resamples.fetch_add(1, Ordering::SeqCst);
            }
        }
        Ok(ModelAnswer { raw: (self.script)(req, sample).to_string(), usage: self.usage })
    }
}

type Behaviour = Arc<dyn Fn(&ToolCall, u64) -> Result<Value, ActivityError> + Send + Sync>;

/// A fake tool: `behaviour(call, n)` answers the n-th execution (from 1) of a sub-step key.
struct FakeTool {
    name: &'static str,
    behaviour: Behaviour,
    runs: Arc<Mutex<BTreeMap<String, u64>>>,
    store: Arc<DynStore>,
    oracle: Arc<Oracle>,
}

impl FakeTool {
    fn new(name: &'static str, world: &World, oracle: &Arc<Oracle>, behaviour: Behaviour) -> Self {
        FakeTool { name, behaviour, runs: Default::default(), store: world.durable.clone(), oracle: oracle.clone() }
    }
}

#[async_trait::async_trait]
impl Tool for FakeTool {
    fn name(&self) -> &str {
        self.name
    }
    async fn call(&self, call: &ToolCall, key: &str, ctx: &ActivityContext) -> Result<Value, ActivityError> {
        self.oracle.tool_runs.fetch_add(1, Ordering::SeqCst);
        let (step_key, n) = key.rsplit_once("|s").expect("a sub-step key");
        assert_eq!(step_key, ctx.idempotency_key(), "K ∥ subStep");
        let label = format!("agent.t{n}");
        if stored_record(&self.store, ctx).await.is_some_and(|r| r.entries.iter().any(|e| e.label() == label)) {
            self.oracle.tool_reexecutions.fetch_add(1, Ordering::SeqCst);
        }
        let n = {
            let mut runs = self.runs.lock().unwrap();
            let n = runs.entry(key.to_string()).or_default();
            *n += 1;
            *n
        };
        (self.behaviour)(call, n)
    }
}

fn usage() -> Usage {
    Usage { input_tokens: 10, output_tokens: 5, cost_micros: 7 }
}

fn labels(rec: &StepRecord) -> Vec<String> {
    rec.entries.iter().map(|e| e.label().to_string()).collect()
}

// --- the crash sweep ------------------------------------------------------------------------

/// Tool results in a transcript, by tool name.
fn results<'a>(input: &'a Value, tool: &str) -> Vec<&'a Value> {
    input["transcript"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["tool_result"]["tool"] == tool)
        .map(|t| &t["tool_result"])
        .collect()
}

/// The planner of the sweep: it reads what the tools returned from the transcript. First
/// an invalid proposal (re-sampled), then two lookups proposed together, then a sum with a
/// call to a tool that does not exist, then done with the sum and the errors it saw.
fn planner(req: &ModelRequest, sample: usize) -> Value {
    let input = &req.input;
    let lookups = results(input, "lookup");
    let sums = results(input, "sum");
    if lookups.is_empty() {
        if sample == 0 {
            return json!({"tool_calls": "soon"});
        }
        let calls: Vec<Value> = input["task"]["cities"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| json!({"tool": "lookup", "args": {"city": c}}))
            .collect();
        return json!({ "tool_calls": calls });
    }
    if sums.is_empty() {
        let temps: Vec<Value> = lookups.iter().map(|r| r["result"]["temp"].clone()).collect();
        return json!({"tool_calls": [{"tool": "sum", "args": {"values": temps}}, {"tool": "forecast", "args": {}}]});
    }
    let errors = input["transcript"].as_array().into_iter().flatten().filter(|t| t["tool_result"]["error"].is_string());
    json!({"done": {"answer": sums[0]["result"], "tool_errors": errors.count()}})
}

fn lookup(call: &ToolCall, n: u64) -> Result<Value, ActivityError> {
    match call.args["city"].as_str() {
        Some("oslo") => Ok(json!({"temp": 3})),
        // The first execution of this sub-step times out: the step retries.
        Some("rome") if n == 1 => Err(ActivityError::transient("weather service timed out")),
        Some("rome") => Ok(json!({"temp": 18})),
        _ => Err(ActivityError::permanent("unknown city")),
    }
}

fn sum(call: &ToolCall, _: u64) -> Result<Value, ActivityError> {
    Ok(json!(call.args["values"].as_array().into_iter().flatten().filter_map(Value::as_i64).sum::<i64>()))
}

const SWEEP_LABELS: [&str; 8] =
    ["agent.start", "agent.p0", "agent.t1", "agent.t2", "agent.p3", "agent.t4", "agent.t5", "agent.p6"];

struct AgentStory {
    oracle: Arc<Oracle>,
}

struct AgentStoryRun {
    agent: Arc<Agent>,
    store: Arc<DynStore>,
    oracle: Arc<Oracle>,
    /// Step keys the tools ran under (one logical attempt: one key).
    step_keys: Arc<Mutex<BTreeSet<String>>>,
}

impl Scenario for AgentStory {
    fn name(&self) -> String {
        "agent-story".into()
    }
    fn instantiate(&self, world: &World) -> Box<dyn ScenarioRun> {
        let step_keys: Arc<Mutex<BTreeSet<String>>> = Default::default();
        let keyed = |f: fn(&ToolCall, u64) -> Result<Value, ActivityError>| -> Behaviour { Arc::new(f) };
        let model = ScriptedModel {
            script: Arc::new(planner),
            usage: usage(),
            store: world.durable.clone(),
            oracle: self.oracle.clone(),
        };
        let agent = Agent::builder(Arc::new(model), VersionRef::new("trip-plan", "1"))
            .tool(FakeTool::new("lookup", world, &self.oracle, keyed(lookup)))
            .tool(FakeTool::new("sum", world, &self.oracle, keyed(sum)))
            .limits(AgentLimits {
                max_sub_steps: 10,
                max_tokens: Some(10_000),
                max_cost_micros: None,
                deadline_ms: Some(DurationMs::from_secs(600)),
            })
            .build()
            .unwrap();
        Box::new(AgentStoryRun {
            agent: Arc::new(agent),
            store: world.durable.clone(),
            oracle: self.oracle.clone(),
            step_keys,
        })
    }
}

impl AgentStoryRun {
    fn definition(&self) -> Definition {
        let (agent, store, oracle, keys) =
            (self.agent.clone(), self.store.clone(), self.oracle.clone(), self.step_keys.clone());
        let plan = move |ctx: ActivityContext| {
            let (agent, store, oracle, keys) = (agent.clone(), store.clone(), oracle.clone(), keys.clone());
            async move {
                oracle.invocations.fetch_add(1, Ordering::SeqCst);
                let rec = stored_record(&store, &ctx).await;
                if rec.is_some_and(|r| r.entries.iter().any(|e| e.label().starts_with("agent.p"))) {
                    oracle.resumes.fetch_add(1, Ordering::SeqCst);
                }
                keys.lock().unwrap().insert(ctx.idempotency_key());
                let task = ctx.output("fetch").cloned().unwrap_or_default();
                let run = agent.run(&ctx, task).await?;
                Ok(StepOutcome::complete(run.output))
            }
        };
        // The step's own schema holds the `done` value; the proposals are held to the
        // built-in proposal schema (they would all fail this one).
        let answer =
            OutputSchema::new(VersionRef::new("trip-answer", "1"), json!({"type": "object", "required": ["answer"]}))
                .unwrap();
        Definition::builder("trip")
            .step(StepDef::new("fetch", |_| async { Ok(StepOutcome::complete(json!({"cities": ["oslo", "rome"]}))) }))
            .step(StepDef::new("plan", plan).output_schema(answer).max_retry(4).retry(RetryPolicy::Immediate))
            .build()
            .unwrap()
    }
}

impl ScenarioRun for AgentStoryRun {
    fn definitions(&self) -> Vec<Definition> {
        vec![self.definition()]
    }
    fn start<'a>(&'a self, engine: &'a Engine) -> BoxFuture<'a, kernel_core::Result<()>> {
        Box::pin(async move {
            engine.publisher().start_or_resume(StartRequest::new("trip", "trip:1", json!({}))).await?;
            Ok(())
        })
    }
    fn verdict(&self, instances: &[WorkflowInstance]) -> ScenarioVerdict {
        let mut unfinished = vec![];
        for i in instances {
            let rec = i.steps[1].record.as_ref();
            let p0 = rec.and_then(|r| r.model_calls().find(|c| c.label == "agent.p0"));
            let ok = i.status == WorkflowStatus::Completed
                && i.output.get("plan") == Some(&json!({"answer": 21, "tool_errors": 1}))
                && rec.map(labels) == Some(SWEEP_LABELS.iter().map(|s| s.to_string()).collect())
                && p0.is_some_and(|c| c.samples.len() == 2 && !c.samples[0].errors.is_empty())
                && p0.and_then(|c| c.schema.clone()) == Some(VersionRef::new("agent-proposal", "1"));
            if !ok {
                unfinished.push(i.biz_key.clone());
            }
        }
        ScenarioVerdict {
            expected: vec!["trip:1".into()],
            unfinished,
            effective_jobs_max: self.step_keys.lock().unwrap().len() as u64,
            late_submissions: 0,
        }
    }
}

/// The sweep of the agent story; the report and the oracle.
async fn agent_sweep() -> (testkit::harness::SweepReport, Arc<Oracle>) {
    let oracle = Arc::new(Oracle::default());
    let sc = AgentStory { oracle: oracle.clone() };
    let report = sweep(&[&sc], 31, SweepSample::All).await;
    (report, oracle)
}

// --- limits ---------------------------------------------------------------------------------

/// A model that always asks for one more tick.
fn ticker(_: &ModelRequest, _: usize) -> Value {
    json!({"tool_calls": [{"tool": "tick", "args": {}}]})
}

fn limits_for(limit: AgentLimit) -> AgentLimits {
    let mut l = AgentLimits {
        max_sub_steps: 50,
        max_tokens: Some(1_000_000),
        max_cost_micros: None,
        deadline_ms: Some(DurationMs::from_secs(3_600)),
    };
    match limit {
        AgentLimit::SubSteps => l.max_sub_steps = 3,
        AgentLimit::Tokens => l.max_tokens = Some(40),
        AgentLimit::CostMicros => (l.max_tokens, l.max_cost_micros) = (None, Some(10)),
        AgentLimit::Deadline => l.deadline_ms = Some(DurationMs::from_secs(5)),
        // Not declared: bounded by the payload limit (see `the_record_is_bounded_by_bytes`).
        AgentLimit::RecordBytes => {}
    }
    l
}

/// What each limit stops at, given 15 tokens and 7 micros per proposal and 2 s per tick:
/// `(used, max, labels recorded before the stop)`.
fn expected_stop(limit: AgentLimit) -> (u64, u64, usize) {
    match limit {
        // p0 t1 p2 | t3 refused
        AgentLimit::SubSteps => (3, 3, 3),
        // p0 (15) t1 p2 (30) t3 p4 (45) | t5 refused
        AgentLimit::Tokens => (45, 40, 5),
        // p0 (7) t1 p2 (14) | t3 refused
        AgentLimit::CostMicros => (14, 10, 3),
        // p0 t1 (2 s) p2 t3 (4 s) p4 t5 (6 s) | p6 refused
        AgentLimit::Deadline => (6_000, 5_000, 6),
        AgentLimit::RecordBytes => unreachable!("not a declared limit"),
    }
}

const LIMITS: [AgentLimit; 4] =
    [AgentLimit::SubSteps, AgentLimit::Tokens, AgentLimit::CostMicros, AgentLimit::Deadline];

fn ticking_agent(world: &World, oracle: &Arc<Oracle>, limits: AgentLimits) -> Agent {
    let clock: Arc<ManualClock> = world.clock.clone();
    let tick: Behaviour = Arc::new(move |_, _| {
        clock.advance(DurationMs::from_secs(2));
        Ok(json!({"ticked": true}))
    });
    let model = ScriptedModel {
        script: Arc::new(ticker),
        usage: usage(),
        store: world.durable.clone(),
        oracle: oracle.clone(),
    };
    Agent::builder(Arc::new(model), VersionRef::new("tick-prompt", "1"))
        .tool(FakeTool::new("tick", world, oracle, tick))
        .limits(limits)
        .build()
        .unwrap()
}

/// One workflow whose only step is an agent that reaches `limit`, run to rest.
async fn limit_case(limit: AgentLimit, on_failed: OnFailed, oracle: &Arc<Oracle>) -> (World, WorkflowInstance) {
    let world = World::new(40 + limit as u64);
    let agent = ticking_agent(&world, oracle, limits_for(limit));
    let def = Definition::builder("ticks")
        .step(StepDef::agent("tick", agent).on_failed(on_failed).timeout_ms(DurationMs::from_secs(600)))
        .step(StepDef::new("after", |_| async { Ok(StepOutcome::complete(json!("after"))) }))
        .build()
        .unwrap();
    let engine = world.engine("A", vec![def]);
    engine.publisher().start_or_resume(StartRequest::new("ticks", "ticks:1", json!({}))).await.unwrap();
    world.drive(&engine).await.unwrap();
    let inst = world.instances().await.unwrap().pop().unwrap();
    (world, inst)
}

/// The stop the store holds for the step, if any.
fn recorded_stop(step: &Step) -> Option<Value> {
    step.record.as_ref()?.entries.iter().find_map(|e| match e {
        RecordEntry::Value(v) if v.label == LABEL_STOP => Some(v.value.clone()),
        _ => None,
    })
}

/// A recorded stop is replayed, not decided again: the first invocation turns its limit
/// into a crash after the stop was recorded (and the clock jumps); the retry reads every
/// sub-step and the stop back. Returns the instance and the model asks of each invocation.
async fn replayed_stop(oracle: &Arc<Oracle>) -> (WorkflowInstance, Vec<(u64, Result<(), AgentError>)>) {
    let world = World::new(50);
    let agent = Arc::new(ticking_agent(&world, oracle, limits_for(AgentLimit::Deadline)));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (s, o, store, clock) = (seen.clone(), oracle.clone(), world.durable.clone(), world.clock.clone());
    let def = Definition::builder("replay")
        .step(
            StepDef::new("tick", move |ctx: ActivityContext| {
                let (agent, seen, oracle, store, clock) =
                    (agent.clone(), s.clone(), o.clone(), store.clone(), clock.clone());
                async move {
                    oracle.invocations.fetch_add(1, Ordering::SeqCst);
                    let rec = stored_record(&store, &ctx).await;
                    if rec.is_some_and(|r| r.entries.iter().any(|e| e.label().starts_with("agent.p"))) {
                        oracle.resumes.fetch_add(1, Ordering::SeqCst);
                    }
                    let asks = get(&oracle.asks);
                    let r = agent.run(&ctx, json!({"ticks": "many"})).await;
                    let first = seen.lock().unwrap().is_empty();
                    seen.lock().unwrap().push((get(&oracle.asks) - asks, r.clone().map(|_| ())));
                    match r {
                        Err(AgentError::Limit { .. }) if first => {
                            clock.advance(DurationMs::from_secs(60));
                            Err(ActivityError::transient("the worker died after recording the stop"))
                        }
                        r => Ok(StepOutcome::complete(r?.output)),
                    }
                }
            })
            .max_retry(2)
            .retry(RetryPolicy::Immediate)
            .on_failed(OnFailed::DeadLetter)
            .timeout_ms(DurationMs::from_secs(600)),
        )
        .build()
        .unwrap();
    let engine = world.engine("A", vec![def]);
    engine.publisher().start_or_resume(StartRequest::new("replay", "replay:1", json!({}))).await.unwrap();
    world.drive(&engine).await.unwrap();
    let inst = world.instances().await.unwrap().pop().unwrap();
    let seen = seen.lock().unwrap().clone();
    (inst, seen)
}

// --- the counts -----------------------------------------------------------------------------

/// Totals of the agent cases, each from an independent oracle: `runs` are the sweep's
/// crash runs plus the limit workflows; `resumes` the invocations that entered with agent
/// sub-steps already in the store (read by the wrapper activities); `proposal_resamples`
/// and `tool_reexecutions` what the scripted model and the fake tools saw in the store when
/// asked; `limit_stops` the stored instances whose agent step recorded `agent.stop`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AgentCounts {
    pub(crate) runs: u64,
    pub(crate) resumes: u64,
    pub(crate) proposal_resamples: u64,
    pub(crate) tool_reexecutions: u64,
    pub(crate) limit_stops: u64,
}

/// Run the crash sweep of the agent story and every limit case (dead-lettered, plus the
/// replayed stop); the counts from the oracles. Panics when the sweep is not clean.
pub(crate) async fn agent_counts() -> AgentCounts {
    let (report, sweep_oracle) = agent_sweep().await;
    report.assert_clean();
    let oracle = Arc::new(Oracle::default());
    let mut runs = report.runs;
    let mut limit_stops = 0;
    for limit in LIMITS {
        let (_, inst) = limit_case(limit, OnFailed::DeadLetter, &oracle).await;
        runs += 1;
        limit_stops += u64::from(recorded_stop(&inst.steps[0]).is_some());
    }
    let (inst, _) = replayed_stop(&oracle).await;
    runs += 1;
    limit_stops += u64::from(recorded_stop(&inst.steps[0]).is_some());
    AgentCounts {
        runs,
        resumes: get(&sweep_oracle.resumes) + get(&oracle.resumes),
        proposal_resamples: get(&sweep_oracle.proposal_resamples) + get(&oracle.proposal_resamples),
        tool_reexecutions: get(&sweep_oracle.tool_reexecutions) + get(&oracle.tool_reexecutions),
        limit_stops,
    }
}

// --- tests ----------------------------------------------------------------------------------

/// At every persistence boundary — a crash before or after any write, a zombie coming back
/// late, a new worker taking over — a recorded proposal is never sampled again, a recorded
/// tool call never runs again (two proposed together run one by one), the agent resumes
/// from its record, and the workflow completes with the answer built from the tools'
/// recorded results, under one idempotency key.
#[tokio::test]
async fn agent_resumes_from_its_last_recorded_sub_step_at_every_crash_point() {
    let (report, oracle) = agent_sweep().await;
    report.assert_clean();
    assert!(report.runs >= 20, "{report:?}");
    assert_eq!(get(&oracle.proposal_resamples), 0, "re-samples of recorded proposals");
    assert_eq!(get(&oracle.tool_reexecutions), 0, "re-executions of recorded tool calls");
    assert!(get(&oracle.resumes) > 0, "no invocation resumed from recorded sub-steps");
    assert!(get(&oracle.resumes) < get(&oracle.invocations));
    // Every run drew at least its four samples and ran its three tools.
    assert!(get(&oracle.asks) >= 4 * report.runs && get(&oracle.tool_runs) >= 3 * report.runs, "{oracle:?}");
}

/// Each limit stops the loop with the typed error, recorded as `agent.stop` after exactly
/// the sub-steps the limit allows; with `OnFailed::DeadLetter` the step is dead-lettered
/// with a permanent error naming the limit.
#[tokio::test]
async fn each_limit_stops_the_agent_and_dead_letters_the_step() {
    for limit in LIMITS {
        let oracle = Arc::new(Oracle::default());
        let (world, inst) = limit_case(limit, OnFailed::DeadLetter, &oracle).await;
        let (used, max, before) = expected_stop(limit);
        assert_eq!(inst.status, WorkflowStatus::Waiting, "{limit}: waiting for the operator");
        let rec = inst.steps[0].record.as_ref().unwrap();
        let labels = labels(rec);
        assert_eq!(labels.len(), before + 2, "{limit}: {labels:?}");
        assert_eq!(labels.last().map(String::as_str), Some(LABEL_STOP), "{limit}");
        assert_eq!(
            recorded_stop(&inst.steps[0]),
            Some(json!({"limit": limit.as_str(), "used": used, "max": max})),
            "{limit}"
        );
        let dls = world.dead_letters.list(None, None, 10).await.unwrap();
        assert_eq!(dls.len(), 1, "{limit}");
        assert_eq!(dls[0].error.class, ErrorClass::Permanent, "{limit}");
        let message = AgentError::Limit { limit, used, max }.to_string();
        assert!(dls[0].error.message.contains(&message), "{limit}: {} / {message}", dls[0].error.message);
        let proposals = rec.model_calls().count() as u64;
        assert_eq!(get(&oracle.asks), proposals, "{limit}: one sample per recorded proposal");
        assert_eq!(get(&oracle.tool_runs), before as u64 - proposals, "{limit}: each tool call ran once");
        assert_eq!((get(&oracle.proposal_resamples), get(&oracle.tool_reexecutions)), (0, 0));
    }
}

/// The other `on_failed` policies handle a limit like any permanent error: the default
/// fails the workflow, `skip` skips the step and goes on.
#[tokio::test]
async fn a_limit_fails_or_skips_the_step_as_declared() {
    let oracle = Arc::new(Oracle::default());
    let (_, failed) = limit_case(AgentLimit::SubSteps, OnFailed::Stop, &oracle).await;
    assert_eq!(failed.status, WorkflowStatus::Failed);
    assert!(failed.steps[0].error.as_ref().unwrap().message.contains("agent limit sub_steps reached"));
    let (_, skipped) = limit_case(AgentLimit::SubSteps, OnFailed::Skip, &oracle).await;
    assert_eq!(skipped.status, WorkflowStatus::Completed);
    assert_eq!(skipped.steps[0].status, StepStatus::Skipped);
    assert_eq!(skipped.output.get("after"), Some(&json!("after")));
    assert!(recorded_stop(&skipped.steps[0]).is_some());
}

/// A stop recorded before a crash is read back by the next invocation, with every
/// sub-step before it: the model is not asked again, no tool runs again, and the stop is
/// the recorded one even though the clock has moved on.
#[tokio::test]
async fn a_recorded_stop_is_replayed_without_asking_the_model() {
    let oracle = Arc::new(Oracle::default());
    let (inst, seen) = replayed_stop(&oracle).await;
    let stop = Err(AgentError::Limit { limit: AgentLimit::Deadline, used: 6_000, max: 5_000 });
    assert_eq!(seen, vec![(3, stop.clone()), (0, stop)], "asks and outcome of each invocation");
    assert_eq!(get(&oracle.tool_runs), 3, "three ticks, each once");
    assert_eq!(get(&oracle.resumes), 1);
    assert_eq!(inst.status, WorkflowStatus::Waiting, "dead-lettered");
    let stops = inst.steps[0].record.as_ref().unwrap().entries.iter().filter(|e| e.label() == LABEL_STOP).count();
    assert_eq!(stops, 1, "recorded once");
}

/// The pay agent: it proposes a payment and a refund together (the agent has no `refund`
/// tool, and `pay` is declined), then finishes with the errors it saw.
fn pay_agent(world: &World, oracle: &Arc<Oracle>, limits: AgentLimits) -> Agent {
    let script: Script = Arc::new(|req, _| {
        let transcript = req.input["transcript"].as_array().cloned().unwrap_or_default();
        if transcript.is_empty() {
            json!({"tool_calls": [{"tool": "pay", "args": {"amount": 5}}, {"tool": "refund", "args": {}}]})
        } else {
            let errors: Vec<Value> = transcript.iter().filter_map(|t| t["tool_result"].get("error").cloned()).collect();
            json!({ "done": { "errors": errors } })
        }
    });
    let model = ScriptedModel { script, usage: usage(), store: world.durable.clone(), oracle: oracle.clone() };
    let refuse: Behaviour = Arc::new(|_, _| Err(ActivityError::permanent("card declined")));
    Agent::builder(Arc::new(model), VersionRef::new("pay-prompt", "1"))
        .tool(FakeTool::new("pay", world, oracle, refuse))
        .limits(limits)
        .task(|_| json!({"order": 7}))
        .build()
        .unwrap()
}

async fn run_pay(world: &World, agent: Agent) -> WorkflowInstance {
    let def = Definition::builder("pay").step(StepDef::agent("pay", agent)).build().unwrap();
    let engine = world.engine("A", vec![def]);
    engine.publisher().start_or_resume(StartRequest::new("pay", "pay:1", json!({}))).await.unwrap();
    world.drive(&engine).await.unwrap();
    world.instances().await.unwrap().pop().unwrap()
}

/// A tool's permanent error and a call to a tool the agent does not have are recorded as
/// error results and shown to the model, which goes on; nothing crashes.
#[tokio::test]
async fn tool_errors_are_recorded_and_fed_back() {
    let world = World::new(60);
    let oracle = Arc::new(Oracle::default());
    let agent = pay_agent(&world, &oracle, limits_for(AgentLimit::SubSteps));
    assert_eq!(agent.limits().max_sub_steps, 3);
    let inst = run_pay(&world, agent).await;
    // Three sub-steps were allowed: the proposal and both calls; the next proposal is refused.
    assert_eq!(inst.status, WorkflowStatus::Failed);
    assert_eq!(
        labels(inst.steps[0].record.as_ref().unwrap()),
        ["agent.start", "agent.p0", "agent.t1", "agent.t2", "agent.stop"]
    );
    let values: Vec<Value> = inst.steps[0]
        .record
        .as_ref()
        .unwrap()
        .entries
        .iter()
        .filter_map(|e| match e {
            RecordEntry::Value(v) => Some(v.value.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(values[0]["task"], json!({"order": 7}), "the task is recorded with the start");
    assert_eq!(values[1], json!({"tool": "pay", "error": "card declined"}));
    assert_eq!(values[2], json!({"tool": "refund", "error": "unknown tool `refund`"}));
    assert_eq!(get(&oracle.tool_runs), 1, "the unknown tool ran nothing");

    // With one more sub-step the model sees both errors and finishes.
    let world = World::new(61);
    let oracle = Arc::new(Oracle::default());
    let mut limits = limits_for(AgentLimit::SubSteps);
    limits.max_sub_steps = 4;
    let inst = run_pay(&world, pay_agent(&world, &oracle, limits)).await;
    assert_eq!(inst.status, WorkflowStatus::Completed);
    assert_eq!(inst.output["pay"], json!({"errors": ["card declined", "unknown tool `refund`"]}));
}

/// An agent step without a sub-step bound, a deadline or a budget is refused when the
/// definition is built, naming the field.
#[tokio::test]
async fn an_agent_without_limits_is_refused_at_build() {
    let world = World::new(70);
    let oracle = Arc::new(Oracle::default());
    let ok = limits_for(AgentLimit::Tokens);
    let cases = [
        (AgentLimits::default(), "steps[1].agent.max_sub_steps"),
        (AgentLimits { max_sub_steps: 0, ..ok }, "steps[1].agent.max_sub_steps"),
        (AgentLimits { max_sub_steps: AGENT_SUB_STEPS_MAX + 1, ..ok }, "steps[1].agent.max_sub_steps"),
        (AgentLimits { deadline_ms: None, ..ok }, "steps[1].agent.deadline_ms"),
        (AgentLimits { deadline_ms: Some(DurationMs::ZERO), ..ok }, "steps[1].agent.deadline_ms"),
        (AgentLimits { max_tokens: None, max_cost_micros: None, ..ok }, "steps[1].agent.budget"),
        (AgentLimits { max_tokens: Some(0), ..ok }, "steps[1].agent.budget"),
    ];
    for (limits, expected) in cases {
        let def = Definition::builder("bad")
            .step(StepDef::new("first", |_| async { Ok(StepOutcome::complete(json!(1))) }))
            .step(StepDef::agent("plan", ticking_agent(&world, &oracle, limits)))
            .build();
        match def {
            Err(Error::InvalidInput { field, .. }) => assert_eq!(field, expected, "{limits:?}"),
            other => panic!("{limits:?} was not refused: {:?}", other.map(|_| ())),
        }
    }
    // The same limits refused when the agent runs inside a custom activity.
    let agent = Arc::new(ticking_agent(&world, &oracle, AgentLimits::default()));
    let def = Definition::builder("custom")
        .step(StepDef::new("plan", move |ctx: ActivityContext| {
            let agent = agent.clone();
            async move {
                let r = agent.run(&ctx, json!({})).await;
                assert!(matches!(&r, Err(AgentError::InvalidLimits(Error::InvalidInput { .. }))), "{r:?}");
                Ok(StepOutcome::complete(json!(r?.output)))
            }
        }))
        .build()
        .unwrap();
    let engine = world.engine("A", vec![def]);
    engine.publisher().start_or_resume(StartRequest::new("custom", "custom:1", json!({}))).await.unwrap();
    world.drive(&engine).await.unwrap();
    let inst = world.instances().await.unwrap().pop().unwrap();
    assert_eq!(inst.status, WorkflowStatus::Failed);
    assert_eq!(get(&oracle.asks), 0, "the model is never asked");
}

/// The counts other reports print: every one from an oracle, each as the cases promise.
#[tokio::test]
async fn agent_counts_come_from_the_oracles() {
    let c = agent_counts().await;
    assert!(c.runs > 20, "{c:?}");
    assert!(c.resumes > 0, "{c:?}");
    assert_eq!((c.proposal_resamples, c.tool_reexecutions), (0, 0), "{c:?}");
    assert_eq!(c.limit_stops, LIMITS.len() as u64 + 1, "{c:?}");
}

fn one_agent_step(
    world: &World,
    oracle: &Arc<Oracle>,
    script: Script,
    tool: Behaviour,
    schema: Option<kernel_core::model_call::OutputSchema>,
) -> Definition {
    let model = ScriptedModel { script, usage: usage(), store: world.durable.clone(), oracle: oracle.clone() };
    let mut limits = limits_for(AgentLimit::SubSteps);
    limits.max_sub_steps = 40;
    let agent = Agent::builder(Arc::new(model), VersionRef::new("p", "1"))
        .tool(FakeTool::new("fetch", world, oracle, tool))
        .limits(limits)
        .build()
        .unwrap();
    let mut step = StepDef::agent("work", agent);
    if let Some(s) = schema {
        step = step.output_schema(s);
    }
    Definition::builder("one").step(step).build().unwrap()
}

async fn run_one(world: &World, def: Definition) -> WorkflowInstance {
    let engine = world.engine("A", vec![def]);
    engine.publisher().start_or_resume(StartRequest::new("one", "one:1", json!({}))).await.unwrap();
    world.drive(&engine).await.unwrap();
    world.instances().await.unwrap().pop().unwrap()
}

/// The step's own output schema holds the agent's answer (K-17.4), as it holds an
/// operator's: an answer that fails it is a permanent error of the step — before, any
/// `done` value completed the step.
#[tokio::test]
async fn the_agents_answer_is_held_to_the_steps_schema() {
    let world = World::new(80);
    let oracle = Arc::new(Oracle::default());
    let script: Script = Arc::new(|_, _| json!({"done": {"total": "not a number"}}));
    let schema = kernel_core::model_call::OutputSchema::new(
        VersionRef::new("answer", "1"),
        json!({"type": "object", "required": ["total"], "properties": {"total": {"type": "number"}}}),
    )
    .unwrap();
    let inst =
        run_one(&world, one_agent_step(&world, &oracle, script, Arc::new(|_, _| Ok(json!(1))), Some(schema))).await;
    assert_eq!(inst.status, WorkflowStatus::Failed);
    let error = inst.steps[0].error.as_ref().unwrap();
    assert_eq!(error.class, ErrorClass::Permanent);
    assert!(error.message.contains("fails the step's schema answer@1"), "{}", error.message);
}

/// The record is bounded by bytes whatever the declared limits allow: a tool result too
/// large for what is left is recorded as an error (the model sees it), and an agent whose
/// record reaches three quarters of the payload limit stops with the recorded limit
/// `record_bytes` — before, the record write failed after the tool's side effect, with no
/// recorded stop.
#[tokio::test]
async fn the_record_is_bounded_by_bytes() {
    let world = World::new(81);
    let oracle = Arc::new(Oracle::default());
    // Always one more fetch; a 40 KiB result first, then 12 KiB ones.
    let script: Script = Arc::new(|_, _| json!({"tool_calls": [{"tool": "fetch", "args": {}}]}));
    let big: Behaviour = Arc::new(|_, _| Ok(json!("x".repeat(40 * 1024))));
    let inst = run_one(&world, one_agent_step(&world, &oracle, script.clone(), big, None)).await;
    let rec = inst.steps[0].record.as_ref().unwrap();
    let first = rec.entries.iter().find_map(|e| match e {
        RecordEntry::Value(v) if v.label == "agent.t1" => Some(v.value.clone()),
        _ => None,
    });
    assert!(first.unwrap()["error"].as_str().unwrap().contains("too large to record"));

    let world = World::new(82);
    let oracle = Arc::new(Oracle::default());
    let mid: Behaviour = Arc::new(|_, _| Ok(json!("y".repeat(12 * 1024))));
    let inst = run_one(&world, one_agent_step(&world, &oracle, script, mid, None)).await;
    assert_eq!(inst.status, WorkflowStatus::Failed);
    let rec = inst.steps[0].record.as_ref().unwrap();
    let stop = rec.entries.iter().find_map(|e| match e {
        RecordEntry::Value(v) if v.label == LABEL_STOP => Some(v.value.clone()),
        _ => None,
    });
    assert_eq!(stop.as_ref().map(|s| s["limit"].clone()), Some(json!("record_bytes")), "{stop:?}");
    let bytes = serde_json::to_vec(rec).unwrap().len();
    assert!(bytes < 64 * 1024, "the record stayed within the payload limit: {bytes}");
    assert!(get(&oracle.tool_runs) >= 3 && get(&oracle.tool_runs) < 8, "{}", get(&oracle.tool_runs));
}

/// The write cost of an agent (K-7.1's budget, for sub-steps): one durable write per
/// recorded sub-step (each proposal and each tool call, written before the loop goes on),
/// one for the recorded start, plus the step's own mark-running and completion. Counted by
/// the store's audit, not by the engine.
#[tokio::test]
async fn an_agent_sub_step_costs_one_write() {
    for rounds in [1u64, 3, 6] {
        let world = World::new(83);
        let oracle = Arc::new(Oracle::default());
        // `rounds` proposals of one fetch each, then done.
        let script: Script = Arc::new(move |req, _| {
            let seen = req.input["transcript"].as_array().map_or(0, Vec::len) as u64;
            if seen < 2 * rounds {
                json!({"tool_calls": [{"tool": "fetch", "args": {}}]})
            } else {
                json!({"done": {"rounds": rounds}})
            }
        });
        let def = one_agent_step(&world, &oracle, script, Arc::new(|_, _| Ok(json!("page"))), None);
        let engine = world.engine("A", vec![def]);
        engine.publisher().start_or_resume(StartRequest::new("one", "one:1", json!({}))).await.unwrap();
        world.audit.reset_traffic();
        world.drive(&engine).await.unwrap();
        let inst = world.instances().await.unwrap().pop().unwrap();
        assert_eq!(inst.status, WorkflowStatus::Completed);
        let sub_steps = 2 * rounds + 1; // proposals with a call each, then the done proposal
        let writes = world.audit.counts().writes;
        println!("agent-writes: sub_steps={sub_steps} writes={writes}");
        // claim + mark running + start + one per sub-step + completion fused with completed.
        assert_eq!(writes, 1 + 1 + 1 + sub_steps + 1, "{sub_steps} sub-steps");
    }
}
