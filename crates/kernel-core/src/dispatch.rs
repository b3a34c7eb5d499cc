//! From request to workflow (K-11, K-12, invariant K-3.1): accept with a pending intent in
//! the same atomic write, the realtime path (StartOrResume, then confirm with the K-11.2
//! re-read rules), the recovery dispatcher (candidates + a low-frequency scan under a
//! store-kept mutex, per-object leases, revert on failure) and new rounds after failure.

use crate::domain::{DurationMs, Priority, WorkflowStatus};
use crate::engine::{DeadlineOutbox, Publisher, StartRequest};
use crate::error::{Error, Result};
use crate::id::{BusinessRound, FencingToken, LeaseToken, ObjectId};
use crate::ports::*;
use crate::validate;
use serde_json::Value;
use std::sync::Arc;

/// Settings of the dispatch paths.
#[derive(Debug, Clone)]
pub struct DispatchConfig {
    /// Name of this dispatcher (mutex holder, logs).
    pub dispatcher_id: String,
    /// Business status written at accept and by a new round.
    pub initial_status: String,
    /// Business status that allows a new round (K-11.4).
    pub failed_status: String,
    /// How long recovery leaves a fresh intent to the realtime path.
    pub realtime_grace_ms: DurationMs,
    /// Per-object recovery lease.
    pub lease_ms: DurationMs,
    /// Delay before a failed or deferred intent is tried again.
    pub retry_delay_ms: DurationMs,
    /// Candidates popped per recovery round.
    pub batch_max: usize,
    /// Ids per scan page.
    pub scan_page_size: usize,
    /// Pages per scan.
    pub scan_pages_max: usize,
    /// How long one scan holds the distributed mutex.
    pub scan_lock_ms: DurationMs,
    /// How long an outbox call may take on the clock before it gives up (a write as
    /// `Error::Uncertain`, a read as `Error::Unavailable`); shorter than `lease_ms`, so a
    /// recovery lease is never renewed blindly past its end.
    pub store_call_deadline_ms: DurationMs,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        DispatchConfig {
            dispatcher_id: "dispatcher".into(),
            initial_status: "initial".into(),
            failed_status: "failed".into(),
            realtime_grace_ms: DurationMs::from_millis(10_000),
            lease_ms: DurationMs::from_millis(30_000),
            retry_delay_ms: DurationMs::from_millis(5_000),
            batch_max: 100,
            scan_page_size: 100,
            scan_pages_max: 10,
            scan_lock_ms: DurationMs::from_millis(60_000),
            store_call_deadline_ms: DurationMs::from_millis(10_000),
        }
    }
}

impl DispatchConfig {
    /// Check every field.
    pub fn validate(&self) -> Result<()> {
        validate::identifier("dispatcher_id", &self.dispatcher_id)?;
        validate::identifier("initial_status", &self.initial_status)?;
        validate::identifier("failed_status", &self.failed_status)?;
        for (f, v) in
            [("lease_ms", self.lease_ms), ("retry_delay_ms", self.retry_delay_ms), ("scan_lock_ms", self.scan_lock_ms)]
        {
            validate::config_ms(f, v)?;
        }
        validate::positive_ms("store_call_deadline_ms", self.store_call_deadline_ms)?;
        if self.store_call_deadline_ms >= self.lease_ms {
            return Err(Error::invalid("store_call_deadline_ms", "must be shorter than lease_ms"));
        }
        if self.realtime_grace_ms < 0 {
            return Err(Error::invalid("realtime_grace_ms", "must be >= 0"));
        }
        if self.realtime_grace_ms > validate::CONFIG_MS_MAX {
            return Err(Error::invalid("realtime_grace_ms", format_args!("must be <= {} ms", validate::CONFIG_MS_MAX)));
        }
        for (f, v) in [
            ("batch_max", self.batch_max),
            ("scan_page_size", self.scan_page_size),
            ("scan_pages_max", self.scan_pages_max),
        ] {
            if v == 0 {
                return Err(Error::invalid(f, "must be > 0"));
            }
        }
        Ok(())
    }
}

