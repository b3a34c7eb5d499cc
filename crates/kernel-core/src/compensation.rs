//! Compensation on the failure path (K-17.6): what the engine records on an instance after
//! running the inverses of its completed side-effecting steps.

use crate::domain::Instant;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// Longest error message kept per inverse, in bytes.
pub const INVERSE_ERROR_BYTES_MAX: usize = 512;

/// How the compensation of a failed workflow ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompensationOutcome {
    /// Every completed compensable step was undone.
    Recovered,
    /// Some were undone, some could not be (and no person was asked).
    PartiallyRecovered,
    /// None could be undone (and no person was asked).
    CompensationFailed,
    /// At least one inverse kept failing and was handed to a person (a human task).
    Escalated,
    /// Not over yet (K-17.6 amendment): the progress recorded on a `failing` instance when
    /// a claim hands it back before every inverse has run — the entries so far, the last
    /// one [`Retrying`](InverseResult::Retrying) when its inverse is tried again at the
    /// report's `at`.
    InProgress,
}

impl CompensationOutcome {
    /// The snake_case name used in documents and rows.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Recovered => "recovered",
            Self::PartiallyRecovered => "partially_recovered",
            Self::CompensationFailed => "compensation_failed",
            Self::Escalated => "escalated",
            Self::InProgress => "in_progress",
        }
    }
}

/// How one inverse ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InverseResult {
    /// The inverse completed.
    Compensated,
    /// It kept failing; nobody was asked.
    Failed,
    /// It kept failing; a human task was opened.
    Escalated,
    /// It failed and is tried again (only in an [`InProgress`](CompensationOutcome::InProgress)
    /// report; `attempts` counts the attempts made so far).
    Retrying,
}

/// One inverse run by the compensation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InverseRun {
    /// The compensated step's name.
    pub step: String,
    /// How it ended.
    pub result: InverseResult,
    /// Attempts made (at least 1).
    pub attempts: u32,
    /// The last error, when it did not complete (at most [`INVERSE_ERROR_BYTES_MAX`] bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The human task opened for it, when escalated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
}

/// What the compensation of a failed workflow did, recorded on the instance with its
/// `failed` transition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompensationReport {
    /// Overall.
    pub outcome: CompensationOutcome,
    /// One entry per inverse, in the order they ran (reverse completion order).
    pub steps: Vec<InverseRun>,
    /// When the compensation ended (the engine's `Clock`); in an
    /// [`InProgress`](CompensationOutcome::InProgress) report, when the compensation may go
    /// on (the retrying inverse's next try).
    pub at: Instant,
}

impl CompensationReport {
    /// The overall outcome of `steps`: all compensated (or none to run) → recovered; any
    /// escalated → escalated; else some compensated → partially recovered; else failed.
    pub fn outcome_of(steps: &[InverseRun]) -> CompensationOutcome {
        let done = steps.iter().filter(|s| s.result == InverseResult::Compensated).count();
        if done == steps.len() {
            CompensationOutcome::Recovered
        } else if steps.iter().any(|s| s.result == InverseResult::Escalated) {
            CompensationOutcome::Escalated
        } else if done > 0 {
            CompensationOutcome::PartiallyRecovered
        } else {
            CompensationOutcome::CompensationFailed
        }
    }

    /// The K-2.0 check every adapter runs before writing a report: step names follow the
    /// key-name rule, at most [`STEPS_MAX`](crate::definition::STEPS_MAX) entries (a
    /// definition's step bound), errors at most
    /// [`INVERSE_ERROR_BYTES_MAX`] bytes without NUL, task ids identifiers, the outcome
    /// agrees with the steps.
    pub fn validate(&self) -> Result<()> {
        let steps_max = crate::definition::STEPS_MAX;
        let CompensationReport { outcome, steps, at: _ } = self;
        if steps.len() > steps_max {
            return Err(Error::invalid(
                "compensation.steps",
                format_args!("{} entries exceed the limit of {steps_max}", steps.len()),
            ));
        }
        for InverseRun { step, result: _, attempts: _, error, task } in steps {
            crate::validate::key_name("compensation.steps.step", step)?;
            if let Some(e) = error {
                if e.len() > INVERSE_ERROR_BYTES_MAX || e.contains('\0') {
                    return Err(Error::invalid(
                        "compensation.steps.error",
                        format_args!("at most {INVERSE_ERROR_BYTES_MAX} bytes without NUL"),
                    ));
                }
            }
            if let Some(t) = task {
                crate::validate::identifier("compensation.steps.task", t)?;
            }
        }
        if *outcome == CompensationOutcome::InProgress {
            return Ok(());
        }
        if steps.iter().any(|s| s.result == InverseResult::Retrying) {
            return Err(Error::invalid("compensation.steps.result", "retrying only in a report in progress"));
        }
        if *outcome != Self::outcome_of(steps) {
            return Err(Error::invalid(
                "compensation.outcome",
                format_args!("{} does not agree with its steps", outcome.as_str()),
            ));
        }
        Ok(())
    }
}
