//! Repair: rebuild snapshots of finished workflows from their instances (K-15).

use crate::projection::Snapshot;
use crate::repo::DynRepository;
use crate::{Error, Result};
use kernel_core::ports::DynStore;
use kernel_core::WorkflowId;

/// Most ids one repair call takes.
pub const REPAIR_IDS_MAX: usize = 10_000;

/// What a repair did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RepairReport {
    /// Snapshots written (the stored one was older or missing).
    pub rebuilt: u64,
    /// Snapshots already newer than the instance read (left as they are).
    pub current: u64,
    /// Instances not finished yet (left to the live projection).
    pub unfinished: u64,
    /// Ids the store does not know.
    pub missing: u64,
}

/// Rebuild the snapshot of each finished workflow among `workflow_ids`, read one by one
/// through the store port (by id: never a scan of the instances), and write it with the
/// usual revision rule (a newer snapshot is never overwritten).
pub async fn repair_snapshots(
    store: &DynStore,
    repo: &DynRepository,
    workflow_ids: &[WorkflowId],
) -> Result<RepairReport> {
    if workflow_ids.len() > REPAIR_IDS_MAX {
        return Err(Error::InvalidInput {
            field: "workflow_ids".into(),
            reason: format!("more than {REPAIR_IDS_MAX} ids"),
        });
    }
    let mut report = RepairReport::default();
    for id in workflow_ids {
        let inst = store.get(id).await.map_err(|e| Error::unavailable_with(format!("store: {e}"), e))?;
        let Some(inst) = inst else {
            report.missing += 1;
            continue;
        };
        if !inst.status.is_terminal() {
            report.unfinished += 1;
            continue;
        }
        if repo.put_snapshot(&Snapshot::from_instance(&inst)).await? {
            report.rebuilt += 1;
        } else {
            report.current += 1;
        }
    }
    Ok(report)
}
