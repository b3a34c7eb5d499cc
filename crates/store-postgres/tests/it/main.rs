//! store-postgres integration tests: one binary, modules by concern.
//!
//! `protocol` needs no server. Everything else connects to `DATABASE_URL`, else
//! `postgres://postgres@127.0.0.1:5432/test`, through [`support::server_url`]: a server
//! that does not answer makes the test print why and pass, except under CI (`CI=true` or
//! `CI=1`, `testkit::ci`), where it fails the test. Each test works in a fresh, randomly
//! named schema and drops it afterwards, even when the test panics.

mod bad_input;
mod conformance;
mod errors;
mod explain;
mod migrate;
mod observation;
mod outbox;
mod protocol;
mod quarantine;
mod races;
mod story;
mod support;
mod sweep;
mod task_inbox;
