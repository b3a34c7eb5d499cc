//! Human-task steps (K-17.5): a person approves, rejects, escalates or cancels; a timeout
//! never approves.
//!
//! [`HumanTask`] is an [`Activity`]: its first invocation opens a task record in the
//! [`TaskInbox`](kernel_core::ports::TaskInbox) (id: the step's idempotency key and the escalation level; an unguessable
//! token) and waits on the signal [`HUMAN_TASK_SIGNAL`] with a poll fallback at the next
//! reminder or the SLA deadline — a durable timer, so no worker is held while a person
//! thinks. [`TaskDesk`] is the other side: it lists the open tasks an actor may decide,
//! fetches one with its evidence, and decides it with the token — the decision is stored on
//! the record first, then the signal rings, so a decision made before the workflow reached
//! its wait is not lost (K-9.3): the step reads the record whenever it runs.
//!
//! Past the SLA deadline without a decision the step takes its SLA path, whose outcome
//! type [`SlaOutcome`] has no approve variant: escalate to the next level of the
//! escalation path (a new record, a new token), reject or cancel. A decision made at or
//! after the deadline is refused by the inbox ([`TaskDecideOutcome::PastDeadline`]).
//!
//! Only approval completes the step (K-17.5 amended): a task that concludes otherwise — a
//! person's reject, cancel or escalation past the last level, or any SLA outcome — fails
//! its step with the permanent error `not approved: <outcome>`, so its dependents do not
//! run and the step's `on_failed` policy decides what follows (stop, skip, dead letter).
//! A definition that routes the outcome itself declares it with
//! [`HumanTaskBuilder::routes_outcomes`]: then every conclusion completes the step and a
//! dependent's branch condition (`.when`) reads it. The step's output is a
//! [`HumanResult`]; a sensitive reason is never in it (nor in logs, observations or the
//! stream) — only on the task record, where [`TaskDesk::purge_sensitive_reasons`] removes
//! it after retention while the decision stays.
//!
//! ```
//! use kernel_tasks::{HumanTask, Level, SlaOutcome};
//! use kernel_core::domain::DurationMs;
//! # fn inbox() -> std::sync::Arc<kernel_core::ports::DynTaskInbox> { unimplemented!() }
//! # fn build() -> kernel_core::Result<HumanTask> {
//! let approve = HumanTask::builder("Approve the invoice")
//!     .level(Level::roles(["finance"]).sla(DurationMs::from_millis(4 * 3_600_000)))
//!     .level(Level::assignee("cfo").sla(DurationMs::from_millis(24 * 3_600_000)))
//!     .reminders([DurationMs::from_millis(3_600_000)])
//!     .on_sla(SlaOutcome::Escalate)
//!     .build(inbox())?;
//! # Ok(approve) }
//! ```

