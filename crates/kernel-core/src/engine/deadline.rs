//! Deadlines on port calls, measured on the [`Clock`] port.
//!
//! A primary that stops answering must not hold a claim, a heartbeat or a scheduling round
//! forever. Every port the engine calls runs in the one [`PortEnvelope`](super::PortEnvelope)
//! (`envelope.rs`); the names below are that envelope on the three durable ports, kept for
//! the callers that wrap a port themselves (the publisher, the dispatch). The heartbeat adds
//! its own, shorter deadline (`EngineConfig::heartbeat_deadline_ms`) so that a process that
//! cannot renew its lease ends the claim before the lease can be taken over.

use super::enveloped::Enveloped;
use crate::domain::DurationMs;
use crate::error::{Error, Result};
use crate::ports::*;
use std::future::Future;

/// Run the write `fut` until `deadline_ms` of `clock` have passed; then give up as
/// [`Error::Uncertain`] (it may still be applied).
pub(crate) async fn write_within<T>(
    clock: &DynClock,
    deadline_ms: DurationMs,
    what: &str,
    fut: impl Future<Output = Result<T>>,
) -> Result<T> {
    let until = clock.now().saturating_add(deadline_ms);
    tokio::select! {
        r = fut => r,
        _ = clock.sleep_until(until) => {
            let message = format!("store {what}: no answer within {deadline_ms} ms");
            tracing::warn!(call = what, deadline_ms = deadline_ms.as_millis(), "store call passed its deadline");
            Err(Error::uncertain(message))
        }
    }
}

/// A [`WorkflowStore`] whose every call has a deadline on the given clock
/// ([`Enveloped::new`]).
///
/// A write that passes its deadline is [`Error::Uncertain`]: its effect is unknown, so the
/// caller ends the claim and never retries it blindly (K-6.4). A read that passes it is
/// [`Error::Unavailable`]. Answers within the deadline are passed through unchanged.
pub type DeadlineStore = Enveloped<DynStore>;

/// A [`SignalInbox`] whose every call has a deadline on the given clock, with the same
/// meaning as [`DeadlineStore`]. The inbox lives on the same durable store, so a hung
/// primary must not hold a signal delivery, a repair scan or a retention pass either.
pub type DeadlineInbox = Enveloped<DynInbox>;

/// A [`DispatchOutbox`] whose every call has a deadline on the given clock, with the same
/// meaning as [`DeadlineStore`]. [`Dispatch`](crate::dispatch::Dispatch) wraps its outbox in
/// one (`DispatchConfig::store_call_deadline_ms`).
pub type DeadlineOutbox = Enveloped<DynOutbox>;
