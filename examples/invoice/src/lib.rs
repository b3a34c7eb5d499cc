//! The invoice pipeline on the durable workflow kernel, runnable in memory and on SQLite:
//! receive (the file hash is the business key) → extract (a fake model, a versioned
//! schema, bounded re-sampling) → validate → approve (a human task above a threshold, with
//! an SLA and escalation) → post (a fake ledger, idempotency key, a reversal as its
//! compensation) → reconcile → notify (irreversible, last).
//!
//! [`eval`] runs it under injected faults (K-17.8) next to an all-agent baseline;
//! [`report`] writes the Markdown report and the PNG chart.

pub mod eval;
pub mod fakes;
pub mod pipeline;
pub mod report;
pub mod story;
pub mod world;
