//! Integration tests of the observer: the conformance suite on the in-memory repository
//! (and, with the `mongo` feature, on `MONGODB_URI`), the sink and writer under faults in
//! simulated time, repair and ops queries.

mod memory;
#[cfg(feature = "mongo")]
mod mongo;
mod writer;