use kernel_core::activity::{Activity, ActivityContext, ActivityError, StepOutcome};
use kernel_core::domain::{DurationMs, Instant};
use kernel_core::error::{Error, Result};
use kernel_core::ports::{
    task_decision_refused, validate_task_decide, validate_task_list, validate_task_purge, Actor, Clock, DynIds,
    DynTaskInbox, Evidence, Signal, SignalSender, TaskCloseOutcome, TaskDecideOutcome, TaskDecision, TaskOutcome,
    TaskReason, TaskRecord, TaskStatus, TASK_EVIDENCE_MAX,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;

/// The signal type a decision rings; the wait key is the task id.
pub const HUMAN_TASK_SIGNAL: &str = "kernel.human_task";
/// Most levels of an escalation path.
pub const ESCALATION_LEVELS_MAX: usize = 8;
/// Most reminders per level.
pub const REMINDERS_MAX: usize = 16;

/// What the SLA path of a human-task step may conclude when nobody decided in time. It has
/// no approve variant, so no configuration and no code path can turn a timeout into an
/// approval:
///
/// ```compile_fail
/// use kernel_tasks::SlaOutcome;
/// let _ = SlaOutcome::Approve; // there is no such variant: a timeout never approves
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SlaOutcome {
    /// Hand the task to the next level of the escalation path (past the last level the
    /// task concludes `escalate`, which fails the step unless its outcome is routed, see
    /// [`HumanTaskBuilder::routes_outcomes`]).
    Escalate,
    /// Conclude with a rejection.
    Reject,
    /// Conclude with a cancellation.
    Cancel,
}

impl SlaOutcome {
    /// The outcome a step records for it; never [`TaskOutcome::Approve`].
    pub fn outcome(self) -> TaskOutcome {
        match self {
            SlaOutcome::Escalate => TaskOutcome::Escalate,
            SlaOutcome::Reject => TaskOutcome::Reject,
            SlaOutcome::Cancel => TaskOutcome::Cancel,
        }
    }
}

/// How a human-task step concluded. Approval exists only on the person's side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "by")]
pub enum Concluded {
    /// A person decided.
    Person {
        /// What they decided.
        outcome: TaskOutcome,
        /// Who.
        actor: String,
        /// When.
        decided_at: Instant,
        /// Their reason: the text unless it is sensitive (then only `sensitive: true`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<TaskReason>,
    },
    /// Nobody decided within the SLA of the last level the path allowed.
    Sla {
        /// What the SLA path concluded.
        outcome: SlaOutcome,
        /// When the deadline was found passed.
        at: Instant,
    },
}

/// The output of a human-task step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HumanResult {
    /// The id of the task record that concluded (the last level's).
    pub task: String,
    /// Its escalation level.
    pub level: u32,
    /// How.
    pub concluded: Concluded,
}

impl HumanResult {
    /// Read a step's recorded output.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when `output` is not a human-task result.
    pub fn from_output(output: &Value) -> Result<HumanResult> {
        serde_json::from_value(output.clone())
            .map_err(|e| Error::invalid("output", format_args!("not a human-task result: {e}")))
    }

    /// Whether a person approved. Nothing else approves.
    pub fn approved(&self) -> bool {
        matches!(self.concluded, Concluded::Person { outcome: TaskOutcome::Approve, .. })
    }

    /// The outcome, whoever concluded.
    pub fn outcome(&self) -> TaskOutcome {
        match &self.concluded {
            Concluded::Person { outcome, .. } => *outcome,
            Concluded::Sla { outcome, .. } => outcome.outcome(),
        }
    }
}

/// One level of an escalation path: who may decide and how long they have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Level {
    assignee: Option<String>,
    roles: Vec<String>,
    sla: DurationMs,
}

impl Level {
    /// Anyone holding one of `roles` may decide.
    pub fn roles(roles: impl IntoIterator<Item = impl Into<String>>) -> Level {
        Level {
            assignee: None,
            roles: roles.into_iter().map(Into::into).collect(),
            sla: DurationMs::from_millis(86_400_000),
        }
    }
    /// Only `actor` may decide.
    pub fn assignee(actor: impl Into<String>) -> Level {
        Level { assignee: Some(actor.into()), roles: Vec::new(), sla: DurationMs::from_millis(86_400_000) }
    }
    /// Also anyone holding one of `roles`.
    pub fn or_roles(mut self, roles: impl IntoIterator<Item = impl Into<String>>) -> Level {
        self.roles.extend(roles.into_iter().map(Into::into));
        self
    }
    /// The time to decide from the task's opening (default 24 h).
    pub fn sla(mut self, sla: DurationMs) -> Level {
        self.sla = sla;
        self
    }
}

/// What a [`Notifier`] is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// The task was opened (once per record, again only after a failed notice or a crash).
    Opened,
    /// The n-th reminder (from 1) of the task is due.
    Reminder(u32),
}

/// Tells people about tasks (mail, chat). At least once: a notice may repeat after a crash.
#[async_trait::async_trait]
pub trait Notifier: Send + Sync + 'static {
    /// Tell the task's eligible people. An error ends the invocation as a transient
    /// error: the step retries it as its retry policy allows (give it `max_retry`).
    async fn notify(&self, task: &TaskRecord, notice: Notice) -> std::result::Result<(), ActivityError>;
}

