#![doc = include_str!("../../README.md")]
//! Runnable examples of the durable workflow kernel, the story and the workflows its crash
//! sweep replays (from testkit's [`scenarios`]), and the real-process runs ([`real`]): worker processes on a durable store,
//! killed and stopped for real. The durable drivers come through `compose`, chosen by this
//! package's `durable` feature alone; without it no database or Redis crate is built.

pub mod real;

// The story, its workflows and fake business systems, and the sweep's scenarios live in
// testkit (the stores' integration tests replay them too); the demos use them from there.
pub use testkit::scenarios::{self, business, story, workflows};
