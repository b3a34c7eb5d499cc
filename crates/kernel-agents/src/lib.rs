//! Bounded agents (K-17 amendment): an agent loop inside one step whose proposals and
//! tool calls are recorded sub-steps, each with its own idempotency key
//! `K ∥ subStep` ([`sub_step_key`]), under limits declared with the step.
//!
//! The model proposes the next action — tool calls or "done" — as JSON validated against
//! the built-in [`proposal_schema`] (an invalid proposal is re-sampled within the call's
//! bound, every sample recorded); each proposal and each tool call is an entry of the
//! step's record, written before the loop goes on. A later invocation of the same logical
//! attempt (a retry, a crash, another worker) reads the recorded sub-steps back — no
//! recorded proposal is sampled again, no recorded tool call runs again — and goes on from
//! the first sub-step not recorded. Tool calls proposed together run one at a time, in
//! proposal order, each recorded before the next starts.
//!
//! The record of an agent, in order: `agent.start` (the recorded start time and task),
//! then per sub-step `n` either `agent.p<n>` (a proposal, a model call) or `agent.t<n>`
//! (a tool result `{"tool", "result"}` or `{"tool", "error"}`), and `agent.stop` when a
//! limit ended the loop. The input of each proposal is `{"task", "transcript"}`, the
//! transcript being the earlier sub-steps as recorded (`{"sub_step", "proposal"}`,
//! `{"sub_step", "tool_result"}`), so a replayed proposal asks exactly what it asked.
//!
//! [`AgentLimits`] are checked before each **new** sub-step (a recorded one is read back
//! unconditionally, and a recorded proposal without a valid sample yet goes on sampling
//! within its re-sample bound): the sub-steps used, the tokens and cost summed from the recorded
//! proposals' samples, and the time since the recorded start on the live clock. A limit
//! reached is recorded (`agent.stop`, so a re-invocation replays the same stop instead of
//! deciding again) and returned as [`AgentError::Limit`], a permanent error of the step
//! that its `on_failed` policy handles. A proposal's usage is known only once it is
//! recorded, so the proposal that crosses the budget is kept and nothing new starts after
//! it. One step runs one agent.
//!
//! ```
//! use kernel_agents::{Agent, AgentLimits, AgentStepDef, Tool, ToolCall};
//! use kernel_core::model_call::{Model, ModelAnswer, ModelRequest};
//! use kernel_core::record::{Usage, VersionRef};
//! use kernel_core::{ActivityContext, ActivityError, Definition, DurationMs, StepDef};
//! use serde_json::{json, Value};
//! use std::sync::Arc;
//!
//! struct Planner;
//! #[async_trait::async_trait]
//! impl Model for Planner {
//!     fn version(&self) -> VersionRef {
//!         VersionRef::new("planner", "1")
//!     }
//!     async fn generate(&self, req: &ModelRequest, _ctx: &ActivityContext) -> Result<ModelAnswer, ActivityError> {
//!         // The transcript holds every earlier sub-step as recorded.
//!         let raw = match req.input["transcript"].as_array().map_or(0, Vec::len) {
//!             0 => json!({"tool_calls": [{"tool": "weather", "args": {"city": "Oslo"}}]}),
//!             _ => json!({"done": {"forecast": req.input["transcript"][1]["tool_result"]["result"]}}),
//!         };
//!         Ok(ModelAnswer { raw: raw.to_string(), usage: Usage { input_tokens: 50, output_tokens: 10, cost_micros: 30 } })
//!     }
//! }
//!
//! struct Weather;
//! #[async_trait::async_trait]
//! impl Tool for Weather {
//!     fn name(&self) -> &str {
//!         "weather"
//!     }
//!     async fn call(&self, call: &ToolCall, key: &str, _ctx: &ActivityContext) -> Result<Value, ActivityError> {
//!         // `key` is the sub-step's idempotency key: pass it to the external system.
//!         Ok(json!({"city": call.args["city"], "sky": "clear", "request": key}))
//!     }
//! }
//!
//! let agent = Agent::builder(Arc::new(Planner), VersionRef::new("plan-prompt", "2"))
//!     .tool(Weather)
//!     .limits(AgentLimits {
//!         max_sub_steps: 12,
//!         max_tokens: Some(4_000),
//!         max_cost_micros: None,
//!         deadline_ms: Some(DurationMs::from_secs(120)),
//!     })
//!     .task(|ctx| json!({"question": ctx.input()["question"]}))
//!     .build()
//!     .unwrap();
//! let def = Definition::builder("forecast").step(StepDef::agent("plan", agent)).build();
//! assert!(def.is_ok());
//!
//! // An agent step without limits is refused when the definition is built.
//! let unbounded = Agent::builder(Arc::new(Planner), VersionRef::new("plan-prompt", "2")).build().unwrap();
//! let refused = Definition::builder("forecast").step(StepDef::agent("plan", unbounded)).build();
//! assert!(matches!(refused, Err(kernel_core::Error::InvalidInput { field, .. }) if field == "steps[0].agent.max_sub_steps"));
//! ```

