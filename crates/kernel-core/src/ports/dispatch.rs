use crate::domain::{Instant, Priority};
use crate::error::{Error, Result};
use crate::id::{FencingToken, LeaseToken, ObjectId};
use crate::validate;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where a dispatch intent stands (K-11.1). It says whether the workflow is reliably
/// registered, not how the workflow runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DispatchStatus {
    /// Accepted, not yet confirmed registered.
    Pending,
    /// A recovery dispatcher holds the per-object lease.
    Processing,
    /// StartOrResume succeeded and was confirmed.
    Dispatched,
}

/// The `workflow_dispatch` intent a business object carries (K-11.1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DispatchIntent {
    /// Workflow type to start.
    pub workflow_type: String,
    /// Permanent idempotency key of the workflow (one instance per key, K-3.2).
    pub biz_key: String,
    /// Whether the workflow is reliably registered yet, and who may try (K-11.1).
    pub status: DispatchStatus,
    /// The business round (K-12); every conditional write of the intent compares it.
    pub fencing_token: FencingToken,
    /// The exact input snapshot taken at the entry; `None` on objects accepted before
    /// snapshots existed (a conservative input is then built from stable fields).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// The ready lane the workflow starts in (K-13).
    pub priority: Priority,
    /// The recovery lease holder (processing only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_token: Option<LeaseToken>,
    /// End of the recovery lease (processing only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_until: Option<Instant>,
    /// Earliest time a recovery dispatcher may take it (pending only).
    pub next_attempt_time: Instant,
}

impl DispatchIntent {
    /// The K-2.0 check of an intent before it is written (`accept`, `retry_failed`):
    /// `workflow_type`, `biz_key` and `fencing_token` follow the identifier rule and the
    /// input snapshot is at most `payload_bytes_max` serialized bytes.
    pub fn validate(&self, payload_bytes_max: usize) -> Result<()> {
        let DispatchIntent {
            workflow_type,
            biz_key,
            status: _,
            fencing_token,
            input,
            priority: _,
            lease_token: _,
            lease_until: _,
            next_attempt_time: _,
        } = self;
        validate::identifier("workflow_type", workflow_type)?;
        validate::identifier("biz_key", biz_key)?;
        validate::identifier("fencing_token", fencing_token.as_str())?;
        if let Some(input) = input {
            validate::payload("workflow_dispatch.input", input, payload_bytes_max)?;
        }
        Ok(())
    }

    /// A fresh pending intent for round `fencing_token`.
    pub fn pending(
        workflow_type: &str,
        biz_key: &str,
        fencing_token: &FencingToken,
        input: Value,
        priority: Priority,
        next_attempt_time: Instant,
    ) -> Self {
        DispatchIntent {
            workflow_type: workflow_type.to_string(),
            biz_key: biz_key.to_string(),
            status: DispatchStatus::Pending,
            fencing_token: fencing_token.clone(),
            input: Some(input),
            priority,
            lease_token: None,
            lease_until: None,
            next_attempt_time,
        }
    }
}

/// A business object as the outbox sees it: its id, the business status field, the
/// intent, and the rest of the user's fields as opaque JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DispatchRecord {
    /// The business object's id (its primary key in the business collection).
    pub object_id: ObjectId,
    /// Value of the configured business status field (`None` when the object has none).
    pub business_status: Option<String>,
    /// The dispatch intent, if the object has one (objects written outside the outbox may not).
    pub dispatch: Option<DispatchIntent>,
    /// The user's fields (read-only for the kernel; used to build legacy inputs).
    pub fields: Value,
}

/// The arguments of [`DispatchOutbox::accept`], borrowed, with the one check every outbox
/// adapter runs before writing.
#[derive(Debug, Clone, Copy)]
pub struct OutboxAccept<'a> {
    /// The new business object's id (K-2.0 identifier).
    pub object_id: &'a ObjectId,
    /// The user's fields: a JSON object whose keys are document keys.
    pub fields: &'a Value,
    /// The business status the object starts in (K-2.0 identifier).
    pub initial_status: &'a str,
    /// The pending intent written with the object.
    pub intent: &'a DispatchIntent,
}

