//! Definitions, plans, fingerprints (K-4) and the readiness rule (K-4.4).
//!
//! A [`Plan`] is the persisted protocol of a workflow type: ordered step names and their
//! effective dependencies. A [`Definition`] adds the callables and policies a worker needs.
//! Publishers register plans, workers register definitions (K-4.1).

use crate::activity::Activity;
use crate::domain::{DurationMs, Step, StepStatus};
use crate::error::{Error, Result};
use crate::validate;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// What happens when a step fails for good (K-7.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnFailed {
    /// Fail the workflow (default).
    #[default]
    Stop,
    /// Skip the step and continue with the next wave.
    Skip,
    /// Dead-letter it (K-17.2): record a dead letter (workflow, step, error class, the
    /// recorded inputs) and park the workflow on the operator signal — no new status, no
    /// worker held — until an operator retries the step (next epoch), completes it with a
    /// supplied output or fails it. Needs a [`DeadLetters`](crate::ports::DeadLetters)
    /// port on the engine.
    DeadLetter,
}

/// How long to wait before a retry (K-7.4). Persisted as `claimable_time`, never slept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryPolicy {
    /// Retry at once (seed 000's behaviour).
    Immediate,
    /// `random(0, min(cap, base × 2^(attempt−1)))`: exponential backoff with full jitter.
    Exponential {
        /// Base delay.
        base_ms: DurationMs,
        /// Upper bound.
        cap_ms: DurationMs,
    },
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy::Exponential { base_ms: DurationMs::from_secs(1), cap_ms: DurationMs::from_secs(60) }
    }
}

impl RetryPolicy {
    /// Delay before the retry that follows physical attempt `attempt` (1-based), with the
    /// jitter drawn from `random` (full range of u64).
    pub fn delay_ms(&self, attempt: u32, random: u64) -> DurationMs {
        match *self {
            RetryPolicy::Immediate => DurationMs::ZERO,
            RetryPolicy::Exponential { base_ms, cap_ms } => {
                let exp = attempt.saturating_sub(1).min(30);
                let ceiling = base_ms.saturating_mul(1i64 << exp).min(cap_ms).max(DurationMs::ZERO).as_millis();
                if ceiling == 0 {
                    DurationMs::ZERO
                } else {
                    DurationMs::from_millis((random % (ceiling as u64 + 1)) as i64)
                }
            }
        }
    }
}

/// Derives a step's traffic resource from the workflow's input and its prepared context
/// (K-2.3), e.g. `tenant:<t>:<resource>` (K-14).
pub type ResourceFn = Arc<dyn Fn(&Value, &Value) -> String + Send + Sync>;

/// The traffic resource of a step (K-14).
#[derive(Clone)]
pub(crate) enum StepResource {
    /// The same resource for every workflow.
    Fixed(String),
    /// A resource per workflow, derived before each permit acquire.
    Derived(ResourceFn),
}

impl std::fmt::Debug for StepResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StepResource::Fixed(name) => name.fmt(f),
            StepResource::Derived(_) => f.write_str("<derived>"),
        }
    }
}

/// One step of a [`Definition`].
#[derive(Clone)]
pub struct StepDef {
    pub(crate) name: String,
    pub(crate) activity: Arc<dyn Activity>,
    pub(crate) timeout_ms: DurationMs,
    pub(crate) max_retry: u32,
    pub(crate) retry: RetryPolicy,
    pub(crate) resource: Option<StepResource>,
    pub(crate) on_failed: OnFailed,
    pub(crate) depends_on: Option<Vec<String>>,
    pub(crate) streaming: bool,
    pub(crate) model: crate::journal::ModelSettings,
    pub(crate) max_retry_duration: Option<DurationMs>,
    pub(crate) query: Option<Arc<dyn OutcomeQuery>>,
    pub(crate) loop_to: Option<LoopSpec>,
    pub(crate) when: Option<BranchSpec>,
    pub(crate) agent: Option<crate::agent_limits::AgentLimits>,
    pub(crate) inverse: Option<Arc<dyn Activity>>,
    pub(crate) irreversible: bool,
    pub(crate) outcome_authority: OutcomeAuthority,
}

/// Who may supply a step's outcome (K-17.2 amendment): the kernel's one rule for outputs
/// that carry authority. An operator deciding the step's dead letter may complete it with
/// an output of their own only when its outcome is not reserved to its own activity.
///
/// A step takes its activity's [`Activity::outcome_authority`] (a
/// `HumanTask` (the `kernel-tasks` crate) declares [`ActivityOnly`](Self::ActivityOnly));
/// [`StepDef::outcome_authority`] overrides it, e.g. for a step whose closure wraps a
/// human task. Policy, like retries: not part of the fingerprint (K-4.2), so declaring it
/// parks no instance in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum OutcomeAuthority {
    /// The activity's result, or an operator's output completing the step's dead letter
    /// (the default).
    #[default]
    ActivityOrOperator,
    /// Only the step's own activity — for a human task, an eligible person's decision
    /// through the task desk or its SLA path. An operator may retry such a dead-lettered
    /// step (which re-opens its task) or fail it; a `Complete` with a supplied output is
    /// refused.
    ActivityOnly,
}

/// Whether a loop's sender sends the workflow back again, read from the sender's recorded
/// output (K-17.4a): never from the clock, a random draw or a lookup.
pub type LoopPredicate = Arc<dyn Fn(&Value) -> bool + Send + Sync>;

/// Whether a conditional step runs, read from the recorded outputs of the steps it names.
pub type BranchPredicate = Arc<dyn Fn(&BranchInputs<'_>) -> bool + Send + Sync>;

/// A loop's back-edge, declared on its sender.
#[derive(Clone)]
pub(crate) struct LoopSpec {
    pub(crate) target: String,
    pub(crate) again: LoopPredicate,
    pub(crate) max_iterations: Option<u32>,
}

/// A branch condition, declared on the conditional step.
#[derive(Clone)]
pub(crate) struct BranchSpec {
    pub(crate) reads: Vec<String>,
    pub(crate) holds: BranchPredicate,
}

/// Upper bound on a loop's declared maximum of iterations.
pub const LOOP_ITERATIONS_MAX: u32 = 1_000;

/// What a branch predicate may read: the recorded outputs of the steps it declared
/// (K-17.4a), each `None` when that step was skipped.
pub struct BranchInputs<'a> {
    pub(crate) reads: &'a [String],
    pub(crate) outputs: &'a BTreeMap<String, Value>,
}

