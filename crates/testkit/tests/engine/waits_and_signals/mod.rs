//! Waits and signals (K-9): a waiting workflow holds no worker, a signal wakes its wait once,
//! and the signals the inbox keeps are bounded.

mod signal_caps;
mod signal_waits;
