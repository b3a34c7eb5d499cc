#![doc = include_str!("../../README.md")]
//! Runnable examples of the durable workflow kernel and the workflows its crash sweep
//! replays. No database or Redis crate is a dependency of this package, so the first demo
//! builds fast and runs with no server.

pub mod business;
pub mod scenarios;
pub mod story;
pub mod workflows;