use kernel_core::activity::{Activity, ActivityContext, ActivityError, StepOutcome};
use kernel_core::definition::StepDef;
use kernel_core::domain::{DurationMs, ErrorClass, Instant};
use kernel_core::error::{Error, Result};
use kernel_core::model_call::{Model, ModelRequest, OutputSchema};
use kernel_core::record::{RecordEntry, Usage, VersionRef};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};

pub use kernel_core::agent_limits::{AgentLimits, AGENT_SUB_STEPS_MAX};

/// Tools one agent may have.
pub const AGENT_TOOLS_MAX: usize = 64;
/// Tool calls one proposal may hold (they run one at a time, each a sub-step).
pub const AGENT_TOOL_CALLS_MAX: usize = 16;
/// Id of the built-in [`proposal_schema`]; its version is [`PROPOSAL_SCHEMA_VERSION`].
pub const PROPOSAL_SCHEMA_ID: &str = "agent-proposal";
/// Version of the built-in [`proposal_schema`].
pub const PROPOSAL_SCHEMA_VERSION: &str = "1";
/// Label of the recorded start (time and task) of an agent.
pub const LABEL_START: &str = "agent.start";
/// Label of the recorded stop of an agent that reached a limit.
pub const LABEL_STOP: &str = "agent.stop";

// The start, every sub-step and the stop fit in one record.

/// Label of a proposal recorded as sub-step `n`.
pub fn proposal_label(n: u32) -> String {
    format!("agent.p{n}")
}

/// Label of a tool call recorded as sub-step `n`.
pub fn tool_label(n: u32) -> String {
    format!("agent.t{n}")
}

/// K-17.1 amendment: the idempotency key of sub-step `sub_step` of the agent of the step
/// whose key is `step_key` — `K ∥ subStep`, encoded `{K}|s{n}`. A step's key
/// ([`idempotency_key_at`](kernel_core::activity::idempotency_key_at)) ends in its bare run
/// number or in `|e<epoch>`, never in `|s<n>`, so no sub-step key is a step key, and `K`
/// and `n` are read back unambiguously from the last `|s`.
///
/// ```
/// use kernel_core::activity::idempotency_key_at;
/// use kernel_agents::sub_step_key;
/// let k = idempotency_key_at("wf-42", "plan", 0, 0);
/// assert_eq!(sub_step_key(&k, 3), "5:wf-42|4:plan|0|s3");
/// assert_eq!(sub_step_key(&idempotency_key_at("wf-42", "plan", 1, 2), 0), "5:wf-42|4:plan|1|e2|s0");
/// // Every step key and every sub-step key are distinct, even with names that look alike.
/// let mut seen = std::collections::BTreeSet::new();
/// for (wf, step) in [("wf", "plan"), ("wf|s0", "plan"), ("wf", "plan|s0"), ("wf", "plan|e1")] {
///     for run in 0..3 {
///         for epoch in 0..3 {
///             let k = idempotency_key_at(wf, step, run, epoch);
///             assert!(seen.insert(k.clone()), "{k}");
///             for n in 0..3 {
///                 assert!(seen.insert(sub_step_key(&k, n)), "{k} {n}");
///             }
///         }
///     }
/// }
/// ```
pub fn sub_step_key(step_key: &str, sub_step: u32) -> String {
    format!("{step_key}|s{sub_step}")
}

