//! Human tasks (K-17.5): the record store of tasks waiting for a person's decision.
//!
//! A human-task step opens one record per escalation level (the step's idempotency key
//! plus the level), then waits on a signal with a poll fallback at the SLA deadline (K-9):
//! no worker is held while a person thinks. A person lists the open tasks they may decide,
//! fetches one with its evidence and decides it with the task's token; the decision is
//! stored on the record first and a signal then wakes the workflow, so a decision that
//! arrives before the workflow reached its wait is not lost (K-9.3). This port is the
//! record store only; the step, its reminders, escalation and the SLA path are
//! [`human`](crate::human)'s.
//!
//! A reason marked sensitive lives on the task record only (the step's output, the
//! observer and the stream carry `{"sensitive": true}` in its place), so the retention purge
//! ([`TaskInbox::purge_sensitive_reasons`]) has one place to reach; the decision stays.

use super::dead_letter::text;
use crate::domain::Instant;
use crate::error::{Error, Result};
use crate::id::WorkflowId;
use crate::validate;
use serde::{Deserialize, Serialize};

/// Longest task title or reason, in bytes.
pub const TASK_TEXT_BYTES_MAX: usize = 4_096;
/// Most pieces of evidence on one task.
pub const TASK_EVIDENCE_MAX: usize = 32;
/// Most roles on a task or an actor.
pub const TASK_ROLES_MAX: usize = 32;
/// Shortest task token, in bytes: a token is a capability, it must not be guessable.
pub const TASK_TOKEN_BYTES_MIN: usize = 16;
/// Largest page of [`TaskInbox::list_open`].
pub const TASK_LIST_MAX: usize = 1_000;
/// Most records one purge call changes or deletes.
pub const TASK_PURGE_MAX: usize = 10_000;

/// Where a task stands. It only moves forward: `open → decided → closed`, or
/// `open → closed` when the workflow stops waiting without a decision (the SLA path, an
/// escalation to the next level, a canceled workflow).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    /// Waiting for a decision.
    Open,
    /// A person decided; the workflow has not taken the decision yet.
    Decided,
    /// The workflow took the decision, or stopped waiting; kept for audit until purged.
    Closed,
}

impl TaskStatus {
    /// The snake_case name used in documents and rows.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Decided => "decided",
            Self::Closed => "closed",
        }
    }
}

/// Who acts on a task: an identifier and the roles they hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actor {
    /// The person (a K-2.0 identifier).
    pub id: String,
    /// Their roles (identifiers, at most [`TASK_ROLES_MAX`]).
    #[serde(default)]
    pub roles: Vec<String>,
}

impl Actor {
    /// An actor with `roles`.
    pub fn new(id: impl Into<String>, roles: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Actor { id: id.into(), roles: roles.into_iter().map(Into::into).collect() }
    }

    /// The K-2.0 check: the id and every role follow the identifier rule, at most
    /// [`TASK_ROLES_MAX`] roles.
    pub fn validate(&self) -> Result<()> {
        let Actor { id, roles } = self;
        validate::identifier("actor.id", id)?;
        roles_ok("actor.roles", roles)
    }
}

fn roles_ok(field: &str, roles: &[String]) -> Result<()> {
    if roles.len() > TASK_ROLES_MAX {
        return Err(Error::invalid(field, format_args!("{} roles exceed the limit of {TASK_ROLES_MAX}", roles.len())));
    }
    roles.iter().try_for_each(|r| validate::identifier(field, r))
}

/// A reference the reviewer sees (a document, a link, a figure): never the document itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    /// What it is, for the reviewer (at most [`TASK_TEXT_BYTES_MAX`] bytes).
    pub label: String,
    /// Where it is (an identifier: a URL, a storage key, a step output's name).
    pub reference: String,
}

/// What a person decided. Only a person approves: the SLA path of a human-task step has
/// its own type without an approve variant (`SlaOutcome` (the `kernel-tasks` crate)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskOutcome {
    /// Go ahead.
    Approve,
    /// Do not.
    Reject,
    /// Hand the task to the next level of the escalation path.
    Escalate,
    /// Stop the work this task belongs to.
    Cancel,
}

impl TaskOutcome {
    /// The snake_case name used in documents and rows.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Approve => "approve",
            Self::Reject => "reject",
            Self::Escalate => "escalate",
            Self::Cancel => "cancel",
        }
    }
}

