//! The dispatch outbox on the user's business collection (K-11, K-12).
//!
//! The adapter knows only what it is told about the business schema: the collection, the
//! field that holds the intent (default `workflow_dispatch`), the business status field
//! (default `business_status`), the previous-error field a new round clears (default
//! `previous_error`) and the failed status (default `failed`). Objects are addressed by
//! `_id` (a string). Every write is one `updateOne`/`findAndModify`/`insertOne`:
//!
//! | call | filter (besides `_id`) | update |
//! |---|---|---|
//! | accept | — (insert, unique `_id`) | whole document |
//! | confirm_dispatched | `d.fencing_token = f, d.status = pending` | `$set d.status = dispatched` |
//! | defer_pending | `d.fencing_token = f, d.status = pending` | `$set d.next_attempt_time` |
//! | try_lease | `$or: [{d.status: pending, d.next_attempt_time ≤ now}, {d.status: processing, d.lease_until < now}]` | `$set d.status = processing, d.lease_token, d.lease_until` |
//! | renew_lease | `d.fencing_token = f, d.status = processing, d.lease_token = l` | `$set d.lease_until` |
//! | confirm_leased | same | `$set d.status = dispatched`, `$unset` lease |
//! | revert_leased | same | `$set d.status = pending, d.next_attempt_time`, `$unset` lease |
//! | retry_failed | `status = failed, d.fencing_token = prev` | `$set status = initial, d = next`, `$unset previous_error` |
//! | fenced_update | `d.fencing_token = f` | `$set <user paths>[, status]` |
//!
//! (`d` is the intent field.) The scan mutex lives in `<collection>_locks`:
//! `findAndModify({_id: name, $or: [{holder}, {until ≤ now}]}, {$set: {holder, until}}, upsert)`,
//! where a duplicate-key answer means another holder has it.

use crate::error::{self, map, Op};
use crate::{codec, MongoConfig};
use futures::TryStreamExt;
use kernel_core::domain::{Instant, Priority};
use kernel_core::ports::*;
use kernel_core::{validate, Error, FencingToken, LeaseToken, ObjectId, Result};
use mongodb::bson::{doc, Bson, Document, RawDocumentBuf};
use mongodb::options::{CollectionOptions, IndexOptions, ReturnDocument};
use mongodb::{Collection, Database, IndexModel};
use serde_json::Value;

/// Where the outbox lives in the user's business collection.
#[derive(Debug, Clone)]
pub struct OutboxSchema {
    /// Business collection.
    pub collection: String,
    /// Field holding the intent.
    pub dispatch_field: String,
    /// Field holding the business status.
    pub status_field: String,
    /// Field a new round clears.
    pub error_field: String,
    /// Business status that allows a new round.
    pub failed_status: String,
}

impl Default for OutboxSchema {
    fn default() -> Self {
        OutboxSchema {
            collection: "business_objects".into(),
            dispatch_field: "workflow_dispatch".into(),
            status_field: "business_status".into(),
            error_field: "previous_error".into(),
            failed_status: "failed".into(),
        }
    }
}

/// A dotted field path, by the one K-2.0 rule of every store. MongoDB reads a dotted path
/// segment by segment with no escapes, so an admitted segment (no `.`, no `$` prefix) is
/// taken literally: `note\u0041` is its own field.
fn path(field: &str, p: &str) -> Result<()> {
    validate::field_path(field, p).map(drop)
}

impl OutboxSchema {
    fn validate(&self) -> Result<()> {
        validate::key_name("collection", &self.collection)?;
        validate::key_name("dispatch_field", &self.dispatch_field)?;
        path("status_field", &self.status_field)?;
        path("error_field", &self.error_field)?;
        validate::identifier("failed_status", &self.failed_status)?;
        if self.status_field.split('.').next() == Some(self.dispatch_field.as_str()) {
            return Err(Error::invalid("status_field", "must not live inside the intent"));
        }
        Ok(())
    }
    fn d(&self, f: &str) -> String {
        format!("{}.{f}", self.dispatch_field)
    }
}

/// [`DispatchOutbox`] on a MongoDB business collection.
#[derive(Debug, Clone)]
pub struct MongoOutbox {
    coll: Collection<RawDocumentBuf>,
    locks: Collection<Document>,
    schema: OutboxSchema,
    config: MongoConfig,
}

