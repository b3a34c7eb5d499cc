//! store-sqlite integration tests: one binary, modules by concern.
//!
//! No server: each test works in a fresh SQLite file in its own temporary directory,
//! deleted afterwards. The fixtures open files with `synchronous=NORMAL` (a crash of the
//! process loses nothing committed, which is all these tests can observe); the kill test
//! (`durability`) uses the default, `FULL`.

mod bad_input;
mod conformance;
mod durability;
mod explain;
mod observation;
mod outbox;
mod protocol;
mod quarantine;
mod races;
mod support;
mod sweep;
mod task_inbox;
