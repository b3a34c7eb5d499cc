//! Dead letters (K-17.2): the record of a step the engine gave up on, kept for an operator.
//!
//! A dead letter is a record (workflow, step, error class, recorded inputs) plus a signal
//! wait of the workflow on an operator signal (K-9): no new workflow status, no worker held.
//! The operator retries the step (next epoch), completes it with a supplied output, or
//! fails it. This port is the record store only; writing the record, the signal wait and
//! applying a decision are the engine's. Listing dead letters reads these records and
//! never scans instances.

use crate::domain::{Instant, StepError};
use crate::error::{Error, Result};
use crate::id::WorkflowId;
use crate::validate;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Longest [`StepError::message`] of a dead letter, in bytes.
pub const DEAD_LETTER_MESSAGE_BYTES_MAX: usize = 4_096;
/// Longest [`DeadLetterDecision::reason`], in bytes.
pub const DEAD_LETTER_REASON_BYTES_MAX: usize = 4_096;
/// Largest page of [`DeadLetters::list`].
pub const DEAD_LETTER_LIST_MAX: usize = 1_000;
/// Most records one [`DeadLetters::purge_closed`] call deletes.
pub const DEAD_LETTER_PURGE_MAX: usize = 10_000;

/// Where a dead letter stands. It only moves forward: `open → decided → closed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeadLetterStatus {
    /// Recorded; waiting for an operator's decision.
    Open,
    /// An operator decided; the engine has not applied the decision yet.
    Decided,
    /// The engine applied the decision; kept for audit until retention purges it.
    Closed,
}

impl DeadLetterStatus {
    /// The snake_case name used in documents and rows.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Decided => "decided",
            Self::Closed => "closed",
        }
    }
}

/// What an operator decided for a dead letter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum DeadLetterAction {
    /// Run the step again, in the next epoch.
    Retry,
    /// Complete the step with this output (payload-limited).
    Complete {
        /// The step's output, as the activity would have returned it.
        output: Value,
    },
    /// Fail the step (and so the workflow, as a permanent error would).
    Fail,
}

/// An operator's decision on a dead letter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetterDecision {
    /// What to do.
    pub action: DeadLetterAction,
    /// Who decided (a K-2.0 identifier).
    pub actor: String,
    /// Why, for the audit (at most [`DEAD_LETTER_REASON_BYTES_MAX`] bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When (the caller's `Clock` reading).
    pub decided_at: Instant,
}

impl DeadLetterDecision {
    /// The K-2.0 check of a decision, called by every adapter before any I/O: `actor`
    /// follows the identifier rule, `reason` is at most [`DEAD_LETTER_REASON_BYTES_MAX`]
    /// bytes without NUL, a `Complete` output passes [`validate::payload`] against
    /// [`STORE_PAYLOAD_BYTES_MAX`](validate::STORE_PAYLOAD_BYTES_MAX). A refusal is
    /// [`Error::InvalidInput`] and nothing is written.
    ///
    /// ```
    /// use kernel_core::domain::Instant;
    /// use kernel_core::ports::{DeadLetterAction, DeadLetterDecision};
    /// let mut d = DeadLetterDecision {
    ///     action: DeadLetterAction::Retry, actor: "ops:alice".into(), reason: None,
    ///     decided_at: Instant::ZERO,
    /// };
    /// assert!(d.validate().is_ok());
    /// d.actor = String::new();
    /// assert!(d.validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<()> {
        let DeadLetterDecision { action, actor, reason, decided_at: _ } = self;
        validate::identifier("decision.actor", actor)?;
        if let Some(r) = reason {
            text("decision.reason", r, DEAD_LETTER_REASON_BYTES_MAX)?;
        }
        match action {
            DeadLetterAction::Complete { output } => {
                validate::payload("decision.output", output, validate::STORE_PAYLOAD_BYTES_MAX)
            }
            DeadLetterAction::Retry | DeadLetterAction::Fail => Ok(()),
        }
    }
}

/// A free text of at most `max` bytes without NUL (no store can hold NUL in every place).
pub(super) fn text(field: &str, s: &str, max: usize) -> Result<()> {
    if s.len() > max {
        return Err(Error::invalid(field, format_args!("{} bytes exceeds the limit of {max}", s.len())));
    }
    if s.contains('\0') {
        return Err(Error::invalid(field, "contains NUL, which not every store can hold"));
    }
    Ok(())
}

