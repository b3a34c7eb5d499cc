//! A worker whose queue is `REDIS_URL` — one server, or a Redis Cluster
//! (`redis+cluster://host:port,…`, the form the test script runs this with) — under a random
//! prefix, on a `memory:` store: lanes, wakeup and a permit carry ten workflows to
//! completion, and `destroy` leaves no key under the prefix on any node. Skipped (with the
//! reason printed) when `REDIS_URL` is unset, except under CI (`testkit::ci`).

use compose::{Deployment, QueueOptions, Scheme};
use kernel_core::domain::DurationMs;
use kernel_core::engine::{Engine, EngineConfig};
use kernel_core::ports::{IdGenerator, RandomIds};
use kernel_core::{Definition, StartRequest, StepDef, StepOutcome, WorkflowStatus};
use serde_json::json;

#[tokio::test]
async fn a_worker_on_a_redis_queue_url_completes_workflows_and_destroy_clears_every_node() {
    let test = "a_worker_on_a_redis_queue_url_completes_workflows_and_destroy_clears_every_node";
    let Some(redis) = std::env::var("REDIS_URL")
        .ok()
        .filter(|v| !v.is_empty())
        .or_else(|| testkit::ci::skip_or_fail(test, "REDIS_URL unset"))
    else {
        return;
    };
    let prefix = format!("wfk_cq_{}", RandomIds::default().new_token());
    let queue_url = format!("{}/?prefix={prefix}", redis.trim_end_matches('/'));
    let d = Deployment::connect("memory:", &queue_url, &QueueOptions::default()).await.unwrap();
    assert_eq!(d.queue.scheme, Scheme::Redis);
    let def = Definition::builder("cq")
        .step(StepDef::new("a", |_| async { Ok(StepOutcome::complete(json!(1))) }).resource("asr"))
        .step(StepDef::new("b", |_| async { Ok(StepOutcome::complete(json!(2))) }).depends_on(["a"]))
        .build()
        .unwrap();
    let config = EngineConfig {
        worker_id: "w".into(),
        poll_interval_ms: DurationMs::from_millis(50),
        ..EngineConfig::default()
    };
    let engine = Engine::builder(d.ports().build().unwrap()).config(config).register(def).build().unwrap();
    let running = engine.spawn();
    let mut ids = Vec::new();
    for i in 0..10 {
        let out = engine.publisher().start_or_resume(StartRequest::new("cq", format!("cq:{i}"), json!({}))).await;
        ids.push(out.unwrap().instance.workflow_id);
    }
    let mut done = 0;
    for _ in 0..1_000 {
        done = 0;
        for id in &ids {
            if d.store.store.get(id).await.unwrap().map(|i| i.status) == Some(WorkflowStatus::Completed) {
                done += 1;
            }
        }
        if done == ids.len() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(running.shutdown().await, "clean shutdown");
    assert_eq!(done, ids.len(), "completed, read from the store");
    let keys = queue_redis::test_support::TestKeys { url: redis.clone(), prefix: prefix.clone() };
    assert!(!keys.keys().is_empty(), "the lanes' rotation and the permit live under {prefix}");
    d.destroy().await.unwrap();
    assert_eq!(keys.keys(), Vec::<String>::new(), "destroy purged every node");
}
