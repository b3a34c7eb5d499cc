//! The claim's main sequence: fingerprint and PrepareContext refusals, the half-done
//! signal match, woken dead letters, then the control pass and the ready steps until the
//! claim ends (K-4.3, K-2.3, K-9.4, K-6.6).

use super::*;

impl Claim {
    pub(super) async fn drive(&self, refusal: Option<Refusal>) -> ClaimEnd {
        let (status, resuming_signal, prepare_failures) = {
            let d = self.doc();
            let resuming_signal = match &d.inst.resume {
                Some(Resume { kind: ResumeKind::Signal, signal_id: Some(id), .. }) => Some(id.clone()),
                _ => None,
            };
            (d.inst.status, resuming_signal, d.inst.prepare_failures)
        };
        let plan = self.def.plan();
        let status_guard = if status == WorkflowStatus::Failing { G::Failing } else { G::Running };
        match refusal {
            // K-4.3: a fingerprint mismatch is not a failure; push back, touch no step.
            Some(Refusal::FingerprintMismatch) => {
                let persisted = self.doc().inst.definition_fingerprint.clone();
                tracing::warn!(persisted = %persisted, worker = %plan.fingerprint(), "definition fingerprint mismatch; pushing back");
                let t = match Transition::fingerprint_push_back(
                    &persisted,
                    plan.fingerprint(),
                    self.now(),
                    self.inner.config.fingerprint_pushback_ms,
                ) {
                    Ok(t) => t,
                    Err(e) => return self.refused(e),
                };
                let at = match t.claimable_time {
                    Some(crate::transition::Patch::Set(at)) => Some(at),
                    _ => None,
                };
                return match self.commit_plain(G::Token, t).await {
                    Ok(()) => {
                        if let Some(at) = at {
                            self.enqueue(self.priority(), at).await;
                        }
                        ClaimEnd::PushedBack
                    }
                    Err(e) => e,
                };
            }
            Some(Refusal::PrepareFailed(msg)) => {
                return self.prepare_failed(status, prepare_failures, status_guard, msg).await
            }
            None => {}
        }
        // K-9.4: finish a half-done signal match before any step runs, so the record can
        // never wake the next identical wait.
        if let Some(id) = &resuming_signal {
            if let Err(e) = self.inner.ports.inbox.mark_matched(id, self.now()).await {
                tracing::warn!(error = %e, "could not mark the resuming signal matched; releasing");
                return self.release_after(status_guard, self.inner.config.permit_retry_ms).await;
            }
        }
        if status == WorkflowStatus::Failing {
            return self.fail_path().await;
        }
        // K-17.2: dead-lettered steps that woke (operator signal, poll, or beside another
        // one) are marked by their own state — pending with a permanent error under a
        // dead-letter policy, which nothing else leaves behind: their decisions first.
        let dead_lettered: Vec<usize> = {
            let d = self.doc();
            d.inst
                .steps
                .iter()
                .enumerate()
                .filter(|(i, s)| {
                    s.status == StepStatus::Pending
                        && s.error.as_ref().is_some_and(|e| e.class == ErrorClass::Permanent)
                        && self.dead_letters_step(*i)
                })
                .map(|(i, _)| i)
                .collect()
        };
        for i in dead_lettered {
            if let Some(end) = self.resume_dead_letter(i).await {
                return end;
            }
        }
        let mut started: Option<(usize, Option<HeldPermit>)> = None;
        loop {
            if self.cancel.is_cancelled() {
                // The claim has ended (K-6.4) or the engine was killed (K-6.6): write
                // nothing more, leave the lease to expire.
                if let Some((_, permit)) = started.take() {
                    self.release_permit(permit).await;
                }
                return self.ended_as();
            }
            if started.is_none() && self.inner.stopping.is_cancelled() {
                // Shutdown between waves: hand the instance back at once, and put it in
                // its lane so another worker claims it without waiting for a rebuild (K-13).
                let now = self.now();
                return match self.commit_plain(G::Running, Transition::release(now)).await {
                    Ok(()) => {
                        self.enqueue(self.priority(), now).await;
                        ClaimEnd::Released
                    }
                    Err(e) => e,
                };
            }
            let next = if let Some((idx, permit)) = started.take() {
                self.run_single(idx, Entering::Marked(permit)).await
            } else if let Some(next) = self.control().await {
                // A loop-back, a branch skip or a loop past its maximum was written (K-4
                // amendment): read the plan again.
                next
            } else {
                let (ready, all_done, any_failed) = {
                    let d = self.doc();
                    let steps = &d.inst.steps;
                    (plan.ready(steps), plan.all_done(steps), steps.iter().any(|s| s.status == StepStatus::Failed))
                };
                match terminal::next_move(ready, all_done, any_failed) {
                    NextMove::Succeed => return self.success_path().await,
                    NextMove::Fail => {
                        if let Err(e) = self.commit_plain(G::Running, Transition::failing(self.now())).await {
                            return e;
                        }
                        return self.fail_path().await;
                    }
                    NextMove::Stuck => {
                        tracing::error!("running instance with nothing ready; releasing");
                        return self.release_after(G::Running, self.inner.config.finalizer_retry_ms).await;
                    }
                    NextMove::Single(idx) => self.run_single(idx, Entering::Fresh).await,
                    NextMove::Wave(ready) => self.run_wave(ready).await,
                }
            };
            match next {
                Next::Continue(s) => started = s,
                Next::End(e) => return e,
            }
        }
    }

    /// A failed PrepareContext (K-2.3): counted on the instance; below
    /// `prepare_attempts_max` the claim is released with a growing delay, at the limit the
    /// workflow fails through `failing` without running any business code: no step, no
    /// inverse, no failure finalizer runs without its context (K-8, K-17.6 amendment).
    pub(super) async fn prepare_failed(
        &self,
        status: WorkflowStatus,
        prepare_failures: u32,
        g: G,
        msg: String,
    ) -> ClaimEnd {
        let config = &self.inner.config;
        let now = self.now();
        let (failures, mark_failing) = match terminal::prepare_next(
            status,
            prepare_failures,
            config.prepare_attempts_max,
        ) {
            PrepareNext::Fail { failures, mark_failing } => (failures, mark_failing),
            PrepareNext::Release { failures } => {
                let delay = config.prepare_retry_delay(failures);
                tracing::error!(error = %msg, failures, delay_ms = delay.as_millis(), "PrepareContext failed; releasing with a delay");
                let t = match Transition::prepare_release(failures, now, delay) {
                    Ok(t) => t,
                    Err(e) => return self.refused(e),
                };
                return match self.commit_plain(g, t).await {
                    Ok(()) => {
                        self.enqueue(self.priority(), now.saturating_add(delay)).await;
                        ClaimEnd::Released
                    }
                    Err(e) => e,
                };
            }
        };
        tracing::error!(error = %msg, failures, "PrepareContext failed too often; failing the workflow");
        if mark_failing {
            let mut t = Transition::failing(now);
            t.prepare_failures = Some(failures);
            if let Err(e) = self.commit_plain(G::Running, t).await {
                return e;
            }
        }
        self.fail_path_without_context(failures).await
    }

    pub(super) async fn release_after(&self, g: G, delay: DurationMs) -> ClaimEnd {
        let now = self.now();
        let t = match Transition::finalizer_release(now, delay) {
            Ok(t) => t,
            Err(e) => return self.refused(e),
        };
        match self.commit_plain(g, t).await {
            Ok(()) => {
                self.enqueue(self.priority(), now.saturating_add(delay)).await;
                ClaimEnd::Released
            }
            Err(e) => e,
        }
    }
}