impl<'a> BranchInputs<'a> {
    /// The recorded output of `step`: `None` when it was skipped, or when the predicate did
    /// not declare it (a predicate reads only what it declared).
    pub fn output(&self, step: &str) -> Option<&'a Value> {
        if self.reads.iter().any(|r| r == step) {
            self.outputs.get(step)
        } else {
            None
        }
    }
}

/// What the external system says about an operation whose outcome was unknown (K-17.2).
#[derive(Debug, Clone, PartialEq)]
pub enum QueryAnswer {
    /// It took effect: the step completes with this output, the activity is not run.
    Done(Value),
    /// It did not take effect: the activity runs again.
    NotDone,
    /// Still unknown: counted as a failed attempt; past the step's retry bounds the step
    /// is dead-lettered (or fails, without a dead-letter policy) — never a blind retry.
    StillUnknown,
}

/// The query hook asked before any retry of a step whose last attempt ended with an
/// unknown outcome (K-17.2), e.g. "is invoice 42 posted?".
#[async_trait::async_trait]
pub trait OutcomeQuery: Send + Sync + 'static {
    /// Ask the external system; `ctx` is the retry's context (same idempotency key).
    async fn query(
        &self,
        ctx: &crate::activity::ActivityContext,
    ) -> std::result::Result<QueryAnswer, crate::activity::ActivityError>;
}

#[async_trait::async_trait]
impl<F, Fut> OutcomeQuery for F
where
    F: Fn(crate::activity::ActivityContext) -> Fut + Send + Sync + 'static,
    Fut:
        std::future::Future<Output = std::result::Result<QueryAnswer, crate::activity::ActivityError>> + Send + 'static,
{
    async fn query(
        &self,
        ctx: &crate::activity::ActivityContext,
    ) -> std::result::Result<QueryAnswer, crate::activity::ActivityError> {
        (self)(ctx.clone()).await
    }
}

impl std::fmt::Debug for StepDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepDef")
            .field("name", &self.name)
            .field("timeout_ms", &self.timeout_ms)
            .field("max_retry", &self.max_retry)
            .field("resource", &self.resource)
            .field("depends_on", &self.depends_on)
            .finish_non_exhaustive()
    }
}

impl StepDef {
    /// A step running `activity`, with a 60 s timeout, no retries, no resource.
    pub fn new(name: impl Into<String>, activity: impl Activity) -> Self {
        let outcome_authority = activity.outcome_authority();
        StepDef {
            name: name.into(),
            activity: Arc::new(activity),
            timeout_ms: DurationMs::from_secs(60),
            max_retry: 0,
            retry: RetryPolicy::default(),
            resource: None,
            on_failed: OnFailed::Stop,
            depends_on: None,
            streaming: false,
            model: Default::default(),
            max_retry_duration: None,
            query: None,
            loop_to: None,
            when: None,
            agent: None,
            inverse: None,
            irreversible: false,
            outcome_authority,
        }
    }
    /// Declare this step an agent step bounded by `limits`: what the `kernel-agents`
    /// crate's `AgentStepDef::agent` sets from its agent, so the limits the definition
    /// validates and fingerprints are the ones the loop enforces. Not for direct use (set on
    /// another step, nothing enforces them). [`DefinitionBuilder::build`] refuses the
    /// definition when they do not bound the loop (field `steps[i].agent.*`).
    #[doc(hidden)]
    pub fn agent_limits(mut self, limits: crate::agent_limits::AgentLimits) -> Self {
        self.agent = Some(limits);
        self
    }

    /// The limits of an agent step.
    pub fn get_agent_limits(&self) -> Option<&crate::agent_limits::AgentLimits> {
        self.agent.as_ref()
    }

