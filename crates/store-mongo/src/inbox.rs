use crate::error::{self, map, Op};
use crate::{codec, MongoConfig, INBOX};
use futures::TryStreamExt;
use kernel_core::model::Millis;
use kernel_core::ports::*;
use kernel_core::{validate, Result, WorkflowId};
use mongodb::bson::{doc, Document, RawDocumentBuf};
use mongodb::options::{CollectionOptions, IndexOptions};
use mongodb::{Collection, Database, IndexModel};

/// [`SignalInbox`] on the `signal_inbox` collection (K-9.3, K-9.4).
///
/// Document: `{ signal_id, workflow_id, signal_type, wait_key, generation: Int64,
/// status: "pending" | "matched", created_at: Date, match_time?: Date }`.
/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct MongoSignalInbox {
    coll: Collection<RawDocumentBuf>,
    config: MongoConfig,
}

impl MongoSignalInbox {
    /// Open the inbox on `db` and create its indexes (idempotent).
    pub async fn open(db: &Database, config: MongoConfig) -> Result<Self> {
        let s = Self::without_indexes(db, config);
        s.ensure_indexes().await?;
        Ok(s)
    }

    /// Open without touching indexes.
    pub fn without_indexes(db: &Database, config: MongoConfig) -> Self {
        let opts = CollectionOptions::builder()
            .write_concern(config.write_concern.clone())
            .selection_criteria(config.selection_criteria())
            .build();
        MongoSignalInbox { coll: db.collection_with_options(INBOX, opts), config }
    }

    /// The indexes of `signal_inbox`:
    ///
    /// - `signal_id_unique` — a duplicate delivery is ignored (K-9.3);
    /// - `status_signal_id` — the pending-signal repair scan, paged by `signal_id` (K-9.4);
    /// - `workflow_id_status_created_at` — the early-signal lookup after a suspend: a
    ///   handful of records per instance, oldest first;
    /// - `created_at` — retention (`purge_older_than`).
    pub async fn ensure_indexes(&self) -> Result<()> {
        let unique = |name: &str| IndexOptions::builder().unique(true).name(name.to_string()).build();
        let named = |name: &str| IndexOptions::builder().name(name.to_string()).build();
        let models = vec![
            IndexModel::builder().keys(doc! { "signal_id": 1 }).options(unique("signal_id_unique")).build(),
            IndexModel::builder().keys(doc! { "status": 1, "signal_id": 1 }).options(named("status_signal_id")).build(),
            IndexModel::builder()
                .keys(doc! { "workflow_id": 1, "status": 1, "created_at": 1 })
                .options(named("workflow_id_status_created_at"))
                .build(),
            IndexModel::builder().keys(doc! { "created_at": 1 }).options(named("created_at")).build(),
        ];
        self.coll.create_indexes(models).await.map_err(|e| map(Op::Write, "create indexes", e))?;
        Ok(())
    }

    async fn find_one(&self, filter: Document, sort: Option<Document>) -> Result<Option<SignalRecord>> {
        let mut action = self.coll.find_one(filter);
        if let Some(s) = sort {
            action = action.sort(s);
        }
        let d = action.await.map_err(|e| map(Op::Read, "find signal", e))?;
        d.as_ref().map(codec::decode_signal).transpose()
    }
}

#[async_trait::async_trait]
impl SignalInbox for MongoSignalInbox {
    async fn insert(&self, record: SignalRecord) -> Result<InsertOutcome> {
        record.validate()?;
        let d = codec::signal_doc(&record)?;
        match self.coll.insert_one(codec::raw("signal", &d)?).await {
            Ok(_) => Ok(InsertOutcome::Inserted),
            Err(e) if error::is_duplicate_key(&e) => match self.get(&record.signal_id).await? {
                Some(existing) => Ok(InsertOutcome::Duplicate(existing)),
                None => Err(kernel_core::Error::uncertain(format!(
                    "signal `{}` reported as duplicate but not found",
                    record.signal_id
                ))),
            },
            Err(e) => Err(map(Op::Write, "insert signal", e)),
        }
    }

    async fn get(&self, signal_id: &str) -> Result<Option<SignalRecord>> {
        validate::identifier("signal_id", signal_id)?;
        self.find_one(doc! { "signal_id": signal_id }, None).await
    }

    async fn find_pending(
        &self,
        workflow_id: &WorkflowId,
        signal_type: &str,
        wait_key: &str,
        generation: u64,
    ) -> Result<Option<SignalRecord>> {
        let workflow_id = workflow_id.as_str();
        validate::identifier("workflow_id", workflow_id)?;
        validate::identifier("signal_type", signal_type)?;
        validate::identifier("wait_key", wait_key)?;
        let filter = doc! {
            "workflow_id": workflow_id,
            "status": "pending",
            "signal_type": signal_type,
            "wait_key": wait_key,
            "generation": codec::i64_of("generation", generation)?,
        };
        self.find_one(filter, Some(doc! { "created_at": 1, "signal_id": 1 })).await
    }

    async fn mark_matched(&self, signal_id: &str, now: Millis) -> Result<bool> {
        validate::identifier("signal_id", signal_id)?;
        let r = self
            .coll
            .update_one(
                doc! { "signal_id": signal_id, "status": "pending" },
                doc! { "$set": { "status": "matched", "match_time": codec::dt(now) } },
            )
            .await
            .map_err(|e| map(Op::Write, "mark signal matched", e))?;
        Ok(r.matched_count == 1)
    }

    async fn scan_pending(&self, after: Option<&str>, limit: usize) -> Result<Vec<SignalRecord>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut filter = doc! { "status": "pending" };
        if let Some(a) = after {
            validate::identifier("after", a)?;
            filter.insert("signal_id", doc! { "$gt": a });
        }
        let docs: Vec<RawDocumentBuf> = self
            .coll
            .find(filter)
            .sort(doc! { "signal_id": 1 })
            .limit(limit.min(self.config.scan_page_max) as i64)
            .await
            .map_err(|e| map(Op::Read, "scan pending signals", e))?
            .try_collect()
            .await
            .map_err(|e| map(Op::Read, "scan pending signals", e))?;
        docs.iter().map(codec::decode_signal).collect()
    }

    async fn purge_older_than(&self, before: Millis, limit: usize) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        // Two bounded steps: pick at most `limit` ids (oldest first), then delete exactly
        // those; a record matched meanwhile is deleted all the same (it is as old).
        let docs: Vec<RawDocumentBuf> = self
            .coll
            .find(doc! { "created_at": { "$lt": codec::dt(before) } })
            .sort(doc! { "created_at": 1 })
            .limit(limit.min(self.config.scan_page_max) as i64)
            .await
            .map_err(|e| map(Op::Read, "find old signals", e))?
            .try_collect()
            .await
            .map_err(|e| map(Op::Read, "find old signals", e))?;
        let ids: Vec<String> = docs
            .iter()
            .map(codec::decode_signal)
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .map(|r| r.signal_id)
            .collect();
        if ids.is_empty() {
            return Ok(0);
        }
        let r = self
            .coll
            .delete_many(doc! { "signal_id": { "$in": ids } })
            .await
            .map_err(|e| map(Op::Write, "purge old signals", e))?;
        Ok(r.deleted_count)
    }
}