/// The built-in schema of an agent's proposals, `agent-proposal@1`:
/// `{"tool_calls": [{"tool": "<name>", "args": {…}}, …]}` (1..=[`AGENT_TOOL_CALLS_MAX`]
/// calls) or `{"done": <value>}`, nothing else.
pub fn proposal_schema() -> Result<OutputSchema> {
    static SCHEMA: OnceLock<Result<OutputSchema>> = OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            OutputSchema::new(
                VersionRef::new(PROPOSAL_SCHEMA_ID, PROPOSAL_SCHEMA_VERSION),
                json!({
                    "oneOf": [
                        {
                            "type": "object",
                            "required": ["tool_calls"],
                            "additionalProperties": false,
                            "properties": {"tool_calls": {
                                "type": "array",
                                "minItems": 1,
                                "maxItems": AGENT_TOOL_CALLS_MAX,
                                "items": {
                                    "type": "object",
                                    "required": ["tool", "args"],
                                    "additionalProperties": false,
                                    "properties": {
                                        "tool": {"type": "string", "minLength": 1, "maxLength": kernel_core::validate::IDENTIFIER_BYTES_MAX},
                                        "args": {"type": "object"}
                                    }
                                }
                            }}
                        },
                        {"type": "object", "required": ["done"], "additionalProperties": false, "properties": {"done": {}}}
                    ]
                }),
            )
        })
        .clone()
}

/// One tool call of a proposal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The tool's name.
    pub tool: String,
    /// Its arguments (a JSON object).
    pub args: Value,
}

/// What the model proposed.
#[derive(Debug, Clone, PartialEq)]
pub enum Proposal {
    /// Run these tools, in order, then propose again.
    ToolCalls(Vec<ToolCall>),
    /// Finished, with this output.
    Done(Value),
}

impl Proposal {
    /// Read a proposal valid under [`proposal_schema`]; anything else is
    /// [`Error::InvalidInput`].
    pub fn from_value(v: &Value) -> Result<Proposal> {
        if let Some(done) = v.get("done") {
            return Ok(Proposal::Done(done.clone()));
        }
        let calls = v.get("tool_calls").cloned().unwrap_or(Value::Null);
        let calls: Vec<ToolCall> =
            serde_json::from_value(calls).map_err(|e| Error::invalid("proposal.tool_calls", e))?;
        if calls.is_empty() || calls.len() > AGENT_TOOL_CALLS_MAX {
            return Err(Error::invalid(
                "proposal.tool_calls",
                format_args!("{} calls, not within 1..={AGENT_TOOL_CALLS_MAX}", calls.len()),
            ));
        }
        Ok(Proposal::ToolCalls(calls))
    }
}

/// A tool an agent may call, implemented by the user.
#[async_trait::async_trait]
pub trait Tool: Send + Sync + 'static {
    /// The name proposals call it by (a K-2.0 identifier, unique within the agent).
    fn name(&self) -> &str;

    /// Run one call. `key` is the sub-step's idempotency key ([`sub_step_key`]): stable
    /// across retries and crashes of the logical attempt, so pass it to any external
    /// system with side effects (the call runs again when it ended before its result was
    /// recorded). A permanent error is recorded as the call's result `{"error": message}`
    /// and shown to the model; a transient or unknown-outcome error ends the invocation
    /// (the step retries; the recorded sub-steps stay). A tool makes no recorded call of
    /// its own (`ctx.model`, `ctx.record`): the tool call is the recorded sub-step. A result
    /// too large for what is left of the step's record is recorded as an error.
    async fn call(
        &self,
        call: &ToolCall,
        key: &str,
        ctx: &ActivityContext,
    ) -> std::result::Result<Value, ActivityError>;
}

/// Which limit ended an agent's loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AgentLimit {
    /// [`AgentLimits::max_sub_steps`].
    SubSteps,
    /// [`AgentLimits::max_tokens`].
    Tokens,
    /// [`AgentLimits::max_cost_micros`].
    CostMicros,
    /// [`AgentLimits::deadline_ms`] (used and max in milliseconds).
    Deadline,
    /// The step's record reached three quarters of the store payload limit (used and max
    /// in bytes): the rest is kept for the stop and the step's own writes. Not declared:
    /// the record is bounded by bytes whatever the other limits allow.
    RecordBytes,
}

impl AgentLimit {
    /// `sub_steps`, `tokens`, `cost_micros`, `deadline_ms` or `record_bytes`, as recorded.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentLimit::SubSteps => "sub_steps",
            AgentLimit::Tokens => "tokens",
            AgentLimit::CostMicros => "cost_micros",
            AgentLimit::Deadline => "deadline_ms",
            AgentLimit::RecordBytes => "record_bytes",
        }
    }

    fn parse(s: &str) -> Option<AgentLimit> {
        [
            AgentLimit::SubSteps,
            AgentLimit::Tokens,
            AgentLimit::CostMicros,
            AgentLimit::Deadline,
            AgentLimit::RecordBytes,
        ]
        .into_iter()
        .find(|l| l.as_str() == s)
    }
}