/// Why, as the decider wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskReason {
    /// Sensitive reasons are kept on the task record only and purged after retention.
    pub sensitive: bool,
    /// The text (at most [`TASK_TEXT_BYTES_MAX`] bytes); `None` once purged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// A person's decision on a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskDecision {
    /// What they decided.
    pub outcome: TaskOutcome,
    /// Who (a K-2.0 identifier; the adapter checks it is the deciding actor's id).
    pub actor: String,
    /// Why, if they said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<TaskReason>,
    /// When (the caller's `Clock` reading).
    pub decided_at: Instant,
}

impl TaskDecision {
    /// This decision without the text of a sensitive reason (what leaves the task record).
    pub fn redacted(&self) -> TaskDecision {
        let mut d = self.clone();
        if let Some(r) = d.reason.as_mut().filter(|r| r.sensitive) {
            r.text = None;
        }
        d
    }

    /// The K-2.0 check, called by every adapter before any I/O: `actor` follows the
    /// identifier rule, a reason's text is at most [`TASK_TEXT_BYTES_MAX`] bytes without
    /// NUL. A refusal is [`Error::InvalidInput`] and nothing is written.
    pub fn validate(&self) -> Result<()> {
        let TaskDecision { outcome: _, actor, reason, decided_at: _ } = self;
        validate::identifier("decision.actor", actor)?;
        if let Some(TaskReason { sensitive: _, text: Some(t) }) = reason {
            text("decision.reason", t, TASK_TEXT_BYTES_MAX)?;
        }
        Ok(())
    }
}

/// One human task: what a reviewer sees and what the decision needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// Unique id, a K-2.0 identifier: the step's idempotency key (K-17.1) and the
    /// escalation level, so opening again after a crash finds the same record.
    pub id: String,
    /// The workflow whose step this is.
    pub workflow_id: WorkflowId,
    /// Its type.
    pub workflow_type: String,
    /// The step's name.
    pub step: String,
    /// Escalation level: 0 for the first assignee, then one per escalation.
    pub level: u32,
    /// What to decide (at most [`TASK_TEXT_BYTES_MAX`] bytes).
    pub title: String,
    /// The one person who may decide, if the task is assigned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignee: Option<String>,
    /// Anyone holding one of these roles may decide.
    #[serde(default)]
    pub roles: Vec<String>,
    /// What the reviewer sees (at most [`TASK_EVIDENCE_MAX`] references).
    #[serde(default)]
    pub evidence: Vec<Evidence>,
    /// The capability a decision must present (at least [`TASK_TOKEN_BYTES_MIN`] bytes).
    pub token: String,
    /// When it was opened (the caller's `Clock` reading).
    pub created_at: Instant,
    /// The SLA deadline: past it the step takes its SLA path, which never approves.
    pub due_at: Instant,
    /// Where it stands.
    pub status: TaskStatus,
    /// The decision, once decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<TaskDecision>,
    /// When it was closed; retention purges by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_at: Option<Instant>,
}

impl TaskRecord {
    /// Whether `actor` may decide: they are the assignee or hold one of the roles.
    pub fn eligible(&self, actor: &Actor) -> bool {
        self.assignee.as_deref() == Some(actor.id.as_str()) || actor.roles.iter().any(|r| self.roles.contains(r))
    }

