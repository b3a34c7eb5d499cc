//! Claims and leases (K-6): what a claim does while it holds its lease, how it ends, and what
//! a zombie or a skewed clock can no longer do once the lease is lost.

mod claims;
mod clock_skew;
mod heartbeats;
mod lease_ends;
mod lease_loss;
mod lost_claims;
mod stream_fencing;
