//! The maintenance pass and the paths outside a claim (K-9, K-13, K-15): timers, signal repair,
//! inbox retention, re-enqueues, observations, and the engine's health.

mod health;
mod inbox_retention;
mod outside_claims;
mod undecodable_signals;