    /// The K-2.0 check of a record, called by every adapter before any I/O: ids, type,
    /// assignee, roles, evidence references and the token follow the identifier rule,
    /// `step` the key-name rule; texts are bounded and without NUL; someone can decide (an
    /// assignee or a role); the token is at least [`TASK_TOKEN_BYTES_MIN`] bytes; the
    /// deadline is not before the opening; a decision passes [`TaskDecision::validate`].
    /// A refusal is [`Error::InvalidInput`] naming the field, and nothing is written.
    ///
    /// ```
    /// use kernel_core::domain::Instant;
    /// use kernel_core::ports::{TaskRecord, TaskStatus};
    /// let mut t = TaskRecord {
    ///     id: "inv-7|approve|h0".into(), workflow_id: "inv-7".into(), workflow_type: "invoice".into(),
    ///     step: "approve".into(), level: 0, title: "Approve invoice 7 (12 400 EUR)".into(),
    ///     assignee: None, roles: vec!["finance".into()], evidence: vec![],
    ///     token: "b1e3f0c2a9d84e57".into(), created_at: Instant::ZERO,
    ///     due_at: Instant::from_millis(3_600_000), status: TaskStatus::Open, decision: None, closed_at: None,
    /// };
    /// assert!(t.validate_new().is_ok());
    /// t.roles.clear();
    /// assert!(t.validate_new().is_err(), "nobody could decide");
    /// ```
    pub fn validate(&self) -> Result<()> {
        let TaskRecord {
            id,
            workflow_id,
            workflow_type,
            step,
            level: _,
            title,
            assignee,
            roles,
            evidence,
            token,
            created_at,
            due_at,
            status: _,
            decision,
            closed_at: _,
        } = self;
        validate::identifier("id", id)?;
        validate::identifier("workflow_id", workflow_id.as_str())?;
        validate::identifier("workflow_type", workflow_type)?;
        validate::key_name("step", step)?;
        text("title", title, TASK_TEXT_BYTES_MAX)?;
        if let Some(a) = assignee {
            validate::identifier("assignee", a)?;
        }
        roles_ok("roles", roles)?;
        if assignee.is_none() && roles.is_empty() {
            return Err(Error::invalid("roles", "a task needs an assignee or at least one role: nobody could decide"));
        }
        if evidence.len() > TASK_EVIDENCE_MAX {
            return Err(Error::invalid(
                "evidence",
                format_args!("{} references exceed the limit of {TASK_EVIDENCE_MAX}", evidence.len()),
            ));
        }
        for Evidence { label, reference } in evidence {
            text("evidence.label", label, TASK_TEXT_BYTES_MAX)?;
            validate::identifier("evidence.reference", reference)?;
        }
        validate::identifier("token", token)?;
        if token.len() < TASK_TOKEN_BYTES_MIN {
            return Err(Error::invalid(
                "token",
                format_args!(
                    "{} bytes is shorter than {TASK_TOKEN_BYTES_MIN}: a token must not be guessable",
                    token.len()
                ),
            ));
        }
        if due_at < created_at {
            return Err(Error::invalid("due_at", "the SLA deadline is before the task was opened"));
        }
        if let Some(d) = decision {
            d.validate()?;
        }
        Ok(())
    }

    /// The check of [`TaskInbox::open`]: [`validate`](Self::validate), and a new record is
    /// `Open` with no decision and no `closed_at`.
    pub fn validate_new(&self) -> Result<()> {
        self.validate()?;
        if self.status != TaskStatus::Open {
            return Err(Error::invalid("status", format_args!("a new task is open, not {}", self.status.as_str())));
        }
        if self.decision.is_some() {
            return Err(Error::invalid("decision", "a new task has no decision"));
        }
        if self.closed_at.is_some() {
            return Err(Error::invalid("closed_at", "a new task is not closed"));
        }
        Ok(())
    }
}

/// What [`TaskInbox::decide`] did. Every refusal changed nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskDecideOutcome {
    /// The task was open, the token and the actor were right: the decision is stored.
    Decided,
    /// No task has that id.
    NotFound,
    /// The task is closed (decided and taken, escalated, expired or canceled).
    Closed,
    /// Another decision was stored first (returned without a sensitive reason's text) —
    /// also what a reused token gets.
    AlreadyDecided(TaskDecision),
    /// The token is not this task's (checked before anything else is said of the task).
    WrongToken,
    /// The actor is neither the assignee nor holds one of the task's roles.
    NotEligible,
    /// The decision names another actor than the one deciding.
    ActorMismatch,
    /// The decision was made at or after the task's SLA deadline (`decided_at >=
    /// due_at`): too late to count, whether or not the step has taken its SLA path yet.
    /// The step's SLA path concludes the task (K-17.5 amended); nothing was written.
    PastDeadline {
        /// The task's deadline.
        due_at: Instant,
    },
}

