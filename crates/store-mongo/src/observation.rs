//! The observer's projection on MongoDB: [`MongoObservationRepository`] implements
//! [`ObservationRepository`] (and so serves [`OpsView`](observer::OpsView)) on the
//! collections `observation_attempts`, `observation_snapshots` and `observation_audit`. It
//! never reads `workflow_instances`.
//!
//! Both collections use the same revision rule with one upsert per record:
//! filter `{_id, revision: {$lte: r}}`, `upsert: true`. When the stored revision is newer
//! the filter misses and the upsert's insert collides on `_id` (duplicate key 11000): that
//! is the "older revision ignored" outcome, not an error. An attempt row's update `$set`s
//! every field but `started_at`, which it `$min`s (when the row carries one): the row keeps
//! the earliest start it has seen ([`AttemptRow::merge`]), in the same single update. Any
//! other per-record write error is the server refusing the record for good
//! ([`Error::InvalidRecord`]); connection and selection failures are
//! [`Error::Unavailable`]. A batch is one `update` command per collection with
//! `ordered: false`.
//!
//! A biz-key prefix is the `_id` range `[prefix, prefix_upper_bound(prefix))` (strings
//! compare as UTF-8 bytes, so no character is a wildcard and the `_id` index answers it);
//! a paging cursor is `updated_at < t OR (updated_at = t AND _id > key)`. An audit entry is
//! one insert with `_id = id`; a duplicate key is the entry already being there.

use futures::TryStreamExt;
use kernel_core::domain::Instant;
use kernel_core::ports::Observation;
use mongodb::bson::{doc, Bson, Document};
use mongodb::error::{ErrorKind, WriteFailure};
use mongodb::options::IndexOptions;
use mongodb::{Collection, Database, IndexModel};
use observer::audit::{check_audit_purge_limit, AuditEntry, AuditQuery};
use observer::projection::{effective_limit, prefix_upper_bound, AttemptQuery, AttemptRow, Snapshot, SnapshotQuery};
use observer::{check_finished_purge_limit, Error, ObservationRepository, Result, FINISHED_STATUSES};

/// Attempt rows.
pub const ATTEMPTS_COLLECTION: &str = "observation_attempts";
/// Snapshots, `_id = biz_key`.
pub const SNAPSHOTS_COLLECTION: &str = "observation_snapshots";
/// Operator audit entries, `_id = id`.
pub const AUDIT_COLLECTION: &str = "observation_audit";

const DUPLICATE_KEY: i32 = 11000;

/// The projection on MongoDB. Cheap to clone.
#[derive(Debug, Clone)]
pub struct MongoObservationRepository {
    db: Database,
}

fn map_err(e: mongodb::error::Error) -> Error {
    match *e.kind {
        ErrorKind::Write(WriteFailure::WriteError(ref w)) if w.code != DUPLICATE_KEY => {
            Error::InvalidRecord(format!("code {}: {}", w.code, w.message))
        }
        ErrorKind::BsonSerialization(_) | ErrorKind::InvalidArgument { .. } => Error::InvalidRecord(e.to_string()),
        _ => Error::unavailable_with(format!("mongodb: {e}"), e),
    }
}

fn is_duplicate(e: &mongodb::error::Error) -> bool {
    match *e.kind {
        ErrorKind::Write(WriteFailure::WriteError(ref w)) => w.code == DUPLICATE_KEY,
        ErrorKind::Command(ref c) => c.code == DUPLICATE_KEY,
        _ => false,
    }
}

fn to_doc<T: serde::Serialize>(v: &T) -> Result<Document> {
    mongodb::bson::to_document(v).map_err(|e| Error::InvalidRecord(e.to_string()))
}

/// `_id` of an attempt row: length-prefixed, so no two keys collide.
fn attempt_id(r: &AttemptRow) -> String {
    format!("{}:{}|{}|{}:{}|{}", r.biz_key.len(), r.biz_key, r.workflow_run, r.step_name.len(), r.step_name, r.attempt)
}

/// The guarded `$set` of a record, keeping `_id` out of it.
fn set_doc(mut d: Document) -> Document {
    d.remove("_id");
    d
}

