//! # kernel-core
//!
//! The pure heart of a durable workflow kernel: domain types, the identifier rule, plans
//! and fingerprints, readiness, guarded transitions, the ports (the **API boundary**) and
//! the engine that wires them together. No database or Redis crate is a dependency.
//!
//! A workflow is a persisted list of steps. Workers claim it with an expiring, fenced lease
//! ([`ports::WorkflowStore::claim`]); activities run at least once; waits release the
//! worker; every write is conditional ([`transition::Guard`]).
//!
//! See the repository README for a runnable "define a workflow" example.

pub mod activity;
pub mod agent_limits;
pub mod compensation;
pub mod definition;
pub mod dispatch;
pub mod engine;
pub mod error;
pub mod id;
mod journal;
pub use journal::RecordCursor;
pub mod domain;
pub mod model_call;
pub mod operator_request;
pub mod ports;
pub mod record;
pub mod time;
pub mod trace;
pub mod transition;
pub mod validate;

pub use activity::{idempotency_key, Activity, ActivityContext, ActivityError, SignalWaitSpec, StepOutcome};
pub use definition::{
    BranchInputs, Definition, OnFailed, OutcomeAuthority, Plan, PlanRegistry, ResourceFn, RetryPolicy, StepControl,
    StepDef,
};
pub use domain::*;
pub use engine::{
    Acted, CancelOutcome, Engine, EngineConfig, EngineHealth, Ports, Publisher, PublisherBuilder, StartOutcome,
    StartRequest,
};
pub use error::{Cause, Error, Result};
pub use id::{BusinessRound, ClaimToken, FencingToken, LeaseToken, ObjectId, WorkflowId};