impl MongoOutbox {
    /// Open on `db` with `schema` and create the scan indexes (idempotent).
    pub async fn open(db: &Database, schema: OutboxSchema, config: MongoConfig) -> Result<Self> {
        schema.validate()?;
        let opts = CollectionOptions::builder()
            .write_concern(config.write_concern.clone())
            .selection_criteria(config.selection_criteria())
            .build();
        let o = MongoOutbox {
            coll: db.collection_with_options(&schema.collection, opts.clone()),
            locks: db.collection_with_options(&format!("{}_locks", schema.collection), opts),
            schema,
            config,
        };
        // Serve the recovery scan: due pending intents and expired processing leases.
        let models = vec![
            IndexModel::builder()
                .keys(doc! { o.schema.d("status"): 1, o.schema.d("next_attempt_time"): 1 })
                .options(IndexOptions::builder().name("dispatch_status_next_attempt".to_string()).build())
                .build(),
            IndexModel::builder()
                .keys(doc! { o.schema.d("status"): 1, o.schema.d("lease_until"): 1 })
                .options(IndexOptions::builder().name("dispatch_status_lease_until".to_string()).build())
                .build(),
        ];
        o.coll.create_indexes(models).await.map_err(|e| map(Op::Write, "create outbox indexes", e))?;
        Ok(o)
    }

    fn intent_doc(&self, i: &DispatchIntent) -> Result<Document> {
        i.validate(self.config.limits.payload_bytes_max)?;
        let DispatchIntent {
            workflow_type,
            biz_key,
            status,
            fencing_token,
            input,
            priority,
            lease_token,
            lease_until,
            next_attempt_time,
        } = i;
        let mut d = doc! {
            "workflow_type": workflow_type.as_str(),
            "biz_key": biz_key.as_str(),
            "status": status_str(*status),
            "fencing_token": fencing_token.as_str(),
            "priority": *priority as i32,
            "next_attempt_time": codec::dt(*next_attempt_time),
        };
        if let Some(input) = input {
            d.insert("input", codec::json_to_bson("workflow_dispatch.input", input)?);
        }
        if let Some(t) = lease_token {
            d.insert("lease_token", t.as_str());
        }
        if let Some(u) = lease_until {
            d.insert("lease_until", codec::dt(*u));
        }
        Ok(d)
    }

    fn record_of(&self, raw: &RawDocumentBuf) -> Result<DispatchRecord> {
        let mut d = codec::unraw(raw)?;
        let object_id = match d.remove("_id") {
            Some(Bson::String(s)) => ObjectId::from(s),
            other => return Err(codec::corrupt("_id", format_args!("expected a string, got {other:?}"))),
        };
        let dispatch = match d.remove(&self.schema.dispatch_field) {
            Some(Bson::Document(i)) => Some(intent_of(&i)?),
            None | Some(Bson::Null) => None,
            Some(other) => return Err(codec::corrupt("workflow_dispatch", format_args!("{other:?}"))),
        };
        let business_status = take_path(&mut d, &self.schema.status_field).and_then(|b| b.as_str().map(str::to_string));
        let fields = codec::bson_to_json("fields", &Bson::Document(d))?;
        Ok(DispatchRecord { object_id, business_status, dispatch, fields })
    }

    async fn update(&self, what: &str, filter: Document, update: Document) -> Result<bool> {
        let r = self.coll.update_one(filter, update).await.map_err(|e| map(Op::Write, what, e))?;
        Ok(r.matched_count == 1)
    }

    fn leased_filter(&self, object_id: &str, f: &str, lease: &str) -> Result<Document> {
        validate::identifier("object_id", object_id)?;
        validate::identifier("fencing_token", f)?;
        validate::identifier("lease_token", lease)?;
        Ok(doc! {
            "_id": object_id,
            self.schema.d("fencing_token"): f,
            self.schema.d("status"): "processing",
            self.schema.d("lease_token"): lease,
        })
    }

    fn pending_filter(&self, object_id: &str, f: &str) -> Result<Document> {
        validate::identifier("object_id", object_id)?;
        validate::identifier("fencing_token", f)?;
        Ok(doc! { "_id": object_id, self.schema.d("fencing_token"): f, self.schema.d("status"): "pending" })
    }

