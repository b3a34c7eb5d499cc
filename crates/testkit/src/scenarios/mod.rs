//! The workflows, fake business systems and scenarios that the crash-window sweeps and the
//! stores' integration tests replay, in memory and on every durable store:
//!
//! - [`business`]: a fake business collection fenced by the round's token and fake
//!   speech-recognition and summarizer services;
//! - [`workflows`]: the workflow definitions of the story and of the sweep;
//! - [`story`]: the live-summary story (the README's first demo) as a driver over any
//!   [`World`](crate::harness::World), in memory or on a durable store;
//! - [`sweep`] (re-exported here): the [`Scenario`](crate::harness::Scenario)s of the
//!   crash-window sweep.

pub mod business;
pub mod story;
pub mod sweep;
pub mod workflows;

pub use sweep::*;
