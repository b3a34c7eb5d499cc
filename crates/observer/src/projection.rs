//! The projection's records: attempt rows, snapshots, queries, and the merge rules both
//! repositories implement.

use crate::{Error, Result};
use kernel_core::domain::{DurationMs, ErrorClass, Instant, WorkflowInstance, WorkflowStatus};
use kernel_core::ports::Observation;
use kernel_core::transition::TransitionKind;
use kernel_core::WorkflowId;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::BTreeMap;

/// Most rows one query returns.
pub const QUERY_LIMIT_MAX: usize = 1_000;

/// What became of one attempt of a step, as far as the projection saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    /// Waiting for a traffic permit (not yet entered).
    Deferred,
    /// Entered the activity.
    Running,
    /// Completed.
    Completed,
    /// Failed retryably; a later attempt follows.
    Retrying,
    /// Failed for good.
    Failed,
    /// Skipped after a failure (`on_failed = skip`).
    Skipped,
    /// Suspended on a timer or a signal.
    Suspended,
    /// Yielded with a checkpoint.
    Yielded,
    /// Canceled by the activity.
    Canceled,
}

impl AttemptOutcome {
    /// The snake_case name used in documents.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Deferred => "deferred",
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Retrying => "retrying",
            Self::Failed => "failed",
            Self::Skipped => "skipped",
            Self::Suspended => "suspended",
            Self::Yielded => "yielded",
            Self::Canceled => "canceled",
        }
    }
}

/// The attempt row an observation concerns: `(outcome, attempt number)`, or `None` when
/// the transition is not about an attempt (claims, activations, workflow-level changes).
///
/// SuspendClaim and yield roll `attempt` back by one in the same write (K-2.1), and a permit
/// deferral happens before the next entry, so for those the row is `attempt + 1`: the entry
/// that suspended, yielded or waits for its permit.
pub fn attempt_of(obs: &Observation) -> Option<(AttemptOutcome, u32)> {
    obs.step_name.as_ref()?;
    let (outcome, next) = match obs.kind {
        TransitionKind::MarkRunning => (AttemptOutcome::Running, false),
        TransitionKind::CompleteStep => (AttemptOutcome::Completed, false),
        TransitionKind::RetryRelease => (AttemptOutcome::Retrying, false),
        TransitionKind::StepFailed => (AttemptOutcome::Failed, false),
        TransitionKind::SkipStep => (AttemptOutcome::Skipped, false),
        TransitionKind::Canceled => (AttemptOutcome::Canceled, false),
        TransitionKind::SuspendClaim => (AttemptOutcome::Suspended, true),
        TransitionKind::Yield => (AttemptOutcome::Yielded, true),
        TransitionKind::PermitDeferral => (AttemptOutcome::Deferred, true),
        _ => return None,
    };
    Some((outcome, if next { obs.attempt.saturating_add(1) } else { obs.attempt }))
}

/// One attempt of one step in one run, upserted on `(biz_key, workflow_run, step_name,
/// attempt)`; a row accepts only observations with a revision ≥ its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRow {
    /// Business key.
    pub biz_key: String,
    /// `retry_count` of the instance.
    pub workflow_run: u32,
    /// Step.
    pub step_name: String,
    /// Physical attempt (real entries into the activity).
    pub attempt: u32,
    /// Instance.
    pub workflow_id: WorkflowId,
    /// Type.
    pub workflow_type: String,
    /// Latest outcome seen.
    pub outcome: AttemptOutcome,
    /// Revision of the latest observation applied.
    pub revision: u64,
    /// The earliest mark-running time seen for this attempt (a resumed attempt keeps its
    /// first start, [`AttemptRow::merge`]), when one was seen.
    pub started_at: Option<Instant>,
    /// Commit time of the latest observation applied.
    pub updated_at: Instant,
    /// Activity time.
    pub elapsed_ms: DurationMs,
    /// Permit wait accumulated by the step (traffic wait, not execution).
    pub traffic_wait_ms: DurationMs,
    /// Error class, if any.
    pub error_class: Option<ErrorClass>,
    /// Worker.
    pub worker_id: Option<String>,
}

