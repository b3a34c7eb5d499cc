use crate::error::{self, map, Op};
use crate::{codec, MongoConfig, TASK_INBOX};
use futures::TryStreamExt;
use kernel_core::domain::Instant;
use kernel_core::ports::*;
use kernel_core::{validate, Error, Result};
use mongodb::bson::{doc, Bson, Document, RawDocumentBuf};
use mongodb::options::{IndexOptions, ReturnDocument};
use mongodb::{Collection, Database, IndexModel};

/// [`TaskInbox`] on a collection of its own (default [`TASK_INBOX`],
/// `workflow_task_inbox`), K-17.5.
///
/// Document (times are BSON DateTime, the caller's readings; `level` Int64):
///
/// ```text
/// { _id: id, workflow_id, workflow_type, step, level, title, assignee?, roles: [role],
///   evidence: [{ label, reference }], token, created_at: Date, due_at: Date,
///   status: "open" | "decided" | "closed",
///   decision?: { outcome: "approve" | "reject" | "escalate" | "cancel", actor,
///                reason?: { sensitive: Bool, text? }, decided_at: Date },
///   closed_at?: Date }
/// ```
///
/// `open` is one `insert_one` (a duplicate `_id` reads the stored record back), `decide` a
/// read, the shared refusal rule, then one `update_one` filtered on
/// `{ _id, status: "open", token, due_at: { $gt: decided_at } }` and a read on a miss; `close` one `findAndModify` on
/// `{ _id, status: { $ne: "closed" } }` returning the document as it was before, so the
/// closer learns the decision it closed over. `list_open` reads this collection only. The
/// purges read at most `limit` candidate ids, then write once conditionally on the same
/// filter. Cheap to clone.
#[derive(Debug, Clone)]
pub struct MongoTaskInbox {
    coll: Collection<RawDocumentBuf>,
    config: MongoConfig,
}

impl MongoTaskInbox {
    /// Open the task inbox on `db`'s collection [`TASK_INBOX`] and create its indexes
    /// (idempotent).
    pub async fn open(db: &Database, config: MongoConfig) -> Result<Self> {
        Self::open_in(db, TASK_INBOX, config).await
    }

    /// Open the task inbox on `db`'s collection `collection` and create its indexes
    /// (idempotent). A collection name that is not an identifier (K-2.0), or that starts
    /// with `system.` or holds `$`, is [`Error::InvalidInput`].
    pub async fn open_in(db: &Database, collection: &str, config: MongoConfig) -> Result<Self> {
        let s = Self::without_indexes(db, collection, config)?;
        s.ensure_indexes().await?;
        Ok(s)
    }

    /// Open on `collection` without touching indexes.
    pub fn without_indexes(db: &Database, collection: &str, config: MongoConfig) -> Result<Self> {
        Ok(MongoTaskInbox { coll: crate::dead_letter::record_collection(db, collection, &config)?, config })
    }

    /// The indexes of the collection (besides `_id`):
    ///
    /// - `status_assignee_id` and `status_roles_id` (multikey) — the two branches of
    ///   `list_open`'s `$or`, each in `_id` order, so the server merges them without a sort;
    /// - `status_closed_at` — the candidates of `purge_closed`;
    /// - `sensitive_decided_at` — partial on `decision.reason.sensitive: true`, the
    ///   candidates of `purge_sensitive_reasons`.
    pub async fn ensure_indexes(&self) -> Result<()> {
        let named = |name: &str| IndexOptions::builder().name(name.to_string()).build();
        let models = vec![
            IndexModel::builder()
                .keys(doc! { "status": 1, "assignee": 1, "_id": 1 })
                .options(named("status_assignee_id"))
                .build(),
            IndexModel::builder()
                .keys(doc! { "status": 1, "roles": 1, "_id": 1 })
                .options(named("status_roles_id"))
                .build(),
            IndexModel::builder().keys(doc! { "status": 1, "closed_at": 1 }).options(named("status_closed_at")).build(),
            IndexModel::builder()
                .keys(doc! { "decision.decided_at": 1 })
                .options(
                    IndexOptions::builder()
                        .name("sensitive_decided_at".to_string())
                        .partial_filter_expression(doc! { "decision.reason.sensitive": true })
                        .build(),
                )
                .build(),
        ];
        self.coll.create_indexes(models).await.map_err(|e| map(Op::Write, "create task indexes", e))?;
        Ok(())
    }

