use crate::domain::{DurationMs, Instant, Priority, ResumeKind, WorkflowInstance};
use crate::error::Result;
use crate::id::{ClaimToken, WorkflowId};
use crate::transition::{Guard, Transition};
use crate::validate;
use serde::{Deserialize, Serialize};

/// Result of [`WorkflowStore::create`].
#[derive(Debug, Clone, PartialEq)]
pub enum CreateOutcome {
    /// This call inserted the instance.
    Created(WorkflowInstance),
    /// An instance with that `biz_key` already existed (returned as stored). The
    /// duplicate-key loser of a race lands here too (K-5).
    Exists(WorkflowInstance),
}

/// Result of a guarded write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The guard matched; the transition was applied. Carries the new revision.
    Applied {
        /// Revision after the write.
        revision: u64,
    },
    /// The guard did not match; nothing changed. Under a token guard this means the claim
    /// is lost (K-6.4).
    Missed,
}

impl WriteOutcome {
    /// Whether the write was applied.
    pub fn applied(&self) -> bool {
        matches!(self, WriteOutcome::Applied { .. })
    }
}

/// Claim parameters (K-6.2): the guard and the transition of a claim, derived in one place
/// so no adapter rebuilds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSpec {
    /// The caller's clock: the instance must be due (`claimable_time ≤ now`), and the lease
    /// runs from it.
    pub now: Instant,
    /// Lease length, strictly positive: `claimable_time = now + lease_ms`.
    pub lease_ms: DurationMs,
    /// The claim token the caller minted (K-2.0 identifier); the engine fences its later
    /// writes with this value, not with one read back.
    pub token: ClaimToken,
    /// Workflow types the worker has definitions for; others are never claimed.
    pub types: Vec<String>,
}

impl ClaimSpec {
    /// The guard this claim writes under ([`Guard::Claimable`]).
    pub fn guard(&self) -> Guard {
        Guard::Claimable { now: self.now, types: self.types.clone() }
    }

    /// The transition this claim writes ([`Transition::claim`]): lease and token, no
    /// revision bump.
    ///
    /// A lease end `now + lease_ms` that is not representable is
    /// [`Error::InvalidInput`](crate::Error::InvalidInput)
    /// (as [`validate`](Self::validate) reports it).
    pub fn transition(&self) -> Result<Transition> {
        Transition::claim(&self.token, self.now, self.lease_ms)
    }

    /// The K-2.0 check of a claim: the token and every type are identifiers, the lease is
    /// strictly positive. Every store adapter calls it before claiming; a refusal is
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) and nothing is written.
    pub fn validate(&self) -> Result<()> {
        let ClaimSpec { now: _, lease_ms, token, types: _ } = self;
        validate::identifier("claim_token", token.as_str())?;
        validate::positive_ms("lease_ms", *lease_ms)?;
        self.now.try_add(*lease_ms, "lease_ms")?;
        self.guard().validate()
    }
}

/// A due wait found by [`WorkflowStore::scan_due_waits`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DueWait {
    /// The waiting instance, to activate under [`Guard::DueWait`].
    pub workflow_id: WorkflowId,
    /// The step holding the wait (the guard checks it is still that step).
    pub step_index: u32,
    /// `timer` for sleeps, `poll` for signal waits with a poll fallback.
    pub resume: ResumeKind,
    /// The instance's `business_priority`, the lane it is re-enqueued in.
    pub priority: Priority,
}

/// Where a paged [`WorkflowStore::scan_due_waits`] goes on: strictly after this
/// `(claimable_time, workflow_id)` in scan order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DueCursor {
    /// The `claimable_time` of the last document read.
    pub claimable_time: Instant,
    /// Its `workflow_id`.
    pub workflow_id: WorkflowId,
}