impl OutboxAccept<'_> {
    /// The K-2.0 check of an accept: `object_id` and `initial_status` are identifiers;
    /// `fields` is a JSON object whose top-level keys are document keys
    /// ([`validate::key_name`]: no `$` prefix, no `.`) and whose serialized size is at most
    /// `payload_bytes_max`; the intent passes [`DispatchIntent::validate`]. Every outbox
    /// adapter calls it in `accept`; a refusal is
    /// [`Error::InvalidInput`] and nothing is written. (Keys an adapter reserves for its
    /// own schema are refused by that adapter in addition.)
    ///
    /// ```
    /// use kernel_core::domain::{Instant, Priority};
    /// use kernel_core::ports::{OutboxAccept, DispatchIntent};
    /// use kernel_core::validate::STORE_PAYLOAD_BYTES_MAX;
    /// let intent = DispatchIntent::pending("summary", "biz:1", &"f1".into(), serde_json::json!({}), Priority::P2, Instant::ZERO);
    /// let fields = serde_json::json!({"title": "x"});
    /// let id = "doc-1".into();
    /// let req = OutboxAccept { object_id: &id, fields: &fields, initial_status: "new", intent: &intent };
    /// assert!(req.validate(STORE_PAYLOAD_BYTES_MAX).is_ok());
    /// let bad = serde_json::json!({"$set": 1});
    /// assert!(OutboxAccept { fields: &bad, ..req }.validate(STORE_PAYLOAD_BYTES_MAX).is_err());
    /// ```
    pub fn validate(&self, payload_bytes_max: usize) -> Result<()> {
        let OutboxAccept { object_id, fields, initial_status, intent } = *self;
        validate::identifier("object_id", object_id.as_str())?;
        validate::identifier("initial_status", initial_status)?;
        let Value::Object(map) = fields else { return Err(Error::invalid("fields", "must be a JSON object")) };
        for k in map.keys() {
            validate::key_name("fields", k)?;
        }
        validate::payload("fields", fields, payload_bytes_max)?;
        intent.validate(payload_bytes_max)
    }
}

/// Result of an accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcceptOutcome {
    /// Object and intent written in one atomic write.
    Accepted,
    /// An object with that id exists; nothing written.
    Exists,
}

