//! The engine-facing sink (a bounded queue whose `emit` never waits) and the batch writer.

use crate::audit::AUDIT_PURGE_MAX;
use crate::repo::{DynRepository, FINISHED_PURGE_MAX};
use crate::{Error, Result};
use kernel_core::domain::{DurationMs, Instant};
use kernel_core::ports::{DynClock, Observation, ObservationSink};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Observer limits. Times in ms on the [`Clock`](kernel_core::ports::Clock) port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObserverConfig {
    /// Events the in-process queue holds; a full queue rejects the newest event.
    pub queue_capacity: usize,
    /// Most observations per repository write.
    pub batch_size_max: usize,
    /// A non-empty batch is written at most this long after its first event.
    pub flush_interval_ms: DurationMs,
    /// First pause after a failed write (doubles up to `retry_backoff_max_ms`).
    pub retry_backoff_ms: DurationMs,
    /// Longest pause.
    pub retry_backoff_max_ms: DurationMs,
    /// How long [`ObserverWriter::close`] keeps trying while the repository is down.
    pub drain_timeout_ms: DurationMs,
    /// What the writer purges, and how often, so that the projection does not grow without
    /// bound; `None`: nothing (another process or an operator purges).
    pub retention: Option<Retention>,
}

/// The writer's retention passes: between batches, once at start and then every `interval_ms`, it
/// deletes one page of snapshots (with their attempt rows) of workflows finished longer than
/// `finished_ms` ago ([`purge_finished`](crate::ObservationRepository::purge_finished)) and
/// one page of audit entries older than `audit_ms`
/// ([`purge_audit`](crate::ObservationRepository::purge_audit)). A full page brings the next
/// pass forward to `flush_interval_ms`, so a backlog drains page by page between batches. A
/// failed pass is counted (`retention_failures`) and tried again at the next interval; it
/// never delays the batches. Several writers on one repository purge the same rows
/// harmlessly.
///
/// ```
/// use kernel_core::domain::DurationMs;
/// use observer::{ObserverConfig, Retention};
///
/// let config = ObserverConfig {
///     retention: Some(Retention { finished_ms: DurationMs::from_millis(7 * 24 * 3_600_000), ..Retention::default() }),
///     ..ObserverConfig::default()
/// };
/// assert!(config.validate().is_ok());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Snapshots of workflows finished (completed, failed, canceled) and not updated for this
    /// long go, with their attempt rows. Default: 30 days.
    pub finished_ms: DurationMs,
    /// Audit entries older than this go. Default: 365 days.
    pub audit_ms: DurationMs,
    /// Time between passes. Default: one hour.
    pub interval_ms: DurationMs,
    /// Most rows of each kind one pass deletes, `1..=`[`FINISHED_PURGE_MAX`] (and
    /// [`AUDIT_PURGE_MAX`]). Default: 500.
    pub page: usize,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            finished_ms: DurationMs::from_millis(30 * 24 * 3_600_000),
            audit_ms: DurationMs::from_millis(365 * 24 * 3_600_000),
            interval_ms: DurationMs::from_millis(3_600_000),
            page: 500,
        }
    }
}

impl Default for ObserverConfig {
    fn default() -> Self {
        ObserverConfig {
            queue_capacity: 10_000,
            batch_size_max: 500,
            flush_interval_ms: DurationMs::from_millis(1_000),
            retry_backoff_ms: DurationMs::from_millis(500),
            retry_backoff_max_ms: DurationMs::from_millis(30_000),
            drain_timeout_ms: DurationMs::from_millis(10_000),
            retention: Some(Retention::default()),
        }
    }
}

