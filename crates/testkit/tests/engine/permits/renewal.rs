//! What the engine does with a permit renewal's answer while the activity runs (K-14).

use crate::support::settle;
use kernel_core::engine::{ClaimEnd, RoundOutcome};
use kernel_core::ports::*;
use kernel_core::*;
use serde_json::json;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use testkit::harness::{test_config, World};

/// Permits that grant every acquire and answer renewals from a script (then grant).
#[derive(Default)]
struct ScriptedPermits {
    renewals_script: Mutex<VecDeque<Result<PermitDecision>>>,
    renewals: AtomicU32,
    releases: AtomicU32,
}

#[async_trait::async_trait]
impl Permits for ScriptedPermits {
    async fn acquire(&self, _resource: &str, _owner: &PermitOwner) -> Result<PermitDecision> {
        Ok(PermitDecision::Granted { lease_ms: DurationMs::from_millis(30_000) })
    }
    async fn renew(&self, _resource: &str, _owner: &PermitOwner) -> Result<PermitDecision> {
        self.renewals.fetch_add(1, Ordering::SeqCst);
        let next = self.renewals_script.lock().unwrap().pop_front();
        next.unwrap_or(Ok(PermitDecision::Granted { lease_ms: DurationMs::from_millis(30_000) }))
    }
    async fn release(&self, _resource: &str, _owner: &PermitOwner) -> Result<()> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    async fn usage(&self, resource: &str) -> Result<PermitUsage> {
        UnlimitedPermits.usage(resource).await
    }
    async fn resources(&self) -> Result<Vec<String>> {
        UnlimitedPermits.resources().await
    }
    async fn set_limits(&self, resource: &str, limits: PermitLimits) -> Result<()> {
        UnlimitedPermits.set_limits(resource, limits).await
    }
}

#[tokio::test]
async fn renewal_errors_are_retried_a_denial_stops_renewing_and_the_activity_keeps_running() {
    // K-14: an error is retried at the next interval, a denial ends renewal for this
    // invocation; neither cancels the admitted activity, and its permit is still released.
    let world = World::new(1);
    let permits = Arc::new(ScriptedPermits::default());
    permits.renewals_script.lock().unwrap().extend([
        Err(Error::unavailable("permit backend down")),
        Ok(PermitDecision::Granted { lease_ms: DurationMs::from_millis(30_000) }),
        Ok(PermitDecision::Denied { retry_after_ms: DurationMs::from_millis(1_000) }),
    ]);
    let gate = Arc::new(tokio::sync::Notify::new());
    let g = gate.clone();
    let activity = move |c: ActivityContext| {
        let g = g.clone();
        async move {
            tokio::select! {
                _ = g.notified() => Ok(StepOutcome::complete(json!("done"))),
                _ = c.cancellation().cancelled() => Err(ActivityError::transient("cancelled")),
            }
        }
    };
    let def = Definition::builder("t")
        .step(StepDef::new("asr", activity).resource("asr").timeout_ms(3_600_000))
        .build()
        .unwrap();
    let mut ports = world.ports();
    ports.permits = permits.clone();
    let engine = world.engine_on(ports, test_config("w"), vec![def]);
    let every = engine.config().permit_renew_ms;
    world.start_as(&engine, "t", "b", "wf-b").await;
    let e = engine.clone();
    let claim = tokio::spawn(async move { e.tick().await });
    settle().await;
    assert_eq!(permits.renewals.load(Ordering::SeqCst), 0, "no renewal before the first interval");
    for expected in 1..=3 {
        world.clock.advance(every);
        settle().await;
        assert_eq!(permits.renewals.load(Ordering::SeqCst), expected, "one renewal per interval, errors included");
    }
    for _ in 0..3 {
        world.clock.advance(every);
        settle().await;
    }
    assert_eq!(permits.renewals.load(Ordering::SeqCst), 3, "no renewal after a denial");
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!((i.steps[0].status, i.steps[0].attempt), (StepStatus::Running, 1), "the activity still runs");
    assert_eq!(permits.releases.load(Ordering::SeqCst), 0);
    gate.notify_one();
    let out = claim.await.unwrap().unwrap();
    assert!(matches!(out, RoundOutcome::Ran { end: ClaimEnd::Terminal(WorkflowStatus::Completed), .. }), "{out:?}");
    assert_eq!(world.store.peek("wf-b").unwrap().output["asr"], json!("done"));
    assert_eq!(permits.releases.load(Ordering::SeqCst), 1, "released when the activity returned");
}
