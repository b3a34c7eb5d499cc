//! The step logic as plain values (sans-IO): what an invocation's result means for its step
//! ([`classify`], the K-7.4 order) and how the outcomes of one wave become one write
//! ([`resolve_wave`], K-4.5). No locks, no ports, no clock: the claim driver reads the
//! facts, calls these functions and performs the writes they describe.

use crate::activity::{ActivityError, StepOutcome};
use crate::definition::{OnFailed, RetryPolicy, StepDef};
use crate::domain::{DurationMs, ErrorClass, Instant, StepError, Wait};
use crate::transition::Transition;
use crate::validate;
use serde_json::Value;

/// The settings of a step that decide what a failure means (K-4.1, K-7.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StepPolicy {
    /// Retries after the first attempt; a retryable error at `attempt <= max_retry` retries.
    pub(crate) max_retry: u32,
    /// Where the delay of a retry comes from.
    pub(crate) retry: RetryPolicy,
    /// Whether a step that failed for good is skipped or fails the workflow.
    pub(crate) on_failed: OnFailed,
    /// Total time one logical attempt may spend retrying, from its first retryable failure.
    pub(crate) max_retry_duration: Option<DurationMs>,
}

impl From<&StepDef> for StepPolicy {
    fn from(sd: &StepDef) -> Self {
        StepPolicy {
            max_retry: sd.get_max_retry(),
            retry: sd.retry_policy(),
            on_failed: sd.get_on_failed(),
            max_retry_duration: sd.get_max_retry_duration(),
        }
    }
}

/// The facts of one entry into a step's activity that classification reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Index of the step in the instance.
    pub(crate) index: usize,
    /// Physical attempt of this entry (already counted by mark-running, K-2.1).
    pub(crate) attempt: u32,
    /// Time the invocation took, added to the step's `elapsed_ms`.
    pub(crate) elapsed_ms: DurationMs,
    /// The engine's clock when the result is classified: the origin of a sleep's due time.
    pub(crate) now: Instant,
    /// The step's failure settings.
    pub(crate) policy: StepPolicy,
    /// Largest serialized output or checkpoint.
    pub(crate) payload_bytes_max: usize,
    /// Longest stored error message; longer ones are cut at a character boundary.
    pub(crate) error_message_bytes_max: usize,
    /// When the logical attempt first failed retryably (`max_retry_duration` counts from
    /// it; `None`: this would be the first).
    pub(crate) retrying_since: Option<Instant>,
    /// Delay of a parked step's hand-back (the fingerprint push-back delay, K-4.3).
    pub(crate) park_ms: DurationMs,
    /// The operator signal wait of a step whose policy is `dead_letter` (K-17.2).
    pub(crate) dead_letter: Option<Wait>,
}

/// What one invocation comes to for its step (K-7.4).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StepResult {
    /// A valid output: committed with the step in one `CompleteStep` write.
    Complete {
        /// The step's output.
        output: Value,
        /// Time the invocation took.
        elapsed_ms: DurationMs,
    },
    /// Failed for good under `on_failed = skip`: the step is skipped with its error and the
    /// wave goes on (K-7.4 row 3).
    Skipped {
        /// The error, stored on the step.
        error: StepError,
        /// Time the invocation took.
        elapsed_ms: DurationMs,
    },
    /// An outcome that ends the claim once every sibling of the wave returned (K-4.5).
    Halt(Halt),
}