impl AttemptRow {
    /// The row an observation writes, or `None` when it is not about an attempt.
    pub fn from_observation(obs: &Observation) -> Option<AttemptRow> {
        let (outcome, attempt) = attempt_of(obs)?;
        Some(AttemptRow {
            biz_key: obs.biz_key.clone(),
            workflow_run: obs.workflow_run,
            step_name: obs.step_name.clone()?,
            attempt,
            workflow_id: obs.workflow_id.clone(),
            workflow_type: obs.workflow_type.clone(),
            outcome,
            revision: obs.revision,
            started_at: (outcome == AttemptOutcome::Running).then_some(obs.at),
            updated_at: obs.at,
            elapsed_ms: obs.elapsed_ms,
            traffic_wait_ms: obs.traffic_wait_ms,
            error_class: obs.error_class,
            worker_id: obs.worker_id.clone(),
        })
    }

    /// Apply a newer row (revision ≥ own); returns whether it was accepted. Every field
    /// comes from the newer row except `started_at`, which keeps the earliest start seen:
    /// the newer row's replaces the stored one only when the stored one is absent or
    /// later, and a newer row without one keeps the stored one. A suspension or yield
    /// rolls the attempt back in the same write (see [`attempt_of`]), so a resumed
    /// mark-running lands on the same row; the row still starts when the attempt first
    /// ran, and the wait in between is not taken for a queue wait. A rejected (older) row
    /// changes nothing, its start included.
    ///
    /// ```
    /// use kernel_core::domain::Instant;
    /// # use observer::{AttemptOutcome, AttemptRow};
    /// # let row = |revision: u64, outcome, started: Option<i64>, at: i64| AttemptRow {
    /// #     biz_key: "k".into(), workflow_run: 0, step_name: "s".into(), attempt: 1,
    /// #     workflow_id: "wf".into(), workflow_type: "t".into(), outcome, revision,
    /// #     started_at: started.map(Instant::from_millis), updated_at: Instant::from_millis(at),
    /// #     elapsed_ms: Default::default(), traffic_wait_ms: Default::default(), error_class: None,
    /// #     worker_id: None,
    /// # };
    /// let mut stored = row(1, AttemptOutcome::Running, Some(1_000), 1_000);
    /// assert!(stored.merge(row(2, AttemptOutcome::Suspended, None, 2_000)));
    /// assert!(stored.merge(row(3, AttemptOutcome::Running, Some(9_000), 9_000)));
    /// assert!(stored.merge(row(4, AttemptOutcome::Completed, None, 9_500)));
    /// assert_eq!(stored.started_at, Some(Instant::from_millis(1_000)));
    /// assert_eq!((stored.outcome, stored.updated_at), (AttemptOutcome::Completed, Instant::from_millis(9_500)));
    /// assert!(!stored.merge(row(3, AttemptOutcome::Running, Some(500), 500)), "older: refused");
    /// assert_eq!(stored.started_at, Some(Instant::from_millis(1_000)));
    /// ```
    pub fn merge(&mut self, newer: AttemptRow) -> bool {
        if newer.revision < self.revision {
            return false;
        }
        let started = match (self.started_at, newer.started_at) {
            (Some(stored), Some(new)) => Some(stored.min(new)),
            (stored, new) => new.or(stored),
        };
        *self = AttemptRow { started_at: started, ..newer };
        true
    }
}

/// A step as the snapshot last saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepSummary {
    /// Attempt number after the transition.
    pub attempt: u32,
    /// The transition.
    pub kind: TransitionKind,
    /// Its revision.
    pub revision: u64,
    /// Its commit time.
    pub at: Instant,
    /// Error class, if any.
    pub error_class: Option<ErrorClass>,
}