impl ObserverConfig {
    /// Check the limits.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, reason: &str| Err(Error::InvalidInput { field: field.into(), reason: reason.into() });
        if self.queue_capacity == 0 || self.queue_capacity > 10_000_000 {
            return bad("queue_capacity", "must be in 1..=10000000");
        }
        if self.batch_size_max == 0 || self.batch_size_max > 10_000 {
            return bad("batch_size_max", "must be in 1..=10000");
        }
        if self.flush_interval_ms <= 0 || self.retry_backoff_ms <= 0 || self.drain_timeout_ms < 0 {
            return bad("flush_interval_ms", "times must be positive");
        }
        if self.retry_backoff_max_ms < self.retry_backoff_ms {
            return bad("retry_backoff_max_ms", "must be >= retry_backoff_ms");
        }
        if let Some(r) = &self.retention {
            if r.finished_ms <= 0 || r.audit_ms <= 0 || r.interval_ms <= 0 {
                return bad("retention", "times must be positive");
            }
            if r.page == 0 || r.page > FINISHED_PURGE_MAX.min(AUDIT_PURGE_MAX) {
                return bad("retention.page", "must be in 1..=1000");
            }
        }
        Ok(())
    }
}

/// Counters of an observer. `accepted + dropped` = events emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ObserverStats {
    /// Events taken into the queue.
    pub accepted: u64,
    /// Events rejected because the queue was full (or the writer closed).
    pub dropped: u64,
    /// Events written to the repository.
    pub written: u64,
    /// Events isolated as permanently invalid and discarded.
    pub poison: u64,
    /// Repository writes that failed as unavailable (each followed by a pause).
    pub write_failures: u64,
    /// Events abandoned by a close whose drain timed out.
    pub abandoned: u64,
    /// Events in the queue now.
    pub queue_len: u64,
    /// Snapshots of finished workflows deleted by retention passes ([`Retention`]).
    pub purged_finished: u64,
    /// Audit entries deleted by retention passes.
    pub purged_audit: u64,
    /// Retention purges that failed (each tried again at the next pass).
    pub retention_failures: u64,
}

#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    dropped: AtomicU64,
    written: AtomicU64,
    poison: AtomicU64,
    write_failures: AtomicU64,
    abandoned: AtomicU64,
    purged_finished: AtomicU64,
    purged_audit: AtomicU64,
    retention_failures: AtomicU64,
}

struct Shared {
    tx: mpsc::Sender<Observation>,
    counters: Counters,
}

/// The [`ObservationSink`] the engine emits into (K-15).
///
/// `emit` is a `try_send` on a bounded queue: it never awaits and never blocks; when the
/// queue is full the **newest** event (the one being emitted) is rejected and counted in
/// `dropped`; accepted events are never evicted. Cheap to clone.
#[derive(Clone)]
pub struct Observer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer").field("stats", &self.stats()).finish()
    }
}

impl Observer {
    /// Start an observer writing to `repo`, timed by `clock`: the sink, and the handle of
    /// its writer task (flush, close). Needs a tokio runtime.
    pub fn start(
        repo: Arc<DynRepository>,
        clock: Arc<DynClock>,
        config: ObserverConfig,
    ) -> Result<(Observer, ObserverWriter)> {
        config.validate()?;
        let (tx, rx) = mpsc::channel(config.queue_capacity);
        let (ctl_tx, ctl_rx) = mpsc::channel(16);
        let shared = Arc::new(Shared { tx, counters: Counters::default() });
        let writer = Writer { repo, clock, config, rx, ctl: ctl_rx, shared: shared.clone(), batch: Vec::new() };
        let task = tokio::spawn(writer.run());
        Ok((Observer { shared: shared.clone() }, ObserverWriter { ctl: ctl_tx, task, observer: Observer { shared } }))
    }

    /// Counters now.
    pub fn stats(&self) -> ObserverStats {
        let c = &self.shared.counters;
        ObserverStats {
            accepted: c.accepted.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            written: c.written.load(Ordering::Relaxed),
            poison: c.poison.load(Ordering::Relaxed),
            write_failures: c.write_failures.load(Ordering::Relaxed),
            abandoned: c.abandoned.load(Ordering::Relaxed),
            queue_len: self.queue_len() as u64,
            purged_finished: c.purged_finished.load(Ordering::Relaxed),
            purged_audit: c.purged_audit.load(Ordering::Relaxed),
            retention_failures: c.retention_failures.load(Ordering::Relaxed),
        }
    }

    /// Events waiting in the queue (never more than its capacity).
    pub fn queue_len(&self) -> usize {
        self.shared.tx.max_capacity() - self.shared.tx.capacity()
    }

    /// The queue's capacity.
    pub fn capacity(&self) -> usize {
        self.shared.tx.max_capacity()
    }
}

