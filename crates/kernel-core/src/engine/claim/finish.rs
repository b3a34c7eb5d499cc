//! The ends of a claim (K-8, K-17.6): finalizers, the compensation's inverses and their
//! escalation, the terminal writes and the terminal frame.

use super::*;

impl Claim {
    pub(super) async fn run_finalizer(&self, activity: Arc<dyn Activity>, name: &str) -> Result<(), ActivityError> {
        let cancel = self.cancel.child_token();
        let ctx = self.context(None, name, cancel.clone());
        let span = tracing::info_span!("finalizer", name);
        let timeout_ms = self.inner.config.finalizer_timeout_ms;
        let inv =
            invoke::invoke(&self.inner.ports.clock, activity, ctx, cancel, timeout_ms, None).instrument(span).await;
        match inv.result {
            Ok(StepOutcome::Complete(_)) => Ok(()),
            Ok(other) => Err(ActivityError::permanent(format!("a finalizer must complete, got {other:?}"))),
            Err(e) => Err(e),
        }
    }

    /// Success (K-8): finalizer, then `running + token → completed`.
    pub(super) async fn success_path(&self) -> ClaimEnd {
        if let Some(f) = self.def.success_finalizer().cloned() {
            if let Err(e) = self.run_finalizer(f, "success_finalizer").await {
                tracing::warn!(error = %e, "success finalizer failed; releasing with a delay");
                return self.release_after(G::Running, self.inner.config.finalizer_retry_ms).await;
            }
        }
        match self.commit_plain(G::Running, Transition::completed(self.now())).await {
            Ok(()) => {
                self.on_terminal().await;
                ClaimEnd::Terminal(WorkflowStatus::Completed)
            }
            Err(e) => e,
        }
    }

    /// Failure (K-8): in `failing`, the compensation (K-17.6) when the definition declares
    /// inverses, the finalizer, then `failing + token → failed` with the compensation's
    /// report. Failed steps are never re-run here.
    pub(super) async fn fail_path(&self) -> ClaimEnd {
        let report = match self.compensate().await {
            Ok(r) => r,
            Err(end) => return end,
        };
        if let Some(f) = self.def.failure_finalizer().cloned() {
            if let Err(e) = self.run_finalizer(f, "failure_finalizer").await {
                tracing::warn!(error = %e, "failure finalizer failed; releasing with a delay");
                let delay = self.inner.config.finalizer_retry_ms;
                return match report {
                    // The finished compensation is recorded: the next claim runs no inverse.
                    Some((report, _)) => {
                        let until = self.now().saturating_add(delay);
                        self.release_compensation(report, until).await
                    }
                    None => self.release_after(G::Failing, delay).await,
                };
            }
        }
        self.write_failed(report).await
    }

    /// Hand the failing claim back until `until` with the compensation's progress (K-17.6
    /// amendment).
    async fn release_compensation(&self, report: CompensationReport, until: Instant) -> ClaimEnd {
        let t = Transition::compensation_release(report, until, self.now());
        match self.commit_plain(G::Failing, t).await {
            Ok(()) => {
                self.enqueue(self.priority(), until).await;
                ClaimEnd::Released
            }
            Err(e) => e,
        }
    }

    /// Failure after PrepareContext failed `failures` times, its limit (K-2.3, K-17.6
    /// amendment): business code never runs without its context, so no inverse and no
    /// failure finalizer runs; the completed steps that declare an inverse are escalated
    /// to a person once, in one task ([`escalate_without_context`](Self::escalate_without_context)),
    /// and `failing → failed` is written with the report that says so.
    pub(super) async fn fail_path_without_context(&self, failures: u32) -> ClaimEnd {
        let report = match self.escalate_remaining(compensation_plan::no_context_error(failures)).await {
            Ok(r) => r,
            Err(end) => return end,
        };
        if self.def.failure_finalizer().is_some() {
            tracing::error!(failures, "no prepared context: the failure finalizer does not run");
        }
        self.write_failed(report).await
    }

    async fn write_failed(&self, report: Option<(CompensationReport, Vec<usize>)>) -> ClaimEnd {
        let t = terminal::failed_write(report, self.now());
        match self.commit_plain(G::Failing, t).await {
            Ok(()) => {
                self.on_terminal().await;
                ClaimEnd::Terminal(WorkflowStatus::Failed)
            }
            Err(e) => e,
        }
    }

