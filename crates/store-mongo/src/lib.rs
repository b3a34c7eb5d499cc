//! # store-mongo
//!
//! The durable side of the kernel on MongoDB (≥ 5.0) with the official `mongodb` driver:
//! [`MongoWorkflowStore`] implements [`WorkflowStore`](kernel_core::ports::WorkflowStore),
//! [`MongoSignalInbox`] implements [`SignalInbox`](kernel_core::ports::SignalInbox) and
//! [`MongoResultCache`] implements [`ResultCache`](kernel_core::ports::ResultCache).
//! [`MongoDeadLetters`] implements [`DeadLetters`](kernel_core::ports::DeadLetters).
//! [`MongoTaskInbox`] implements [`TaskInbox`](kernel_core::ports::TaskInbox).
//! [`MongoObservationRepository`] is the observer's projection (K-15) on the same database
//! ([`ObservationRepository`](observer::ObservationRepository), the collections
//! `observation_attempts`, `observation_snapshots` and `observation_audit`).
//!
//! Every port write is **one** single-document `findAndModify`, `update` or `insert` whose
//! filter is `workflow_id = id AND <guard>` (K-6.4); the update is translated from the typed
//! [`Transition`](kernel_core::transition::Transition). A miss is
//! [`WriteOutcome::Missed`](kernel_core::ports::WriteOutcome::Missed); `revision` is only
//! ever `$inc`-ed. [`protocol`] holds the translation and documents every filter and update.
//!
//! ```no_run
//! use kernel_core::ports::{DynStore, WorkflowStore};
//! use std::sync::Arc;
//! use store_mongo::{MongoConfig, MongoSignalInbox, MongoWorkflowStore};
//!
//! # async fn demo() -> kernel_core::Result<()> {
//! let db = store_mongo::connect("mongodb://127.0.0.1:27017", "workflows").await?;
//! let store: Arc<DynStore> = Arc::new(MongoWorkflowStore::open(&db, MongoConfig::default()).await?);
//! let inbox = MongoSignalInbox::open(&db, MongoConfig::default()).await?;
//! assert!(store.get(&"wf-1".into()).await?.is_none());
//! # let _ = inbox; Ok(()) }
//! ```
//!
//! ## Documents
//!
//! `workflow_instances` (times are BSON DateTime, counters Int32, `revision` Int64,
//! payloads are JSON mapped node by node to BSON with keys kept verbatim):
//!
//! ```text
//! { _id: ObjectId, workflow_id, type, biz_key, status, definition_fingerprint,
//!   business_priority: Int32 0..3, retry_count: Int32, prepare_failures?: Int32 (absent = 0),
//!   refused_writes?: Int32 (absent = 0),
//!   revision: Int64,
//!   steps: [ { name, status, attempt: Int32, elapsed_ms: Int64, traffic_wait_ms: Int64,
//!              traffic_waits: Int32, error?: { class, message }, checkpoint?,
//!              started_at?: Date, finished_at?: Date } ],
//!   input, output: { <step name>: value },
//!   claimable_time?: Date, claim_token?, finished_at?: Date, created_at: Date, updated_at: Date,
//!   wait?: { kind: "timer"|"signal", signal_type?, wait_key?, generation: Int64,
//!            step_index: Int32, poll_time?: Date },
//!   resume?: { kind: "timer"|"signal"|"poll", step_index: Int32, signal_id? },
//!   fingerprint_mismatch?: { persisted, worker },
//!   compensation?: <the report's JSON form>, trace_parent?,
//!   operator_request?: { id, action: { kind: "cancel"|"regenerate", step? }, holder,
//!                        requested_at: Date } }
//! ```
//!
//! `signal_inbox`: see [`MongoSignalInbox`]. `workflow_result_cache` (the name is
//! configurable): see [`MongoResultCache`].
//! `signal_inbox`: see [`MongoSignalInbox`]. `workflow_dead_letters` (configurable): see
//! [`MongoDeadLetters`]. `workflow_task_inbox` (configurable): see [`MongoTaskInbox`].

mod cache;
mod codec;
mod dead_letter;
pub mod error;
mod inbox;
mod observation;
mod outbox;
pub mod protocol;
mod store;
mod task_inbox;

pub use cache::{MongoResultCache, RESULT_CACHE};
pub use dead_letter::MongoDeadLetters;
pub use inbox::MongoSignalInbox;
pub use observation::{MongoObservationRepository, ATTEMPTS_COLLECTION, AUDIT_COLLECTION, SNAPSHOTS_COLLECTION};
pub use outbox::{MongoOutbox, OutboxSchema};
pub use protocol::Limits;
pub use store::MongoWorkflowStore;
pub use task_inbox::MongoTaskInbox;

use mongodb::options::{Acknowledgment, ReadPreference, SelectionCriteria, WriteConcern};

/// Name of the instance collection.
pub const INSTANCES: &str = "workflow_instances";
/// Name of the inbox collection.
pub const INBOX: &str = "signal_inbox";
/// Default name of the dead-letter collection ([`MongoDeadLetters`]).
pub const DEAD_LETTERS: &str = "workflow_dead_letters";
/// Default name of the human-task collection ([`MongoTaskInbox`]).
pub const TASK_INBOX: &str = "workflow_task_inbox";

/// Adapter configuration.
#[derive(Debug, Clone)]
pub struct MongoConfig {
    /// Write concern of every write; default `w: majority` so an acknowledged claim or
    /// transition survives a primary failover.
    pub write_concern: WriteConcern,
    /// Payload and document size limits, checked before anything is sent.
    pub limits: Limits,
    /// Upper bound on one page of any scan, whatever the caller asks for.
    pub scan_page_max: usize,
}

impl Default for MongoConfig {
    fn default() -> Self {
        MongoConfig {
            write_concern: WriteConcern::builder().w(Acknowledgment::Majority).build(),
            limits: Limits::default(),
            scan_page_max: 1000,
        }
    }
}

impl MongoConfig {
    /// Reads always go to the primary: a guarded write decides from the primary's state,
    /// and a read that fed a decision must not be older than that.
    pub fn selection_criteria(&self) -> SelectionCriteria {
        SelectionCriteria::ReadPreference(ReadPreference::Primary)
    }
}

/// Connect to `uri` and return database `db_name` (no round trip is made until first use).
pub async fn connect(uri: &str, db_name: &str) -> kernel_core::Result<mongodb::Database> {
    let client = mongodb::Client::with_uri_str(uri).await.map_err(|e| error::map(error::Op::Read, "connect", e))?;
    Ok(client.database(db_name))
}