/// Builds an input for objects accepted before input snapshots existed: only stable fields
/// and conservative defaults, never today's configuration (K-11.3).
pub type LegacyInput = Arc<dyn Fn(&DispatchRecord) -> Value + Send + Sync>;

/// A request to accept.
#[derive(Debug, Clone, PartialEq)]
pub struct AcceptRequest {
    /// Business object id.
    pub object_id: ObjectId,
    /// The user's fields of the business object.
    pub fields: Value,
    /// Workflow type.
    pub workflow_type: String,
    /// Workflow idempotency key.
    pub biz_key: String,
    /// The round.
    pub fencing_token: FencingToken,
    /// The exact input snapshot (must carry `fencing_token`).
    pub input: Value,
    /// Lane.
    pub priority: Priority,
}

impl AcceptRequest {
    /// The K-2.0 check of a request before anything is written: `object_id`,
    /// `workflow_type`, `biz_key` and `fencing_token` are identifiers, and the input
    /// snapshot carries the round's fencing token. The outbox then checks the written
    /// object as a whole ([`OutboxAccept::validate`](crate::ports::OutboxAccept::validate):
    /// field names, payload sizes).
    pub fn validate(&self) -> Result<()> {
        let AcceptRequest { object_id, fields: _, workflow_type, biz_key, fencing_token, input, priority: _ } = self;
        validate::identifier("object_id", object_id.as_str())?;
        validate::identifier("workflow_type", workflow_type)?;
        validate::identifier("biz_key", biz_key)?;
        validate::identifier("fencing_token", fencing_token.as_str())?;
        if !BusinessRound::of(input).is(fencing_token) {
            return Err(Error::invalid(
                "input.fencing_token",
                "the input snapshot must carry the round's fencing token",
            ));
        }
        Ok(())
    }
}

/// How the realtime path ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RealtimeOutcome {
    /// Registered and confirmed (by this call or an earlier one).
    Dispatched,
    /// A recovery dispatcher holds the intent; it will confirm.
    LeftToDispatcher,
    /// The previous round's failure finalizer is still running (K-5 failing): the intent
    /// stays pending with a later attempt time.
    Deferred,
}

/// What a recovery attempt on one object did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Processed {
    /// Registered and confirmed under this dispatcher's lease.
    Dispatched,
    /// Given back as pending with a later attempt time.
    Reverted,
    /// Not taken: not due, held by another dispatcher, or already dispatched.
    Skipped,
    /// The lease was lost midway; this dispatcher changed nothing after that.
    LeaseLost,
}

/// Counts of one recovery round or scan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Candidates examined.
    pub examined: usize,
    /// Confirmed dispatched.
    pub dispatched: usize,
    /// Reverted for later.
    pub reverted: usize,
    /// Lost leases.
    pub lease_lost: usize,
}

impl RecoveryReport {
    fn add(&mut self, p: Processed) {
        self.examined += 1;
        match p {
            Processed::Dispatched => self.dispatched += 1,
            Processed::Reverted => self.reverted += 1,
            Processed::LeaseLost => self.lease_lost += 1,
            Processed::Skipped => {}
        }
    }
}

/// Both dispatch paths over one outbox.
#[derive(Clone)]
pub struct Dispatch {
    outbox: Arc<DynOutbox>,
    candidates: Arc<DynCandidates>,
    publisher: Publisher,
    clock: Arc<DynClock>,
    ids: Arc<DynIds>,
    config: DispatchConfig,
    legacy: Option<LegacyInput>,
}

impl std::fmt::Debug for Dispatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatch").field("config", &self.config).finish_non_exhaustive()
    }
}

/// Builder of a [`Dispatch`], from [`Dispatch::builder`]. Every port is named, none is
/// positional; the clock defaults to [`SystemClock`], the ids to [`RandomIds`] and the
/// settings to [`DispatchConfig::default`].
#[derive(Default)]
#[must_use = "a builder does nothing until `build`"]
pub struct DispatchBuilder {
    outbox: Option<Arc<DynOutbox>>,
    candidates: Option<Arc<DynCandidates>>,
    publisher: Option<Publisher>,
    clock: Option<Arc<DynClock>>,
    ids: Option<Arc<DynIds>>,
    config: DispatchConfig,
    legacy: Option<LegacyInput>,
}

