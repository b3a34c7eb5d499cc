use crate::domain::Instant;
use crate::error::Result;
use crate::id::WorkflowId;
use crate::validate;
use serde::{Deserialize, Serialize};

/// Status of an inbox record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SignalStatus {
    /// Not yet consumed by a wait.
    Pending,
    /// Consumed (activation done, or repaired).
    Matched,
}

/// A durable doorbell (K-9.3). Carries no business payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalRecord {
    /// Unique; a duplicate delivery is ignored.
    pub signal_id: String,
    /// The instance whose wait this signal may activate.
    pub workflow_id: WorkflowId,
    /// Must equal the wait's `signal_type` to match (K-9.3).
    pub signal_type: String,
    /// Must equal the wait's `wait_key` (which business object) to match.
    pub wait_key: String,
    /// Must equal the wait's generation; an older round never matches (K-9.6).
    pub generation: u64,
    /// Pending until a wait consumed it (activation or repair), then matched.
    pub status: SignalStatus,
    /// Insert time; retention purges by it.
    pub created_at: Instant,
    /// When it was matched (audit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_time: Option<Instant>,
    /// No instance had `workflow_id` when the signal was delivered. Pending orphans are
    /// bounded per workflow id and in total (see [`SignalInbox::count_pending_orphans`]);
    /// the flag is cleared once the workflow exists ([`SignalInbox::clear_orphans`]).
    #[serde(default)]
    pub orphan: bool,
}

impl SignalRecord {
    /// The K-2.0 check of a record before insert: `signal_id`, `workflow_id`,
    /// `signal_type` and `wait_key` follow the identifier rule. Every inbox adapter calls
    /// it in `insert`; a refusal is [`Error::InvalidInput`](crate::Error::InvalidInput) and
    /// nothing is written.
    ///
    /// ```
    /// use kernel_core::domain::Instant;
    /// use kernel_core::ports::{SignalRecord, SignalStatus};
    /// let mut r = SignalRecord {
    ///     signal_id: "sig-1".into(), workflow_id: "wf-1".into(), signal_type: "approved".into(),
    ///     wait_key: "doc:42".into(), generation: 1, status: SignalStatus::Pending,
    ///     created_at: Instant::ZERO, match_time: None, orphan: false,
    /// };
    /// assert!(r.validate().is_ok());
    /// r.wait_key = "doc\0".into();
    /// assert!(r.validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<()> {
        let SignalRecord {
            signal_id,
            workflow_id,
            signal_type,
            wait_key,
            generation: _,
            status: _,
            created_at: _,
            match_time: _,
            orphan: _,
        } = self;
        validate::identifier("signal_id", signal_id)?;
        validate::identifier("workflow_id", workflow_id.as_str())?;
        validate::identifier("signal_type", signal_type)?;
        validate::identifier("wait_key", wait_key)
    }
}

/// Result of an inbox insert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InsertOutcome {
    /// New record stored as pending.
    Inserted,
    /// A record with that `signal_id` exists (returned as stored).
    Duplicate(SignalRecord),
}

/// An inbox record a scan read but could not decode (written by an incompatible version,
/// or changed outside the kernel): skipped by the scan and reported, so one bad record
/// never stops the scan over the others (K-9.4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UndecodableSignal {
    /// Its `signal_id` when that much is readable, else the store's own key of the record
    /// (e.g. `_id:<hex>`).
    pub signal_id: String,
    /// Why it does not decode (the decoder's message).
    pub reason: String,
}

/// One page of an inbox scan ([`SignalInbox::scan_pending`],
/// [`SignalInbox::scan_created_before`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SignalPage {
    /// The records decoded, in scan order.
    pub records: Vec<SignalRecord>,
    /// The records of the page that could not be decoded, skipped.
    pub undecodable: Vec<UndecodableSignal>,
    /// Records the page read: `records` plus `undecodable`. Fewer than the limit means the
    /// scan is at its end.
    pub read: usize,
    /// The `signal_id` of the last record read, decoded or not: the `after` of the next
    /// page, so an undecodable record is passed instead of read again.
    pub last: Option<String>,
}

impl SignalPage {
    /// A page of decoded records only.
    pub fn of(records: Vec<SignalRecord>) -> Self {
        let last = records.last().map(|r| r.signal_id.clone());
        SignalPage { read: records.len(), records, undecodable: Vec::new(), last }
    }

    /// Add a record the page read and decoded.
    pub fn push(&mut self, record: SignalRecord) {
        self.read += 1;
        self.last = Some(record.signal_id.clone());
        self.records.push(record);
    }

    /// Add a record the page read but could not decode. `is_cursor` says whether
    /// `signal_id` is the record's own id (then the next page starts after it) or only the
    /// name it is reported under.
    pub fn push_undecodable(&mut self, signal_id: String, reason: String, is_cursor: bool) {
        self.read += 1;
        if is_cursor {
            self.last = Some(signal_id.clone());
        }
        self.undecodable.push(UndecodableSignal { signal_id, reason });
    }

