//! # testkit
//!
//! Everything needed to test workflows and adapters of the durable workflow kernel without
//! servers:
//!
//! - [`memory`]: in-memory store, inbox, ready queue, wakeup and permits with the same
//!   atomicity as the real adapters, a [`ManualClock`](memory::ManualClock) and
//!   deterministic ids;
//! - [`faults`]: decorators that crash before/after any port call, lose wakeups, flush the
//!   queue;
//! - [`conformance`]: one suite per port, as `pub async fn` cases plus a macro, that every
//!   adapter runs;
//! - [`harness`]: a wired in-memory world and the crash-window sweep.
//!
//! ```
//! use testkit::harness::World;
//! let world = World::new(7);
//! assert_eq!(world.queue.len(), 0);
//! ```

pub mod conformance;
pub mod dispatch;
pub mod faults;
pub mod harness;
pub mod memory;