    fn due_filter(&self, now: Instant) -> Document {
        doc! { "$or": [
            { self.schema.d("status"): "pending", self.schema.d("next_attempt_time"): { "$lte": codec::dt(now) } },
            { self.schema.d("status"): "processing", self.schema.d("lease_until"): { "$lt": codec::dt(now) } },
        ] }
    }
}

fn take_path(d: &mut Document, p: &str) -> Option<Bson> {
    match p.split_once('.') {
        None => d.remove(p),
        Some((head, rest)) => match d.get_mut(head) {
            Some(Bson::Document(child)) => take_path(child, rest),
            _ => None,
        },
    }
}

fn status_str(s: DispatchStatus) -> &'static str {
    match s {
        DispatchStatus::Pending => "pending",
        DispatchStatus::Processing => "processing",
        DispatchStatus::Dispatched => "dispatched",
    }
}

fn intent_of(d: &Document) -> Result<DispatchIntent> {
    let s = |k: &str| -> Result<String> {
        d.get_str(k).map(str::to_string).map_err(|e| codec::corrupt_by(&format!("workflow_dispatch.{k}"), e))
    };
    let t = |k: &str| -> Result<Option<Instant>> {
        match d.get(k) {
            None | Some(Bson::Null) => Ok(None),
            Some(Bson::DateTime(x)) => Ok(Some(Instant::from_millis(x.timestamp_millis()))),
            Some(other) => Err(codec::corrupt(&format!("workflow_dispatch.{k}"), format_args!("{other:?}"))),
        }
    };
    let status = match s("status")?.as_str() {
        "pending" => DispatchStatus::Pending,
        "processing" => DispatchStatus::Processing,
        "dispatched" => DispatchStatus::Dispatched,
        other => return Err(codec::corrupt("workflow_dispatch.status", other)),
    };
    let priority = match d.get("priority") {
        Some(Bson::Int32(p)) => *p as i64,
        Some(Bson::Int64(p)) => *p,
        other => return Err(codec::corrupt("workflow_dispatch.priority", format_args!("{other:?}"))),
    };
    Ok(DispatchIntent {
        workflow_type: s("workflow_type")?,
        biz_key: s("biz_key")?,
        status,
        fencing_token: s("fencing_token")?.into(),
        input: d.get("input").map(|b| codec::bson_to_json("workflow_dispatch.input", b)).transpose()?,
        priority: Priority::try_from(priority as u8).map_err(|e| codec::corrupt("workflow_dispatch.priority", e))?,
        lease_token: d.get_str("lease_token").ok().map(LeaseToken::from),
        lease_until: t("lease_until")?,
        next_attempt_time: t("next_attempt_time")?
            .ok_or_else(|| codec::corrupt("workflow_dispatch.next_attempt_time", "missing"))?,
    })
}

#[async_trait::async_trait]
impl DispatchOutbox for MongoOutbox {
    async fn accept(
        &self,
        object_id: &ObjectId,
        fields: Value,
        initial_status: &str,
        intent: DispatchIntent,
    ) -> Result<AcceptOutcome> {
        OutboxAccept { object_id, fields: &fields, initial_status, intent: &intent }
            .validate(self.config.limits.payload_bytes_max)?;
        let object_id = object_id.as_str();
        let Value::Object(map_) = &fields else { return Err(Error::invalid("fields", "must be a JSON object")) };
        for k in map_.keys() {
            // Keys this schema reserves, on top of the shared rule.
            if k == "_id"
                || *k == self.schema.dispatch_field
                || self.schema.status_field.split('.').next() == Some(k.as_str())
            {
                return Err(Error::invalid("fields", format_args!("`{k}` is reserved for the outbox")));
            }
        }
        let Bson::Document(mut d) = codec::json_to_bson("fields", &fields)? else { unreachable!("object") };
        d.insert("_id", object_id);
        d.insert(self.schema.dispatch_field.clone(), self.intent_doc(&intent)?);
        set_path(&mut d, &self.schema.status_field, Bson::String(initial_status.into()));
        match self.coll.insert_one(codec::raw("business object", &d)?).await {
            Ok(_) => Ok(AcceptOutcome::Accepted),
            Err(e) if error::is_duplicate_key(&e) => Ok(AcceptOutcome::Exists),
            Err(e) => Err(map(Op::Write, "accept", e)),
        }
    }

