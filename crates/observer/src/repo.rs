//! The repository port of the projection and its in-memory implementation.

use crate::audit::{check_audit_purge_limit, AuditEntry, AuditQuery};
use crate::projection::{effective_limit, AttemptQuery, AttemptRow, Snapshot, SnapshotQuery};
use crate::{Error, Result};
use kernel_core::domain::{Instant, WorkflowStatus};
use kernel_core::ports::Observation;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Where observations are projected: attempt rows and snapshots (K-15), and the operator
/// audit log beside them. Only the projection's own collections; it never reads
/// `workflow_instances`.
#[async_trait::async_trait]
pub trait ObservationRepository: Send + Sync + 'static {
    /// Project a batch: upsert each observation's attempt row on `(biz_key, workflow_run,
    /// step_name, attempt)` and apply it to the `biz_key` snapshot.
    ///
    /// # Contract
    /// Idempotent (writing a batch twice changes nothing more than once). A row or snapshot
    /// accepts an observation only when its revision is ≥ the stored one; an older one is
    /// silently ignored (not an error). [`Error::Unavailable`]: the repository could not be
    /// reached, retry the same batch later. [`Error::InvalidRecord`]: at least one record
    /// is permanently refused; others may have been applied.
    async fn write_batch(&self, batch: &[Observation]) -> Result<()>;

    /// Replace a snapshot wholesale (repair) if its revision is ≥ the stored one.
    ///
    /// # Contract
    /// Atomic per `biz_key`; returns whether it was applied.
    async fn put_snapshot(&self, snapshot: &Snapshot) -> Result<bool>;

    /// The snapshot of a `biz_key`.
    async fn snapshot(&self, biz_key: &str) -> Result<Option<Snapshot>>;

    /// Snapshots matching `query`, newest `updated_at` first, at most its limit.
    ///
    /// # Contract
    /// Exactly the snapshots [`SnapshotQuery::matches`] accepts, in [`SnapshotQuery::order`],
    /// at most [`effective_limit`] of them: the biz-key prefix is literal (no character is a
    /// wildcard), `waiting_on` compares [`Snapshot::wait_signal`], and following the
    /// `before` cursor from page to page returns every matching snapshot exactly once while
    /// none changes. [`Error::InvalidInput`]: [`SnapshotQuery::validate`] refused the query.
    async fn find_snapshots(&self, query: &SnapshotQuery) -> Result<Vec<Snapshot>>;

    /// Attempt rows matching `query`, newest `updated_at` first, at most its limit.
    async fn find_attempts(&self, query: &AttemptQuery) -> Result<Vec<AttemptRow>>;

    /// Append one operator action to the audit log.
    ///
    /// # Contract
    /// Idempotent on `id`: an entry whose id is already stored changes nothing (the first
    /// one written is kept, even when the second differs), and is not an error.
    /// [`Error::InvalidRecord`]: [`AuditEntry::validate`] refused the entry, nothing
    /// written. [`Error::Unavailable`]: retry the same entry later.
    async fn append_audit(&self, entry: &AuditEntry) -> Result<()>;

    /// Audit entries matching `query`.
    ///
    /// # Contract
    /// Exactly the entries [`AuditQuery::matches`] accepts, in [`AuditQuery::order`]
    /// (newest `at` first, ties by `id`), at most [`effective_limit`] of them; following the
    /// `before` cursor from page to page returns every matching entry exactly once.
    /// [`Error::InvalidInput`]: [`AuditQuery::validate`] refused the query.
    async fn find_audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>>;

    /// Retention: delete at most `limit` entries with `at < before`, oldest first (ties by
    /// `id`); returns how many were deleted.
    ///
    /// # Contract
    /// Bounded: `limit` in `1..=`[`AUDIT_PURGE_MAX`](crate::audit::AUDIT_PURGE_MAX), else
    /// [`Error::InvalidInput`] and nothing deleted. Never deletes an entry at or after
    /// `before`; a caller repeats the call until it returns less than `limit`.
    async fn purge_audit(&self, before: Instant, limit: usize) -> Result<u64>;

    /// Retention: delete at most `limit` snapshots of finished workflows (status completed,
    /// failed or canceled) last updated before `before`, oldest `updated_at` first (ties by
    /// `biz_key`), each with every attempt row of its `biz_key`; returns how many snapshots
    /// were deleted.
    ///
    /// # Contract
    /// Bounded: `limit` in `1..=`[`FINISHED_PURGE_MAX`], else [`Error::InvalidInput`] and
    /// nothing deleted. Never deletes a snapshot that is not terminal or was updated at or
    /// after `before` (checked again as it is deleted, so a workflow restarted meanwhile
    /// keeps its snapshot), nor an attempt row of a `biz_key` not selected. Where the two
    /// deletes are not one transaction, attempt rows go first: an interrupted call leaves
    /// only snapshots, which the next call deletes, and a workflow restarted between the two
    /// may lose attempt rows written before (observations only, K-1.2). A caller repeats the
    /// call until it returns less than `limit`. An observation arriving after the purge (or
    /// [`repair_snapshots`](crate::repair_snapshots)) creates the snapshot again.
    async fn purge_finished(&self, before: Instant, limit: usize) -> Result<u64>;
}

