//! The recovery dispatcher's candidate ZSET (K-11.3).

use futures::future::join_all;
use kernel_core::domain::Instant;
use kernel_core::Error;
use kernel_core::ObjectId;
use queue_redis::test_support::{require_redis, TestKeys};
use queue_redis::{connect, RedisDispatchCandidates, DISPATCH_BATCH_MAX};
use std::collections::BTreeSet;
use testkit::time::TestTime;

const T0: Instant = Instant::from_millis(1_700_000_000_000);

async fn fixture(test: &str) -> Option<(RedisDispatchCandidates, TestKeys)> {
    let url = require_redis(test)?;
    let keys = TestKeys::new(&url, test);
    let d = RedisDispatchCandidates::new(connect(&url).await.unwrap(), &keys.prefix).unwrap();
    Some((d, keys))
}

#[tokio::test]
async fn pop_due_removes_a_bounded_batch_earliest_first() {
    let Some((d, _keys)) = fixture("pop_due_removes_a_bounded_batch_earliest_first").await else { return };
    for i in (0..10).rev() {
        d.add(&ObjectId::from(format!("obj-{i}")), T0.plus(i)).await.unwrap();
    }
    assert_eq!(d.pop_due(T0.plus(4), 3).await.unwrap(), ["obj-0", "obj-1", "obj-2"]);
    assert_eq!(d.pop_due(T0.plus(4), 10).await.unwrap(), ["obj-3", "obj-4"], "only due ones");
    assert!(d.pop_due(T0.plus(4), 10).await.unwrap().is_empty(), "popped = removed");
    assert_eq!(d.len().await.unwrap(), 5);
    // Re-adding moves the due time (the dispatcher's later attempt).
    d.add(&"obj-5".into(), T0.plus(100)).await.unwrap();
    assert_eq!(d.pop_due(T0.plus(9), 10).await.unwrap(), ["obj-6", "obj-7", "obj-8", "obj-9"]);
    assert_eq!(d.pop_due(T0.plus(100), 10).await.unwrap(), ["obj-5"]);
    assert!(d.is_empty().await.unwrap());
}

#[tokio::test]
async fn rejects_bad_batches_and_ids() {
    let Some((d, _keys)) = fixture("rejects_bad_batches_and_ids").await else { return };
    for n in [0, DISPATCH_BATCH_MAX + 1] {
        assert!(matches!(d.pop_due(T0, n).await, Err(Error::InvalidInput { .. })), "batch {n}");
    }
    for bad in ["", "a\0b"] {
        assert!(matches!(d.add(&ObjectId::from(bad), T0).await, Err(Error::InvalidInput { .. })), "{bad:?}");
    }
    assert!(d.is_empty().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_poppers_never_share_a_candidate() {
    let Some((d, keys)) = fixture("concurrent_poppers_never_share_a_candidate").await else { return };
    for i in 0..400 {
        d.add(&ObjectId::from(format!("obj-{i:03}")), T0).await.unwrap();
    }
    let mut poppers = Vec::new();
    for _ in 0..4 {
        poppers.push(RedisDispatchCandidates::new(connect(&keys.url).await.unwrap(), &keys.prefix).unwrap());
    }
    let batches = join_all(poppers.into_iter().map(|p| {
        tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                let b = p.pop_due(T0, 7).await.unwrap();
                assert!(b.len() <= 7);
                if b.is_empty() {
                    return got;
                }
                got.extend(b);
            }
        })
    }))
    .await;
    let all: Vec<ObjectId> = batches.into_iter().flat_map(|b| b.unwrap()).collect();
    let unique: BTreeSet<&ObjectId> = all.iter().collect();
    assert_eq!(all.len(), 400);
    assert_eq!(unique.len(), 400, "a candidate was handed out twice");
}

/// The candidates port conformance suite on Redis.
pub struct Cands {
    candidates: RedisDispatchCandidates,
    // Deletes the case's keys when the fixture is dropped.
    _keys: TestKeys,
}

impl testkit::conformance::outbox::CandidatesFixture for Cands {
    fn candidates(&self) -> &kernel_core::ports::DynCandidates {
        &self.candidates
    }
}

/// A fresh prefix per case.
pub async fn cands_fixture() -> Option<Cands> {
    let (d, keys) = fixture("candidates_conformance").await?;
    Some(Cands { candidates: d, _keys: keys })
}

mod conformance {
    testkit::candidates_conformance!(super::cands_fixture);
}