impl MongoObservationRepository {
    /// The repository on `db`, indexes created (idempotent).
    pub async fn open(db: &Database) -> Result<Self> {
        let repo = MongoObservationRepository { db: db.clone() };
        let ix = |keys: Document, name: &str| {
            IndexModel::builder().keys(keys).options(IndexOptions::builder().name(name.to_string()).build()).build()
        };
        repo.snapshots()
            .create_indexes([
                ix(doc! {"workflow_type": 1, "updated_at": -1}, "type_updated"),
                ix(doc! {"status": 1, "updated_at": -1}, "status_updated"),
                ix(doc! {"step_name": 1, "updated_at": -1}, "step_updated"),
                ix(doc! {"updated_at": -1}, "updated"),
                ix(doc! {"wait_signal": 1, "updated_at": -1}, "wait_signal_updated"),
            ])
            .await
            .map_err(map_err)?;
        repo.attempts()
            .create_indexes([
                ix(doc! {"biz_key": 1, "workflow_run": 1}, "biz_run"),
                ix(doc! {"workflow_type": 1, "step_name": 1, "outcome": 1, "updated_at": -1}, "type_step_outcome"),
                ix(doc! {"step_name": 1, "outcome": 1, "updated_at": -1}, "step_outcome"),
            ])
            .await
            .map_err(map_err)?;
        repo.audit()
            .create_indexes([
                ix(doc! {"at": -1, "_id": 1}, "at"),
                ix(doc! {"actor": 1, "at": -1}, "actor_at"),
                ix(doc! {"action": 1, "at": -1}, "action_at"),
                ix(doc! {"target": 1, "at": -1}, "target_at"),
            ])
            .await
            .map_err(map_err)?;
        Ok(repo)
    }

    fn audit(&self) -> Collection<Document> {
        self.db.collection(AUDIT_COLLECTION)
    }

    fn snapshots(&self) -> Collection<Document> {
        self.db.collection(SNAPSHOTS_COLLECTION)
    }

    fn attempts(&self) -> Collection<Document> {
        self.db.collection(ATTEMPTS_COLLECTION)
    }

    /// One `update` command, unordered; duplicate keys (older revisions) are ignored.
    async fn run_updates(&self, collection: &str, updates: Vec<Document>) -> Result<()> {
        if updates.is_empty() {
            return Ok(());
        }
        let reply = self
            .db
            .run_command(doc! { "update": collection, "updates": updates, "ordered": false })
            .await
            .map_err(map_err)?;
        let mut refused = Vec::new();
        if let Ok(errors) = reply.get_array("writeErrors") {
            for e in errors.iter().filter_map(Bson::as_document) {
                let code = e.get_i32("code").map(i64::from).or_else(|_| e.get_i64("code")).unwrap_or(-1);
                if code != i64::from(DUPLICATE_KEY) {
                    refused.push(format!(
                        "#{} code {code}: {}",
                        e.get_i32("index").unwrap_or(-1),
                        e.get_str("errmsg").unwrap_or("")
                    ));
                }
            }
        }
        if refused.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidRecord(refused.join("; ")))
        }
    }

    fn snapshot_update(obs: &Observation) -> Result<Document> {
        let snap = Snapshot::from_observation(obs);
        let mut set = to_doc(&snap)?;
        set.remove("steps");
        if let Some(name) = &obs.step_name {
            // The step name becomes a path component: the server refuses names it cannot store.
            let summary = snap.steps.get(name).map(to_doc).transpose()?.unwrap_or_default();
            set.insert(format!("steps.{name}"), summary);
        }
        let mut update = doc! { "$set": set };
        if !obs.status.is_terminal() {
            update.get_document_mut("$set").map_err(|e| Error::InvalidRecord(e.to_string()))?.remove("finished_at");
            update.insert("$unset", doc! { "finished_at": "" });
        }
        Ok(doc! {
            "q": { "_id": &obs.biz_key, "revision": { "$lte": obs.revision as i64 } },
            "u": update,
            "upsert": true,
        })
    }

    /// `$set` of every field but `started_at`, which is `$min`: the earliest start kept
    /// (an absent field takes the new one), in the same guarded single-document update.
    fn attempt_update(row: &AttemptRow) -> Result<Document> {
        let mut set = set_doc(to_doc(row)?);
        set.remove("started_at");
        let mut update = doc! { "$set": set };
        if let Some(started) = row.started_at {
            update.insert("$min", doc! { "started_at": started.as_millis() });
        }
        Ok(doc! {
            "q": { "_id": attempt_id(row), "revision": { "$lte": row.revision as i64 } },
            "u": update,
            "upsert": true,
        })
    }

    async fn find<T: serde::de::DeserializeOwned>(
        &self,
        coll: Collection<Document>,
        filter: Document,
        limit: usize,
    ) -> Result<Vec<T>> {
        self.find_sorted(coll, filter, doc! { "updated_at": -1, "_id": 1 }, limit).await
    }

    async fn find_sorted<T: serde::de::DeserializeOwned>(
        &self,
        coll: Collection<Document>,
        filter: Document,
        sort: Document,
        limit: usize,
    ) -> Result<Vec<T>> {
        let cursor = coll.find(filter).sort(sort).limit(effective_limit(limit) as i64).await.map_err(map_err)?;
        let docs: Vec<Document> = cursor.try_collect().await.map_err(map_err)?;
        docs.into_iter()
            .map(|d| mongodb::bson::from_document(d).map_err(|e| Error::unavailable_with(format!("decode: {e}"), e)))
            .collect()
    }
}

