use crate::domain::{DurationMs, Instant, Priority};
use crate::error::{Error, Result};
use crate::id::WorkflowId;

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
    pub oldest_wait_ms: DurationMs,
    /// Candidates popped from this lane since the backing store began counting (its
    /// creation, or the last flush that lost the counter): a counter the adapter keeps in
    /// the backing store and bumps inside the pop itself, so every worker on that store
    /// adds to the same count. Burst pops count for P0.
    pub pops: u64,
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
    async fn enqueue(&self, workflow_id: &WorkflowId, priority: Priority, claimable_at: Instant) -> Result<()>;

    /// Add or move several candidates in one call (a bulk start).
    ///
    /// # Contract
    /// The same as `entries.len()` calls of [`enqueue`](Self::enqueue) in order (promote-only
    /// per entry; a member named twice ends as the two single calls would leave it), applied
    /// atomically as one operation (one round trip on a remote adapter). Refused as a whole
    /// with [`Error::InvalidInput`], nothing stored, when the batch holds more than
    /// [`ENQUEUE_MANY_MAX`] entries or an entry breaks the identifier rule
    /// ([`check_enqueue_many`]). An empty batch changes nothing and needs no call.
    async fn enqueue_many(&self, entries: &[LaneEntry]) -> Result<()>;

    /// Remove and return up to `max` due candidates (`score <= now`), in pop order.
    ///
    /// # Contract
    /// Atomic: the whole batch is one operation, and concurrent callers never receive the
    /// same candidate. `max` must be in `1..=POP_DUE_MAX`, else [`Error::InvalidInput`]
    /// before any effect ([`check_pop_max`]).
    ///
    /// One pop: weighted round robin in blocks P0×8 → P1×6 → P2×4 → P3×2; a lane with
    /// nothing due is skipped and forfeits the rest of its block. When a pop finds nothing
    /// due anywhere, the next ≤ 8 pops look at P0 first (burst window), ending early the
    /// first time P0 has nothing due. Rotation and burst state are shared by all callers.
    ///
    /// A batch is exactly `max` such pops in a row, stopped by the first that finds nothing
    /// due: it returns what those pops return, in their order, and leaves the rotation and
    /// burst state as they would (an empty pop at the end arms the burst window as usual).
    /// Fewer than `max` members (an empty vector included) therefore means nothing else
    /// was due.
    async fn pop_due(&self, now: Instant, max: usize) -> Result<Vec<WorkflowId>>;

    /// Depth, ready, delayed, oldest wait and pops per lane, P0 first.
    ///
    /// # Contract
    /// Read-only (pop rotation and burst state untouched); `ready` and `delayed` split
    /// `depth` at `score ≤ now`. Each lane is read consistently, the four lanes need not be.
    /// `pops` is the lane's popped-candidate counter: every member a
    /// [`pop_due`](Self::pop_due) returns adds one to its lane's counter within the same
    /// atomic operation (no extra round trip), so the counters never miss a pop that
    /// happened nor count one that did not; they only grow, and start again at 0 when the
    /// backing store loses them (a flush).
    async fn stats(&self, now: Instant) -> Result<[LaneStats; 4]>;
}

/// `dyn ReadyQueue`.
pub type DynQueue = dyn ReadyQueue;

/// Most candidates one [`ReadyQueue::pop_due`] may return.
pub const POP_DUE_MAX: usize = 1_000;
/// Most entries one [`ReadyQueue::enqueue_many`] may take.
pub const ENQUEUE_MANY_MAX: usize = 1_000;

/// One candidate of [`ReadyQueue::enqueue_many`]: what one [`ReadyQueue::enqueue`] takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneEntry {
    /// The member.
    pub workflow_id: WorkflowId,
    /// The lane asked for (promote-only).
    pub priority: Priority,
    /// The score: when the member becomes due.
    pub claimable_at: Instant,
}

/// The check of `max` every [`ReadyQueue::pop_due`] adapter runs before anything else:
/// `1..=POP_DUE_MAX`, else [`Error::InvalidInput`] (field `max`).
pub fn check_pop_max(max: usize) -> Result<()> {
    if !(1..=POP_DUE_MAX).contains(&max) {
        return Err(Error::invalid("max", format_args!("{max} is not in 1..={POP_DUE_MAX}")));
    }
    Ok(())
}

/// The check every [`ReadyQueue::enqueue_many`] adapter runs before anything else: at most
/// [`ENQUEUE_MANY_MAX`] entries, each id under the identifier rule; else
/// [`Error::InvalidInput`] naming the entry.
pub fn check_enqueue_many(entries: &[LaneEntry]) -> Result<()> {
    if entries.len() > ENQUEUE_MANY_MAX {
        return Err(Error::invalid(
            "entries",
            format_args!("{} entries exceed the limit of {ENQUEUE_MANY_MAX}", entries.len()),
        ));
    }
    for (i, e) in entries.iter().enumerate() {
        crate::validate::identifier(&format!("entries[{i}].workflow_id"), e.workflow_id.as_str())?;
    }
    Ok(())
}

/// Receiver side of the wakeup doorbell: a message means "look at the queue now".
pub type WakeupReceiver = tokio::sync::mpsc::Receiver<()>;

/// The wakeup doorbell (K-13). Lost messages only delay (poll fallback).
///
/// # Contract
/// A hint, never a grant: a message means "look at the queue now", and a spurious one
/// costs one look. Rings made after a subscription is established reach it (best effort),
/// coalesced: however many rings, a receiver holds a bounded number of pending messages.
/// Adapter values on the same backing (workers on one Redis channel, processes on one
/// SQLite file) reach each other's subscribers. Dropping a receiver ends its subscription
/// and whatever task served it; other subscriptions are unaffected. Checked for every
/// adapter by `testkit::conformance::wakeup`.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str) -> LaneEntry {
        LaneEntry { workflow_id: id.into(), priority: Priority::P2, claimable_at: Instant::ZERO }
    }

    #[test]
    fn pop_max_is_bounded_on_both_sides() {
        for bad in [0, POP_DUE_MAX + 1, usize::MAX] {
            let e = check_pop_max(bad).expect_err("refused");
            assert!(matches!(&e, Error::InvalidInput { field, .. } if field == "max"), "{bad}: {e:?}");
        }
        for good in [1, 8, POP_DUE_MAX] {
            check_pop_max(good).expect("accepted");
        }
    }

    #[test]
    fn enqueue_batch_is_bounded_and_names_the_bad_entry() {
        check_enqueue_many(&[]).expect("an empty batch is fine");
        let full: Vec<LaneEntry> = (0..ENQUEUE_MANY_MAX).map(|i| entry(&format!("wf-{i}"))).collect();
        check_enqueue_many(&full).expect("exactly the limit");
        let over: Vec<LaneEntry> = (0..=ENQUEUE_MANY_MAX).map(|i| entry(&format!("wf-{i}"))).collect();
        let e = check_enqueue_many(&over).expect_err("over the limit");
        assert!(matches!(&e, Error::InvalidInput { field, .. } if field == "entries"), "{e:?}");
        let e = check_enqueue_many(&[entry("ok"), entry("bad\n")]).expect_err("bad id");
        assert!(matches!(&e, Error::InvalidInput { field, .. } if field == "entries[1].workflow_id"), "{e:?}");
    }
}
