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

/// A malformed URL is `InvalidInput` whose `source()` is the parser's `RedisError` (the
/// connection's own error cases are `redis-conn`'s tests).
#[tokio::test]
async fn a_malformed_url_keeps_the_parsers_error_as_its_source() {
    use std::error::Error as _;
    let e = RedisConnection::open("not a url").await.unwrap_err();
    assert!(matches!(e, Error::InvalidInput { .. }), "{e:?}");
    assert!(e.source().and_then(|s| s.downcast_ref::<redis::RedisError>()).is_some(), "{e:?}");
}
