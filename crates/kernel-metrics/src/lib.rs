//! Prometheus metrics for the durable workflow kernel, as port decorators.
//!
//! Every decorator wraps one port of `kernel_core::ports`, implements **every** method of it
//! and forwards each call unchanged — same arguments, same answer, same error — measuring on
//! the way (`clippy::missing_trait_methods` holds each to that). kernel-core knows nothing
//! of this crate: a deployment wraps the ports it builds and hands the wrapped ones to the
//! engine.
//!
//! - [`MeteredStore`] over a `WorkflowStore`: call latency and errors per operation, claims
//!   won or missed, stale writes refused (a token-guarded write that missed, K-6.4).
//! - [`MeteredQueue`], [`MeteredWakeup`], [`MeteredPermits`]: call latency and errors per
//!   port and operation, permit denials and permits held by this process per resource.
//! - [`MeteredObservations`] over an `ObservationSink`: step outcomes, retries, step
//!   durations and waits, from the observations the engine emits (K-15). It never blocks
//!   and never fails.
//! - [`poll_lanes`] and [`Metrics::record_observer`]: gauges of the ready lanes (K-13) and
//!   of the observer's queue.
//!
//! Labels come from fixed sets (`op`, `port`, `lane`, `outcome`, `result`, `kind`); the
//! `resource` label is capped at [`RESOURCE_LABELS_MAX`] distinct names, later ones count
//! as `other`. No label ever carries a workflow id, a biz key or a token.
//!
//! ```
//! use std::sync::Arc;
//! use kernel_core::ports::{DynStore, DynQueue};
//! use kernel_metrics::{Metrics, MeteredStore, MeteredQueue};
//! use testkit::memory::{InMemoryQueue, InMemoryStore};
//!
//! let metrics = Arc::new(Metrics::new());
//! let store: Arc<DynStore> = Arc::new(MeteredStore::new(Arc::new(InMemoryStore::new()), metrics.clone()));
//! let queue: Arc<DynQueue> = Arc::new(MeteredQueue::new(Arc::new(InMemoryQueue::default()), metrics.clone()));
//! // ... hand `store` and `queue` to `Ports::builder()`; serve `metrics.render()` at /metrics.
//! let text = metrics.render();
//! assert!(text.contains("# TYPE wfk_claims counter"));
//! # let _ = (store, queue);
//! ```

// A decorator that left a provided method to its default body would change its meaning.
#![warn(clippy::missing_trait_methods)]

mod coord;
mod lanes;
mod observe;
mod registry;
mod store;

pub use coord::{MeteredPermits, MeteredQueue, MeteredWakeup};
pub use lanes::{poll_lanes, LANES};
pub use observe::{MeteredObservations, QUEUE_WAITS_TRACKED_MAX};
pub use registry::{Metrics, CONTENT_TYPE, RESOURCE_LABELS_MAX};
pub use store::MeteredStore;

macro_rules! opaque_debug {
    ($($t:ident),*) => {$(
        impl std::fmt::Debug for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($t)).finish_non_exhaustive()
            }
        }
    )*};
}
opaque_debug!(MeteredStore, MeteredQueue, MeteredWakeup, MeteredPermits, MeteredObservations);

/// `ports` with its store, queue, wakeup, permits and observation sink wrapped in the
/// decorators of this crate, all recording into `metrics`; every other port as it was.
///
/// ```
/// use std::sync::Arc;
/// use kernel_metrics::{metered, Metrics};
/// let metrics = Arc::new(Metrics::new());
/// let world = testkit::harness::World::new(1);
/// let ports = metered(world.ports(), &metrics);
/// # let _ = ports;
/// ```
pub fn metered(ports: kernel_core::engine::Ports, metrics: &std::sync::Arc<Metrics>) -> kernel_core::engine::Ports {
    use std::sync::Arc;
    kernel_core::engine::Ports {
        store: Arc::new(MeteredStore::new(ports.store, metrics.clone())),
        queue: Arc::new(MeteredQueue::new(ports.queue, metrics.clone())),
        wakeup: Arc::new(MeteredWakeup::new(ports.wakeup, metrics.clone())),
        permits: Arc::new(MeteredPermits::new(ports.permits, metrics.clone())),
        observer: Arc::new(MeteredObservations::new(ports.observer, metrics.clone())),
        ..ports
    }
}
