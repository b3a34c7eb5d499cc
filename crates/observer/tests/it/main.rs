//! Integration tests of the observer: the conformance suite on the in-memory repository
//! (each store crate runs it on its own repository), the sink and writer under faults in
//! simulated time, repair and ops queries.

mod memory;
mod writer;