impl std::fmt::Display for AgentLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an agent did not finish.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentError {
    /// A limit was reached before a new sub-step (recorded as `agent.stop`; replayed as
    /// recorded).
    #[error("agent limit {limit} reached: {used} used, at most {max}")]
    Limit {
        /// Which limit.
        limit: AgentLimit,
        /// What was used when the loop stopped.
        used: u64,
        /// The declared maximum.
        max: u64,
    },
    /// The model, a tool, the journal or the context failed (a transient error: retry the
    /// step; the recorded sub-steps stay).
    #[error(transparent)]
    Activity(ActivityError),
    /// The limits do not bound the loop ([`AgentLimits::validate`]).
    #[error("invalid agent limits: {0}")]
    InvalidLimits(Error),
}

impl From<ActivityError> for AgentError {
    fn from(e: ActivityError) -> Self {
        AgentError::Activity(e)
    }
}

impl From<AgentError> for ActivityError {
    /// A limit and invalid limits are permanent (the step's `on_failed` policy decides);
    /// an activity error keeps its class.
    fn from(e: AgentError) -> Self {
        match e {
            AgentError::Activity(e) => e,
            other => ActivityError::permanent(other.to_string()),
        }
    }
}

/// What a finished agent produced.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentRun {
    /// The `done` value of the last proposal.
    pub output: Value,
    /// Sub-steps used (proposals and tool calls).
    pub sub_steps: u32,
    /// Tokens and cost of every recorded proposal sample.
    pub usage: Usage,
    /// Of the sub-steps, those read back from the record by this invocation.
    pub replayed: u32,
}

type TaskFn = Arc<dyn Fn(&ActivityContext) -> Value + Send + Sync>;

/// A bounded agent: a model, its prompt, its tools and its limits. As an [`Activity`]
/// (see [`StepDef::agent`]) it completes the step with the `done` value; inside a custom
/// activity, call [`Agent::run`].
pub struct Agent {
    model: Arc<dyn Model>,
    prompt: VersionRef,
    tools: Vec<Arc<dyn Tool>>,
    limits: AgentLimits,
    task: Option<TaskFn>,
    params: Value,
    resamples: Option<u32>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("prompt", &self.prompt)
            .field("tools", &self.tools.iter().map(|t| t.name().to_string()).collect::<Vec<_>>())
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// Builds an [`Agent`].
pub struct AgentBuilder {
    agent: Agent,
}

impl Agent {
    /// An agent asking `model` with prompt `prompt`; no tools, no limits yet (an agent
    /// without [`limits`](AgentBuilder::limits) is refused when it runs and when its
    /// definition is built).
    pub fn builder(model: Arc<dyn Model>, prompt: VersionRef) -> AgentBuilder {
        AgentBuilder {
            agent: Agent {
                model,
                prompt,
                tools: Vec::new(),
                limits: AgentLimits::default(),
                task: None,
                params: Value::Null,
                resamples: None,
            },
        }
    }

