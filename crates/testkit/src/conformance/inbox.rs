//! Conformance cases for the inbox port (to be filled).