    /// Whether this page read `limit` records, so another page may follow.
    pub fn is_full(&self, limit: usize) -> bool {
        self.read >= limit && limit > 0
    }
}

/// The durable signal inbox (K-9.3, K-9.4).
#[async_trait::async_trait]
pub trait SignalInbox: Send + Sync + 'static {
    /// Insert a pending record.
    ///
    /// # Contract
    /// Atomic on the unique `signal_id`: of concurrent inserts exactly one returns
    /// `Inserted`; the others return `Duplicate` with the stored record. An error means the
    /// delivery failed and the producer must retry with the same id. A record refused by
    /// [`SignalRecord::validate`] (K-2.0) is
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) and nothing is written.
    async fn insert(&self, record: SignalRecord) -> Result<InsertOutcome>;

    /// Read a record.
    ///
    /// # Contract
    /// Read-only; the record as last written (pending or matched), or `None` when no
    /// record has that id (never inserted, or purged by retention).
    async fn get(&self, signal_id: &str) -> Result<Option<SignalRecord>>;

    /// The oldest pending record matching the wait identity exactly (K-9.4 early signals).
    ///
    /// # Contract
    /// Read-only; only `status = pending` records are returned.
    async fn find_pending(
        &self,
        workflow_id: &WorkflowId,
        signal_type: &str,
        wait_key: &str,
        generation: u64,
    ) -> Result<Option<SignalRecord>>;

    /// `pending → matched` with `match_time = now`.
    ///
    /// # Contract
    /// Conditional on `status = pending`; returns whether this call changed it. Idempotent.
    async fn mark_matched(&self, signal_id: &str, now: Instant) -> Result<bool>;

    /// A page of pending records ordered by `signal_id`, strictly after `after`.
    ///
    /// # Contract
    /// Bounded by `limit` (`limit = 0` is an empty page); read-only. Records are decoded
    /// one by one: a record that does not decode is reported in
    /// [`SignalPage::undecodable`] (under its `signal_id` when that much is readable) and
    /// counted in [`SignalPage::read`], never an error of the page; [`SignalPage::last`]
    /// names the last record read, decoded or not, so the next page starts after it.
    async fn scan_pending(&self, after: Option<&str>, limit: usize) -> Result<SignalPage>;

    /// Records created before `before`, ordered by `signal_id`, strictly after `after`:
    /// the candidates of retention, which decides per record from the workflow's state.
    ///
    /// # Contract
    /// Read-only, bounded by `limit` (`limit = 0` is an empty page); pending and matched
    /// records alike. Undecodable records are reported and paged past as by
    /// [`SignalInbox::scan_pending`].
    async fn scan_created_before(&self, before: Instant, after: Option<&str>, limit: usize) -> Result<SignalPage>;

    /// Records of one workflow in one status, newest first (`created_at` descending, then
    /// `signal_id` descending).
    ///
    /// # Contract
    /// Read-only, bounded by `limit` (`limit = 0` is an empty page).
    async fn scan_workflow(
        &self,
        workflow_id: &WorkflowId,
        status: SignalStatus,
        limit: usize,
    ) -> Result<Vec<SignalRecord>>;

    /// Retention: delete the records of `signal_ids` that are still in `status`; returns
    /// how many were deleted.
    ///
    /// # Contract
    /// Conditional per record on `status`, so a pending record matched meanwhile is not
    /// deleted as pending (and vice versa); unknown ids are ignored. At most
    /// [`INBOX_DELETE_IDS_MAX`] ids per call, more is
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) and deletes nothing. The caller
    /// decides which records may go (K-9.4), all past the retention period: only those of
    /// a terminal or absent workflow, pending records of an older generation than the
    /// workflow's current wait, pending records of a live workflow beyond the newest
    /// `pending_signals_per_workflow_max` (never one for the current wait's generation or a
    /// newer one: a documented drop of signals no wait consumed within retention), and
    /// matched records beyond the per-workflow cap — never a pending record the current
    /// wait may still consume, never the duplicate memory a producer's redelivery needs
    /// within the cap.
    async fn delete_if(&self, signal_ids: &[String], status: SignalStatus) -> Result<u64>;

    /// Pending records with `orphan = true`, of `workflow_id` or of every workflow id,
    /// counted up to `limit`.
    ///
    /// # Contract
    /// Read-only; returns `min(count, limit)`, so the cost is bounded by `limit`. The bound
    /// the caller keeps with it is soft: the count and the insert that follows are two
    /// calls, so concurrent deliveries may each see room and together pass it by a few.
    async fn count_pending_orphans(&self, workflow_id: Option<&WorkflowId>, limit: u64) -> Result<u64>;

    /// Clear the `orphan` flag of every record of `workflow_id`: the workflow exists now,
    /// so its early signals no longer count against the orphan bounds (they are kept as
    /// any pending record of a live workflow is). Returns how many records changed.
    ///
    /// # Contract
    /// Idempotent; records of other workflow ids and their flags are untouched, nothing
    /// else of a record changes. An id that breaks the K-2.0 identifier rule is
    /// [`Error::InvalidInput`](crate::Error::InvalidInput).
    async fn clear_orphans(&self, workflow_id: &WorkflowId) -> Result<u64>;
}