/// The business collection's dispatch outbox (K-11). Every write is one atomic
/// conditional update of one business object.
#[async_trait::async_trait]
pub trait DispatchOutbox: Send + Sync + 'static {
    /// Accept a request: insert the business object with `fields`, the business status
    /// `initial_status` and a pending `intent`.
    ///
    /// # Contract
    /// One atomic insert of fields + status + intent, unique on `object_id`; an existing
    /// object is left untouched (`Exists`). A request refused by
    /// [`OutboxAccept::validate`] (K-2.0, payload limit) is
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) and nothing is written.
    async fn accept(
        &self,
        object_id: &ObjectId,
        fields: Value,
        initial_status: &str,
        intent: DispatchIntent,
    ) -> Result<AcceptOutcome>;

    /// Read one object.
    ///
    /// # Contract
    /// Read-only; the object as last written, or `None` when no object has that id.
    async fn get(&self, object_id: &ObjectId) -> Result<Option<DispatchRecord>>;

    /// Realtime confirm (K-11.2).
    ///
    /// # Contract
    /// CAS `fencing_token = f AND status = pending` → `dispatched`. Returns whether it
    /// changed; on a miss the caller re-reads.
    async fn confirm_dispatched(&self, object_id: &ObjectId, fencing_token: &FencingToken) -> Result<bool>;

    /// Leave a pending intent for later (StartOrResume did not activate, K-5 failing).
    ///
    /// # Contract
    /// CAS `fencing_token = f AND status = pending` → `next_attempt_time = at`.
    async fn defer_pending(&self, object_id: &ObjectId, fencing_token: &FencingToken, at: Instant) -> Result<bool>;

    /// Take the per-object recovery lease (K-11.3).
    ///
    /// # Contract
    /// CAS `(status = pending AND next_attempt_time <= now) OR (status = processing AND
    /// lease_until < now)` → `processing`, `lease_token`, `lease_until`. Returns the
    /// object after the write, or `None` when the guard missed.
    async fn try_lease(
        &self,
        object_id: &ObjectId,
        now: Instant,
        lease_token: &LeaseToken,
        lease_until: Instant,
    ) -> Result<Option<DispatchRecord>>;

    /// Renew the recovery lease.
    ///
    /// # Contract
    /// CAS `(fencing_token = f, status = processing, lease_token = d)` → `lease_until`.
    /// A miss cancels the dispatch.
    async fn renew_lease(
        &self,
        object_id: &ObjectId,
        fencing_token: &FencingToken,
        lease_token: &LeaseToken,
        lease_until: Instant,
    ) -> Result<bool>;

    /// Confirm after a successful StartOrResume by the lease holder.
    ///
    /// # Contract
    /// CAS `(f, processing, d)` → `dispatched`, lease fields unset.
    async fn confirm_leased(
        &self,
        object_id: &ObjectId,
        fencing_token: &FencingToken,
        lease_token: &LeaseToken,
    ) -> Result<bool>;

    /// Give a leased intent back for a later attempt.
    ///
    /// # Contract
    /// CAS `(f, processing, d)` → `pending`, lease fields unset, `next_attempt_time = at`.
    async fn revert_leased(
        &self,
        object_id: &ObjectId,
        fencing_token: &FencingToken,
        lease_token: &LeaseToken,
        at: Instant,
    ) -> Result<bool>;

    /// Objects a recovery dispatcher may take now: pending and due, or processing with an
    /// expired lease; ordered by `object_id`, strictly after `after`.
    ///
    /// # Contract
    /// Read-only, at most `limit` ids.
    async fn scan_due(&self, now: Instant, after: Option<&ObjectId>, limit: usize) -> Result<Vec<(ObjectId, Instant)>>;

    /// Install a new round after a failure (K-11.4).
    ///
    /// # Contract
    /// CAS `business_status = failed AND fencing_token = prev` → business status
    /// `initial_status`, the intent replaced wholesale by `next`, the previous error field
    /// cleared. Returns whether this call installed it (a concurrent loser gets `false`).
    /// An intent refused by [`DispatchIntent::validate`] is
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) and nothing is written.
    async fn retry_failed(
        &self,
        object_id: &ObjectId,
        prev_fencing_token: &FencingToken,
        next: DispatchIntent,
        initial_status: &str,
    ) -> Result<bool>;

    /// A fenced business write (K-11.5): set `fields` (top-level or dotted paths of the
    /// user's document) and optionally the business status, only while the round is `f`.
    ///
    /// # Contract
    /// One conditional update on `fencing_token = f`; returns whether a document changed.
    /// The intent's fields cannot be written through it.
    async fn fenced_update(
        &self,
        object_id: &ObjectId,
        fencing_token: &FencingToken,
        fields: Value,
        business_status: Option<&str>,
    ) -> Result<bool>;

    /// The distributed mutex of the low-frequency scan (a lease document in the store).
    ///
    /// # Contract
    /// Atomic: take `name` for `holder` until `until` when it is free, expired, or already
    /// held by `holder`. Returns whether `holder` holds it now.
    async fn try_lock(&self, name: &str, holder: &str, now: Instant, until: Instant) -> Result<bool>;
}

/// `dyn DispatchOutbox`.
pub type DynOutbox = dyn DispatchOutbox;

/// The recovery dispatcher's candidate index (K-11.3): identity and due time only, never
/// tokens. Losing it costs latency only: the store scan refills it.
#[async_trait::async_trait]
pub trait DispatchCandidates: Send + Sync + 'static {
    /// Add or move a candidate.
    ///
    /// # Contract
    /// Atomic upsert: one entry per object, its due time replaced. Best effort for the
    /// caller: a lost entry costs latency only (the store scan refills the index).
    async fn add(&self, object_id: &ObjectId, due: Instant) -> Result<()>;

    /// Remove and return up to `max` candidates due at `now`.
    ///
    /// # Contract
    /// Atomic: a popped candidate is gone (two dispatchers never pop the same one).
    async fn pop_due(&self, now: Instant, max: usize) -> Result<Vec<ObjectId>>;
}

/// `dyn DispatchCandidates`.
pub type DynCandidates = dyn DispatchCandidates;
