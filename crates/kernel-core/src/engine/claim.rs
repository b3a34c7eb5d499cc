//! One claim, from the won `Claim` write to its end (K-6.5, K-7, K-8, K-4.5).

use super::{enqueue_and_wake, observe, publisher::stream_key, signals, ClaimEnd, Inner};
use crate::activity::{Activity, ActivityContext, ActivityError, StepOutcome};
use crate::definition::{Definition, OnFailed};
use crate::model::*;
use crate::ports::*;
use crate::transition::{Guard, Transition};
use crate::validate;
use futures::FutureExt;
use serde_json::Value;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Which token guard a claim write uses.
#[derive(Clone, Copy)]
enum G {
    Running,
    Failing,
    Token,
}

/// Result of one step invocation that did not simply complete.
#[derive(Debug)]
enum StepResult {
    /// Completed or skipped, already committed.
    Done,
    Deferred {
        delay: Millis,
    },
    Suspend {
        wait: Box<Wait>,
        checkpoint: Option<Value>,
        elapsed: i64,
    },
    Yield {
        checkpoint: Option<Value>,
        elapsed: i64,
    },
    Retry {
        error: StepError,
        delay: Millis,
        elapsed: i64,
    },
    Failed {
        error: StepError,
        elapsed: i64,
    },
    Canceled {
        error: StepError,
        elapsed: i64,
    },
    Lost(ClaimEnd),
}

impl StepResult {
    /// K-4.5 severity: canceled > failed > retry release > (permit deferral) > suspend > yield.
    fn severity(&self) -> u8 {
        match self {
            StepResult::Done => 0,
            StepResult::Yield { .. } => 1,
            StepResult::Suspend { .. } => 2,
            StepResult::Deferred { .. } => 3,
            StepResult::Retry { .. } => 4,
            StepResult::Failed { .. } => 5,
            StepResult::Canceled { .. } => 6,
            StepResult::Lost(_) => 7,
        }
    }
}

struct HeldPermit {
    resource: String,
    owner: PermitOwner,
}

enum Next {
    Continue(Option<(usize, Option<HeldPermit>)>),
    End(ClaimEnd),
}

struct Claim {
    inner: Arc<Inner>,
    def: Arc<Definition>,
    workflow_id: String,
    token: String,
    doc: Mutex<WorkflowInstance>,
    /// Cancelled on claim loss, uncertain writes and hard shutdown; parent of every
    /// activity's cancellation.
    cancel: CancellationToken,
    prepared: Mutex<Arc<Value>>,
    /// End of the lease as last written by this claim (claim or heartbeat).
    lease_until: AtomicI64,
}

fn suffix(token: &str) -> &str {
    let n = token.len();
    token.get(n.saturating_sub(6)..).unwrap_or(token)
}

/// Run a claim to its end. Activity panics become step errors; no write is ever retried.
pub(crate) async fn run(inner: Arc<Inner>, inst: WorkflowInstance) -> ClaimEnd {
    let token = inst.claim_token.clone().unwrap_or_default();
    let span = tracing::info_span!(
        "claim",
        worker = %inner.config.worker_id,
        workflow_id = %inst.workflow_id,
        workflow_type = %inst.workflow_type,
        token = %suffix(&token),
    );
    async move {
        let Some(def) = inner.defs.get(&inst.workflow_type).cloned() else {
            // The claim filter only matches registered types; leave the lease to expire.
            tracing::error!("claimed an unregistered type");
            return ClaimEnd::Uncertain;
        };
        tracing::info!(status = inst.status.as_str(), "claimed");
        let claim_t = Transition::claim(&token, inst.updated_at.max(inner.ports.clock.now()), inner.config.lease_ms);
        observe(&inner, &inst, &claim_t, inst.revision, Some(&token));
        let claim = Arc::new(Claim {
            cancel: inner.killed.child_token(),
            inner: inner.clone(),
            def,
            workflow_id: inst.workflow_id.clone(),
            token,
            lease_until: AtomicI64::new(inst.claimable_time.unwrap_or(Millis::MIN)),
            doc: Mutex::new(inst),
            prepared: Mutex::new(Arc::new(Value::Null)),
        });
        let hb_stop = CancellationToken::new();
        let hb = tokio::spawn(heartbeat(claim.clone(), hb_stop.clone()));
        let end = claim.drive().await;
        hb_stop.cancel();
        let _ = hb.await;
        tracing::info!(end = ?end, "claim ended");
        end
    }
    .instrument(span)
    .await
}

