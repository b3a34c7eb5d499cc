//! Fault decorators.
