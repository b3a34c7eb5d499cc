//! The stream sink from a URL.

use kernel_core::ports::{Clock, DynClock, Frame, StreamKey, StreamOwner, StreamSink, SystemClock};
use kernel_core::Error;
use redis_conn::test_support::{require_redis, TestKeys};
use sse_stream::{RedisStreamSink, StreamConfig, StreamSecret};
use std::sync::Arc;

#[tokio::test]
async fn a_sink_from_a_url_appends_under_its_prefix() {
    let Some(url) = require_redis("a_sink_from_a_url_appends_under_its_prefix") else { return };
    let keys = TestKeys::new(&url, "sink_from_url");
    let clock: Arc<DynClock> = Arc::new(SystemClock);
    let sink =
        RedisStreamSink::from_url(&url, clock, StreamConfig::new(&keys.prefix, StreamSecret::new([1u8; 32]).unwrap()))
            .await
            .unwrap();
    let key = StreamKey { object_id: "o".into(), workflow_id: "w".into(), fencing_token: "f".into() };
    let owner = StreamOwner { lease_until: SystemClock.now() };
    sink.reset(&key, owner).await.unwrap();
    sink.append(&key, owner, Frame::Control(serde_json::json!({ "phase": "x" }))).await.unwrap();
    sink.flush_all().await.unwrap();
    assert!(!keys.keys().is_empty(), "frames live under the URL sink's prefix");
}

#[tokio::test]
async fn a_malformed_url_is_invalid_input() {
    let clock: Arc<DynClock> = Arc::new(SystemClock);
    let e = RedisStreamSink::from_url("nope", clock, StreamConfig::new("p", StreamSecret::new([1u8; 32]).unwrap()))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidInput { ref field, .. } if field == "redis url"), "{e:?}");
}

/// The sink uses the workspace's one Redis mapping: a closed port is `Unavailable`
/// (retryable) with the driver's `RedisError` as `source()`.
#[tokio::test]
async fn a_redis_failure_keeps_the_drivers_error_as_its_source() {
    use std::error::Error as _;
    let e = sse_stream::connect("redis://127.0.0.1:1").await.unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }) && e.is_retryable(), "{e:?}");
    assert!(e.source().and_then(|s| s.downcast_ref::<redis::RedisError>()).is_some(), "{e:?}");
    let e = sse_stream::connect("nope").await.unwrap_err();
    assert!(matches!(e, Error::InvalidInput { .. }), "{e:?}");
    assert!(e.source().and_then(|s| s.downcast_ref::<redis::RedisError>()).is_some(), "{e:?}");
}
