//! The builder of a standalone [`Publisher`]: the required ports, the defaults, and the
//! deadline every store and inbox call gets.

use super::Publisher;
use crate::definition::{Plan, PlanRegistry};
use crate::domain::DurationMs;
use crate::error::{Error, Result};
use crate::ports::*;
use std::sync::Arc;

/// Builder of a standalone [`Publisher`]: the store, the queue and the wakeup are required;
/// the rest defaults to the system clock, random ids and no-op observation and stream
/// sinks, each of which can be replaced. Every call of its store, inbox, queue, wakeup and
/// stream sink gets a deadline on the clock ([`PortEnvelope`](crate::engine::PortEnvelope), default
/// [`EngineConfig::store_call_deadline_ms`](crate::engine::EngineConfig::store_call_deadline_ms)).
#[derive(Clone)]
pub struct PublisherBuilder {
    pub(super) publisher: Publisher,
    pub(super) store_call_deadline_ms: DurationMs,
}

impl std::fmt::Debug for PublisherBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublisherBuilder").field("plans", &self.publisher.plans).finish_non_exhaustive()
    }
}

impl PublisherBuilder {
    /// The time source of `created_at` and the first `claimable_time` (default:
    /// [`SystemClock`]).
    pub fn clock(mut self, clock: Arc<DynClock>) -> Self {
        self.publisher.clock = clock;
        self
    }
    /// Where generated workflow ids come from (default: [`RandomIds`]).
    pub fn ids(mut self, ids: Arc<DynIds>) -> Self {
        self.publisher.ids = ids;
        self
    }
    /// Where the `create` observation goes (default: [`NoopObservationSink`], K-15).
    pub fn observer(mut self, observer: Arc<DynObservationSink>) -> Self {
        self.publisher.observer = observer;
        self
    }
    /// The client streams reset when a start activates execution (default:
    /// [`NoopStreamSink`], K-16).
    pub fn stream(mut self, stream: Arc<DynStreamSink>) -> Self {
        self.publisher.stream = stream;
        self
    }
    /// Make the workflow type of `plan` startable (K-4.1: publishers register plans, never
    /// activities). A second plan of the same type replaces the first.
    pub fn plan(mut self, plan: Plan) -> Self {
        self.publisher.plans.register(plan);
        self
    }
    /// Use `plans` (for instance a worker's `DefinitionRegistry::plans`), replacing the
    /// plans registered so far.
    pub fn plans(mut self, plans: PlanRegistry) -> Self {
        self.publisher.plans = plans;
        self
    }
    /// Largest serialized input a start accepts (default: the engine's default,
    /// [`EngineConfig::payload_bytes_max`](crate::engine::EngineConfig::payload_bytes_max)). Must be > 0.
    pub fn payload_bytes_max(mut self, bytes: usize) -> Self {
        self.publisher.payload_bytes_max = bytes;
        self
    }
    /// How long a store call may take on the clock before it gives up (a write as
    /// `Error::Uncertain`, a read as `Error::Unavailable`; default
    /// [`EngineConfig::store_call_deadline_ms`](crate::engine::EngineConfig::store_call_deadline_ms)). Must be > 0.
    pub fn store_call_deadline_ms(mut self, deadline: impl Into<DurationMs>) -> Self {
        self.store_call_deadline_ms = deadline.into();
        self
    }
    /// The signal inbox, so the publisher can also deliver signals
    /// ([`Publisher::deliver_signal`], and the `kernel-events` crate's event routes) with no engine in the
    /// process. Its calls get the same deadline as the store's.
    pub fn inbox(mut self, inbox: Arc<DynInbox>) -> Self {
        self.publisher.inbox = Some(inbox);
        self
    }
    /// The bounds on pending signals for workflow ids that do not exist, per id and in
    /// total, as [`EngineConfig::orphan_signals_per_workflow_max`](crate::engine::EngineConfig::orphan_signals_per_workflow_max) and
    /// [`EngineConfig::orphan_signals_max`](crate::engine::EngineConfig::orphan_signals_max) (their defaults by default). Both must be > 0.
    pub fn orphan_signal_bounds(mut self, per_workflow_max: u64, total_max: u64) -> Self {
        self.publisher.orphan_signals_per_workflow_max = per_workflow_max;
        self.publisher.orphan_signals_max = total_max;
        self
    }
    /// Check the settings and build.
    pub fn build(self) -> Result<Publisher> {
        if self.publisher.payload_bytes_max == 0 {
            return Err(Error::invalid("payload_bytes_max", "must be > 0"));
        }
        if self.publisher.orphan_signals_per_workflow_max == 0 {
            return Err(Error::invalid("orphan_signals_per_workflow_max", "must be > 0"));
        }
        if self.publisher.orphan_signals_max == 0 {
            return Err(Error::invalid("orphan_signals_max", "must be > 0"));
        }
        crate::validate::positive_ms("store_call_deadline_ms", self.store_call_deadline_ms)?;
        // Every port call runs in the engine's one envelope (K-6.8).
        let mut p = self.publisher;
        let env = Arc::new(crate::engine::PortEnvelope::new(p.clock.clone(), self.store_call_deadline_ms));
        p.store = Arc::new(crate::engine::Enveloped::wrap(p.store, env.clone()));
        p.queue = Arc::new(crate::engine::Enveloped::wrap(p.queue, env.clone()));
        p.wakeup = Arc::new(crate::engine::Enveloped::wrap(p.wakeup, env.clone()));
        p.stream = Arc::new(crate::engine::Enveloped::wrap(p.stream, env.clone()));
        p.inbox = p.inbox.map(|inbox| Arc::new(crate::engine::Enveloped::wrap(inbox, env)) as Arc<DynInbox>);
        Ok(p)
    }
}
