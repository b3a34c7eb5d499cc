//! Starting workflows and the ready lanes (K-5, K-13): one by one, in batches, from a standalone
//! publisher, with promote-only priorities and a store fallback when the queue is down.

mod bulk_start;
mod priority_and_fallback;
mod standalone_publisher;