/// A dead letter (K-17.2): a step the engine gave up on, with what it needs to run it again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// Unique id, a K-2.0 identifier; the engine uses the step's idempotency key (K-17.1),
    /// so recording again after a crash finds the same record.
    pub id: String,
    /// The workflow whose step this is.
    pub workflow_id: WorkflowId,
    /// Its type.
    pub workflow_type: String,
    /// The step's name.
    pub step: String,
    /// The step's index in the workflow.
    pub step_index: u32,
    /// The workflow run (replay round) the step belongs to.
    pub run: u32,
    /// The step's epoch; a retry decision runs the step in the next one.
    pub epoch: u32,
    /// The last attempt's error (class and message, at most
    /// [`DEAD_LETTER_MESSAGE_BYTES_MAX`] bytes).
    pub error: StepError,
    /// The step's recorded inputs (payload-limited).
    pub inputs: Value,
    /// When it was recorded (the caller's `Clock` reading).
    pub created_at: Instant,
    /// Where it stands.
    pub status: DeadLetterStatus,
    /// The operator's decision, once decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<DeadLetterDecision>,
    /// When the engine closed it, once closed; retention purges by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_at: Option<Instant>,
}

impl DeadLetter {
    /// The K-2.0 check of a record, called by every adapter before any I/O: `id`,
    /// `workflow_id` and `workflow_type` follow the identifier rule, `step` the key-name
    /// rule, `error.message` is at most [`DEAD_LETTER_MESSAGE_BYTES_MAX`] bytes without
    /// NUL, `inputs` passes [`validate::payload`] against
    /// [`STORE_PAYLOAD_BYTES_MAX`](validate::STORE_PAYLOAD_BYTES_MAX), and a decision, if
    /// any, passes [`DeadLetterDecision::validate`]. A refusal is [`Error::InvalidInput`]
    /// naming the field, and nothing is written.
    ///
    /// ```
    /// use kernel_core::domain::{ErrorClass, Instant, StepError};
    /// use kernel_core::ports::{DeadLetter, DeadLetterStatus};
    /// let mut dl = DeadLetter {
    ///     id: "wf-1:charge:0".into(), workflow_id: "wf-1".into(), workflow_type: "order".into(),
    ///     step: "charge".into(), step_index: 2, run: 0, epoch: 0,
    ///     error: StepError { class: ErrorClass::Permanent, message: "card declined".into() },
    ///     inputs: serde_json::json!({"amount": 12}), created_at: Instant::ZERO,
    ///     status: DeadLetterStatus::Open, decision: None, closed_at: None,
    /// };
    /// assert!(dl.validate_new().is_ok());
    /// dl.error.message = "x".repeat(4_097);
    /// assert!(dl.validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<()> {
        let DeadLetter {
            id,
            workflow_id,
            workflow_type,
            step,
            step_index: _,
            run: _,
            epoch: _,
            error,
            inputs,
            created_at: _,
            status: _,
            decision,
            closed_at: _,
        } = self;
        validate::identifier("id", id)?;
        validate::identifier("workflow_id", workflow_id.as_str())?;
        validate::identifier("workflow_type", workflow_type)?;
        validate::key_name("step", step)?;
        text("error.message", &error.message, DEAD_LETTER_MESSAGE_BYTES_MAX)?;
        validate::payload("inputs", inputs, validate::STORE_PAYLOAD_BYTES_MAX)?;
        if let Some(d) = decision {
            d.validate()?;
        }
        Ok(())
    }

    /// The check of [`DeadLetters::record`]: [`validate`](Self::validate), and a new record
    /// is `Open` with no decision and no `closed_at`.
    pub fn validate_new(&self) -> Result<()> {
        self.validate()?;
        if self.status != DeadLetterStatus::Open {
            return Err(Error::invalid(
                "status",
                format_args!("a new dead letter is open, not {}", self.status.as_str()),
            ));
        }
        if self.decision.is_some() {
            return Err(Error::invalid("decision", "a new dead letter has no decision"));
        }
        if self.closed_at.is_some() {
            return Err(Error::invalid("closed_at", "a new dead letter is not closed"));
        }
        Ok(())
    }
}

/// The shared check of a [`DeadLetters::list`] call: `limit` in
/// `1..=`[`DEAD_LETTER_LIST_MAX`], `after` an identifier.
pub fn validate_dead_letter_list(after: Option<&str>, limit: usize) -> Result<()> {
    validate::page(after, limit, DEAD_LETTER_LIST_MAX)
}

/// The shared check of a [`DeadLetters::purge_closed`] limit: `1..=`[`DEAD_LETTER_PURGE_MAX`].
pub fn validate_dead_letter_purge(limit: usize) -> Result<()> {
    validate::limit_in("limit", limit, DEAD_LETTER_PURGE_MAX)
}

/// What [`DeadLetters::decide`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecideOutcome {
    /// The record was open; this decision is now stored and the record is decided.
    Decided,
    /// Another decision was stored first (returned as stored); nothing changed.
    AlreadyDecided(DeadLetterDecision),
    /// The record is closed already; nothing changed.
    Closed,
    /// No record has that id; nothing was written.
    NotFound,
}

