//! Permits from a URL.

use kernel_core::ports::{PermitDecision, PermitOwner, Permits};
use kernel_core::Error;
use permit_redis::{RedisPermits, RedisPermitsConfig};
use redis_conn::test_support::{require_redis, TestKeys};

#[tokio::test]
async fn permits_from_a_url_enforce_their_limits() {
    let Some(url) = require_redis("permits_from_a_url_enforce_their_limits") else { return };
    let keys = TestKeys::new(&url, "permits_from_url");
    let permits =
        RedisPermits::from_url(&url, RedisPermitsConfig::new(keys.prefix.clone(), crate::limits(1, 0))).await.unwrap();
    let owner = |w: &str| PermitOwner { workflow_id: w.into(), step: "s".into(), claim_token: "c".into() };
    assert!(matches!(permits.acquire("r", &owner("a")).await.unwrap(), PermitDecision::Granted { .. }));
    assert!(!matches!(permits.acquire("r", &owner("b")).await.unwrap(), PermitDecision::Granted { .. }));
    permits.release("r", &owner("a")).await.unwrap();
}

#[tokio::test]
async fn a_malformed_url_or_config_is_invalid_input() {
    let config = || RedisPermitsConfig::new("p", crate::limits(1, 0));
    let e = RedisPermits::from_url("nope", config()).await.unwrap_err();
    assert!(matches!(e, Error::InvalidInput { ref field, .. } if field == "redis url"), "{e:?}");
    // The configuration is checked before any connection is made.
    let e = RedisPermits::from_url("redis://127.0.0.1:1", config().lease_ms(0)).await.unwrap_err();
    assert!(matches!(e, Error::InvalidInput { ref field, .. } if field == "lease_ms"), "{e:?}");
}

/// Permits use the workspace's one Redis mapping: a closed port is `Unavailable` (retryable,
/// the engine fails closed) with the driver's `RedisError` as `source()`; a malformed URL
/// keeps the parser's error too.
#[tokio::test]
async fn a_redis_failure_keeps_the_drivers_error_as_its_source() {
    use std::error::Error as _;
    let config = || RedisPermitsConfig::new("p", crate::limits(1, 0));
    let e = RedisPermits::from_url("redis://127.0.0.1:1", config()).await.unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }) && e.is_retryable(), "{e:?}");
    assert!(e.source().and_then(|s| s.downcast_ref::<redis::RedisError>()).is_some(), "{e:?}");
    let e = RedisPermits::from_url("nope", config()).await.unwrap_err();
    assert!(e.source().and_then(|s| s.downcast_ref::<redis::RedisError>()).is_some(), "{e:?}");
}