    /// Who may supply this step's outcome (K-17.2 amendment); the default is its activity's
    /// [`Activity::outcome_authority`]. Not part of the fingerprint.
    pub fn outcome_authority(mut self, authority: OutcomeAuthority) -> Self {
        self.outcome_authority = authority;
        self
    }
    /// Who may supply this step's outcome.
    pub fn get_outcome_authority(&self) -> OutcomeAuthority {
        self.outcome_authority
    }
    /// Declare the idempotent inverse of this side-effecting step (K-17.6): the business
    /// action that undoes it (a reversal entry, a refund), run by the failure path's
    /// compensation in reverse completion order. The inverse gets its own idempotency key,
    /// derived from the step's. Policy, like retries: not part of the fingerprint.
    pub fn compensate_with(mut self, inverse: impl Activity) -> Self {
        self.inverse = Some(Arc::new(inverse));
        self
    }
    /// Mark this step irreversible (K-17.6): nothing can undo it (a notification sent, a
    /// payment released). The definition is refused unless every compensable step is
    /// upstream of it — so no compensable step can still be running or pending when it
    /// starts — and it is in no loop's body (a loop would run it again).
    pub fn irreversible(mut self) -> Self {
        self.irreversible = true;
        self
    }
    /// The step's inverse, if it declared one.
    pub fn get_inverse(&self) -> Option<&Arc<dyn Activity>> {
        self.inverse.as_ref()
    }
    /// Whether the step is irreversible.
    pub fn is_irreversible(&self) -> bool {
        self.irreversible
    }
    /// Make this step a loop's sender (K-4 amendment): once it completes, while
    /// `again(output)` holds on its recorded output, the workflow goes back to `target` —
    /// the target and every step that depends on it and has run (this one among them) run
    /// again in their next epoch (a new K-17.1 key per iteration), each iteration's outputs
    /// kept in their bounded history. `target` is this step or one it depends on
    /// (transitively). A loop needs a [`max_iterations`](Self::max_iterations); going past
    /// it is a permanent error of this step, handled by its `on_failed` policy.
    ///
    /// ```
    /// use kernel_core::{ActivityContext, Definition, StepDef, StepOutcome};
    /// use serde_json::json;
    /// let step = |out: serde_json::Value| move |_: ActivityContext| {
    ///     let out = out.clone();
    ///     async move { Ok(StepOutcome::complete(out)) }
    /// };
    /// let def = Definition::builder("review")
    ///     .step(StepDef::new("collect", step(json!({"files": 2}))))
    ///     .step(
    ///         StepDef::new("check", step(json!({"complete": true})))
    ///             .loop_to("collect", |out| out["complete"] != json!(true))
    ///             .max_iterations(5),
    ///     )
    ///     .build();
    /// assert!(def.is_ok());
    /// ```
    pub fn loop_to(
        mut self,
        target: impl Into<String>,
        again: impl Fn(&Value) -> bool + Send + Sync + 'static,
    ) -> Self {
        let max_iterations = self.loop_to.as_ref().and_then(|l| l.max_iterations);
        self.loop_to = Some(LoopSpec { target: target.into(), again: Arc::new(again), max_iterations });
        self
    }
    /// The most times this step's loop may send the workflow back (1..=[`LOOP_ITERATIONS_MAX`]).
    pub fn max_iterations(mut self, n: u32) -> Self {
        match &mut self.loop_to {
            Some(l) => l.max_iterations = Some(n),
            None => {
                self.loop_to =
                    Some(LoopSpec { target: String::new(), again: Arc::new(|_| false), max_iterations: Some(n) })
            }
        }
        self
    }
    /// Run this step only when `holds` is true of the recorded outputs of `reads` — steps
    /// it depends on, directly or transitively (K-4 amendment, K-17.4a). A step not taken
    /// is `skipped` without an error ([`Step::not_taken`]); like any skipped step it
    /// satisfies its dependents (K-4.4), so a join after alternative branches runs; a step
    /// that should follow only a taken branch declares its own condition, e.g.
    /// `|o| o.output("extract").is_some()`.
    pub fn when<I, S>(mut self, reads: I, holds: impl Fn(&BranchInputs<'_>) -> bool + Send + Sync + 'static) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.when = Some(BranchSpec { reads: reads.into_iter().map(Into::into).collect(), holds: Arc::new(holds) });
        self
    }
    /// The loop target of this step, if it is a loop's sender.
    pub fn get_loop_to(&self) -> Option<&str> {
        self.loop_to.as_ref().map(|l| l.target.as_str()).filter(|t| !t.is_empty())
    }
    /// The declared maximum of this step's loop.
    pub fn get_max_iterations(&self) -> Option<u32> {
        self.loop_to.as_ref().and_then(|l| l.max_iterations)
    }
    /// The steps this step's branch condition reads, if it is conditional.
    pub fn get_when_reads(&self) -> Option<&[String]> {
        self.when.as_ref().map(|b| b.reads.as_slice())
    }
    /// The versioned output schema of the step's model calls (K-17.4): every answer is
    /// validated against it; its id and version are recorded with each call and are not
    /// part of the fingerprint (K-4.2).
    pub fn output_schema(mut self, schema: crate::model_call::OutputSchema) -> Self {
        self.model.schema = Some(schema);
        self
    }
    /// Re-samples of an invalid model answer within one logical attempt (default 2).
    pub fn resamples(mut self, n: u32) -> Self {
        self.model.resamples = Some(n);
        self
    }
    /// The step only reads: its model calls may be served from the result cache (K-17.7).
    pub fn read_only(mut self) -> Self {
        self.model.read_only = true;
        self
    }
    /// Bound the total time spent retrying one logical attempt, counted from its first
    /// retryable failure, as well as the count ([`max_retry`](Self::max_retry)).
    pub fn max_retry_duration(mut self, ms: impl Into<DurationMs>) -> Self {
        self.max_retry_duration = Some(ms.into());
        self
    }
    /// Ask `query` before any retry after an unknown outcome (K-17.2) instead of running
    /// the activity blindly.
    pub fn on_unknown_outcome(mut self, query: impl OutcomeQuery) -> Self {
        self.query = Some(Arc::new(query));
        self
    }
    /// The step's output schema, if any.
    pub fn get_output_schema(&self) -> Option<&crate::model_call::OutputSchema> {
        self.model.schema.as_ref()
    }
    /// The retry time bound, if any.
    pub fn get_max_retry_duration(&self) -> Option<DurationMs> {
        self.max_retry_duration
    }
    /// Per-invocation timeout (a fresh window per entry, K-7.3).
    pub fn timeout_ms(mut self, ms: impl Into<DurationMs>) -> Self {
        self.timeout_ms = ms.into();
        self
    }
    /// Retries after the first attempt.
    pub fn max_retry(mut self, n: u32) -> Self {
        self.max_retry = n;
        self
    }
    /// Retry delay policy.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }
    /// A traffic resource whose permit is acquired before every entry (K-14).
    pub fn resource(mut self, name: impl Into<String>) -> Self {
        self.resource = Some(StepResource::Fixed(name.into()));
        self
    }
    /// A traffic resource derived per workflow from its input and its prepared context
    /// (`Value::Null` without a PrepareContext hook), computed before every entry (K-14):
    /// e.g. `tenant:<t>:asr`, so that each tenant is held to its own limit. The function
    /// must be deterministic. A derived name that is not a valid resource name
    /// ([`validate::key_name`]) fails the step permanently without entering its activity.
    pub fn resource_from(mut self, derive: impl Fn(&Value, &Value) -> String + Send + Sync + 'static) -> Self {
        self.resource = Some(StepResource::Derived(Arc::new(derive)));
        self
    }
    /// Failure policy.
    pub fn on_failed(mut self, p: OnFailed) -> Self {
        self.on_failed = p;
        self
    }
    /// Explicit dependencies (DAG). Without it, the step depends on the previous one.
    pub fn depends_on<I: IntoIterator<Item = S>, S: Into<String>>(mut self, deps: I) -> Self {
        self.depends_on = Some(deps.into_iter().map(Into::into).collect());
        self
    }
    /// The step writes a client stream, reset before a re-execution (K-16).
    pub fn streaming(mut self) -> Self {
        self.streaming = true;
        self
    }
    /// Step name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Traffic resource, when it is a fixed name (see [`resource_for`](Self::resource_for)).
    pub fn resource_name(&self) -> Option<&str> {
        match &self.resource {
            Some(StepResource::Fixed(name)) => Some(name),
            _ => None,
        }
    }
    /// Whether the step takes a permit before each entry.
    pub fn has_resource(&self) -> bool {
        self.resource.is_some()
    }
    /// Traffic resource of this step for a workflow with `input` and `prepared` context:
    /// the fixed name, or the derived one (not validated here).
    pub fn resource_for(&self, input: &Value, prepared: &Value) -> Option<String> {
        match &self.resource {
            None => None,
            Some(StepResource::Fixed(name)) => Some(name.clone()),
            Some(StepResource::Derived(derive)) => Some(derive(input, prepared)),
        }
    }
    /// Timeout.
    pub fn get_timeout_ms(&self) -> DurationMs {
        self.timeout_ms
    }
    /// Retries after the first attempt.
    pub fn get_max_retry(&self) -> u32 {
        self.max_retry
    }
    /// Retry policy.
    pub fn retry_policy(&self) -> RetryPolicy {
        self.retry
    }
    /// Failure policy.
    pub fn get_on_failed(&self) -> OnFailed {
        self.on_failed
    }
    /// Whether the step streams.
    pub fn is_streaming(&self) -> bool {
        self.streaming
    }
    /// The activity.
    pub fn activity(&self) -> &Arc<dyn Activity> {
        &self.activity
    }
}

