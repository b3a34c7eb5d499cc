//! # observer
//!
//! The observation projection of the durable workflow kernel (SPEC K-15): operators' eyes
//! on running work that never decide a result (K-1.2).
//!
//! - [`Observer`]: the engine's [`ObservationSink`](kernel_core::ports::ObservationSink).
//!   `emit` never awaits and never blocks: a bounded queue rejects the newest event when
//!   full (`dropped`) and never evicts an accepted one.
//! - Its writer task ([`ObserverWriter`]) writes batches by size or interval on the
//!   [`Clock`](kernel_core::ports::Clock) port; while the repository is down it keeps its
//!   batch and pauses; a permanently invalid record is isolated by bisection (`poison`).
//!   Drain it on shutdown: install `ObserverWriter::flush` as an engine shutdown hook
//!   (`EngineBuilder::on_shutdown`), or call [`ObserverWriter::close`] after
//!   `RunningEngine::shutdown`.
//! - [`ObservationRepository`]: attempt rows upserted on `(biz_key, workflow_run,
//!   step_name, attempt)` and one [`Snapshot`] per `biz_key` that accepts only revisions ≥
//!   its own (with the signal type a waiting workflow waits for, so a console can list
//!   them), and the operator audit log ([`AuditEntry`], appended once per id, paged newest
//!   first, purged in bounded pages); the writer's retention passes ([`Retention`]) delete
//!   finished workflows' snapshots and attempt rows and old audit entries, so the
//!   projection does not grow without bound; [`InMemoryObservationRepository`] here, and
//!   one repository beside each store (`store-mongo`'s `MongoObservationRepository`,
//!   `store-postgres`'s and `store-sqlite`'s). All run the repository conformance suite
//!   (`conformance`, with the `testing` feature, as is the fault decorator `faults`).
//! - [`repair_snapshots`] rebuilds snapshots of finished workflows from instances;
//!   [`OpsView`] answers the ops queries without ever touching `workflow_instances`.
//!
//! ```
//! use kernel_core::ports::{ObservationSink, SystemClock};
//! use observer::{InMemoryObservationRepository, Observer, ObserverConfig};
//! use std::sync::Arc;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let repo = Arc::new(InMemoryObservationRepository::new());
//! let (sink, writer) = Observer::start(repo.clone(), Arc::new(SystemClock), ObserverConfig::default()).unwrap();
//! // Hand `Arc::new(sink.clone())` to the engine's ports as `observer`; on shutdown:
//! let stats = writer.close().await;
//! assert_eq!(stats.dropped, 0);
//! # }
//! ```

pub mod audit;
#[cfg(feature = "testing")]
pub mod conformance;
#[cfg(feature = "testing")]
pub mod faults;
mod ops;
pub mod projection;
mod repair;
mod repo;
mod sink;

pub use audit::{AuditEntry, AuditQuery, AuditResult};
pub use ops::OpsView;
pub use projection::{AttemptOutcome, AttemptQuery, AttemptRow, Snapshot, SnapshotQuery, StepSummary};
pub use repair::{repair_snapshots, RepairReport, REPAIR_IDS_MAX};
pub use repo::{
    check_finished_purge_limit, check_step_key, DynRepository, InMemoryObservationRepository, ObservationRepository,
    FINISHED_PURGE_MAX, FINISHED_STATUSES,
};
pub use sink::{Observer, ObserverConfig, ObserverStats, ObserverWriter, Retention};

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can fail in the projection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The repository could not be reached; the same call may be retried later.
    #[error("unavailable: {message}")]
    Unavailable {
        /// What failed, for logs (names the backend and the call).
        message: String,
        /// The driver's (or port's) own error, when one reported the failure; returned by
        /// `source()`.
        #[source]
        cause: Option<kernel_core::Cause>,
    },
    /// A record the repository refuses for good (a poison record).
    #[error("invalid record: {0}")]
    InvalidRecord(String),
    /// A caller-supplied value breaks a limit.
    #[error("invalid {field}: {reason}")]
    InvalidInput {
        /// Which input.
        field: String,
        /// Why.
        reason: String,
    },
    /// The writer has stopped.
    #[error("observer closed")]
    Closed,
}

impl Error {
    /// [`Error::Unavailable`] without a cause (an injected outage).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Error::Unavailable { message: message.into(), cause: None }
    }

    /// [`Error::Unavailable`] reported by a driver or port: `cause` is returned by `source()`.
    pub fn unavailable_with(message: impl Into<String>, cause: impl Into<kernel_core::Cause>) -> Self {
        Error::Unavailable { message: message.into(), cause: Some(cause.into()) }
    }

    /// Whether the same call may simply be retried later.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Unavailable { .. })
    }
}