/// The ops view of one `biz_key`: accepts only revisions ≥ its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Business key (the snapshot's identity).
    pub biz_key: String,
    /// Instance.
    pub workflow_id: WorkflowId,
    /// Type.
    pub workflow_type: String,
    /// Run.
    pub workflow_run: u32,
    /// Revision of the latest applied observation.
    pub revision: u64,
    /// Workflow status.
    pub status: WorkflowStatus,
    /// Latest transition.
    pub last_kind: TransitionKind,
    /// Step of the latest step transition.
    pub step_name: Option<String>,
    /// Its attempt.
    pub attempt: u32,
    /// Error class of the latest transition, if any.
    pub error_class: Option<ErrorClass>,
    /// Commit time of the latest applied observation.
    pub updated_at: Instant,
    /// Terminal time, once terminal.
    pub finished_at: Option<Instant>,
    /// Worker of the latest transition.
    pub worker_id: Option<String>,
    /// Per step, the latest transition seen (keys are step names).
    #[serde(default)]
    pub steps: BTreeMap<String, StepSummary>,
    /// The signal type the workflow waits for, while it holds a signal wait (`None` for a
    /// timer or no wait). Absent in snapshots written before it was projected.
    #[serde(default)]
    pub wait_signal: Option<String>,
}

impl Snapshot {
    /// The snapshot fields an observation sets.
    pub fn from_observation(obs: &Observation) -> Snapshot {
        let mut steps = BTreeMap::new();
        if let Some(name) = &obs.step_name {
            steps.insert(name.clone(), step_summary(obs));
        }
        Snapshot {
            biz_key: obs.biz_key.clone(),
            workflow_id: obs.workflow_id.clone(),
            workflow_type: obs.workflow_type.clone(),
            workflow_run: obs.workflow_run,
            revision: obs.revision,
            status: obs.status,
            last_kind: obs.kind,
            step_name: obs.step_name.clone(),
            attempt: obs.attempt,
            error_class: obs.error_class,
            updated_at: obs.at,
            finished_at: obs.status.is_terminal().then_some(obs.at),
            worker_id: obs.worker_id.clone(),
            steps,
            wait_signal: obs.wait_signal.clone(),
        }
    }

    /// Apply an observation if its revision is ≥ the snapshot's; returns whether it was.
    pub fn apply(&mut self, obs: &Observation) -> bool {
        if obs.revision < self.revision {
            return false;
        }
        let mut steps = std::mem::take(&mut self.steps);
        if let Some(name) = &obs.step_name {
            steps.insert(name.clone(), step_summary(obs));
        }
        let finished_at = if obs.status.is_terminal() { self.finished_at.or(Some(obs.at)) } else { None };
        *self = Snapshot { steps, finished_at, ..Snapshot::from_observation(obs) };
        true
    }

