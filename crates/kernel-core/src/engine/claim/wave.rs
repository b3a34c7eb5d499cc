//! The control pass's writes and the end of a wave: one write per wave, its fallbacks when
//! the store refuses it, and the retry clock (K-4 amendment, K-4.5, K-17.2).

use super::*;

impl Claim {
    /// The control pass (K-4 amendment), before the ready steps are read: the first
    /// completed loop sender whose predicate holds on its recorded output sends the
    /// workflow back (one write), or, at its maximum, fails by its policy; otherwise every
    /// fresh ready conditional step whose predicate does not hold is skipped (one write).
    /// Decided from the committed document alone, so a crash between a sender's completion
    /// and its loop-back decides the same way on the next claim. `None`: nothing to do.
    pub(super) async fn control(&self) -> Option<Next> {
        // The loop-back write is built from the same reading of the document as the decision.
        let (decision, loop_back) = {
            let d = self.doc();
            let decision = control::decide(&self.def, &d.inst.steps, &d.outputs)?;
            let t = match &decision {
                Control::LoopBack { sender, target } => {
                    let limits = self.inner.config.history_limits;
                    Some(control::loop_back(&self.def, &d.inst, &d.outputs, limits, (*sender, *target), self.now()))
                }
                _ => None,
            };
            (decision, t)
        };
        let t = match decision {
            Control::LoopBack { .. } => loop_back.expect("built with the decision"),
            Control::Skip(indices) => Transition::branch_skip(&indices, self.now()),
            Control::Stop(i, message) => {
                tracing::warn!(step = self.def.steps()[i].name(), %message, "control stop");
                let inv = Invocation { result: Err(ActivityError::permanent(message)), elapsed_ms: DurationMs::ZERO };
                return Some(match self.classify(i, inv) {
                    StepResult::Skipped { error, elapsed_ms } => {
                        let t = control::stop_skip(&self.def, i, &self.doc().outputs, error, elapsed_ms, self.now());
                        let m = match self.commit(G::Running, t).await {
                            Ok(()) => Member::Settled,
                            Err(Unwritten::End(e)) => Member::Lost(e),
                            Err(Unwritten::Unavailable) => Member::HandBack,
                            Err(Unwritten::Refused(e)) => self.refused_completion(&e, elapsed_ms),
                        };
                        self.settle(vec![(i, m)]).await
                    }
                    StepResult::Halt(h) => self.settle(vec![(i, Member::Halted(h))]).await,
                    StepResult::Complete { .. } => unreachable!("a permanent error never completes"),
                });
            }
        };
        let streams = control::resets_stream(&self.def, &t);
        Some(match self.commit_plain(G::Running, t).await {
            Ok(()) => {
                if let (true, Some(key)) = (streams, &self.shared.stream_key) {
                    // A streaming step of the body runs again: its readers start over (K-16),
                    // best effort, fenced by this claim's lease.
                    if let Err(e) = self.inner.ports.stream.reset(key, self.stream_owner()).await {
                        tracing::debug!(error = %e, "stream reset after a loop-back failed");
                    }
                }
                Next::Continue(None)
            }
            Err(e) => Next::End(e),
        })
    }

    /// A wave of parallel steps: each commits its own completion or skip (K-4.4); the rest
    /// is resolved after all siblings returned (K-4.5).
    pub(super) async fn run_wave(&self, ready: Vec<usize>) -> Next {
        let futs = ready.iter().map(|&idx| async move {
            let inv = match self.enter_and_invoke(idx, Entering::Fresh).await {
                Ok(inv) => inv,
                Err(m) => return (idx, m),
            };
            if self.cancel.is_cancelled() && !matches!(inv.result, Ok(StepOutcome::Complete(_))) {
                // The claim ended during the activity (as in `run_single`); write nothing.
                return (idx, Member::Lost(self.ended_as()));
            }
            let m = match self.classify(idx, inv) {
                StepResult::Complete { output, elapsed_ms } => {
                    match self.commit(G::Running, self.completion(idx, output, elapsed_ms)).await {
                        Ok(()) => Member::Settled,
                        Err(Unwritten::End(e)) => Member::Lost(e),
                        Err(Unwritten::Unavailable) => Member::HandBack,
                        Err(Unwritten::Refused(e)) => self.refused_completion(&e, elapsed_ms),
                    }
                }
                StepResult::Skipped { error, elapsed_ms } => self.commit_skip(idx, error, elapsed_ms).await,
                StepResult::Halt(h) => Member::Halted(h),
            };
            (idx, m)
        });
        let members = futures::future::join_all(futs).await;
        self.settle(members).await
    }