/// A step of a [`Plan`]: name, effective dependencies (indices, sorted) and its control
/// shape beyond them (K-4 amendment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanStep {
    /// Step name.
    pub name: String,
    /// Indices of the steps it depends on.
    pub deps: Vec<usize>,
    /// The target of this step's loop (an index not after this one), if it is a loop's sender.
    pub loop_to: Option<usize>,
    /// The steps its branch condition reads (indices, sorted), if it is conditional.
    pub reads: Option<Vec<usize>>,
}

/// The control shape of one step beyond its dependencies, by name (K-4 amendment): what
/// a publisher declares for [`Plan::with_control`] so its fingerprint matches the
/// workers' definition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepControl {
    /// The step's loop target.
    pub loop_to: Option<String>,
    /// The steps its branch condition reads.
    pub reads: Option<Vec<String>>,
}

/// The persisted protocol of a workflow type (K-4.1): no callables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    workflow_type: String,
    steps: Vec<PlanStep>,
    fingerprint: String,
}

impl Plan {
    /// Build and validate a plan from `(name, explicit deps)` pairs; `None` deps means
    /// "the previous step".
    pub fn new(workflow_type: &str, steps: &[(String, Option<Vec<String>>)]) -> Result<Plan> {
        Plan::with_control(workflow_type, steps, &[])
    }

    /// [`Plan::new`] with the control shape of each step (`control[i]` for step `i`; a
    /// shorter list leaves the rest plain). Refused, as [`Error::InvalidInput`] naming the
    /// field: a loop target or a branch read that is not a step, a loop target after its
    /// sender, one the sender does not depend on (transitively), a branch reading a step
    /// that is not upstream of it.
    pub fn with_control(
        workflow_type: &str,
        steps: &[(String, Option<Vec<String>>)],
        control: &[StepControl],
    ) -> Result<Plan> {
        if control.len() > steps.len() {
            return Err(Error::invalid("control", "more control entries than steps"));
        }
        validate::identifier("workflow_type", workflow_type)?;
        if steps.is_empty() {
            return Err(Error::invalid("steps", "a definition needs at least one step"));
        }
        if steps.len() > STEPS_MAX {
            return Err(Error::invalid("steps", format_args!("more than {STEPS_MAX} steps")));
        }
        let mut index: HashMap<&str, usize> = HashMap::new();
        for (i, (name, _)) in steps.iter().enumerate() {
            validate::key_name(&format!("steps[{i}].name"), name)?;
            if index.insert(name.as_str(), i).is_some() {
                return Err(Error::invalid(format!("steps[{i}].name"), format_args!("duplicate step name `{name}`")));
            }
        }
        let mut out = Vec::with_capacity(steps.len());
        for (i, (name, deps)) in steps.iter().enumerate() {
            let mut d: Vec<usize> = match deps {
                None => {
                    if i == 0 {
                        vec![]
                    } else {
                        vec![i - 1]
                    }
                }
                Some(list) => {
                    let mut v = Vec::new();
                    for dep in list {
                        let j = *index.get(dep.as_str()).ok_or_else(|| {
                            Error::invalid(format!("steps[{i}].depends_on"), format_args!("unknown step `{dep}`"))
                        })?;
                        if j == i {
                            return Err(Error::invalid(
                                format!("steps[{i}].depends_on"),
                                "a step cannot depend on itself",
                            ));
                        }
                        v.push(j);
                    }
                    v
                }
            };
            d.sort_unstable();
            d.dedup();
            out.push(PlanStep { name: name.clone(), deps: d, loop_to: None, reads: None });
        }
        detect_cycle(&out)?;
        for (i, c) in control.iter().enumerate() {
            let upstream = ancestors(&out, i);
            if let Some(target) = &c.loop_to {
                let field = format!("steps[{i}].loop_to");
                let j = *index
                    .get(target.as_str())
                    .ok_or_else(|| Error::invalid(field.clone(), format_args!("unknown step `{target}`")))?;
                if j > i {
                    return Err(Error::invalid(
                        field,
                        format_args!("loop target `{target}` comes after its sender `{}`", out[i].name),
                    ));
                }
                if j != i && !upstream[j] {
                    return Err(Error::invalid(
                        field,
                        format_args!("loop target `{target}` is not upstream of its sender `{}`", out[i].name),
                    ));
                }
                out[i].loop_to = Some(j);
            }
            if let Some(reads) = &c.reads {
                let field = format!("steps[{i}].when");
                if reads.is_empty() {
                    return Err(Error::invalid(field, "a branch condition reads at least one step"));
                }
                let mut r = Vec::with_capacity(reads.len());
                for read in reads {
                    let j = *index
                        .get(read.as_str())
                        .ok_or_else(|| Error::invalid(field.clone(), format_args!("unknown step `{read}`")))?;
                    if !upstream[j] {
                        return Err(Error::invalid(
                            field,
                            format_args!("`{read}` is not upstream of `{}`: a branch reads recorded outputs of steps it depends on", out[i].name),
                        ));
                    }
                    r.push(j);
                }
                r.sort_unstable();
                r.dedup();
                out[i].reads = Some(r);
            }
        }
        let fingerprint = fingerprint(workflow_type, &out);
        Ok(Plan { workflow_type: workflow_type.to_string(), steps: out, fingerprint })
    }