/// Heartbeat on a task detached from activity cancellation (K-6.3).
async fn heartbeat(c: Arc<Claim>, stop: CancellationToken) {
    let clock = c.inner.ports.clock.clone();
    loop {
        let next = clock.now() + c.inner.config.heartbeat_ms;
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = clock.sleep_until(next) => {}
        }
        if stop.is_cancelled() {
            return;
        }
        let now = clock.now();
        let t = Transition::heartbeat(now, c.inner.config.lease_ms);
        let guard = Guard::Token { token: c.token.clone() };
        match c.inner.ports.store.apply(&c.workflow_id, &guard, &t).await {
            Ok(WriteOutcome::Applied { .. }) => c.lease_until.store(now + c.inner.config.lease_ms, Ordering::SeqCst),
            Ok(WriteOutcome::Missed) => {
                tracing::warn!("heartbeat missed: claim lost");
                c.cancel.cancel();
                return;
            }
            Err(e) => tracing::warn!(error = %e, "heartbeat failed; retrying at the next interval"),
        }
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

impl Claim {
    fn now(&self) -> Millis {
        self.inner.ports.clock.now()
    }

    fn snapshot(&self) -> WorkflowInstance {
        self.doc.lock().expect("doc lock").clone()
    }

    fn guard(&self, g: G) -> Guard {
        let token = self.token.clone();
        match g {
            G::Running => Guard::Running { token },
            G::Failing => Guard::Failing { token },
            G::Token => Guard::Token { token },
        }
    }

    /// One guarded write. A miss is claim loss, an error is an uncertain outcome: both end
    /// the claim and cancel its activities (K-6.4); neither is retried.
    async fn commit(&self, g: G, t: Transition) -> Result<(), ClaimEnd> {
        match self.inner.ports.store.apply(&self.workflow_id, &self.guard(g), &t).await {
            Ok(WriteOutcome::Applied { revision }) => {
                let after = {
                    let mut d = self.doc.lock().expect("doc lock");
                    t.apply_to(&mut d);
                    d.revision = revision;
                    d.clone()
                };
                observe(&self.inner, &after, &t, revision, Some(&self.token));
                Ok(())
            }
            Ok(WriteOutcome::Missed) => {
                tracing::warn!(kinds = ?t.kinds, "write missed: claim lost");
                self.cancel.cancel();
                Err(ClaimEnd::ClaimLost)
            }
            Err(e) => {
                tracing::warn!(kinds = ?t.kinds, error = %e, "write outcome uncertain: ending the claim");
                self.cancel.cancel();
                Err(ClaimEnd::Uncertain)
            }
        }
    }

    async fn drive(&self) -> ClaimEnd {
        let inst = self.snapshot();
        let plan = self.def.plan();
        // K-4.3: a fingerprint mismatch is not a failure; push back, touch no step.
        if inst.definition_fingerprint != plan.fingerprint() {
            tracing::warn!(persisted = %inst.definition_fingerprint, worker = %plan.fingerprint(), "definition fingerprint mismatch; pushing back");
            let t = Transition::fingerprint_push_back(
                &inst.definition_fingerprint,
                plan.fingerprint(),
                self.now(),
                self.inner.config.fingerprint_pushback_ms,
            );
            return match self.commit(G::Token, t).await {
                Ok(()) => ClaimEnd::PushedBack,
                Err(e) => e,
            };
        }
        let status_guard = if inst.status == WorkflowStatus::Failing { G::Failing } else { G::Running };
        // K-2.3: rebuild the execution context from the persisted input.
        if let Some(prepare) = &self.inner.prepare {
            match prepare(&inst) {
                Ok(v) => *self.prepared.lock().expect("prepared lock") = Arc::new(v),
                Err(msg) => {
                    tracing::error!(error = %msg, "PrepareContext failed; releasing with a delay");
                    return self.release_after(status_guard, self.inner.config.finalizer_retry_ms).await;
                }
            }
        }
        // K-9.4: finish a half-done signal match before any step runs, so the record can
        // never wake the next identical wait.
        if let Some(Resume { kind: ResumeKind::Signal, signal_id: Some(id), .. }) = &inst.resume {
            if let Err(e) = self.inner.ports.inbox.mark_matched(id, self.now()).await {
                tracing::warn!(error = %e, "could not mark the resuming signal matched; releasing");
                return self.release_after(status_guard, self.inner.config.permit_retry_ms).await;
            }
        }
        if inst.status == WorkflowStatus::Failing {
            return self.fail_path().await;
        }
        let mut started: Option<(usize, Option<HeldPermit>)> = None;
        loop {
            if started.is_none() && (self.inner.stopping.is_cancelled() || self.cancel.is_cancelled()) {
                // Shutdown between waves: hand the instance back at once.
                return match self.commit(G::Running, Transition::release(self.now())).await {
                    Ok(()) => ClaimEnd::Released,
                    Err(e) => e,
                };
            }
            let doc = self.snapshot();
            let next = if let Some((idx, permit)) = started.take() {
                self.run_single(idx, Some(permit)).await
            } else {
                let ready = plan.ready(&doc.steps);
                if ready.is_empty() {
                    if plan.all_done(&doc.steps) {
                        return self.success_path().await;
                    }
                    if doc.steps.iter().any(|s| s.status == StepStatus::Failed) {
                        if let Err(e) = self.commit(G::Running, Transition::failing(self.now())).await {
                            return e;
                        }
                        return self.fail_path().await;
                    }
                    tracing::error!("running instance with nothing ready; releasing");
                    return self.release_after(G::Running, self.inner.config.finalizer_retry_ms).await;
                }
                if ready.len() == 1 {
                    self.run_single(ready[0], None).await
                } else {
                    self.run_wave(ready).await
                }
            };
            match next {
                Next::Continue(s) => started = s,
                Next::End(e) => return e,
            }
        }
    }

    async fn release_after(&self, g: G, delay: Millis) -> ClaimEnd {
        let now = self.now();
        match self.commit(g, Transition::finalizer_release(now, delay)).await {
            Ok(()) => {
                let prio = self.snapshot().business_priority;
                enqueue_and_wake(&self.inner, &self.workflow_id, prio, now + delay).await;
                ClaimEnd::Released
            }
            Err(e) => e,
        }
    }

    /// Acquire the step's permit, failing closed on errors (K-14).
    async fn acquire_permit(&self, idx: usize) -> Result<Option<HeldPermit>, Millis> {
        let sd = &self.def.steps()[idx];
        let Some(resource) = sd.resource_name() else { return Ok(None) };
        let owner = PermitOwner {
            workflow_id: self.workflow_id.clone(),
            step: sd.name().to_string(),
            claim_token: self.token.clone(),
        };
        match self.inner.ports.permits.acquire(resource, &owner).await {
            Ok(PermitDecision::Granted { .. }) => Ok(Some(HeldPermit { resource: resource.to_string(), owner })),
            Ok(PermitDecision::Denied { retry_after_ms }) => {
                tracing::info!(step = sd.name(), resource, "permit denied; deferring");
                Err(retry_after_ms.max(self.inner.config.permit_retry_ms))
            }
            Err(e) => {
                tracing::warn!(step = sd.name(), resource, error = %e, "permit check failed; failing closed");
                Err(self.inner.config.permit_retry_ms)
            }
        }
    }

    /// Reset the client stream before a streaming step re-executes (K-7.2, K-16); a failed
    /// reset never blocks the step.
    async fn maybe_reset_stream(&self, idx: usize) {
        if !self.def.steps()[idx].is_streaming() {
            return;
        }
        let doc = self.snapshot();
        let step = &doc.steps[idx];
        if step.status == StepStatus::Running || step.error.is_some() {
            if let Some(key) = stream_key(&doc) {
                if let Err(e) = self.inner.ports.stream.reset(&key).await {
                    tracing::debug!(error = %e, "stream reset failed");
                }
            }
        }
    }

    /// Permit, mark running, invoke. Returns the raw outcome with its elapsed time, or the
    /// non-invocation result (deferral, loss).
    async fn enter_and_invoke(
        &self,
        idx: usize,
        premarked: Option<Option<HeldPermit>>,
    ) -> Result<(Result<StepOutcome, ActivityError>, i64), StepResult> {
        let permit = match premarked {
            Some(p) => p,
            None => {
                let permit = match self.acquire_permit(idx).await {
                    Ok(p) => p,
                    Err(delay) => return Err(StepResult::Deferred { delay }),
                };
                self.maybe_reset_stream(idx).await;
                if let Err(e) = self.commit(G::Running, Transition::mark_running(idx, self.now())).await {
                    self.release_permit(permit).await;
                    return Err(StepResult::Lost(e));
                }
                permit
            }
        };
        // A process that slept past its lease must not start new side effects: another
        // worker may own the instance already (the write would be fenced, the call not).
        if self.now() >= self.lease_until.load(Ordering::SeqCst) {
            tracing::warn!("lease expired before the activity started; stopping");
            self.cancel.cancel();
            self.release_permit(permit).await;
            return Err(StepResult::Lost(ClaimEnd::ClaimLost));
        }
        Ok(self.invoke_step(idx, permit).await)
    }

    async fn release_permit(&self, permit: Option<HeldPermit>) {
        if let Some(p) = permit {
            if let Err(e) = self.inner.ports.permits.release(&p.resource, &p.owner).await {
                tracing::debug!(error = %e, "permit release failed (its lease will expire)");
            }
            let _ = self.inner.ports.wakeup.notify().await;
        }
    }

    fn context(
        &self,
        doc: &WorkflowInstance,
        idx: Option<usize>,
        name: &str,
        cancel: CancellationToken,
    ) -> ActivityContext {
        let step = idx.and_then(|i| doc.steps.get(i));
        ActivityContext {
            workflow_id: doc.workflow_id.as_str().into(),
            workflow_type: doc.workflow_type.as_str().into(),
            biz_key: doc.biz_key.as_str().into(),
            step_name: name.into(),
            step_index: idx.unwrap_or(usize::MAX),
            input: Arc::new(doc.input.clone()),
            outputs: Arc::new(doc.output.clone()),
            prepared: self.prepared.lock().expect("prepared lock").clone(),
            attempt: step.map_or(1, |s| s.attempt),
            workflow_run: doc.retry_count,
            checkpoint: step.and_then(|s| s.checkpoint.clone()),
            resume: doc.resume.clone().filter(|r| Some(r.step_index as usize) == idx),
            previous_error: step.and_then(|s| s.error.clone()),
            claim_token: self.token.as_str().into(),
            cancel,
            signals: SignalSender::new(Arc::new(signals::Delivery { inner: self.inner.clone() })),
            stream: if idx.is_some_and(|i| self.def.steps()[i].is_streaming()) {
                stream_key(doc).map(|k| StreamHandle::new(self.inner.ports.stream.clone(), k))
            } else {
                None
            },
            now: self.now(),
        }
    }

    async fn invoke_step(&self, idx: usize, permit: Option<HeldPermit>) -> (Result<StepOutcome, ActivityError>, i64) {
        let doc = self.snapshot();
        let sd = &self.def.steps()[idx];
        let span = tracing::info_span!("step", step = sd.name(), attempt = doc.steps[idx].attempt);
        let cancel = self.cancel.child_token();
        let ctx = self.context(&doc, Some(idx), sd.name(), cancel.clone());
        let out = self
            .invoke(sd.activity().clone(), ctx, cancel, sd.get_timeout_ms(), permit.as_ref())
            .instrument(span)
            .await;
        self.release_permit(permit).await;
        out
    }

    /// The single activity entry point (K-7.3): fresh timeout window, cancellation passed
    /// in, panics captured; after a timeout it waits for the activity to return.
    async fn invoke(
        &self,
        activity: Arc<dyn Activity>,
        ctx: ActivityContext,
        cancel: CancellationToken,
        timeout_ms: Millis,
        permit: Option<&HeldPermit>,
    ) -> (Result<StepOutcome, ActivityError>, i64) {
        let clock = self.inner.ports.clock.clone();
        let start = clock.now();
        let deadline = start + timeout_ms;
        let fut = AssertUnwindSafe(async move { activity.run(ctx).await }).catch_unwind();
        tokio::pin!(fut);
        let renew = async {
            let Some(p) = permit else { return std::future::pending::<()>().await };
            loop {
                clock.sleep_until(clock.now() + self.inner.config.permit_renew_ms).await;
                if let Err(e) = self.inner.ports.permits.renew(&p.resource, &p.owner).await {
                    tracing::debug!(error = %e, "permit renewal failed");
                }
            }
        };
        tokio::pin!(renew);
        let result = loop {
            tokio::select! {
                r = &mut fut => break r,
                _ = clock.sleep_until(deadline) => {
                    tracing::warn!(timeout_ms, "activity timed out; waiting for it to return");
                    cancel.cancel();
                    let _ = (&mut fut).await;
                    break Ok(Err(ActivityError::transient(format!("timed out after {timeout_ms} ms"))));
                }
                _ = &mut renew => {}
            }
        };
        let elapsed = (clock.now() - start).max(0);
        let result = result.unwrap_or_else(|panic| {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic".into());
            tracing::error!(panic = %msg, "activity panicked");
            Err(ActivityError::transient(format!("panic: {msg}")))
        });
        (result, elapsed)
    }

    fn step_error(&self, e: &ActivityError) -> StepError {
        StepError { class: e.class, message: truncate(e.message.clone(), self.inner.config.error_message_bytes_max) }
    }

    /// Turn a non-complete invocation result into a [`StepResult`] (K-7.4 order).
    fn classify(&self, idx: usize, result: Result<StepOutcome, ActivityError>, elapsed: i64) -> StepResult {
        let now = self.now();
        let limit = self.inner.config.payload_bytes_max;
        let check_cp = |cp: &Option<Value>| match cp {
            Some(v) => validate::payload("checkpoint", v, limit).map_err(|e| ActivityError::permanent(e.to_string())),
            None => Ok(()),
        };
        let perm = |e: crate::Error| ActivityError::permanent(e.to_string());
        let e: ActivityError = match result {
            Ok(StepOutcome::Sleep { delay_ms, checkpoint }) => {
                match check_cp(&checkpoint)
                    .and_then(|_| validate::positive_ms("sleep.delay_ms", delay_ms).map_err(perm))
                {
                    Ok(()) => {
                        let wait = Wait {
                            kind: WaitKind::Timer,
                            signal_type: None,
                            wait_key: None,
                            generation: 0,
                            step_index: idx as u32,
                            poll_time: Some(now + delay_ms),
                        };
                        return StepResult::Suspend { wait: Box::new(wait), checkpoint, elapsed };
                    }
                    Err(e) => e,
                }
            }
            Ok(StepOutcome::WaitForSignal(spec)) => {
                let valid = check_cp(&spec.checkpoint)
                    .and_then(|_| validate::identifier("signal_type", &spec.signal_type).map_err(perm))
                    .and_then(|_| validate::identifier("wait_key", &spec.wait_key).map_err(perm))
                    .and_then(|_| {
                        spec.poll_after_ms.map_or(Ok(()), |ms| validate::positive_ms("poll_after_ms", ms).map_err(perm))
                    });
                match valid {
                    Ok(()) => {
                        let wait = Wait {
                            kind: WaitKind::Signal,
                            signal_type: Some(spec.signal_type),
                            wait_key: Some(spec.wait_key),
                            generation: spec.generation,
                            step_index: idx as u32,
                            poll_time: spec.poll_after_ms.map(|d| now + d),
                        };
                        return StepResult::Suspend { wait: Box::new(wait), checkpoint: spec.checkpoint, elapsed };
                    }
                    Err(e) => e,
                }
            }
            Ok(StepOutcome::Yield { checkpoint }) => match check_cp(&checkpoint) {
                Ok(()) => return StepResult::Yield { checkpoint, elapsed },
                Err(e) => e,
            },
            Ok(StepOutcome::Complete(_)) => ActivityError::permanent("internal: completion routed to classify"),
            Err(e) => e,
        };
        let error = self.step_error(&e);
        let sd = &self.def.steps()[idx];
        let attempt = self.doc.lock().expect("doc lock").steps[idx].attempt;
        match e.class {
            ErrorClass::Canceled => StepResult::Canceled { error, elapsed },
            ErrorClass::Transient | ErrorClass::UnknownOutcome if attempt <= sd.get_max_retry() => {
                let delay = sd.retry_policy().delay_ms(attempt, self.inner.ports.ids.random_u64());
                StepResult::Retry { error, delay, elapsed }
            }
            _ if sd.get_on_failed() == OnFailed::Skip => {
                // Marked as failed-with-skip; committed by the caller as a skip.
                StepResult::Failed {
                    error: StepError { message: format!("[skip] {}", error.message), ..error },
                    elapsed,
                }
            }
            _ => StepResult::Failed { error, elapsed },
        }
    }

    fn is_skip(&self, idx: usize, r: &StepResult) -> bool {
        matches!(r, StepResult::Failed { .. }) && self.def.steps()[idx].get_on_failed() == OnFailed::Skip
    }

    fn strip_skip(error: StepError) -> StepError {
        let message = error.message.strip_prefix("[skip] ").map(str::to_string).unwrap_or(error.message);
        StepError { message, ..error }
    }

    /// Validate an output and build its completion, or the failure it turns into.
    fn completion(&self, idx: usize, output: Value, elapsed: i64) -> Result<Transition, StepResult> {
        if let Err(e) = validate::payload("output", &output, self.inner.config.payload_bytes_max) {
            let r = self.classify(idx, Err(ActivityError::permanent(e.to_string())), elapsed);
            return Err(r);
        }
        let doc = self.doc.lock().expect("doc lock");
        let clears = doc.resume.as_ref().is_some_and(|r| r.step_index as usize == idx);
        Ok(Transition::complete_step(idx, &doc.steps[idx].name, output, elapsed, self.now(), clears))
    }

    /// A lone ready step: the fusion path of K-7.1.
    async fn run_single(&self, idx: usize, premarked: Option<Option<HeldPermit>>) -> Next {
        let (result, elapsed) = match self.enter_and_invoke(idx, premarked).await {
            Ok(r) => r,
            Err(r) => return self.finish_wave(vec![(idx, r)]).await,
        };
        if self.cancel.is_cancelled() && !matches!(result, Ok(StepOutcome::Complete(_))) {
            // The claim was lost during the activity; any write would miss.
            return Next::End(ClaimEnd::ClaimLost);
        }
        let t = match result {
            Ok(StepOutcome::Complete(output)) => match self.completion(idx, output, elapsed) {
                Ok(t) => t,
                Err(r) => return self.finish_wave(vec![(idx, r)]).await,
            },
            other => {
                let r = self.classify(idx, other, elapsed);
                return self.finish_wave(vec![(idx, r)]).await;
            }
        };
        let plan = self.def.plan();
        let mut after = self.snapshot();
        t.apply_to(&mut after);
        let now = self.now();
        // Last completion + completed when there is no success finalizer.
        if plan.all_done(&after.steps) && self.def.success_finalizer().is_none() {
            return match self.commit(G::Running, t.fuse(Transition::completed(now))).await {
                Ok(()) => {
                    self.on_terminal().await;
                    Next::End(ClaimEnd::Terminal(WorkflowStatus::Completed))
                }
                Err(e) => Next::End(e),
            };
        }
        let next = plan.ready(&after.steps);
        if next.len() == 1 && !self.inner.stopping.is_cancelled() {
            let j = next[0];
            // Permit before attempt++ (K-7.1): fuse completion with the next start only
            // when the permit is already granted under this token.
            match self.acquire_permit(j).await {
                Ok(permit) => {
                    self.maybe_reset_stream(j).await;
                    return match self.commit(G::Running, t.fuse(Transition::mark_running(j, now))).await {
                        Ok(()) => Next::Continue(Some((j, permit))),
                        Err(e) => {
                            self.release_permit(permit).await;
                            Next::End(e)
                        }
                    };
                }
                Err(delay) => {
                    let t = t.fuse(Transition::permit_deferral(j, delay, now).release_until(now + delay));
                    return match self.commit(G::Running, t).await {
                        Ok(()) => {
                            enqueue_and_wake(&self.inner, &self.workflow_id, after.business_priority, now + delay)
                                .await;
                            Next::End(ClaimEnd::Released)
                        }
                        Err(e) => Next::End(e),
                    };
                }
            }
        }
        match self.commit(G::Running, t).await {
            Ok(()) => Next::Continue(None),
            Err(e) => Next::End(e),
        }
    }

    /// A wave of parallel steps: each commits its own completion (K-4.4); the rest is
    /// resolved after all siblings returned (K-4.5).
    async fn run_wave(&self, ready: Vec<usize>) -> Next {
        let futs = ready.iter().map(|&idx| async move {
            let (result, elapsed) = match self.enter_and_invoke(idx, None).await {
                Ok(r) => r,
                Err(r) => return (idx, r),
            };
            let r = match result {
                Ok(StepOutcome::Complete(output)) => match self.completion(idx, output, elapsed) {
                    Ok(t) => match self.commit(G::Running, t).await {
                        Ok(()) => StepResult::Done,
                        Err(e) => StepResult::Lost(e),
                    },
                    Err(r) => r,
                },
                other => self.classify(idx, other, elapsed),
            };
            let r = if self.is_skip(idx, &r) { self.commit_skip(idx, r).await } else { r };
            (idx, r)
        });
        let results = futures::future::join_all(futs).await;
        self.finish_wave(results).await
    }

    async fn commit_skip(&self, idx: usize, r: StepResult) -> StepResult {
        let StepResult::Failed { error, elapsed } = r else { return r };
        match self.commit(G::Running, Transition::skip_step(idx, Self::strip_skip(error), elapsed, self.now())).await {
            Ok(()) => StepResult::Done,
            Err(e) => StepResult::Lost(e),
        }
    }

    /// Resolve the non-completed outcomes of a wave into one write (K-4.5).
    async fn finish_wave(&self, results: Vec<(usize, StepResult)>) -> Next {
        let mut results = results;
        // A single-step "wave" may still be a skip.
        for (idx, r) in results.iter_mut() {
            if self.is_skip(*idx, r) {
                let taken = std::mem::replace(r, StepResult::Done);
                *r = self.commit_skip(*idx, taken).await;
            }
        }
        if let Some((_, StepResult::Lost(e))) = results.iter().find(|(_, r)| matches!(r, StepResult::Lost(_))) {
            return Next::End(e.clone());
        }
        let Some(win) = results
            .iter()
            .enumerate()
            .filter(|(_, (_, r))| r.severity() > 0)
            .max_by_key(|(i, (_, r))| (r.severity(), std::cmp::Reverse(*i)))
            .map(|(i, _)| i)
        else {
            return Next::Continue(None);
        };
        let now = self.now();
        let (widx, wres) = results.swap_remove(win);
        let mut t = match &wres {
            StepResult::Canceled { error, elapsed } => {
                Transition::activity_canceled(widx, error.clone(), *elapsed, now)
            }
            StepResult::Failed { error, elapsed } => Transition::step_failed(widx, error.clone(), *elapsed, now),
            StepResult::Retry { error, delay, elapsed } => {
                let d = results
                    .iter()
                    .filter_map(|(_, r)| if let StepResult::Retry { delay, .. } = r { Some(*delay) } else { None })
                    .fold(*delay, Millis::max);
                Transition::step_retry(widx, error.clone(), *elapsed, now).release_until(now + d)
            }
            StepResult::Deferred { delay } => Transition::permit_deferral(widx, *delay, now).release_until(now + delay),
            StepResult::Suspend { wait, checkpoint, elapsed } => {
                Transition::suspend(widx, (**wait).clone(), checkpoint.clone(), *elapsed, now)
            }
            StepResult::Yield { checkpoint, elapsed } => {
                Transition::yield_step(widx, checkpoint.clone(), *elapsed, now)
            }
            StepResult::Done | StepResult::Lost(_) => unreachable!("filtered above"),
        };
        let terminal_win = matches!(wres, StepResult::Canceled { .. });
        for (idx, r) in results {
            let sibling = match r {
                _ if terminal_win => continue,
                StepResult::Failed { error, elapsed } => Transition::step_failed(idx, error, elapsed, now),
                StepResult::Retry { error, elapsed, .. } => Transition::step_retry(idx, error, elapsed, now),
                StepResult::Deferred { delay } => Transition::permit_deferral(idx, delay, now),
                StepResult::Suspend { checkpoint, elapsed, .. } | StepResult::Yield { checkpoint, elapsed } => {
                    Transition::park_sibling(idx, checkpoint, elapsed, now)
                }
                StepResult::Done | StepResult::Lost(_) | StepResult::Canceled { .. } => continue,
            };
            // Keep the winner's claim/status fields: fuse the sibling's step patch only.
            let mut s = sibling;
            s.status = None;
            s.claim_token = None;
            s.claimable_time = None;
            s.wait = None;
            s.resume = None;
            s.finished_at = None;
            t = t.fuse(s);
        }
        if let Err(e) = self.commit(G::Running, t).await {
            return Next::End(e);
        }
        let prio = self.snapshot().business_priority;
        Next::End(match wres {
            StepResult::Canceled { .. } => {
                self.on_terminal().await;
                ClaimEnd::Terminal(WorkflowStatus::Canceled)
            }
            StepResult::Failed { .. } => self.fail_path().await,
            StepResult::Retry { .. } | StepResult::Deferred { .. } => {
                let at = self.snapshot().claimable_time.unwrap_or(now);
                enqueue_and_wake(&self.inner, &self.workflow_id, prio, at).await;
                ClaimEnd::Released
            }
            StepResult::Suspend { wait, .. } => {
                self.after_suspend(&wait).await;
                ClaimEnd::Suspended
            }
            StepResult::Yield { .. } => {
                enqueue_and_wake(&self.inner, &self.workflow_id, prio, now).await;
                ClaimEnd::Yielded
            }
            StepResult::Done | StepResult::Lost(_) => unreachable!(),
        })
    }

    /// K-9.4: right after a signal wait is stored, consume an early signal.
    async fn after_suspend(&self, wait: &Wait) {
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

    async fn run_finalizer(&self, activity: Arc<dyn Activity>, name: &str) -> Result<(), ActivityError> {
        let doc = self.snapshot();
        let cancel = self.cancel.child_token();
        let ctx = self.context(&doc, None, name, cancel.clone());
        let span = tracing::info_span!("finalizer", name);
        let (r, _) =
            self.invoke(activity, ctx, cancel, self.inner.config.finalizer_timeout_ms, None).instrument(span).await;
        match r {
            Ok(StepOutcome::Complete(_)) => Ok(()),
            Ok(other) => Err(ActivityError::permanent(format!("a finalizer must complete, got {other:?}"))),
            Err(e) => Err(e),
        }
    }

    /// Success (K-8): finalizer, then `running + token → completed`.
    async fn success_path(&self) -> ClaimEnd {
        if let Some(f) = self.def.success_finalizer().cloned() {
            if let Err(e) = self.run_finalizer(f, "success_finalizer").await {
                tracing::warn!(error = %e, "success finalizer failed; releasing with a delay");
                return self.release_after(G::Running, self.inner.config.finalizer_retry_ms).await;
            }
        }
        match self.commit(G::Running, Transition::completed(self.now())).await {
            Ok(()) => {
                self.on_terminal().await;
                ClaimEnd::Terminal(WorkflowStatus::Completed)
            }
            Err(e) => e,
        }
    }

    /// Failure (K-8): in `failing`, the finalizer, then `failing + token → failed`. Failed
    /// steps are never re-run here.
    async fn fail_path(&self) -> ClaimEnd {
        if let Some(f) = self.def.failure_finalizer().cloned() {
            if let Err(e) = self.run_finalizer(f, "failure_finalizer").await {
                tracing::warn!(error = %e, "failure finalizer failed; releasing with a delay");
                return self.release_after(G::Failing, self.inner.config.finalizer_retry_ms).await;
            }
        }
        match self.commit(G::Failing, Transition::failed(self.now())).await {
            Ok(()) => {
                self.on_terminal().await;
                ClaimEnd::Terminal(WorkflowStatus::Failed)
            }
            Err(e) => e,
        }
    }

    /// After the terminal commit: only best-effort side channels (K-8, K-16).
    async fn on_terminal(&self) {
        if !self.def.steps().iter().any(|s| s.is_streaming()) {
            return;
        }
        let doc = self.snapshot();
        if let Some(key) = stream_key(&doc) {
            let summary = serde_json::json!({ "status": doc.status.as_str(), "revision": doc.revision });
            if let Err(e) = self.inner.ports.stream.terminal(&key, summary).await {
                tracing::debug!(error = %e, "terminal frame failed");
            }
        }
    }
}
