//! Regression tests of the hardening issue: a held lease or permit lives exactly as long as
//! the work it covers, store calls have deadlines on the clock, PrepareContext converges,
//! and a step's resource can be derived per workflow (K-6, K-14, K-2.3).

use kernel_core::engine::{ClaimEnd, RoundOutcome};
use kernel_core::ports::*;
use kernel_core::*;
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use testkit::harness::{test_config, World};

async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

fn limits(pairs: &[(&str, u32)]) -> HashMap<String, PermitLimits> {
    pairs
        .iter()
        .map(|(r, n)| (r.to_string(), PermitLimits { max_concurrency: *n, max_starts_per_second: 0 }))
        .collect()
}

fn other_owner(step: &str) -> PermitOwner {
    PermitOwner { workflow_id: "wf-other".into(), step: step.into(), claim_token: "tok-other".into() }
}

#[tokio::test]
async fn hardening_05_a_timed_out_activity_keeps_its_permit_until_it_returns() {
    // max_concurrency = 1. The activity ignores its cancellation and returns only when the
    // gate opens, long after its timeout and after the permit lease would have run out.
    let world = World::with_limits(5, limits(&[("r", 1)]));
    let gate = Arc::new(tokio::sync::Notify::new());
    let returned = Arc::new(AtomicU32::new(0));
    let (g, ret) = (gate.clone(), returned.clone());
    let activity = move |_c: ActivityContext| {
        let (g, ret) = (g.clone(), ret.clone());
        async move {
            g.notified().await;
            ret.fetch_add(1, Ordering::SeqCst);
            Ok(StepOutcome::complete(json!("late")))
        }
    };
    let def = Definition::builder("t")
        .step(StepDef::new("call", activity).resource("r").timeout_ms(5_000).max_retry(3))
        .build()
        .unwrap();
    let engine = world.engine("w", vec![def]);
    let every = engine.config().permit_renew_ms;
    engine.publisher().start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf-5")).await.unwrap();
    let e = engine.clone();
    let claim = tokio::spawn(async move { e.tick().await });
    settle().await;
    assert_eq!(world.permits.holders("r"), 1, "the step holds its permit");
    world.clock.advance(5_000);
    settle().await;
    // Well past the permit lease (30 s), one renewal interval at a time.
    for _ in 0..6 {
        world.clock.advance(every);
        settle().await;
    }
    assert_eq!(returned.load(Ordering::SeqCst), 0, "the timed-out call is still in flight");
    let second = world.permits.acquire("r", &other_owner("call")).await.unwrap();
    assert!(
        matches!(second, PermitDecision::Denied { .. }),
        "max_concurrency exceeded while the timed-out call is in flight: {second:?}"
    );
    gate.notify_one();
    let out = claim.await.unwrap().unwrap();
    assert!(matches!(out, RoundOutcome::Ran { .. }), "{out:?}");
    assert_eq!(world.permits.holders("r"), 0, "released once the call returned");
}