type TextFn = Arc<dyn Fn(&ActivityContext) -> String + Send + Sync>;
type EvidenceFn = Arc<dyn Fn(&ActivityContext) -> Vec<Evidence> + Send + Sync>;

/// Builder of a [`HumanTask`], from [`HumanTask::builder`].
#[must_use = "a builder does nothing until `build`"]
pub struct HumanTaskBuilder {
    title: TextFn,
    levels: Vec<Level>,
    evidence: EvidenceFn,
    reminders: Vec<DurationMs>,
    on_sla: SlaOutcome,
    ids: Option<Arc<DynIds>>,
    notifier: Option<Arc<dyn Notifier>>,
    routes_outcomes: bool,
}

impl HumanTaskBuilder {
    /// The title from the step's context (default: the fixed title given to `builder`).
    pub fn title_from(mut self, f: impl Fn(&ActivityContext) -> String + Send + Sync + 'static) -> Self {
        self.title = Arc::new(f);
        self
    }
    /// Add a level of the escalation path (the first is the initial assignment).
    pub fn level(mut self, level: Level) -> Self {
        self.levels.push(level);
        self
    }
    /// The evidence the reviewer sees, from the step's context (references, not documents).
    pub fn evidence(mut self, f: impl Fn(&ActivityContext) -> Vec<Evidence> + Send + Sync + 'static) -> Self {
        self.evidence = Arc::new(f);
        self
    }
    /// Reminder offsets from each task's opening, each before the level's SLA.
    pub fn reminders(mut self, offsets: impl IntoIterator<Item = DurationMs>) -> Self {
        self.reminders = offsets.into_iter().collect();
        self
    }
    /// What a missed SLA does (default [`SlaOutcome::Escalate`]).
    pub fn on_sla(mut self, outcome: SlaOutcome) -> Self {
        self.on_sla = outcome;
        self
    }
    /// Where tokens come from: by default [`secure_token`] (the operating system's secure
    /// source); tests pass a seeded generator to replay exactly.
    pub fn ids(mut self, ids: Arc<DynIds>) -> Self {
        self.ids = Some(ids);
        self
    }
    /// Who tells people about opened tasks and reminders (default: nobody).
    pub fn notifier(mut self, n: Arc<dyn Notifier>) -> Self {
        self.notifier = Some(n);
        self
    }
    /// The definition routes this task's outcome itself: every conclusion — approve,
    /// reject, cancel, escalate — completes the step with its [`HumanResult`], for the
    /// dependents' branch conditions (`StepDef::when`) to read.
    ///
    /// Without it (the default, K-17.5 amended) only an approval completes the step; any
    /// other conclusion fails it permanently with `not approved: <outcome>`, so no
    /// dependent runs unless the step's `on_failed` policy says so. Declare it only when
    /// every dependent that must not run without an approval has a condition that reads
    /// this step's outcome (e.g. [`HumanResult::approved`]): a dependent without one runs
    /// after a rejection, and so does a dependent of a skipped conditional step (a skipped
    /// step satisfies its dependents).
    pub fn routes_outcomes(mut self) -> Self {
        self.routes_outcomes = true;
        self
    }

