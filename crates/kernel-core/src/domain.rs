//! Domain types of K-2: the persisted [`WorkflowInstance`] and its parts.
//!
//! Times are [`Instant`]s read from the [`Clock`](crate::ports::Clock) port and spans are
//! [`DurationMs`]; adapters store them natively (BSON DateTime in Mongo, scores in Redis).

use crate::error::{Error, Result};
use crate::id::{BusinessRound, ClaimToken, WorkflowId};
use crate::record::{HistoryEntry, StepRecord};
use crate::validate;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

pub use crate::time::{DurationMs, Instant};

/// Top-level status of an instance (K-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkflowStatus {
    /// Claimable when `claimable_time <= now`.
    Running,
    /// Parked on a timer or a signal; holds no claim.
    Waiting,
    /// The failure finalizer must still run; claimable.
    Failing,
    /// Terminal success.
    Completed,
    /// Terminal failure; may be replayed by StartOrResume (K-5).
    Failed,
    /// Terminal: the work should no longer be done.
    Canceled,
}

impl WorkflowStatus {
    /// Completed, failed or canceled.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Canceled)
    }
    /// The snake_case name used in documents.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Waiting => "waiting",
            Self::Failing => "failing",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
        }
    }
}

/// Status of one step (K-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    /// Not started, or handed back (yield, retry, activation).
    Pending,
    /// An attempt entered the activity and has not committed.
    Running,
    /// Holds the instance's wait.
    Waiting,
    /// Done; its output is in `output.<name>`.
    Completed,
    /// Failed for good in this round.
    Failed,
    /// Skipped (`on_failed = skip`, or canceled).
    Skipped,
}

impl StepStatus {
    /// The snake_case name used in documents.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Waiting => "waiting",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Skipped => "skipped",
        }
    }
}

/// Business priority: P0 is the most urgent lane (K-13). Promote-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(into = "u8", try_from = "u8")]
pub enum Priority {
    /// Realtime, user waiting.
    P0 = 0,
    /// Interactive.
    P1 = 1,
    /// Asynchronous.
    P2 = 2,
    /// Background and recovery.
    P3 = 3,
}

impl Priority {
    /// All lanes, most urgent first.
    pub const ALL: [Priority; 4] = [Priority::P0, Priority::P1, Priority::P2, Priority::P3];
    /// The lanes' names, most urgent first: `p0` … `p3` (the operator views' and the
    /// metrics' `lane` label).
    pub const LANE_NAMES: [&'static str; 4] = ["p0", "p1", "p2", "p3"];
    /// Lane index 0..=3.
    pub fn index(self) -> usize {
        self as usize
    }
    /// Whether `self` is more urgent than `other`.
    pub fn is_higher_than(self, other: Priority) -> bool {
        (self as u8) < (other as u8)
    }
}

impl From<Priority> for u8 {
    fn from(p: Priority) -> u8 {
        p as u8
    }
}

impl TryFrom<u8> for Priority {
    type Error = String;
    fn try_from(v: u8) -> Result<Self, String> {
        Priority::ALL.get(v as usize).copied().ok_or_else(|| format!("priority {v} is not 0..=3"))
    }
}

/// How an activity error is classified (K-7, K-17.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// Timeout, rate limit, unavailable: retried with backoff while budget remains.
    Transient,
    /// Schema mismatch, permission, validation: never retried.
    Permanent,
    /// The call may have taken effect: retried, and the next attempt sees this class so the
    /// activity queries the external system before acting again.
    UnknownOutcome,
    /// The work should not be done any more: step skipped, workflow canceled.
    Canceled,
    /// The step cannot run on this worker as it is (a recorded output of a schema version
    /// it cannot migrate, K-17.4): handed back after the push-back delay, never counted
    /// against the retries, as a fingerprint mismatch is (K-4.3).
    Parked,
}

impl ErrorClass {
    /// The snake_case name used in documents and observations.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Transient => "transient",
            Self::Permanent => "permanent",
            Self::UnknownOutcome => "unknown_outcome",
            Self::Canceled => "canceled",
            Self::Parked => "parked",
        }
    }
}

/// A recorded step error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepError {
    /// How the engine treated it (retry, fail, cancel), and what the next attempt sees.
    pub class: ErrorClass,
    /// Human-readable message (bounded by the engine).
    pub message: String,
}

