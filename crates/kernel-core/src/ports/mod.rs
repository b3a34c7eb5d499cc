//! **API boundary.** The ports of the kernel: small, object-safe, `Send + Sync + 'static`
//! traits, each usable as `Arc<dyn …>` so a deployment picks adapters at run time.
//!
//! Every method documents its `# Contract`: what is atomic, which condition guards a write,
//! what a miss means and what is idempotent. `testkit` holds one conformance suite per port
//! that every adapter runs.

mod cache;
mod clock;
mod dead_letter;
mod dispatch;
mod ids;
mod inbox;
mod observe;
mod permits;
mod queue;
mod store;
mod stream;
mod task_inbox;

pub use cache::*;
pub use clock::*;
pub use dead_letter::*;
pub use dispatch::*;
pub use ids::*;
pub use inbox::*;
pub use observe::*;
pub use permits::*;
pub use queue::*;
pub use store::*;
pub use stream::*;
pub use task_inbox::*;