/// An outcome that stops the claim; the most severe of a wave wins (K-4.5).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Halt {
    /// The activity reported cancellation: step skipped, workflow canceled (K-7.4 row 1).
    Canceled {
        /// The cancellation error, stored on the step.
        error: StepError,
        /// Time the invocation took.
        elapsed_ms: DurationMs,
    },
    /// Failed for good: step failed, workflow failing (K-7.4 row 4).
    Failed {
        /// The error, stored on the step.
        error: StepError,
        /// Time the invocation took.
        elapsed_ms: DurationMs,
    },
    /// Failed for good under `on_failed = dead_letter` (K-17.2): the step waits with its
    /// error on the operator signal `wait`; the dead-letter record follows the commit.
    DeadLetter {
        /// The operator signal wait.
        wait: Wait,
        /// The error as the step and the record keep it.
        error: StepError,
        /// Time the invocation took.
        elapsed_ms: DurationMs,
    },
    /// The step cannot run on this worker (K-17.4, `ErrorClass::Parked`): handed back
    /// after `delay_ms` as a fingerprint mismatch is (K-4.3) — the attempt rolled back, the
    /// checkpoint kept, nothing counted against the retries.
    Park {
        /// Why, stored on the step.
        error: StepError,
        /// The push-back delay.
        delay_ms: DurationMs,
        /// Time the invocation took.
        elapsed_ms: DurationMs,
    },
    /// A retryable error within the retry budget (K-7.4 row 2).
    Retry {
        /// The error, stored on the step for the next attempt to see.
        error: StepError,
        /// Delay drawn from the step's retry policy.
        delay_ms: DurationMs,
        /// Time the invocation took.
        elapsed_ms: DurationMs,
    },
    /// The step's permit was denied or could not be checked (K-7.1, K-14): it never ran.
    Deferred {
        /// How long until the claim may be taken again.
        delay_ms: DurationMs,
    },
    /// A sleep or a signal wait (K-9.1).
    Suspend {
        /// The wait to store on the instance.
        wait: Wait,
        /// Saved for the next entry.
        checkpoint: Option<Value>,
        /// Time the invocation took.
        elapsed_ms: DurationMs,
    },
    /// Hand the worker back and run again soon (K-7.4).
    Yield {
        /// Saved for the next entry.
        checkpoint: Option<Value>,
        /// Time the invocation took.
        elapsed_ms: DurationMs,
    },
}

impl Halt {
    /// K-4.5 rank, higher wins: canceled > failed > dead letter > retry release > permit
    /// deferral > suspend > yield.
    pub(crate) fn rank(&self) -> u8 {
        match self {
            Halt::Yield { .. } => 1,
            Halt::Suspend { .. } => 2,
            Halt::Deferred { .. } => 3,
            Halt::Park { .. } | Halt::Retry { .. } => 4,
            Halt::DeadLetter { .. } => 5,
            Halt::Failed { .. } => 6,
            Halt::Canceled { .. } => 7,
        }
    }

    /// This outcome's write when it wins its wave, and what follows the commit.
    fn winning(self, index: usize, release_delay_ms: DurationMs, now: Instant) -> Resolution {
        match self {
            Halt::Canceled { error, elapsed_ms } => Resolution {
                transition: Transition::activity_canceled(index, error, elapsed_ms, now),
                then: AfterWave::Canceled,
            },
            Halt::Failed { error, elapsed_ms } => Resolution {
                transition: Transition::step_failed(index, error, elapsed_ms, now),
                then: AfterWave::Failing,
            },
            Halt::DeadLetter { wait, error, elapsed_ms } => {
                let kept = kept_error(error.clone());
                Resolution {
                    transition: Transition::dead_letter(index, wait, kept, elapsed_ms, now),
                    then: AfterWave::DeadLettered { index, error },
                }
            }
            Halt::Park { error, delay_ms, elapsed_ms } => Resolution {
                transition: Transition::park_step(index, error, elapsed_ms, now)
                    .release_until(now.saturating_add(delay_ms)),
                then: AfterWave::Released { at: now.saturating_add(delay_ms) },
            },
            Halt::Retry { error, elapsed_ms, .. } => Resolution {
                // Saturating: the delay is bounded by the policy's validated cap (K-7.4).
                transition: Transition::step_retry(index, error, elapsed_ms, now)
                    .release_until(now.saturating_add(release_delay_ms)),
                then: AfterWave::Released { at: now.saturating_add(release_delay_ms) },
            },
            Halt::Deferred { delay_ms } => Resolution {
                // Saturating: the claim clamps a deferral to a configurable span (K-14).
                transition: Transition::permit_deferral(index, delay_ms, now)
                    .release_until(now.saturating_add(delay_ms)),
                then: AfterWave::Released { at: now.saturating_add(delay_ms) },
            },
            Halt::Suspend { wait, checkpoint, elapsed_ms } => Resolution {
                transition: Transition::suspend(index, wait.clone(), checkpoint, elapsed_ms, now),
                then: AfterWave::Suspended { wait },
            },
            Halt::Yield { checkpoint, elapsed_ms } => Resolution {
                transition: Transition::yield_step(index, checkpoint, elapsed_ms, now),
                then: AfterWave::Yielded { at: now },
            },
        }
    }