    /// A snapshot rebuilt from a stored instance (repair).
    pub fn from_instance(inst: &WorkflowInstance) -> Snapshot {
        // The furthest step that has left `pending` (steps run in definition order).
        let last = inst.steps.iter().rev().find(|s| s.status != kernel_core::StepStatus::Pending || s.attempt > 0);
        let kind = match inst.status {
            WorkflowStatus::Completed => TransitionKind::Completed,
            WorkflowStatus::Failed => TransitionKind::Failed,
            WorkflowStatus::Canceled => TransitionKind::Canceled,
            WorkflowStatus::Failing => TransitionKind::Failing,
            WorkflowStatus::Waiting => TransitionKind::SuspendClaim,
            WorkflowStatus::Running => TransitionKind::MarkRunning,
        };
        let steps = inst
            .steps
            .iter()
            .map(|s| {
                let kind = match s.status {
                    kernel_core::StepStatus::Completed => TransitionKind::CompleteStep,
                    kernel_core::StepStatus::Failed => TransitionKind::StepFailed,
                    kernel_core::StepStatus::Skipped => TransitionKind::SkipStep,
                    kernel_core::StepStatus::Waiting => TransitionKind::SuspendClaim,
                    kernel_core::StepStatus::Running => TransitionKind::MarkRunning,
                    kernel_core::StepStatus::Pending => TransitionKind::Create,
                };
                let summary = StepSummary {
                    attempt: s.attempt,
                    kind,
                    revision: inst.revision,
                    at: s.finished_at.or(s.started_at).unwrap_or(inst.updated_at),
                    error_class: s.error.as_ref().map(|e| e.class),
                };
                (s.name.clone(), summary)
            })
            .collect();
        Snapshot {
            biz_key: inst.biz_key.clone(),
            workflow_id: inst.workflow_id.clone(),
            workflow_type: inst.workflow_type.clone(),
            workflow_run: inst.retry_count,
            revision: inst.revision,
            status: inst.status,
            last_kind: kind,
            step_name: last.map(|s| s.name.clone()),
            attempt: last.map_or(0, |s| s.attempt),
            error_class: last.and_then(|s| s.error.as_ref().map(|e| e.class)),
            updated_at: inst.updated_at,
            finished_at: inst.finished_at.or(inst.status.is_terminal().then_some(inst.updated_at)),
            worker_id: None,
            steps,
            wait_signal: inst.wait.as_ref().and_then(|w| w.signal_type()).map(str::to_string),
        }
    }
}

fn step_summary(obs: &Observation) -> StepSummary {
    StepSummary {
        attempt: obs.attempt,
        kind: obs.kind,
        revision: obs.revision,
        at: obs.at,
        error_class: obs.error_class,
    }
}

/// Snapshots for the ops view; every filter is optional. Newest `updated_at` first, ties
/// by `biz_key` ascending ([`SnapshotQuery::order`]); page with [`before`](Self::before).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SnapshotQuery {
    /// Workflow type.
    pub workflow_type: Option<String>,
    /// Workflow status.
    pub status: Option<WorkflowStatus>,
    /// Step of the latest step transition.
    pub step_name: Option<String>,
    /// `updated_at >= from`.
    pub updated_from: Option<Instant>,
    /// `updated_at < to`.
    pub updated_to: Option<Instant>,
    /// `biz_key` starts with this text, taken literally (no character is a wildcard);
    /// follows the identifier rule (K-2.0).
    pub biz_key_prefix: Option<String>,
    /// The workflow holds a signal wait for this signal type ([`Snapshot::wait_signal`]).
    pub waiting_on: Option<String>,
    /// Keyset paging: `(updated_at, biz_key)` of the last snapshot of the previous page;
    /// only snapshots strictly after it in the newest-first order are returned.
    pub before: Option<(Instant, String)>,
    /// Most rows (capped at [`QUERY_LIMIT_MAX`]; 0 means the cap).
    pub limit: usize,
}

impl SnapshotQuery {
    /// The check every repository makes before it queries: the prefix, the signal type
    /// and the cursor's key follow the identifier rule (K-2.0), else
    /// [`Error::InvalidInput`].
    pub fn validate(&self) -> Result<()> {
        input("biz_key_prefix", self.biz_key_prefix.as_deref())?;
        input("waiting_on", self.waiting_on.as_deref())?;
        input("before", self.before.as_ref().map(|(_, k)| k.as_str()))
    }

    /// Whether a snapshot matches (reference semantics for every repository), the
    /// [`before`](Self::before) cursor included.
    pub fn matches(&self, s: &Snapshot) -> bool {
        self.workflow_type.as_ref().is_none_or(|t| *t == s.workflow_type)
            && self.status.is_none_or(|st| st == s.status)
            && self.step_name.as_ref().is_none_or(|n| Some(n) == s.step_name.as_ref())
            && self.updated_from.is_none_or(|f| s.updated_at >= f)
            && self.updated_to.is_none_or(|t| s.updated_at < t)
            && self.biz_key_prefix.as_ref().is_none_or(|p| s.biz_key.starts_with(p.as_str()))
            && self.waiting_on.as_ref().is_none_or(|w| Some(w) == s.wait_signal.as_ref())
            && self.before.as_ref().is_none_or(|(at, key)| after_cursor((s.updated_at, &s.biz_key), (*at, key)))
    }

