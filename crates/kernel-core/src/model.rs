//! Domain types of K-2: the persisted [`WorkflowInstance`] and its parts.
//!
//! Times are [`Millis`] since the Unix epoch, read from the [`Clock`](crate::ports::Clock)
//! port; adapters store them natively (BSON DateTime in Mongo, scores in Redis).

use crate::error::{Error, Result};
use crate::id::{ClaimToken, WorkflowId};
use crate::validate;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// Milliseconds since the Unix epoch (or since the start of a manual clock).
pub type Millis = i64;

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
}

impl ErrorClass {
    /// The snake_case name used in documents and observations.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Transient => "transient",
            Self::Permanent => "permanent",
            Self::UnknownOutcome => "unknown_outcome",
            Self::Canceled => "canceled",
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
    pub elapsed_ms: i64,
    /// Time spent waiting for a permit.
    #[serde(default)]
    pub traffic_wait_ms: i64,
    /// Number of permit denials.
    #[serde(default)]
    pub traffic_waits: u32,
    /// Small, opaque state carried across suspensions and yields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<Value>,
    /// Last mark-running time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Millis>,
    /// Completion / failure time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Millis>,
}

impl Step {
    /// A fresh pending step.
    pub fn pending(name: impl Into<String>) -> Self {
        Step {
            name: name.into(),
            status: StepStatus::Pending,
            attempt: 0,
            error: None,
            elapsed_ms: 0,
            traffic_wait_ms: 0,
            traffic_waits: 0,
            checkpoint: None,
            started_at: None,
            finished_at: None,
        }
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

/// The persisted wait of a waiting instance (K-2, K-9).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wait {
    /// Timer or signal; decides whether the poll time resumes as `timer` or `poll`.
    pub kind: WaitKind,
    /// The signal type a matching signal carries (signal waits; K-2.0 identifier).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal_type: Option<String>,
    /// Which business object the signal is about (signal waits; K-2.0 identifier).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_key: Option<String>,
    /// Which round of waiting; stale generations never match (K-9.6).
    #[serde(default)]
    pub generation: u64,
    /// The step holding the wait.
    pub step_index: u32,
    /// When a timer is due, or a signal wait's poll fallback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_time: Option<Millis>,
}

impl Wait {
    /// The K-2.0 check of the wait identity: `signal_type` and `wait_key`, when present,
    /// follow the identifier rule.
    pub fn validate(&self) -> Result<()> {
        let Wait { kind: _, signal_type, wait_key, generation: _, step_index: _, poll_time: _ } = self;
        if let Some(s) = signal_type {
            validate::identifier("wait.signal_type", s)?;
        }
        if let Some(s) = wait_key {
            validate::identifier("wait.wait_key", s)?;
        }
        Ok(())
    }

    /// The identity a signal must match (K-9.3).
    pub fn signal_identity(&self) -> Option<WaitIdentity> {
        match self.kind {
            WaitKind::Timer => None,
            WaitKind::Signal => Some(WaitIdentity {
                signal_type: self.signal_type.clone().unwrap_or_default(),
                wait_key: self.wait_key.clone().unwrap_or_default(),
                generation: self.generation,
                step_index: self.step_index,
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    pub claimable_time: Option<Millis>,
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
    /// +1 on every accepted write except claim and heartbeat (K-2.2).
    #[serde(default)]
    pub revision: u64,
    /// Time of the create write.
    pub created_at: Millis,
    /// Time of the last accepted write (the writer's clock).
    pub updated_at: Millis,
    /// When the instance reached a terminal status; cleared by replay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Millis>,
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
            revision: _,
            created_at: _,
            updated_at: _,
            finished_at: _,
        } = self;
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

    /// The fencing token carried by the input (`input.fencing_token`), if any (K-12).
    pub fn fencing_token(&self) -> Option<&str> {
        self.input.get("fencing_token").and_then(Value::as_str)
    }
}