    async fn get(&self, object_id: &ObjectId) -> Result<Option<DispatchRecord>> {
        let object_id = object_id.as_str();
        validate::identifier("object_id", object_id)?;
        let d = self.coll.find_one(doc! { "_id": object_id }).await.map_err(|e| map(Op::Read, "get object", e))?;
        d.as_ref().map(|r| self.record_of(r)).transpose()
    }

    async fn confirm_dispatched(&self, object_id: &ObjectId, f: &FencingToken) -> Result<bool> {
        let (object_id, f) = (object_id.as_str(), f.as_str());
        let filter = self.pending_filter(object_id, f)?;
        self.update("confirm dispatched", filter, doc! { "$set": { self.schema.d("status"): "dispatched" } }).await
    }

    async fn defer_pending(&self, object_id: &ObjectId, f: &FencingToken, at: Instant) -> Result<bool> {
        let (object_id, f) = (object_id.as_str(), f.as_str());
        let filter = self.pending_filter(object_id, f)?;
        self.update("defer intent", filter, doc! { "$set": { self.schema.d("next_attempt_time"): codec::dt(at) } })
            .await
    }

    async fn try_lease(
        &self,
        object_id: &ObjectId,
        now: Instant,
        lease: &LeaseToken,
        until: Instant,
    ) -> Result<Option<DispatchRecord>> {
        let (object_id, lease) = (object_id.as_str(), lease.as_str());
        validate::identifier("object_id", object_id)?;
        validate::identifier("lease_token", lease)?;
        let mut filter = self.due_filter(now);
        filter.insert("_id", object_id);
        let update = doc! { "$set": {
            self.schema.d("status"): "processing",
            self.schema.d("lease_token"): lease,
            self.schema.d("lease_until"): codec::dt(until),
        } };
        let d = self
            .coll
            .find_one_and_update(filter, update)
            .return_document(ReturnDocument::After)
            .await
            .map_err(|e| map(Op::Write, "take dispatch lease", e))?;
        d.as_ref().map(|r| self.record_of(r)).transpose()
    }

    async fn renew_lease(
        &self,
        object_id: &ObjectId,
        f: &FencingToken,
        lease: &LeaseToken,
        until: Instant,
    ) -> Result<bool> {
        let (object_id, f, lease) = (object_id.as_str(), f.as_str(), lease.as_str());
        let filter = self.leased_filter(object_id, f, lease)?;
        self.update("renew dispatch lease", filter, doc! { "$set": { self.schema.d("lease_until"): codec::dt(until) } })
            .await
    }

    async fn confirm_leased(&self, object_id: &ObjectId, f: &FencingToken, lease: &LeaseToken) -> Result<bool> {
        let (object_id, f, lease) = (object_id.as_str(), f.as_str(), lease.as_str());
        let filter = self.leased_filter(object_id, f, lease)?;
        let update = doc! {
            "$set": { self.schema.d("status"): "dispatched" },
            "$unset": { self.schema.d("lease_token"): "", self.schema.d("lease_until"): "" },
        };
        self.update("confirm leased intent", filter, update).await
    }

    async fn revert_leased(
        &self,
        object_id: &ObjectId,
        f: &FencingToken,
        lease: &LeaseToken,
        at: Instant,
    ) -> Result<bool> {
        let (object_id, f, lease) = (object_id.as_str(), f.as_str(), lease.as_str());
        let filter = self.leased_filter(object_id, f, lease)?;
        let update = doc! {
            "$set": { self.schema.d("status"): "pending", self.schema.d("next_attempt_time"): codec::dt(at) },
            "$unset": { self.schema.d("lease_token"): "", self.schema.d("lease_until"): "" },
        };
        self.update("revert leased intent", filter, update).await
    }

