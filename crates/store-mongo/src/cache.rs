//! The result cache of read-only activities (K-17.7) on its own collection.

use crate::codec;
use crate::error::{map, Op};
use crate::MongoConfig;
use futures::TryStreamExt;
use kernel_core::domain::{DurationMs, Instant};
use kernel_core::ports::*;
use kernel_core::Result;
use mongodb::bson::{doc, Bson, RawDocumentBuf};
use mongodb::options::{CollectionOptions, IndexOptions};
use mongodb::{Collection, Database, IndexModel};
use serde_json::Value;
use std::time::Duration;

/// Default name of the result-cache collection.
pub const RESULT_CACHE: &str = "workflow_result_cache";

/// [`ResultCache`] on a MongoDB collection (default [`RESULT_CACHE`]).
///
/// Document: `{ _id: <key hex>, value, stored_at: Date, expires_at: Date }`; `value` is
/// converted node by node like every user payload of this crate (keys verbatim, integers
/// Int64). A put is one `replaceOne` with upsert; a get filters on `expires_at > now`; a
/// purge reads at most `limit` expired ids (earliest expiry first) and deletes those still
/// expired with one `deleteMany`. The index `expires_at_ttl` (`expireAfterSeconds: 0`) lets
/// the server delete an entry once its own clock passes `expires_at`: a backstop never
/// earlier than `expires_at` when the caller's clock is the wall clock. Cheap to clone.
#[derive(Debug, Clone)]
pub struct MongoResultCache {
    coll: Collection<RawDocumentBuf>,
}

impl MongoResultCache {
    /// Open the cache on `db` in `collection` and create its index (idempotent).
    pub async fn open(db: &Database, config: &MongoConfig, collection: &str) -> Result<Self> {
        let s = Self::without_indexes(db, config, collection);
        s.ensure_indexes().await?;
        Ok(s)
    }

    /// Open without touching indexes.
    pub fn without_indexes(db: &Database, config: &MongoConfig, collection: &str) -> Self {
        let opts = CollectionOptions::builder()
            .write_concern(config.write_concern.clone())
            .selection_criteria(config.selection_criteria())
            .build();
        MongoResultCache { coll: db.collection_with_options(collection, opts) }
    }

    /// The index of the collection: `expires_at_ttl` on `expires_at`, a TTL index with
    /// `expireAfterSeconds: 0` (MongoDB ≥ 5.0 for the backstop), which also serves the
    /// purge's range scan.
    pub async fn ensure_indexes(&self) -> Result<()> {
        let ttl = IndexOptions::builder().name("expires_at_ttl".to_string()).expire_after(Duration::ZERO).build();
        let model = IndexModel::builder().keys(doc! { "expires_at": 1 }).options(ttl).build();
        self.coll.create_index(model).await.map_err(|e| map(Op::Write, "create indexes", e))?;
        Ok(())
    }
}

fn decode(r: &RawDocumentBuf) -> Result<CachedResult> {
    let d = codec::unraw(r)?;
    let value = codec::bson_to_json("value", d.get("value").ok_or_else(|| codec::corrupt("value", "missing"))?)?;
    Ok(CachedResult {
        value,
        stored_at: codec::time_field(&d, "stored_at")?,
        expires_at: codec::time_field(&d, "expires_at")?,
    })
}

#[async_trait::async_trait]
impl ResultCache for MongoResultCache {
    async fn get(&self, key: &CacheKey, now: Instant) -> Result<Option<CachedResult>> {
        let filter = doc! { "_id": key.as_str(), "expires_at": { "$gt": codec::dt(now) } };
        let found = self.coll.find_one(filter).await.map_err(|e| map(Op::Read, "read cached result", e))?;
        found.as_ref().map(decode).transpose()
    }

    async fn put(&self, key: &CacheKey, value: &Value, now: Instant, ttl: DurationMs) -> Result<()> {
        let expires_at = check_cache_put(value, now, ttl)?;
        let entry = doc! {
            "_id": key.as_str(),
            "value": codec::json_to_bson("value", value)?,
            "stored_at": codec::dt(now),
            "expires_at": codec::dt(expires_at),
        };
        let entry = codec::raw("value", &entry)?;
        self.coll
            .replace_one(doc! { "_id": key.as_str() }, entry)
            .upsert(true)
            .await
            .map_err(|e| map(Op::Write, "put cached result", e))?;
        Ok(())
    }

    async fn purge_expired(&self, now: Instant, limit: usize) -> Result<u64> {
        check_cache_purge_limit(limit)?;
        let expired = doc! { "expires_at": { "$lte": codec::dt(now) } };
        let docs: Vec<RawDocumentBuf> = self
            .coll
            .find(expired.clone())
            .sort(doc! { "expires_at": 1 })
            .projection(doc! { "_id": 1 })
            .limit(limit as i64)
            .await
            .map_err(|e| map(Op::Read, "find expired cached results", e))?
            .try_collect()
            .await
            .map_err(|e| map(Op::Read, "find expired cached results", e))?;
        if docs.is_empty() {
            return Ok(0);
        }
        let ids: Vec<Bson> = docs
            .iter()
            .map(|r| match r.get_str("_id") {
                Ok(id) => Ok(Bson::String(id.to_string())),
                Err(e) => Err(codec::corrupt_by("_id", e)),
            })
            .collect::<Result<_>>()?;
        // Still expired: a put that renewed an entry since the read keeps it.
        let mut filter = expired;
        filter.insert("_id", doc! { "$in": ids });
        let r = self.coll.delete_many(filter).await.map_err(|e| map(Op::Write, "purge expired cached results", e))?;
        Ok(r.deleted_count)
    }
}
