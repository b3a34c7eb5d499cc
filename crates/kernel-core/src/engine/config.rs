use crate::domain::DurationMs;
use crate::error::{Error, Result};
use crate::validate;

/// Engine settings. Every limit is explicit; units are in the name.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Name of this worker in logs, spans and observations.
    pub worker_id: String,
    /// Local worker slots (claims running at once).
    pub worker_slots: usize,
    /// Claim lease (K-6.2).
    pub lease_ms: DurationMs,
    /// Heartbeat interval; must be < `lease_ms` (K-6.3 suggests lease/3).
    pub heartbeat_ms: DurationMs,
    /// Poll interval of the ready queue when no wakeup arrives (K-13).
    pub poll_interval_ms: DurationMs,
    /// Rebuild scan + timer activation interval (K-13, K-9.2).
    pub rebuild_interval_ms: DurationMs,
    /// Pending-signal repair interval (K-9.4).
    pub signal_repair_interval_ms: DurationMs,
    /// How long inbox records are kept before retention may delete them. Retention deletes
    /// only records of terminal or absent workflows, pending records of an older generation
    /// than the workflow's current wait, pending records beyond
    /// `pending_signals_per_workflow_max` and matched records beyond
    /// `matched_signals_per_workflow_max` of a live workflow (K-9.4).
    pub signal_retention_ms: DurationMs,
    /// Matched records kept per live workflow past retention (the memory that recognises a
    /// producer's redelivery); older ones beyond it are deleted.
    pub matched_signals_per_workflow_max: usize,
    /// Pending records kept per live workflow past retention: signals no wait of the
    /// workflow has consumed for `signal_retention_ms` (another type or key, never
    /// awaited). Older ones beyond the newest this many are deleted (a documented drop:
    /// a wait that starts later for such a signal does not find it). Records matching the
    /// workflow's current wait are never deleted this way.
    pub pending_signals_per_workflow_max: usize,
    /// Pending signals accepted for one workflow id that does not exist; one more is
    /// [`Error::LimitExceeded`] and nothing is written. A soft bound: the count and the
    /// insert are two calls, so concurrent deliveries may pass it by a few. Once the
    /// workflow exists its signals stop counting (the signal repair clears their flag).
    pub orphan_signals_per_workflow_max: u64,
    /// Pending signals accepted in total for workflow ids that do not exist; one more is
    /// [`Error::LimitExceeded`] and nothing is written. Soft, as
    /// `orphan_signals_per_workflow_max`, and counting only workflow ids that do not exist
    /// (as of the last signal repair).
    pub orphan_signals_max: u64,
    /// Stale candidates tried per scheduling round (K-6.1).
    pub candidates_per_round_max: usize,
    /// Push-back delay on a fingerprint mismatch (K-4.3).
    pub fingerprint_pushback_ms: DurationMs,
    /// Delay before retrying a step whose permit was denied (or errored: fail closed); a
    /// denial's shorter hint (the start window's) is taken instead.
    pub permit_retry_ms: DurationMs,
    /// Permit renewal interval while an activity holds it (K-14). A renewal error is
    /// logged at warn level and retried at the next interval; a denied renewal stops
    /// renewing for that invocation. Neither cancels the running activity: a lapsed permit
    /// overshoots its limit by at most one renewal interval.
    pub permit_renew_ms: DurationMs,
    /// Delay after a finalizer error (K-8).
    pub finalizer_retry_ms: DurationMs,
    /// Timeout of one finalizer invocation.
    pub finalizer_timeout_ms: DurationMs,
    /// Largest serialized input, output or checkpoint.
    pub payload_bytes_max: usize,
    /// Longest stored error message.
    pub error_message_bytes_max: usize,
    /// Rows per scan page.
    pub scan_page_size: usize,
    /// Pages per rebuild / repair pass.
    pub scan_pages_max: usize,
    /// How long graceful shutdown waits for running claims (K-6.6).
    pub shutdown_timeout_ms: DurationMs,
    /// Deadline of every store call the engine makes, on the engine's clock. A write
    /// without an answer by then is uncertain (the claim ends, the lease is left to
    /// expire); a read is unavailable.
    pub store_call_deadline_ms: DurationMs,
    /// Deadline of one heartbeat write; `heartbeat_ms + heartbeat_deadline_ms` must be
    /// `< lease_ms`, so a process that cannot renew ends its claim (cancelling the running
    /// activity, starting no new one) before the lease can be taken over (K-6.4).
    pub heartbeat_deadline_ms: DurationMs,
    /// How far the clocks of two processes may disagree (K-6.8). A claim holder starts no
    /// activity, inverse or finalizer once its own clock reads `lease_until −
    /// max_clock_skew_ms`, so a worker whose clock runs ahead by at most this much, and who
    /// takes the instance over when its clock reaches `lease_until`, never runs beside it;
    /// `heartbeat_ms + heartbeat_deadline_ms + max_clock_skew_ms` must be `< lease_ms`.
    /// 0 trusts the clocks to agree exactly. Default 500 ms (NTP-synchronised hosts stay
    /// well within it).
    pub max_clock_skew_ms: DurationMs,
    /// PrepareContext failures (K-2.3) tolerated before the workflow fails through
    /// `failing` and its failure finalizer (K-8). Counted across claims
    /// (`WorkflowInstance::prepare_failures`); reset by replay. The failure finalizer then
    /// runs with a null prepared context.
    pub prepare_attempts_max: u32,
    /// Delay before the next claim after the first PrepareContext failure; doubled after
    /// each further failure, up to `prepare_retry_max_ms`.
    pub prepare_retry_base_ms: DurationMs,
    /// Longest delay between two PrepareContext attempts.
    pub prepare_retry_max_ms: DurationMs,
    /// Poll fallback of a dead-letter wait (K-17.2, K-9.5): how often a parked workflow
    /// re-reads its dead letter (a decision whose signal was lost is applied then).
    pub dead_letter_poll_ms: DurationMs,
    /// How much history of earlier logical attempts each step keeps (K-17.3).
    pub history_limits: crate::record::HistoryLimits,
    /// How long a closed dead letter is kept before maintenance deletes it (K-17.2).
    pub dead_letter_retention_ms: DurationMs,
    /// Attempts of each inverse by the failure path's compensation (K-17.6), 1..=10, made
    /// one after the other within the claim.
    pub compensation_attempts: u32,
    /// Who gets the human task of an inverse that kept failing (roles, K-17.5).
    pub compensation_escalation_roles: Vec<String>,
    /// The SLA of that task.
    pub compensation_escalation_sla_ms: DurationMs,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            worker_id: "worker".into(),
            worker_slots: 8,
            lease_ms: DurationMs::from_millis(30_000),
            heartbeat_ms: DurationMs::from_millis(10_000),
            poll_interval_ms: DurationMs::from_millis(5_000),
            rebuild_interval_ms: DurationMs::from_millis(30_000),
            signal_repair_interval_ms: DurationMs::from_millis(30_000),
            signal_retention_ms: DurationMs::from_millis(7 * 24 * 3_600_000),
            matched_signals_per_workflow_max: 64,
            pending_signals_per_workflow_max: 256,
            orphan_signals_per_workflow_max: 16,
            orphan_signals_max: 10_000,
            candidates_per_round_max: 8,
            fingerprint_pushback_ms: DurationMs::from_millis(3_600_000),
            permit_retry_ms: DurationMs::from_millis(1_000),
            permit_renew_ms: DurationMs::from_millis(10_000),
            finalizer_retry_ms: DurationMs::from_millis(5_000),
            finalizer_timeout_ms: DurationMs::from_millis(60_000),
            payload_bytes_max: 64 * 1024,
            error_message_bytes_max: 2_048,
            scan_page_size: 100,
            scan_pages_max: 10,
            shutdown_timeout_ms: DurationMs::from_millis(60_000),
            store_call_deadline_ms: DurationMs::from_millis(10_000),
            heartbeat_deadline_ms: DurationMs::from_millis(5_000),
            max_clock_skew_ms: DurationMs::from_millis(500),
            prepare_attempts_max: 5,
            prepare_retry_base_ms: DurationMs::from_millis(5_000),
            prepare_retry_max_ms: DurationMs::from_millis(300_000),
            dead_letter_poll_ms: DurationMs::from_millis(600_000),
            history_limits: Default::default(),
            dead_letter_retention_ms: DurationMs::from_millis(30 * 24 * 3_600_000),
            compensation_attempts: 3,
            compensation_escalation_roles: vec!["operator".to_string()],
            compensation_escalation_sla_ms: DurationMs::from_millis(24 * 3_600_000),
        }
    }
}