    /// End a wave: a lost member ends the claim; otherwise [`outcome::resolve_wave`] gives
    /// the one write (if any step halted) and what follows it.
    pub(super) async fn settle(&self, members: Vec<(usize, Member)>) -> Next {
        let mut wave = Vec::with_capacity(members.len());
        // The step to fail if the store refuses the wave's write: the first whose outcome
        // carries a value of its own (an error, a checkpoint); a deferral carries none.
        let mut blame = None;
        let mut hand_back = false;
        let mut refused_plain = None;
        for (idx, m) in members {
            if let Member::Halted(h) = &m {
                if !matches!(h, Halt::Deferred { .. }) {
                    blame.get_or_insert(idx);
                }
            }
            match m {
                Member::Settled => wave.push((idx, None)),
                Member::Halted(h) => wave.push((idx, Some(h))),
                Member::Lost(e) => return Next::End(e),
                Member::HandBack => hand_back = true,
                Member::RefusedPlain(i, e) => {
                    refused_plain.get_or_insert((i, e));
                }
            }
        }
        if let Some((i, e)) = refused_plain {
            // Every sibling has returned: the one hand-back of the wave, counted (K-6.4).
            let refused = super::refused::Refused::mark_running(i);
            return Next::End(self.refused_plain(G::Running, refused, e).await);
        }
        if hand_back {
            // Every sibling has returned: the one hand-back of the wave (K-4.5). What the
            // halted siblings would have written is lost with it; they run again.
            return Next::End(self.hand_back(G::Running).await);
        }
        let supersedes = control::supersedes(&self.def, &wave, || {
            let d = self.doc();
            control::decide(&self.def, &d.inst.steps, &d.outputs)
        });
        if supersedes {
            // A sender of this wave completed and its loop goes back over every halted
            // sibling: their waits, yields, retries and deferrals belong to an iteration that
            // is over; the control pass takes the loop back now and they run again in the
            // next one, instead of holding the loop-back until they resume.
            return Next::Continue(None);
        }
        let dead_letters: Vec<(usize, StepError)> = wave
            .iter()
            .filter_map(|(i, h)| match h {
                Some(Halt::DeadLetter { error, .. }) => Some((*i, error.clone())),
                _ => None,
            })
            .collect();
        let Some(resolution) = outcome::resolve_wave(wave, self.now()) else {
            return Next::Continue(None);
        };
        let refused = RefusedWrite::of(&resolution.then);
        let mut transition = resolution.transition;
        self.retry_clock(&mut transition);
        match self.commit(G::Running, transition).await {
            Ok(()) => {}
            Err(Unwritten::End(e)) => return Next::End(e),
            Err(Unwritten::Unavailable) => return Next::End(self.hand_back(G::Running).await),
            Err(Unwritten::Refused(e)) => {
                let Some(idx) = blame else {
                    return Next::End(self.hand_back(G::Running).await);
                };
                return Next::End(self.fail_refused(idx, &e, refused).await);
            }
        }
        let prio = self.priority();
        Next::End(match resolution.then {
            AfterWave::Canceled => {
                self.on_terminal().await;
                ClaimEnd::Terminal(WorkflowStatus::Canceled)
            }
            AfterWave::Failing => self.fail_path().await,
            AfterWave::Released { at } => {
                self.enqueue(prio, at).await;
                ClaimEnd::Released
            }
            AfterWave::Suspended { wait } => {
                self.after_suspend(&wait).await;
                ClaimEnd::Suspended
            }
            AfterWave::Yielded { at } => {
                self.enqueue(prio, at).await;
                ClaimEnd::Yielded
            }
            AfterWave::DeadLettered { .. } => {
                for (i, error) in dead_letters {
                    self.record_dead_letter(i, error).await;
                }
                let wait = self.doc().inst.wait.clone();
                if let Some(wait) = wait {
                    // K-9.4: a decision whose doorbell rang before the wait was stored.
                    self.after_suspend(&wait).await;
                }
                ClaimEnd::Suspended
            }
        })
    }