    /// The compensation's report when no further inverse may run (no prepared context, or
    /// a store that keeps refusing the workflow's writes): the inverses the recorded
    /// progress says ended keep their entries; every other one of the plan is not run and
    /// escalated in one task for all of them (named after the first, with an id of its own,
    /// so a second pass opens nothing new), or failed without an inbox. `None` when the
    /// definition declares no inverse.
    pub(super) async fn escalate_remaining(
        &self,
        error: String,
    ) -> Result<Option<(CompensationReport, Vec<usize>)>, ClaimEnd> {
        let Some(order) = compensation_plan::plan(&self.def, &self.doc().inst.steps) else {
            return Ok(None);
        };
        let recorded = compensation_plan::ended_runs(self.doc().inst.compensation.as_ref());
        let name = |i: usize| self.def.steps()[i].name();
        let ended = |i: usize| recorded.iter().find(|r| r.step == name(i)).cloned();
        let rest: Vec<usize> = order.iter().copied().filter(|&i| ended(i).is_none()).collect();
        let task = match rest.first() {
            Some(&first) => {
                self.may_start_inverse().await?;
                tracing::error!(inverses = rest.len(), error = %error, "no further inverse runs; escalating");
                let count = rest.len();
                let id = compensation_plan::remaining_task_id(&self.idempotency_key_of(first));
                self.open_escalation(first, id, &error, |e, roles, token, now, sla| {
                    compensation_plan::no_context_task(e, count, roles, token, now, sla)
                })
                .await
            }
            None => None,
        };
        let not_run: Vec<(usize, &str)> = rest.iter().map(|&i| (i, name(i))).collect();
        let mut runs: Vec<(usize, InverseRun)> = compensation_plan::not_run(not_run, &error, task);
        runs.extend(order.iter().filter_map(|&i| ended(i).map(|r| (i, r))));
        runs.sort_by_key(|(i, _)| order.iter().position(|o| o == i));
        Ok(Some(compensation_plan::report(runs, self.now())))
    }

    /// The compensation of a failing workflow (K-17.6), `None` when no step declares an
    /// inverse: the inverses of the completed steps that declare one, in the order of
    /// [`compensation_plan::plan`], each with its own idempotency key (the step's with `|c`)
    /// and up to `compensation_attempts` attempts. The progress is recorded on the instance
    /// (K-17.6 amendment): a transient failure hands the claim back until the next try
    /// (the compensated step's retry delay, with jitter) with the entries so far, so a
    /// later claim runs no finished inverse again; a permanent error or an inverse that
    /// does not complete stops at once. An inverse that kept failing is escalated to a
    /// person through the task inbox once, or recorded as failed without one — never
    /// dropped.
    pub(super) async fn compensate(&self) -> Result<Option<(CompensationReport, Vec<usize>)>, ClaimEnd> {
        let Some(order) = compensation_plan::plan(&self.def, &self.doc().inst.steps) else {
            return Ok(None);
        };
        let progress = compensation_plan::progress_of(self.doc().inst.compensation.as_ref());
        let (recorded, due) = match progress {
            compensation_plan::Progress::Finished(report) => {
                let undone = compensation_plan::undone_in(&self.def, &report);
                return Ok(Some((report, undone)));
            }
            compensation_plan::Progress::Ongoing { runs, due } => (runs, Some(due)),
            compensation_plan::Progress::Fresh => (Vec::new(), None),
        };
        let mut runs = Vec::with_capacity(order.len());
        for idx in order {
            let name = self.def.steps()[idx].name();
            let attempts_max = self.inner.config.compensation_attempts;
            match compensation_plan::next_inverse(&recorded, due, name, self.now(), attempts_max) {
                compensation_plan::NextInverse::Recorded(run) => runs.push((idx, run)),
                compensation_plan::NextInverse::GiveUp { attempts } => {
                    self.may_start_inverse().await?;
                    let message = compensation_plan::LAST_ATTEMPT_UNKNOWN.to_string();
                    tracing::warn!(step = name, attempts, "inverse kept failing (its last attempt never reported)");
                    let task = self.escalate_inverse(idx, &message).await;
                    runs.push((idx, compensation_plan::kept_failing(name, attempts, message, task)));
                }
                compensation_plan::NextInverse::NotYet { run, until } => {
                    runs.push((idx, run));
                    let progress = compensation_plan::in_progress(&runs, until);
                    return Err(self.release_compensation(progress, until).await);
                }
                compensation_plan::NextInverse::Run { attempts } => {
                    match self.start_inverse(&runs, idx, attempts).await? {
                        (run, None) => runs.push((idx, run)),
                        (run, Some(until)) => {
                            runs.push((idx, run));
                            let progress = compensation_plan::in_progress(&runs, until);
                            return Err(self.release_compensation(progress, until).await);
                        }
                    }
                }
            }
        }
        let (report, undone) = compensation_plan::report(runs, self.now());
        tracing::info!(outcome = report.outcome.as_str(), inverses = report.steps.len(), "compensation ended");
        Ok(Some((report, undone)))
    }