/// Most ids one [`SignalInbox::delete_if`] call takes.
pub const INBOX_DELETE_IDS_MAX: usize = 1_000;

/// The shared check of a [`SignalInbox::delete_if`] id list: at most
/// [`INBOX_DELETE_IDS_MAX`] ids, each an identifier (K-2.0).
pub fn validate_delete_ids(signal_ids: &[String]) -> Result<()> {
    if signal_ids.len() > INBOX_DELETE_IDS_MAX {
        return Err(crate::Error::invalid(
            "signal_ids",
            format_args!("{} ids exceed {INBOX_DELETE_IDS_MAX}", signal_ids.len()),
        ));
    }
    signal_ids.iter().try_for_each(|id| validate::identifier("signal_id", id))
}

/// `dyn SignalInbox`.
pub type DynInbox = dyn SignalInbox;

/// A signal to deliver (K-9.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signal {
    /// Stable id: retries of one notification reuse it.
    pub signal_id: String,
    /// Target instance.
    pub workflow_id: WorkflowId,
    /// Signal type.
    pub signal_type: String,
    /// Wait key.
    pub wait_key: String,
    /// Wait generation.
    pub generation: u64,
}

impl Signal {
    /// Start a signal of type `signal_type` to `workflow_id`; name the rest with the
    /// builder's setters, so no two strings can trade places. `generation` defaults to 0
    /// (the first wait); `wait_key` and `signal_id` are required — the id because retries
    /// of one notification must reuse it.
    ///
    /// ```
    /// use kernel_core::ports::Signal;
    /// let s = Signal::builder("wf-1", "live_ready")
    ///     .wait_key("live-7")
    ///     .generation(2)
    ///     .signal_id("live-ready:live-7:wf-1")
    ///     .build()
    ///     .unwrap();
    /// assert_eq!((s.wait_key.as_str(), s.generation), ("live-7", 2));
    /// // A signal without an id cannot be retried safely: refused.
    /// assert!(Signal::builder("wf-1", "live_ready").wait_key("live-7").build().is_err());
    /// assert!(Signal::builder("wf-1", "live_ready").signal_id("s-1").build().is_err());
    /// ```
    pub fn builder(workflow_id: impl Into<WorkflowId>, signal_type: impl Into<String>) -> SignalBuilder {
        SignalBuilder {
            signal: Signal {
                signal_id: String::new(),
                workflow_id: workflow_id.into(),
                signal_type: signal_type.into(),
                wait_key: String::new(),
                generation: 0,
            },
        }
    }
}

/// Builder of a [`Signal`], from [`Signal::builder`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build`"]
pub struct SignalBuilder {
    signal: Signal,
}

impl SignalBuilder {
    /// The stable id that every retry of this notification reuses (required).
    pub fn signal_id(mut self, id: impl Into<String>) -> Self {
        self.signal.signal_id = id.into();
        self
    }
    /// The wait key the target waits on (required).
    pub fn wait_key(mut self, key: impl Into<String>) -> Self {
        self.signal.wait_key = key.into();
        self
    }
    /// The wait generation the signal is meant for (K-9.6: another generation's signal
    /// never wakes the wait).
    pub fn generation(mut self, generation: u64) -> Self {
        self.signal.generation = generation;
        self
    }
    /// The signal, its identifiers checked by the identifier rule (K-2.0) that delivery
    /// applies too.
    pub fn build(self) -> Result<Signal> {
        let s = self.signal;
        crate::validate::identifier("signal_id", &s.signal_id)?;
        crate::validate::identifier("workflow_id", s.workflow_id.as_str())?;
        crate::validate::identifier("signal_type", &s.signal_type)?;
        crate::validate::identifier("wait_key", &s.wait_key)?;
        Ok(s)
    }
}

/// What a delivery did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliverOutcome {
    /// Stored and it woke the matching wait.
    Activated,
    /// Stored as pending (early signal, or no matching wait yet).
    Pending,
    /// Already delivered and consumed.
    Duplicate,
}

/// Something that delivers signals; the engine implements it.
#[async_trait::async_trait]
pub trait SignalDelivery: Send + Sync + 'static {
    /// Deliver one signal (K-9.3).
    ///
    /// # Contract
    /// Inbox insert first; an error means nothing is guaranteed and the producer retries
    /// with the same `signal_id`.
    async fn deliver(&self, signal: Signal) -> Result<DeliverOutcome>;
}

/// Cloneable handle on a [`SignalDelivery`], given to activities.
#[derive(Clone)]
pub struct SignalSender(pub(crate) std::sync::Arc<dyn SignalDelivery>);

impl std::fmt::Debug for SignalSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SignalSender")
    }
}

impl SignalSender {
    /// Wrap a delivery implementation.
    pub fn new(d: std::sync::Arc<dyn SignalDelivery>) -> Self {
        SignalSender(d)
    }
    /// Deliver one signal.
    pub async fn deliver(&self, signal: Signal) -> Result<DeliverOutcome> {
        self.0.deliver(signal).await
    }
}