    /// The step's activity.
    ///
    /// # Errors
    /// [`Error::InvalidInput`]: no level or more than [`ESCALATION_LEVELS_MAX`], a level
    /// nobody could decide (no assignee, no role) or with a bad identifier, an SLA that is
    /// not positive, more than [`REMINDERS_MAX`] reminders or one not positive, reminders
    /// out of order.
    pub fn build(self, inbox: Arc<DynTaskInbox>) -> Result<HumanTask> {
        if self.levels.is_empty() || self.levels.len() > ESCALATION_LEVELS_MAX {
            return Err(Error::invalid(
                "levels",
                format_args!("{} levels; a human task has 1..={ESCALATION_LEVELS_MAX}", self.levels.len()),
            ));
        }
        for (i, l) in self.levels.iter().enumerate() {
            let probe = Actor { id: l.assignee.clone().unwrap_or_else(|| "nobody".into()), roles: l.roles.clone() };
            probe.validate().map_err(|e| Error::invalid(format!("levels[{i}]"), e))?;
            if l.assignee.is_none() && l.roles.is_empty() {
                return Err(Error::invalid(format!("levels[{i}]"), "no assignee and no role: nobody could decide"));
            }
            if l.sla <= DurationMs::ZERO {
                return Err(Error::invalid(format!("levels[{i}].sla"), "must be positive"));
            }
        }
        if self.reminders.len() > REMINDERS_MAX {
            return Err(Error::invalid(
                "reminders",
                format_args!("{} reminders exceed the limit of {REMINDERS_MAX}", self.reminders.len()),
            ));
        }
        if self.reminders.iter().any(|r| *r <= DurationMs::ZERO) || self.reminders.windows(2).any(|w| w[0] >= w[1]) {
            return Err(Error::invalid("reminders", "offsets must be positive and increasing"));
        }
        Ok(HumanTask {
            title: self.title,
            levels: self.levels,
            evidence: self.evidence,
            reminders: self.reminders,
            on_sla: self.on_sla,
            ids: self.ids,
            notifier: self.notifier,
            routes_outcomes: self.routes_outcomes,
            inbox,
        })
    }
}

/// A human-task step's activity (K-17.5); see the [module docs](self).
pub struct HumanTask {
    title: TextFn,
    levels: Vec<Level>,
    evidence: EvidenceFn,
    reminders: Vec<DurationMs>,
    on_sla: SlaOutcome,
    ids: Option<Arc<DynIds>>,
    notifier: Option<Arc<dyn Notifier>>,
    routes_outcomes: bool,
    inbox: Arc<DynTaskInbox>,
}

impl std::fmt::Debug for HumanTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HumanTask")
            .field("levels", &self.levels)
            .field("on_sla", &self.on_sla)
            .field("routes_outcomes", &self.routes_outcomes)
            .finish()
    }
}

/// What a human-task step keeps in its checkpoint between waits.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
struct Progress {
    level: u32,
    reminders: u32,
    /// The `Opened` notice of this level went out (kept with the wait, so a notice that
    /// failed is sent again when the step is retried: at least once).
    #[serde(default)]
    opened: bool,
}

/// 128 bits from the operating system's secure random source, in hex: a task token no one
/// can guess (the default of [`HumanTaskBuilder::ids`]); the id port's
/// [`os_task_token`](kernel_core::ports::os_task_token).
///
/// # Errors
/// [`Error::Unavailable`] when the source cannot be read.
pub fn secure_token() -> Result<String> {
    kernel_core::ports::os_task_token()
}

pub use kernel_core::ports::task_id;

fn transient(what: &str, e: Error) -> ActivityError {
    ActivityError::transient(format!("task inbox: {what}: {e}"))
}

impl HumanTask {
    /// Start a human task titled `title`; add at least one [`Level`].
    pub fn builder(title: impl Into<String>) -> HumanTaskBuilder {
        let title: String = title.into();
        HumanTaskBuilder {
            title: Arc::new(move |_| title.clone()),
            levels: Vec::new(),
            evidence: Arc::new(|_| Vec::new()),
            reminders: Vec::new(),
            on_sla: SlaOutcome::Escalate,
            ids: None,
            notifier: None,
            routes_outcomes: false,
        }
    }

    fn conclude(&self, task: &TaskRecord, concluded: Concluded) -> Result<StepOutcome, ActivityError> {
        step_end(HumanResult { task: task.id.clone(), level: task.level, concluded }, self.routes_outcomes)
    }

    fn by_person(d: &TaskDecision) -> Concluded {
        Concluded::Person {
            outcome: d.outcome,
            actor: d.actor.clone(),
            decided_at: d.decided_at,
            // A sensitive reason stays on the task record only.
            reason: d.reason.as_ref().map(|r| {
                if r.sensitive {
                    TaskReason { sensitive: true, text: None }
                } else {
                    r.clone()
                }
            }),
        }
    }