    /// The declared limits.
    pub fn limits(&self) -> AgentLimits {
        self.limits
    }
}

impl AgentBuilder {
    /// Add a tool (names are unique within the agent).
    pub fn tool(mut self, tool: impl Tool) -> Self {
        self.agent.tools.push(Arc::new(tool));
        self
    }
    /// The limits of the whole loop.
    pub fn limits(mut self, limits: AgentLimits) -> Self {
        self.agent.limits = limits;
        self
    }
    /// The task the agent works on, from the invocation's context (default: the instance
    /// input). It is recorded with the agent's start: a later invocation works on the
    /// recorded task.
    pub fn task(mut self, f: impl Fn(&ActivityContext) -> Value + Send + Sync + 'static) -> Self {
        self.agent.task = Some(Arc::new(f));
        self
    }
    /// Sampling parameters of every proposal.
    pub fn params(mut self, params: Value) -> Self {
        self.agent.params = params;
        self
    }
    /// Re-samples of an invalid proposal (default: the step's, itself default 2).
    pub fn resamples(mut self, n: u32) -> Self {
        self.agent.resamples = Some(n);
        self
    }
    /// The agent. Refused as [`Error::InvalidInput`]: a prompt id or version or a tool
    /// name that is not a K-2.0 identifier, two tools of one name, more than
    /// [`AGENT_TOOLS_MAX`] tools. The limits are checked where they bound the loop: by
    /// [`DefinitionBuilder::build`](kernel_core::definition::DefinitionBuilder::build) for a
    /// [`StepDef::agent`] and by [`Agent::run`].
    pub fn build(self) -> Result<Agent> {
        let a = self.agent;
        kernel_core::validate::identifier("agent.prompt.id", &a.prompt.id)?;
        kernel_core::validate::identifier("agent.prompt.version", &a.prompt.version)?;
        if a.tools.len() > AGENT_TOOLS_MAX {
            return Err(Error::invalid(
                "agent.tools",
                format_args!("{} tools, at most {AGENT_TOOLS_MAX}", a.tools.len()),
            ));
        }
        for (i, t) in a.tools.iter().enumerate() {
            kernel_core::validate::identifier(&format!("agent.tools[{i}].name"), t.name())?;
            if a.tools[..i].iter().any(|u| u.name() == t.name()) {
                return Err(Error::invalid(
                    format!("agent.tools[{i}].name"),
                    format_args!("a second tool named `{}`", t.name()),
                ));
            }
        }
        Ok(a)
    }
}

fn permanent(m: impl Into<String>) -> AgentError {
    AgentError::Activity(ActivityError::permanent(m))
}

fn tokens(u: Usage) -> u64 {
    u.input_tokens.saturating_add(u.output_tokens)
}

impl Agent {
    /// Run the loop on `task` within the step `ctx` runs (see the [module](self) docs):
    /// recorded sub-steps are read back, new ones recorded before the loop goes on, limits
    /// checked before each new sub-step.
    ///
    /// Errors: [`AgentError::Limit`] (recorded), [`AgentError::InvalidLimits`],
    /// [`AgentError::Activity`] — the model's or a tool's transient errors, no valid
    /// proposal within the re-sample bound, a record that would exceed its limits, a
    /// record of another shape (a changed activity), a finalizer's context.
    pub async fn run(&self, ctx: &ActivityContext, task: Value) -> std::result::Result<AgentRun, AgentError> {
        self.limits.validate("agent").map_err(AgentError::InvalidLimits)?;
        let Some(journal) = ctx.record_cursor() else {
            return Err(permanent("an agent runs in a step; a finalizer cannot run one"));
        };
        let schema = proposal_schema().map_err(|e| permanent(e.to_string()))?;
        let live = journal.now();
        let start =
            ctx.record(LABEL_START, || async move { Ok(json!({"at": live.as_millis(), "task": task})) }).await?;
        let started = start
            .get("at")
            .and_then(Value::as_i64)
            .map(Instant::from_millis)
            .ok_or_else(|| permanent(format!("the recorded {LABEL_START} has no start time: {start}")))?;
        let task = start.get("task").cloned().unwrap_or(Value::Null);
        let step_key = ctx.idempotency_key();
        let mut transcript: Vec<Value> = Vec::new();
        let mut pending: VecDeque<ToolCall> = VecDeque::new();
        let mut usage = Usage::default();
        let mut replayed = 0u32;
        let mut n = 0u32;
        loop {
            let label = if pending.is_empty() { proposal_label(n) } else { tool_label(n) };
            // The label recorded next, and whether that entry is complete (a proposal whose
            // recorded samples were all invalid goes on sampling within its bound).
            let next = journal.around(|next, _| {
                next.map(|e| (e.label().to_string(), !matches!(e, RecordEntry::Model(c) if c.output.is_none())))
            })?;
            match next.as_ref().map(|(l, complete)| (l.as_str(), *complete)) {
                Some((l, complete)) if l == label => replayed += u32::from(complete),
                Some((LABEL_STOP, _)) => return Err(self.replay_stop(ctx).await),
                // Nothing recorded: a new sub-step, within the limits. (Another label: the
                // journal refuses the call below as a record mismatch.)
                _ => {
                    if let Some((limit, used, max)) = self.reached(n, usage, started, journal.now()) {
                        return Err(self.stop(ctx, limit, used, max).await);
                    }
                    let (bytes, bytes_max) = journal.room()?;
                    if bytes.saturating_mul(4) >= bytes_max.saturating_mul(3) {
                        return Err(self.stop(ctx, AgentLimit::RecordBytes, bytes as u64, bytes_max as u64).await);
                    }
                    if ctx.cancellation().is_cancelled() {
                        return Err(ActivityError::transient("canceled before the next sub-step").into());
                    }
                }
            }
            match pending.pop_front() {
                None => {
                    let mut req =
                        ModelRequest::new(label, self.prompt.clone(), json!({"task": task, "transcript": transcript}))
                            .params(self.params.clone())
                            .output_schema(schema.clone());
                    if let Some(r) = self.resamples {
                        req = req.resamples(r);
                    }
                    let out = ctx.model(&*self.model, req).await?;
                    let spent = journal.around(|_, previous| match previous {
                        Some(RecordEntry::Model(c)) => c.usage(),
                        _ => Usage::default(),
                    })?;
                    usage = usage.plus(spent);
                    let proposal = Proposal::from_value(&out).map_err(|e| permanent(e.to_string()))?;
                    transcript.push(json!({"sub_step": n, "proposal": out}));
                    n += 1;
                    match proposal {
                        Proposal::Done(output) => {
                            // The step's own output schema holds the agent's answer, as it
                            // holds an operator's (K-17.4): a mismatch is a permanent error.
                            if let Some(schema) = journal.output_schema() {
                                let errors = schema.errors(&output);
                                if !errors.is_empty() {
                                    return Err(permanent(format!(
                                        "the agent's answer fails the step's schema {}: {}",
                                        schema.version(),
                                        errors.join("; ")
                                    )));
                                }
                            }
                            return Ok(AgentRun { output, sub_steps: n, usage, replayed });
                        }
                        Proposal::ToolCalls(calls) => pending.extend(calls),
                    }
                }
                Some(call) => {
                    let key = sub_step_key(&step_key, n);
                    let tool = self.tools.iter().find(|t| t.name() == call.tool).cloned();
                    // What a result may take of the record: half of what is left after a
                    // little for the entry's own fields, so the next proposal and the stop
                    // still fit; a larger result is recorded as an error.
                    let (bytes, bytes_max) = journal.room()?;
                    let room = bytes_max.saturating_sub(bytes).saturating_sub(1_024) / 2;
                    let result = ctx
                        .record(&label, || async {
                            let Some(tool) = tool else {
                                return Ok(
                                    json!({"tool": call.tool, "error": format!("unknown tool `{}`", call.tool)}),
                                );
                            };
                            match tool.call(&call, &key, ctx).await {
                                Ok(v) => {
                                    let size = serde_json::to_vec(&v).map_or(usize::MAX, |b| b.len());
                                    if size > room {
                                        // The call took effect; only its result is dropped (say so,
                                        // or the model calls it again under a new key).
                                        return Ok(json!({"tool": call.tool, "succeeded": true, "error": format!(
                                            "the call succeeded but its result is too large to record: \
                                             {size} bytes, {room} left; do not call it again for the same purpose"
                                        )}));
                                    }
                                    Ok(json!({"tool": call.tool, "result": v}))
                                }
                                Err(e) if e.class == ErrorClass::Permanent => {
                                    Ok(json!({"tool": call.tool, "error": e.message}))
                                }
                                Err(e) => Err(e),
                            }
                        })
                        .await?;
                    transcript.push(json!({"sub_step": n, "tool_result": result}));
                    n += 1;
                }
            }
        }
    }