    /// `d` as a raw document, refused when larger than the configured document limit.
    fn sized(&self, field: &str, d: &Document) -> Result<RawDocumentBuf> {
        let raw = codec::raw(field, d)?;
        let max = self.config.limits.document_bytes_max;
        if raw.as_bytes().len() > max {
            return Err(Error::invalid(
                field,
                format_args!("{} BSON bytes exceed the document limit of {max}", raw.as_bytes().len()),
            ));
        }
        Ok(raw)
    }

    /// At most `limit` ids of documents matching `filter`, in `sort` order.
    async fn ids(&self, filter: Document, sort: Document, limit: usize, what: &str) -> Result<Vec<Bson>> {
        self.coll
            .find(filter)
            .sort(sort)
            .projection(doc! { "_id": 1 })
            .limit(limit as i64)
            .await
            .map_err(|e| map(Op::Read, what, e))?
            .try_collect::<Vec<RawDocumentBuf>>()
            .await
            .map_err(|e| map(Op::Read, what, e))?
            .iter()
            .map(|r| {
                codec::unraw(r).and_then(|d| d.get("_id").cloned().ok_or_else(|| codec::corrupt("_id", "missing")))
            })
            .collect()
    }
}

#[async_trait::async_trait]
impl TaskInbox for MongoTaskInbox {
    async fn open(&self, task: &TaskRecord) -> Result<Option<TaskRecord>> {
        task.validate_new()?;
        let raw = self.sized("task", &codec::task_doc(task))?;
        // A duplicate reads what is there; only a purge between the two can leave nothing,
        // and then the insert is tried once more.
        for _ in 0..2 {
            match self.coll.insert_one(raw.clone()).await {
                Ok(_) => return Ok(None),
                Err(e) if error::is_duplicate_key(&e) => {
                    if let Some(stored) = self.get(&task.id).await? {
                        return Ok(Some(stored));
                    }
                }
                Err(e) => return Err(map(Op::Write, "open task", e)),
            }
        }
        Err(Error::Conflict(format!("task `{}` was purged and opened concurrently; nothing written", task.id)))
    }

    async fn get(&self, id: &str) -> Result<Option<TaskRecord>> {
        validate::identifier("id", id)?;
        let d = self.coll.find_one(doc! { "_id": id }).await.map_err(|e| map(Op::Read, "read task", e))?;
        d.as_ref().map(codec::decode_task).transpose()
    }

    async fn list_open(&self, actor: &Actor, after: Option<&str>, limit: usize) -> Result<Vec<TaskRecord>> {
        validate_task_list(actor, after, limit)?;
        let mut filter = doc! { "status": TaskStatus::Open.as_str() };
        let mine = doc! { "assignee": actor.id.as_str() };
        if actor.roles.is_empty() {
            filter.extend(mine);
        } else {
            let roles: Vec<Bson> = actor.roles.iter().map(|r| Bson::String(r.clone())).collect();
            filter.insert("$or", vec![mine, doc! { "roles": { "$in": roles } }]);
        }
        if let Some(a) = after {
            filter.insert("_id", doc! { "$gt": a });
        }
        // Served by `status_assignee_id` and `status_roles_id`, merged in `_id` order.
        let docs: Vec<RawDocumentBuf> = self
            .coll
            .find(filter)
            .sort(doc! { "_id": 1 })
            .limit(limit as i64)
            .await
            .map_err(|e| map(Op::Read, "list open tasks", e))?
            .try_collect()
            .await
            .map_err(|e| map(Op::Read, "list open tasks", e))?;
        docs.iter().map(codec::decode_task).collect()
    }