/// One step of an instance (K-2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// Unique within the definition; a document key.
    pub name: String,
    /// Where the step stands; `pending` steps whose dependencies completed are ready (K-4.4).
    pub status: StepStatus,
    /// Real entries into the activity (K-2.1).
    pub attempt: u32,
    /// The last attempt's error; kept across retries so the next attempt can see it
    /// (query-before-retry), cleared by replay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<StepError>,
    /// Time spent inside the activity, summed over attempts.
    #[serde(default)]
    pub elapsed_ms: DurationMs,
    /// Time spent waiting for a permit.
    #[serde(default)]
    pub traffic_wait_ms: DurationMs,
    /// Number of permit denials.
    #[serde(default)]
    pub traffic_waits: u32,
    /// Small, opaque state carried across suspensions and yields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<Value>,
    /// Last mark-running time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Instant>,
    /// Completion / failure time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Instant>,
    /// Per-step epoch (K-17.1): the logical attempt within a run is `(workflow_run,
    /// epoch)`; an operator's regenerate or dead-letter retry moves it on. Stored only when
    /// above 0, so a step that was never re-run keeps its stored shape.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub epoch: u32,
    /// What the current logical attempt recorded (model calls, values, operator
    /// decisions; K-17.3). A record of another `(run, epoch)` is never replayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<StepRecord>,
    /// Earlier logical attempts, bounded by count and bytes, oldest first (K-17.3).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<HistoryEntry>,
    /// When the current logical attempt first failed retryably; the step's
    /// `max_retry_duration` counts from it. Cleared when the attempt ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retrying_since: Option<Instant>,
    /// Loop iterations taken by this step's back-edge (K-4 amendment): how many times its
    /// loop sent the workflow back since the loop was last entered. Bounded by the loop's
    /// declared maximum; reset by a replay and when an enclosing loop re-runs this step.
    /// Stored only when above 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub iterations: u32,
    /// The revision of the write that completed the step (K-17.6 amendment): a
    /// store-assigned completion order, so the compensation orders independent steps
    /// without comparing the clocks of different processes. Read only while the step is
    /// completed (a step that runs again keeps it until it completes again; replay clears
    /// it); `None` for a step that completed before the field existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_revision: Option<u64>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Step {
    /// A fresh pending step.
    pub fn pending(name: impl Into<String>) -> Self {
        Step {
            name: name.into(),
            status: StepStatus::Pending,
            attempt: 0,
            error: None,
            elapsed_ms: DurationMs::ZERO,
            traffic_wait_ms: DurationMs::ZERO,
            traffic_waits: 0,
            checkpoint: None,
            started_at: None,
            finished_at: None,
            epoch: 0,
            record: None,
            history: Vec::new(),
            retrying_since: None,
            iterations: 0,
            completed_revision: None,
        }
    }

    /// This step's record when it belongs to the logical attempt `(run, epoch)`.
    pub fn record_of(&self, run: u32) -> Option<&StepRecord> {
        self.record.as_ref().filter(|r| r.is_of(run, self.epoch))
    }

    /// Whether the step was skipped because its branch predicate did not hold (K-4
    /// amendment): skipped without an error. A step skipped by `on_failed = skip` or by a
    /// cancellation carries its error.
    pub fn not_taken(&self) -> bool {
        self.status == StepStatus::Skipped && self.error.is_none()
    }
}

/// What a waiting instance waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitKind {
    /// A durable sleep.
    Timer,
    /// A signal, optionally with a poll fallback.
    Signal,
}

/// The persisted wait of a waiting instance (K-2, K-9): a durable sleep or a signal wait,
/// each with exactly the fields it needs.
///
/// Serialized in the document shape every store keeps (`kind`, `signal_type`, `wait_key`,
/// `generation`, `step_index`, `poll_time`; a timer's due time is its `poll_time`, its
/// generation 0), so the enum changes no stored byte.
///
/// ```
/// use kernel_core::domain::{Instant, ResumeKind, Wait, WaitKind};
/// let t = Wait::Timer { step_index: 1, due: Some(Instant::from_millis(5_000)) };
/// assert_eq!((t.kind(), t.poll_time(), t.due_resume()), (WaitKind::Timer, Some(Instant::from_millis(5_000)), ResumeKind::Timer));
/// assert_eq!(
///     serde_json::to_value(&t).unwrap(),
///     serde_json::json!({"kind": "timer", "generation": 0, "step_index": 1, "poll_time": 5_000}),
/// );
/// let s = Wait::Signal {
///     signal_type: "approved".into(),
///     wait_key: "doc:42".into(),
///     generation: 2,
///     step_index: 1,
///     poll_time: None,
/// };
/// assert_eq!(s.signal_identity().unwrap().generation, 2);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "WaitDoc", try_from = "WaitDoc")]
pub enum Wait {
    /// A durable sleep: the step resumes as `timer` once `due` has passed (K-9.2).
    Timer {
        /// The step holding the wait.
        step_index: u32,
        /// When the sleep is over (stored as the wait's `poll_time`, and as the instance's
        /// `claimable_time`, which the timer scan reads). Every sleep the engine writes has
        /// one; the stored shape allows a timer without it, which never comes due.
        due: Option<Instant>,
    },
    /// A signal wait (K-9.3): only a signal with exactly this identity activates it.
    Signal {
        /// The signal type a matching signal carries (K-2.0 identifier).
        signal_type: String,
        /// Which business object the signal is about (K-2.0 identifier).
        wait_key: String,
        /// Which round of waiting; stale generations never match (K-9.6).
        generation: u64,
        /// The step holding the wait.
        step_index: u32,
        /// The poll fallback: when set, the step resumes as `poll` at that time even
        /// without a signal (K-9.5).
        poll_time: Option<Instant>,
    },
}

