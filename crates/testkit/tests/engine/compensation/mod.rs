//! Compensation (K-17.6): declared inverses run in reverse completion order when a workflow
//! fails, their progress is durable, and a person is asked when an inverse keeps failing.

mod inverses;
mod progress;