    async fn decide(&self, id: &str, token: &str, actor: &Actor, decision: &TaskDecision) -> Result<TaskDecideOutcome> {
        validate_task_decide(id, token, actor, decision)?;
        let update = doc! { "$set": {
            "status": TaskStatus::Decided.as_str(),
            "decision": codec::task_decision_doc(decision),
        } };
        self.sized("decision", &update)?;
        // A refusal on the record as read writes nothing. A miss of the conditional write
        // reads again: a record is never reopened, so the read finds it decided, closed or
        // absent; only a record opened again between the two (after a purge of the same id)
        // can be open with this token: the write is tried once more.
        let mut found = self.get(id).await?;
        for _ in 0..2 {
            if let Some(refused) = task_decision_refused(found.as_ref(), token, actor, decision)? {
                return Ok(refused);
            }
            let r = self
                .coll
                .update_one(
                    doc! {
                        "_id": id,
                        "status": TaskStatus::Open.as_str(),
                        "token": token,
                        "due_at": { "$gt": codec::dt(decision.decided_at) },
                    },
                    update.clone(),
                )
                .await
                .map_err(|e| map(Op::Write, "decide task", e))?;
            if r.matched_count == 1 {
                return Ok(TaskDecideOutcome::Decided);
            }
            found = self.get(id).await?;
        }
        if let Some(refused) = task_decision_refused(found.as_ref(), token, actor, decision)? {
            return Ok(refused);
        }
        Err(Error::Conflict(format!("task `{id}` changed twice while it was being decided; nothing written")))
    }

    async fn close(&self, id: &str, now: Instant) -> Result<TaskCloseOutcome> {
        validate::identifier("id", id)?;
        let closed = TaskStatus::Closed.as_str();
        // A miss reads the status: closed already, or absent. A record is never reopened,
        // so only one opened again between the two (after a purge of the same id) is found
        // open or decided: the write is tried once more.
        for _ in 0..2 {
            let before = self
                .coll
                .find_one_and_update(
                    doc! { "_id": id, "status": { "$ne": closed } },
                    doc! { "$set": { "status": closed, "closed_at": codec::dt(now) } },
                )
                .return_document(ReturnDocument::Before)
                .projection(doc! { "_id": 0, "decision": 1 })
                .await
                .map_err(|e| map(Op::Write, "close task", e))?;
            if let Some(before) = before {
                return Ok(TaskCloseOutcome::Closed(codec::task_decision_in(&before)?));
            }
            let found = self
                .coll
                .find_one(doc! { "_id": id })
                .projection(doc! { "_id": 0, "status": 1 })
                .await
                .map_err(|e| map(Op::Read, "read task", e))?;
            match found.as_ref().map(codec::unraw).transpose()? {
                None => return Ok(TaskCloseOutcome::NotFound),
                Some(d) if d.get_str("status") == Ok(closed) => return Ok(TaskCloseOutcome::AlreadyClosed),
                Some(_) => {}
            }
        }
        Err(Error::Conflict(format!("task `{id}` changed twice while it was being closed; nothing written")))
    }

    async fn purge_sensitive_reasons(&self, before: Instant, limit: usize) -> Result<u64> {
        validate_task_purge(limit)?;
        // Served by `sensitive_decided_at`: at most `limit` candidate ids, then one update
        // conditional on the same filter, so a text already gone is not counted twice.
        let mut filter = doc! {
            "decision.reason.sensitive": true,
            "decision.decided_at": { "$lt": codec::dt(before) },
            "decision.reason.text": { "$exists": true },
        };
        let ids =
            self.ids(filter.clone(), doc! { "decision.decided_at": 1 }, limit, "find sensitive task reasons").await?;
        if ids.is_empty() {
            return Ok(0);
        }
        filter.insert("_id", doc! { "$in": ids });
        let r = self
            .coll
            .update_many(filter, doc! { "$unset": { "decision.reason.text": "" } })
            .await
            .map_err(|e| map(Op::Write, "purge sensitive task reasons", e))?;
        Ok(r.modified_count)
    }

    async fn purge_closed(&self, before: Instant, limit: usize) -> Result<u64> {
        validate_task_purge(limit)?;
        // Served by `status_closed_at`: at most `limit` candidate ids, then one delete
        // conditional on the status again.
        let mut filter = doc! { "status": TaskStatus::Closed.as_str(), "closed_at": { "$lt": codec::dt(before) } };
        let ids = self.ids(filter.clone(), doc! { "closed_at": 1 }, limit, "find closed tasks").await?;
        if ids.is_empty() {
            return Ok(0);
        }
        filter.insert("_id", doc! { "$in": ids });
        let r = self.coll.delete_many(filter).await.map_err(|e| map(Op::Write, "purge closed tasks", e))?;
        Ok(r.deleted_count)
    }
}
