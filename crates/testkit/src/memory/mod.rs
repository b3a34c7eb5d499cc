//! In-memory adapters with the same atomicity as the real ones: every port call takes one
//! lock, so each is linearizable, like a single-document conditional update.

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
