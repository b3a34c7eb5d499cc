//! The shared conformance suites on the SQLite coordination: every case on a fresh file,
//! and on an in-memory database.

use crate::{fresh, Fx};
use coord_local::{LocalConfig, LocalCoord, LocalPermits, LocalPermitsConfig, LocalQueue};
use kernel_core::domain::{DurationMs, Instant};
use kernel_core::ports::{Clock, DynCandidates, DynPermits, DynQueue, DynWakeup, SystemClock};
use std::sync::Arc;
use std::time::Duration;
use testkit::conformance::outbox::CandidatesFixture;
use testkit::conformance::permits::{configured_defaults, PermitFixture, PermitHooks, FALLBACK_LIMITS};
use testkit::conformance::queue::QueueFixture;
use testkit::conformance::wakeup::{SharedWakeup, WakeupFixture};
use testkit::memory::{ManualClock, PermitLimits};

async fn file_queue(_case: &'static str) -> Option<Fx<LocalQueue>> {
    let (coord, dir) = fresh(LocalConfig::default()).await;
    Some(Fx { port: coord.queue(), coord, dir })
}

async fn memory_queue(_case: &'static str) -> Option<Box<LocalQueue>> {
    Some(Box::new(LocalCoord::in_memory(LocalConfig::default()).await.expect("in memory").queue()))
}

impl QueueFixture for Fx<LocalQueue> {
    fn queue(&self) -> &DynQueue {
        &self.port
    }
}

mod queue_file {
    testkit::queue_conformance!(super::file_queue);
}

mod queue_in_memory {
    testkit::queue_conformance!(super::memory_queue);
}

/// Two openings of one file: what two worker processes hold.
pub struct FileWakeups {
    a: LocalCoord,
    b: LocalCoord,
    a_wakeup: coord_local::LocalWakeup,
    b_wakeup: coord_local::LocalWakeup,
    _dir: tempfile::TempDir,
}

impl WakeupFixture for FileWakeups {
    fn wakeup(&self) -> &DynWakeup {
        &self.a_wakeup
    }
    fn peer(&self) -> &DynWakeup {
        &self.b_wakeup
    }
    fn settle(&self) -> Duration {
        // Eight poll intervals of the two openings.
        let poll = self.a.config().wakeup_poll_ms.max(self.b.config().wakeup_poll_ms);
        poll.to_std() * 8
    }
}

async fn file_wakeups(_case: &'static str) -> Option<FileWakeups> {
    let (a, dir) = fresh(LocalConfig::default()).await;
    let b = LocalCoord::open(a.path().expect("a file"), LocalConfig::default()).await.expect("second opening");
    Some(FileWakeups { a_wakeup: a.wakeup(), b_wakeup: b.wakeup(), a, b, _dir: dir })
}

async fn memory_wakeups(_case: &'static str) -> Option<SharedWakeup> {
    let coord = LocalCoord::in_memory(LocalConfig::default()).await.expect("in memory");
    Some(SharedWakeup::new(Arc::new(coord.wakeup()), Arc::new(coord.wakeup())).settle(Duration::from_millis(20)))
}

mod wakeup_file {
    testkit::wakeup_conformance!(super::file_wakeups);
}

mod wakeup_in_memory {
    testkit::wakeup_conformance!(super::memory_wakeups);
}

/// Permits on a fresh file and their hooks; time from a manual clock or the system clock.
pub struct PermitsFx {
    permits: LocalPermits,
    manual: Option<Arc<ManualClock>>,
    _coord: LocalCoord,
    _dir: Option<tempfile::TempDir>,
}

#[async_trait::async_trait]
impl PermitHooks for PermitsFx {
    async fn set_limits(&self, resource: &str, limits: PermitLimits) {
        self.permits.set_limits(resource, limits).await.expect("set limits");
    }
    async fn clear_limits(&self, resource: &str) {
        self.permits.clear_limits(resource).await.expect("clear limits");
    }
    async fn flush(&self) {
        self.permits.clear().await.expect("clear");
    }
    fn lease_ms(&self) -> DurationMs {
        self.permits.config().lease_ms
    }
    async fn now_ms(&self) -> Instant {
        match &self.manual {
            Some(c) => c.now(),
            None => SystemClock.now(),
        }
    }
    async fn pass(&self, ms: DurationMs) {
        match &self.manual {
            Some(c) => c.advance(ms),
            None => tokio::time::sleep(ms.to_std()).await,
        }
    }
}

impl PermitFixture for PermitsFx {
    fn permits(&self) -> &DynPermits {
        &self.permits
    }
    fn hooks(&self) -> &dyn PermitHooks {
        self
    }
}

fn permits_config(lease_ms: i64) -> LocalPermitsConfig {
    let mut config = LocalPermitsConfig::new(FALLBACK_LIMITS).lease_ms(DurationMs::from_millis(lease_ms));
    for (name, l) in configured_defaults() {
        config = config.default_limits(name, l);
    }
    config
}

async fn manual_permits(_case: &'static str) -> Option<PermitsFx> {
    let (coord, dir) = fresh(LocalConfig::default()).await;
    let clock = Arc::new(ManualClock::new(Instant::from_millis(1_700_000_000_000)));
    let permits = coord.permits(clock.clone(), permits_config(30_000)).expect("permits");
    Some(PermitsFx { permits, manual: Some(clock), _coord: coord, _dir: Some(dir) })
}

async fn wall_clock_permits(_case: &'static str) -> Option<PermitsFx> {
    let (coord, dir) = fresh(LocalConfig::default()).await;
    // As on Redis: short enough to keep the lease cases quick, long enough that scheduling
    // noise rarely disturbs a case (disturbed cases are retried anyway).
    let permits = coord.permits(Arc::new(SystemClock), permits_config(1_000)).expect("permits");
    Some(PermitsFx { permits, manual: None, _coord: coord, _dir: Some(dir) })
}

async fn memory_permits(_case: &'static str) -> Option<PermitsFx> {
    let coord = LocalCoord::in_memory(LocalConfig::default()).await.expect("in memory");
    let clock = Arc::new(ManualClock::new(Instant::from_millis(1_700_000_000_000)));
    let permits = coord.permits(clock.clone(), permits_config(30_000)).expect("permits");
    Some(PermitsFx { permits, manual: Some(clock), _coord: coord, _dir: None })
}

mod permits_file_manual_clock {
    testkit::permits_conformance!(super::manual_permits);
}

mod permits_file_wall_clock {
    testkit::permits_conformance!(super::wall_clock_permits);
}

mod permits_in_memory {
    testkit::permits_conformance!(super::memory_permits);
}

/// Candidates on a fresh file.
pub struct CandidatesFx(Fx<coord_local::LocalCandidates>);

impl CandidatesFixture for CandidatesFx {
    fn candidates(&self) -> &DynCandidates {
        &self.0.port
    }
}

pub async fn file_candidates() -> Option<CandidatesFx> {
    let (coord, dir) = fresh(LocalConfig::default()).await;
    Some(CandidatesFx(Fx { port: coord.dispatch_candidates(), coord, dir }))
}

mod candidates_file {
    testkit::candidates_conformance!(super::file_candidates);
}
