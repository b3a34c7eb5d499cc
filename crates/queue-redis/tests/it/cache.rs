//! The result cache on Redis: the shared conformance suite, plus what only Redis does (the
//! server's own expiry as a backstop, and purges of entries it already expired).

use kernel_core::domain::{DurationMs, Instant};
use kernel_core::ports::{CacheKey, CacheVersions, DynResultCache, ResultCache};
use queue_redis::test_support::{require_redis, TestKeys};
use queue_redis::{connect, RedisResultCache};
use testkit::conformance::cache::CacheFixture;

/// A cache under a fresh prefix whose keys are deleted on drop.
pub struct CacheDb {
    cache: RedisResultCache,
    keys: TestKeys,
}

impl CacheDb {
    pub async fn new() -> Option<CacheDb> {
        let url = require_redis("result_cache")?;
        let keys = TestKeys::new(&url, "result_cache");
        let cache = RedisResultCache::new(connect(&url).await.expect("connect"), &keys.prefix).expect("cache");
        Some(CacheDb { cache, keys })
    }
}

impl CacheFixture for CacheDb {
    fn cache(&self) -> &DynResultCache {
        &self.cache
    }
}

mod conformance {
    testkit::result_cache_conformance!(super::CacheDb::new);
}

fn key(n: u32) -> CacheKey {
    let v = CacheVersions { prompt: "p".into(), model: "m".into(), tool: "t".into(), data: "d".into() };
    CacheKey::new("read", &v, &serde_json::json!(n)).unwrap()
}

async fn redis_i64(db: &CacheDb, args: &[&str]) -> i64 {
    let mut conn = connect(&db.keys.url).await.unwrap();
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(&mut conn).await.unwrap()
}

/// A put gives the entry a server expiry of the ttl (the backstop) and an expiry score of
/// `expires_at`; a replacing put moves both.
#[tokio::test]
async fn put_sets_the_server_expiry_and_the_score() {
    let Some(db) = CacheDb::new().await else { return };
    let (k, now) = (key(1), Instant::from_millis(1_000_000));
    db.cache.put(&k, &serde_json::json!("a"), now, DurationMs::from_secs(3_600)).await.unwrap();
    let pttl = redis_i64(&db, &["PTTL", &db.cache.entry_key(&k)]).await;
    assert!(pttl > 3_500_000 && pttl <= 3_600_000, "PTTL {pttl}");
    let score: String = {
        let mut conn = connect(&db.keys.url).await.unwrap();
        redis::cmd("ZSCORE").arg(db.cache.expiry_key()).arg(k.as_str()).query_async(&mut conn).await.unwrap()
    };
    assert_eq!(score, "4600000");
    db.cache.put(&k, &serde_json::json!("b"), now, DurationMs::from_secs(60)).await.unwrap();
    let pttl = redis_i64(&db, &["PTTL", &db.cache.entry_key(&k)]).await;
    assert!(pttl > 0 && pttl <= 60_000, "PTTL {pttl}");
    assert_eq!(redis_i64(&db, &["ZCARD", db.cache.expiry_key()]).await, 1, "one score per key");
}

/// An entry Redis already expired is a miss, and a purge drops its score without counting
/// it; an entry Redis still holds past the caller's `expires_at` is purged and counted.
#[tokio::test]
async fn purge_counts_only_entries_redis_still_holds() {
    let Some(db) = CacheDb::new().await else { return };
    let now = Instant::from_millis(1_000_000);
    db.cache.put(&key(1), &serde_json::json!(1), now, DurationMs::from_millis(50)).await.unwrap();
    db.cache.put(&key(2), &serde_json::json!(2), now, DurationMs::from_millis(60)).await.unwrap();
    db.cache.put(&key(3), &serde_json::json!(3), now, DurationMs::from_secs(3_600)).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(db.cache.get(&key(1), now).await.unwrap(), None, "Redis expired it");
    // Simulated time past every expiry: key(3) is still held by Redis and is purged.
    let later = Instant::from_millis(1_000_000 + 3_600_000);
    assert_eq!(db.cache.purge_expired(later, 10).await.unwrap(), 1);
    assert_eq!(redis_i64(&db, &["ZCARD", db.cache.expiry_key()]).await, 0, "every score dropped");
    assert_eq!(redis_i64(&db, &["EXISTS", &db.cache.entry_key(&key(3))]).await, 0);
}
