//! Integration tests of the Redis lanes, wakeup and dispatch candidates against a real
//! Redis (`REDIS_URL`, default `redis://127.0.0.1:6379`; see `queue_redis::test_support`).

mod cache;
mod conformance;
mod dispatch;
mod lanes;
mod outage;
mod url;
mod wakeup;

use queue_redis::test_support::{require_redis, TestKeys};
use queue_redis::{connect, LaneWeights, RedisReadyQueue};

/// A queue under a fresh prefix whose keys are deleted on drop.
pub struct QueueFixture {
    /// The queue under test.
    pub queue: RedisReadyQueue,
    /// Its namespace.
    pub keys: TestKeys,
}

impl std::ops::Deref for QueueFixture {
    type Target = RedisReadyQueue;
    fn deref(&self) -> &RedisReadyQueue {
        &self.queue
    }
}

impl QueueFixture {
    /// Another worker: a queue on its own connection sharing this fixture's prefix.
    pub async fn worker(&self) -> RedisReadyQueue {
        let conn = connect(&self.keys.url).await.expect("connect");
        RedisReadyQueue::new(conn, &self.keys.prefix, self.queue.weights()).expect("queue")
    }
}

/// A fresh queue, or `None` when Redis is unavailable outside CI.
pub async fn queue_fixture(test: &'static str) -> Option<QueueFixture> {
    let url = require_redis(test)?;
    let keys = TestKeys::new(&url, test);
    let conn = connect(&url).await.expect("connect");
    let queue = RedisReadyQueue::new(conn, &keys.prefix, LaneWeights::default()).expect("queue");
    Some(QueueFixture { queue, keys })
}