impl std::fmt::Debug for DispatchBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatchBuilder")
            .field("outbox", &self.outbox.is_some())
            .field("candidates", &self.candidates.is_some())
            .field("publisher", &self.publisher.is_some())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl DispatchBuilder {
    /// The business collection holding objects and their intents (required).
    pub fn outbox(mut self, outbox: Arc<DynOutbox>) -> Self {
        self.outbox = Some(outbox);
        self
    }
    /// The recovery candidate index (required).
    pub fn candidates(mut self, candidates: Arc<DynCandidates>) -> Self {
        self.candidates = Some(candidates);
        self
    }
    /// Registers workflows: StartOrResume (required).
    pub fn publisher(mut self, publisher: Publisher) -> Self {
        self.publisher = Some(publisher);
        self
    }
    /// Time for due dates, leases and the scan mutex (default: the system clock).
    pub fn clock(mut self, clock: Arc<DynClock>) -> Self {
        self.clock = Some(clock);
        self
    }
    /// Lease tokens (default: random).
    pub fn ids(mut self, ids: Arc<DynIds>) -> Self {
        self.ids = Some(ids);
        self
    }
    /// Settings, validated by [`build`](Self::build).
    pub fn config(mut self, config: DispatchConfig) -> Self {
        self.config = config;
        self
    }
    /// Builds inputs for objects accepted before input snapshots existed (K-11.3).
    pub fn legacy_input(mut self, f: LegacyInput) -> Self {
        self.legacy = Some(f);
        self
    }
    /// Validate and build; a missing required port is [`Error::InvalidInput`] naming it.
    pub fn build(self) -> Result<Dispatch> {
        let outbox = self.outbox.ok_or_else(|| Error::invalid("outbox", "required"))?;
        let candidates = self.candidates.ok_or_else(|| Error::invalid("candidates", "required"))?;
        let publisher = self.publisher.ok_or_else(|| Error::invalid("publisher", "required"))?;
        self.config.validate()?;
        let clock: Arc<DynClock> = self.clock.unwrap_or_else(|| Arc::new(SystemClock));
        // Every outbox call has a deadline on the dispatch's clock.
        let outbox: Arc<DynOutbox> =
            Arc::new(DeadlineOutbox::new(outbox, clock.clone(), self.config.store_call_deadline_ms));
        Ok(Dispatch {
            outbox,
            candidates,
            publisher,
            clock,
            ids: self.ids.unwrap_or_else(|| Arc::new(RandomIds::default())),
            config: self.config,
            legacy: self.legacy,
        })
    }
}

fn start_request(intent: &DispatchIntent, input: Value) -> StartRequest {
    StartRequest::new(intent.workflow_type.clone(), intent.biz_key.clone(), input).priority(intent.priority)
}

impl Dispatch {
    /// Start building a dispatch; the outbox, candidate index and publisher are required.
    ///
    /// ```
    /// use kernel_core::dispatch::{Dispatch, DispatchConfig};
    /// // Without its ports a dispatch is refused, naming what is missing.
    /// let err = Dispatch::builder().config(DispatchConfig::default()).build().unwrap_err();
    /// assert!(err.to_string().contains("outbox"));
    /// ```
    ///
    /// A complete one, with the clock and ids of the engine's ports:
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kernel_core::dispatch::{Dispatch, DispatchConfig};
    /// use kernel_core::ports::{DynCandidates, DynOutbox};
    /// use kernel_core::{Engine, Result};
    ///
    /// fn api_dispatch(engine: &Engine, outbox: Arc<DynOutbox>, candidates: Arc<DynCandidates>) -> Result<Dispatch> {
    ///     Dispatch::builder()
    ///         .outbox(outbox)
    ///         .candidates(candidates)
    ///         .publisher(engine.publisher())
    ///         .clock(engine.ports().clock.clone())
    ///         .ids(engine.ports().ids.clone())
    ///         .config(DispatchConfig { dispatcher_id: "api-1".into(), ..DispatchConfig::default() })
    ///         .build()
    /// }
    /// # let _ = api_dispatch;
    /// ```
    pub fn builder() -> DispatchBuilder {
        DispatchBuilder::default()
    }

