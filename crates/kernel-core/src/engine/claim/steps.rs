//! One step of a claim: permit, mark running, the activity, what its result means, and the
//! fused write of a lone step (K-7.1 … K-7.4, K-14).

use super::*;

impl Claim {
    /// Acquire the step's permit, failing closed on errors (K-14). The resource is the
    /// step's fixed name or the one derived from this workflow's input and prepared context.
    pub(super) async fn acquire_permit(&self, idx: usize) -> Result<Option<HeldPermit>, NoPermit> {
        let sd = &self.def.steps()[idx];
        let input = &self.shared.input;
        let derived = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sd.resource_for(input, &self.prepared)));
        let resource = match derived {
            Ok(Some(resource)) => resource,
            Ok(None) => return Ok(None),
            Err(panic) => {
                let msg = panic_message(&*panic);
                tracing::error!(step = sd.name(), panic = msg, "resource function panicked");
                return Err(NoPermit::Refused(format!("the step's resource function panicked: {msg}")));
            }
        };
        if let Err(e) = validate::key_name("resource", &resource) {
            tracing::error!(step = sd.name(), error = %e, "derived resource name refused");
            return Err(NoPermit::Refused(format!("the step's derived resource is not a valid name: {e}")));
        }
        let resource = resource.as_str();
        let owner = PermitOwner {
            workflow_id: self.workflow_id.clone(),
            step: sd.name().to_string(),
            claim_token: self.token.clone(),
        };
        match self.inner.ports.permits.acquire(resource, &owner).await {
            Ok(PermitDecision::Granted { .. }) => Ok(Some(HeldPermit { resource: resource.to_string(), owner })),
            Ok(PermitDecision::Denied { retry_after_ms }) => {
                tracing::info!(step = sd.name(), resource, "permit denied; deferring");
                // At most `permit_retry_ms`: a full resource's hint is its soonest holder's
                // lease end, but a holder releases (with a wakeup, K-14) when its activity
                // returns, usually long before; a waiter deferred to the lease end would
                // starve behind later arrivals. A shorter hint (the start window) is kept.
                Err(NoPermit::Deferred(
                    retry_after_ms.min(self.inner.config.permit_retry_ms).max(DurationMs::from_millis(1)),
                ))
            }
            Err(e) => {
                tracing::warn!(step = sd.name(), resource, error = %e, "permit check failed; failing closed");
                Err(NoPermit::Deferred(self.inner.config.permit_retry_ms))
            }
        }
    }

    /// Give the permit back when the activity returned, whatever the outcome (K-14).
    pub(super) async fn release_permit(&self, permit: Option<HeldPermit>) {
        if let Some(p) = permit {
            if let Err(e) = self.inner.ports.permits.release(&p.resource, &p.owner).await {
                tracing::debug!(error = %e, "permit release failed (its lease will expire)");
            }
            let _ = self.inner.ports.wakeup.notify().await;
        }
    }

    /// Reset the client stream before a streaming step re-executes (K-7.2, K-16); a failed
    /// reset never blocks the step.
    pub(super) async fn maybe_reset_stream(&self, idx: usize) {
        if !self.def.steps()[idx].is_streaming() {
            return;
        }
        let reset = {
            let d = self.doc();
            let step = &d.inst.steps[idx];
            step.status == StepStatus::Running || step.error.is_some()
        };
        if let (true, Some(key)) = (reset, &self.shared.stream_key) {
            // Fenced by this claim's lease (K-16): a zombie's reset is refused by the sink
            // once a successor wrote, before its own mark-running write is refused.
            if let Err(e) = self.inner.ports.stream.reset(key, self.stream_owner()).await {
                tracing::debug!(error = %e, "stream reset failed");
            }
        }
    }

    /// This claim as a stream writer: its lease end as the store last accepted it.
    pub(super) fn stream_owner(&self) -> StreamOwner {
        StreamOwner { lease_until: self.lease.until_or_min() }
    }

    /// Permit, mark running, invoke (K-7 steps 1–3). A step that did not reach its
    /// activity is a deferral, or the end of the claim.
    pub(super) async fn enter_and_invoke(&self, idx: usize, entering: Entering) -> Result<Invocation, Member> {
        if self.cancel.is_cancelled() {
            // The claim has ended: no new activity starts (K-6.4).
            if let Entering::Marked(permit) = entering {
                self.release_permit(permit).await;
            }
            return Err(Member::Lost(self.ended_as()));
        }
        let permit = match entering {
            Entering::Marked(p) => p,
            Entering::Fresh => {
                let permit = match self.acquire_permit(idx).await {
                    Ok(p) => p,
                    Err(NoPermit::Deferred(delay_ms)) => return Err(Member::Halted(Halt::Deferred { delay_ms })),
                    // Never entered: a permanent failure of the step, through the normal path.
                    Err(NoPermit::Refused(msg)) => {
                        return Ok(Invocation {
                            result: Err(ActivityError::permanent(msg)),
                            elapsed_ms: DurationMs::ZERO,
                        })
                    }
                };
                self.maybe_reset_stream(idx).await;
                if let Err(u) = self.commit(G::Running, Transition::mark_running(idx, self.now())).await {
                    self.release_permit(permit).await;
                    return Err(match u {
                        Unwritten::End(e) => Member::Lost(e),
                        Unwritten::Unavailable => Member::HandBack,
                        Unwritten::Refused(e) => Member::RefusedPlain(idx, e),
                    });
                }
                permit
            }
        };
        if self.cancel.is_cancelled() {
            // The claim ended while the step was being marked running.
            self.release_permit(permit).await;
            return Err(Member::Lost(self.ended_as()));
        }
        // A process that slept past its lease must not start new side effects: another
        // worker may own the instance already (the write would be fenced, the call not).
        if self.past_start_limit() {
            tracing::warn!("lease expired before the activity started; stopping");
            self.cancel.cancel();
            self.release_permit(permit).await;
            return Err(Member::Lost(ClaimEnd::ClaimLost));
        }
        Ok(self.invoke_step(idx, permit).await)
    }

    /// The context of one invocation, built from the claim's copy under its lock: the
    /// names, input and outputs are shared, not copied.
    pub(super) fn context(&self, idx: Option<usize>, name: &str, cancel: CancellationToken) -> ActivityContext {
        let sh = &self.shared;
        let stream = match (idx, &sh.stream_key) {
            (Some(i), Some(key)) if self.def.steps()[i].is_streaming() => {
                Some(StreamHandle::new(self.inner.ports.stream.clone(), key.clone(), self.stream_owner()))
            }
            _ => None,
        };
        let now = self.now();
        let d = self.doc();
        let step = idx.and_then(|i| d.inst.steps.get(i));
        ActivityContext {
            workflow_id: sh.workflow_id.clone(),
            workflow_type: sh.workflow_type.clone(),
            biz_key: sh.biz_key.clone(),
            step_name: name.into(),
            step_index: idx.unwrap_or(usize::MAX),
            input: sh.input.clone(),
            round: sh.round.clone(),
            outputs: d.outputs.clone(),
            prepared: self.prepared.clone(),
            attempt: step.map_or(1, |s| s.attempt),
            workflow_run: d.inst.retry_count,
            checkpoint: step.and_then(|s| s.checkpoint.clone()),
            resume: d.inst.resume.clone().filter(|r| Some(r.step_index as usize) == idx),
            previous_error: step.and_then(|s| s.error.clone()),
            claim_token: sh.claim_token.clone(),
            cancel,
            signals: sh.signals.clone(),
            stream,
            now,
            epoch: step.map_or(0, |s| s.epoch),
            journal: idx.zip(step).map(|(i, s)| self.journal(i, s, d.inst.retry_count, now)),
            compensating: false,
            trace_parent: sh.trace_parent.clone(),
        }
    }

    /// The journal of an invocation of step `idx` (K-17.3): its record for the current
    /// logical attempt, written back through this claim.
    pub(super) fn journal(&self, idx: usize, step: &Step, run: u32, now: Instant) -> Arc<crate::journal::StepJournal> {
        let limits = self.inner.config.history_limits;
        Arc::new(crate::journal::StepJournal {
            writer: Arc::new(ClaimRecorder { claim: self.me.clone(), index: idx }),
            clock: self.inner.ports.clock.clone(),
            cache: self.inner.ports.result_cache.clone(),
            settings: self.def.steps()[idx].model.clone(),
            key: crate::activity::idempotency_key_at(&self.shared.workflow_id, &step.name, run, step.epoch),
            payload_bytes_max: self.inner.config.payload_bytes_max,
            state: tokio::sync::Mutex::new(crate::journal::JournalState::of(step, run, &limits, now)),
            poisoned: Default::default(),
        })
    }

    pub(super) async fn invoke_step(&self, idx: usize, permit: Option<HeldPermit>) -> Invocation {
        let sd = &self.def.steps()[idx];
        let cancel = self.cancel.child_token();
        let mut ctx = self.context(Some(idx), sd.name(), cancel.clone());
        let lost = self.lost_attempts.lock().expect("lost attempts lock").remove(&idx);
        ctx.previous_error = crate::engine::outcome::after_lost_attempt(lost, ctx.previous_error.take());
        let span = tracing::info_span!(
            "workflow.step",
            otel.name = %format_args!("step {}", sd.name()),
            otel.kind = "internal",
            workflow.id = %self.workflow_id,
            "workflow.type" = %self.def.workflow_type(),
            workflow.step = sd.name(),
            workflow.attempt = ctx.attempt,
            workflow.claim = %self.token.suffix(),
        );
        let renewal = permit.as_ref().map(|permit| Renewal {
            permits: &*self.inner.ports.permits,
            permit,
            every_ms: self.inner.config.permit_renew_ms,
        });
        let clock = &self.inner.ports.clock;
        // K-17.2: after an unknown outcome, ask the external system before any retry.
        let activity: Arc<dyn Activity> = match &sd.query {
            Some(query) if ctx.must_query_before_retry() => {
                Arc::new(QueryFirst { query: query.clone(), activity: sd.activity().clone() })
            }
            _ => sd.activity().clone(),
        };
        let out = invoke::invoke(clock, activity, ctx, cancel, sd.get_timeout_ms(), renewal).instrument(span).await;
        self.release_permit(permit).await;
        out
    }

    /// What the invocation means for step `idx` (K-7.4), from the facts as they are now.
    pub(super) fn classify(&self, idx: usize, inv: Invocation) -> StepResult {
        let (attempt, retrying_since) = {
            let d = self.doc();
            (d.inst.steps[idx].attempt, d.inst.steps[idx].retrying_since)
        };
        let entry = Entry {
            index: idx,
            attempt,
            elapsed_ms: inv.elapsed_ms,
            now: self.now(),
            policy: StepPolicy::from(&self.def.steps()[idx]),
            payload_bytes_max: self.inner.config.payload_bytes_max,
            error_message_bytes_max: self.inner.config.error_message_bytes_max,
            retrying_since,
            park_ms: self.inner.config.fingerprint_pushback_ms,
            dead_letter: self.dead_letters_step(idx).then(|| self.dead_letter_wait(idx)),
        };
        outcome::classify(inv.result, &entry, || self.inner.ports.ids.random_u64())
    }

    /// The `CompleteStep` write of a valid output.
    pub(super) fn completion(&self, idx: usize, output: Value, elapsed_ms: DurationMs) -> Transition {
        let now = self.now();
        let mut t = {
            let d = self.doc();
            let clears = d.inst.resume.as_ref().is_some_and(|r| r.step_index as usize == idx);
            Transition::complete_step(idx, &d.inst.steps[idx].name, output, elapsed_ms, now, clears)
        };
        self.retry_clock(&mut t);
        t
    }

    pub(super) async fn commit_skip(&self, idx: usize, error: StepError, elapsed_ms: DurationMs) -> Member {
        match self.commit(G::Running, Transition::skip_step(idx, error, elapsed_ms, self.now())).await {
            Ok(()) => Member::Settled,
            Err(Unwritten::End(e)) => Member::Lost(e),
            Err(Unwritten::Unavailable) => Member::HandBack,
            Err(Unwritten::Refused(e)) => self.refused_completion(&e, elapsed_ms),
        }
    }

    /// A lone ready step: the fusion path of K-7.1.
    pub(super) async fn run_single(&self, idx: usize, entering: Entering) -> Next {
        let inv = match self.enter_and_invoke(idx, entering).await {
            Ok(inv) => inv,
            Err(m) => return self.settle(vec![(idx, m)]).await,
        };
        if self.cancel.is_cancelled() && !matches!(inv.result, Ok(StepOutcome::Complete(_))) {
            // The claim ended during the activity; write nothing more.
            return Next::End(self.ended_as());
        }
        let (t, elapsed_ms, loops_back) = match self.classify(idx, inv) {
            StepResult::Complete { output, elapsed_ms } => {
                let loops_back = control::may_loop_back(&self.def.steps()[idx], &output);
                (self.completion(idx, output, elapsed_ms), elapsed_ms, loops_back)
            }
            StepResult::Skipped { error, elapsed_ms } => {
                let m = self.commit_skip(idx, error, elapsed_ms).await;
                return self.settle(vec![(idx, m)]).await;
            }
            StepResult::Halt(h) => return self.settle(vec![(idx, Member::Halted(h))]).await,
        };
        let (all_done, next, priority) = self.after_completion(idx);
        let completing = terminal::Completing {
            loops_back,
            all_done,
            success_finalizer: self.def.success_finalizer().is_some(),
            next_conditional: next.len() == 1 && self.def.steps()[next[0]].when.is_some(),
            next,
            stopping: self.inner.stopping.is_cancelled() || self.cancel.is_cancelled(),
        };
        let now = self.now();
        match terminal::fusion(&completing) {
            Fusion::Alone => {}
            Fusion::Completed => {
                return match self.commit(G::Running, t.fuse(Transition::completed(now))).await {
                    Ok(()) => {
                        self.on_terminal().await;
                        Next::End(ClaimEnd::Terminal(WorkflowStatus::Completed))
                    }
                    Err(u) => self.completion_unwritten(idx, u, elapsed_ms).await,
                };
            }
            Fusion::StartNext(j) => {
                // Permit before attempt++ (K-7.1): fuse completion with the next start only
                // when the permit is already granted under this token.
                match self.acquire_permit(j).await {
                    Ok(permit) => {
                        self.maybe_reset_stream(j).await;
                        return match self.commit(G::Running, t.fuse(Transition::mark_running(j, now))).await {
                            Ok(()) => Next::Continue(Some((j, permit))),
                            Err(u) => {
                                self.release_permit(permit).await;
                                self.completion_unwritten(idx, u, elapsed_ms).await
                            }
                        };
                    }
                    // The next step fails on its own entry; complete this one alone.
                    Err(NoPermit::Refused(_)) => {}
                    Err(NoPermit::Deferred(delay)) => {
                        let t =
                            t.fuse(Transition::permit_deferral(j, delay, now).release_until(now.saturating_add(delay)));
                        return match self.commit(G::Running, t).await {
                            Ok(()) => {
                                self.enqueue(priority, now.saturating_add(delay)).await;
                                Next::End(ClaimEnd::Released)
                            }
                            Err(u) => self.completion_unwritten(idx, u, elapsed_ms).await,
                        };
                    }
                }
            }
        }
        match self.commit(G::Running, t).await {
            Ok(()) => Next::Continue(None),
            Err(u) => self.completion_unwritten(idx, u, elapsed_ms).await,
        }
    }

    /// What the plan says once step `idx` completes, before its completion is written
    /// (whether every step is then done, and which steps are ready), with the instance's
    /// lane. A completion changes no other step, so this is read from the claim's copy with
    /// that one status changed for the reading, instead of from a copy of the instance.
    pub(super) fn after_completion(&self, idx: usize) -> (bool, Vec<usize>, Priority) {
        let plan = self.def.plan();
        let mut d = self.doc();
        let steps = &mut d.inst.steps;
        let was = std::mem::replace(&mut steps[idx].status, StepStatus::Completed);
        let seen = (plan.all_done(steps), plan.ready(steps));
        steps[idx].status = was;
        (seen.0, seen.1, d.inst.business_priority)
    }

    /// A lone step's completion write (fused or not) that did not commit: a refusal fails
    /// the completing step; any other end stands.
    pub(super) async fn completion_unwritten(&self, idx: usize, u: Unwritten, elapsed_ms: DurationMs) -> Next {
        match u {
            Unwritten::End(e) => Next::End(e),
            Unwritten::Unavailable => Next::End(self.hand_back(G::Running).await),
            Unwritten::Refused(e) => self.settle(vec![(idx, self.refused_completion(&e, elapsed_ms))]).await,
        }
    }
}
