//! Permits (K-14): capacity before each activity entry, renewed while it runs, released when it
//! returns, per derived resource and tenant.

mod deferral;
mod held_permits;
mod renewal;