/// A claimable instance found by [`WorkflowStore::scan_claimable`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    /// A running or failing instance with a `claimable_time`.
    pub workflow_id: WorkflowId,
    /// Its `business_priority`: the ready lane the rebuild scan puts it in.
    pub priority: Priority,
    /// Its `claimable_time`: the score in that lane (due when `≤ now`).
    pub claimable_time: Instant,
}

/// A document a scan read but could not decode (written by an incompatible version, or
/// changed outside the kernel): skipped by the scan and reported, so one bad document
/// never stops the scan over the others (quarantine).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quarantined {
    /// Its `workflow_id` when that much is readable, else the store's own key of the
    /// document (e.g. `_id:<hex>`).
    pub workflow_id: WorkflowId,
    /// Why it does not decode (the decoder's message).
    pub reason: String,
}

/// One page of a store scan ([`WorkflowStore::scan_due_waits`],
/// [`WorkflowStore::scan_claimable`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanPage<T> {
    /// The rows decoded, in scan order.
    pub rows: Vec<T>,
    /// The documents of the page that could not be decoded, skipped.
    pub quarantined: Vec<Quarantined>,
    /// Documents the page read: `rows` plus `quarantined`. Fewer than the limit means the
    /// scan is at its end.
    pub read: usize,
    /// The `workflow_id` of the last document read, decoded or not: the `after` of the next
    /// page of a paged scan, so a quarantined document is never read twice in one sweep.
    pub last: Option<WorkflowId>,
    /// For [`WorkflowStore::scan_due_waits`]: the `claimable_time` of the document `last`
    /// names; with it, the [`DueCursor`] of the next page ([`ScanPage::due_cursor`]).
    /// `None` for other scans.
    pub last_time: Option<Instant>,
}

impl<T> Default for ScanPage<T> {
    fn default() -> Self {
        ScanPage { rows: Vec::new(), quarantined: Vec::new(), read: 0, last: None, last_time: None }
    }
}

impl<T> ScanPage<T> {
    /// A page of decoded rows only; `last` is the id `key` gives the last row.
    pub fn of(rows: Vec<T>, key: impl Fn(&T) -> &WorkflowId) -> Self {
        let last = rows.last().map(|r| key(r).clone());
        ScanPage { read: rows.len(), rows, quarantined: Vec::new(), last, last_time: None }
    }

    /// The cursor of the page after this one of a [`WorkflowStore::scan_due_waits`] scan,
    /// when the page names its last document.
    pub fn due_cursor(&self) -> Option<DueCursor> {
        Some(DueCursor { claimable_time: self.last_time?, workflow_id: self.last.clone()? })
    }

    /// Whether this page read `limit` documents, so another page may follow.
    pub fn is_full(&self, limit: usize) -> bool {
        self.read >= limit && limit > 0
    }
}