/// Most snapshots one [`purge_finished`](ObservationRepository::purge_finished) call deletes.
pub const FINISHED_PURGE_MAX: usize = 1_000;

/// The statuses [`purge_finished`](ObservationRepository::purge_finished) deletes, as
/// stored.
pub const FINISHED_STATUSES: [WorkflowStatus; 3] =
    [WorkflowStatus::Completed, WorkflowStatus::Failed, WorkflowStatus::Canceled];

/// The check of a [`purge_finished`](ObservationRepository::purge_finished) limit:
/// `1..=`[`FINISHED_PURGE_MAX`], else [`Error::InvalidInput`].
pub fn check_finished_purge_limit(limit: usize) -> Result<()> {
    kernel_core::validate::limit_in("limit", limit, FINISHED_PURGE_MAX)
        .map_err(|e| Error::InvalidInput { field: "limit".into(), reason: crate::projection::reason_of(e) })
}

/// `dyn ObservationRepository`.
pub type DynRepository = dyn ObservationRepository;

/// The rule a step name must follow to become a document key (K-2.0's key names): a record
/// breaking it is permanently invalid. The in-memory repository enforces it entirely; the
/// Mongo one leaves the `$` prefix to the server, which refuses it.
pub fn check_step_key(name: &str) -> std::result::Result<(), String> {
    kernel_core::validate::key_name("step_name", name).map_err(|e| e.to_string())
}

type AttemptKey = (String, u32, String, u32);

#[derive(Debug, Default)]
struct State {
    attempts: HashMap<AttemptKey, AttemptRow>,
    snapshots: HashMap<String, Snapshot>,
    audit: HashMap<String, AuditEntry>,
}

/// In-memory projection with the same semantics as the Mongo one. Clones share state.
#[derive(Debug, Clone, Default)]
pub struct InMemoryObservationRepository {
    state: Arc<Mutex<State>>,
}

impl InMemoryObservationRepository {
    /// An empty repository.
    pub fn new() -> Self {
        Self::default()
    }
    /// Number of attempt rows.
    pub fn attempt_count(&self) -> usize {
        self.state.lock().expect("repo lock").attempts.len()
    }
    /// Number of snapshots.
    pub fn snapshot_count(&self) -> usize {
        self.state.lock().expect("repo lock").snapshots.len()
    }
}

#[async_trait::async_trait]
impl ObservationRepository for InMemoryObservationRepository {
    async fn write_batch(&self, batch: &[Observation]) -> Result<()> {
        let mut st = self.state.lock().expect("repo lock");
        let mut invalid = None;
        for obs in batch {
            if let Some(name) = &obs.step_name {
                if let Err(reason) = check_step_key(name) {
                    invalid.get_or_insert(reason);
                    continue;
                }
            }
            if let Some(row) = AttemptRow::from_observation(obs) {
                let key = (row.biz_key.clone(), row.workflow_run, row.step_name.clone(), row.attempt);
                match st.attempts.get_mut(&key) {
                    Some(existing) => {
                        existing.merge(row);
                    }
                    None => {
                        st.attempts.insert(key, row);
                    }
                }
            }
            match st.snapshots.get_mut(&obs.biz_key) {
                Some(s) => {
                    s.apply(obs);
                }
                None => {
                    st.snapshots.insert(obs.biz_key.clone(), Snapshot::from_observation(obs));
                }
            }
        }
        invalid.map_or(Ok(()), |r| Err(Error::InvalidRecord(r)))
    }

