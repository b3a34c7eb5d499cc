#![doc = include_str!("../../README.md")]
//! Runnable examples of the durable workflow kernel and the workflows its crash sweep
//! replays, and the real-process runs ([`real`]): worker processes on a durable store,
//! killed and stopped for real. The durable drivers come through `compose`, chosen by this
//! package's `durable` feature alone; without it no database or Redis crate is built.

pub mod business;
pub mod real;
pub mod scenarios;
pub mod story;
pub mod workflows;