    /// Open (or find) the record of `level`.
    async fn open(&self, ctx: &ActivityContext, level: u32) -> Result<TaskRecord, ActivityError> {
        let l = &self.levels[level as usize];
        let now = ctx.now();
        let mut evidence = (self.evidence)(ctx);
        evidence.truncate(TASK_EVIDENCE_MAX);
        let fresh = TaskRecord {
            id: task_id(&ctx.idempotency_key(), level),
            workflow_id: ctx.workflow_id().into(),
            workflow_type: ctx.workflow_type().to_string(),
            step: ctx.step_name().to_string(),
            level,
            title: (self.title)(ctx),
            assignee: l.assignee.clone(),
            roles: l.roles.clone(),
            evidence,
            token: match &self.ids {
                Some(ids) => format!("{}{:016x}", ids.new_token(), ids.random_u64()),
                None => secure_token().map_err(|e| ActivityError::transient(format!("task token: {e}")))?,
            },
            created_at: now,
            due_at: now
                .checked_add(l.sla)
                .ok_or_else(|| ActivityError::permanent("the SLA deadline is past the range of time"))?,
            status: TaskStatus::Open,
            decision: None,
            closed_at: None,
        };
        match self.inbox.open(&fresh).await {
            Ok(None) => Ok(fresh),
            Ok(Some(stored)) => Ok(stored),
            Err(e @ Error::InvalidInput { .. }) => Err(ActivityError::permanent(format!("human task refused: {e}"))),
            Err(e) => Err(transient("open", e)),
        }
    }
}

#[async_trait::async_trait]
impl Activity for HumanTask {
    /// A human task's outcome comes only from an eligible person or its SLA path (K-17.2).
    fn outcome_authority(&self) -> kernel_core::OutcomeAuthority {
        kernel_core::OutcomeAuthority::ActivityOnly
    }

    async fn run(&self, ctx: ActivityContext) -> Result<StepOutcome, ActivityError> {
        let mut p: Progress = ctx.checkpoint().and_then(|c| serde_json::from_value(c.clone()).ok()).unwrap_or_default();
        loop {
            if p.level as usize >= self.levels.len() {
                return Err(ActivityError::permanent(format!("escalation level {} is past the path", p.level)));
            }
            let task = self.open(&ctx, p.level).await?;
            let now = ctx.now();
            let decision = match task.status {
                TaskStatus::Decided => {
                    match self.inbox.close(&task.id, now).await.map_err(|e| transient("close", e))? {
                        TaskCloseOutcome::Closed(d) => d.or(task.decision.clone()),
                        TaskCloseOutcome::AlreadyClosed | TaskCloseOutcome::NotFound => task.decision.clone(),
                    }
                }
                TaskStatus::Closed => task.decision.clone(),
                TaskStatus::Open if now >= task.due_at => {
                    // The SLA path closes the task first: a decision stored before wins.
                    match self.inbox.close(&task.id, now).await.map_err(|e| transient("close", e))? {
                        TaskCloseOutcome::Closed(d) => d,
                        TaskCloseOutcome::AlreadyClosed | TaskCloseOutcome::NotFound => {
                            self.inbox.get(&task.id).await.map_err(|e| transient("get", e))?.and_then(|t| t.decision)
                        }
                    }
                }
                TaskStatus::Open => {
                    if !p.opened {
                        if let Some(n) = &self.notifier {
                            n.notify(&task, Notice::Opened).await?;
                        }
                        p.opened = true;
                    }
                    let offsets = &self.reminders;
                    while let Some(off) = offsets.get(p.reminders as usize) {
                        if now < task.created_at.saturating_add(*off) {
                            break;
                        }
                        p.reminders += 1;
                        if let Some(n) = &self.notifier {
                            n.notify(&task, Notice::Reminder(p.reminders)).await?;
                        }
                    }
                    let next = offsets
                        .get(p.reminders as usize)
                        .map(|off| task.created_at.saturating_add(*off))
                        .map_or(task.due_at, |r| r.min(task.due_at));
                    let wait = (next - now).max(DurationMs::from_millis(1));
                    return Ok(StepOutcome::wait_for_signal(HUMAN_TASK_SIGNAL, task.id.clone())
                        .poll_after_ms(wait)
                        .checkpoint(serde_json::to_value(p).unwrap_or(Value::Null))
                        .into());
                }
            };
            let next_level = p.level as usize + 1 < self.levels.len();
            match decision {
                Some(d) if d.outcome == TaskOutcome::Escalate && next_level => {}
                Some(d) => return self.conclude(&task, Self::by_person(&d)),
                // Closed without a decision: the SLA passed (here or before a crash).
                None if self.on_sla == SlaOutcome::Escalate && next_level => {}
                None => {
                    let at = task.closed_at.unwrap_or(now);
                    return self.conclude(&task, Concluded::Sla { outcome: self.on_sla, at });
                }
            }
            p = Progress { level: p.level + 1, reminders: 0, opened: false };
        }
    }
}