    /// The order of results: newest `updated_at` first, ties by `biz_key` ascending.
    pub fn order(a: &Snapshot, b: &Snapshot) -> Ordering {
        b.updated_at.cmp(&a.updated_at).then_with(|| a.biz_key.cmp(&b.biz_key))
    }
}

/// Whether `row` comes strictly after `cursor` in the newest-first order (time descending,
/// ties by key ascending): the keyset paging rule of snapshots and audit entries.
pub fn after_cursor(row: (Instant, &str), cursor: (Instant, &str)) -> bool {
    row.0 < cursor.0 || (row.0 == cursor.0 && row.1 > cursor.1)
}

/// The smallest string greater than every string that starts with `prefix`, in code point
/// (= UTF-8 byte) order, or `None` when there is none: `key >= prefix AND key < bound` is
/// exactly "`key` starts with `prefix`", a range every store answers from an index, with
/// no wildcard to escape.
///
/// ```
/// use observer::projection::prefix_upper_bound;
/// assert_eq!(prefix_upper_bound("a%b").as_deref(), Some("a%c"));
/// assert_eq!(prefix_upper_bound("a\u{d7ff}").as_deref(), Some("a\u{e000}"));
/// assert_eq!(prefix_upper_bound("a\u{10ffff}").as_deref(), Some("b"));
/// assert_eq!(prefix_upper_bound("\u{10ffff}"), None);
/// ```
pub fn prefix_upper_bound(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = match last {
            '\u{d7ff}' => Some('\u{e000}'),
            c => char::from_u32(u32::from(c) + 1),
        };
        if let Some(n) = next {
            chars.push(n);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// An optional query text: the identifier rule (K-2.0), as [`Error::InvalidInput`].
pub(crate) fn input(field: &str, value: Option<&str>) -> Result<()> {
    match value {
        Some(v) => kernel_core::validate::identifier(field, v)
            .map_err(|e| Error::InvalidInput { field: field.to_string(), reason: reason_of(e) }),
        None => Ok(()),
    }
}

/// Attempt rows for the ops view; every filter is optional. Newest `updated_at` first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AttemptQuery {
    /// Business key.
    pub biz_key: Option<String>,
    /// Workflow type.
    pub workflow_type: Option<String>,
    /// Step.
    pub step_name: Option<String>,
    /// Outcome.
    pub outcome: Option<AttemptOutcome>,
    /// `updated_at >= from`.
    pub updated_from: Option<Instant>,
    /// `updated_at < to`.
    pub updated_to: Option<Instant>,
    /// Most rows (capped at [`QUERY_LIMIT_MAX`]; 0 means the cap).
    pub limit: usize,
}

impl AttemptQuery {
    /// Whether a row matches (reference semantics for every repository).
    pub fn matches(&self, r: &AttemptRow) -> bool {
        self.biz_key.as_ref().is_none_or(|b| *b == r.biz_key)
            && self.workflow_type.as_ref().is_none_or(|t| *t == r.workflow_type)
            && self.step_name.as_ref().is_none_or(|n| *n == r.step_name)
            && self.outcome.is_none_or(|o| o == r.outcome)
            && self.updated_from.is_none_or(|f| r.updated_at >= f)
            && self.updated_to.is_none_or(|t| r.updated_at < t)
    }
}

/// The effective row limit of a query.
pub fn effective_limit(limit: usize) -> usize {
    if limit == 0 {
        QUERY_LIMIT_MAX
    } else {
        limit.min(QUERY_LIMIT_MAX)
    }
}

/// The reason of a kernel refusal, without the field name it repeats.
pub(crate) fn reason_of(e: kernel_core::Error) -> String {
    match e {
        kernel_core::Error::InvalidInput { reason, .. } => reason,
        other => other.to_string(),
    }
}