    async fn put_snapshot(&self, snapshot: &Snapshot) -> Result<bool> {
        let mut st = self.state.lock().expect("repo lock");
        match st.snapshots.get(&snapshot.biz_key) {
            Some(s) if s.revision > snapshot.revision => Ok(false),
            _ => {
                st.snapshots.insert(snapshot.biz_key.clone(), snapshot.clone());
                Ok(true)
            }
        }
    }

    async fn snapshot(&self, biz_key: &str) -> Result<Option<Snapshot>> {
        Ok(self.state.lock().expect("repo lock").snapshots.get(biz_key).cloned())
    }

    async fn find_snapshots(&self, query: &SnapshotQuery) -> Result<Vec<Snapshot>> {
        query.validate()?;
        let st = self.state.lock().expect("repo lock");
        let mut out: Vec<Snapshot> = st.snapshots.values().filter(|s| query.matches(s)).cloned().collect();
        out.sort_by(SnapshotQuery::order);
        out.truncate(effective_limit(query.limit));
        Ok(out)
    }

    async fn find_attempts(&self, query: &AttemptQuery) -> Result<Vec<AttemptRow>> {
        let st = self.state.lock().expect("repo lock");
        let mut out: Vec<AttemptRow> = st.attempts.values().filter(|r| query.matches(r)).cloned().collect();
        out.sort_by(|a, b| {
            b.updated_at.cmp(&a.updated_at).then_with(|| {
                (&a.biz_key, a.workflow_run, &a.step_name, a.attempt).cmp(&(
                    &b.biz_key,
                    b.workflow_run,
                    &b.step_name,
                    b.attempt,
                ))
            })
        });
        out.truncate(effective_limit(query.limit));
        Ok(out)
    }

    async fn append_audit(&self, entry: &AuditEntry) -> Result<()> {
        entry.validate()?;
        let mut st = self.state.lock().expect("repo lock");
        st.audit.entry(entry.id.clone()).or_insert_with(|| entry.clone());
        Ok(())
    }

    async fn find_audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>> {
        query.validate()?;
        let st = self.state.lock().expect("repo lock");
        let mut out: Vec<AuditEntry> = st.audit.values().filter(|e| query.matches(e)).cloned().collect();
        out.sort_by(AuditQuery::order);
        out.truncate(effective_limit(query.limit));
        Ok(out)
    }

    async fn purge_audit(&self, before: Instant, limit: usize) -> Result<u64> {
        check_audit_purge_limit(limit)?;
        let mut st = self.state.lock().expect("repo lock");
        let mut old: Vec<(Instant, String)> =
            st.audit.values().filter(|e| e.at < before).map(|e| (e.at, e.id.clone())).collect();
        old.sort();
        old.truncate(limit);
        for (_, id) in &old {
            st.audit.remove(id);
        }
        Ok(old.len() as u64)
    }

    async fn purge_finished(&self, before: Instant, limit: usize) -> Result<u64> {
        check_finished_purge_limit(limit)?;
        let mut st = self.state.lock().expect("repo lock");
        let mut old: Vec<(Instant, String)> = st
            .snapshots
            .values()
            .filter(|s| s.status.is_terminal() && s.updated_at < before)
            .map(|s| (s.updated_at, s.biz_key.clone()))
            .collect();
        old.sort();
        old.truncate(limit);
        for (_, key) in &old {
            st.attempts.retain(|(k, ..), _| k != key);
            st.snapshots.remove(key);
        }
        Ok(old.len() as u64)
    }
}
