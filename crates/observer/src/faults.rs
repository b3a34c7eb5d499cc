//! A fault decorator over any repository: an outage switch, and a log of the batches it
//! saw, so tests can prove that the kept batch is written after the outage.

use crate::audit::{AuditEntry, AuditQuery};
use crate::projection::{AttemptQuery, AttemptRow, Snapshot, SnapshotQuery};
use crate::repo::{DynRepository, ObservationRepository};
use crate::{Error, Result};
use kernel_core::domain::Instant;
use kernel_core::ports::Observation;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// `(accepted by the switch, batch)` per `write_batch` call.
pub type BatchLog = Vec<(bool, Vec<Observation>)>;

/// Wraps a repository; while [`set_down(true)`](Self::set_down) every call fails with
/// [`Error::Unavailable`] without reaching it. Clones share the switch and the log.
#[derive(Clone)]
pub struct FaultyRepository {
    inner: Arc<DynRepository>,
    down: Arc<AtomicBool>,
    calls: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
    batches: Arc<Mutex<BatchLog>>,
}

impl std::fmt::Debug for FaultyRepository {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyRepository").field("down", &self.is_down()).finish_non_exhaustive()
    }
}

/// Batches kept in the log (oldest first); later ones are not recorded.
pub const LOGGED_BATCHES_MAX: usize = 10_000;

impl FaultyRepository {
    /// Decorate `inner` (up).
    pub fn new(inner: Arc<DynRepository>) -> Self {
        FaultyRepository {
            inner,
            down: Arc::new(AtomicBool::new(false)),
            calls: Arc::new(AtomicU64::new(0)),
            refused: Arc::new(AtomicU64::new(0)),
            batches: Arc::new(Mutex::new(Vec::new())),
        }
    }
    /// Start or end an outage.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }
    /// Whether it is down.
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::SeqCst)
    }
    /// Calls made (any method).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }
    /// Calls refused by the outage.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::SeqCst)
    }
    /// Every `write_batch` call: `(accepted by the switch, batch)`.
    pub fn batches(&self) -> BatchLog {
        self.batches.lock().expect("log lock").clone()
    }

    fn gate(&self) -> Result<()> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.is_down() {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Err(Error::unavailable("injected outage"));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl ObservationRepository for FaultyRepository {
    async fn write_batch(&self, batch: &[Observation]) -> Result<()> {
        let gate = self.gate();
        {
            let mut log = self.batches.lock().expect("log lock");
            if log.len() < LOGGED_BATCHES_MAX {
                log.push((gate.is_ok(), batch.to_vec()));
            }
        }
        gate?;
        self.inner.write_batch(batch).await
    }
    async fn put_snapshot(&self, snapshot: &Snapshot) -> Result<bool> {
        self.gate()?;
        self.inner.put_snapshot(snapshot).await
    }
    async fn snapshot(&self, biz_key: &str) -> Result<Option<Snapshot>> {
        self.gate()?;
        self.inner.snapshot(biz_key).await
    }
    async fn find_snapshots(&self, query: &SnapshotQuery) -> Result<Vec<Snapshot>> {
        self.gate()?;
        self.inner.find_snapshots(query).await
    }
    async fn find_attempts(&self, query: &AttemptQuery) -> Result<Vec<AttemptRow>> {
        self.gate()?;
        self.inner.find_attempts(query).await
    }
    async fn append_audit(&self, entry: &AuditEntry) -> Result<()> {
        self.gate()?;
        self.inner.append_audit(entry).await
    }
    async fn find_audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>> {
        self.gate()?;
        self.inner.find_audit(query).await
    }
    async fn purge_audit(&self, before: Instant, limit: usize) -> Result<u64> {
        self.gate()?;
        self.inner.purge_audit(before, limit).await
    }
    async fn purge_finished(&self, before: Instant, limit: usize) -> Result<u64> {
        self.gate()?;
        self.inner.purge_finished(before, limit).await
    }
}
