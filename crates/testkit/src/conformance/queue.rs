//! Conformance cases for the queue port (to be filled).