/// What a `decide` whose conditional `open → decided` write missed reports, from the
/// record read back after the miss — the one rule every adapter follows:
/// `Ok(Some(outcome))`, or `Ok(None)` when the record reads open again (it was purged and
/// recorded anew in between: the adapter tries its write once more). A decided record
/// without a decision is [`Error::Corrupt`](crate::Error::Corrupt).
pub fn decide_missed(id: &str, found: Option<DeadLetter>) -> Result<Option<DecideOutcome>> {
    match found {
        None => Ok(Some(DecideOutcome::NotFound)),
        Some(d) => match (d.status, d.decision) {
            (DeadLetterStatus::Decided, Some(existing)) => Ok(Some(DecideOutcome::AlreadyDecided(existing))),
            (DeadLetterStatus::Decided, None) => {
                Err(crate::Error::corrupt(format!("dead letter `{id}` is decided without a decision")))
            }
            (DeadLetterStatus::Closed, _) => Ok(Some(DecideOutcome::Closed)),
            (DeadLetterStatus::Open, _) => Ok(None),
        },
    }
}

/// The dead-letter record store (K-17.2).
///
/// # Contract
///
/// - **One record per id.** `record` inserts only when no record has the id; a record
///   is never overwritten, so recording again after a crash changes nothing.
/// - **Forward only.** A record moves `open → decided → closed`, each move one
///   conditional single-record write (`decide`: `status = open`; `close`:
///   `status = decided`), so of concurrent calls exactly one makes the move and the others
///   see what is there. Only `purge_closed` deletes, and only closed records.
/// - **Caller's time.** Every time (`created_at`, `decided_at`, `closed_at`, the purge
///   cutoff) is the caller's `Clock` reading; an adapter never reads its own clock.
/// - **Checked before I/O.** Every input is checked first ([`DeadLetter::validate_new`],
///   [`DeadLetterDecision::validate`], the identifier rule for ids and cursors, the page
///   and purge bounds); a refusal is [`Error::InvalidInput`] and nothing is written.
/// - **Bounded.** A page is at most [`DEAD_LETTER_LIST_MAX`] records, a purge at most
///   [`DEAD_LETTER_PURGE_MAX`]; inputs and outputs are payload-limited, texts are at most
///   4 096 bytes. Closed records are kept until purged (retention is the caller's).
/// - Object safe: deployments hold it as `Arc<dyn DeadLetters>`.
#[async_trait::async_trait]
pub trait DeadLetters: Send + Sync + 'static {
    /// Insert `dl` as an open record; `true` when inserted.
    ///
    /// # Contract
    /// `dl` must pass [`DeadLetter::validate_new`] (open, no decision, not closed), else
    /// [`Error::InvalidInput`] and nothing is written. Atomic on the unique `id`: when a
    /// record has that id already it is left unchanged (whatever its status and fields) and
    /// the call returns `false` — the idempotent re-record after a crash.
    async fn record(&self, dl: &DeadLetter) -> Result<bool>;

    /// Read one record.
    ///
    /// # Contract
    /// Read-only; the record as last written, or `None` (never recorded, or purged). A bad
    /// id is [`Error::InvalidInput`].
    async fn get(&self, id: &str) -> Result<Option<DeadLetter>>;

    /// A page of records, in `status` when given, ordered by `id` ascending (byte order),
    /// with ids strictly greater than `after`.
    ///
    /// # Contract
    /// Read-only; at most `limit` records, `limit` in `1..=`[`DEAD_LETTER_LIST_MAX`] (else
    /// [`Error::InvalidInput`]). Reads only the dead-letter records, never instances.
    async fn list(
        &self,
        status: Option<DeadLetterStatus>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>>;

    /// Store an operator's decision: `open → decided`.
    ///
    /// # Contract
    /// One conditional write on `id = id AND status = open` that sets the status and the
    /// decision together. On a miss the record is read and reported: `AlreadyDecided` with
    /// the stored decision, `Closed`, or `NotFound`; nothing changed. Of concurrent
    /// decisions on one open record exactly one returns `Decided`. A decision failing
    /// [`DeadLetterDecision::validate`] or a bad id is [`Error::InvalidInput`], nothing
    /// written.
    async fn decide(&self, id: &str, decision: &DeadLetterDecision) -> Result<DecideOutcome>;

    /// The engine applied the decision: `decided → closed` with `closed_at = now`.
    ///
    /// # Contract
    /// One conditional write on `id = id AND status = decided`; `true` when this call
    /// closed it, `false` when the record is open, closed already or absent (nothing
    /// changed). A bad id is [`Error::InvalidInput`].
    async fn close(&self, id: &str, now: Instant) -> Result<bool>;

    /// Retention: delete closed records with `closed_at < before`; returns how many.
    ///
    /// # Contract
    /// At most `limit` records per call, `limit` in `1..=`[`DEAD_LETTER_PURGE_MAX`] (else
    /// [`Error::InvalidInput`], nothing deleted); never an open or decided record, each
    /// deletion conditional on the record being closed. Which of the eligible records go
    /// first is unspecified; a caller repeats until the call returns less than `limit`.
    async fn purge_closed(&self, before: Instant, limit: usize) -> Result<u64>;
}

/// `dyn DeadLetters`.
pub type DynDeadLetters = dyn DeadLetters;
