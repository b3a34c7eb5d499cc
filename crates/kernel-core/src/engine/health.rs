//! What an engine reports about itself: how it learns of new work (K-13), its last
//! maintenance pass (K-9.2, K-13) and the claims it runs (K-6.1). Read with
//! [`RunningEngine::health`](super::RunningEngine::health); never drives execution.

use super::MaintenanceReport;
use crate::domain::Instant;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;

/// How the scheduling loop learns of new work (K-13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeupState {
    /// The scheduling loop has not subscribed yet (just spawned, or never spawned).
    NotSubscribed,
    /// Subscribed to the doorbell: an enqueue is noticed at once.
    Subscribed,
    /// The subscription failed or was closed: new work is noticed only at the next poll,
    /// up to `poll_interval_ms` late. The engine stays correct, only slower.
    Polling,
}

impl WakeupState {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => WakeupState::Subscribed,
            2 => WakeupState::Polling,
            _ => WakeupState::NotSubscribed,
        }
    }
    fn as_u8(self) -> u8 {
        match self {
            WakeupState::NotSubscribed => 0,
            WakeupState::Subscribed => 1,
            WakeupState::Polling => 2,
        }
    }
}

/// One finished maintenance pass ([`Engine::maintain`](super::Engine::maintain)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaintenancePass {
    /// The engine's clock when the pass returned.
    pub finished_at: Instant,
    /// What the pass did, or the message of the error that stopped it (the next pass
    /// starts over).
    pub outcome: Result<MaintenanceReport, String>,
}

/// A snapshot of an engine's health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineHealth {
    /// Whether new work is noticed through the doorbell or only by polling.
    pub wakeup: WakeupState,
    /// The last maintenance pass, `None` before the first one returned.
    pub last_maintenance: Option<MaintenancePass>,
    /// Claims being run right now (at most `worker_slots`).
    pub claims_running: usize,
    /// Whether a shutdown has begun: no new claim is taken.
    pub stopping: bool,
    /// Instances this engine found undecodable and skipped (quarantined), at most
    /// [`QUARANTINE_IDS_MAX`](super::QUARANTINE_IDS_MAX), ordered by id. They need an
    /// operator: the kernel neither runs nor deletes them.
    pub quarantined: Vec<crate::id::WorkflowId>,
    /// Inbox records (by `signal_id`) this engine found undecodable and skipped, at most
    /// [`QUARANTINE_IDS_MAX`](super::QUARANTINE_IDS_MAX), ordered by id (K-9.4). They need
    /// an operator: the kernel neither matches nor deletes them.
    pub undecodable_signals: Vec<String>,
}

/// The live figures behind [`EngineHealth`]; updated by the engine, read without waiting on
/// it.
#[derive(Debug, Default)]
pub(crate) struct HealthState {
    wakeup: AtomicU8,
    last_maintenance: Mutex<Option<MaintenancePass>>,
    claims_running: AtomicUsize,
}

/// Counts one running claim while alive (dropped when the claim ends or is aborted).
pub(crate) struct RunningClaim<'a>(&'a HealthState);

impl Drop for RunningClaim<'_> {
    fn drop(&mut self) {
        self.0.claims_running.fetch_sub(1, Ordering::SeqCst);
    }
}

impl HealthState {
    pub(crate) fn set_wakeup(&self, state: WakeupState) {
        self.wakeup.store(state.as_u8(), Ordering::SeqCst);
    }

    pub(crate) fn maintenance_finished(&self, pass: MaintenancePass) {
        *self.last_maintenance.lock().expect("health lock") = Some(pass);
    }

    pub(crate) fn claim_started(&self) -> RunningClaim<'_> {
        self.claims_running.fetch_add(1, Ordering::SeqCst);
        RunningClaim(self)
    }

    pub(crate) fn snapshot(
        &self,
        stopping: bool,
        quarantined: Vec<crate::id::WorkflowId>,
        undecodable_signals: Vec<String>,
    ) -> EngineHealth {
        EngineHealth {
            wakeup: WakeupState::from_u8(self.wakeup.load(Ordering::SeqCst)),
            last_maintenance: self.last_maintenance.lock().expect("health lock").clone(),
            claims_running: self.claims_running.load(Ordering::SeqCst),
            stopping,
            quarantined,
            undecodable_signals,
        }
    }
}