impl Wait {
    /// The K-2.0 check of the wait identity: a signal wait's `signal_type` and `wait_key`
    /// follow the identifier rule.
    pub fn validate(&self) -> Result<()> {
        match self {
            Wait::Timer { step_index: _, due: _ } => Ok(()),
            Wait::Signal { signal_type, wait_key, generation: _, step_index: _, poll_time: _ } => {
                validate::identifier("wait.signal_type", signal_type)?;
                validate::identifier("wait.wait_key", wait_key)
            }
        }
    }

    /// Timer or signal (the stored `kind`).
    pub fn kind(&self) -> WaitKind {
        match self {
            Wait::Timer { .. } => WaitKind::Timer,
            Wait::Signal { .. } => WaitKind::Signal,
        }
    }

    /// The step holding the wait.
    pub fn step_index(&self) -> u32 {
        match self {
            Wait::Timer { step_index, .. } | Wait::Signal { step_index, .. } => *step_index,
        }
    }

    /// When the wait comes due without a signal: a timer's due time, a signal wait's poll
    /// fallback (`None`: it waits for the signal alone).
    pub fn poll_time(&self) -> Option<Instant> {
        match self {
            Wait::Timer { due, .. } => *due,
            Wait::Signal { poll_time, .. } => *poll_time,
        }
    }

    /// How the step resumes when [`poll_time`](Self::poll_time) comes due: `timer` for a
    /// sleep, `poll` for a signal wait's fallback (K-9.2).
    pub fn due_resume(&self) -> ResumeKind {
        match self {
            Wait::Timer { .. } => ResumeKind::Timer,
            Wait::Signal { .. } => ResumeKind::Poll,
        }
    }

    /// The signal type a signal wait waits for; `None` for a timer.
    pub fn signal_type(&self) -> Option<&str> {
        match self {
            Wait::Timer { .. } => None,
            Wait::Signal { signal_type, .. } => Some(signal_type),
        }
    }

    /// The identity a signal must match (K-9.3); `None` for a timer.
    pub fn signal_identity(&self) -> Option<WaitIdentity> {
        match self {
            Wait::Timer { .. } => None,
            Wait::Signal { signal_type, wait_key, generation, step_index, poll_time: _ } => Some(WaitIdentity {
                signal_type: signal_type.clone(),
                wait_key: wait_key.clone(),
                generation: *generation,
                step_index: *step_index,
            }),
        }
    }
}

/// The stored shape of a [`Wait`]: a kind plus the fields either kind may carry.
#[derive(Serialize, Deserialize)]
struct WaitDoc {
    kind: WaitKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    signal_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    wait_key: Option<String>,
    #[serde(default)]
    generation: u64,
    step_index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    poll_time: Option<Instant>,
}

impl From<Wait> for WaitDoc {
    fn from(w: Wait) -> WaitDoc {
        match w {
            Wait::Timer { step_index, due } => WaitDoc {
                kind: WaitKind::Timer,
                signal_type: None,
                wait_key: None,
                generation: 0,
                step_index,
                poll_time: due,
            },
            Wait::Signal { signal_type, wait_key, generation, step_index, poll_time } => WaitDoc {
                kind: WaitKind::Signal,
                signal_type: Some(signal_type),
                wait_key: Some(wait_key),
                generation,
                step_index,
                poll_time,
            },
        }
    }
}

