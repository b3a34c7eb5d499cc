//! Conformance suites: one per port, as `pub async fn` cases taking the port as `&dyn …`,
//! plus a macro per suite that expands to one named `#[tokio::test]` per case. Every
//! adapter crate invokes the macro once; the in-memory adapters run it too.

pub mod cache;
pub mod dead_letter;
pub mod inbox;
pub mod outbox;
pub mod permits;
pub mod queue;
pub mod store;
pub mod task_inbox;
pub mod task_inbox_extra;
pub mod wakeup;
