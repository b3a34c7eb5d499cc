//! The adapters from a URL, several adapters on one connection, and the end of a
//! throw-away namespace.

use kernel_core::ports::{ReadyQueue, Wakeup};
use kernel_core::Instant;
use kernel_core::WorkflowId;
use kernel_core::{Error, Priority};
use queue_redis::test_support::{require_redis, TestKeys};
use queue_redis::{RedisConnection, RedisDispatchCandidates, RedisReadyQueue, RedisWakeup};

#[tokio::test]
async fn adapters_from_a_url_share_the_prefix() {
    let Some(url) = require_redis("adapters_from_a_url_share_the_prefix") else { return };
    let keys = TestKeys::new(&url, "from_url");
    let queue = RedisReadyQueue::from_url(&url, &keys.prefix).await.unwrap();
    queue.enqueue(&"wf-1".into(), Priority::P1, Instant::from_millis(10)).await.unwrap();
    // A second connection from the same URL sees the same lanes.
    let other = RedisConnection::open(&url).await.unwrap().ready_queue(&keys.prefix, queue.weights()).unwrap();
    assert_eq!(other.pop_due(Instant::from_millis(10), 1).await.unwrap(), [WorkflowId::from("wf-1")]);

    let wakeup = RedisWakeup::from_url(&url, &keys.prefix).await.unwrap();
    let mut rx = wakeup.subscribe().await.unwrap();
    wakeup.notify().await.unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv()).await.expect("rang").expect("open");

    let candidates = RedisDispatchCandidates::from_url(&url, &keys.prefix).await.unwrap();
    candidates.add(&"obj-1".into(), Instant::from_millis(5)).await.unwrap();
    assert_eq!(candidates.pop_due(Instant::from_millis(5), 10).await.unwrap(), ["obj-1"]);
}

#[tokio::test]
async fn a_malformed_url_is_invalid_input_and_a_bad_prefix_is_refused() {
    let e = RedisReadyQueue::from_url("not a url", "p").await.unwrap_err();
    assert!(matches!(e, Error::InvalidInput { ref field, .. } if field == "redis url"), "{e:?}");
    let Some(url) = require_redis("a_malformed_url_is_invalid_input_and_a_bad_prefix_is_refused") else { return };
    let e = RedisWakeup::from_url(&url, "").await.unwrap_err();
    assert!(matches!(e, Error::InvalidInput { .. }), "{e:?}");
}

#[tokio::test]
async fn purge_prefix_deletes_its_own_keys_only() {
    let Some(url) = require_redis("purge_prefix_deletes_its_own_keys_only") else { return };
    let (mine, theirs) = (TestKeys::new(&url, "purge_mine"), TestKeys::new(&url, "purge_theirs"));
    let conn = RedisConnection::open(&url).await.unwrap();
    let weights = queue_redis::LaneWeights::default();
    for (i, p) in [Priority::P0, Priority::P3].into_iter().enumerate() {
        conn.ready_queue(&mine.prefix, weights)
            .unwrap()
            .enqueue(&WorkflowId::from(format!("wf-{i}")), p, Instant::from_millis(1))
            .await
            .unwrap();
    }
    conn.ready_queue(&theirs.prefix, weights)
        .unwrap()
        .enqueue(&"wf-x".into(), Priority::P0, Instant::from_millis(1))
        .await
        .unwrap();
    assert_eq!(mine.keys().len(), 2);
    assert_eq!(conn.purge_prefix(&mine.prefix).await.unwrap(), 2);
    assert!(mine.keys().is_empty());
    assert_eq!(theirs.keys().len(), 1, "another prefix is untouched");
    assert_eq!(conn.purge_prefix(&mine.prefix).await.unwrap(), 0, "idempotent");
}

/// The one Redis mapping keeps the driver's error as the cause: a closed port is
/// `Unavailable` (still retryable) and `source()` is the `RedisError`; a malformed URL is
/// `InvalidInput` whose `source()` is the parser's `RedisError`.
#[tokio::test]
async fn a_redis_failure_keeps_the_drivers_error_as_its_source() {
    use std::error::Error as _;
    // Port 1 is never a Redis server: the connection is refused.
    let e = queue_redis::connect("redis://127.0.0.1:1").await.unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }) && e.is_retryable(), "{e:?}");
    let driver = e.source().and_then(|s| s.downcast_ref::<redis::RedisError>()).expect("the driver's error");
    assert_eq!(e.to_string(), format!("unavailable: redis: {driver}"));

    let mapped = queue_redis::map_redis_error(redis::RedisError::from((redis::ErrorKind::Io, "reset")));
    assert!(mapped.is_retryable());
    assert!(mapped.source().and_then(|s| s.downcast_ref::<redis::RedisError>()).is_some());

    let e = RedisConnection::open("not a url").await.unwrap_err();
    assert!(matches!(e, Error::InvalidInput { .. }), "{e:?}");
    assert!(e.source().and_then(|s| s.downcast_ref::<redis::RedisError>()).is_some(), "{e:?}");
}

/// The one connection helper, shared by permit-redis and sse-stream, refuses a malformed
/// URL as bad input (a typed error naming the field), not as an outage to retry.
#[tokio::test]
async fn the_shared_connect_refuses_a_malformed_url_as_invalid_input() {
    for url in ["not a url", "http://127.0.0.1:6379"] {
        let e = queue_redis::connect(url).await.unwrap_err();
        assert!(matches!(e, Error::InvalidInput { ref field, .. } if field == "redis url"), "{url}: {e:?}");
        assert!(!e.is_retryable(), "{url}");
    }
}

/// No silent passes: queue-redis decides "CI" exactly as `testkit::ci` does, so a test that
/// needs a server fails under `CI=true` and `CI=1` in every crate alike.
#[test]
fn the_ci_rule_is_the_one_of_testkit() {
    for v in [None, Some(""), Some("true"), Some("1"), Some("TRUE"), Some(" 1 "), Some("0"), Some("false"), Some("yes")]
    {
        assert_eq!(queue_redis::test_support::ci_from(v), testkit::ci::ci_from(v), "CI={v:?}");
    }
    assert!(queue_redis::test_support::ci_from(Some("1")) && testkit::ci::ci_from(Some("true")));
}