impl TryFrom<WaitDoc> for Wait {
    type Error = String;
    fn try_from(d: WaitDoc) -> std::result::Result<Wait, String> {
        Wait::from_parts(d.kind, d.signal_type, d.wait_key, d.generation, d.step_index, d.poll_time)
    }
}

impl Wait {
    /// Rebuild a wait from its stored fields (a store adapter's decoder): a timer's
    /// `poll_time` is its due time and its generation is ignored; a signal wait needs its
    /// `signal_type` and `wait_key` (the error names the missing field).
    pub fn from_parts(
        kind: WaitKind,
        signal_type: Option<String>,
        wait_key: Option<String>,
        generation: u64,
        step_index: u32,
        poll_time: Option<Instant>,
    ) -> std::result::Result<Wait, String> {
        match kind {
            WaitKind::Timer => Ok(Wait::Timer { step_index, due: poll_time }),
            WaitKind::Signal => Ok(Wait::Signal {
                signal_type: signal_type.ok_or("a signal wait has no signal_type")?,
                wait_key: wait_key.ok_or("a signal wait has no wait_key")?,
                generation,
                step_index,
                poll_time,
            }),
        }
    }
}

/// Identity of a signal wait: a signal activates the instance only on an exact match.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WaitIdentity {
    /// The wait's `signal_type`; compared for equality, never a pattern.
    pub signal_type: String,
    /// The wait's `wait_key` (which business object).
    pub wait_key: String,
    /// The round of waiting; a signal of an older generation never matches (K-9.6).
    pub generation: u64,
    /// The step holding the wait.
    pub step_index: u32,
}

/// Why a waiting step was resumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResumeKind {
    /// A sleep came due.
    Timer,
    /// A matching signal arrived.
    Signal,
    /// A signal wait's poll fallback came due.
    Poll,
}

/// The reason a waiting step resumed; carries no business data (K-2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resume {
    /// Timer, signal or poll.
    pub kind: ResumeKind,
    /// Which step it applies to.
    pub step_index: u32,
    /// The signal that woke it (signal resumes; K-2.0 identifier).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal_id: Option<String>,
}

impl Resume {
    /// The K-2.0 check: a `signal_id`, when present, follows the identifier rule.
    pub fn validate(&self) -> Result<()> {
        let Resume { kind: _, step_index: _, signal_id } = self;
        if let Some(s) = signal_id {
            validate::identifier("resume.signal_id", s)?;
        }
        Ok(())
    }
}

/// Both fingerprints, recorded when a worker pushed back an instance it cannot interpret (K-4.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FingerprintMismatch {
    /// Fingerprint stored on the instance.
    pub persisted: String,
    /// Fingerprint of the worker's definition.
    pub worker: String,
}

/// The durable execution record (K-2). One per `biz_key`, forever (K-3.2).
///
/// Cloning is counted per thread ([`instance_clones_on_this_thread`]): a whole copy of
/// the document is the most expensive thing the engine's hot path can do.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkflowInstance {
    /// Business-facing id (not the storage primary key); K-2.0 identifier, unique.
    pub workflow_id: WorkflowId,
    /// Which registered definition interprets the steps; claims filter on it (K-6.2).
    pub workflow_type: String,
    /// Permanent idempotency key: one instance per key, forever (K-3.2).
    pub biz_key: String,
    /// Where the instance stands; decides which guards can match (K-6.4).
    pub status: WorkflowStatus,
    /// Steps in definition order; names are document keys and unique.
    pub steps: Vec<Step>,
    /// Small, exact input snapshot.
    pub input: Value,
    /// step name → small output.
    #[serde(default)]
    pub output: BTreeMap<String, Value>,
    /// When the instance may next be claimed (lease end while claimed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimable_time: Option<Instant>,
    /// The current claim, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_token: Option<ClaimToken>,
    /// The wait, when waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<Wait>,
    /// Why the waiting step resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<Resume>,
    /// SHA-256 of the plan at creation (K-4.2).
    pub definition_fingerprint: String,
    /// Set by a fingerprint push-back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint_mismatch: Option<FingerprintMismatch>,
    /// Ready lane of the instance (K-13); only ever raised (promote-only).
    pub business_priority: Priority,
    /// Replays of the instance; `workflow_run = retry_count` (K-2.1).
    #[serde(default)]
    pub retry_count: u32,
    /// PrepareContext failures since the instance was created or last replayed (K-2.3);
    /// at `EngineConfig::prepare_attempts_max` the workflow fails (K-8).
    #[serde(default)]
    pub prepare_failures: u32,
    /// Plain writes (mark running, release, `failing`, `failed`, …) the store refused in
    /// this run (K-6.4: a refusal is deterministic): each hands the claim back once; at
    /// `REFUSED_WRITES_MAX` the workflow fails instead. Reset to 0 by replay.
    #[serde(default)]
    pub refused_writes: u32,
    /// +1 on every accepted write except claim and heartbeat (K-2.2).
    #[serde(default)]
    pub revision: u64,
    /// Time of the create write.
    pub created_at: Instant,
    /// Time of the last accepted write (the writer's clock).
    pub updated_at: Instant,
    /// When the instance reached a terminal status; cleared by replay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Instant>,
    /// What the failure path's compensation did (K-17.6), recorded with the `failed`
    /// write when the definition declares inverses; cleared by replay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensation: Option<crate::compensation::CompensationReport>,
    /// The W3C `traceparent` of the request that created the instance (its
    /// [`TraceParent`](crate::trace::TraceParent) form), so its activities join the
    /// caller's trace. Written only by the create; a replay or a resume keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_parent: Option<String>,
    /// An operator's request to the holder of the live claim (K-6.8): recorded under the
    /// holder's token, applied by the holder when its claim ends or by the next claimer
    /// before it starts anything; cleared when applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_request: Option<crate::operator_request::OperatorRequest>,
}