/// The one rule every adapter applies to a decision, from the record as read: `Some` of
/// the refusal, or `None` when the decision may be written (conditionally on the record
/// still being open with this token and due after `decided_at`). Checked in this order:
/// absent, the token, closed, decided, the decision's actor, eligibility, the deadline — so
/// a caller without the token learns nothing about the task (not whether it is closed, not
/// a stored decision, not its deadline), and a stored decision is returned without the text
/// of a sensitive reason. The fields it reads besides the status and decision never change
/// after `open`.
///
/// The deadline (K-17.5 amended): a decision with `decided_at >= due_at` is
/// [`TaskDecideOutcome::PastDeadline`], so whether a late decision counts never depends on
/// how soon a worker takes the step's SLA poll.
pub fn task_decision_refused(
    found: Option<&TaskRecord>,
    token: &str,
    actor: &Actor,
    decision: &TaskDecision,
) -> Result<Option<TaskDecideOutcome>> {
    let Some(t) = found else { return Ok(Some(TaskDecideOutcome::NotFound)) };
    if !constant_time_eq(t.token.as_bytes(), token.as_bytes()) {
        return Ok(Some(TaskDecideOutcome::WrongToken));
    }
    Ok(match (t.status, &t.decision) {
        (TaskStatus::Closed, _) => Some(TaskDecideOutcome::Closed),
        (TaskStatus::Decided, Some(d)) => Some(TaskDecideOutcome::AlreadyDecided(d.redacted())),
        (TaskStatus::Decided, None) => {
            return Err(Error::corrupt(format!("task `{}` is decided without a decision", t.id)));
        }
        (TaskStatus::Open, _) if decision.actor != actor.id => Some(TaskDecideOutcome::ActorMismatch),
        (TaskStatus::Open, _) if !t.eligible(actor) => Some(TaskDecideOutcome::NotEligible),
        (TaskStatus::Open, _) if decision.decided_at >= t.due_at => {
            Some(TaskDecideOutcome::PastDeadline { due_at: t.due_at })
        }
        (TaskStatus::Open, _) => None,
    })
}

/// Equality whose time does not depend on where two equally long byte strings differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The shared input check of [`TaskInbox::decide`]: the id and token are identifiers, the
/// actor and the decision pass their checks.
pub fn validate_task_decide(id: &str, token: &str, actor: &Actor, decision: &TaskDecision) -> Result<()> {
    validate::identifier("id", id)?;
    validate::identifier("token", token)?;
    actor.validate()?;
    decision.validate()
}

/// The shared check of a [`TaskInbox::list_open`] call: the actor, `limit` in
/// `1..=`[`TASK_LIST_MAX`], `after` an identifier.
pub fn validate_task_list(actor: &Actor, after: Option<&str>, limit: usize) -> Result<()> {
    actor.validate()?;
    validate::page(after, limit, TASK_LIST_MAX)
}

/// The shared check of a purge limit: `1..=`[`TASK_PURGE_MAX`].
pub fn validate_task_purge(limit: usize) -> Result<()> {
    validate::limit_in("limit", limit, TASK_PURGE_MAX)
}

/// What [`TaskInbox::close`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskCloseOutcome {
    /// This call closed the task; the decision it carried, if any (`None`: closed open,
    /// without a decision).
    Closed(Option<TaskDecision>),
    /// It was closed already; nothing changed.
    AlreadyClosed,
    /// No task has that id.
    NotFound,
}

