//! Conformance cases for the permits port (to be filled).