    /// Workflow type.
    pub fn workflow_type(&self) -> &str {
        &self.workflow_type
    }
    /// Steps in order.
    pub fn steps(&self) -> &[PlanStep] {
        &self.steps
    }
    /// SHA-256 fingerprint, lowercase hex (K-4.2).
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }
    /// Fresh pending steps for a new instance.
    pub fn initial_steps(&self) -> Vec<Step> {
        self.steps.iter().map(|s| Step::pending(s.name.clone())).collect()
    }

    /// Ready step indices (K-4.4): every non-terminal, non-waiting step whose dependencies
    /// are all completed or skipped. `running` is ready (a crashed worker's leftover).
    pub fn ready(&self, steps: &[Step]) -> Vec<usize> {
        let done =
            |i: usize| steps.get(i).is_some_and(|s| matches!(s.status, StepStatus::Completed | StepStatus::Skipped));
        self.steps
            .iter()
            .enumerate()
            .filter(|(i, p)| {
                steps.get(*i).is_some_and(|s| matches!(s.status, StepStatus::Pending | StepStatus::Running))
                    && p.deps.iter().all(|d| done(*d))
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// `dependents[j]`: step `j` is step `i` or depends on it, directly or transitively.
    pub fn dependents(&self, i: usize) -> Vec<bool> {
        descendants(&self.steps, i)
    }

    /// The body of the loop whose sender is step `sender` (`None` when it sends no loop):
    /// `body[j]` for the target and every step depending on it (transitively), except the
    /// steps after the sender (K-4 amendment).
    pub fn loop_body(&self, sender: usize) -> Option<Vec<bool>> {
        let target = self.steps.get(sender)?.loop_to?;
        let (from_target, from_sender) = (descendants(&self.steps, target), descendants(&self.steps, sender));
        Some((0..self.steps.len()).map(|j| from_target[j] && (j == sender || !from_sender[j])).collect())
    }

    /// Every step completed or skipped.
    pub fn all_done(&self, steps: &[Step]) -> bool {
        steps.len() == self.steps.len()
            && steps.iter().all(|s| matches!(s.status, StepStatus::Completed | StepStatus::Skipped))
    }
}

/// Upper bound on steps per definition.
pub const STEPS_MAX: usize = 256;

/// `reach[j]`: step `j` is `root` or depends on it, directly or transitively.
fn descendants(steps: &[PlanStep], root: usize) -> Vec<bool> {
    let mut reach = vec![false; steps.len()];
    reach[root] = true;
    let mut changed = true;
    while changed {
        changed = false;
        for (j, p) in steps.iter().enumerate() {
            if !reach[j] && p.deps.iter().any(|&k| reach[k]) {
                reach[j] = true;
                changed = true;
            }
        }
    }
    reach
}

/// K-17.6: an irreversible step runs after every compensable step — each compensable step
/// is upstream of it (a dependency, directly or transitively), so when it starts every
/// compensable step has completed or been skipped — and it is in no loop's body. A step
/// both compensable and irreversible is refused.
fn irreversible_last(plan: &Plan, steps: &[StepDef]) -> Result<()> {
    for (i, s) in steps.iter().enumerate().filter(|(_, s)| s.irreversible) {
        let field = format!("steps[{i}].irreversible");
        if s.inverse.is_some() {
            return Err(Error::invalid(
                field,
                format_args!("`{}` declares an inverse: it is not irreversible", s.name),
            ));
        }
        let upstream = ancestors(plan.steps(), i);
        for (j, c) in steps.iter().enumerate().filter(|(j, c)| c.inverse.is_some() && *j != i) {
            if !upstream[j] {
                return Err(Error::invalid(
                    field,
                    format_args!(
                        "irreversible `{}` could run before compensable `{}`: make `{}` depend on it",
                        s.name, c.name, s.name
                    ),
                ));
            }
        }
        for (sender, sd) in steps.iter().enumerate() {
            if plan.loop_body(sender).is_some_and(|body| body[i]) {
                return Err(Error::invalid(
                    field,
                    format_args!("irreversible `{}` is in the body of the loop sent by `{}`", s.name, sd.name),
                ));
            }
        }
    }
    Ok(())
}

/// `upstream[j]`: step `j` is a dependency of step `i`, directly or transitively.
fn ancestors(steps: &[PlanStep], i: usize) -> Vec<bool> {
    let mut seen = vec![false; steps.len()];
    let mut stack: Vec<usize> = steps[i].deps.clone();
    while let Some(j) = stack.pop() {
        if !std::mem::replace(&mut seen[j], true) {
            stack.extend(steps[j].deps.iter().copied());
        }
    }
    seen
}

fn detect_cycle(steps: &[PlanStep]) -> Result<()> {
    // Iterative DFS with colours; the plan is small (≤ STEPS_MAX).
    let n = steps.len();
    let mut colour = vec![0u8; n];
    for start in 0..n {
        if colour[start] != 0 {
            continue;
        }
        let mut stack = vec![(start, 0usize)];
        colour[start] = 1;
        while let Some((node, next)) = stack.pop() {
            if let Some(&dep) = steps[node].deps.get(next) {
                stack.push((node, next + 1));
                match colour[dep] {
                    0 => {
                        colour[dep] = 1;
                        stack.push((dep, 0));
                    }
                    1 => {
                        return Err(Error::invalid(
                            format!("steps[{node}].depends_on"),
                            format_args!("dependency cycle through `{}`", steps[dep].name),
                        ))
                    }
                    _ => {}
                }
            } else {
                colour[node] = 2;
            }
        }
    }
    Ok(())
}

fn put(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u32).to_be_bytes());
    h.update(bytes);
}

