//! Dead-lettered steps (K-17.2): their wait, their record, and applying an operator's
//! decision when the step wakes; early signals after a wait (K-9.4).

use super::*;

impl Claim {
    /// Whether step `idx` can be dead-lettered: its policy says so, or it asks a query hook
    /// after unknown outcomes and the engine keeps dead letters (K-17.2).
    pub(super) fn dead_letters_step(&self, idx: usize) -> bool {
        let has_port = self.inner.ports.dead_letters.is_some();
        self.def.steps().get(idx).is_some_and(|sd| dead_letter_decision::dead_letters(sd, has_port))
    }

    /// The operator signal wait of step `idx`'s current logical attempt (K-17.2), with
    /// its poll fallback (K-9.5).
    pub(super) fn dead_letter_wait(&self, idx: usize) -> Wait {
        let d = self.doc();
        let step = &d.inst.steps[idx];
        Wait::Signal {
            signal_type: crate::engine::operator::DEAD_LETTER_SIGNAL.to_string(),
            wait_key: step.name.clone(),
            generation: crate::engine::operator::dead_letter_generation(d.inst.retry_count, step.epoch),
            step_index: idx as u32,
            poll_time: Some(self.now().saturating_add(self.inner.config.dead_letter_poll_ms)),
        }
    }

    /// The dead-letter record of step `idx` (K-17.2), written after the instance's wait:
    /// best effort — a record lost here is written by the poll fallback's visit.
    pub(super) async fn record_dead_letter(&self, idx: usize, error: StepError) {
        let Some(dls) = self.inner.ports.dead_letters.clone() else {
            tracing::error!("a step was dead-lettered on an engine without a DeadLetters port");
            return;
        };
        let dl = {
            let d = self.doc();
            crate::engine::operator::dead_letter_of(&d.inst, idx, &self.shared.input, error, self.now())
        };
        match dls.record(&dl).await {
            Ok(_) => tracing::warn!(dead_letter = %dl.id, step = %dl.step, "step dead-lettered"),
            Err(e) => tracing::warn!(error = %e, "dead letter not recorded; the poll fallback records it"),
        }
    }

    /// A step resumed from a dead-letter wait (K-17.2): apply the operator's decision
    /// ([`dead_letter_decision`], pure), or wait again. `None`: the claim goes on (the step
    /// is pending in its next epoch, or completed with the operator's output).
    pub(super) async fn resume_dead_letter(&self, idx: usize) -> Option<ClaimEnd> {
        let Some(dls) = self.inner.ports.dead_letters.clone() else {
            tracing::error!("a dead-lettered step resumed on an engine without a DeadLetters port; releasing");
            return Some(self.release_after(G::Running, self.inner.config.fingerprint_pushback_ms).await);
        };
        let (id, error) = {
            let d = self.doc();
            let step = &d.inst.steps[idx];
            let id =
                crate::activity::idempotency_key_at(&d.inst.workflow_id, &step.name, d.inst.retry_count, step.epoch);
            (id, dead_letter_decision::kept_error(step))
        };
        let found = match dls.get(&id).await {
            Ok(found) => dead_letter_decision::found(found),
            Err(e) => {
                tracing::warn!(error = %e, "dead letter unreadable; releasing");
                return Some(self.release_after(G::Running, self.inner.config.permit_retry_ms).await);
            }
        };
        let decision = match found {
            Found::Decided(decision) => decision,
            Found::Undecided | Found::Lost => {
                if found == Found::Lost {
                    // The record was lost after the wait was stored: write it now.
                    self.record_dead_letter(idx, error.clone()).await;
                }
                let wait = self.dead_letter_wait(idx);
                let t = Transition::dead_letter(idx, wait.clone(), error, DurationMs::ZERO, self.now());
                return Some(match self.commit_plain(G::Running, t).await {
                    Ok(()) => {
                        self.after_suspend(&wait).await;
                        ClaimEnd::Suspended
                    }
                    Err(e) => e,
                });
            }
        };
        let now = self.now();
        let applied = {
            let d = self.doc();
            let limits = self.inner.config.history_limits;
            // A human task's Complete is refused here too, when it was decided without its
            // definition (K-17.2 amendment).
            let authority = self.def.steps()[idx].get_outcome_authority();
            dead_letter_decision::apply(idx, &d.inst.steps[idx], d.inst.retry_count, &decision, authority, limits, now)
        };
        if let Err(e) = self.commit_plain(G::Running, applied.transition).await {
            return Some(e);
        }
        if let Err(e) = dls.close(&id, now).await {
            tracing::warn!(error = %e, dead_letter = %id, "applied dead letter not closed");
        }
        match applied.then {
            AfterDecision::Fail => Some(self.fail_path().await),
            AfterDecision::Continue => None,
        }
    }

    /// K-9.4: right after a signal wait is stored, consume an early signal.
    pub(super) async fn after_suspend(&self, wait: &Wait) {
        let Some(id) = wait.signal_identity() else { return };
        match self.inner.ports.inbox.find_pending(&self.workflow_id, &id.signal_type, &id.wait_key, id.generation).await
        {
            Ok(Some(rec)) => {
                if let Err(e) = signals::try_match(&self.inner, &rec).await {
                    tracing::debug!(error = %e, "early-signal match failed; the repair scan will retry");
                }
            }
            Ok(None) => {}
            Err(e) => tracing::debug!(error = %e, "early-signal lookup failed; the repair scan will retry"),
        }
    }
}
