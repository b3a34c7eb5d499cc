use kernel_core::domain::{DurationMs, Instant};
use kernel_core::ports::*;
use kernel_core::Result;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// In-memory [`ResultCache`]: one map from key hex to entry under one lock; clones share
/// state.
#[derive(Debug, Default, Clone)]
pub struct MemoryResultCache {
    entries: Arc<Mutex<BTreeMap<String, CachedResult>>>,
}

impl MemoryResultCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }
    /// How many entries are stored, expired or not.
    pub fn len(&self) -> usize {
        self.entries.lock().expect("cache lock").len()
    }
    /// Whether no entry is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait::async_trait]
impl ResultCache for MemoryResultCache {
    async fn get(&self, key: &CacheKey, now: Instant) -> Result<Option<CachedResult>> {
        let e = self.entries.lock().expect("cache lock");
        Ok(e.get(key.as_str()).filter(|r| r.expires_at > now).cloned())
    }

    async fn put(&self, key: &CacheKey, value: &Value, now: Instant, ttl: DurationMs) -> Result<()> {
        // The shared check, so this fake refuses exactly what a real cache refuses.
        let expires_at = check_cache_put(value, now, ttl)?;
        let entry = CachedResult { value: value.clone(), stored_at: now, expires_at };
        self.entries.lock().expect("cache lock").insert(key.as_str().to_string(), entry);
        Ok(())
    }

    async fn purge_expired(&self, now: Instant, limit: usize) -> Result<u64> {
        check_cache_purge_limit(limit)?;
        let mut e = self.entries.lock().expect("cache lock");
        let mut expired: Vec<(Instant, String)> =
            e.iter().filter(|(_, r)| r.expires_at <= now).map(|(k, r)| (r.expires_at, k.clone())).collect();
        expired.sort();
        expired.truncate(limit);
        for (_, k) in &expired {
            e.remove(k);
        }
        Ok(expired.len() as u64)
    }
}