/// K-4.2: SHA-256 over the length-prefixed type, then per step in order its length-prefixed
/// name, the count of its effective dependencies and their length-prefixed names sorted.
/// Activities, timeouts, retries and resources are deliberately excluded.
///
/// K-4 amendment (control beyond a DAG): a plan with a loop or a branch appends the
/// length-prefixed tag `control`, then per step in order a byte — 0 plain, 1 loop's sender,
/// 2 conditional, 3 both — followed by the loop target's length-prefixed name (1, 3) and
/// the count and length-prefixed names, sorted, of the steps its condition reads (2, 3).
/// A plan without either hashes exactly as before (the golden values are unchanged). The
/// loop's maximum and the predicates' code are policy, like retries, and are excluded.
pub fn fingerprint(workflow_type: &str, steps: &[PlanStep]) -> String {
    let mut h = Sha256::new();
    put(&mut h, workflow_type.as_bytes());
    h.update((steps.len() as u32).to_be_bytes());
    for s in steps {
        put(&mut h, s.name.as_bytes());
        let mut deps: Vec<&str> = s.deps.iter().map(|d| steps[*d].name.as_str()).collect();
        deps.sort_unstable();
        h.update((deps.len() as u32).to_be_bytes());
        for d in deps {
            put(&mut h, d.as_bytes());
        }
    }
    if steps.iter().any(|s| s.loop_to.is_some() || s.reads.is_some()) {
        put(&mut h, b"control");
        for s in steps {
            h.update([u8::from(s.loop_to.is_some()) | (u8::from(s.reads.is_some()) << 1)]);
            if let Some(t) = s.loop_to {
                put(&mut h, steps[t].name.as_bytes());
            }
            if let Some(reads) = &s.reads {
                let mut names: Vec<&str> = reads.iter().map(|r| steps[*r].name.as_str()).collect();
                names.sort_unstable();
                h.update((names.len() as u32).to_be_bytes());
                for n in names {
                    put(&mut h, n.as_bytes());
                }
            }
        }
    }
    hex::encode(h.finalize())
}

/// A workflow type with its callables: what a worker registers.
#[derive(Clone)]
pub struct Definition {
    plan: Plan,
    steps: Vec<StepDef>,
    success_finalizer: Option<Arc<dyn Activity>>,
    failure_finalizer: Option<Arc<dyn Activity>>,
}

impl std::fmt::Debug for Definition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Definition").field("plan", &self.plan).field("steps", &self.steps).finish_non_exhaustive()
    }
}

/// Builder of a [`Definition`].
pub struct DefinitionBuilder {
    workflow_type: String,
    steps: Vec<StepDef>,
    success_finalizer: Option<Arc<dyn Activity>>,
    failure_finalizer: Option<Arc<dyn Activity>>,
}

impl DefinitionBuilder {
    /// Append a step.
    pub fn step(mut self, s: StepDef) -> Self {
        self.steps.push(s);
        self
    }
    /// Idempotent business close-out run before `completed` (K-8).
    pub fn success_finalizer(mut self, a: impl Activity) -> Self {
        self.success_finalizer = Some(Arc::new(a));
        self
    }
    /// Idempotent failure close-out run in `failing`, before `failed` (K-8).
    pub fn failure_finalizer(mut self, a: impl Activity) -> Self {
        self.failure_finalizer = Some(Arc::new(a));
        self
    }
    /// Validate: identifier rules, unique names, known dependencies, no cycles, positive
    /// timeouts and retry delays of at most [`validate::CONFIG_MS_MAX`], resource names;
    /// loops (a known target, not after its sender and upstream of it, a maximum of
    /// 1..=[`LOOP_ITERATIONS_MAX`]), branch conditions (reading known, upstream steps) and
    /// agent limits ([`AgentLimits`](crate::agent_limits::AgentLimits)). Every refusal is an
    /// [`Error::InvalidInput`] naming the field.
    pub fn build(self) -> Result<Definition> {
        let pairs: Vec<(String, Option<Vec<String>>)> =
            self.steps.iter().map(|s| (s.name.clone(), s.depends_on.clone())).collect();
        let mut control = Vec::with_capacity(self.steps.len());
        for (i, s) in self.steps.iter().enumerate() {
            if let Some(l) = &s.loop_to {
                if l.target.is_empty() {
                    return Err(Error::invalid(
                        format!("steps[{i}].max_iterations"),
                        "a maximum of iterations without a loop (`loop_to`)",
                    ));
                }
                match l.max_iterations {
                    None => {
                        return Err(Error::invalid(
                            format!("steps[{i}].max_iterations"),
                            format_args!("the loop from `{}` to `{}` has no maximum", s.name, l.target),
                        ))
                    }
                    Some(n) if n == 0 || n > LOOP_ITERATIONS_MAX => {
                        return Err(Error::invalid(
                            format!("steps[{i}].max_iterations"),
                            format_args!("{n} is not within 1..={LOOP_ITERATIONS_MAX}"),
                        ))
                    }
                    Some(_) => {}
                }
            }
            if let Some(limits) = &s.agent {
                limits.validate(&format!("steps[{i}].agent"))?;
            }
            control.push(StepControl {
                loop_to: s.get_loop_to().map(str::to_string),
                reads: s.when.as_ref().map(|b| b.reads.clone()),
            });
        }
        let plan = Plan::with_control(&self.workflow_type, &pairs, &control)?;
        irreversible_last(&plan, &self.steps)?;
        for (i, s) in self.steps.iter().enumerate() {
            validate::config_ms(&format!("steps[{i}].timeout_ms"), s.timeout_ms)?;
            if let Some(StepResource::Fixed(r)) = &s.resource {
                validate::key_name(&format!("steps[{i}].resource"), r)?;
            }
            if let RetryPolicy::Exponential { base_ms, cap_ms } = s.retry {
                validate::config_ms(&format!("steps[{i}].retry.base_ms"), base_ms)?;
                validate::config_ms(&format!("steps[{i}].retry.cap_ms"), cap_ms)?;
            }
        }
        Ok(Definition {
            plan,
            steps: self.steps,
            success_finalizer: self.success_finalizer,
            failure_finalizer: self.failure_finalizer,
        })
    }
}

