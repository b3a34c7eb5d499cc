//! A store decorator that counts what the engine wrote and sees each terminal write: the
//! bench's oracle of completion, independent of the engine's own counters.

use kernel_core::domain::{Instant, WorkflowInstance, WorkflowStatus};
use kernel_core::ports::{
    Candidate, ClaimSpec, CreateOutcome, DueCursor, DueWait, DynStore, ScanPage, WorkflowStore, WriteOutcome,
};
use kernel_core::transition::{Guard, Transition};
use kernel_core::{Result, WorkflowId};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// The figures a [`CountingStore`] keeps. Atomics only on the hot path, so the decorator
/// costs the engine next to nothing.
#[derive(Debug)]
pub struct Tally {
    /// Applied guarded writes: won claims plus applied `apply` calls (not the create).
    pub writes: AtomicU64,
    /// Guarded writes whose guard missed (claims of stale candidates included).
    pub misses: AtomicU64,
    /// Every store call (reads, creates and writes; on store-postgres one statement each,
    /// but for a create that finds its key taken).
    pub calls: AtomicU64,
    /// Terminal writes seen, completed ones counted in `completed`.
    terminal: watch::Sender<u64>,
    /// Terminal writes that completed the workflow.
    pub completed: AtomicU64,
    /// When the last terminal write returned.
    last_terminal: Mutex<Option<std::time::Instant>>,
}

impl Tally {
    /// Nothing counted yet.
    pub fn new() -> Self {
        Tally {
            writes: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            terminal: watch::Sender::new(0),
            completed: AtomicU64::new(0),
            last_terminal: Mutex::new(None),
        }
    }

    /// Terminal writes so far.
    pub fn terminal(&self) -> u64 {
        *self.terminal.borrow()
    }

    /// When the latest terminal write returned.
    pub fn last_terminal(&self) -> Option<std::time::Instant> {
        *self.last_terminal.lock().expect("tally lock")
    }

    /// Wait until at least `n` terminal writes were seen, at most `timeout`.
    pub async fn wait_terminal(&self, n: u64, timeout: std::time::Duration) -> std::result::Result<(), String> {
        let mut rx = self.terminal.subscribe();
        let reached = matches!(tokio::time::timeout(timeout, rx.wait_for(|t| *t >= n)).await, Ok(Ok(_)));
        if reached {
            return Ok(());
        }
        Err(format!("{} of {n} workflows reached a terminal state within {timeout:?}", self.terminal()))
    }

    /// Record a terminal write that returned just now.
    pub fn saw_terminal(&self, status: WorkflowStatus) {
        let now = std::time::Instant::now();
        if status == WorkflowStatus::Completed {
            self.completed.fetch_add(1, Ordering::Relaxed);
        }
        {
            let mut last = self.last_terminal.lock().expect("tally lock");
            if last.is_none_or(|l| l < now) {
                *last = Some(now);
            }
        }
        self.terminal.send_modify(|t| *t += 1);
    }
}

impl Default for Tally {
    fn default() -> Self {
        Tally::new()
    }
}

/// Counts applied writes and signals terminal transitions; everything else passes through.
#[derive(Clone)]
pub struct CountingStore {
    inner: Arc<DynStore>,
    tally: Arc<Tally>,
}

impl CountingStore {
    /// Count the writes made through this decorator to `inner`.
    pub fn new(inner: Arc<DynStore>) -> Self {
        CountingStore { inner, tally: Arc::new(Tally::new()) }
    }

    /// The shared figures.
    pub fn tally(&self) -> Arc<Tally> {
        self.tally.clone()
    }
}

#[async_trait::async_trait]
#[warn(clippy::missing_trait_methods)]
impl WorkflowStore for CountingStore {
    async fn create(&self, instance: WorkflowInstance) -> Result<CreateOutcome> {
        self.tally.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.create(instance).await
    }

    async fn get(&self, workflow_id: &WorkflowId) -> Result<Option<WorkflowInstance>> {
        self.tally.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.get(workflow_id).await
    }

    async fn get_by_biz_key(&self, biz_key: &str) -> Result<Option<WorkflowInstance>> {
        self.tally.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.get_by_biz_key(biz_key).await
    }

    async fn claim(&self, workflow_id: &WorkflowId, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        self.tally.calls.fetch_add(1, Ordering::Relaxed);
        let out = self.inner.claim(workflow_id, spec).await?;
        let counter = if out.is_some() { &self.tally.writes } else { &self.tally.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(out)
    }

    async fn claim_any(&self, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        self.tally.calls.fetch_add(1, Ordering::Relaxed);
        let out = self.inner.claim_any(spec).await?;
        if out.is_some() {
            self.tally.writes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(out)
    }

    async fn apply(&self, workflow_id: &WorkflowId, guard: &Guard, transition: &Transition) -> Result<WriteOutcome> {
        self.tally.calls.fetch_add(1, Ordering::Relaxed);
        let out = self.inner.apply(workflow_id, guard, transition).await?;
        match out {
            WriteOutcome::Applied { .. } => {
                self.tally.writes.fetch_add(1, Ordering::Relaxed);
                if let Some(status) = transition.status.filter(|s| s.is_terminal()) {
                    self.tally.saw_terminal(status);
                }
            }
            WriteOutcome::Missed => {
                self.tally.misses.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(out)
    }

    async fn scan_due_waits(&self, now: Instant, after: Option<&DueCursor>, limit: usize) -> Result<ScanPage<DueWait>> {
        self.tally.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.scan_due_waits(now, after, limit).await
    }

    async fn scan_claimable(&self, after: Option<&WorkflowId>, limit: usize) -> Result<ScanPage<Candidate>> {
        self.tally.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.scan_claimable(after, limit).await
    }
}