fn window(filter: &mut Document, from: Option<Instant>, to: Option<Instant>) {
    let mut range = Document::new();
    if let Some(f) = from {
        range.insert("$gte", f.as_millis());
    }
    if let Some(t) = to {
        range.insert("$lt", t.as_millis());
    }
    if !range.is_empty() {
        filter.insert("updated_at", range);
    }
}

/// Keyset paging: strictly after `(at, key)` in the order `time_field` descending, `_id`
/// ascending.
fn cursor(filter: &mut Document, time_field: &str, before: Option<&(Instant, String)>) {
    if let Some((at, key)) = before {
        filter.insert(
            "$or",
            vec![
                doc! { time_field: { "$lt": at.as_millis() } },
                doc! { time_field: at.as_millis(), "_id": { "$gt": key } },
            ],
        );
    }
}

/// The document an audit entry is stored as: the entry's serde form with `_id = id`.
fn audit_doc(entry: &AuditEntry) -> Result<Document> {
    let mut d = to_doc(entry)?;
    d.remove("id");
    d.insert("_id", &entry.id);
    Ok(d)
}

fn audit_entry(mut d: Document) -> Result<AuditEntry> {
    if let Some(id) = d.remove("_id") {
        d.insert("id", id);
    }
    mongodb::bson::from_document(d).map_err(|e| Error::unavailable_with(format!("decode: {e}"), e))
}

fn bson_str<T: serde::Serialize>(v: &T) -> Result<Bson> {
    mongodb::bson::to_bson(v).map_err(|e| Error::InvalidInput { field: "query".into(), reason: e.to_string() })
}

/// The `_id`s of at most `limit` documents matching `filter`, oldest `time_field` first
/// (ties by `_id`): the page a purge deletes.
async fn oldest_ids(
    coll: &Collection<Document>,
    filter: Document,
    time_field: &str,
    limit: usize,
) -> Result<Vec<Bson>> {
    let cursor = coll
        .find(filter)
        .sort(doc! { time_field: 1, "_id": 1 })
        .projection(doc! { "_id": 1 })
        .limit(limit as i64)
        .await
        .map_err(map_err)?;
    Ok(cursor
        .try_collect::<Vec<Document>>()
        .await
        .map_err(map_err)?
        .into_iter()
        .filter_map(|mut d| d.remove("_id"))
        .collect())
}

#[async_trait::async_trait]
impl ObservationRepository for MongoObservationRepository {
    async fn write_batch(&self, batch: &[Observation]) -> Result<()> {
        let mut attempts = Vec::new();
        let mut snapshots = Vec::with_capacity(batch.len());
        let mut invalid = None;
        for obs in batch {
            // `.` would silently nest the path and NUL cannot be a BSON key: refuse those
            // here; a `$` prefix is left to the server, which refuses it.
            if let Some(name) = &obs.step_name {
                if name.is_empty() || name.contains('.') || name.contains('\0') {
                    invalid.get_or_insert(format!("step name {name:?} cannot be a document key"));
                    continue;
                }
            }
            if let Some(row) = AttemptRow::from_observation(obs) {
                attempts.push(Self::attempt_update(&row)?);
            }
            snapshots.push(Self::snapshot_update(obs)?);
        }
        // Attempts first: a snapshot never points at a row that is missing for good.
        let a = self.run_updates(ATTEMPTS_COLLECTION, attempts).await;
        let s = self.run_updates(SNAPSHOTS_COLLECTION, snapshots).await;
        for r in [a, s] {
            match r {
                Err(Error::InvalidRecord(m)) => {
                    invalid.get_or_insert(m);
                }
                Err(e) => return Err(e),
                Ok(()) => {}
            }
        }
        invalid.map_or(Ok(()), |m| Err(Error::InvalidRecord(m)))
    }

    async fn put_snapshot(&self, snapshot: &Snapshot) -> Result<bool> {
        let set = to_doc(snapshot)?;
        let r = self
            .snapshots()
            .update_one(
                doc! { "_id": &snapshot.biz_key, "revision": { "$lte": snapshot.revision as i64 } },
                doc! { "$set": set },
            )
            .upsert(true)
            .await;
        match r {
            Ok(_) => Ok(true),
            Err(e) if is_duplicate(&e) => Ok(false),
            Err(e) => Err(map_err(e)),
        }
    }