    /// The first limit the next new sub-step would cross: `sub_steps` used sub-steps,
    /// `usage` of the recorded proposals, `now` on the live clock.
    fn reached(&self, sub_steps: u32, usage: Usage, started: Instant, now: Instant) -> Option<(AgentLimit, u64, u64)> {
        let l = &self.limits;
        if sub_steps >= l.max_sub_steps {
            return Some((AgentLimit::SubSteps, u64::from(sub_steps), u64::from(l.max_sub_steps)));
        }
        if let Some(max) = l.max_tokens.filter(|m| tokens(usage) >= *m) {
            return Some((AgentLimit::Tokens, tokens(usage), max));
        }
        if let Some(max) = l.max_cost_micros.filter(|m| usage.cost_micros >= *m) {
            return Some((AgentLimit::CostMicros, usage.cost_micros, max));
        }
        let deadline = l.deadline_ms.unwrap_or(DurationMs::MAX).as_millis().max(0) as u64;
        let elapsed = now.duration_since(started).as_millis().max(0) as u64;
        (elapsed >= deadline).then_some((AgentLimit::Deadline, elapsed, deadline))
    }

    /// Record the stop, then return it (as recorded).
    async fn stop(&self, ctx: &ActivityContext, limit: AgentLimit, used: u64, max: u64) -> AgentError {
        match ctx
            .record(LABEL_STOP, || async move { Ok(json!({"limit": limit.as_str(), "used": used, "max": max})) })
            .await
        {
            Ok(v) => stop_of(&v),
            Err(e) => e.into(),
        }
    }