impl ObservationSink for Observer {
    /// Always: the observer forwards every observation to its writer (after a close, each
    /// is counted as dropped).
    fn enabled(&self) -> bool {
        true
    }
    fn emit(&self, obs: Observation) {
        match self.shared.tx.try_send(obs) {
            Ok(()) => self.shared.counters.accepted.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.shared.counters.dropped.fetch_add(1, Ordering::Relaxed),
        };
    }
}

enum Control {
    Flush(oneshot::Sender<()>),
    Close(oneshot::Sender<()>),
}

/// Handle of the writer task. Call [`close`](Self::close) after
/// `RunningEngine::shutdown` so that accepted observations are written (K-6.6).
#[derive(Debug)]
pub struct ObserverWriter {
    ctl: mpsc::Sender<Control>,
    task: tokio::task::JoinHandle<()>,
    observer: Observer,
}

impl ObserverWriter {
    /// Write everything accepted before this call; returns once it is written (or
    /// isolated as poison). While the repository is down this waits for it to return.
    pub async fn flush(&self) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        self.ctl.send(Control::Flush(tx)).await.map_err(|_| Error::Closed)?;
        rx.await.map_err(|_| Error::Closed)
    }

    /// Drain the queue and stop the writer. While the repository is down it keeps trying
    /// for `drain_timeout_ms` (clock port), then abandons what is left (`abandoned`).
    pub async fn close(self) -> ObserverStats {
        let (tx, rx) = oneshot::channel();
        if self.ctl.send(Control::Close(tx)).await.is_ok() {
            let _ = rx.await;
        }
        let _ = self.task.await;
        self.observer.stats()
    }

    /// The sink this writer drains.
    pub fn observer(&self) -> &Observer {
        &self.observer
    }
}

struct Writer {
    repo: Arc<DynRepository>,
    clock: Arc<DynClock>,
    config: ObserverConfig,
    rx: mpsc::Receiver<Observation>,
    ctl: mpsc::Receiver<Control>,
    shared: Arc<Shared>,
    /// The batch being written; kept across an outage.
    batch: Vec<Observation>,
}

impl Writer {
    fn top_up(&mut self) {
        while self.batch.len() < self.config.batch_size_max {
            match self.rx.try_recv() {
                Ok(o) => self.batch.push(o),
                Err(_) => break,
            }
        }
    }

