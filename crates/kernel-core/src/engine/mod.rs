//! The engine: wires the pure core to the ports (K-5 … K-10, K-13).
//!
//! - [`Publisher::start_or_resume`]: the idempotent entry (K-5);
//!   [`Publisher::deliver_event`]: an event starts a workflow or signals the running one
//!   (`events.rs`).
//! - [`Engine::tick`]: one scheduling round (K-6.7) that runs the claim it wins to its end.
//! - [`Engine::maintain`]: timer activation, signal repair, inbox retention and the rebuild
//!   scan (K-9.2, K-9.4, K-13).
//! - [`Engine::spawn`]: the background worker with slots, wakeups, polling and graceful
//!   shutdown (K-6.6); [`RunningEngine::health`] reports on it.
//!
//! Inside, one claim is driven by `claim.rs`, which only sequences: the activity entry
//! point (timeout, cancellation, panic capture, permit renewal) is `invoke.rs`; what a
//! result means (the K-7.4 order) and how a wave resolves (K-4.5) are pure functions over
//! plain values in `outcome.rs`; observations, enqueue + wakeup and stream keys, shared by
//! the engine and the publisher, are `effects.rs`.

mod claim;
mod compensation_plan;
mod config;
mod control;
mod dead_letter_decision;
mod deadline;
mod effects;
mod events;
mod health;
mod heartbeat;
mod invoke;
mod operator;
mod outcome;
mod ports;
mod publisher;
mod signals;
mod terminal;
#[cfg(test)]
mod test_fixtures;

pub use config::EngineConfig;
pub use deadline::{DeadlineInbox, DeadlineOutbox, DeadlineStore};
pub use events::{Event, EventOutcome, EventRoute};
pub use health::{EngineHealth, MaintenancePass, WakeupState};
pub use operator::{dead_letter_generation, Regenerated, DEAD_LETTER_SIGNAL};
pub use ports::{MissingPort, Ports, PortsBuilder};
pub use publisher::{Publisher, PublisherBuilder, StartOutcome, StartRequest};

use crate::definition::{Definition, DefinitionRegistry};
use crate::error::{Error, Result};
use crate::id::{ClaimToken, WorkflowId};
use crate::model::{Instant, WorkflowInstance};
use crate::ports::*;
use crate::transition::{Guard, Transition};
use effects::{QueueGate, Writer};
use serde_json::Value;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Rebuilds the execution context (tenant, user identity) from the persisted input at the
/// start of each claim (K-2.3). Deterministic, no external I/O.
pub type PrepareContext = Arc<dyn Fn(&WorkflowInstance) -> std::result::Result<Value, String> + Send + Sync>;

/// Work that must happen after the running claims finished on a graceful shutdown, such as
/// draining the observer (K-6.6).
pub type ShutdownHook = Arc<dyn Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// What one scheduling round did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoundOutcome {
    /// Claimed and ran this instance; the claim ended as described.
    Ran {
        /// Instance.
        workflow_id: WorkflowId,
        /// How the claim ended.
        end: ClaimEnd,
    },
    /// Nothing claimable (after trying `stale` stale candidates).
    Idle {
        /// Candidates popped whose claim missed.
        stale: usize,
    },
    /// No free local slot.
    NoSlot,
}

/// How a claim ended (K-6.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimEnd {
    /// Reached completed / failed / canceled.
    Terminal(crate::model::WorkflowStatus),
    /// Suspended on a timer or a signal.
    Suspended,
    /// Yielded.
    Yielded,
    /// Released for a retry, a permit wait, a finalizer retry or shutdown.
    Released,
    /// Pushed back on a fingerprint mismatch.
    PushedBack,
    /// A token-guarded write missed (another worker owns it now).
    ClaimLost,
    /// A write's outcome was uncertain; the lease is left to expire.
    Uncertain,
}

