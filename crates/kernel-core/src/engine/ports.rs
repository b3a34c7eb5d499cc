//! The adapters an engine runs on, and the builder a deployment assembles them with.

use crate::ports::*;
use std::sync::Arc;

/// The adapters an engine runs on.
///
/// Build it with [`Ports::builder`]: a deployment names the five ports that hold or carry
/// work (store, inbox, queue, wakeup, permits) and only those side ports it changes; the
/// rest default to the wall clock, random ids and no-op observation and stream sinks.
#[derive(Clone)]
pub struct Ports {
    /// Durable instances: the only source of truth and the only grant of execution (K-1.1).
    pub store: Arc<DynStore>,
    /// Durable signal inbox: signals that arrived before, during or after their wait (K-9).
    pub inbox: Arc<DynInbox>,
    /// Ready lanes: candidates only; losing them costs latency, never correctness (K-13).
    pub queue: Arc<DynQueue>,
    /// Wakeup doorbell that makes idle workers poll now instead of at their next interval.
    pub wakeup: Arc<DynWakeup>,
    /// Traffic permits taken before each activity entry (K-14).
    pub permits: Arc<DynPermits>,
    /// The only source of time for leases, backoffs, timers and scans.
    pub clock: Arc<DynClock>,
    /// The only source of claim tokens, generated ids and retry jitter.
    pub ids: Arc<DynIds>,
    /// Ops projection; best effort, never decides a result (K-1.2).
    pub observer: Arc<DynObservationSink>,
    /// Client progress streams; best effort, never decides a result (K-1.3).
    pub stream: Arc<DynStreamSink>,
    /// Content-hash cache of read-only model calls (K-17.7); none by default.
    pub result_cache: Option<Arc<DynResultCache>>,
    /// Dead-letter records (K-17.2); needed by steps with `OnFailed::DeadLetter`.
    pub dead_letters: Option<Arc<DynDeadLetters>>,
    /// Human tasks (K-17.5): where the failure path's compensation escalates an inverse
    /// that keeps failing (K-17.6); without it such an inverse is recorded as failed.
    pub task_inbox: Option<Arc<DynTaskInbox>>,
}

impl std::fmt::Debug for Ports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ports")
    }
}

impl Ports {
    /// Start assembling ports; see [`PortsBuilder`] for the defaults.
    ///
    /// ```
    /// use kernel_core::ports::SystemClock;
    /// use kernel_core::engine::{MissingPort, Ports};
    ///
    /// // Without the ports that hold work, building names the first one missing.
    /// let err = Ports::builder().clock(std::sync::Arc::new(SystemClock)).build().unwrap_err();
    /// assert_eq!(err, MissingPort { port: "store" });
    /// ```
    pub fn builder() -> PortsBuilder {
        PortsBuilder::default()
    }
}

/// A required port was not given to [`PortsBuilder::build`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("ports: the required `{port}` port was not given")]
pub struct MissingPort {
    /// Name of the missing port, as the builder method that sets it (`store`, `inbox`,
    /// `queue`, `wakeup`, `permits`).
    pub port: &'static str,
}

/// Builder of [`Ports`].
///
/// Required: [`store`](Self::store), [`inbox`](Self::inbox), [`queue`](Self::queue),
/// [`wakeup`](Self::wakeup), [`permits`](Self::permits). Defaults: [`SystemClock`],
/// [`RandomIds`], [`NoopObservationSink`], [`NoopStreamSink`].
#[derive(Default, Clone)]
pub struct PortsBuilder {
    store: Option<Arc<DynStore>>,
    inbox: Option<Arc<DynInbox>>,
    queue: Option<Arc<DynQueue>>,
    wakeup: Option<Arc<DynWakeup>>,
    permits: Option<Arc<DynPermits>>,
    clock: Option<Arc<DynClock>>,
    ids: Option<Arc<DynIds>>,
    observer: Option<Arc<DynObservationSink>>,
    stream: Option<Arc<DynStreamSink>>,
    result_cache: Option<Arc<DynResultCache>>,
    dead_letters: Option<Arc<DynDeadLetters>>,
    task_inbox: Option<Arc<DynTaskInbox>>,
}

