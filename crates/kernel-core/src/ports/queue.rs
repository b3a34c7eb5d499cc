use crate::error::Result;
use crate::model::{Millis, Priority};

/// Per-lane statistics (K-13).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LaneStats {
    /// Members in the lane.
    pub depth: u64,
    /// Members due now.
    pub ready: u64,
    /// Members due later.
    pub delayed: u64,
    /// `now − oldest due score`, 0 when nothing is due.
    pub oldest_wait_ms: Millis,
}

/// The ready lanes: four priority-ordered candidate sets (K-13). Only recommends; the
/// store's claim grants execution (K-1.1, K-3.3).
#[async_trait::async_trait]
pub trait ReadyQueue: Send + Sync + 'static {
    /// Add or move a candidate.
    ///
    /// # Contract
    /// Atomic and promote-only: a member present in a more urgent lane stays there (score
    /// untouched); a more urgent request removes it from the other lanes first; re-enqueue
    /// in its own lane overwrites the score. A member is never in two lanes.
    async fn enqueue(&self, workflow_id: &str, priority: Priority, claimable_at: Millis) -> Result<()>;

    /// Remove and return one due candidate (`score <= now`).
    ///
    /// # Contract
    /// Atomic. Weighted round robin in blocks P0×8 → P1×6 → P2×4 → P3×2; a lane with
    /// nothing due is skipped and forfeits the rest of its block. When a pop finds nothing
    /// due anywhere, the next ≤ 8 pops look at P0 first (burst window), ending early the
    /// first time P0 has nothing due. Rotation and burst state are shared by all callers.
    async fn pop_due(&self, now: Millis) -> Result<Option<String>>;

    /// Depth, ready, delayed and oldest wait per lane, P0 first.
    async fn stats(&self, now: Millis) -> Result<[LaneStats; 4]>;
}

/// `dyn ReadyQueue`.
pub type DynQueue = dyn ReadyQueue;

/// Receiver side of the wakeup doorbell: a message means "look at the queue now".
pub type WakeupReceiver = tokio::sync::mpsc::Receiver<()>;

/// The wakeup doorbell (K-13). Lost messages only delay (poll fallback).
#[async_trait::async_trait]
pub trait Wakeup: Send + Sync + 'static {
    /// Ring.
    ///
    /// # Contract
    /// Best effort; may be lost.
    async fn notify(&self) -> Result<()>;

    /// Listen. Bursts may be coalesced into one message.
    async fn subscribe(&self) -> Result<WakeupReceiver>;
}

/// `dyn Wakeup`.
pub type DynWakeup = dyn Wakeup;