/// How a concluded task ends its step (K-17.5 amended): an approval completes it with the
/// [`HumanResult`]; any other conclusion completes it only when the definition routes the
/// outcome ([`HumanTaskBuilder::routes_outcomes`]), else fails it with the permanent error
/// `not approved: <outcome> (<who>, task <id>)`, which the step's `on_failed` policy handles.
/// A pure function of its inputs, so a re-run after a crash ends the step the same way.
fn step_end(result: HumanResult, routes_outcomes: bool) -> Result<StepOutcome, ActivityError> {
    if !result.approved() && !routes_outcomes {
        let by = match &result.concluded {
            Concluded::Person { actor, .. } => format!("decided by {actor}"),
            Concluded::Sla { .. } => "the SLA path".to_string(),
        };
        return Err(ActivityError::permanent(format!(
            "not approved: {} ({by}, task {})",
            result.outcome().as_str(),
            result.task
        )));
    }
    serde_json::to_value(result)
        .map(StepOutcome::complete)
        .map_err(|e| ActivityError::permanent(format!("human-task result: {e}")))
}

type Rule = Arc<dyn Fn(&Actor, &TaskRecord) -> bool + Send + Sync>;

/// The people's side of human tasks: list, fetch, decide (K-17.5). Cheap to clone.
#[derive(Clone)]
pub struct TaskDesk {
    inbox: Arc<DynTaskInbox>,
    signals: SignalSender,
    clock: Arc<dyn Clock>,
    rules: HashMap<(String, String), Rule>,
    store: Option<Arc<kernel_core::ports::DynStore>>,
}

impl std::fmt::Debug for TaskDesk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskDesk").field("rules", &self.rules.len()).finish()
    }
}

/// Largest page of [`TaskDesk::open_tasks`] (the inbox's page bound).
pub use kernel_core::ports::TASK_LIST_MAX as DESK_PAGE_MAX;

impl TaskDesk {
    /// A desk over `inbox` that rings decisions through `signals`
    /// ([`Engine::signal_sender`](kernel_core::engine::Engine::signal_sender), or
    /// [`Publisher::signal_sender`](kernel_core::engine::Publisher::signal_sender) in a process
    /// without an engine).
    pub fn new(inbox: Arc<DynTaskInbox>, signals: SignalSender, clock: Arc<dyn Clock>) -> TaskDesk {
        TaskDesk { inbox, signals, clock, rules: HashMap::new(), store: None }
    }

    /// Check each task against its workflow before listing or deciding it: a task whose
    /// workflow ended, or whose step moved on (a replay, a regenerate or a loop started
    /// another logical attempt), is stale — closed on the spot and refused as
    /// [`TaskDecideOutcome::Closed`], never listed. One instance read per task looked at.
    pub fn with_store(mut self, store: Arc<kernel_core::ports::DynStore>) -> TaskDesk {
        self.store = Some(store);
        self
    }