    async fn scan_due(&self, now: Instant, after: Option<&ObjectId>, limit: usize) -> Result<Vec<(ObjectId, Instant)>> {
        let after = after.map(ObjectId::as_str);
        if limit == 0 {
            return Ok(vec![]);
        }
        let mut filter = self.due_filter(now);
        if let Some(a) = after {
            validate::identifier("after", a)?;
            filter.insert("_id", doc! { "$gt": a });
        }
        let cursor = self
            .coll
            .find(filter)
            .sort(doc! { "_id": 1 })
            .limit(limit.min(self.config.scan_page_max) as i64)
            .await
            .map_err(|e| map(Op::Read, "scan due intents", e))?;
        let docs: Vec<RawDocumentBuf> = cursor.try_collect().await.map_err(|e| map(Op::Read, "scan due intents", e))?;
        docs.iter()
            .map(|r| {
                let rec = self.record_of(r)?;
                let due = rec.dispatch.as_ref().map_or(now, |d| match d.status {
                    DispatchStatus::Pending => d.next_attempt_time,
                    _ => now,
                });
                Ok((rec.object_id, due))
            })
            .collect()
    }

    async fn retry_failed(
        &self,
        object_id: &ObjectId,
        prev: &FencingToken,
        next: DispatchIntent,
        initial_status: &str,
    ) -> Result<bool> {
        let (object_id, prev) = (object_id.as_str(), prev.as_str());
        validate::identifier("object_id", object_id)?;
        validate::identifier("fencing_token", prev)?;
        validate::identifier("initial_status", initial_status)?;
        let filter = doc! {
            "_id": object_id,
            self.schema.status_field.as_str(): self.schema.failed_status.as_str(),
            self.schema.d("fencing_token"): prev,
        };
        let update = doc! {
            "$set": { self.schema.status_field.as_str(): initial_status, self.schema.dispatch_field.as_str(): self.intent_doc(&next)? },
            "$unset": { self.schema.error_field.as_str(): "" },
        };
        self.update("install new round", filter, update).await
    }

    async fn fenced_update(
        &self,
        object_id: &ObjectId,
        f: &FencingToken,
        fields: Value,
        status: Option<&str>,
    ) -> Result<bool> {
        let (object_id, f) = (object_id.as_str(), f.as_str());
        validate::identifier("object_id", object_id)?;
        validate::identifier("fencing_token", f)?;
        let Value::Object(m) = &fields else { return Err(Error::invalid("fields", "must be a JSON object")) };
        let mut set = Document::new();
        for (k, v) in m {
            path("fields", k)?;
            let head = k.split('.').next().unwrap_or_default();
            if head == "_id" || head == self.schema.dispatch_field || k == &self.schema.status_field {
                return Err(Error::invalid("fields", format_args!("`{k}` is not a business field")));
            }
            validate::payload("fields", v, self.config.limits.payload_bytes_max)?;
            set.insert(k.clone(), codec::json_to_bson("fields", v)?);
        }
        if let Some(s) = status {
            validate::identifier("business_status", s)?;
            set.insert(self.schema.status_field.clone(), s);
        }
        if set.is_empty() {
            return Ok(false);
        }
        let filter = doc! { "_id": object_id, self.schema.d("fencing_token"): f };
        self.update("fenced business write", filter, doc! { "$set": set }).await
    }

    async fn try_lock(&self, name: &str, holder: &str, now: Instant, until: Instant) -> Result<bool> {
        validate::identifier("lock name", name)?;
        validate::identifier("lock holder", holder)?;
        let filter = doc! { "_id": name, "$or": [ { "holder": holder }, { "until": { "$lte": codec::dt(now) } } ] };
        let update = doc! { "$set": { "holder": holder, "until": codec::dt(until) } };
        match self.locks.find_one_and_update(filter, update).upsert(true).return_document(ReturnDocument::After).await {
            Ok(d) => Ok(d.is_some()),
            // The filter missed an existing lock and the upsert's insert collided: held.
            Err(e) if error::is_duplicate_key(&e) => Ok(false),
            Err(e) => Err(map(Op::Write, "take scan lock", e)),
        }
    }
}

fn set_path(d: &mut Document, p: &str, v: Bson) {
    match p.split_once('.') {
        None => {
            d.insert(p, v);
        }
        Some((head, rest)) => {
            if !matches!(d.get(head), Some(Bson::Document(_))) {
                d.insert(head, Document::new());
            }
            if let Some(Bson::Document(child)) = d.get_mut(head) {
                set_path(child, rest, v);
            }
        }
    }
}