/// What [`Engine::maintain`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MaintenanceReport {
    /// Due waits activated.
    pub activated: usize,
    /// Candidates re-enqueued by the rebuild scan.
    pub enqueued: usize,
    /// Pending signals repaired.
    pub signals_repaired: usize,
    /// Inbox records past retention deleted (only those no wait or redelivery needs).
    pub signals_purged: u64,
    /// Expired result-cache entries deleted (K-17.7), one page per pass.
    pub cache_purged: u64,
    /// Dead letters closed longer than `dead_letter_retention_ms` deleted (K-17.2), one page
    /// per pass.
    pub dead_letters_purged: u64,
    /// Whether Redis (the ready queue or the doorbell) failed during the pass: after its
    /// first error the pass made no more Redis calls (K-13; the store-fallback claim and the
    /// next pass find what was not enqueued).
    pub queue_unavailable: bool,
    /// Enqueues skipped (or failed) because Redis was unavailable during the pass.
    pub enqueue_skipped: usize,
    /// Instances the pass met but could not decode, skipped (quarantined) so the rest of
    /// the pass went on; each is logged once per engine and listed in
    /// [`EngineHealth::quarantined`].
    pub quarantined: Vec<WorkflowId>,
}

/// Most quarantined instance ids an engine remembers (to log each once and report them).
pub const QUARANTINE_IDS_MAX: usize = 1_024;

pub(crate) struct Inner {
    pub(crate) ports: Ports,
    pub(crate) defs: DefinitionRegistry,
    pub(crate) types: Vec<String>,
    pub(crate) config: EngineConfig,
    pub(crate) prepare: Option<PrepareContext>,
    pub(crate) slots: Arc<Semaphore>,
    /// Stop taking new work and stop between waves.
    pub(crate) stopping: CancellationToken,
    /// Hard stop after a shutdown timeout: activities are cancelled, leases left to expire.
    pub(crate) killed: CancellationToken,
    pub(crate) next_repair_at: AtomicI64,
    pub(crate) repair_cursor: Mutex<Option<String>>,
    pub(crate) rebuild_cursor: Mutex<Option<WorkflowId>>,
    pub(crate) timer_cursor: Mutex<Option<DueCursor>>,
    pub(crate) retention_cursor: Mutex<Option<String>>,
    pub(crate) repair_failed: AtomicBool,
    /// Instances found undecodable, with the reason (bounded by [`QUARANTINE_IDS_MAX`]).
    pub(crate) quarantine: Mutex<std::collections::BTreeMap<WorkflowId, String>>,
    pub(crate) shutdown_hooks: Vec<ShutdownHook>,
    pub(crate) health: health::HealthState,
    /// The one heartbeat driver of the engine's claims (K-6.3).
    pub(crate) heartbeats: heartbeat::Heartbeats,
}

impl Inner {
    /// Remember an undecodable instance, logging it the first time this engine meets it.
    pub(crate) fn quarantine(&self, workflow_id: &WorkflowId, reason: &str) {
        let mut q = self.quarantine.lock().expect("quarantine lock");
        if q.contains_key(workflow_id) {
            return;
        }
        tracing::error!(worker = %self.config.worker_id, %workflow_id, reason, "instance does not decode; skipped (quarantined)");
        if q.len() < QUARANTINE_IDS_MAX {
            q.insert(workflow_id.clone(), reason.to_string());
        }
    }

    /// The writer of observations emitted outside a claim (no token).
    fn writer(&self) -> Writer<'_> {
        Writer { worker_id: Some(&self.config.worker_id), claim_token: None }
    }
}

/// Run a claim won with `token`, counted as running while it lasts.
async fn run_claim(inner: Arc<Inner>, inst: WorkflowInstance, token: ClaimToken) -> ClaimEnd {
    let _running = inner.health.claim_started();
    claim::run(inner.clone(), inst, token).await
}

/// A worker engine. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("worker_id", &self.inner.config.worker_id)
            .field("types", &self.inner.types)
            .finish()
    }
}

/// Builder of an [`Engine`].
pub struct EngineBuilder {
    ports: Ports,
    config: EngineConfig,
    defs: DefinitionRegistry,
    prepare: Option<PrepareContext>,
    shutdown_hooks: Vec<ShutdownHook>,
    error: Option<Error>,
}