    /// This outcome's step patch when another outcome won: no claim or wait change. A
    /// failed sibling also moves the workflow to `failing`, which the winner (a failure:
    /// only a cancellation outranks it) does anyway. A canceled sibling leaves nothing: a
    /// cancellation is the winner or is dropped with the winning one.
    fn sibling(self, index: usize, now: Instant, winner_rank: u8) -> Option<Transition> {
        let dead_letter_rank = 5;
        Some(match self {
            // Beside another dead letter: pending with its error; the claim records its
            // dead letter too, and it waits for its own decision at the next claim.
            Halt::DeadLetter { error, elapsed_ms, .. } if winner_rank == dead_letter_rank => {
                Transition::dead_letter_sibling(index, kept_error(error), elapsed_ms, now)
            }
            Halt::Park { error, elapsed_ms, .. } => Transition::park_step(index, error, elapsed_ms, now),
            Halt::Canceled { .. } => return None,
            // Only a failure or a cancellation outranks a dead letter: the workflow fails.
            Halt::Failed { error, elapsed_ms } | Halt::DeadLetter { error, elapsed_ms, .. } => {
                Transition::step_failed(index, error, elapsed_ms, now)
            }
            Halt::Retry { error, elapsed_ms, .. } => Transition::step_retry(index, error, elapsed_ms, now),
            Halt::Deferred { delay_ms } => Transition::permit_deferral(index, delay_ms, now),
            Halt::Suspend { checkpoint, elapsed_ms, .. } | Halt::Yield { checkpoint, elapsed_ms } => {
                Transition::park_sibling(index, checkpoint, elapsed_ms, now)
            }
        })
    }
}

/// The error a dead-lettered step keeps: permanent (what marks a dead-lettered step when
/// it wakes); the dead-letter record keeps the original class.
pub(crate) fn kept_error(error: StepError) -> StepError {
    match error.class {
        ErrorClass::Permanent => error,
        class => StepError {
            class: ErrorClass::Permanent,
            message: format!("dead-lettered ({}): {}", class.as_str(), error.message),
        },
    }
}

/// What the claim does once the wave's write committed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AfterWave {
    /// The workflow is canceled: terminal frame only, no finalizer.
    Canceled,
    /// The workflow is failing: run the failure path (K-8).
    Failing,
    /// The claim is released until `at`: enqueue for then.
    Released {
        /// The stored `claimable_time`.
        at: Instant,
    },
    /// The instance waits: consume an early signal for this wait (K-9.4).
    Suspended {
        /// The stored wait.
        wait: Wait,
    },
    /// The step yielded: enqueue for `at` (now).
    Yielded {
        /// The stored `claimable_time`.
        at: Instant,
    },
    /// The step was dead-lettered: record the dead letter (K-17.2).
    DeadLettered {
        /// The step.
        index: usize,
        /// Its error.
        error: StepError,
    },
}

/// The one write that ends a wave, and what follows it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Resolution {
    /// Written under the running token guard (K-6.4).
    pub(crate) transition: Transition,
    /// What the claim does after the commit.
    pub(crate) then: AfterWave,
}