    /// The retry clock of `max_retry_duration` (K-17.2), kept on the steps a write
    /// concerns: a retry release starts it once per logical attempt; an invocation that
    /// succeeded (completed, suspended, yielded) stops it.
    pub(super) fn retry_clock(&self, t: &mut Transition) {
        use crate::transition::Patch;
        let d = self.doc();
        let now = self.now();
        for p in t.steps.iter_mut() {
            let Some(step) = d.inst.steps.get(p.index as usize) else { continue };
            let retry = p.status == Some(StepStatus::Pending)
                && matches!(&p.error, Some(Patch::Set(e)) if matches!(e.class, ErrorClass::Transient | ErrorClass::UnknownOutcome));
            let succeeded = p.traffic_waits_inc == 0
                && p.error.is_none()
                && matches!(p.status, Some(StepStatus::Completed | StepStatus::Waiting | StepStatus::Pending));
            if retry && step.retrying_since.is_none() {
                p.retrying_since = Some(Patch::Set(now));
            } else if succeeded && step.retrying_since.is_some() && p.retrying_since.is_none() {
                p.retrying_since = Some(Patch::Unset);
            }
        }
    }

    /// The error stored on a step whose outcome the store refused: permanent, with the
    /// store's reason.
    pub(super) fn refusal_error(&self, e: &crate::error::Error) -> StepError {
        let message = format!("the store refused the step's outcome: {e}");
        let message = crate::engine::outcome::stored_text(&message, self.inner.config.error_message_bytes_max);
        StepError { class: ErrorClass::Permanent, message }
    }

    /// The wave's write, carrying a value of step `idx`, was refused: fail the step for
    /// good with a write that carries less and less of it, so a document at its size limit
    /// still ends (K-7.4) instead of re-running the step after every hand-back:
    /// the store's reason (unless the refused write was already a failure), then a short
    /// fixed message, then `failing` alone, which carries nothing from the step.
    pub(super) async fn fail_refused(&self, idx: usize, e: &crate::error::Error, refused: RefusedWrite) -> ClaimEnd {
        for error in terminal::refusal_ladder(refused, self.refusal_error(e)) {
            match self.commit(G::Running, Transition::step_failed(idx, error, DurationMs::ZERO, self.now())).await {
                Ok(()) => return self.fail_path().await,
                Err(Unwritten::Refused(e)) => tracing::warn!(error = %e, "the step's failure was refused as well"),
                Err(Unwritten::End(end)) => return end,
                Err(Unwritten::Unavailable) => return self.hand_back(G::Running).await,
            }
        }
        match self.commit_plain(G::Running, Transition::failing(self.now())).await {
            Ok(()) => self.fail_path().await,
            Err(end) => end,
        }
    }

    /// A completion of step `idx` the store refused: the step failed for good, resolved with
    /// its wave like any failure (K-4.5, K-7.4 row 4), so the workflow goes `failing` and
    /// through its failure finalizer to `failed`.
    pub(super) fn refused_completion(&self, e: &crate::error::Error, elapsed_ms: DurationMs) -> Member {
        Member::Halted(Halt::Failed { error: self.refusal_error(e), elapsed_ms })
    }
}
