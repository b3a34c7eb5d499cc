//! The console's HTTP API over an in-process deployment: every action, done and refused
//! (K-6.4 guards, roles, credentials, CSRF), the reads, the pages.

mod access;
mod actions;
mod reads;
mod rig;