    /// The recorded stop, read back.
    async fn replay_stop(&self, ctx: &ActivityContext) -> AgentError {
        match ctx.record(LABEL_STOP, || async { Err(ActivityError::permanent("no recorded stop to read back")) }).await
        {
            Ok(v) => stop_of(&v),
            Err(e) => e.into(),
        }
    }
}

fn stop_of(v: &Value) -> AgentError {
    let limit = v.get("limit").and_then(Value::as_str).and_then(AgentLimit::parse);
    match (limit, v.get("used").and_then(Value::as_u64), v.get("max").and_then(Value::as_u64)) {
        (Some(limit), Some(used), Some(max)) => AgentError::Limit { limit, used, max },
        _ => permanent(format!("the recorded {LABEL_STOP} is not a stop: {v}")),
    }
}

#[async_trait::async_trait]
impl Activity for Agent {
    /// Run the loop on the task (default: the instance input) and complete the step with
    /// the `done` value.
    async fn run(&self, ctx: ActivityContext) -> std::result::Result<StepOutcome, ActivityError> {
        let task = match &self.task {
            Some(f) => f(&ctx),
            None => ctx.input().clone(),
        };
        let done = Agent::run(self, &ctx, task).await?;
        Ok(StepOutcome::complete(done.output))
    }
}

/// Agent steps on a [`StepDef`]: bring the trait into scope and write
/// `StepDef::agent("triage", agent)`.
pub trait AgentStepDef {
    /// A step running `agent` (see [`Agent`]), its limits declared with the step:
    /// [`DefinitionBuilder::build`](kernel_core::definition::DefinitionBuilder::build) refuses
    /// the definition when they do not bound the loop (field `steps[i].agent.*`). The
    /// step's other settings (timeout, retries, `on_failed`, output schema of the `done`
    /// value) are set as on any step.
    fn agent(name: impl Into<String>, agent: Agent) -> StepDef;
}

impl AgentStepDef for StepDef {
    fn agent(name: impl Into<String>, agent: Agent) -> StepDef {
        let limits = agent.limits;
        StepDef::new(name, agent).agent_limits(limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel_core::model_call::ModelAnswer;

    struct Silent;
    #[async_trait::async_trait]
    impl Model for Silent {
        fn version(&self) -> VersionRef {
            VersionRef::new("m", "1")
        }
        async fn generate(
            &self,
            _: &ModelRequest,
            _: &ActivityContext,
        ) -> std::result::Result<ModelAnswer, ActivityError> {
            Err(ActivityError::permanent("never asked"))
        }
    }

    struct Named(&'static str);
    #[async_trait::async_trait]
    impl Tool for Named {
        fn name(&self) -> &str {
            self.0
        }
        async fn call(&self, _: &ToolCall, _: &str, _: &ActivityContext) -> std::result::Result<Value, ActivityError> {
            Ok(Value::Null)
        }
    }

    fn limits() -> AgentLimits {
        AgentLimits {
            max_sub_steps: 5,
            max_tokens: Some(100),
            max_cost_micros: Some(50),
            deadline_ms: Some(DurationMs::from_secs(10)),
        }
    }

    #[test]
    fn the_proposal_schema_takes_tool_calls_or_done_and_nothing_else() {
        let s = proposal_schema().unwrap();
        assert_eq!(s.version(), &VersionRef::new("agent-proposal", "1"));
        for ok in [
            json!({"done": null}),
            json!({"done": {"answer": 2}}),
            json!({"tool_calls": [{"tool": "a", "args": {}}, {"tool": "b", "args": {"x": 1}}]}),
        ] {
            assert!(s.errors(&ok).is_empty(), "{ok}");
            assert!(Proposal::from_value(&ok).is_ok(), "{ok}");
        }
        let many: Vec<Value> = (0..=AGENT_TOOL_CALLS_MAX).map(|_| json!({"tool": "a", "args": {}})).collect();
        for bad in [
            json!({}),
            json!({"tool_calls": []}),
            json!({"tool_calls": [{"tool": "a"}]}),
            json!({"tool_calls": [{"tool": "", "args": {}}]}),
            json!({"tool_calls": [{"tool": "a", "args": 3}]}),
            json!({"tool_calls": many}),
            json!({"done": 1, "tool_calls": [{"tool": "a", "args": {}}]}),
            json!({"done": 1, "why": "x"}),
            json!("done"),
        ] {
            assert!(!s.errors(&bad).is_empty(), "{bad}");
        }
        assert_eq!(Proposal::from_value(&json!({"done": 7})).unwrap(), Proposal::Done(json!(7)));
        assert!(matches!(Proposal::from_value(&json!({"tool_calls": []})), Err(Error::InvalidInput { .. })));
    }

    #[test]
    fn labels_are_identifiers_and_keys_append_the_sub_step() {
        for l in [proposal_label(0), tool_label(199), LABEL_START.into(), LABEL_STOP.into()] {
            kernel_core::validate::identifier("label", &l).unwrap();
        }
        assert_eq!(sub_step_key("3:w-1|1:s|0", 12), "3:w-1|1:s|0|s12");
        assert_ne!(sub_step_key("k", 1), sub_step_key("k|s1", 0));
    }

    #[test]
    fn limits_are_reached_in_a_fixed_order() {
        let a = Agent::builder(Arc::new(Silent), VersionRef::new("p", "1")).limits(limits()).build().unwrap();
        let t0 = Instant::from_millis(1_000);
        let u = |t: u64, c: u64| Usage { input_tokens: t, output_tokens: 0, cost_micros: c };
        assert_eq!(a.reached(4, u(99, 49), t0, Instant::from_millis(10_999)), None);
        assert_eq!(a.reached(5, u(0, 0), t0, t0), Some((AgentLimit::SubSteps, 5, 5)));
        assert_eq!(a.reached(1, u(100, 0), t0, t0), Some((AgentLimit::Tokens, 100, 100)));
        assert_eq!(a.reached(1, u(0, 60), t0, t0), Some((AgentLimit::CostMicros, 60, 50)));
        assert_eq!(
            a.reached(1, u(0, 0), t0, Instant::from_millis(11_000)),
            Some((AgentLimit::Deadline, 10_000, 10_000))
        );
        // A clock behind the recorded start is no time used.
        assert_eq!(a.reached(1, u(0, 0), t0, Instant::ZERO), None);
    }

    #[test]
    fn stops_read_back_and_errors_convert_with_their_class() {
        let e = stop_of(&json!({"limit": "tokens", "used": 120, "max": 100}));
        assert_eq!(e, AgentError::Limit { limit: AgentLimit::Tokens, used: 120, max: 100 });
        assert_eq!(ActivityError::from(e).class, ErrorClass::Permanent);
        assert!(matches!(stop_of(&json!({"limit": "nope", "used": 1, "max": 1})), AgentError::Activity(_)));
        let t = ActivityError::transient("rate limited");
        assert_eq!(ActivityError::from(AgentError::from(t.clone())), t);
        let invalid = AgentError::InvalidLimits(AgentLimits::default().validate("agent").unwrap_err());
        assert_eq!(ActivityError::from(invalid).class, ErrorClass::Permanent);
    }

    #[test]
    fn the_builder_refuses_bad_tools_and_prompts() {
        let b = || Agent::builder(Arc::new(Silent), VersionRef::new("p", "1"));
        let field = |r: Result<Agent>| match r {
            Err(Error::InvalidInput { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(b().tool(Named("a")).tool(Named("a")).build()), "agent.tools[1].name");
        assert_eq!(field(b().tool(Named("")).build()), "agent.tools[0].name");
        assert_eq!(field(Agent::builder(Arc::new(Silent), VersionRef::new("", "1")).build()), "agent.prompt.id");
        let mut many = b();
        for _ in 0..=AGENT_TOOLS_MAX {
            many = many.tool(Named("t"));
        }
        assert_eq!(field(many.build()), "agent.tools");
        let step = StepDef::agent("plan", b().limits(limits()).build().unwrap());
        assert_eq!(step.get_agent_limits(), Some(&limits()));
    }
}
