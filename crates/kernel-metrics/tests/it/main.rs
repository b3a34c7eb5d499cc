//! Integration tests of the metric decorators, on the in-memory world of `testkit`.

mod decorators;
mod support;