std::thread_local! {
    static INSTANCE_CLONES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many [`WorkflowInstance`]s were cloned on the calling thread since it started.
///
/// A diagnostic for tests that pin the engine's copies per workflow: it counts only clones
/// made on the calling thread, so such a test runs the engine on a current-thread runtime
/// (a multi-thread runtime spreads the clones over its workers) and takes the difference of
/// two readings.
///
/// ```
/// use kernel_core::domain::instance_clones_on_this_thread;
/// let before = instance_clones_on_this_thread();
/// // ... run the engine on this thread ...
/// assert!(instance_clones_on_this_thread() >= before);
/// ```
pub fn instance_clones_on_this_thread() -> u64 {
    INSTANCE_CLONES.with(std::cell::Cell::get)
}

impl Clone for WorkflowInstance {
    fn clone(&self) -> Self {
        INSTANCE_CLONES.with(|n| n.set(n.get().wrapping_add(1)));
        WorkflowInstance {
            workflow_id: self.workflow_id.clone(),
            workflow_type: self.workflow_type.clone(),
            biz_key: self.biz_key.clone(),
            status: self.status,
            steps: self.steps.clone(),
            input: self.input.clone(),
            output: self.output.clone(),
            claimable_time: self.claimable_time,
            claim_token: self.claim_token.clone(),
            wait: self.wait.clone(),
            resume: self.resume.clone(),
            definition_fingerprint: self.definition_fingerprint.clone(),
            fingerprint_mismatch: self.fingerprint_mismatch.clone(),
            business_priority: self.business_priority,
            retry_count: self.retry_count,
            prepare_failures: self.prepare_failures,
            refused_writes: self.refused_writes,
            revision: self.revision,
            created_at: self.created_at,
            updated_at: self.updated_at,
            finished_at: self.finished_at,
            compensation: self.compensation.clone(),
            trace_parent: self.trace_parent.clone(),
            operator_request: self.operator_request.clone(),
        }
    }
}

impl WorkflowInstance {
    /// The K-2.0 check of everything a create would store: `workflow_id`, `biz_key`,
    /// `workflow_type`, `definition_fingerprint` and a claim token follow the identifier
    /// rule; step names and output names are document keys ([`validate::key_name`]) and
    /// step names are unique; the wait identity and a resume's signal id are identifiers;
    /// input, each output and each checkpoint are at most `payload_bytes_max` serialized
    /// bytes (adapters pass [`validate::STORE_PAYLOAD_BYTES_MAX`] or their configured limit).
    ///
    /// Every store adapter calls it in `create`; a refusal is [`Error::InvalidInput`] and
    /// nothing is written.
    pub fn validate(&self, payload_bytes_max: usize) -> Result<()> {
        let WorkflowInstance {
            workflow_id,
            workflow_type,
            biz_key,
            status: _,
            steps,
            input,
            output,
            claimable_time: _,
            claim_token,
            wait,
            resume,
            definition_fingerprint,
            fingerprint_mismatch: _,
            business_priority: _,
            retry_count: _,
            prepare_failures: _,
            refused_writes: _,
            revision: _,
            created_at: _,
            updated_at: _,
            finished_at: _,
            compensation,
            trace_parent,
            operator_request,
        } = self;
        if let Some(c) = compensation {
            c.validate()?;
        }
        if let Some(r) = operator_request {
            r.validate()?;
        }
        if let Some(t) = trace_parent {
            crate::trace::TraceParent::parse(t)?;
        }
        validate::identifier("workflow_id", workflow_id.as_str())?;
        validate::identifier("biz_key", biz_key)?;
        validate::identifier("workflow_type", workflow_type)?;
        validate::identifier("definition_fingerprint", definition_fingerprint)?;
        let mut names = std::collections::BTreeSet::new();
        for (i, s) in steps.iter().enumerate() {
            validate::key_name(&format!("steps[{i}].name"), &s.name)?;
            if !names.insert(s.name.as_str()) {
                return Err(Error::invalid(
                    format!("steps[{i}].name"),
                    format_args!("duplicate step name `{}`", s.name),
                ));
            }
            if let Some(c) = &s.checkpoint {
                validate::payload(&format!("steps[{i}].checkpoint"), c, payload_bytes_max)?;
            }
        }
        validate::payload("input", input, payload_bytes_max)?;
        for (k, v) in output {
            validate::key_name("output", k)?;
            validate::payload(&format!("output.{k}"), v, payload_bytes_max)?;
        }
        if let Some(t) = claim_token {
            validate::identifier("claim_token", t.as_str())?;
        }
        if let Some(w) = wait {
            w.validate()?;
        }
        if let Some(r) = resume {
            r.validate()?;
        }
        Ok(())
    }

    /// `workflow_run`, the logical attempt of K-17.1.
    pub fn workflow_run(&self) -> u32 {
        self.retry_count
    }

    /// Index of a step by name.
    pub fn step_index(&self, name: &str) -> Option<usize> {
        self.steps.iter().position(|s| s.name == name)
    }

    /// The business round the input carries (`input.object_id`, `input.fencing_token`),
    /// read by the one rule of [`BusinessRound::of`] (K-12).
    pub fn round(&self) -> BusinessRound {
        BusinessRound::of(&self.input)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The enum keeps the stored shape of the kind-plus-options struct it replaced (K-2).
    #[test]
    fn wait_keeps_the_stored_shape() {
        let signal = Wait::Signal {
            signal_type: "approved".into(),
            wait_key: "doc:42".into(),
            generation: 3,
            step_index: 1,
            poll_time: Some(Instant::from_millis(60)),
        };
        let doc = json!({"kind": "signal", "signal_type": "approved", "wait_key": "doc:42", "generation": 3, "step_index": 1, "poll_time": 60});
        assert_eq!(serde_json::to_value(&signal).unwrap(), doc);
        assert_eq!(serde_json::from_value::<Wait>(doc).unwrap(), signal);
        let timer = Wait::Timer { step_index: 0, due: None };
        let doc = json!({"kind": "timer", "generation": 0, "step_index": 0});
        assert_eq!(serde_json::to_value(&timer).unwrap(), doc);
        assert_eq!(serde_json::from_value::<Wait>(doc).unwrap(), timer);
    }

    /// A signal wait without its identity is not a wait a store may hand back: the old
    /// shape read it as an empty identity, the enum refuses it.
    #[test]
    fn a_signal_wait_without_its_identity_is_refused() {
        for (doc, missing) in [
            (json!({"kind": "signal", "wait_key": "k", "step_index": 1}), "signal_type"),
            (json!({"kind": "signal", "signal_type": "t", "step_index": 1}), "wait_key"),
        ] {
            let err = serde_json::from_value::<Wait>(doc).unwrap_err().to_string();
            assert!(err.contains(missing), "{err}");
        }
        let w = Wait::from_parts(WaitKind::Timer, None, None, 7, 2, Some(Instant::from_millis(5))).unwrap();
        assert_eq!(
            (w.kind(), w.step_index(), w.poll_time(), w.signal_identity()),
            (WaitKind::Timer, 2, Some(Instant::from_millis(5)), None)
        );
        assert_eq!(w.due_resume(), ResumeKind::Timer);
        let w = Wait::from_parts(WaitKind::Signal, Some("t".into()), Some("k".into()), 7, 2, None).unwrap();
        assert_eq!((w.kind(), w.poll_time(), w.due_resume()), (WaitKind::Signal, None, ResumeKind::Poll));
        assert_eq!(w.signal_identity().unwrap().generation, 7);
    }
}