impl EngineBuilder {
    /// Settings (validated in [`build`](Self::build)).
    pub fn config(mut self, c: EngineConfig) -> Self {
        self.config = c;
        self
    }
    /// Register a definition.
    pub fn register(mut self, d: Definition) -> Self {
        if let Err(e) = self.defs.register(d) {
            self.error.get_or_insert(e);
        }
        self
    }
    /// Install the PrepareContext hook (K-2.3).
    pub fn prepare_context(mut self, f: PrepareContext) -> Self {
        self.prepare = Some(f);
        self
    }
    /// Run `hook` on a graceful shutdown, after the running claims finished (K-6.6: "then
    /// drain the observer"). Hooks run in order, within the shutdown timeout.
    pub fn on_shutdown(mut self, hook: ShutdownHook) -> Self {
        self.shutdown_hooks.push(hook);
        self
    }
    /// Validate and build.
    pub fn build(self) -> Result<Engine> {
        if let Some(e) = self.error {
            return Err(e);
        }
        self.config.validate()?;
        let types = self.defs.types();
        if self.ports.dead_letters.is_none() {
            for t in &types {
                let def = self.defs.get(t).expect("a registered type");
                if let Some(s) =
                    def.steps().iter().find(|s| s.get_on_failed() == crate::definition::OnFailed::DeadLetter)
                {
                    return Err(crate::Error::invalid(
                        "ports.dead_letters",
                        format_args!("step {} of {t} dead-letters, and the engine has no DeadLetters port", s.name()),
                    ));
                }
            }
        }
        // Every store and inbox call the engine makes has a deadline on its clock.
        let mut ports = self.ports;
        let deadline = self.config.store_call_deadline_ms;
        ports.store = Arc::new(DeadlineStore::new(ports.store.clone(), ports.clock.clone(), deadline));
        ports.inbox = Arc::new(DeadlineInbox::new(ports.inbox.clone(), ports.clock.clone(), deadline));
        Ok(Engine {
            inner: Arc::new(Inner {
                slots: Arc::new(Semaphore::new(self.config.worker_slots)),
                ports,
                defs: self.defs,
                types,
                config: self.config,
                prepare: self.prepare,
                stopping: CancellationToken::new(),
                killed: CancellationToken::new(),
                next_repair_at: AtomicI64::new(i64::MIN),
                repair_cursor: Mutex::new(None),
                rebuild_cursor: Mutex::new(None),
                timer_cursor: Mutex::new(None),
                retention_cursor: Mutex::new(None),
                repair_failed: AtomicBool::new(false),
                quarantine: Mutex::new(Default::default()),
                shutdown_hooks: self.shutdown_hooks,
                health: health::HealthState::default(),
                heartbeats: heartbeat::Heartbeats::default(),
            }),
        })
    }
}

impl Engine {
    /// Start building an engine on `ports`.
    pub fn builder(ports: Ports) -> EngineBuilder {
        EngineBuilder {
            ports,
            config: EngineConfig::default(),
            defs: DefinitionRegistry::default(),
            prepare: None,
            shutdown_hooks: Vec::new(),
            error: None,
        }
    }

    /// The settings.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// The ports, as the engine uses them: the store is wrapped in a [`DeadlineStore`]
    /// (`EngineConfig::store_call_deadline_ms`).
    pub fn ports(&self) -> &Ports {
        &self.inner.ports
    }

    /// A publisher that knows the plans of every registered definition.
    pub fn publisher(&self) -> Publisher {
        let c = &self.inner.config;
        Publisher::new(self.inner.ports.clone(), self.inner.defs.plans(), c.payload_bytes_max)
            .with_orphan_bounds(c.orphan_signals_per_workflow_max, c.orphan_signals_max)
    }

    /// A cloneable signal sender backed by this engine.
    pub fn signal_sender(&self) -> SignalSender {
        signals::sender(&self.inner)
    }

