//! The pub/sub doorbell (K-13).

use kernel_core::ports::Wakeup;
use queue_redis::test_support::{require_redis, DedicatedRedis, TestKeys};
use queue_redis::{connect, RedisWakeup};
use std::time::Duration;

/// Liveness bound for a ring to arrive; never a speed assertion.
const ARRIVAL_BOUND: Duration = Duration::from_secs(10);

async fn doorbell(url: &str, prefix: &str) -> RedisWakeup {
    queue_redis::RedisConnection::open(url).await.unwrap().wakeup(prefix).unwrap()
}

async fn subscribers(url: &str, channel: &str) -> i64 {
    let (_, n): (String, i64) =
        redis::cmd("PUBSUB").arg("NUMSUB").arg(channel).query_async(&mut connect(url).await.unwrap()).await.unwrap();
    n
}

/// The subscriber tries the seed nodes in turn (a cluster's): a dead first seed is
/// skipped, and rings published on the shared connection arrive through the next one.
#[tokio::test]
async fn a_dead_seed_is_skipped_by_the_subscriber() {
    let test = "a_dead_seed_is_skipped_by_the_subscriber";
    let Some(url) = require_redis(test) else { return };
    let keys = TestKeys::new(&url, test);
    let live = queue_redis::test_support::node_urls(&url).remove(0);
    let clients =
        vec![redis::Client::open("redis://127.0.0.1:1").unwrap(), redis::Client::open(live.as_str()).unwrap()];
    let bell = RedisWakeup::with_clients(clients, connect(&url).await.unwrap(), &keys.prefix).unwrap();
    let mut rx = bell.subscribe().await.unwrap();
    bell.notify().await.unwrap();
    tokio::time::timeout(ARRIVAL_BOUND, rx.recv()).await.expect("ring arrives").expect("open");
    let dead = RedisWakeup::with_clients(
        vec![redis::Client::open("redis://127.0.0.1:1").unwrap()],
        connect(&url).await.unwrap(),
        &keys.prefix,
    )
    .unwrap();
    assert!(matches!(dead.subscribe().await, Err(kernel_core::Error::Unavailable { .. })));
    assert!(RedisWakeup::with_clients(Vec::new(), connect(&url).await.unwrap(), &keys.prefix).is_err());
}

#[tokio::test]
async fn a_ring_reaches_subscribers_of_other_workers_coalesced() {
    let test = "a_ring_reaches_subscribers_of_other_workers_coalesced";
    let Some(url) = require_redis(test) else { return };
    let keys = TestKeys::new(&url, test);
    let a = doorbell(&url, &keys.prefix).await;
    let b = doorbell(&url, &keys.prefix).await;
    let other = doorbell(&url, &format!("{}-other", keys.prefix)).await;
    let mut rx_a = a.subscribe().await.unwrap();
    let mut rx_other = other.subscribe().await.unwrap();
    for _ in 0..10 {
        b.notify().await.unwrap();
    }
    tokio::time::timeout(ARRIVAL_BOUND, rx_a.recv()).await.expect("ring arrives").expect("open");
    // A burst is coalesced: at most one more pending message, never ten.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut extra = 0;
    while rx_a.try_recv().is_ok() {
        extra += 1;
    }
    assert!(extra <= 1, "{extra} extra rings queued");
    assert!(rx_other.try_recv().is_err(), "another prefix's doorbell stays silent");
}

#[tokio::test]
async fn dropping_the_receiver_ends_the_subscription() {
    let test = "dropping_the_receiver_ends_the_subscription";
    let Some(url) = require_redis(test) else { return };
    let keys = TestKeys::new(&url, test);
    let w = doorbell(&url, &keys.prefix).await;
    let rx = w.subscribe().await.unwrap();
    assert_eq!(subscribers(&url, w.channel()).await, 1);
    drop(rx);
    let deadline = tokio::time::Instant::now() + ARRIVAL_BOUND;
    while subscribers(&url, w.channel()).await != 0 {
        assert!(tokio::time::Instant::now() < deadline, "subscriber task outlived its receiver");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn subscriber_resubscribes_after_its_connection_is_killed() {
    let test = "subscriber_resubscribes_after_its_connection_is_killed";
    let Some(server) = DedicatedRedis::start(test) else { return };
    let w = doorbell(&server.url, "wk").await;
    let mut rx = w.subscribe().await.unwrap();
    let mut admin = connect(&server.url).await.unwrap();
    let killed: i64 = redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("pubsub").query_async(&mut admin).await.unwrap();
    assert_eq!(killed, 1);
    // The resubscribed task rings once by itself (messages may have been lost meanwhile).
    tokio::time::timeout(ARRIVAL_BOUND, rx.recv()).await.expect("ring after resubscribe").expect("open");
    let deadline = tokio::time::Instant::now() + ARRIVAL_BOUND;
    while subscribers(&server.url, w.channel()).await != 1 {
        assert!(tokio::time::Instant::now() < deadline, "not resubscribed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while rx.try_recv().is_ok() {}
    w.notify().await.unwrap();
    tokio::time::timeout(ARRIVAL_BOUND, rx.recv()).await.expect("rings reach the new subscription").expect("open");
}

/// The shared wakeup suite: two doorbells on their own connections under one fresh prefix
/// (two workers), a ring crossing Redis pub/sub.
mod conformance {
    use super::doorbell;
    use kernel_core::ports::DynWakeup;
    use queue_redis::test_support::{require_redis, TestKeys};
    use queue_redis::RedisWakeup;
    use std::time::Duration;
    use testkit::conformance::wakeup::WakeupFixture;

    pub struct Doorbells {
        a: RedisWakeup,
        b: RedisWakeup,
        _keys: TestKeys,
    }

    impl WakeupFixture for Doorbells {
        fn wakeup(&self) -> &DynWakeup {
            &self.a
        }
        fn peer(&self) -> &DynWakeup {
            &self.b
        }
        fn settle(&self) -> Duration {
            Duration::from_millis(300)
        }
    }

    pub async fn doorbells(case: &'static str) -> Option<Doorbells> {
        let url = require_redis(case)?;
        let keys = TestKeys::new(&url, case);
        let (a, b) = (doorbell(&url, &keys.prefix).await, doorbell(&url, &keys.prefix).await);
        Some(Doorbells { a, b, _keys: keys })
    }

    testkit::wakeup_conformance!(doorbells);
}
