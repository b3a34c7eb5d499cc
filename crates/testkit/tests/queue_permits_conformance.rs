//! The queue, wakeup and permits conformance suites against the in-memory adapters (queue
//! and permits both directly and through `Arc<dyn …>`), so the suites themselves are
//! checked on every run.

use kernel_core::domain::{DurationMs, Instant};
use kernel_core::ports::{Clock, DynPermits, DynQueue};
use std::sync::Arc;
use testkit::conformance::permits::{configured_defaults, PermitFixture, PermitHooks, FALLBACK_LIMITS};
use testkit::memory::{InMemoryPermits, InMemoryQueue, ManualClock, PermitLimits};

const LEASE_MS: DurationMs = DurationMs::from_millis(30_000);

mod queue_direct {
    use super::*;
    testkit::queue_conformance!(|| async { Some(InMemoryQueue::default()) });
}

mod queue_dyn {
    use super::*;
    testkit::queue_conformance!(|| async {
        let q: Arc<DynQueue> = Arc::new(InMemoryQueue::default());
        Some(q)
    });
}

mod wakeup {
    use super::*;
    use testkit::conformance::wakeup::SharedWakeup;
    use testkit::memory::InMemoryWakeup;
    // Clones share the subscriber list: two values on one backing.
    testkit::wakeup_conformance!(|| async {
        let w = InMemoryWakeup::new();
        Some(SharedWakeup::new(Arc::new(w.clone()), Arc::new(w)).settle(std::time::Duration::from_millis(20)))
    });
}

/// In-memory permits on a manual clock.
struct MemoryPermits<P: ?Sized> {
    clock: Arc<ManualClock>,
    raw: InMemoryPermits,
    port: Arc<P>,
}

#[async_trait::async_trait]
impl<P: ?Sized + Send + Sync> PermitHooks for MemoryPermits<P> {
    async fn set_limits(&self, resource: &str, limits: PermitLimits) {
        self.raw.set_limits(resource, limits);
    }
    async fn clear_limits(&self, resource: &str) {
        self.raw.clear_limits(resource);
    }
    async fn flush(&self) {
        self.raw.flush();
    }
    fn lease_ms(&self) -> DurationMs {
        self.raw.lease_ms()
    }
    async fn now_ms(&self) -> Instant {
        self.clock.now()
    }
    async fn pass(&self, ms: DurationMs) {
        self.clock.advance(ms);
    }
}

impl PermitFixture for MemoryPermits<InMemoryPermits> {
    fn permits(&self) -> &DynPermits {
        &*self.port
    }
    fn hooks(&self) -> &dyn PermitHooks {
        self
    }
}

impl PermitFixture for MemoryPermits<DynPermits> {
    fn permits(&self) -> &DynPermits {
        &*self.port
    }
    fn hooks(&self) -> &dyn PermitHooks {
        self
    }
}

fn memory_permits() -> (Arc<ManualClock>, InMemoryPermits) {
    let clock = Arc::new(ManualClock::default());
    let raw = InMemoryPermits::new(clock.clone(), configured_defaults(), LEASE_MS).with_fallback(FALLBACK_LIMITS);
    (clock, raw)
}

mod permits_direct {
    use super::*;
    testkit::permits_conformance!(|| async {
        let (clock, raw) = memory_permits();
        Some(MemoryPermits { clock, port: Arc::new(raw.clone()), raw })
    });
}

mod permits_dyn {
    use super::*;
    testkit::permits_conformance!(|| async {
        let (clock, raw) = memory_permits();
        let port: Arc<DynPermits> = Arc::new(raw.clone());
        Some(MemoryPermits { clock, port, raw })
    });
}