    /// Record the progress — the inverses ended so far and this attempt, now starting — then
    /// run the attempt (K-17.6 amendment): an inverse that completed is never run again by
    /// a later claim, and an attempt during which the process ends still counts.
    async fn start_inverse(
        &self,
        runs: &[(usize, InverseRun)],
        idx: usize,
        attempts: u32,
    ) -> Result<(InverseRun, Option<Instant>), ClaimEnd> {
        self.may_start_inverse().await?;
        let mut progress = runs.to_vec();
        progress.push((idx, compensation_plan::started(self.def.steps()[idx].name(), attempts.saturating_add(1))));
        let report = compensation_plan::in_progress(&progress, self.now());
        self.commit_plain(G::Failing, Transition::compensation_progress(report, self.now())).await?;
        self.run_inverse(idx, attempts).await
    }

    /// `Err` with how the claim ended when it may no longer start an inverse: canceled,
    /// lost, past its lease (another worker may own the instance already), or the stored
    /// instance is no longer `failing` under this claim's token — an operator's cancel is
    /// seen before the next inverse starts (one read per inverse, on the failure path only;
    /// a read that fails stops the compensation too: the next claim runs it again).
    pub(super) async fn may_start_inverse(&self) -> Result<(), ClaimEnd> {
        if self.cancel.is_cancelled() {
            return Err(self.ended_as());
        }
        if self.past_start_limit() {
            tracing::warn!("lease expired during the compensation; stopping");
            self.cancel.cancel();
            return Err(ClaimEnd::ClaimLost);
        }
        let id = WorkflowId::from(&*self.shared.workflow_id);
        match self.inner.ports.store.get(&id).await {
            Ok(Some(i))
                if i.status == WorkflowStatus::Failing
                    && i.claim_token.as_ref().map(|t| t.as_str()) == Some(&*self.shared.claim_token) =>
            {
                Ok(())
            }
            Ok(found) => {
                tracing::info!(status = ?found.map(|i| i.status), "the instance changed during the compensation; stopping");
                self.cancel.cancel();
                Err(ClaimEnd::ClaimLost)
            }
            Err(e) => {
                tracing::warn!(error = %e, "the instance could not be read during the compensation; stopping");
                Err(ClaimEnd::Uncertain)
            }
        }
    }

    /// One attempt of step `idx`'s inverse, after `prior` attempts by earlier claims: its
    /// entry, with the time of its next try when it failed and is tried again.
    pub(super) async fn run_inverse(&self, idx: usize, prior: u32) -> Result<(InverseRun, Option<Instant>), ClaimEnd> {
        let sd = &self.def.steps()[idx];
        let inverse = sd.get_inverse().expect("only steps with an inverse are compensated").clone();
        let cfg = &self.inner.config;
        self.may_start_inverse().await?;
        let attempts = prior.saturating_add(1);
        let cancel = self.cancel.child_token();
        let mut ctx = self.context(Some(idx), sd.name(), cancel.clone());
        ctx.compensating = true;
        ctx.journal = None;
        ctx.attempt = attempts;
        let span = tracing::info_span!("compensate", step = sd.name(), attempt = attempts);
        let inv = invoke::invoke(&self.inner.ports.clock, inverse, ctx, cancel, cfg.finalizer_timeout_ms, None)
            .instrument(span)
            .await;
        let error = match inv.result {
            Ok(StepOutcome::Complete(_)) => {
                self.close_escalation(idx).await;
                let run = InverseRun {
                    step: sd.name().to_string(),
                    result: InverseResult::Compensated,
                    attempts,
                    error: None,
                    task: None,
                };
                return Ok((run, None));
            }
            Ok(other) => ActivityError::permanent(format!("an inverse must complete, got {other:?}")),
            Err(e) => e,
        };
        // The claim ending is not the inverse failing: nothing is recorded or escalated.
        self.may_start_inverse().await?;
        let message = compensation_plan::inverse_error(&error.message);
        let random = self.inner.ports.ids.random_u64();
        let retry = &sd.retry;
        if let Some(until) =
            compensation_plan::next_try(error.class, attempts, cfg.compensation_attempts, retry, random, self.now())
        {
            tracing::warn!(step = sd.name(), attempt = attempts, error = %message, "inverse failed; tried again later");
            return Ok((compensation_plan::retrying(sd.name(), attempts, message), Some(until)));
        }
        tracing::warn!(step = sd.name(), attempts, error = %message, "inverse kept failing");
        let task = self.escalate_inverse(idx, &message).await;
        Ok((compensation_plan::kept_failing(sd.name(), attempts, message, task), None))
    }

