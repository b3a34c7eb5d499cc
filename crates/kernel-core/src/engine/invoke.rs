//! The single activity entry point (K-7.3): a fresh timeout window per invocation,
//! cancellation passed in, panics captured as step errors, and the step's permit renewed
//! while the activity runs (K-14). It performs no write: the claim driver decides what the
//! result means.

use crate::activity::{Activity, ActivityContext, ActivityError, StepOutcome};
use crate::domain::DurationMs;
use crate::ports::{DynClock, DynPermits, PermitDecision, PermitOwner};
use futures::FutureExt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// A permit held for one invocation of a step.
#[derive(Debug)]
pub(crate) struct HeldPermit {
    /// The traffic resource it counts against.
    pub(crate) resource: String,
    /// `workflow_id + step + claim_token` (K-14).
    pub(crate) owner: PermitOwner,
}

/// Renewal of a held permit while its activity runs.
pub(crate) struct Renewal<'a> {
    /// Where the permit lives.
    pub(crate) permits: &'a DynPermits,
    /// The permit to renew.
    pub(crate) permit: &'a HeldPermit,
    /// Time between renewals (`EngineConfig::permit_renew_ms`).
    pub(crate) every_ms: DurationMs,
}

/// What one invocation returned.
#[derive(Debug)]
pub(crate) struct Invocation {
    /// The activity's answer; a timeout or a panic is a transient error.
    pub(crate) result: Result<StepOutcome, ActivityError>,
    /// Clock time from the call to its return (never negative).
    pub(crate) elapsed_ms: DurationMs,
}

/// Invoke `activity` once. After `timeout_ms` its cancellation is triggered and the call
/// is awaited to its end (no overlapping attempts, K-7.3), its permit still renewed
/// meanwhile (the call still counts against its resource, K-14), then reported as a
/// transient timeout. A panic is a transient error carrying the panic message.
pub(crate) async fn invoke(
    clock: &Arc<DynClock>,
    activity: Arc<dyn Activity>,
    ctx: ActivityContext,
    cancel: CancellationToken,
    timeout_ms: DurationMs,
    renewal: Option<Renewal<'_>>,
) -> Invocation {
    let start = clock.now();
    // Saturating: a timeout too long to represent as an instant never fires.
    let deadline = start.saturating_add(timeout_ms);
    let fut = AssertUnwindSafe(async move { activity.run(ctx).await }).catch_unwind();
    tokio::pin!(fut);
    let renew = async {
        match renewal {
            Some(r) => renew_while_running(clock, r).await,
            None => std::future::pending::<()>().await,
        }
    };
    tokio::pin!(renew);
    let result = loop {
        tokio::select! {
            r = &mut fut => break r,
            _ = clock.sleep_until(deadline) => {
                tracing::warn!(timeout_ms = timeout_ms.as_millis(), "activity timed out; waiting for it to return");
                cancel.cancel();
                // The call is still in flight and still counts against the resource: keep
                // renewing its permit until it has actually returned (K-14).
                loop {
                    tokio::select! {
                        _ = &mut fut => break,
                        _ = &mut renew => {}
                    }
                }
                break Ok(Err(ActivityError::transient(format!("timed out after {timeout_ms} ms"))));
            }
            _ = &mut renew => {}
        }
    };
    let elapsed_ms = (clock.now() - start).max(DurationMs::ZERO);
    let result = result.unwrap_or_else(|panic| {
        let msg = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "non-string panic".into());
        tracing::error!(panic = %msg, "activity panicked");
        Err(ActivityError::transient(format!("panic: {msg}")))
    });
    Invocation { result, elapsed_ms }
}

/// Renew the permit every `every_ms` until the activity returns (the caller drops this
/// future then). What a renewal's answer does:
///
/// - granted: nothing more;
/// - an error: logged at warn level and tried again at the next interval. The activity
///   keeps running: it was admitted, and a lapsed lease is re-registered by the next
///   renewal that succeeds, so the overshoot stays bounded by one renewal interval (K-14);
/// - denied: the adapter refuses to keep this owner's permit, which renewing again will
///   not change; logged at warn level and renewal stops. The activity keeps running (held
///   permits are never revoked, K-14); its permit is still released when it returns.
async fn renew_while_running(clock: &Arc<DynClock>, r: Renewal<'_>) {
    loop {
        clock.sleep_until(clock.now().saturating_add(r.every_ms)).await;
        match r.permits.renew(&r.permit.resource, &r.permit.owner).await {
            Ok(PermitDecision::Granted { .. }) => {}
            Ok(PermitDecision::Denied { .. }) => {
                tracing::warn!(resource = %r.permit.resource, "permit renewal denied; no further renewal for this invocation");
                return std::future::pending().await;
            }
            Err(e) => {
                tracing::warn!(resource = %r.permit.resource, error = %e, "permit renewal failed; retrying at the next interval");
            }
        }
    }
}