    /// Deliver a signal (K-9.3).
    pub async fn deliver_signal(&self, signal: Signal) -> Result<DeliverOutcome> {
        signals::deliver(&self.inner, signal).await
    }

    /// Cancel / supersede (K-8): `running|waiting|failing → canceled`; no token needed.
    /// Returns whether this call changed anything (idempotent).
    pub async fn cancel(&self, workflow_id: &WorkflowId) -> Result<bool> {
        crate::validate::identifier("workflow_id", workflow_id.as_str())?;
        let now = self.inner.ports.clock.now();
        let t = Transition::supersede(now);
        match self.inner.ports.store.apply(workflow_id, &Guard::Active, &t).await? {
            WriteOutcome::Applied { revision } => {
                // The read only serves the observation: skipped for a disabled sink.
                if self.inner.ports.observer.enabled() {
                    if let Some(inst) = self.inner.ports.store.get(workflow_id).await.ok().flatten() {
                        effects::observe(&*self.inner.ports.observer, &inst, &t, revision, self.inner.writer());
                    }
                }
                Ok(true)
            }
            WriteOutcome::Missed => Ok(false),
        }
    }

    /// One scheduling round (K-6.7): repair signals when due, take a slot, pop one
    /// candidate at a time (≤ `candidates_per_round_max` stale ones), claim, and run the
    /// claim won to its end. Falls back to the store when the queue errors, or is empty
    /// after a failed repair.
    pub async fn tick(&self) -> Result<RoundOutcome> {
        let Ok(permit) = self.inner.slots.clone().try_acquire_owned() else {
            return Ok(RoundOutcome::NoSlot);
        };
        let round = self.claim_round(1).await?;
        let out = match round.won.into_iter().next() {
            Some(Won { inst, token }) => {
                let id = inst.workflow_id.clone();
                let end = run_claim(self.inner.clone(), *inst, token).await;
                RoundOutcome::Ran { workflow_id: id, end }
            }
            None => RoundOutcome::Idle { stale: round.stale },
        };
        drop(permit);
        Ok(out)
    }