    /// The escalation task id of step `idx`'s inverse (one per logical attempt).
    pub(super) fn escalation_task_id(&self, idx: usize) -> String {
        compensation_plan::escalation_task_id(&self.idempotency_key_of(idx))
    }

    /// Step `idx`'s idempotency key in its current logical attempt.
    fn idempotency_key_of(&self, idx: usize) -> String {
        let d = self.doc();
        let s = &d.inst.steps[idx];
        crate::activity::idempotency_key_at(&self.shared.workflow_id, &s.name, d.inst.retry_count, s.epoch)
    }

    /// An inverse completed: close the task an earlier pass may have opened for it, so
    /// nobody undoes the step a second time by hand (best effort; absent is the rule).
    pub(super) async fn close_escalation(&self, idx: usize) {
        let Some(inbox) = self.inner.ports.task_inbox.clone() else { return };
        if let Err(e) = inbox.close(&self.escalation_task_id(idx), self.now()).await {
            tracing::warn!(error = %e, "the escalation task of a compensated step could not be closed");
        }
    }

    /// Open a human task for an inverse that kept failing (K-17.5); its id, or `None`
    /// without a task inbox or when the inbox refused.
    pub(super) async fn escalate_inverse(&self, idx: usize, error: &str) -> Option<String> {
        self.open_escalation(idx, self.escalation_task_id(idx), error, compensation_plan::escalation_task).await
    }

    /// Open the escalation task of step `idx`'s inverse as `build` makes it from what it is
    /// about (with `error`), the configured roles, a task token, now and the configured
    /// SLA; its id, or `None` without a task inbox, without a token or when the inbox
    /// refused.
    async fn open_escalation(
        &self,
        idx: usize,
        id: String,
        error: &str,
        build: impl FnOnce(compensation_plan::Escalated<'_>, Vec<String>, String, Instant, DurationMs) -> TaskRecord,
    ) -> Option<String> {
        let inbox = self.inner.ports.task_inbox.clone()?;
        let cfg = &self.inner.config;
        let token = match self.inner.ports.ids.task_token() {
            Ok(token) => token,
            Err(e) => {
                // No task with a guessable token: the inverse is recorded as failed.
                tracing::error!(error = %e, "no task token for the escalation of an inverse");
                return None;
            }
        };
        let task = {
            let d = self.doc();
            let escalated = compensation_plan::Escalated {
                id,
                workflow_id: &self.shared.workflow_id,
                workflow_type: &d.inst.workflow_type,
                step: &d.inst.steps[idx].name,
                error,
            };
            let roles = cfg.compensation_escalation_roles.clone();
            build(escalated, roles, token, self.now(), cfg.compensation_escalation_sla_ms)
        };
        match inbox.open(&task).await {
            Ok(_) => Some(task.id),
            Err(e) => {
                tracing::error!(error = %e, "the escalation task of an inverse could not be opened");
                None
            }
        }
    }

    /// After the terminal commit: only best-effort side channels (K-8, K-16).
    pub(super) async fn on_terminal(&self) {
        let Some(key) = &self.shared.stream_key else { return };
        let summary = {
            let d = self.doc();
            terminal::terminal_summary(d.inst.status, d.inst.revision, d.inst.compensation.as_ref())
        };
        if let Err(e) = self.inner.ports.stream.terminal(key, self.stream_owner(), summary).await {
            tracing::debug!(error = %e, "terminal frame failed");
        }
    }
}