    /// Install the legacy-input builder.
    pub fn with_legacy_input(mut self, f: LegacyInput) -> Self {
        self.legacy = Some(f);
        self
    }

    /// The outbox.
    pub fn outbox(&self) -> &Arc<DynOutbox> {
        &self.outbox
    }

    /// Accept a request: business object and pending intent in one atomic write, then a
    /// best-effort recovery candidate due after the realtime grace.
    pub async fn accept(&self, req: AcceptRequest) -> Result<AcceptOutcome> {
        req.validate()?;
        let due = self.clock.now().saturating_add(self.config.realtime_grace_ms);
        let intent =
            DispatchIntent::pending(&req.workflow_type, &req.biz_key, &req.fencing_token, req.input, req.priority, due);
        let out = self.outbox.accept(&req.object_id, req.fields, &self.config.initial_status, intent).await?;
        if out == AcceptOutcome::Accepted {
            if let Err(e) = self.candidates.add(&req.object_id, due).await {
                tracing::debug!(object_id = %req.object_id, error = %e, "candidate add failed; the scan will find it");
            }
        }
        Ok(out)
    }

    /// The realtime path (K-11.2): StartOrResume with the stored snapshot, then confirm;
    /// on a miss re-read: same token dispatched ⇒ done, same token processing ⇒ left to the
    /// dispatcher, newer token ⇒ [`Error::RoundChanged`].
    pub async fn dispatch_now(&self, object_id: &ObjectId) -> Result<RealtimeOutcome> {
        validate::identifier("object_id", object_id.as_str())?;
        let rec = self.outbox.get(object_id).await?.ok_or_else(|| Error::NotFound(object_id.to_string()))?;
        let intent =
            rec.dispatch.clone().ok_or_else(|| Error::NotFound(format!("{object_id} has no dispatch intent")))?;
        match intent.status {
            DispatchStatus::Dispatched => return Ok(RealtimeOutcome::Dispatched),
            DispatchStatus::Processing => return Ok(RealtimeOutcome::LeftToDispatcher),
            DispatchStatus::Pending => {}
        }
        let f = intent.fencing_token.clone();
        let input = self.input_of(&rec, &intent)?;
        let out = self.publisher.start_or_resume(start_request(&intent, input)).await?;
        if !registered(&out) {
            self.outbox
                .defer_pending(object_id, &f, self.clock.now().saturating_add(self.config.retry_delay_ms))
                .await?;
            return Ok(RealtimeOutcome::Deferred);
        }
        if self.outbox.confirm_dispatched(object_id, &f).await? {
            return Ok(RealtimeOutcome::Dispatched);
        }
        let now = self
            .outbox
            .get(object_id)
            .await?
            .and_then(|r| r.dispatch)
            .ok_or_else(|| Error::NotFound(object_id.to_string()))?;
        if now.fencing_token != f {
            return Err(Error::RoundChanged(format!("{object_id}: round {f} was replaced by {}", now.fencing_token)));
        }
        match now.status {
            DispatchStatus::Dispatched => Ok(RealtimeOutcome::Dispatched),
            DispatchStatus::Processing => Ok(RealtimeOutcome::LeftToDispatcher),
            DispatchStatus::Pending => Err(Error::Conflict(format!("{object_id}: confirm missed on a pending intent"))),
        }
    }