/// The human-task record store (K-17.5).
///
/// # Contract
///
/// - **One record per id.** `open` inserts only when no record has the id; a record is
///   never overwritten, so opening again after a crash changes nothing and returns the
///   stored record (its token is the one that counts).
/// - **Immutable but for the decision.** After `open` only `status`, `decision` and
///   `closed_at` change (and a purged reason's text); eligibility and the token never do.
/// - **Forward only.** `open → decided → closed` or `open → closed`, each move one
///   conditional single-record write, so of concurrent calls exactly one makes it.
///   `decide` writes on `status = open AND token = token AND due_at > decided_at`;
///   `close` on `status ≠ closed`.
/// - **Refusals change nothing.** A decision on an absent or closed task, an already
///   decided one (a reused token), with a wrong token, naming another actor, from an
///   ineligible actor, or made at or after the deadline is reported as a
///   [`TaskDecideOutcome`] (the [`task_decision_refused`] rule) and writes nothing.
/// - **No decision at or after the deadline** (K-17.5 amended). `decide` writes only when
///   `decided_at < due_at`, in the same conditional write, so a late decision is refused
///   ([`TaskDecideOutcome::PastDeadline`]) whether or not the step has taken its SLA poll
///   yet, and the SLA path concludes the task. `decided_at` is the deciding process's
///   `Clock` reading and `due_at` the opening process's reading plus the SLA: the deadline
///   holds to within the skew between those two clocks (a decider whose clock runs behind
///   by `s` may still decide up to `s` after the true deadline, one running ahead loses `s`
///   of its time). Keep deciding processes on synchronized clocks (NTP: milliseconds
///   against SLAs of minutes to days).
/// - **No instance scans.** `list_open` reads the task records only.
/// - **Caller's time.** Every time is the caller's `Clock` reading.
/// - **Checked before I/O.** Every input is checked first; a refusal is
///   [`Error::InvalidInput`] and nothing is written.
/// - **Bounded.** A page is at most [`TASK_LIST_MAX`] records, a purge at most
///   [`TASK_PURGE_MAX`]; texts at most [`TASK_TEXT_BYTES_MAX`] bytes, evidence and roles
///   bounded. Closed records are kept until purged (retention is the caller's).
/// - Object safe: deployments hold it as `Arc<dyn TaskInbox>`.
#[async_trait::async_trait]
pub trait TaskInbox: Send + Sync + 'static {
    /// Insert `task` as an open record, or return the record that has its id.
    ///
    /// # Contract
    /// `task` must pass [`TaskRecord::validate_new`], else [`Error::InvalidInput`] and
    /// nothing is written. Atomic on the unique id: `None` when inserted; `Some(stored)`
    /// when a record has that id already, left unchanged whatever its status.
    async fn open(&self, task: &TaskRecord) -> Result<Option<TaskRecord>>;

    /// Read one record, with its evidence.
    ///
    /// # Contract
    /// Read-only; the record as last written, or `None` (never opened, or purged). A bad
    /// id is [`Error::InvalidInput`].
    async fn get(&self, id: &str) -> Result<Option<TaskRecord>>;

    /// A page of the open tasks `actor` may decide (the assignee is the actor, or the task
    /// has one of the actor's roles), ordered by id ascending (byte order), ids strictly
    /// greater than `after`.
    ///
    /// # Contract
    /// Read-only; at most `limit` records ([`validate_task_list`]); reads the task records
    /// only, never instances.
    async fn list_open(&self, actor: &Actor, after: Option<&str>, limit: usize) -> Result<Vec<TaskRecord>>;

    /// Store a person's decision: `open → decided`.
    ///
    /// # Contract
    /// Inputs checked by [`validate_task_decide`]. A refusal by [`task_decision_refused`]
    /// on the record as read is returned and nothing is written; else one conditional write
    /// on `id AND status = open AND token AND due_at > decision.decided_at` sets the status
    /// and the decision together; on a miss the record is read again and the refusal
    /// reported. Of concurrent decisions on one open task exactly one returns `Decided`; a
    /// decision at or after `due_at` never does ([`TaskDecideOutcome::PastDeadline`]).
    async fn decide(&self, id: &str, token: &str, actor: &Actor, decision: &TaskDecision) -> Result<TaskDecideOutcome>;

    /// The workflow took the decision or stopped waiting: `open | decided → closed` with
    /// `closed_at = now`.
    ///
    /// # Contract
    /// One conditional write on `id AND status ≠ closed`, returning the decision the record
    /// carried when this call closed it (so a decision that raced a close is never lost:
    /// either it was stored first and the closer gets it, or it finds the task closed). A
    /// bad id is [`Error::InvalidInput`].
    async fn close(&self, id: &str, now: Instant) -> Result<TaskCloseOutcome>;

    /// Retention of sensitive reasons: remove the text of sensitive reasons of decisions
    /// made before `before`; returns how many were removed.
    ///
    /// # Contract
    /// At most `limit` records per call ([`validate_task_purge`]); the decision, its
    /// outcome, actor and time stay, `reason.sensitive` stays `true`, only `reason.text`
    /// goes. Non-sensitive reasons are untouched. Idempotent.
    async fn purge_sensitive_reasons(&self, before: Instant, limit: usize) -> Result<u64>;

    /// Retention: delete closed records with `closed_at < before`; returns how many.
    ///
    /// # Contract
    /// At most `limit` records per call ([`validate_task_purge`]); never an open or decided
    /// record. A caller repeats until the call returns less than `limit`.
    async fn purge_closed(&self, before: Instant, limit: usize) -> Result<u64>;
}

/// `dyn TaskInbox`.
pub type DynTaskInbox = dyn TaskInbox;