    /// One scheduling round for `slots` free slots (K-6.1, K-6.7; the caller holds them):
    /// repair signals when due, pop at most as many candidates as slots are still free in
    /// one call, claim them concurrently, and pop again for the slots left by stale
    /// candidates, meeting at most `candidates_per_round_max` stale candidates in the round
    /// (each pop asks for no more than the slots still free and the stale candidates still
    /// allowed). Falls back to claiming from the store, one free slot after the
    /// other, when the queue errors, or when it ran dry after a failed repair with no stale
    /// candidate in this round. Never returns more claims than `slots`.
    ///
    /// A claim won is never dropped: an error after the first win ends the round with the
    /// claims won so far (logged); an error before any win is returned.
    async fn claim_round(&self, slots: usize) -> Result<Round> {
        let inner = &self.inner;
        debug_assert!((1..=POP_DUE_MAX).contains(&slots), "{slots} slots");
        let now = inner.ports.clock.now();
        if now >= Instant::from_millis(inner.next_repair_at.load(Ordering::Relaxed)) {
            inner
                .next_repair_at
                .store(now.saturating_add(inner.config.signal_repair_interval_ms).as_millis(), Ordering::Relaxed);
            let failed = signals::repair(inner, 1, &QueueGate::default(), &mut Vec::new()).await.is_err();
            inner.repair_failed.store(failed, Ordering::Relaxed);
        }
        let mut round = Round { won: Vec::with_capacity(slots), stale: 0, drained: false };
        let mut fallback = false;
        let stale_max = inner.config.candidates_per_round_max;
        for _ in 0..stale_max {
            // Never more than the free slots (K-6.1), nor more than the stale candidates
            // this round may still meet: at most `candidates_per_round_max` in all.
            let want = (slots - round.won.len()).min(stale_max.saturating_sub(round.stale));
            if want == 0 {
                break;
            }
            let now = inner.ports.clock.now();
            let ids = match inner.ports.queue.pop_due(now, want).await {
                Ok(ids) => ids,
                Err(e) => {
                    tracing::debug!(error = %e, "ready queue unavailable; claiming from the store");
                    fallback = true;
                    break;
                }
            };
            debug_assert!(ids.len() <= want, "popped {} for {want} free slots", ids.len());
            // Fewer than asked: nothing else was due (the port's contract).
            let short = ids.len() < want;
            let mut valid = Vec::with_capacity(ids.len());
            for id in ids.into_iter().take(want) {
                if crate::validate::identifier("workflow_id", id.as_str()).is_ok() {
                    valid.push(id);
                } else {
                    round.stale += 1;
                }
            }
            let claims = valid.into_iter().map(|id| {
                let spec = self.claim_spec(now);
                async move {
                    let r = inner.ports.store.claim(&id, &spec).await;
                    (id, spec.token, r)
                }
            });
            let mut failed = None;
            for (id, token, r) in futures::future::join_all(claims).await {
                match r {
                    Ok(Some(inst)) => round.won.push(Won { inst: Box::new(inst), token }),
                    Ok(None) => round.stale += 1,
                    // The lease is written and the instance does not decode: skip it and
                    // go on to the next candidate.
                    Err(crate::Error::Corrupt { message, .. }) => {
                        inner.quarantine(&id, &message);
                        round.stale += 1;
                    }
                    Err(e) => {
                        tracing::warn!(worker = %inner.config.worker_id, workflow_id = %id, error = %e, "claim failed");
                        failed = Some(e);
                    }
                }
            }
            if failed.is_some() {
                return Ok(round);
            }
            if short {
                round.drained = true;
                fallback = round.stale == 0 && inner.repair_failed.load(Ordering::Relaxed);
                break;
            }
        }
        if fallback {
            while round.won.len() < slots {
                match self.claim_from_store().await {
                    Ok(Some((inst, token))) => round.won.push(Won { inst: Box::new(inst), token }),
                    Ok(None) => {
                        round.drained = true;
                        break;
                    }
                    Err(e) if round.won.is_empty() => return Err(e),
                    Err(e) => {
                        tracing::warn!(worker = %inner.config.worker_id, error = %e, "store-fallback claim failed");
                        break;
                    }
                }
            }
        }
        debug_assert!(round.won.len() <= slots);
        Ok(round)
    }

