//! Conformance cases for the store port (to be filled).