    /// Whether `t` is stale (see [`with_store`](Self::with_store)); closes it if so.
    async fn stale(&self, t: &TaskRecord) -> Result<bool> {
        let Some(store) = &self.store else { return Ok(false) };
        let live = match store.get(&t.workflow_id).await? {
            Some(i) if !i.status.is_terminal() => i.steps.iter().find(|s| s.name == t.step).is_some_and(|s| {
                let key =
                    kernel_core::activity::idempotency_key_at(t.workflow_id.as_str(), &s.name, i.retry_count, s.epoch);
                task_id(&key, t.level) == t.id
            }),
            _ => false,
        };
        if !live {
            self.inbox.close(&t.id, self.clock.now()).await?;
        }
        Ok(!live)
    }

    /// An eligibility predicate over the actor for the tasks of `step` in `workflow_type`,
    /// on top of the task's assignee and roles (both must hold).
    pub fn rule(
        mut self,
        workflow_type: impl Into<String>,
        step: impl Into<String>,
        pred: impl Fn(&Actor, &TaskRecord) -> bool + Send + Sync + 'static,
    ) -> TaskDesk {
        self.rules.insert((workflow_type.into(), step.into()), Arc::new(pred));
        self
    }

    fn allowed(&self, actor: &Actor, t: &TaskRecord) -> bool {
        t.eligible(actor)
            && self.rules.get(&(t.workflow_type.clone(), t.step.clone())).is_none_or(|rule| rule(actor, t))
    }

    /// A page of the open tasks `actor` may decide, ordered by id (see
    /// [`TaskInbox::list_open`](kernel_core::ports::TaskInbox::list_open)); the desk's rules are
    /// applied too, so a page may hold fewer than `limit` tasks — go on from the last id
    /// the inbox returned, which is the second value.
    pub async fn open_tasks(
        &self,
        actor: &Actor,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<TaskRecord>, Option<String>)> {
        validate_task_list(actor, after, limit)?;
        let page = self.inbox.list_open(actor, after, limit).await?;
        let last = (page.len() == limit).then(|| page.last().map(|t| t.id.clone())).flatten();
        let mut open = Vec::with_capacity(page.len());
        for t in page.into_iter().filter(|t| self.allowed(actor, t)) {
            if !self.stale(&t).await? {
                open.push(t);
            }
        }
        Ok((open, last))
    }

    /// One task with its evidence, for an actor who may decide it; `None` when absent or
    /// when the actor may not see it.
    pub async fn task(&self, id: &str, actor: &Actor) -> Result<Option<TaskRecord>> {
        actor.validate()?;
        Ok(self.inbox.get(id).await?.filter(|t| self.allowed(actor, t)))
    }

    /// Decide a task with its token. Every refusal is a [`TaskDecideOutcome`] and changes
    /// nothing: absent, closed, already decided (a reused token), wrong token, a decision
    /// naming another actor, an ineligible actor (assignee/roles, then the desk's rule),
    /// and a decision at or after the task's SLA deadline by this desk's clock
    /// ([`TaskDecideOutcome::PastDeadline`], K-17.5 amended: refused whether or not a
    /// worker has taken the step's SLA poll; the step's SLA path concludes the task).
    /// On `Decided` the signal rings; if it cannot, the decision stays stored and the step
    /// takes it at its next poll (a reminder or the SLA deadline) — the ring error is
    /// logged, not returned, because the decision happened.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for bad ids, actor or reason; the inbox's errors.
    pub async fn decide(
        &self,
        id: &str,
        token: &str,
        actor: &Actor,
        outcome: TaskOutcome,
        reason: Option<TaskReason>,
    ) -> Result<TaskDecideOutcome> {
        let decision = TaskDecision { outcome, actor: actor.id.clone(), reason, decided_at: self.clock.now() };
        validate_task_decide(id, token, actor, &decision)?;
        let found = self.inbox.get(id).await?;
        if let Some(refused) = task_decision_refused(found.as_ref(), token, actor, &decision)? {
            return Ok(refused);
        }
        let task = found.expect("a task not refused exists");
        if !self.allowed(actor, &task) {
            return Ok(TaskDecideOutcome::NotEligible);
        }
        if self.stale(&task).await? {
            return Ok(TaskDecideOutcome::Closed);
        }
        let out = self.inbox.decide(id, token, actor, &decision).await?;
        if out == TaskDecideOutcome::Decided {
            if let Err(e) = self.ring(&task).await {
                // Never the reason: it may be sensitive.
                tracing::warn!(task = %task.id, error = %e, "decision stored; its signal did not ring (taken at the next poll)");
            }
        }
        Ok(out)
    }

