//! The pre-deploy check (`wfk check-deploy`): the new definitions' fingerprints (K-4.2)
//! against the workflows in flight, listed from the projection (K-15) page by page, each
//! read by id for the fingerprint it runs under.

use crate::{OpsError, Result};
use kernel_core::ports::DynStore;
use kernel_core::WorkflowId;
use kernel_core::{Definition, WorkflowStatus};
use observer::{DynRepository, SnapshotQuery};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};

/// Most definitions one manifest may list.
pub const MANIFEST_ENTRIES_MAX: usize = 1_000;
/// Most snapshots one check reads, over all its passes.
pub const CHECK_DEPLOY_SCAN_MAX: u64 = 1_000_000;
/// Most passes over the in-flight snapshots (each after the first looks for workflows that
/// moved ahead of the cursor while the previous one read).
pub const CHECK_DEPLOY_PASSES_MAX: usize = 3;

/// The definitions a deploy will run, as fingerprints: what a build writes with
/// [`DeployManifest::of`] and `wfk check-deploy` reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeployManifest {
    /// One entry per workflow type.
    pub definitions: Vec<ManifestEntry>,
}

/// One definition of a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// Workflow type.
    pub workflow_type: String,
    /// Its fingerprint (K-4.2).
    pub fingerprint: String,
    /// Its steps, in order (for the report).
    #[serde(default)]
    pub steps: Vec<String>,
}

impl DeployManifest {
    /// The manifest of `definitions`.
    pub fn of(definitions: &[Definition]) -> DeployManifest {
        DeployManifest {
            definitions: definitions
                .iter()
                .map(|d| ManifestEntry {
                    workflow_type: d.workflow_type().to_string(),
                    fingerprint: d.plan().fingerprint().to_string(),
                    steps: d.plan().steps().iter().map(|s| s.name.clone()).collect(),
                })
                .collect(),
        }
    }

    /// Parse and check a manifest (JSON).
    pub fn parse(text: &str) -> Result<DeployManifest> {
        let m: DeployManifest =
            serde_json::from_str(text).map_err(|e| OpsError::BadInput(format!("definitions manifest: {e}")))?;
        if m.definitions.len() > MANIFEST_ENTRIES_MAX {
            return Err(OpsError::BadInput(format!("definitions manifest: more than {MANIFEST_ENTRIES_MAX} entries")));
        }
        let mut seen = std::collections::HashSet::new();
        for d in &m.definitions {
            kernel_core::validate::identifier("workflow_type", &d.workflow_type)?;
            if d.fingerprint.len() != 64 || !d.fingerprint.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(OpsError::BadInput(format!("{}: a fingerprint is 64 hex digits", d.workflow_type)));
            }
            if !seen.insert(d.workflow_type.clone()) {
                return Err(OpsError::BadInput(format!("{} is listed twice", d.workflow_type)));
            }
        }
        Ok(m)
    }
}

/// Per workflow type, what the deploy would do to its workflows in flight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TypeReport {
    /// Workflow type.
    pub workflow_type: String,
    /// The fingerprint its workflows in flight run under.
    pub fingerprint: String,
    /// Running, waiting or failing workflows with it.
    pub in_flight: u64,
    /// How many would park after the deploy.
    pub would_park: u64,
    /// Why (`ok`, `fingerprint changed`, `type not in the new definitions`).
    pub reason: String,
}

/// The whole pre-deploy report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeployReport {
    /// One row per (type, fingerprint in flight).
    pub types: Vec<TypeReport>,
    /// Workflows in flight looked at.
    pub in_flight: u64,
    /// Of them, would park.
    pub would_park: u64,
    /// Whether a last pass over the projection found no workflow the earlier passes had not
    /// seen; `false`: workflows kept starting or changing during the check — run it again.
    pub complete: bool,
}

pub(crate) async fn check(
    repo: &DynRepository,
    store: &DynStore,
    manifest: &DeployManifest,
    progress: &(dyn Fn(u64) + Send + Sync),
) -> Result<DeployReport> {
    let new: BTreeMap<&str, &str> =
        manifest.definitions.iter().map(|d| (d.workflow_type.as_str(), d.fingerprint.as_str())).collect();
    let mut groups: BTreeMap<(String, String), u64> = BTreeMap::new();
    // In-flight workflows change while the pages are read (a change moves a snapshot ahead
    // of the cursor, or to another status): passes repeat until one finds no workflow not
    // seen before, each counted once by id.
    let mut seen: HashSet<WorkflowId> = HashSet::new();
    let mut read = 0u64;
    let mut complete = false;
    for _pass in 0..CHECK_DEPLOY_PASSES_MAX {
        let mut new_in_pass = 0u64;
        for status in [WorkflowStatus::Running, WorkflowStatus::Waiting, WorkflowStatus::Failing] {
            let mut before = None;
            loop {
                let page = repo
                    .find_snapshots(&SnapshotQuery {
                        status: Some(status),
                        before: before.clone(),
                        limit: observer::projection::QUERY_LIMIT_MAX,
                        ..Default::default()
                    })
                    .await?;
                read += page.len() as u64;
                progress(read);
                if read > CHECK_DEPLOY_SCAN_MAX {
                    return Err(OpsError::Refused(format!(
                        "more than {CHECK_DEPLOY_SCAN_MAX} snapshots read: check fewer workflows in flight"
                    )));
                }
                for s in &page {
                    if seen.contains(&s.workflow_id) {
                        continue;
                    }
                    // Listed from the projection; each read by id for the fingerprint it
                    // runs under (it may have ended since: not in flight, not counted).
                    let Some(inst) = store.get(&s.workflow_id).await? else { continue };
                    if inst.status.is_terminal() {
                        continue;
                    }
                    seen.insert(s.workflow_id.clone());
                    new_in_pass += 1;
                    *groups.entry((inst.workflow_type.clone(), inst.definition_fingerprint.clone())).or_default() += 1;
                }
                match page.last() {
                    Some(last) if page.len() == observer::projection::QUERY_LIMIT_MAX => {
                        before = Some((last.updated_at, last.biz_key.clone()))
                    }
                    _ => break,
                }
            }
        }
        if new_in_pass == 0 || seen.is_empty() {
            complete = true;
            break;
        }
    }
    let in_flight = groups.values().sum();
    let mut report = DeployReport { types: vec![], in_flight, would_park: 0, complete };
    for ((workflow_type, fingerprint), n) in groups {
        let (park, reason) = match new.get(workflow_type.as_str()) {
            None => (n, "type not in the new definitions".to_string()),
            Some(f) if *f == fingerprint => (0, "ok".to_string()),
            Some(_) => (n, "fingerprint changed: steps added, removed or reordered".to_string()),
        };
        report.would_park += park;
        report.types.push(TypeReport { workflow_type, fingerprint, in_flight: n, would_park: park, reason });
    }
    Ok(report)
}
