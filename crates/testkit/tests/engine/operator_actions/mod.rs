//! Operator actions (K-6.8, K-8, K-17.2): cancel, replay, regenerate and dead-letter decisions,
//! alone and raced against live claims.

mod cancel_and_replay;
mod dead_letter_decisions;
mod live_claims;
mod races;
