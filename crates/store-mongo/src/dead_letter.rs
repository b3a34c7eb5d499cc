use crate::error::{self, map, Op};
use crate::{codec, MongoConfig, DEAD_LETTERS};
use futures::TryStreamExt;
use kernel_core::domain::Instant;
use kernel_core::ports::*;
use kernel_core::{validate, Error, Result};
use mongodb::bson::{doc, Bson, Document, RawDocumentBuf};
use mongodb::options::{CollectionOptions, IndexOptions};
use mongodb::{Collection, Database, IndexModel};

/// [`DeadLetters`] on a collection of their own (default [`DEAD_LETTERS`],
/// `workflow_dead_letters`), K-17.2.
///
/// Document (times are BSON DateTime, counters Int64, the inputs and a completion's output
/// JSON mapped node by node to BSON with keys kept verbatim):
///
/// ```text
/// { _id: id, workflow_id, workflow_type, step, step_index, run, epoch,
///   error: { class, message }, inputs, created_at: Date,
///   status: "open" | "decided" | "closed",
///   decision?: { action: { kind: "retry" | "complete" | "fail", output? }, actor, reason?,
///                decided_at: Date },
///   closed_at?: Date }
/// ```
///
/// `record` is one `insert_one` (a duplicate `_id` is the idempotent re-record), `decide`
/// one `update_one` filtered on `{ _id, status: "open" }` then a read on a miss, `close`
/// one `update_one` on `{ _id, status: "decided" }`, `purge_closed` a bounded read of
/// candidate ids and one `delete_many` conditional on the status. Cheap to clone.
#[derive(Debug, Clone)]
pub struct MongoDeadLetters {
    coll: Collection<RawDocumentBuf>,
    config: MongoConfig,
}

impl MongoDeadLetters {
    /// Open the dead letters on `db`'s collection [`DEAD_LETTERS`] and create its indexes
    /// (idempotent).
    pub async fn open(db: &Database, config: MongoConfig) -> Result<Self> {
        Self::open_in(db, DEAD_LETTERS, config).await
    }

    /// Open the dead letters on `db`'s collection `collection` and create its indexes
    /// (idempotent). A collection name that is not an identifier (K-2.0), or that starts
    /// with `system.` or holds `$`, is [`Error::InvalidInput`].
    pub async fn open_in(db: &Database, collection: &str, config: MongoConfig) -> Result<Self> {
        let s = Self::without_indexes(db, collection, config)?;
        s.ensure_indexes().await?;
        Ok(s)
    }

    /// Open on `collection` without touching indexes.
    pub fn without_indexes(db: &Database, collection: &str, config: MongoConfig) -> Result<Self> {
        Ok(MongoDeadLetters { coll: record_collection(db, collection, &config)?, config })
    }

    /// The indexes of the collection (besides `_id`):
    ///
    /// - `status_id` — `list` with a status filter, paged by `_id`;
    /// - `status_closed_at` — the candidates of `purge_closed`.
    pub async fn ensure_indexes(&self) -> Result<()> {
        let named = |name: &str| IndexOptions::builder().name(name.to_string()).build();
        let models = vec![
            IndexModel::builder().keys(doc! { "status": 1, "_id": 1 }).options(named("status_id")).build(),
            IndexModel::builder().keys(doc! { "status": 1, "closed_at": 1 }).options(named("status_closed_at")).build(),
        ];
        self.coll.create_indexes(models).await.map_err(|e| map(Op::Write, "create dead-letter indexes", e))?;
        Ok(())
    }

    fn payload(&self, field: &str, v: &serde_json::Value) -> Result<()> {
        validate::payload(field, v, self.config.limits.payload_bytes_max)
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
}

#[async_trait::async_trait]
impl DeadLetters for MongoDeadLetters {
    async fn record(&self, dl: &DeadLetter) -> Result<bool> {
        dl.validate_new()?;
        self.payload("inputs", &dl.inputs)?;
        let raw = self.sized("dead_letter", &codec::dead_letter_doc(dl)?)?;
        match self.coll.insert_one(raw).await {
            Ok(_) => Ok(true),
            Err(e) if error::is_duplicate_key(&e) => Ok(false),
            Err(e) => Err(map(Op::Write, "record dead letter", e)),
        }
    }

    async fn get(&self, id: &str) -> Result<Option<DeadLetter>> {
        validate::identifier("id", id)?;
        let d = self.coll.find_one(doc! { "_id": id }).await.map_err(|e| map(Op::Read, "read dead letter", e))?;
        d.as_ref().map(codec::decode_dead_letter).transpose()
    }

