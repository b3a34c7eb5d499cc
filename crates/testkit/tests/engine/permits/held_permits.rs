//! A permit lives exactly as long as the work it covers, and a step's resource can be derived
//! per workflow and per tenant (K-14, K-2.3).

use crate::support::settle;
use kernel_core::engine::RoundOutcome;
use kernel_core::ports::*;
use kernel_core::*;
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use testkit::harness::{test_config, World};

fn limits(pairs: &[(&str, u32)]) -> HashMap<String, PermitLimits> {
    pairs.iter().map(|(r, n)| (r.to_string(), PermitLimits { max_concurrency: *n, max_starts_per_second: 0 })).collect()
}

fn other_owner(step: &str) -> PermitOwner {
    PermitOwner { workflow_id: "wf-other".into(), step: step.into(), claim_token: "tok-other".into() }
}

#[tokio::test]
async fn a_timed_out_activity_keeps_its_permit_until_it_returns() {
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
    world.start_as(&engine, "t", "b", "wf-5").await;
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

#[tokio::test]
async fn two_tenants_are_each_held_to_their_own_ceiling_through_the_engine() {
    // K-14: `tenant:<t>:asr` falls back to the limit configured for `asr` (1 at a time).
    // The step's resource is derived from the workflow's input, so each tenant has its own
    // ceiling: one call per tenant runs, the second of each tenant waits.
    let world = World::with_limits(13, limits(&[("asr", 1)]));
    let (open, gate) = tokio::sync::watch::channel(false);
    let running: Arc<std::sync::Mutex<HashMap<String, u32>>> = Arc::default();
    let peak: Arc<std::sync::Mutex<HashMap<String, u32>>> = Arc::default();
    let (g, r, p) = (gate, running.clone(), peak.clone());
    let activity = move |c: ActivityContext| {
        let (g, r, p) = (g.clone(), r.clone(), p.clone());
        async move {
            let tenant = c.input()["tenant"].as_str().unwrap().to_string();
            {
                let mut r = r.lock().unwrap();
                let n = r.entry(tenant.clone()).or_default();
                *n += 1;
                let mut p = p.lock().unwrap();
                let m = p.entry(tenant.clone()).or_default();
                *m = (*m).max(*n);
            }
            let mut g = g;
            let _ = g.wait_for(|open| *open).await;
            *r.lock().unwrap().get_mut(&tenant).unwrap() -= 1;
            Ok(StepOutcome::complete(json!(tenant)))
        }
    };
    let def = Definition::builder("t")
        .step(StepDef::new("asr", activity).timeout_ms(3_600_000).resource_from(
            |input: &serde_json::Value, _prepared: &serde_json::Value| {
                format!("tenant:{}:asr", input["tenant"].as_str().unwrap_or("none"))
            },
        ))
        .build()
        .unwrap();
    let config = EngineConfig { worker_slots: 4, ..test_config("w") };
    let engine = world.engine_on(world.ports(), config, vec![def]);
    for (i, tenant) in ["a", "a", "b", "b"].iter().enumerate() {
        let req = StartRequest::new("t", format!("b{i}"), json!({ "tenant": tenant })).workflow_id(format!("wf-{i}"));
        engine.publisher().start_or_resume(req).await.unwrap();
    }
    let rounds: Vec<_> = (0..4)
        .map(|_| {
            let e = engine.clone();
            tokio::spawn(async move { e.tick().await })
        })
        .collect();
    settle().await;
    assert_eq!(world.permits.holders("tenant:a:asr"), 1);
    assert_eq!(world.permits.holders("tenant:b:asr"), 1);
    let at_once: u32 = running.lock().unwrap().values().sum();
    assert_eq!(at_once, 2, "one call per tenant at once, both tenants progressing");
    let deferred = world.instances().await.unwrap().iter().filter(|i| i.steps[0].traffic_waits == 1).count();
    assert_eq!(deferred, 2, "the second workflow of each tenant waits for its tenant's permit");
    open.send(true).unwrap();
    for r in rounds {
        r.await.unwrap().unwrap();
    }
    world.drive(&engine).await.unwrap();
    for i in world.instances().await.unwrap() {
        assert_eq!(i.status, WorkflowStatus::Completed, "{}", i.workflow_id);
    }
    assert!(
        peak.lock().unwrap().values().all(|&m| m == 1),
        "a tenant exceeded its ceiling: {:?}",
        peak.lock().unwrap()
    );
}

#[tokio::test]
async fn an_invalid_derived_resource_fails_the_step_without_entering_it() {
    let world = World::new(13);
    let entries = Arc::new(AtomicU32::new(0));
    let n = entries.clone();
    let activity = move |_c: ActivityContext| {
        let n = n.clone();
        async move {
            n.fetch_add(1, Ordering::SeqCst);
            Ok(StepOutcome::complete(json!(1)))
        }
    };
    let def = Definition::builder("t")
        .step(StepDef::new("asr", activity).resource_from(|input: &serde_json::Value, _: &serde_json::Value| {
            format!("tenant:{}:asr", input["tenant"].as_str().unwrap_or_default())
        }))
        .build()
        .unwrap();
    let engine = world.engine("w", vec![def]);
    let req = StartRequest::new("t", "b", json!({ "tenant": "a.b" })).workflow_id("wf-13");
    engine.publisher().start_or_resume(req).await.unwrap();
    world.drive(&engine).await.unwrap();
    let i = world.store.peek("wf-13").unwrap();
    assert_eq!((i.status, i.steps[0].status), (WorkflowStatus::Failed, StepStatus::Failed));
    let msg = &i.steps[0].error.as_ref().unwrap().message;
    assert!(msg.contains("resource"), "{msg}");
    assert_eq!(entries.load(Ordering::SeqCst), 0, "the activity was never entered");
}

#[tokio::test]
async fn a_panicking_resource_function_fails_the_step_without_entering_it() {
    // A derive function that panics fails the step for good without entering it, like an
    // invalid derived resource; the claim is not killed and repeated.
    let world = World::new(13);
    let entries = Arc::new(AtomicU32::new(0));
    let n = entries.clone();
    let activity = move |_c: ActivityContext| {
        let n = n.clone();
        async move {
            n.fetch_add(1, Ordering::SeqCst);
            Ok(StepOutcome::complete(json!(1)))
        }
    };
    let def = Definition::builder("t")
        .step(StepDef::new("asr", activity).resource_from(|input: &serde_json::Value, _: &serde_json::Value| {
            format!("tenant:{}:asr", input["tenant"].as_str().expect("a tenant"))
        }))
        .build()
        .unwrap();
    let engine = world.engine("w", vec![def]);
    let req = StartRequest::new("t", "b", json!({ "no_tenant": true })).workflow_id("wf-13p");
    engine.publisher().start_or_resume(req).await.unwrap();
    let report = tokio::spawn({
        let (world, engine) = (world.clone(), engine.clone());
        async move { world.drive_until(&engine, 50, &|| false).await }
    })
    .await
    .expect("the driver survives a panicking resource function")
    .unwrap();
    let i = world.store.peek("wf-13p").unwrap();
    assert_eq!((i.status, i.steps[0].status), (WorkflowStatus::Failed, StepStatus::Failed));
    let msg = &i.steps[0].error.as_ref().unwrap().message;
    assert!(msg.contains("resource") && msg.contains("panicked"), "{msg}");
    assert_eq!(entries.load(Ordering::SeqCst), 0, "the activity was never entered");
    assert_eq!(report.claims(), 1, "one claim");
}