    /// `claim_any` with a fresh token, past instances that do not decode: each is
    /// quarantined (its lease is written, so the next call claims another), up to
    /// `candidates_per_round_max` calls.
    async fn claim_from_store(&self) -> Result<Option<(WorkflowInstance, ClaimToken)>> {
        let inner = &self.inner;
        for _ in 0..inner.config.candidates_per_round_max.max(1) {
            let spec = self.claim_spec(inner.ports.clock.now());
            match inner.ports.store.claim_any(&spec).await {
                Ok(found) => return Ok(found.map(|inst| (inst, spec.token))),
                Err(e @ crate::Error::Corrupt { .. }) => match e.corrupt_workflow_id() {
                    Some(id) => inner.quarantine(id, &e.to_string()),
                    None => {
                        tracing::error!(worker = %inner.config.worker_id, error = %e, "claimed instance does not decode; skipped")
                    }
                },
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// A claim with a freshly minted token: the token the claim then runs with, never one
    /// read back from the document (K-6.2).
    fn claim_spec(&self, now: Instant) -> ClaimSpec {
        ClaimSpec {
            now,
            lease_ms: self.inner.config.lease_ms,
            token: ClaimToken::from(self.inner.ports.ids.new_token()),
            types: self.inner.types.clone(),
        }
    }

    /// Claim any due instance straight from the store, bypassing the queue (the fallback of
    /// K-6.7), and run it.
    pub async fn tick_from_store(&self) -> Result<RoundOutcome> {
        let Ok(permit) = self.inner.slots.clone().try_acquire_owned() else {
            return Ok(RoundOutcome::NoSlot);
        };
        let out = match self.claim_from_store().await? {
            Some((inst, token)) => {
                let id = inst.workflow_id.clone();
                RoundOutcome::Ran { workflow_id: id, end: run_claim(self.inner.clone(), inst, token).await }
            }
            None => RoundOutcome::Idle { stale: 0 },
        };
        drop(permit);
        Ok(out)
    }

    /// Timer activation (K-9.2), pending-signal repair (K-9.4), one page of inbox retention
    /// and the rebuild scan (K-13), each bounded by `scan_page_size × scan_pages_max`. An
    /// instance that does not decode is skipped and reported
    /// ([`MaintenanceReport::quarantined`]), never the end of the pass; after the first
    /// Redis error the pass makes no more Redis calls
    /// ([`MaintenanceReport::queue_unavailable`]). The pass is recorded for
    /// [`RunningEngine::health`].
    pub async fn maintain(&self) -> Result<MaintenanceReport> {
        let result = self.maintenance_pass().await;
        let outcome = match &result {
            Ok(report) => Ok(report.clone()),
            Err(e) => Err(e.to_string()),
        };
        let finished_at = self.inner.ports.clock.now();
        self.inner.health.maintenance_finished(MaintenancePass { finished_at, outcome });
        result
    }

    async fn maintenance_pass(&self) -> Result<MaintenanceReport> {
        let inner = &self.inner;
        let mut report = MaintenanceReport::default();
        let now = inner.ports.clock.now();
        // One gate for the pass: after the first Redis error no more Redis calls (K-13).
        let gate = QueueGate::default();
        let (queue, wakeup) = (&*inner.ports.queue, &*inner.ports.wakeup);
        // Timers first: they never need Redis to wake (K-9.2). The scan goes on from where
        // the last pass stopped, so documents that stay due (quarantined ones) are paged past
        // instead of read again; at the end of the due set it starts over.
        for _ in 0..inner.config.scan_pages_max {
            let after = inner.timer_cursor.lock().expect("cursor lock").clone();
            let page = inner.ports.store.scan_due_waits(now, after.as_ref(), inner.config.scan_page_size).await?;
            let full = page.is_full(inner.config.scan_page_size);
            self.quarantined(&page.quarantined, &mut report);
            let next = if full { page.due_cursor() } else { None };
            for d in page.rows {
                let t = Transition::timer_activation(d.step_index as usize, d.resume, now);
                let guard = Guard::DueWait { now, step_index: d.step_index };
                if let WriteOutcome::Applied { revision } = inner.ports.store.apply(&d.workflow_id, &guard, &t).await? {
                    report.activated += 1;
                    // The read only serves the observation: skipped for a disabled sink.
                    if inner.ports.observer.enabled() {
                        if let Ok(Some(inst)) = inner.ports.store.get(&d.workflow_id).await {
                            effects::observe(&*inner.ports.observer, &inst, &t, revision, inner.writer());
                        }
                    }
                    gate.enqueue_and_wake(queue, wakeup, &d.workflow_id, d.priority, now).await;
                }
            }
            let done = next.is_none();
            *inner.timer_cursor.lock().expect("cursor lock") = next;
            if done {
                break;
            }
        }
        let mut repair_quarantined = Vec::new();
        report.signals_repaired =
            signals::repair(inner, inner.config.scan_pages_max, &gate, &mut repair_quarantined).await?;
        self.quarantined(&repair_quarantined, &mut report);
        // Retention keeps the inbox bounded, one page per pass, and deletes only what no wait
        // and no redelivery can need (K-9.4).
        let cutoff = now.saturating_sub(inner.config.signal_retention_ms);
        let mut retention_quarantined = Vec::new();
        report.signals_purged = signals::retain(inner, cutoff, &mut retention_quarantined).await?;
        self.quarantined(&retention_quarantined, &mut report);
        // The side records stay bounded too (K-17.2, K-17.7): expired cache entries and dead
        // letters closed longer than their retention, one page per pass. Best effort: they
        // decide nothing, so a failure is logged and the pass goes on.
        let page = inner.config.scan_page_size.clamp(1, CACHE_PURGE_LIMIT_MAX.min(DEAD_LETTER_PURGE_MAX));
        if let Some(cache) = &inner.ports.result_cache {
            match cache.purge_expired(now, page).await {
                Ok(n) => report.cache_purged = n,
                Err(e) => tracing::warn!(error = %e, "result cache purge failed; the next pass tries again"),
            }
        }
        if let Some(dls) = &inner.ports.dead_letters {
            let before = now.saturating_sub(inner.config.dead_letter_retention_ms);
            match dls.purge_closed(before, page).await {
                Ok(n) => report.dead_letters_purged = n,
                Err(e) => tracing::warn!(error = %e, "dead-letter purge failed; the next pass tries again"),
            }
        }
        // Rebuild: re-enqueue claimable instances even while the queue has a backlog. With
        // Redis down there is nothing to rebuild into: the scan waits for the next pass.
        for _ in 0..inner.config.scan_pages_max {
            if gate.is_down() {
                break;
            }
            let after = inner.rebuild_cursor.lock().expect("cursor lock").clone();
            let page = inner.ports.store.scan_claimable(after.as_ref(), inner.config.scan_page_size).await?;
            let full = page.is_full(inner.config.scan_page_size);
            let last = page.last.clone();
            self.quarantined(&page.quarantined, &mut report);
            for c in &page.rows {
                if gate.enqueue(queue, &c.workflow_id, c.priority, c.claimable_time).await {
                    report.enqueued += 1;
                }
            }
            if gate.is_down() {
                // Keep the cursor: the next pass starts this page over.
                break;
            }
            *inner.rebuild_cursor.lock().expect("cursor lock") = if full { last } else { None };
            if !full {
                break;
            }
        }
        if report.enqueued > 0 {
            gate.notify(wakeup).await;
        }
        report.queue_unavailable = gate.is_down();
        report.enqueue_skipped = gate.skipped();
        Ok(report)
    }

    fn quarantined(&self, found: &[Quarantined], report: &mut MaintenanceReport) {
        for q in found {
            self.inner.quarantine(&q.workflow_id, &q.reason);
            if !report.quarantined.contains(&q.workflow_id) {
                report.quarantined.push(q.workflow_id.clone());
            }
        }
    }

    /// Run in the background: wakeups, polling, maintenance and `worker_slots` concurrent
    /// claims. Stop with [`RunningEngine::shutdown`].
    pub fn spawn(&self) -> RunningEngine {
        let engine = self.clone();
        let handle = tokio::spawn(async move { engine.run_loop().await });
        let engine = self.clone();
        let maint = tokio::spawn(async move { engine.maintenance_loop().await });
        RunningEngine { engine: self.clone(), handle, maint }
    }

    async fn maintenance_loop(&self) {
        let inner = &self.inner;
        loop {
            let next = inner.ports.clock.now().saturating_add(inner.config.rebuild_interval_ms);
            tokio::select! {
                _ = inner.stopping.cancelled() => return,
                _ = inner.ports.clock.sleep_until(next) => {}
            }
            if let Err(e) = self.maintain().await {
                tracing::warn!(worker = %inner.config.worker_id, error = %e, "maintenance pass failed");
            }
        }
    }

    async fn run_loop(&self) {
        let inner = self.inner.clone();
        let mut wake = match inner.ports.wakeup.subscribe().await {
            Ok(rx) => {
                inner.health.set_wakeup(WakeupState::Subscribed);
                Some(rx)
            }
            Err(e) => {
                tracing::warn!(error = %e, "wakeup subscription failed; polling only");
                inner.health.set_wakeup(WakeupState::Polling);
                None
            }
        };
        let mut claims = tokio::task::JoinSet::new();
        loop {
            // Fill the free slots: take them first (K-6.1), pop at most that many in one
            // call, claim them concurrently, and give back the slots nobody won.
            loop {
                if inner.stopping.is_cancelled() {
                    break;
                }
                let mut free: Vec<tokio::sync::OwnedSemaphorePermit> =
                    std::iter::from_fn(|| inner.slots.clone().try_acquire_owned().ok()).take(POP_DUE_MAX).collect();
                if free.is_empty() {
                    break;
                }
                let round = match self.claim_round(free.len()).await {
                    Ok(round) => round,
                    Err(e) => {
                        tracing::warn!(error = %e, "scheduling round failed");
                        break;
                    }
                };
                let won_any = !round.won.is_empty();
                for Won { inst, token } in round.won {
                    let slot = free.pop().expect("never more claims than free slots");
                    let inner2 = inner.clone();
                    claims.spawn(async move {
                        let _slot = slot;
                        run_claim(inner2, *inst, token).await
                    });
                }
                drop(free);
                // Nothing won, or nothing else due: wait for a wakeup, a poll or a claim's end.
                if !won_any || round.drained {
                    break;
                }
            }
            let next_poll = inner.ports.clock.now().saturating_add(inner.config.poll_interval_ms);
            tokio::select! {
                _ = inner.stopping.cancelled() => break,
                _ = inner.ports.clock.sleep_until(next_poll) => {}
                rung = async { match wake.as_mut() { Some(rx) => rx.recv().await, None => std::future::pending().await } } => {
                    if rung.is_none() {
                        tracing::warn!("wakeup subscription closed; polling only");
                        inner.health.set_wakeup(WakeupState::Polling);
                        wake = None;
                    }
                }
                Some(_) = claims.join_next(), if !claims.is_empty() => {
                    // Claims that ended together free their slots for one round, not one each.
                    while claims.try_join_next().is_some() {}
                }
            }
        }
        // Graceful: running claims finish on the root context (K-6.6).
        while claims.join_next().await.is_some() {}
    }
}

/// A claim won in a scheduling round.
struct Won {
    inst: Box<WorkflowInstance>,
    /// The token minted for the claim.
    token: ClaimToken,
}

/// What [`Engine::claim_round`] did.
struct Round {
    /// Claims won, at most one per free slot.
    won: Vec<Won>,
    /// Candidates popped whose claim missed (or that were not valid ids).
    stale: usize,
    /// Whether the round saw nothing else due (a pop came short, or the store fallback
    /// found nothing).
    drained: bool,
}

/// A spawned engine.
pub struct RunningEngine {
    engine: Engine,
    handle: tokio::task::JoinHandle<()>,
    maint: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for RunningEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningEngine").field("engine", &self.engine).finish()
    }
}

impl RunningEngine {
    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// A snapshot of the engine's health: whether the wakeup is subscribed or the engine
    /// fell back to polling, the last maintenance pass and the claims running now.
    pub fn health(&self) -> EngineHealth {
        let inner = &self.engine.inner;
        let quarantined = inner.quarantine.lock().expect("quarantine lock").keys().cloned().collect();
        inner.health.snapshot(inner.stopping.is_cancelled(), quarantined)
    }

    /// Graceful shutdown (K-6.6): stop polling and wakeups, let running claims finish
    /// (they stop between waves and release), run the shutdown hooks (drain the observer),
    /// then return. After `shutdown_timeout_ms` of
    /// the engine's clock it behaves like a crash: activities are cancelled and leases are
    /// left to expire, never cleared. Returns whether the shutdown was clean.
    pub async fn shutdown(self) -> bool {
        let inner = self.engine.inner.clone();
        inner.stopping.cancel();
        self.maint.abort();
        let deadline = inner.ports.clock.now().saturating_add(inner.config.shutdown_timeout_ms);
        let mut handle = self.handle;
        let drained = async {
            let _ = (&mut handle).await;
            for hook in &inner.shutdown_hooks {
                hook().await;
            }
        };
        tokio::select! {
            _ = drained => true,
            _ = inner.ports.clock.sleep_until(deadline) => {
                inner.killed.cancel();
                handle.abort();
                false
            }
        }
    }
}
