use crate::error::Result;
use crate::model::{Millis, Priority};
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
    /// Pending, processing or dispatched.
    pub status: DispatchStatus,
    /// The business round (K-12).
    pub fencing_token: String,
    /// The exact input snapshot taken at the entry; `None` on objects accepted before
    /// snapshots existed (a conservative input is then built from stable fields).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// Lane of the workflow.
    pub priority: Priority,
    /// The recovery lease holder (processing only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_token: Option<String>,
    /// End of the recovery lease (processing only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_until: Option<Millis>,
    /// Earliest time a recovery dispatcher may take it (pending only).
    pub next_attempt_time: Millis,
}

impl DispatchIntent {
    /// A fresh pending intent for round `fencing_token`.
    pub fn pending(
        workflow_type: &str,
        biz_key: &str,
        fencing_token: &str,
        input: Value,
        priority: Priority,
        next_attempt_time: Millis,
    ) -> Self {
        DispatchIntent {
            workflow_type: workflow_type.to_string(),
            biz_key: biz_key.to_string(),
            status: DispatchStatus::Pending,
            fencing_token: fencing_token.to_string(),
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
    /// Business object id.
    pub object_id: String,
    /// Value of the configured business status field.
    pub business_status: Option<String>,
    /// The intent, if the object has one.
    pub dispatch: Option<DispatchIntent>,
    /// The user's fields (read-only for the kernel; used to build legacy inputs).
    pub fields: Value,
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
    /// object is left untouched (`Exists`).
    async fn accept(
        &self,
        object_id: &str,
        fields: Value,
        initial_status: &str,
        intent: DispatchIntent,
    ) -> Result<AcceptOutcome>;

    /// Read one object.
    async fn get(&self, object_id: &str) -> Result<Option<DispatchRecord>>;

    /// Realtime confirm (K-11.2).
    ///
    /// # Contract
    /// CAS `fencing_token = f AND status = pending` → `dispatched`. Returns whether it
    /// changed; on a miss the caller re-reads.
    async fn confirm_dispatched(&self, object_id: &str, fencing_token: &str) -> Result<bool>;

    /// Leave a pending intent for later (StartOrResume did not activate, K-5 failing).
    ///
    /// # Contract
    /// CAS `fencing_token = f AND status = pending` → `next_attempt_time = at`.
    async fn defer_pending(&self, object_id: &str, fencing_token: &str, at: Millis) -> Result<bool>;

    /// Take the per-object recovery lease (K-11.3).
    ///
    /// # Contract
    /// CAS `(status = pending AND next_attempt_time <= now) OR (status = processing AND
    /// lease_until < now)` → `processing`, `lease_token`, `lease_until`. Returns the
    /// object after the write, or `None` when the guard missed.
    async fn try_lease(
        &self,
        object_id: &str,
        now: Millis,
        lease_token: &str,
        lease_until: Millis,
    ) -> Result<Option<DispatchRecord>>;

    /// Renew the recovery lease.
    ///
    /// # Contract
    /// CAS `(fencing_token = f, status = processing, lease_token = d)` → `lease_until`.
    /// A miss cancels the dispatch.
    async fn renew_lease(
        &self,
        object_id: &str,
        fencing_token: &str,
        lease_token: &str,
        lease_until: Millis,
    ) -> Result<bool>;

    /// Confirm after a successful StartOrResume by the lease holder.
    ///
    /// # Contract
    /// CAS `(f, processing, d)` → `dispatched`, lease fields unset.
    async fn confirm_leased(&self, object_id: &str, fencing_token: &str, lease_token: &str) -> Result<bool>;

    /// Give a leased intent back for a later attempt.
    ///
    /// # Contract
    /// CAS `(f, processing, d)` → `pending`, lease fields unset, `next_attempt_time = at`.
    async fn revert_leased(&self, object_id: &str, fencing_token: &str, lease_token: &str, at: Millis) -> Result<bool>;

    /// Objects a recovery dispatcher may take now: pending and due, or processing with an
    /// expired lease; ordered by `object_id`, strictly after `after`.
    ///
    /// # Contract
    /// Read-only, at most `limit` ids.
    async fn scan_due(&self, now: Millis, after: Option<&str>, limit: usize) -> Result<Vec<(String, Millis)>>;

    /// Install a new round after a failure (K-11.4).
    ///
    /// # Contract
    /// CAS `business_status = failed AND fencing_token = prev` → business status
    /// `initial_status`, the intent replaced wholesale by `next`, the previous error field
    /// cleared. Returns whether this call installed it (a concurrent loser gets `false`).
    async fn retry_failed(
        &self,
        object_id: &str,
        prev_fencing_token: &str,
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
        object_id: &str,
        fencing_token: &str,
        fields: Value,
        business_status: Option<&str>,
    ) -> Result<bool>;

    /// The distributed mutex of the low-frequency scan (a lease document in the store).
    ///
    /// # Contract
    /// Atomic: take `name` for `holder` until `until` when it is free, expired, or already
    /// held by `holder`. Returns whether `holder` holds it now.
    async fn try_lock(&self, name: &str, holder: &str, now: Millis, until: Millis) -> Result<bool>;
}

/// `dyn DispatchOutbox`.
pub type DynOutbox = dyn DispatchOutbox;

/// The recovery dispatcher's candidate index (K-11.3): identity and due time only, never
/// tokens. Losing it costs latency only: the store scan refills it.
#[async_trait::async_trait]
pub trait DispatchCandidates: Send + Sync + 'static {
    /// Add or move a candidate.
    async fn add(&self, object_id: &str, due: Millis) -> Result<()>;

    /// Remove and return up to `max` candidates due at `now`.
    ///
    /// # Contract
    /// Atomic: a popped candidate is gone (two dispatchers never pop the same one).
    async fn pop_due(&self, now: Millis, max: usize) -> Result<Vec<String>>;
}

/// `dyn DispatchCandidates`.
pub type DynCandidates = dyn DispatchCandidates;