impl Definition {
    /// Start building a definition of `workflow_type`.
    pub fn builder(workflow_type: impl Into<String>) -> DefinitionBuilder {
        DefinitionBuilder {
            workflow_type: workflow_type.into(),
            steps: vec![],
            success_finalizer: None,
            failure_finalizer: None,
        }
    }
    /// The plan (no callables).
    pub fn plan(&self) -> &Plan {
        &self.plan
    }
    /// Workflow type.
    pub fn workflow_type(&self) -> &str {
        self.plan.workflow_type()
    }
    /// Steps.
    pub fn steps(&self) -> &[StepDef] {
        &self.steps
    }
    /// Success finalizer.
    pub fn success_finalizer(&self) -> Option<&Arc<dyn Activity>> {
        self.success_finalizer.as_ref()
    }
    /// Failure finalizer.
    pub fn failure_finalizer(&self) -> Option<&Arc<dyn Activity>> {
        self.failure_finalizer.as_ref()
    }
}

/// Plans by type (publisher side).
#[derive(Debug, Clone, Default)]
pub struct PlanRegistry {
    plans: BTreeMap<String, Plan>,
}

impl PlanRegistry {
    /// Register (or replace) a plan.
    pub fn register(&mut self, plan: Plan) {
        self.plans.insert(plan.workflow_type().to_string(), plan);
    }
    /// Look up a plan.
    pub fn get(&self, workflow_type: &str) -> Result<&Plan> {
        self.plans.get(workflow_type).ok_or_else(|| Error::UnregisteredType(workflow_type.to_string()))
    }
}

/// Definitions by type (worker side).
#[derive(Debug, Clone, Default)]
pub struct DefinitionRegistry {
    defs: BTreeMap<String, Arc<Definition>>,
}