    /// A new round after a failure (K-11.4): install `next_token` with `input` by CAS on
    /// `failed + prev`, then run the realtime path, which replays the same instance. A
    /// concurrent loser gets [`Error::RoundChanged`] and writes nothing.
    pub async fn retry_failed(
        &self,
        object_id: &ObjectId,
        prev_token: &FencingToken,
        next_token: &FencingToken,
        input: Value,
    ) -> Result<RealtimeOutcome> {
        validate::identifier("object_id", object_id.as_str())?;
        validate::identifier("fencing_token", next_token.as_str())?;
        if !BusinessRound::of(&input).is(next_token) {
            return Err(Error::invalid("input.fencing_token", "the input snapshot must carry the new round's token"));
        }
        let rec = self.outbox.get(object_id).await?.ok_or_else(|| Error::NotFound(object_id.to_string()))?;
        let old = rec.dispatch.ok_or_else(|| Error::NotFound(format!("{object_id} has no dispatch intent")))?;
        let due = self.clock.now().saturating_add(self.config.realtime_grace_ms);
        let next = DispatchIntent::pending(&old.workflow_type, &old.biz_key, next_token, input, old.priority, due);
        if !self.outbox.retry_failed(object_id, prev_token, next, &self.config.initial_status).await? {
            return Err(Error::RoundChanged(format!("{object_id}: round {prev_token} is no longer the failed one")));
        }
        if let Err(e) = self.candidates.add(object_id, due).await {
            tracing::debug!(%object_id, error = %e, "candidate add failed; the scan will find it");
        }
        self.dispatch_now(object_id).await
    }

    /// One recovery round: pop up to `batch_max` due candidates and process each. A
    /// candidate index error ends the round (the scan still finds everything).
    pub async fn recover_round(&self) -> Result<RecoveryReport> {
        let mut report = RecoveryReport::default();
        let ids = match self.candidates.pop_due(self.clock.now(), self.config.batch_max).await {
            Ok(ids) => ids,
            Err(e) => {
                tracing::debug!(error = %e, "candidate index unavailable");
                return Ok(report);
            }
        };
        for id in ids {
            report.add(self.process(&id).await?);
        }
        Ok(report)
    }

    /// The low-frequency scan under the store-kept mutex: due intents are re-added as
    /// candidates; when the candidate index is down they are processed directly, so
    /// recovery works without Redis. Returns `None` when another dispatcher holds the mutex.
    pub async fn scan(&self) -> Result<Option<RecoveryReport>> {
        let now = self.clock.now();
        if !self
            .outbox
            .try_lock("dispatch-scan", &self.config.dispatcher_id, now, now.saturating_add(self.config.scan_lock_ms))
            .await?
        {
            return Ok(None);
        }
        let mut report = RecoveryReport::default();
        let mut after: Option<ObjectId> = None;
        for _ in 0..self.config.scan_pages_max {
            let page = self.outbox.scan_due(self.clock.now(), after.as_ref(), self.config.scan_page_size).await?;
            for (id, due) in &page {
                if self.candidates.add(id, *due).await.is_err() {
                    report.add(self.process(id).await?);
                }
            }
            if page.len() < self.config.scan_page_size {
                break;
            }
            after = page.last().map(|(id, _)| id.clone());
        }
        Ok(Some(report))
    }

