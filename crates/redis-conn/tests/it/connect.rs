//! Connecting from a URL, the one error mapping, per-node commands, and the CI rule of the
//! test support.

use kernel_core::Error;
use redis_conn::test_support::require_redis;
use redis_conn::{connect, map_redis_error};

/// The one Redis mapping keeps the driver's error as the cause: a closed port is
/// `Unavailable` (still retryable) and `source()` is the `RedisError`.
#[tokio::test]
async fn a_redis_failure_keeps_the_drivers_error_as_its_source() {
    use std::error::Error as _;
    // Port 1 is never a Redis server: the connection is refused.
    let e = connect("redis://127.0.0.1:1").await.unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }) && e.is_retryable(), "{e:?}");
    let driver = e.source().and_then(|s| s.downcast_ref::<redis::RedisError>()).expect("the driver's error");
    assert_eq!(e.to_string(), format!("unavailable: redis: {driver}"));

    let mapped = map_redis_error(redis::RedisError::from((redis::ErrorKind::Io, "reset")));
    assert!(mapped.is_retryable());
    assert!(mapped.source().and_then(|s| s.downcast_ref::<redis::RedisError>()).is_some());
}

/// The one connection helper, shared by queue-redis, permit-redis and sse-stream, refuses a
/// malformed URL as bad input (a typed error naming the field), not as an outage to retry.
#[tokio::test]
async fn the_shared_connect_refuses_a_malformed_url_as_invalid_input() {
    for url in ["not a url", "http://127.0.0.1:6379"] {
        let e = connect(url).await.unwrap_err();
        assert!(matches!(e, Error::InvalidInput { ref field, .. } if field == "redis url"), "{url}: {e:?}");
        assert!(!e.is_retryable(), "{url}");
    }
}

/// A connection to `REDIS_URL` answers, and reaches every master of a cluster by address
/// (a server has none to list; `on_node` then runs on it).
#[tokio::test]
async fn a_connection_answers_on_every_node() {
    let Some(url) = require_redis("a_connection_answers_on_every_node") else { return };
    let conn = connect(&url).await.expect("connect");
    let pong: String = redis::cmd("PING").query_async(&mut conn.clone()).await.expect("PING");
    assert_eq!(pong, "PONG");
    let masters = conn.masters().await.expect("masters");
    assert_eq!(conn.is_cluster(), !masters.is_empty(), "{conn:?}: {masters:?}");
    let nodes = if masters.is_empty() { vec![(String::new(), 0)] } else { masters };
    for (host, port) in nodes {
        let pong: String = conn.on_node(&host, port, &redis::cmd("PING")).await.expect("PING on a node");
        assert_eq!(pong, "PONG", "{host}:{port}");
    }
}

/// No silent passes: the test support decides "CI" exactly as `testkit::ci` does, so a test
/// that needs a server fails under `CI=true` and `CI=1` in every crate alike.
#[test]
fn the_ci_rule_is_the_one_of_testkit() {
    for v in [None, Some(""), Some("true"), Some("1"), Some("TRUE"), Some(" 1 "), Some("0"), Some("false"), Some("yes")]
    {
        assert_eq!(redis_conn::test_support::ci_from(v), testkit::ci::ci_from(v), "CI={v:?}");
    }
    assert!(redis_conn::test_support::ci_from(Some("1")) && testkit::ci::ci_from(Some("true")));
}
