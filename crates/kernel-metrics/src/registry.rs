//! The metric families and their registry: one value per deployment (or per test), no
//! global recorder.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The `Content-Type` of [`Metrics::render`]'s text (OpenMetrics 1.0, which Prometheus
/// scrapes natively).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Most distinct `resource` label values; a permit resource seen after this many others is
/// counted under `other`, so a deployment with many tenant-scoped resources keeps a bounded
/// number of series.
pub const RESOURCE_LABELS_MAX: usize = 64;

/// The `resource` value of names past [`RESOURCE_LABELS_MAX`].
pub(crate) const OTHER_RESOURCE: &str = "other";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OpLabels {
    pub(crate) op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PortOpLabels {
    pub(crate) port: &'static str,
    pub(crate) op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResultLabels {
    pub(crate) result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResourceLabels {
    pub(crate) resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OutcomeLabels {
    pub(crate) outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KindLabels {
    pub(crate) kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LaneLabels {
    pub(crate) lane: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn call_buckets() -> Histogram {
    // 0.5 ms … 16 s: one store or Redis round trip.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

fn step_buckets() -> Histogram {
    // 10 ms … 5.5 min: one activity's time.
    Histogram::new(exponential_buckets(0.01, 2.0, 16))
}

fn wait_buckets() -> Histogram {
    // 10 ms … 43 min: waits for a worker or a permit.
    Histogram::new(exponential_buckets(0.01, 4.0, 10))
}

/// The kernel's metrics: the families every decorator writes and the registry
/// [`render`](Self::render) encodes. Share it as `Arc<Metrics>` between the decorators of
/// one deployment; two values never share figures, so tests and several engines in one
/// process stay apart.
pub struct Metrics {
    registry: Registry,
    pub(crate) store_call_seconds: HistogramFamily<OpLabels>,
    pub(crate) store_errors: Family<OpLabels, Counter>,
    pub(crate) claims: Family<ResultLabels, Counter>,
    pub(crate) stale_writes_refused: Counter,
    pub(crate) coord_call_seconds: HistogramFamily<PortOpLabels>,
    pub(crate) coord_errors: Family<PortOpLabels, Counter>,
    pub(crate) permit_denied: Family<ResourceLabels, Counter>,
    pub(crate) permit_in_use: Family<ResourceLabels, Gauge>,
    pub(crate) steps: Family<OutcomeLabels, Counter>,
    pub(crate) retries: Counter,
    pub(crate) step_duration_seconds: Histogram,
    pub(crate) wait_duration_seconds: HistogramFamily<KindLabels>,
    pub(crate) lane_depth: Family<LaneLabels, Gauge>,
    pub(crate) lane_oldest_due_seconds: Family<LaneLabels, Gauge<f64, AtomicU64>>,
    pub(crate) observation_queue_depth: Gauge,
    pub(crate) observation_dropped: Counter,
    observer_dropped_seen: AtomicU64,
    resources: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every family registered, all empty.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let m = Metrics {
            store_call_seconds: Family::new_with_constructor(call_buckets),
            store_errors: Family::default(),
            claims: Family::default(),
            stale_writes_refused: Counter::default(),
            coord_call_seconds: Family::new_with_constructor(call_buckets),
            coord_errors: Family::default(),
            permit_denied: Family::default(),
            permit_in_use: Family::default(),
            steps: Family::default(),
            retries: Counter::default(),
            step_duration_seconds: step_buckets(),
            wait_duration_seconds: Family::new_with_constructor(wait_buckets),
            lane_depth: Family::default(),
            lane_oldest_due_seconds: Family::default(),
            observation_queue_depth: Gauge::default(),
            observation_dropped: Counter::default(),
            observer_dropped_seen: AtomicU64::new(0),
            resources: Mutex::new(HashSet::new()),
            registry: Registry::default(),
        };
        // Counters are registered without `_total`: the encoder appends it (OpenMetrics).
        let r = &mut registry;
        r.register("wfk_store_call_seconds", "Store call latency by operation", m.store_call_seconds.clone());
        r.register("wfk_store_errors", "Store calls that returned an error, by operation", m.store_errors.clone());
        r.register("wfk_claims", "Claim attempts by result (won or missed)", m.claims.clone());
        r.register(
            "wfk_stale_writes_refused",
            "Token-guarded writes the store refused (claim lost)",
            m.stale_writes_refused.clone(),
        );
        r.register(
            "wfk_coord_call_seconds",
            "Coordination call latency by port and operation",
            m.coord_call_seconds.clone(),
        );
        r.register("wfk_coord_errors", "Coordination calls that returned an error", m.coord_errors.clone());
        r.register("wfk_permit_denied", "Permit acquires denied, by resource", m.permit_denied.clone());
        r.register("wfk_permit_in_use", "Permits held by this process, by resource", m.permit_in_use.clone());
        r.register("wfk_steps", "Step outcomes committed, by outcome", m.steps.clone());
        r.register("wfk_retries", "Retryable step failures released for a retry", m.retries.clone());
        r.register(
            "wfk_step_duration_seconds",
            "Activity time of a step when it finished",
            m.step_duration_seconds.clone(),
        );
        r.register(
            "wfk_wait_duration_seconds",
            "Time a step or workflow waited, for a worker (queue) or a permit",
            m.wait_duration_seconds.clone(),
        );
        r.register("wfk_lane_depth", "Members of a ready lane", m.lane_depth.clone());
        r.register(
            "wfk_lane_oldest_due_seconds",
            "Age of the oldest due member of a lane",
            m.lane_oldest_due_seconds.clone(),
        );
        r.register(
            "wfk_observation_queue_depth",
            "Observations waiting in the observer's queue",
            m.observation_queue_depth.clone(),
        );
        r.register(
            "wfk_observation_dropped",
            "Observations the observer dropped (queue full)",
            m.observation_dropped.clone(),
        );
        // The fixed label sets start at zero, so a rate over them exists before the first
        // event and a dashboard lists every value.
        for result in ["won", "missed"] {
            let _ = m.claims.get_or_create(&ResultLabels { result });
        }
        for outcome in crate::observe::STEP_OUTCOMES {
            let _ = m.steps.get_or_create(&OutcomeLabels { outcome });
        }
        for lane in crate::LANES {
            let _ = m.lane_depth.get_or_create(&LaneLabels { lane });
            let _ = m.lane_oldest_due_seconds.get_or_create(&LaneLabels { lane });
        }
        Metrics { registry, ..m }
    }

    /// The text a `/metrics` handler serves, with [`CONTENT_TYPE`]. Reads only; never fails.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a `String` cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Set `wfk_observation_queue_depth` and move `wfk_observation_dropped_total` from the
    /// observer's counters (`observer::Observer::stats`); call it on a timer or before each
    /// scrape. The dropped counter follows the observer's: a figure below the last one
    /// seen (a new observer) counts from zero again.
    pub fn record_observer(&self, stats: &observer::ObserverStats) {
        self.observation_queue_depth.set(i64::try_from(stats.queue_len).unwrap_or(i64::MAX));
        let last = self.observer_dropped_seen.swap(stats.dropped, Ordering::Relaxed);
        let delta = if stats.dropped >= last { stats.dropped - last } else { stats.dropped };
        if delta > 0 {
            self.observation_dropped.inc_by(delta);
        }
    }

    /// The `resource` label of `name`: the name itself while fewer than
    /// [`RESOURCE_LABELS_MAX`] names were seen (or it was seen before), else `other`.
    pub(crate) fn resource_label(&self, name: &str) -> String {
        let Ok(mut seen) = self.resources.lock() else {
            return OTHER_RESOURCE.to_string();
        };
        if seen.contains(name) {
            return name.to_string();
        }
        if seen.len() < RESOURCE_LABELS_MAX {
            seen.insert(name.to_string());
            return name.to_string();
        }
        OTHER_RESOURCE.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_labels_stop_growing_at_the_cap() {
        let m = Metrics::new();
        for i in 0..RESOURCE_LABELS_MAX {
            assert_eq!(m.resource_label(&format!("r{i}")), format!("r{i}"));
        }
        assert_eq!(m.resource_label("late"), OTHER_RESOURCE);
        assert_eq!(m.resource_label("r0"), "r0", "a name seen before keeps its label");
    }

    #[test]
    fn observer_dropped_follows_the_observer_and_restarts_with_a_new_one() {
        let m = Metrics::new();
        let stats = |dropped, queue_len| observer::ObserverStats { dropped, queue_len, ..Default::default() };
        m.record_observer(&stats(3, 7));
        m.record_observer(&stats(5, 2));
        assert_eq!(m.observation_dropped.get(), 5);
        assert_eq!(m.observation_queue_depth.get(), 2);
        m.record_observer(&stats(1, 0));
        assert_eq!(m.observation_dropped.get(), 6, "a restarted observer's drops add up");
    }
}