    /// Recovery of one object (K-11.3).
    pub async fn process(&self, object_id: &ObjectId) -> Result<Processed> {
        validate::identifier("object_id", object_id.as_str())?;
        let d = LeaseToken::from(self.ids.new_token());
        let now = self.clock.now();
        let Some(rec) = self.outbox.try_lease(object_id, now, &d, now.saturating_add(self.config.lease_ms)).await?
        else {
            return Ok(Processed::Skipped);
        };
        let Some(intent) = rec.dispatch.clone() else { return Ok(Processed::Skipped) };
        let f = intent.fencing_token.clone();
        let input = match self.input_of(&rec, &intent) {
            Ok(i) => i,
            Err(e) => {
                tracing::error!(%object_id, error = %e, "unusable dispatch intent; reverting with a long delay");
                return self.revert(object_id, &f, &d, self.config.retry_delay_ms.saturating_mul(12)).await;
            }
        };
        // Renew at a third of the lease; a failed renewal is retried sooner, but only while
        // a retry can still finish (its deadline included) before the last lease end the
        // outbox accepted: past that, another dispatcher may hold the lease, so this
        // dispatch stops (K-11.3, K-6.4).
        let renew = async {
            let mut held_until = now.saturating_add(self.config.lease_ms);
            let mut pause = DurationMs::from_millis(self.config.lease_ms.as_millis() / 3);
            loop {
                self.clock.sleep_until(self.clock.now().saturating_add(pause)).await;
                let until = self.clock.now().saturating_add(self.config.lease_ms);
                match self.outbox.renew_lease(object_id, &f, &d, until).await {
                    Ok(true) => {
                        held_until = until;
                        pause = DurationMs::from_millis(self.config.lease_ms.as_millis() / 3);
                    }
                    Ok(false) => return,
                    Err(e) => {
                        pause = DurationMs::from_millis((self.config.lease_ms.as_millis() / 10).max(1));
                        let retry_done =
                            self.clock.now().saturating_add(pause).saturating_add(self.config.store_call_deadline_ms);
                        if retry_done >= held_until {
                            tracing::warn!(%object_id, error = %e, "lease renewal failed and cannot be retried before the lease ends");
                            return;
                        }
                        tracing::debug!(%object_id, error = %e, "lease renewal failed; retrying");
                    }
                }
            }
        };
        let started = tokio::select! {
            r = self.publisher.start_or_resume(start_request(&intent, input)) => r,
            _ = renew => {
                tracing::warn!(%object_id, "dispatch lease lost; cancelling this dispatch");
                return Ok(Processed::LeaseLost);
            }
        };
        match started {
            Ok(out) if registered(&out) => {
                if self.outbox.confirm_leased(object_id, &f, &d).await? {
                    Ok(Processed::Dispatched)
                } else {
                    Ok(Processed::LeaseLost)
                }
            }
            Ok(_) => self.revert(object_id, &f, &d, self.config.retry_delay_ms).await,
            Err(e) => {
                tracing::warn!(%object_id, error = %e, "StartOrResume failed; reverting");
                self.revert(object_id, &f, &d, self.config.retry_delay_ms).await
            }
        }
    }

    async fn revert(
        &self,
        object_id: &ObjectId,
        f: &FencingToken,
        d: &LeaseToken,
        delay: DurationMs,
    ) -> Result<Processed> {
        let at = self.clock.now().saturating_add(delay);
        if !self.outbox.revert_leased(object_id, f, d, at).await? {
            return Ok(Processed::LeaseLost);
        }
        if let Err(e) = self.candidates.add(object_id, at).await {
            tracing::debug!(%object_id, error = %e, "candidate add failed; the scan will find it");
        }
        Ok(Processed::Reverted)
    }

    /// The exact snapshot, or a conservative legacy input; its fencing token must be the
    /// intent's (K-11.3).
    fn input_of(&self, rec: &DispatchRecord, intent: &DispatchIntent) -> Result<Value> {
        let input = match (&intent.input, &self.legacy) {
            (Some(i), _) => i.clone(),
            (None, Some(build)) => build(rec),
            (None, None) => {
                return Err(Error::invalid("workflow_dispatch.input", "no input snapshot and no legacy input builder"))
            }
        };
        if !BusinessRound::of(&input).is(&intent.fencing_token) {
            return Err(Error::invalid("workflow_dispatch.input.fencing_token", "does not match the intent's round"));
        }
        Ok(input)
    }
}

/// Whether StartOrResume left a registered execution for this round. A `failing` instance
/// is not (its old finalizer must finish first, K-5); canceled, completed and failed ones are
/// registered and need nothing more from the dispatcher. A failed instance of the intent's
/// own round comes back not activated (K-5: a round is never replayed under its own round),
/// so recovery after a crash between StartOrResume and confirm settles the intent against
/// it instead of re-running its failed steps under a new K-17.1 key; only a new round
/// (K-11.4) replays.
fn registered(out: &crate::engine::StartOutcome) -> bool {
    out.execution_activated || out.instance.status != WorkflowStatus::Failing
}