impl EngineConfig {
    /// Delay after the `failures`-th PrepareContext failure: `prepare_retry_base_ms`
    /// doubled per earlier failure, at most `prepare_retry_max_ms`.
    pub fn prepare_retry_delay(&self, failures: u32) -> DurationMs {
        let doublings = failures.saturating_sub(1).min(40);
        let ms = self.prepare_retry_base_ms.as_millis().saturating_mul(1_i64 << doublings);
        DurationMs::from_millis(ms).min(self.prepare_retry_max_ms)
    }

    /// Check every field; the first violation is returned as a typed error.
    ///
    /// Every duration is strictly positive and at most [`validate::CONFIG_MS_MAX`], so that
    /// adding it to any clock reading (a lease end, a retry time, a scan deadline) cannot
    /// overflow; a larger one is [`Error::InvalidInput`].
    pub fn validate(&self) -> Result<()> {
        validate::identifier("worker_id", &self.worker_id)?;
        for (f, v) in [
            ("lease_ms", self.lease_ms),
            ("heartbeat_ms", self.heartbeat_ms),
            ("poll_interval_ms", self.poll_interval_ms),
            ("rebuild_interval_ms", self.rebuild_interval_ms),
            ("signal_repair_interval_ms", self.signal_repair_interval_ms),
            ("signal_retention_ms", self.signal_retention_ms),
            ("fingerprint_pushback_ms", self.fingerprint_pushback_ms),
            ("permit_retry_ms", self.permit_retry_ms),
            ("permit_renew_ms", self.permit_renew_ms),
            ("finalizer_retry_ms", self.finalizer_retry_ms),
            ("finalizer_timeout_ms", self.finalizer_timeout_ms),
            ("shutdown_timeout_ms", self.shutdown_timeout_ms),
            ("store_call_deadline_ms", self.store_call_deadline_ms),
            ("heartbeat_deadline_ms", self.heartbeat_deadline_ms),
            ("prepare_retry_base_ms", self.prepare_retry_base_ms),
            ("prepare_retry_max_ms", self.prepare_retry_max_ms),
            ("dead_letter_poll_ms", self.dead_letter_poll_ms),
            ("dead_letter_retention_ms", self.dead_letter_retention_ms),
            ("compensation_escalation_sla_ms", self.compensation_escalation_sla_ms),
        ] {
            validate::config_ms(f, v)?;
        }
        if self.heartbeat_ms >= self.lease_ms {
            return Err(Error::invalid(
                "heartbeat_ms",
                format_args!("{} must be < lease_ms {}", self.heartbeat_ms, self.lease_ms),
            ));
        }
        if self.heartbeat_ms + self.heartbeat_deadline_ms >= self.lease_ms {
            return Err(Error::invalid(
                "heartbeat_deadline_ms",
                format_args!(
                    "heartbeat_ms {} + heartbeat_deadline_ms {} must be < lease_ms {}",
                    self.heartbeat_ms, self.heartbeat_deadline_ms, self.lease_ms
                ),
            ));
        }
        if self.max_clock_skew_ms < DurationMs::ZERO || self.max_clock_skew_ms > validate::CONFIG_MS_MAX {
            return Err(Error::invalid(
                "max_clock_skew_ms",
                format_args!("{} must be in 0..={}", self.max_clock_skew_ms, validate::CONFIG_MS_MAX),
            ));
        }
        if self.heartbeat_ms + self.heartbeat_deadline_ms + self.max_clock_skew_ms >= self.lease_ms {
            return Err(Error::invalid(
                "max_clock_skew_ms",
                format_args!(
                    "heartbeat_ms {} + heartbeat_deadline_ms {} + max_clock_skew_ms {} must be < lease_ms {}",
                    self.heartbeat_ms, self.heartbeat_deadline_ms, self.max_clock_skew_ms, self.lease_ms
                ),
            ));
        }
        if !(1..=10).contains(&self.compensation_attempts) {
            return Err(Error::invalid("compensation_attempts", "must be in 1..=10"));
        }
        if self.compensation_escalation_roles.is_empty() {
            return Err(Error::invalid(
                "compensation_escalation_roles",
                "at least one role: someone must get the task",
            ));
        }
        for r in &self.compensation_escalation_roles {
            validate::identifier("compensation_escalation_roles", r)?;
        }
        if self.prepare_attempts_max == 0 {
            return Err(Error::invalid("prepare_attempts_max", "must be > 0"));
        }
        for (f, v) in [
            ("worker_slots", self.worker_slots),
            ("candidates_per_round_max", self.candidates_per_round_max),
            ("payload_bytes_max", self.payload_bytes_max),
            ("error_message_bytes_max", self.error_message_bytes_max),
            ("scan_page_size", self.scan_page_size),
            ("scan_pages_max", self.scan_pages_max),
            ("orphan_signals_per_workflow_max", self.orphan_signals_per_workflow_max as usize),
            ("orphan_signals_max", self.orphan_signals_max as usize),
        ] {
            if v == 0 {
                return Err(Error::invalid(f, "must be > 0"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(r: Result<()>) -> String {
        match r {
            Err(Error::InvalidInput { field, .. }) => field,
            other => panic!("expected InvalidInput, got {other:?}"),
        }
    }

    #[test]
    fn a_span_that_could_overflow_a_deadline_is_refused() {
        // `now + lease_ms` (and every other configured span) must stay representable.
        assert!(EngineConfig::default().validate().is_ok());
        let huge = EngineConfig { lease_ms: DurationMs::MAX, ..EngineConfig::default() };
        assert_eq!(field_of(huge.validate()), "lease_ms");
        let longest = EngineConfig { lease_ms: validate::CONFIG_MS_MAX, ..EngineConfig::default() };
        assert!(longest.validate().is_ok());
        let over = DurationMs::from_millis(validate::CONFIG_MS_MAX.as_millis() + 1);
        let huge = EngineConfig { shutdown_timeout_ms: over, ..EngineConfig::default() };
        assert_eq!(field_of(huge.validate()), "shutdown_timeout_ms");
        let huge = EngineConfig { signal_retention_ms: DurationMs::MAX, ..EngineConfig::default() };
        assert_eq!(field_of(huge.validate()), "signal_retention_ms");
    }

    #[test]
    fn a_heartbeat_must_be_able_to_give_up_before_the_lease_ends() {
        let late = EngineConfig { heartbeat_deadline_ms: DurationMs::from_millis(20_000), ..EngineConfig::default() };
        assert_eq!(field_of(late.validate()), "heartbeat_deadline_ms");
        let zero = EngineConfig { store_call_deadline_ms: DurationMs::ZERO, ..EngineConfig::default() };
        assert_eq!(field_of(zero.validate()), "store_call_deadline_ms");
    }
}
