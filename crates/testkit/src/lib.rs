//! # testkit
//!
//! Everything needed to test workflows and adapters of the durable workflow kernel without
//! servers:
//!
//! - [`memory`]: the in-memory adapters of the `kernel-memory` crate, re-exported (store,
//!   inbox, ready queue, wakeup, permits… with the same atomicity as the real adapters, a
//!   [`ManualClock`](memory::ManualClock) and deterministic ids);
//! - [`faults`]: decorators that crash before/after any port call (once, or every n-th
//!   call over an engine's life), lose wakeups, flush the queue, and audit every store
//!   write; each implements every method of the port it wraps;
//! - [`conformance`]: one suite per port, as `pub async fn` cases plus a macro, that every
//!   adapter runs;
//! - [`harness`]: a wired in-memory world, drivers that run one or several engines to
//!   quiescence in simulated time and report how each claim ended, and the crash-window
//!   sweep;
//! - [`dispatch`]: the same for the dispatch paths (K-11);
//! - [`port_faults`]: a hook in the engine's port envelope that hangs any port's calls
//!   and counts every call (K-6.8);
//! - [`scenarios`]: the workflows, fake business systems, the live-summary story and the
//!   crash-sweep scenarios that the stores' integration tests replay.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use testkit::harness::World;
//! let world = World::new(7);
//! assert_eq!(world.queue.len(), 0);
//! let engine = world.engine("w", vec![]);
//! let report = world.drive(&engine).await.unwrap();
//! assert_eq!(report.claims(), 0);
//! # }
//! ```

pub mod ci;
pub mod conformance;
pub mod dispatch;
pub mod faults;
pub mod harness;
pub mod memory;
pub mod port_faults;
pub mod protocol_cases;
pub mod scenarios;
pub mod time;
