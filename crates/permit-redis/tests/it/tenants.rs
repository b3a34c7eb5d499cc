//! K-14 through the engine on the Redis permits: a step's resource derived from the
//! workflow's input (`tenant:<t>:asr`) holds each tenant to its own ceiling, inherited from
//! the limits configured for `asr`.

use crate::{limits, permits_fixture};
use kernel_core::domain::WorkflowStatus;
use kernel_core::engine::EngineConfig;
use kernel_core::{ActivityContext, Definition, Engine, StartRequest, StepDef, StepOutcome};
use permit_redis::RedisPermitsConfig;
use serde_json::{json, Value};
use std::sync::Arc;
use testkit::harness::{test_config, World};

async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn redis_permits_hold_each_tenant_to_its_ceiling_through_the_engine() {
    let config = RedisPermitsConfig::new("unused", limits(0, 0)).default_limits("asr", limits(1, 0));
    let Some(fx) = permits_fixture("tenant_ceiling", 30_000, config).await else { return };
    let world = World::new(13);
    let (open, gate) = tokio::sync::watch::channel(false);
    let activity = move |c: ActivityContext| {
        let mut g = gate.clone();
        async move {
            let _ = g.wait_for(|open| *open).await;
            Ok(StepOutcome::complete(c.input()["tenant"].clone()))
        }
    };
    let def = Definition::builder("t")
        .step(StepDef::new("asr", activity).timeout_ms(3_600_000).resource_from(|input: &Value, _: &Value| {
            format!("tenant:{}:asr", input["tenant"].as_str().unwrap_or("none"))
        }))
        .build()
        .unwrap();
    let mut ports = world.ports();
    ports.permits = Arc::new(fx.worker().await);
    let engine: Engine = world.engine_on(ports, EngineConfig { worker_slots: 4, ..test_config("w") }, vec![def]);
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
    // Redis answers on its own time: wait (bounded) until every round has either started
    // its activity or deferred.
    for _ in 0..200 {
        let deferred = world.store.all().iter().filter(|i| i.steps[0].traffic_waits == 1).count();
        if deferred == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        settle().await;
    }
    assert_eq!(fx.permits.holders("tenant:a:asr").await.unwrap().len(), 1);
    assert_eq!(fx.permits.holders("tenant:b:asr").await.unwrap().len(), 1);
    let deferred = world.store.all().iter().filter(|i| i.steps[0].traffic_waits == 1).count();
    assert_eq!(deferred, 2, "the second workflow of each tenant waits for its tenant's permit");
    open.send(true).unwrap();
    for r in rounds {
        r.await.unwrap().unwrap();
    }
    world.drive(&engine).await.unwrap();
    for i in world.store.all() {
        assert_eq!(i.status, WorkflowStatus::Completed, "{}", i.workflow_id);
    }
}