    async fn run(mut self) {
        let mut batch_since: Option<Instant> = None;
        let mut waiters: Vec<oneshot::Sender<()>> = Vec::new();
        let mut closing: Option<(oneshot::Sender<()>, Instant)> = None;
        let mut backoff = self.config.retry_backoff_ms;
        // The first retention pass runs at start, between batches like every other.
        let mut next_retention = self.config.retention.map(|_| self.clock.now());
        loop {
            self.top_up();
            let now = self.clock.now();
            if self.batch.is_empty() {
                batch_since = None;
            } else if batch_since.is_none() {
                batch_since = Some(now);
            }
            let draining = !waiters.is_empty() || closing.is_some();
            let due = self.batch.len() >= self.config.batch_size_max
                || batch_since.is_some_and(|t| now >= t.saturating_add(self.config.flush_interval_ms))
                || (draining && !self.batch.is_empty());
            if due {
                match self.write_batch().await {
                    Ok(()) => {
                        backoff = self.config.retry_backoff_ms;
                        batch_since = None;
                        continue;
                    }
                    Err(e) => {
                        self.shared.counters.write_failures.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(error = %e, kept = self.batch.len(), "observation write failed; pausing");
                        if let Some((_, deadline)) = &closing {
                            if self.clock.now() >= *deadline {
                                self.abandon();
                                break;
                            }
                        }
                        // Keep the batch and pause; the queue absorbs (and drops) meanwhile.
                        let until = self.clock.now().saturating_add(backoff);
                        backoff = (backoff * 2).min(self.config.retry_backoff_max_ms);
                        tokio::select! {
                            _ = self.clock.sleep_until(until) => {}
                            Some(c) = self.ctl.recv() => match c {
                                Control::Flush(tx) => waiters.push(tx),
                                Control::Close(tx) => {
                                    closing = Some((tx, self.clock.now().saturating_add(self.config.drain_timeout_ms)));
                                }
                            },
                        }
                        continue;
                    }
                }
            }
            if draining && self.batch.is_empty() && self.rx.is_empty() {
                for w in waiters.drain(..) {
                    let _ = w.send(());
                }
                if closing.is_some() {
                    break;
                }
            }
            if let (Some(r), Some(at)) = (self.config.retention, next_retention) {
                if !draining && now >= at {
                    let full = self.retain(&r, now).await;
                    let wait = if full { self.config.flush_interval_ms } else { r.interval_ms };
                    next_retention = Some(self.clock.now().saturating_add(wait));
                    continue;
                }
            }
            let deadline = match (batch_since.map(|t| t.saturating_add(self.config.flush_interval_ms)), next_retention)
            {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let room = self.batch.len() < self.config.batch_size_max;
            tokio::select! {
                o = self.rx.recv(), if room => match o {
                    Some(o) => self.batch.push(o),
                    // Every sink is gone: drain what is left and stop.
                    None if closing.is_none() => {
                        let (tx, _rx) = oneshot::channel();
                        closing = Some((tx, self.clock.now().saturating_add(self.config.drain_timeout_ms)));
                    }
                    None => {}
                },
                Some(c) = self.ctl.recv() => match c {
                    Control::Flush(tx) => waiters.push(tx),
                    Control::Close(tx) => closing = Some((tx, self.clock.now().saturating_add(self.config.drain_timeout_ms))),
                },
                _ = async {
                    match deadline {
                        Some(t) => self.clock.sleep_until(t).await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
        }
        self.rx.close();
        if let Some((tx, _)) = closing {
            let _ = tx.send(());
        }
        for w in waiters {
            let _ = w.send(());
        }
    }

    /// One retention pass: a page of finished snapshots and a page of audit entries.
    /// Returns whether a page came back full (more to purge).
    async fn retain(&self, r: &Retention, now: Instant) -> bool {
        let c = &self.shared.counters;
        let mut full = false;
        let finished = self.repo.purge_finished(now.saturating_sub(r.finished_ms), r.page).await;
        let audit = self.repo.purge_audit(now.saturating_sub(r.audit_ms), r.page).await;
        for (what, result, counter) in [("finished", finished, &c.purged_finished), ("audit", audit, &c.purged_audit)] {
            match result {
                Ok(n) => {
                    counter.fetch_add(n, Ordering::Relaxed);
                    full |= n as usize >= r.page;
                }
                Err(e) => {
                    c.retention_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(error = %e, what, "observation retention purge failed; next pass retries");
                }
            }
        }
        full
    }

    fn abandon(&mut self) {
        let mut n = self.batch.len() as u64;
        self.batch.clear();
        while self.rx.try_recv().is_ok() {
            n += 1;
        }
        self.shared.counters.abandoned.fetch_add(n, Ordering::Relaxed);
    }

    /// Write the batch; an invalid record is isolated by bisection and dropped (`poison`).
    /// On an outage the unwritten part stays in `self.batch` and the error is returned.
    async fn write_batch(&mut self) -> Result<()> {
        let mut pending: VecDeque<Vec<Observation>> = VecDeque::from([std::mem::take(&mut self.batch)]);
        while let Some(chunk) = pending.pop_front() {
            if chunk.is_empty() {
                continue;
            }
            match self.repo.write_batch(&chunk).await {
                Ok(()) => {
                    self.shared.counters.written.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                }
                Err(Error::InvalidRecord(reason)) if chunk.len() == 1 => {
                    self.shared.counters.poison.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        biz_key = %chunk[0].biz_key,
                        revision = chunk[0].revision,
                        %reason,
                        "poison observation isolated and dropped"
                    );
                }
                Err(Error::InvalidRecord(_)) => {
                    // Writes are idempotent, so re-writing the valid half is harmless.
                    let mut left = chunk;
                    let right = left.split_off(left.len() / 2);
                    pending.push_front(right);
                    pending.push_front(left);
                }
                Err(e) => {
                    pending.push_front(chunk);
                    self.batch = pending.into_iter().flatten().collect();
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}