/// Classify an invocation's result (K-7.4): a valid completion or request is taken as it
/// is; an invalid one (output or checkpoint too large, a bad sleep or signal spec) becomes
/// a permanent error; an error then goes through the K-7.4 order — canceled, retryable
/// within `max_retry`, `on_failed = skip`, failed. `jitter` is drawn only when a retry is
/// scheduled, so a seeded id source gives the same delays on every replay.
pub(crate) fn classify(
    result: Result<StepOutcome, ActivityError>,
    entry: &Entry,
    jitter: impl FnOnce() -> u64,
) -> StepResult {
    let e = match accept(result, entry) {
        Ok(r) => return r,
        Err(e) => e,
    };
    let error = StepError { class: e.class, message: stored_text(&e.message, entry.error_message_bytes_max) };
    let elapsed_ms = entry.elapsed_ms;
    let policy = entry.policy;
    let within_time = match (policy.max_retry_duration, entry.retrying_since) {
        (Some(max), Some(since)) => entry.now - since < max,
        _ => true,
    };
    match e.class {
        ErrorClass::Canceled => StepResult::Halt(Halt::Canceled { error, elapsed_ms }),
        // Not a failure of the step: handed back for a worker that can run it (K-4.3).
        ErrorClass::Parked => StepResult::Halt(Halt::Park { error, delay_ms: entry.park_ms, elapsed_ms }),
        ErrorClass::Transient | ErrorClass::UnknownOutcome if entry.attempt <= policy.max_retry && within_time => {
            let delay_ms = policy.retry.delay_ms(entry.attempt, jitter());
            StepResult::Halt(Halt::Retry { error, delay_ms, elapsed_ms })
        }
        // K-17.2: an outcome still unknown past the step's bounds is dead-lettered whenever
        // the engine keeps dead letters — never retried blindly, never silently failed.
        ErrorClass::UnknownOutcome if entry.dead_letter.is_some() => match &entry.dead_letter {
            Some(wait) => StepResult::Halt(Halt::DeadLetter { wait: wait.clone(), error, elapsed_ms }),
            None => StepResult::Halt(Halt::Failed { error, elapsed_ms }),
        },
        _ if policy.on_failed == OnFailed::Skip => StepResult::Skipped { error, elapsed_ms },
        _ if policy.on_failed == OnFailed::DeadLetter => match &entry.dead_letter {
            Some(wait) => StepResult::Halt(Halt::DeadLetter { wait: wait.clone(), error, elapsed_ms }),
            None => StepResult::Halt(Halt::Failed { error, elapsed_ms }),
        },
        _ => StepResult::Halt(Halt::Failed { error, elapsed_ms }),
    }
}

/// A result the activity asked for, checked against the limits; the error to classify
/// when it is an error or an invalid request.
fn accept(result: Result<StepOutcome, ActivityError>, entry: &Entry) -> Result<StepResult, ActivityError> {
    let limit = entry.payload_bytes_max;
    let perm = |e: crate::Error| ActivityError::permanent(e.to_string());
    let checkpoint_fits = |cp: &Option<Value>| match cp {
        Some(v) => validate::payload("checkpoint", v, limit).map_err(perm),
        None => Ok(()),
    };
    let (index, now, elapsed_ms) = (entry.index, entry.now, entry.elapsed_ms);
    match result? {
        StepOutcome::Complete(output) => {
            validate::payload("output", &output, limit).map_err(perm)?;
            Ok(StepResult::Complete { output, elapsed_ms })
        }
        StepOutcome::Sleep { delay_ms, checkpoint } => {
            checkpoint_fits(&checkpoint)?;
            validate::positive_ms("sleep.delay_ms", delay_ms).map_err(perm)?;
            // A due time past the range of time is a bad request, not a wrapped time (K-7).
            let due = now.try_add(delay_ms, "sleep.delay_ms").map_err(perm)?;
            let wait = Wait::Timer { step_index: index as u32, due: Some(due) };
            Ok(StepResult::Halt(Halt::Suspend { wait, checkpoint, elapsed_ms }))
        }
        StepOutcome::WaitForSignal(spec) => {
            checkpoint_fits(&spec.checkpoint)?;
            validate::identifier("signal_type", &spec.signal_type).map_err(perm)?;
            validate::identifier("wait_key", &spec.wait_key).map_err(perm)?;
            let poll_time = match spec.poll_after_ms {
                Some(ms) => {
                    validate::positive_ms("poll_after_ms", ms).map_err(perm)?;
                    Some(now.try_add(ms, "poll_after_ms").map_err(perm)?)
                }
                None => None,
            };
            let wait = Wait::Signal {
                signal_type: spec.signal_type,
                wait_key: spec.wait_key,
                generation: spec.generation,
                step_index: index as u32,
                poll_time,
            };
            Ok(StepResult::Halt(Halt::Suspend { wait, checkpoint: spec.checkpoint, elapsed_ms }))
        }
        StepOutcome::Yield { checkpoint } => {
            checkpoint_fits(&checkpoint)?;
            Ok(StepResult::Halt(Halt::Yield { checkpoint, elapsed_ms }))
        }
    }
}

