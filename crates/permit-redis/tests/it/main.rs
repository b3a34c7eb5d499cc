//! Integration tests of the Redis permits against a real Redis (`REDIS_URL`, default
//! `redis://127.0.0.1:6379`; see `redis_conn::test_support`), and the Redis-loss test of
//! the engine on both Redis adapters.

mod bench_smoke;
mod conformance;
mod limits;
mod loss;
mod tenants;
mod url;

use kernel_core::domain::DurationMs;
use permit_redis::{PermitLimits, RedisPermits, RedisPermitsConfig};
use redis_conn::connect;
use redis_conn::test_support::{require_redis, TestKeys};

/// Permits under a fresh prefix whose keys are deleted on drop.
pub struct PermitsFixture {
    /// The adapter under test.
    pub permits: RedisPermits,
    /// Its namespace.
    pub keys: TestKeys,
}

impl PermitsFixture {
    /// Another worker: permits on their own connection sharing this fixture's prefix and
    /// configuration.
    pub async fn worker(&self) -> RedisPermits {
        RedisPermits::new(connect(&self.keys.url).await.expect("connect"), self.permits.config().clone())
            .expect("permits")
    }
}

/// Fresh permits with `lease_ms` and the given configuration (prefix replaced), or `None`
/// when Redis is unavailable outside CI.
pub async fn permits_fixture(
    test: &str,
    lease_ms: impl Into<DurationMs>,
    config: RedisPermitsConfig,
) -> Option<PermitsFixture> {
    let lease_ms = lease_ms.into();
    let url = require_redis(test)?;
    let keys = TestKeys::new(&url, test);
    let config = RedisPermitsConfig { prefix: keys.prefix.clone(), lease_ms, ..config };
    let permits = RedisPermits::new(connect(&url).await.expect("connect"), config).expect("permits");
    Some(PermitsFixture { permits, keys })
}

/// Limits shorthand.
pub fn limits(max_concurrency: u32, max_starts_per_second: u32) -> PermitLimits {
    PermitLimits { max_concurrency, max_starts_per_second }
}