/// The durable workflow store: the only authority on execution rights (K-1.1).
///
/// Every write is **one atomic conditional update** of one instance. Token-guarded misses
/// are reported as [`WriteOutcome::Missed`]; an uncertain outcome is
/// [`Error::Uncertain`](crate::Error::Uncertain) and is never retried blindly.
#[async_trait::async_trait]
pub trait WorkflowStore: Send + Sync + 'static {
    /// Insert a new instance.
    ///
    /// # Contract
    /// Atomic on the permanent unique `biz_key` (K-3.2): of concurrent creates exactly one
    /// returns `Created`; the rest return `Exists` with the stored instance. Also unique on
    /// `workflow_id`: a workflow id taken under another biz key is
    /// [`Error::Conflict`](crate::Error::Conflict). An instance refused by
    /// [`WorkflowInstance::validate`] (K-2.0, payload limit) is
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) and nothing is written.
    async fn create(&self, instance: WorkflowInstance) -> Result<CreateOutcome>;

    /// Read by `workflow_id`.
    ///
    /// # Contract
    /// Read-only; returns the instance as last written (a read after an acknowledged write
    /// sees that write), or `None` when no instance has that id. An id that breaks the
    /// K-2.0 identifier rule is [`Error::InvalidInput`](crate::Error::InvalidInput).
    async fn get(&self, workflow_id: &WorkflowId) -> Result<Option<WorkflowInstance>>;

    /// Read by `biz_key`.
    ///
    /// # Contract
    /// As [`get`](Self::get), addressed by the permanent unique `biz_key` (K-3.2): at most
    /// one instance ever matches.
    async fn get_by_biz_key(&self, biz_key: &str) -> Result<Option<WorkflowInstance>>;

    /// Claim one instance (K-6.2).
    ///
    /// # Contract
    /// One conditional update under `spec.guard()` writing `spec.transition()`
    /// (`claimable_time = now + lease`, `claim_token = token`, no revision bump); returns the
    /// updated document, or `None` when the guard missed (a stale candidate). A spec refused
    /// by [`ClaimSpec::validate`] is [`Error::InvalidInput`](crate::Error::InvalidInput). A
    /// claimed document that does not decode is [`Error::Corrupt`](crate::Error::Corrupt)
    /// (its lease is written).
    async fn claim(&self, workflow_id: &WorkflowId, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>>;

    /// Claim any one due instance straight from the store (Redis down or empty, K-6.7).
    ///
    /// # Contract
    /// As [`claim`](Self::claim) on some instance matching the guard; no priority order.
    /// A claimed document that does not decode is [`Error::Corrupt`](crate::Error::Corrupt)
    /// naming it ([`Error::corrupt_workflow_id`](crate::Error::corrupt_workflow_id)): its
    /// lease is written, so the next call claims another instance.
    async fn claim_any(&self, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>>;

    /// Apply `transition` if `guard` matches (K-6.4).
    ///
    /// # Contract
    /// One atomic conditional update with filter `workflow_id = id AND guard`; `revision`
    /// is incremented (when the transition says so), never used as a guard. Returns
    /// `Missed` when nothing matched; nothing is written then. A guard or transition
    /// refused by [`Guard::validate`] or [`Transition::validate`] (K-2.0, payload limit),
    /// or a step patch past the last step of a matching instance, is
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) and nothing is written.
    async fn apply(&self, workflow_id: &WorkflowId, guard: &Guard, transition: &Transition) -> Result<WriteOutcome>;

    /// Waiting instances whose `claimable_time <= now`, longest due first (timer activation,
    /// K-9.2), strictly after `after`.
    ///
    /// # Contract
    /// Read-only, at most `limit` documents read (`limit = 0` is an empty page), ordered by
    /// `(claimable_time, workflow_id)`; only documents after `after` in that order are read.
    /// [`ScanPage::last`] and [`ScanPage::last_time`] name the last document read, decoded or
    /// not, so paging with [`ScanPage::due_cursor`] as `after` goes past documents that stay
    /// due (quarantined ones) instead of reading them again. A document that does not
    /// decode is never an error of the page: it is skipped and listed in
    /// [`ScanPage::quarantined`], and the other rows are returned. A document whose
    /// `workflow_id` is not a string cannot be paged past and is not read.
    async fn scan_due_waits(&self, now: Instant, after: Option<&DueCursor>, limit: usize) -> Result<ScanPage<DueWait>>;

    /// Running or failing instances with a `claimable_time`, ordered by `workflow_id`,
    /// strictly after `after` (rebuild scan, K-13).
    ///
    /// # Contract
    /// Read-only, at most `limit` documents read (`limit = 0` is an empty page); paging with
    /// [`ScanPage::last`] as `after` visits every such instance once. A document that does
    /// not decode is skipped and listed in [`ScanPage::quarantined`], never an error of the
    /// page. A document whose `workflow_id` is not a string cannot be paged past and is not
    /// read.
    async fn scan_claimable(&self, after: Option<&WorkflowId>, limit: usize) -> Result<ScanPage<Candidate>>;
}

/// `dyn WorkflowStore`.
pub type DynStore = dyn WorkflowStore;