/// The id of a task record: the step's idempotency key and the level (`K|h<level>`), or
/// `#` and its SHA-256 in hex when that would pass the identifier limit. The engine's
/// compensation escalation and the human-task layer name their records by it.
pub fn task_id(idempotency_key: &str, level: u32) -> String {
    crate::validate::bounded_identifier(format!("{idempotency_key}|h{level}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUE: Instant = Instant::from_millis(3_600_000);

    /// A label, the record as read, the token, the deciding actor, the decision, the refusal.
    type Row<'a> = (&'a str, Option<&'a TaskRecord>, &'a str, &'a Actor, TaskDecision, Option<TaskDecideOutcome>);

    fn open_task() -> TaskRecord {
        TaskRecord {
            id: "wf-1|approve|h0".into(),
            workflow_id: "wf-1".into(),
            workflow_type: "invoice".into(),
            step: "approve".into(),
            level: 0,
            title: "Approve invoice 7".into(),
            assignee: Some("alice".into()),
            roles: vec!["finance".into()],
            evidence: vec![],
            token: "b1e3f0c2a9d84e57".into(),
            created_at: Instant::ZERO,
            due_at: DUE,
            status: TaskStatus::Open,
            decision: None,
            closed_at: None,
        }
    }

    fn by(actor: &str, at: i64) -> TaskDecision {
        TaskDecision {
            outcome: TaskOutcome::Approve,
            actor: actor.into(),
            reason: None,
            decided_at: Instant::from_millis(at),
        }
    }

    /// K-17.5 (amended): the shared refusal rule, row by row — the deadline is compared
    /// last, so a caller without the token, or an ineligible one, learns nothing of it; a
    /// decision one millisecond before the deadline may be written, at the deadline or
    /// after it is `PastDeadline`, and a closed or decided task says so first.
    #[test]
    fn the_refusal_rule_row_by_row() {
        let due = DUE.as_millis();
        let open = open_task();
        let stored = by("bob", 5);
        let decided = TaskRecord { status: TaskStatus::Decided, decision: Some(stored.clone()), ..open_task() };
        let closed = TaskRecord { status: TaskStatus::Closed, closed_at: Some(DUE), ..open_task() };
        let (alice, bob, sam) =
            (Actor::new("alice", Vec::<String>::new()), Actor::new("bob", ["finance"]), Actor::new("sam", ["sales"]));
        let past = Some(TaskDecideOutcome::PastDeadline { due_at: DUE });
        let rows: Vec<Row<'_>> = vec![
            ("absent", None, "b1e3f0c2a9d84e57", &alice, by("alice", 0), Some(TaskDecideOutcome::NotFound)),
            (
                "wrong token, late",
                Some(&open),
                "b1e3f0c2a9d84e58",
                &alice,
                by("alice", due),
                Some(TaskDecideOutcome::WrongToken),
            ),
            (
                "closed, late",
                Some(&closed),
                "b1e3f0c2a9d84e57",
                &alice,
                by("alice", due + 1),
                Some(TaskDecideOutcome::Closed),
            ),
            (
                "decided, late",
                Some(&decided),
                "b1e3f0c2a9d84e57",
                &alice,
                by("alice", due),
                Some(TaskDecideOutcome::AlreadyDecided(stored.clone())),
            ),
            (
                "another actor named, late",
                Some(&open),
                "b1e3f0c2a9d84e57",
                &bob,
                by("alice", due),
                Some(TaskDecideOutcome::ActorMismatch),
            ),
            (
                "ineligible, late",
                Some(&open),
                "b1e3f0c2a9d84e57",
                &sam,
                by("sam", due),
                Some(TaskDecideOutcome::NotEligible),
            ),
            ("assignee, a ms before", Some(&open), "b1e3f0c2a9d84e57", &alice, by("alice", due - 1), None),
            ("role, a ms before", Some(&open), "b1e3f0c2a9d84e57", &bob, by("bob", due - 1), None),
            ("assignee, at the deadline", Some(&open), "b1e3f0c2a9d84e57", &alice, by("alice", due), past.clone()),
            ("role, a minute after", Some(&open), "b1e3f0c2a9d84e57", &bob, by("bob", due + 60_000), past.clone()),
        ];
        for (label, found, token, actor, decision, want) in rows {
            assert_eq!(task_decision_refused(found, token, actor, &decision).unwrap(), want, "{label}");
        }
    }
}