/// Resolve a wave (K-4.5). `wave` lists every step of the wave in order, `None` for a step
/// whose completion or skip is already committed. Returns `None` when the claim continues
/// (nothing halted); otherwise the one write that ends the wave: the highest-ranked outcome
/// wins (ties go to the earliest step), a retry waits for the longest delay of the retrying
/// steps, the other halted steps add their own step patch (a suspending or yielding sibling
/// is left pending with its checkpoint, attempt rolled back), and a cancellation drops them.
pub(crate) fn resolve_wave(mut wave: Vec<(usize, Option<Halt>)>, now: Instant) -> Option<Resolution> {
    let win = wave
        .iter()
        .enumerate()
        .filter_map(|(pos, (_, h))| h.as_ref().map(|h| (pos, h.rank())))
        .max_by_key(|&(pos, rank)| (rank, std::cmp::Reverse(pos)))
        .map(|(pos, _)| pos)?;
    let (index, winner) = wave.swap_remove(win);
    let winner = winner.expect("the winner halted");
    let retry_delay_ms = match &winner {
        Halt::Retry { delay_ms, .. } => wave
            .iter()
            .filter_map(|(_, h)| match h {
                Some(Halt::Retry { delay_ms, .. }) => Some(*delay_ms),
                _ => None,
            })
            .fold(*delay_ms, DurationMs::max),
        _ => DurationMs::ZERO,
    };
    let drops_siblings = matches!(winner, Halt::Canceled { .. });
    let winner_rank = winner.rank();
    let mut resolution = winner.winning(index, retry_delay_ms, now);
    if !drops_siblings {
        for (i, h) in wave {
            if let Some(patch) = h.and_then(|h| h.sibling(i, now, winner_rank)) {
                resolution.transition = resolution.transition.fuse(patch);
            }
        }
    }
    Some(resolution)
}

/// Cut `s` to at most `max` bytes at a character boundary.
/// The previous error an entry into a step sees (K-17.2 amendment): a step found
/// `running` when its claim started lost its previous attempt to a crash or a lease loss,
/// which is an unknown outcome — the step's outcome query, if it declares one, runs before
/// the step is entered again. An error recorded before the lost attempt is kept in the
/// message.
pub(crate) fn after_lost_attempt(lost: bool, previous: Option<StepError>) -> Option<StepError> {
    if !lost || previous.as_ref().is_some_and(|e| e.class == ErrorClass::UnknownOutcome) {
        return previous;
    }
    let message = match previous {
        Some(e) => format!("the previous attempt was lost (crash or lease loss); before it: {}", e.message),
        None => "the previous attempt was lost (crash or lease loss)".to_string(),
    };
    Some(StepError { class: ErrorClass::UnknownOutcome, message })
}

/// Text the kernel stores from an activity or a refusal (K-2.0 amendment): control
/// characters (NUL, line breaks, C1) become spaces, then the text is cut to `max` bytes on
/// a character boundary — before any store sees it, so every store keeps, refuses and
/// retries exactly the same errors.
pub(crate) fn stored_text(message: &str, max: usize) -> String {
    let printable: String = message.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    truncate(printable, max)
}

pub(crate) fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

#[cfg(test)]
#[path = "outcome_tests.rs"]
mod tests;