impl std::fmt::Debug for PortsBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortsBuilder")
            .field("store", &self.store.is_some())
            .field("inbox", &self.inbox.is_some())
            .field("queue", &self.queue.is_some())
            .field("wakeup", &self.wakeup.is_some())
            .field("permits", &self.permits.is_some())
            .finish_non_exhaustive()
    }
}

impl PortsBuilder {
    /// Set the workflow store (required).
    pub fn store(mut self, store: Arc<DynStore>) -> Self {
        self.store = Some(store);
        self
    }
    /// Set the signal inbox (required).
    pub fn inbox(mut self, inbox: Arc<DynInbox>) -> Self {
        self.inbox = Some(inbox);
        self
    }
    /// Set the ready queue (required).
    pub fn queue(mut self, queue: Arc<DynQueue>) -> Self {
        self.queue = Some(queue);
        self
    }
    /// Set the wakeup doorbell (required).
    pub fn wakeup(mut self, wakeup: Arc<DynWakeup>) -> Self {
        self.wakeup = Some(wakeup);
        self
    }
    /// Set the traffic permits (required).
    pub fn permits(mut self, permits: Arc<DynPermits>) -> Self {
        self.permits = Some(permits);
        self
    }
    /// Replace the clock (default [`SystemClock`]).
    pub fn clock(mut self, clock: Arc<DynClock>) -> Self {
        self.clock = Some(clock);
        self
    }
    /// Replace the id generator (default [`RandomIds`]).
    pub fn ids(mut self, ids: Arc<DynIds>) -> Self {
        self.ids = Some(ids);
        self
    }
    /// Replace the observation sink (default [`NoopObservationSink`]).
    pub fn observer(mut self, observer: Arc<DynObservationSink>) -> Self {
        self.observer = Some(observer);
        self
    }
    /// Replace the stream sink (default [`NoopStreamSink`]).
    pub fn stream(mut self, stream: Arc<DynStreamSink>) -> Self {
        self.stream = Some(stream);
        self
    }
    /// Serve read-only model calls from this cache (K-17.7; default none).
    pub fn result_cache(mut self, cache: Arc<DynResultCache>) -> Self {
        self.result_cache = Some(cache);
        self
    }
    /// Keep dead letters here (K-17.2; needed by steps with `OnFailed::DeadLetter`).
    pub fn dead_letters(mut self, dead_letters: Arc<DynDeadLetters>) -> Self {
        self.dead_letters = Some(dead_letters);
        self
    }

    /// Escalate inverses that keep failing to people through this inbox (K-17.6).
    pub fn task_inbox(mut self, inbox: Arc<DynTaskInbox>) -> Self {
        self.task_inbox = Some(inbox);
        self
    }

    /// The ports, or the first required port that was not given (in the order store,
    /// inbox, queue, wakeup, permits).
    pub fn build(self) -> Result<Ports, MissingPort> {
        let missing = |port| MissingPort { port };
        Ok(Ports {
            store: self.store.ok_or(missing("store"))?,
            inbox: self.inbox.ok_or(missing("inbox"))?,
            queue: self.queue.ok_or(missing("queue"))?,
            wakeup: self.wakeup.ok_or(missing("wakeup"))?,
            permits: self.permits.ok_or(missing("permits"))?,
            clock: self.clock.unwrap_or_else(|| Arc::new(SystemClock)),
            ids: self.ids.unwrap_or_else(|| Arc::new(RandomIds::default())),
            observer: self.observer.unwrap_or_else(|| Arc::new(NoopObservationSink)),
            stream: self.stream.unwrap_or_else(|| Arc::new(NoopStreamSink)),
            result_cache: self.result_cache,
            dead_letters: self.dead_letters,
            task_inbox: self.task_inbox,
        })
    }
}
