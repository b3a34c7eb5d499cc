//! store-mongo integration tests: one binary, modules by concern.
//!
//! `protocol` needs no server. Everything else reads `MONGODB_URI` through
//! [`support::mongo_uri`]: unset → the test prints why and passes, except under CI (`CI=true` or `CI=1`, `testkit::ci`),
//! where a missing server fails the test. Each test works in a fresh, randomly named
//! database and drops it afterwards.

mod bad_input;
mod conformance;
mod errors;
mod observation;
mod outbox;
mod protocol;
mod quarantine;
mod races;
mod refused;
mod support;
mod sweep;
mod task_inbox;
