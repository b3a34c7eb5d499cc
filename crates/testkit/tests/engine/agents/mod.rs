//! Bounded agents (K-17 amendment, sub-steps `K ∥ subStep`): a crash anywhere resumes from
//! the last recorded sub-step without re-sampling a recorded proposal or re-running a
//! recorded tool call; the limits stop the loop with a typed, recorded outcome that the
//! step's `on_failed` policy handles; an agent without limits is refused.
//!
//! The oracles are the fakes themselves: on every ask the scripted model reads the store
//! and counts a *re-sample* when the proposal it is asked for is already recorded there
//! (its output, or a sample at or above the index asked); on every execution a tool reads
//! the store and counts a *re-execution* when its sub-step's label is already recorded.

mod crashes_and_limits;
mod tools_and_records;

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
