//! The shared permits conformance suite on Redis, timed by Redis `TIME`.

use crate::{permits_fixture, PermitsFixture};
use kernel_core::domain::{DurationMs, Instant};
use kernel_core::ports::DynPermits;
use permit_redis::{PermitLimits as RedisLimits, RedisPermitsConfig};
use testkit::conformance::permits::{configured_defaults, PermitFixture, PermitHooks, FALLBACK_LIMITS};
use testkit::memory::PermitLimits;

/// Short enough to keep the lease cases quick, long enough that scheduling noise on a
/// busy machine rarely disturbs a case (disturbed cases are retried anyway).
const LEASE_MS: DurationMs = DurationMs::from_millis(1_000);

fn convert(l: PermitLimits) -> RedisLimits {
    RedisLimits { max_concurrency: l.max_concurrency, max_starts_per_second: l.max_starts_per_second }
}

#[async_trait::async_trait]
impl PermitHooks for PermitsFixture {
    async fn set_limits(&self, resource: &str, limits: PermitLimits) {
        self.permits.set_limits(resource, convert(limits)).await.expect("set limits");
    }
    async fn clear_limits(&self, resource: &str) {
        self.permits.clear_limits(resource).await.expect("clear limits");
    }
    async fn flush(&self) {
        // Only this test's keys: the shared server is never flushed.
        // One key per DEL: on a cluster the keys are in different slots.
        let mut conn = redis_conn::connect(&self.keys.url).await.expect("connect");
        for key in self.keys.keys() {
            redis::cmd("DEL").arg(key).query_async::<i64>(&mut conn).await.expect("DEL");
        }
    }
    fn lease_ms(&self) -> DurationMs {
        self.permits.config().lease_ms
    }
    async fn now_ms(&self) -> Instant {
        Instant::from_millis(self.permits.redis_time_us().await.expect("TIME") / 1_000)
    }
    async fn pass(&self, ms: DurationMs) {
        tokio::time::sleep(ms.to_std()).await;
    }
}

impl PermitFixture for PermitsFixture {
    fn permits(&self) -> &DynPermits {
        &self.permits
    }
    fn hooks(&self) -> &dyn PermitHooks {
        self
    }
}

async fn fixture(case: &'static str) -> Option<PermitsFixture> {
    let mut config = RedisPermitsConfig::new("unused", convert(FALLBACK_LIMITS));
    for (name, l) in configured_defaults() {
        config = config.default_limits(name, convert(l));
    }
    permits_fixture(case, LEASE_MS, config).await
}

testkit::permits_conformance!(fixture);