    async fn snapshot(&self, biz_key: &str) -> Result<Option<Snapshot>> {
        let d = self.snapshots().find_one(doc! { "_id": biz_key }).await.map_err(map_err)?;
        d.map(|d| mongodb::bson::from_document(d).map_err(|e| Error::unavailable_with(format!("decode: {e}"), e)))
            .transpose()
    }

    async fn find_snapshots(&self, q: &SnapshotQuery) -> Result<Vec<Snapshot>> {
        q.validate()?;
        let mut filter = Document::new();
        if let Some(t) = &q.workflow_type {
            filter.insert("workflow_type", t);
        }
        if let Some(s) = &q.status {
            filter.insert("status", bson_str(s)?);
        }
        if let Some(n) = &q.step_name {
            filter.insert("step_name", n);
        }
        if let Some(w) = &q.waiting_on {
            filter.insert("wait_signal", w);
        }
        if let Some(p) = &q.biz_key_prefix {
            let mut range = doc! { "$gte": p };
            if let Some(upper) = prefix_upper_bound(p) {
                range.insert("$lt", upper);
            }
            filter.insert("_id", range);
        }
        window(&mut filter, q.updated_from, q.updated_to);
        cursor(&mut filter, "updated_at", q.before.as_ref());
        self.find(self.snapshots(), filter, q.limit).await
    }

    async fn find_attempts(&self, q: &AttemptQuery) -> Result<Vec<AttemptRow>> {
        let mut filter = Document::new();
        if let Some(b) = &q.biz_key {
            filter.insert("biz_key", b);
        }
        if let Some(t) = &q.workflow_type {
            filter.insert("workflow_type", t);
        }
        if let Some(n) = &q.step_name {
            filter.insert("step_name", n);
        }
        if let Some(o) = &q.outcome {
            filter.insert("outcome", bson_str(o)?);
        }
        window(&mut filter, q.updated_from, q.updated_to);
        self.find(self.attempts(), filter, q.limit).await
    }

    async fn append_audit(&self, entry: &AuditEntry) -> Result<()> {
        entry.validate()?;
        match self.audit().insert_one(audit_doc(entry)?).await {
            Ok(_) => Ok(()),
            // The id is there already: the first entry is kept.
            Err(e) if is_duplicate(&e) => Ok(()),
            Err(e) => Err(map_err(e)),
        }
    }

    async fn find_audit(&self, q: &AuditQuery) -> Result<Vec<AuditEntry>> {
        q.validate()?;
        let mut filter = Document::new();
        for (field, value) in [("actor", &q.actor), ("action", &q.action), ("target", &q.target)] {
            if let Some(v) = value {
                filter.insert(field, v);
            }
        }
        cursor(&mut filter, "at", q.before.as_ref());
        let docs: Vec<Document> = self.find_sorted(self.audit(), filter, doc! { "at": -1, "_id": 1 }, q.limit).await?;
        docs.into_iter().map(audit_entry).collect()
    }

    async fn purge_audit(&self, before: Instant, limit: usize) -> Result<u64> {
        check_audit_purge_limit(limit)?;
        let old = doc! { "at": { "$lt": before.as_millis() } };
        let ids = oldest_ids(&self.audit(), old.clone(), "at", limit).await?;
        if ids.is_empty() {
            return Ok(0);
        }
        let mut filter = old;
        filter.insert("_id", doc! { "$in": ids });
        let r = self.audit().delete_many(filter).await.map_err(map_err)?;
        Ok(r.deleted_count)
    }

    async fn purge_finished(&self, before: Instant, limit: usize) -> Result<u64> {
        check_finished_purge_limit(limit)?;
        let statuses = FINISHED_STATUSES.iter().map(bson_str).collect::<Result<Vec<Bson>>>()?;
        // The `status_updated` index serves the selection.
        let old = doc! { "status": { "$in": statuses }, "updated_at": { "$lt": before.as_millis() } };
        let keys = oldest_ids(&self.snapshots(), old.clone(), "updated_at", limit).await?;
        if keys.is_empty() {
            return Ok(0);
        }
        // Attempt rows first (`biz_run` index), then the snapshots still finished and old.
        self.attempts().delete_many(doc! { "biz_key": { "$in": keys.clone() } }).await.map_err(map_err)?;
        let mut filter = old;
        filter.insert("_id", doc! { "$in": keys });
        let r = self.snapshots().delete_many(filter).await.map_err(map_err)?;
        Ok(r.deleted_count)
    }
}
