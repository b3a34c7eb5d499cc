use crate::error::{self, map, Op};
use crate::{codec, MongoConfig, INBOX};
use futures::TryStreamExt;
use kernel_core::domain::Instant;
use kernel_core::ports::*;
use kernel_core::{validate, Result, WorkflowId};
use mongodb::bson::{doc, Document, RawDocumentBuf};
use mongodb::options::{CollectionOptions, IndexOptions};
use mongodb::{Collection, Database, IndexModel};

/// [`SignalInbox`] on the `signal_inbox` collection (K-9.3, K-9.4).
///
/// Document: `{ signal_id, workflow_id, signal_type, wait_key, generation: Int64,
/// status: "pending" | "matched", created_at: Date, match_time?: Date, orphan?: true }`.
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
    /// - `created_at` — retention candidates (`scan_created_before`);
    /// - `orphan_workflow_id` — the bounds on signals for unknown workflow ids
    ///   (`count_pending_orphans`), sparse: only orphans carry `orphan`.
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
            IndexModel::builder()
                .keys(doc! { "orphan": 1, "workflow_id": 1 })
                .options(IndexOptions::builder().name("orphan_workflow_id".to_string()).sparse(true).build())
                .build(),
        ];
        self.coll.create_indexes(models).await.map_err(|e| map(Op::Write, "create indexes", e))?;
        Ok(())
    }

    async fn find_many(&self, filter: Document, sort: Document, limit: usize, what: &str) -> Result<Vec<SignalRecord>> {
        self.find_raw(filter, sort, limit, what).await?.iter().map(codec::decode_signal).collect()
    }

    async fn find_raw(
        &self,
        filter: Document,
        sort: Document,
        limit: usize,
        what: &str,
    ) -> Result<Vec<RawDocumentBuf>> {
        self.coll
            .find(filter)
            .sort(sort)
            .limit(limit.min(self.config.scan_page_max) as i64)
            .await
            .map_err(|e| map(Op::Read, what, e))?
            .try_collect()
            .await
            .map_err(|e| map(Op::Read, what, e))
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

    async fn mark_matched(&self, signal_id: &str, now: Instant) -> Result<bool> {
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

    async fn scan_pending(&self, after: Option<&str>, limit: usize) -> Result<SignalPage> {
        if limit == 0 {
            return Ok(SignalPage::default());
        }
        let mut filter = doc! { "status": "pending" };
        if let Some(a) = after {
            validate::identifier("after", a)?;
            filter.insert("signal_id", doc! { "$gt": a });
        }
        let docs = self.find_raw(filter, doc! { "signal_id": 1 }, limit, "scan pending signals").await?;
        Ok(page_of(&docs))
    }

    async fn scan_created_before(&self, before: Instant, after: Option<&str>, limit: usize) -> Result<SignalPage> {
        if limit == 0 {
            return Ok(SignalPage::default());
        }
        let mut filter = doc! { "created_at": { "$lt": codec::dt(before) } };
        if let Some(a) = after {
            validate::identifier("after", a)?;
            filter.insert("signal_id", doc! { "$gt": a });
        }
        let docs = self.find_raw(filter, doc! { "signal_id": 1 }, limit, "scan old signals").await?;
        Ok(page_of(&docs))
    }

    async fn scan_workflow(
        &self,
        workflow_id: &WorkflowId,
        status: SignalStatus,
        limit: usize,
    ) -> Result<Vec<SignalRecord>> {
        validate::identifier("workflow_id", workflow_id.as_str())?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        let filter = doc! { "workflow_id": workflow_id.as_str(), "status": status_str(status) };
        // Served by `workflow_id_status_created_at`.
        self.find_many(filter, doc! { "created_at": -1, "signal_id": -1 }, limit, "scan workflow signals").await
    }

    async fn delete_if(&self, signal_ids: &[String], status: SignalStatus) -> Result<u64> {
        validate_delete_ids(signal_ids)?;
        if signal_ids.is_empty() {
            return Ok(0);
        }
        let r = self
            .coll
            .delete_many(doc! { "signal_id": { "$in": signal_ids }, "status": status_str(status) })
            .await
            .map_err(|e| map(Op::Write, "delete signals", e))?;
        Ok(r.deleted_count)
    }

    async fn count_pending_orphans(&self, workflow_id: Option<&WorkflowId>, limit: u64) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let mut filter = doc! { "orphan": true, "status": "pending" };
        if let Some(w) = workflow_id {
            validate::identifier("workflow_id", w.as_str())?;
            filter.insert("workflow_id", w.as_str());
        }
        // Served by `orphan_workflow_id` (sparse: only orphans carry the field).
        self.coll.count_documents(filter).limit(limit).await.map_err(|e| map(Op::Read, "count orphan signals", e))
    }

    async fn clear_orphans(&self, workflow_id: &WorkflowId) -> Result<u64> {
        validate::identifier("workflow_id", workflow_id.as_str())?;
        // Served by `orphan_workflow_id`; the field is removed, as on a record never orphaned.
        let r = self
            .coll
            .update_many(
                doc! { "orphan": true, "workflow_id": workflow_id.as_str() },
                doc! { "$unset": { "orphan": "" } },
            )
            .await
            .map_err(|e| map(Op::Write, "clear orphan signals", e))?;
        Ok(r.modified_count)
    }
}

fn status_str(s: SignalStatus) -> &'static str {
    match s {
        SignalStatus::Pending => "pending",
        SignalStatus::Matched => "matched",
    }
}

/// A scan page, decoded document by document: a document that does not decode is reported
/// (under its `signal_id` when that is a string, else under `_id:<hex>`), never an error
/// of the page, so one bad record cannot stop the repair of every other (K-9.4).
fn page_of(docs: &[RawDocumentBuf]) -> SignalPage {
    let mut page = SignalPage::default();
    for r in docs {
        match codec::decode_signal(r) {
            Ok(record) => page.push(record),
            Err(e) => match r.get_str("signal_id") {
                Ok(id) => page.push_undecodable(id.to_string(), e.to_string(), true),
                // Only a real id is a cursor: the `_id:` name would sort among the ids and
                // skip the ones below it.
                Err(_) => {
                    let name =
                        r.get_object_id("_id").map_or_else(|_| "_id:unreadable".to_string(), |o| format!("_id:{o}"));
                    page.push_undecodable(name, e.to_string(), false)
                }
            },
        }
    }
    page
}
