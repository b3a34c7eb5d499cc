//! Query helpers for the ops view. They read the projection and the ready queue's
//! statistics only: an [`OpsView`] holds no store handle, so it cannot scan
//! `workflow_instances`.

use crate::audit::{AuditEntry, AuditQuery};
use crate::projection::{AttemptOutcome, AttemptQuery, AttemptRow, Snapshot, SnapshotQuery};
use crate::repo::DynRepository;
use crate::{Error, Result};
use kernel_core::domain::{Instant, WorkflowStatus};
use kernel_core::ports::{DynClock, DynQueue, LaneStats};
use std::sync::Arc;

/// The ops view: snapshots by type, step, status, time window and the signal they wait
/// on; attempt rows; the operator audit log; lane statistics from the ready queue.
#[derive(Clone)]
pub struct OpsView {
    repo: Arc<DynRepository>,
    queue: Arc<DynQueue>,
    clock: Arc<DynClock>,
}

impl std::fmt::Debug for OpsView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OpsView")
    }
}

impl OpsView {
    /// A view over a projection and a ready queue.
    pub fn new(repo: Arc<DynRepository>, queue: Arc<DynQueue>, clock: Arc<DynClock>) -> Self {
        OpsView { repo, queue, clock }
    }

    /// Any snapshot query.
    pub async fn snapshots(&self, query: &SnapshotQuery) -> Result<Vec<Snapshot>> {
        self.repo.find_snapshots(query).await
    }

    /// Workflows of a type, optionally in one status.
    pub async fn by_type(&self, workflow_type: &str, status: Option<WorkflowStatus>) -> Result<Vec<Snapshot>> {
        self.snapshots(&SnapshotQuery { workflow_type: Some(workflow_type.into()), status, ..Default::default() }).await
    }

    /// Workflows whose latest step transition concerns `step_name`.
    pub async fn by_step(&self, step_name: &str) -> Result<Vec<Snapshot>> {
        self.snapshots(&SnapshotQuery { step_name: Some(step_name.into()), ..Default::default() }).await
    }

    /// Workflows in a status.
    pub async fn by_status(&self, status: WorkflowStatus) -> Result<Vec<Snapshot>> {
        self.snapshots(&SnapshotQuery { status: Some(status), ..Default::default() }).await
    }

    /// Workflows updated in `[from, to)`.
    pub async fn in_window(&self, from: Instant, to: Instant) -> Result<Vec<Snapshot>> {
        self.snapshots(&SnapshotQuery { updated_from: Some(from), updated_to: Some(to), ..Default::default() }).await
    }

    /// Workflows waiting for a signal of `signal_type`, newest first.
    pub async fn waiting_on(&self, signal_type: &str) -> Result<Vec<Snapshot>> {
        self.snapshots(&SnapshotQuery { waiting_on: Some(signal_type.into()), ..Default::default() }).await
    }

    /// Operator audit entries, newest first.
    pub async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>> {
        self.repo.find_audit(query).await
    }

    /// Attempt rows.
    pub async fn attempts(&self, query: &AttemptQuery) -> Result<Vec<AttemptRow>> {
        self.repo.find_attempts(query).await
    }

    /// Attempts of a step with an outcome (e.g. every `retrying` attempt of `compose`).
    pub async fn attempts_of_step(&self, step_name: &str, outcome: Option<AttemptOutcome>) -> Result<Vec<AttemptRow>> {
        self.attempts(&AttemptQuery { step_name: Some(step_name.into()), outcome, ..Default::default() }).await
    }

    /// Depth, ready, delayed, oldest wait and pops per lane, P0 first, now.
    pub async fn lane_stats(&self) -> Result<[LaneStats; 4]> {
        self.queue.stats(self.clock.now()).await.map_err(|e| Error::unavailable_with(format!("queue: {e}"), e))
    }
}