impl DefinitionRegistry {
    /// Register a definition; a second one for the same type is an error.
    pub fn register(&mut self, def: Definition) -> Result<()> {
        let t = def.workflow_type().to_string();
        if self.defs.contains_key(&t) {
            return Err(Error::invalid("workflow_type", format_args!("`{t}` is already registered")));
        }
        self.defs.insert(t, Arc::new(def));
        Ok(())
    }
    /// Look up a definition.
    pub fn get(&self, workflow_type: &str) -> Option<&Arc<Definition>> {
        self.defs.get(workflow_type)
    }
    /// Registered types, sorted.
    pub fn types(&self) -> Vec<String> {
        self.defs.keys().cloned().collect()
    }
    /// All plans (for a publisher in the same process).
    pub fn plans(&self) -> PlanRegistry {
        let mut r = PlanRegistry::default();
        for d in self.defs.values() {
            r.register(d.plan().clone());
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(t: &str, steps: &[(&str, Option<&[&str]>)]) -> Result<Plan> {
        let v: Vec<(String, Option<Vec<String>>)> =
            steps.iter().map(|(n, d)| (n.to_string(), d.map(|d| d.iter().map(|s| s.to_string()).collect()))).collect();
        Plan::new(t, &v)
    }

    /// Golden values: a change here is a change of the persisted protocol (K-4.2). They
    /// were cross-checked with an independent Python `hashlib` implementation of the
    /// encoding documented on [`fingerprint`].
    #[test]
    fn fingerprint_golden_values() {
        let linear =
            plan("live_summary", &[("preprocess", None), ("transcribe", None), ("compose", None), ("finalize", None)])
                .unwrap();
        assert_eq!(linear.fingerprint(), "6f77bb7b30b9dcdd5589a3f5cba19a9f5011b04e79d08845be105ae6e0dd4319");
        let dag = plan(
            "dag",
            &[
                ("fetch", None),
                ("left", Some(&["fetch"])),
                ("right", Some(&["fetch"])),
                ("join", Some(&["right", "left"])),
            ],
        )
        .unwrap();
        assert_eq!(dag.fingerprint(), "cd781fcd8c58f0dcccaf933c5a4978acd8ab94388975edbdae6a95bef5a29b9a");
    }

    /// K-17.2 amendment, K-4.2: a step's outcome authority is its activity's unless the
    /// step overrides it, and it is policy — the same definition with and without it has
    /// the golden fingerprint, so declaring it parks no instance in flight.
    #[test]
    fn outcome_authority_comes_from_the_activity_and_leaves_the_fingerprint_alone() {
        struct Reserved;
        #[async_trait::async_trait]
        impl Activity for Reserved {
            async fn run(
                &self,
                _: crate::ActivityContext,
            ) -> std::result::Result<crate::StepOutcome, crate::ActivityError> {
                Ok(crate::StepOutcome::complete(Value::Null))
            }
            fn outcome_authority(&self) -> OutcomeAuthority {
                OutcomeAuthority::ActivityOnly
            }
        }
        let plain = |_: crate::ActivityContext| async { Ok(crate::StepOutcome::complete(Value::Null)) };
        assert_eq!(StepDef::new("a", plain).get_outcome_authority(), OutcomeAuthority::ActivityOrOperator);
        assert_eq!(StepDef::new("a", Reserved).get_outcome_authority(), OutcomeAuthority::ActivityOnly);
        let overridden = StepDef::new("a", plain).outcome_authority(OutcomeAuthority::ActivityOnly);
        assert_eq!(overridden.get_outcome_authority(), OutcomeAuthority::ActivityOnly);
        let names = ["preprocess", "transcribe", "compose", "finalize"];
        let def = |reserved: bool| {
            let mut b = Definition::builder("live_summary");
            for n in names {
                let s = StepDef::new(n, plain);
                b = b.step(if reserved { s.outcome_authority(OutcomeAuthority::ActivityOnly) } else { s });
            }
            b.build().unwrap()
        };
        let golden = "6f77bb7b30b9dcdd5589a3f5cba19a9f5011b04e79d08845be105ae6e0dd4319";
        assert_eq!((def(false).plan().fingerprint(), def(true).plan().fingerprint()), (golden, golden));
    }

    #[test]
    fn fingerprint_ignores_dep_order_and_counts_implicit_deps() {
        let a = plan("t", &[("a", None), ("b", Some(&[])), ("c", Some(&["a", "b"]))]).unwrap();
        let b = plan("t", &[("a", None), ("b", Some(&[])), ("c", Some(&["b", "a"]))]).unwrap();
        assert_eq!(a.fingerprint(), b.fingerprint());
        let implicit = plan("t", &[("a", None), ("b", None)]).unwrap();
        let explicit = plan("t", &[("a", None), ("b", Some(&["a"]))]).unwrap();
        assert_eq!(implicit.fingerprint(), explicit.fingerprint());
        let root = plan("t", &[("a", None), ("b", Some(&[]))]).unwrap();
        assert_ne!(implicit.fingerprint(), root.fingerprint());
        // Length prefixes make "ab"+"c" differ from "a"+"bc".
        let x = plan("t", &[("ab", None), ("c", None)]).unwrap();
        let y = plan("t", &[("a", None), ("bc", None)]).unwrap();
        assert_ne!(x.fingerprint(), y.fingerprint());
    }

    #[test]
    fn plan_rejects_bad_shapes() {
        assert!(matches!(plan("t", &[("a", None), ("a", None)]), Err(Error::InvalidInput { .. })));
        assert!(matches!(plan("t", &[("a", Some(&["zz"]))]), Err(Error::InvalidInput { .. })));
        assert!(matches!(plan("t", &[("a", Some(&["b"])), ("b", Some(&["a"]))]), Err(Error::InvalidInput { .. })));
        assert!(matches!(plan("t", &[("a", Some(&["a"]))]), Err(Error::InvalidInput { .. })));
        assert!(matches!(plan("t", &[("$a", None)]), Err(Error::InvalidInput { .. })));
        assert!(matches!(plan("t", &[("a.b", None)]), Err(Error::InvalidInput { .. })));
        assert!(matches!(plan("", &[("a", None)]), Err(Error::InvalidInput { .. })));
        assert!(matches!(plan("t", &[]), Err(Error::InvalidInput { .. })));
    }

    fn st(statuses: &[StepStatus]) -> Vec<Step> {
        statuses.iter().enumerate().map(|(i, s)| Step { status: *s, ..Step::pending(format!("s{i}")) }).collect()
    }

    fn check(p: &Plan, statuses: &[StepStatus], expect: &[usize]) {
        assert_eq!(p.ready(&st(statuses)), expect, "statuses {statuses:?}");
    }

    #[test]
    fn readiness_linear_and_dag() {
        use StepStatus::*;
        let lin = plan("t", &[("s0", None), ("s1", None), ("s2", None)]).unwrap();
        check(&lin, &[Pending, Pending, Pending], &[0]);
        check(&lin, &[Completed, Pending, Pending], &[1]);
        check(&lin, &[Completed, Running, Pending], &[1]);
        check(&lin, &[Completed, Waiting, Pending], &[]);
        check(&lin, &[Completed, Failed, Pending], &[]);
        check(&lin, &[Skipped, Completed, Pending], &[2]);
        check(&lin, &[Completed, Completed, Completed], &[]);
        // Diamond: s0 → {s1, s2} → s3
        let dag = plan("t", &[("s0", None), ("s1", Some(&["s0"])), ("s2", Some(&["s0"])), ("s3", Some(&["s1", "s2"]))])
            .unwrap();
        check(&dag, &[Pending, Pending, Pending, Pending], &[0]);
        check(&dag, &[Completed, Pending, Pending, Pending], &[1, 2]);
        check(&dag, &[Completed, Completed, Running, Pending], &[2]);
        check(&dag, &[Completed, Completed, Skipped, Pending], &[3]);
        // Two roots run in the first wave.
        let roots = plan("t", &[("s0", Some(&[])), ("s1", Some(&[])), ("s2", Some(&["s0", "s1"]))]).unwrap();
        check(&roots, &[Pending, Pending, Pending], &[0, 1]);
    }

    #[test]
    fn retry_policy_bounds() {
        let p = RetryPolicy::Exponential {
            base_ms: DurationMs::from_millis(1000),
            cap_ms: DurationMs::from_millis(60_000),
        };
        for a in 1..40 {
            for r in [0u64, 1, 12345, u64::MAX] {
                let d = p.delay_ms(a, r).as_millis();
                let ceiling = (1000i64 << (a - 1).min(30)).min(60_000);
                assert!((0..=ceiling).contains(&d), "attempt {a}: {d}");
            }
        }
        assert_eq!(RetryPolicy::Immediate.delay_ms(3, 99), 0);
    }
}