    /// Ring the signal of a decided task again (idempotent: the same signal id).
    pub async fn ring(&self, task: &TaskRecord) -> Result<()> {
        let signal_id = kernel_core::validate::bounded_identifier(format!("{}|decided", task.id));
        let s = Signal::builder(task.workflow_id.clone(), HUMAN_TASK_SIGNAL)
            .wait_key(task.id.clone())
            .signal_id(signal_id)
            .build()?;
        self.signals.deliver(s).await.map(|_| ())
    }

    /// Retention of sensitive reasons: remove the text of those decided more than
    /// `retention` ago, at most `limit`; the decisions stay. Returns how many.
    pub async fn purge_sensitive_reasons(&self, retention: DurationMs, limit: usize) -> Result<u64> {
        validate_task_purge(limit)?;
        self.inbox.purge_sensitive_reasons(self.clock.now().saturating_sub(retention), limit).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// K-17.5 (amended), row by row: only a person's approval completes the step; every
    /// other conclusion — a person's reject, cancel or escalation past the last level, any
    /// SLA outcome — fails it permanently with `not approved: <outcome>`, unless the
    /// definition routes the outcome, when it completes with the result for a branch to read.
    #[test]
    fn only_approval_completes_the_step_unless_the_outcome_is_routed() {
        let at = Instant::from_millis(7);
        let person = |outcome| Concluded::Person { outcome, actor: "alice".into(), decided_at: at, reason: None };
        let sla = |outcome| Concluded::Sla { outcome, at };
        let rows: Vec<(Concluded, Option<&str>)> = vec![
            (person(TaskOutcome::Approve), None),
            (person(TaskOutcome::Reject), Some("not approved: reject (decided by alice, task t|h1)")),
            (person(TaskOutcome::Cancel), Some("not approved: cancel (decided by alice, task t|h1)")),
            (person(TaskOutcome::Escalate), Some("not approved: escalate (decided by alice, task t|h1)")),
            (sla(SlaOutcome::Reject), Some("not approved: reject (the SLA path, task t|h1)")),
            (sla(SlaOutcome::Cancel), Some("not approved: cancel (the SLA path, task t|h1)")),
            (sla(SlaOutcome::Escalate), Some("not approved: escalate (the SLA path, task t|h1)")),
        ];
        for (concluded, refusal) in rows {
            let result = HumanResult { task: "t|h1".into(), level: 1, concluded: concluded.clone() };
            let completed = Ok(StepOutcome::complete(serde_json::to_value(&result).unwrap()));
            assert_eq!(step_end(result.clone(), true), completed, "routed: {concluded:?}");
            let want = match refusal {
                None => completed,
                Some(m) => Err(ActivityError::permanent(m)),
            };
            assert_eq!(step_end(result, false), want, "{concluded:?}");
        }
    }

    /// K-17.5: a default task token is 128 bits from the secure source — 32 hex digits, long
    /// enough for the inbox's check, and never the same twice.
    #[test]
    fn secure_tokens_are_long_and_fresh() {
        let tokens: std::collections::BTreeSet<String> = (0..64).map(|_| secure_token().unwrap()).collect();
        assert_eq!(tokens.len(), 64);
        for t in &tokens {
            assert_eq!(t.len(), 32);
            assert!(
                t.len() >= kernel_core::ports::TASK_TOKEN_BYTES_MIN && t.chars().all(|c| c.is_ascii_hexdigit()),
                "{t}"
            );
        }
    }
}
