//! The engine: wires the pure core to the ports (K-5 … K-10, K-13).
//!
//! - [`Publisher::start_or_resume`]: the idempotent entry (K-5);
//!   the `kernel-events` crate builds event routes on it (an event starts a workflow or
//!   signals the running one).
//! - [`Engine::tick`]: one scheduling round (K-6.7) that runs the claim it wins to its end
//!   (`scheduling.rs`, with the spawned run loop).
//! - [`Engine::maintain`]: timer activation, signal repair, inbox retention and the rebuild
//!   scan (K-9.2, K-9.4, K-13; `maintenance.rs`).
//! - [`Engine::spawn`]: the background worker with slots, wakeups, polling and graceful
//!   shutdown (K-6.6); [`RunningEngine::health`] reports on it.
//!
//! Inside, one claim is driven by `claim.rs` (and its stages in `claim/`), which only
//! sequences: the activity entry point (timeout, cancellation, panic capture, permit
//! renewal) is `invoke.rs`; every decision is a pure function over plain values, each
//! table-tested: what a result means (the K-7.4 order) and how a wave resolves (K-4.5) in
//! `outcome.rs`, loops and branches in `control.rs`, dead-letter decisions in
//! `dead_letter_decision.rs`, the compensation in `compensation_plan.rs`, the way to the
//! end in `terminal.rs`; observations, enqueue + wakeup and stream keys, shared by the
//! engine and the publisher, are `effects.rs`.

mod claim;
mod compensation_plan;
mod config;
mod control;
mod dead_letter_decision;
mod deadline;
mod effects;
mod envelope;
mod enveloped;
mod health;
mod heartbeat;
mod invoke;
mod maintenance;
mod operator;
mod operator_decision;
#[cfg(test)]
mod operator_decision_tests;
mod operator_write;
mod outcome;
mod ports;
mod publisher;
mod scheduling;
mod signals;
mod terminal;
#[cfg(test)]
mod test_fixtures;

pub use config::EngineConfig;
pub use deadline::{DeadlineInbox, DeadlineOutbox, DeadlineStore};
pub use envelope::{CallEnd, Effect, PortCall, PortEnvelope, PortHook};
pub use enveloped::Enveloped;
pub use health::{EngineHealth, MaintenancePass, WakeupState};
pub use operator::{dead_letter_generation, Regenerated, DEAD_LETTER_SIGNAL};
pub use operator_write::{Acted, CancelOutcome};
pub use ports::{MissingPort, Ports, PortsBuilder};
pub use publisher::{Publisher, PublisherBuilder, StartOutcome, StartRequest};
pub use signals::Delivered;
pub use terminal::REFUSED_WRITES_MAX;

use crate::definition::{Definition, DefinitionRegistry};
use crate::domain::{Instant, WorkflowInstance};
use crate::error::{Error, Result};
use crate::id::{ClaimToken, WorkflowId};
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
    Terminal(crate::domain::WorkflowStatus),
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
    /// Inbox records (by `signal_id`) the pass read but could not decode, skipped and
    /// paged past so the repair and retention scans went on with the others (K-9.4); each
    /// is logged once per engine and listed in [`EngineHealth::undecodable_signals`].
    pub undecodable_signals: Vec<String>,
    /// Items the pass skipped because their own write or match failed (a timer activation
    /// write, a signal match): counted and logged, and the pass went on with the others;
    /// the next pass finds them again.
    pub item_failures: usize,
    /// Parts of the pass that failed as a whole and were skipped so the rest still ran
    /// (`signal_repair`, `signal_retention`: an inbox page that could not be read); the
    /// next pass tries them again. Reported in [`EngineHealth::last_maintenance`].
    pub phases_failed: Vec<&'static str>,
}

/// Most quarantined instance ids an engine remembers (to log each once and report them);
/// the same bound holds for undecodable inbox records.
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
    /// Inbox records found undecodable, by `signal_id`, with the reason (bounded by
    /// [`QUARANTINE_IDS_MAX`]).
    pub(crate) undecodable_signals: Mutex<std::collections::BTreeMap<String, String>>,
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

    /// Remember an undecodable inbox record, logging it the first time this engine meets it.
    pub(crate) fn undecodable_signal(&self, found: &UndecodableSignal) {
        let mut u = self.undecodable_signals.lock().expect("undecodable signals lock");
        if u.contains_key(&found.signal_id) {
            return;
        }
        let (signal_id, reason) = (&found.signal_id, &found.reason);
        tracing::warn!(worker = %self.config.worker_id, %signal_id, %reason, "inbox record does not decode; skipped");
        if u.len() < QUARANTINE_IDS_MAX {
            u.insert(signal_id.clone(), reason.clone());
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
    port_hook: Option<Arc<dyn PortHook>>,
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
    /// Run `hook` around every port call the engine makes (metrics, fault injection):
    /// see [`PortHook`]. Every call also has the deadline
    /// [`EngineConfig::store_call_deadline_ms`] on the engine's clock, hook or not.
    pub fn port_hook(mut self, hook: Arc<dyn PortHook>) -> Self {
        self.port_hook = Some(hook);
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
        // Every port call the engine makes runs in one envelope: a deadline on its clock,
        // the deployment's hook (K-6.8).
        let env = PortEnvelope::new(self.ports.clock.clone(), self.config.store_call_deadline_ms)
            .with_hook(self.port_hook.clone());
        let ports = envelope::envelop(self.ports, &env);
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
                undecodable_signals: Mutex::new(Default::default()),
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
            port_hook: None,
            error: None,
        }
    }

    /// The settings.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// The ports, as the engine uses them: every port that does I/O runs in the engine's
    /// [`PortEnvelope`] (`EngineConfig::store_call_deadline_ms`, the builder's
    /// [`port_hook`](EngineBuilder::port_hook)).
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

    /// Run in the background: wakeups, polling, maintenance and `worker_slots` concurrent
    /// claims. Stop with [`RunningEngine::shutdown`].
    pub fn spawn(&self) -> RunningEngine {
        let engine = self.clone();
        let handle = tokio::spawn(async move { engine.run_loop().await });
        let engine = self.clone();
        let maint = tokio::spawn(async move { engine.maintenance_loop().await });
        RunningEngine { engine: self.clone(), handle, maint }
    }
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
        let undecodable = inner.undecodable_signals.lock().expect("undecodable signals lock").keys().cloned().collect();
        inner.health.snapshot(inner.stopping.is_cancelled(), quarantined, undecodable)
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
