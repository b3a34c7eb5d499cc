//! The shared queue conformance suite on Redis.

testkit::queue_conformance!(crate::queue_fixture);
