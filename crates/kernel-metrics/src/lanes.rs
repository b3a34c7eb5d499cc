//! [`poll_lanes`]: gauges of the ready lanes (K-13).

use crate::registry::{LaneLabels, Metrics};
use kernel_core::ports::{DynClock, DynQueue, LaneStats};
use kernel_core::Result;

/// The `lane` label values, P0 first (the four fixed lanes of K-13).
pub const LANES: [&str; 4] = kernel_core::Priority::LANE_NAMES;

/// Read the lanes' statistics once (`ReadyQueue::stats` at the clock's now) and set
/// `wfk_lane_depth{lane}` and `wfk_lane_oldest_due_seconds{lane}`. Call it on a timer of
/// its own (every scrape interval), never on the engine's path: it is one read of the
/// queue. An error leaves the gauges as they were and is returned for the caller to log.
pub async fn poll_lanes(metrics: &Metrics, queue: &DynQueue, clock: &DynClock) -> Result<[LaneStats; 4]> {
    let stats = queue.stats(clock.now()).await?;
    for (lane, s) in LANES.iter().zip(stats.iter()) {
        let labels = LaneLabels { lane };
        metrics.lane_depth.get_or_create(&labels).set(i64::try_from(s.depth).unwrap_or(i64::MAX));
        let oldest = s.oldest_wait_ms.as_millis().max(0) as f64 / 1000.0;
        metrics.lane_oldest_due_seconds.get_or_create(&labels).set(oldest);
    }
    Ok(stats)
}
