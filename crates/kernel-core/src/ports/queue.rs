use crate::error::{Error, Result};
use crate::id::WorkflowId;
use crate::model::{Millis, Priority};

/// Per-lane statistics (K-13).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LaneStats {
    /// Members in the lane, due or not.
    pub depth: u64,
    /// Members whose score is `≤ now`: a pop may return them.
    pub ready: u64,
    /// Members whose score is `> now` (retry delays, leases, permit deferrals).
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
    async fn enqueue(&self, workflow_id: &WorkflowId, priority: Priority, claimable_at: Millis) -> Result<()>;

    /// Remove and return one due candidate (`score <= now`).
    ///
    /// # Contract
    /// Atomic. Weighted round robin in blocks P0×8 → P1×6 → P2×4 → P3×2; a lane with
    /// nothing due is skipped and forfeits the rest of its block. When a pop finds nothing
    /// due anywhere, the next ≤ 8 pops look at P0 first (burst window), ending early the
    /// first time P0 has nothing due. Rotation and burst state are shared by all callers.
    async fn pop_due(&self, now: Millis) -> Result<Option<WorkflowId>>;

    /// Depth, ready, delayed and oldest wait per lane, P0 first.
    ///
    /// # Contract
    /// Read-only (pop rotation and burst state untouched); `ready` and `delayed` split
    /// `depth` at `score ≤ now`. Each lane is read consistently, the four lanes need not be.
    async fn stats(&self, now: Millis) -> Result<[LaneStats; 4]>;
}

/// `dyn ReadyQueue`.
pub type DynQueue = dyn ReadyQueue;

/// Receiver side of the wakeup doorbell: a message means "look at the queue now".
pub type WakeupReceiver = tokio::sync::mpsc::Receiver<()>;

/// The wakeup doorbell (K-13). Lost messages only delay (poll fallback).
#[async_trait::async_trait]
pub trait Wakeup: Send + Sync + 'static {
    /// Ring: every subscriber should look at the queue now.
    ///
    /// # Contract
    /// Best effort; may be lost.
    async fn notify(&self) -> Result<()>;

    /// Listen. Bursts may be coalesced into one message.
    ///
    /// # Contract
    /// Every ring after the subscription is established is delivered at least as one
    /// message unless lost in transit (best effort); an error means no subscription, and
    /// the caller falls back to polling the queue.
    async fn subscribe(&self) -> Result<WakeupReceiver>;
}

/// `dyn Wakeup`.
pub type DynWakeup = dyn Wakeup;

/// Largest block weight of one lane.
pub const LANE_WEIGHT_MAX: u32 = 1_000;
/// Longest burst window.
pub const BURST_MAX: u32 = 1_000;

/// Weighted round-robin settings of the lanes (K-13), shared by every queue adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneWeights {
    /// Pops per block, P0 first (default 8, 6, 4, 2). Each in `1..=LANE_WEIGHT_MAX`: a
    /// weight of 0 would starve its lane.
    pub weights: [u32; 4],
    /// Length of the burst window (default 8), at most [`BURST_MAX`]; 0 disables it.
    pub burst: u32,
}

impl Default for LaneWeights {
    fn default() -> Self {
        LaneWeights { weights: [8, 6, 4, 2], burst: 8 }
    }
}

impl LaneWeights {
    /// Check the limits.
    pub fn validate(&self) -> Result<()> {
        for (i, w) in self.weights.iter().enumerate() {
            if !(1..=LANE_WEIGHT_MAX).contains(w) {
                return Err(Error::invalid(
                    format!("weights[{i}]"),
                    format_args!("{w} is not in 1..={LANE_WEIGHT_MAX}"),
                ));
            }
        }
        if self.burst > BURST_MAX {
            return Err(Error::invalid("burst", format_args!("{} exceeds {BURST_MAX}", self.burst)));
        }
        Ok(())
    }
}