    async fn list(
        &self,
        status: Option<DeadLetterStatus>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>> {
        validate_dead_letter_list(after, limit)?;
        let mut filter = Document::new();
        if let Some(s) = status {
            filter.insert("status", s.as_str());
        }
        if let Some(a) = after {
            filter.insert("_id", doc! { "$gt": a });
        }
        // Served by `_id`, or by `status_id` with a status.
        let docs: Vec<RawDocumentBuf> = self
            .coll
            .find(filter)
            .sort(doc! { "_id": 1 })
            .limit(limit as i64)
            .await
            .map_err(|e| map(Op::Read, "list dead letters", e))?
            .try_collect()
            .await
            .map_err(|e| map(Op::Read, "list dead letters", e))?;
        docs.iter().map(codec::decode_dead_letter).collect()
    }

    async fn decide(&self, id: &str, decision: &DeadLetterDecision) -> Result<DecideOutcome> {
        validate::identifier("id", id)?;
        decision.validate()?;
        if let DeadLetterAction::Complete { output } = &decision.action {
            self.payload("decision.output", output)?;
        }
        let update = doc! { "$set": { "status": "decided", "decision": codec::decision_doc(decision)? } };
        self.sized("decision", &update)?;
        // A miss reads what is there. A record is never reopened, so the read finds it
        // decided, closed or absent; only a record recorded between the two (after a
        // purge of the same id) can be open: the write is tried once more.
        for _ in 0..2 {
            let r = self
                .coll
                .update_one(doc! { "_id": id, "status": "open" }, update.clone())
                .await
                .map_err(|e| map(Op::Write, "decide dead letter", e))?;
            if r.matched_count == 1 {
                return Ok(DecideOutcome::Decided);
            }
            if let Some(outcome) = decide_missed(id, self.get(id).await?)? {
                return Ok(outcome);
            }
        }
        Err(Error::Conflict(format!("dead letter `{id}` changed twice while it was being decided; nothing written")))
    }

    async fn close(&self, id: &str, now: Instant) -> Result<bool> {
        validate::identifier("id", id)?;
        let r = self
            .coll
            .update_one(
                doc! { "_id": id, "status": "decided" },
                doc! { "$set": { "status": "closed", "closed_at": codec::dt(now) } },
            )
            .await
            .map_err(|e| map(Op::Write, "close dead letter", e))?;
        Ok(r.matched_count == 1)
    }

    async fn purge_closed(&self, before: Instant, limit: usize) -> Result<u64> {
        validate_dead_letter_purge(limit)?;
        // Served by `status_closed_at`: at most `limit` candidate ids, then one delete
        // conditional on the status again.
        let filter = doc! { "status": "closed", "closed_at": { "$lt": codec::dt(before) } };
        let ids: Vec<Bson> = self
            .coll
            .find(filter.clone())
            .sort(doc! { "closed_at": 1 })
            .projection(doc! { "_id": 1 })
            .limit(limit as i64)
            .await
            .map_err(|e| map(Op::Read, "find closed dead letters", e))?
            .try_collect::<Vec<RawDocumentBuf>>()
            .await
            .map_err(|e| map(Op::Read, "find closed dead letters", e))?
            .iter()
            .map(|r| {
                codec::unraw(r).and_then(|d| d.get("_id").cloned().ok_or_else(|| codec::corrupt("_id", "missing")))
            })
            .collect::<Result<_>>()?;
        if ids.is_empty() {
            return Ok(0);
        }
        let mut filter = filter;
        filter.insert("_id", doc! { "$in": ids });
        let r = self.coll.delete_many(filter).await.map_err(|e| map(Op::Write, "purge dead letters", e))?;
        Ok(r.deleted_count)
    }
}

/// A record store's collection named by the caller (dead letters, human tasks), with the
/// configured write concern and read preference. A name that is not an identifier (K-2.0),
/// or that starts with `system.` or holds `$`, is [`Error::InvalidInput`].
pub(crate) fn record_collection(
    db: &Database,
    collection: &str,
    config: &MongoConfig,
) -> Result<Collection<RawDocumentBuf>> {
    validate::identifier("collection", collection)?;
    if collection.starts_with("system.") || collection.contains('$') {
        return Err(Error::invalid("collection", format_args!("{collection:?} is not a usable collection name")));
    }
    let opts = CollectionOptions::builder()
        .write_concern(config.write_concern.clone())
        .selection_criteria(config.selection_criteria())
        .build();
    Ok(db.collection_with_options(collection, opts))
}
