//! # kernel-memory
//!
//! In-memory adapters of every port of the durable workflow kernel, shipped beside the
//! ports as a product, not as test support: a store ([`InMemoryStore`]), a signal inbox
//! ([`InMemoryInbox`]), the dispatch outbox and candidate index ([`InMemoryOutbox`],
//! [`InMemoryCandidates`]), the ready queue and its wakeup ([`InMemoryQueue`],
//! [`InMemoryWakeup`]), permits ([`InMemoryPermits`]), dead letters
//! ([`MemoryDeadLetters`]), human tasks ([`MemoryTaskInbox`]), the result cache
//! ([`MemoryResultCache`]), a clock that moves only when told ([`ManualClock`], and
//! [`SkewedClock`], another process's view of it) and deterministic ids ([`SeqIds`]).
//!
//! Nothing survives the process and nothing is shared with another process: a deployment
//! uses them for demos, for a single-process run whose state may be lost, and as the
//! reference every real adapter is checked against (testkit's conformance suites run on
//! both).
//!
//! # Contract
//!
//! Each adapter keeps the `# Contract` of its port with the same atomicity as the real
//! adapters: every port call takes one lock, so each call is linearizable, as a
//! single-document conditional update on MongoDB, a transaction on PostgreSQL or SQLite,
//! or one Lua script on Redis. Each refuses exactly what the real adapters refuse, with
//! the shared checks of `kernel_core::validate` and the ports' own checks. Clones of an
//! adapter share its state.
//!
//! A few methods beyond the ports simulate what a real backend can suffer, for
//! demonstrations of recovery: [`InMemoryQueue::flush`] and [`InMemoryQueue::set_down`] (a
//! flushed or unreachable Redis), [`InMemoryWakeup::set_lossy`] (lost notifications),
//! [`InMemoryStore::fork`] (the durable state a crash leaves).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use kernel_core::engine::Ports;
//! use kernel_core::ports::{Clock, ReadyQueue};
//! use kernel_core::domain::DurationMs;
//! use kernel_core::Priority;
//! use kernel_memory::{InMemoryInbox, InMemoryPermits, InMemoryQueue, InMemoryStore, InMemoryWakeup};
//! use kernel_memory::{ManualClock, SeqIds};
//! use std::sync::Arc;
//!
//! let clock = Arc::new(ManualClock::new(1_000));
//! let queue = Arc::new(InMemoryQueue::default());
//! let ports = Ports::builder()
//!     .store(Arc::new(InMemoryStore::new()))
//!     .inbox(Arc::new(InMemoryInbox::new()))
//!     .queue(queue.clone())
//!     .wakeup(Arc::new(InMemoryWakeup::new()))
//!     .permits(Arc::new(InMemoryPermits::new(clock.clone(), Default::default(), 30_000)))
//!     .clock(clock.clone())
//!     .ids(Arc::new(SeqIds::new("demo", 7)))
//!     .build()
//!     .expect("every required port is set");
//!
//! // A candidate due in one second is popped once the clock reaches it.
//! ports.queue.enqueue(&"wf-1".into(), Priority::P1, clock.now().saturating_add(DurationMs::from_millis(1_000))).await.unwrap();
//! assert!(ports.queue.pop_due(clock.now(), 8).await.unwrap().is_empty());
//! clock.advance(1_000);
//! assert_eq!(ports.queue.pop_due(clock.now(), 8).await.unwrap(), vec!["wf-1"]);
//! assert!(queue.is_empty());
//! # }
//! ```

mod cache;
mod clock;
mod dead_letter;
mod inbox;
mod outbox;
mod permits;
mod queue;
mod store;
mod task_inbox;

pub use cache::MemoryResultCache;
pub use clock::{ManualClock, SeqIds, SkewedClock};
pub use dead_letter::MemoryDeadLetters;
pub use inbox::InMemoryInbox;
pub use outbox::{InMemoryCandidates, InMemoryOutbox};
pub use permits::{InMemoryPermits, PermitLimits};
pub use queue::{InMemoryQueue, InMemoryWakeup, LaneWeights};
pub use store::InMemoryStore;
pub use task_inbox::MemoryTaskInbox;
