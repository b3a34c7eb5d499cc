//! A deployment built from real URLs: `MONGODB_URI` and `REDIS_URL`, in a random database
//! and under a random key prefix, both deleted at the end. Skipped (with the reason
//! printed) when either is unset, except under CI (`testkit::ci`), where that fails.

use compose::{Deployment, QueueOptions, Scheme};
use kernel_core::engine::{EngineConfig, Publisher};
use kernel_core::ports::{IdGenerator, RandomIds};
use kernel_core::{Definition, PlanRegistry, StartRequest, StepDef, StepOutcome, WorkflowStatus};
use serde_json::json;

fn servers(test: &str) -> Option<(String, String)> {
    let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    match (get("MONGODB_URI"), get("REDIS_URL")) {
        (Some(m), Some(r)) => Some((m, r)),
        _ => testkit::ci::skip_or_fail(test, "MONGODB_URI or REDIS_URL unset"),
    }
}

#[tokio::test]
async fn mongo_and_redis_from_urls_publish_and_clean_up() {
    let Some((mongo, redis)) = servers("mongo_and_redis_from_urls_publish_and_clean_up") else { return };
    let ns = format!("wfk_compose_{}", RandomIds::default().new_token());
    let store_url = format!("{}/{ns}", mongo.trim_end_matches('/'));
    let queue_url = format!("{}/?prefix={ns}", redis.trim_end_matches('/'));
    let d = Deployment::connect(&store_url, &queue_url, &QueueOptions::default()).await.unwrap();
    assert_eq!((d.store.scheme, d.queue.scheme), (Scheme::Mongo, Scheme::Redis));
    assert_eq!(d.describe(), "store=mongo queue=redis");

    let def = Definition::builder("t")
        .step(StepDef::new("a", |_| async { Ok(StepOutcome::complete(json!(1))) }))
        .build()
        .unwrap();
    let mut plans = PlanRegistry::default();
    plans.register(def.plan().clone());
    let publisher = Publisher::new(d.ports().build().unwrap(), plans, EngineConfig::default().payload_bytes_max);
    let out = publisher.start_or_resume(StartRequest::new("t", "t:1", json!({}))).await.unwrap();
    assert!(out.created);
    let read = d.store.store.get(&out.instance.workflow_id).await.unwrap().unwrap();
    assert_eq!(read.status, WorkflowStatus::Running);
    // The publisher offered it to the Redis lanes under the URL's prefix.
    assert_eq!(d.queue.queue.pop_due(kernel_core::Instant::MAX, 8).await.unwrap(), [read.workflow_id.as_str()]);
    d.queue.queue.enqueue(&read.workflow_id, kernel_core::Priority::P2, kernel_core::Instant::ZERO).await.unwrap();

    d.clone().destroy().await.unwrap();
    // Both namespaces are gone: a fresh connection sees neither the instance nor the lane.
    let again = Deployment::connect(&store_url, &queue_url, &QueueOptions::default()).await.unwrap();
    assert!(again.store.store.get(&read.workflow_id).await.unwrap().is_none());
    assert!(again.queue.queue.pop_due(kernel_core::Instant::MAX, 8).await.unwrap().is_empty());
    again.destroy().await.unwrap();
}

#[tokio::test]
async fn scratch_namespaces_hold_the_outbox_dead_letters_cache_candidates_and_stream_and_are_destroyed() {
    let Some((mongo, redis)) =
        servers("scratch_namespaces_hold_the_outbox_dead_letters_cache_candidates_and_stream_and_are_destroyed")
    else {
        return;
    };
    let store = compose::StoreSide::connect_scratch(&mongo, "wfk_scratch").await.unwrap();
    let queue = compose::QueueSide::connect_scratch(&redis, &QueueOptions::default(), "wfk_scratch").await.unwrap();
    let db = store.mongo_database().unwrap().clone();
    assert!(db.name().starts_with("wfk_scratch_") && db.name() != compose::DEFAULT_DATABASE, "{}", db.name());
    let prefix = queue.key_prefix().unwrap().to_string();
    assert!(prefix.starts_with("wfk_scratch_"), "{prefix}");
    // A second scratch connection gets another namespace.
    let other = compose::StoreSide::connect_scratch(&mongo, "wfk_scratch").await.unwrap();
    assert_ne!(other.mongo_database().unwrap().name(), db.name());
    other.destroy().await.unwrap();

    // The concrete store lists what the port wrote.
    let def = Definition::builder("t")
        .step(StepDef::new("a", |_| async { Ok(StepOutcome::complete(json!(1))) }))
        .build()
        .unwrap();
    let mut plans = PlanRegistry::default();
    plans.register(def.plan().clone());
    let d = Deployment { store: store.clone(), queue: queue.clone() };
    let publisher = Publisher::new(d.ports().build().unwrap(), plans, EngineConfig::default().payload_bytes_max);
    let out = publisher.start_or_resume(StartRequest::new("t", "t:1", json!({}))).await.unwrap();
    let listed = store.mongo_store().unwrap().list(10).await.unwrap();
    assert_eq!(listed.iter().map(|i| i.workflow_id.as_str()).collect::<Vec<_>>(), [out.instance.workflow_id.as_str()]);
    // The outbox opens its collection in the same database.
    let outbox = store.dispatch_outbox().await.unwrap();
    assert!(outbox.get(&kernel_core::ObjectId::from("none")).await.unwrap().is_none());
    // Dead letters and the result cache come with the ports, in the same database.
    crate::ports::round_trip_through_the_ports(&d, "wf-mongo").await;
    let names = db.list_collection_names().await.unwrap();
    for coll in ["business_objects", store_mongo::DEAD_LETTERS, store_mongo::RESULT_CACHE] {
        assert!(names.iter().any(|n| n == coll), "{coll} in {names:?}");
    }
    // Candidates and stream frames live under the scratch prefix.
    let candidates = queue.dispatch_candidates().unwrap();
    candidates.add(&kernel_core::ObjectId::from("obj-1"), kernel_core::Instant::ZERO).await.unwrap();
    let sink = queue
        .stream_sink(
            std::sync::Arc::new(kernel_core::ports::SystemClock),
            sse_stream::StreamSecret::new([7u8; 32]).unwrap(),
        )
        .unwrap();
    let key = kernel_core::ports::StreamKey {
        object_id: "obj-1".into(),
        workflow_id: "wf-1".into(),
        fencing_token: "f1".into(),
    };
    assert!(sink.keys(&key).frames.starts_with(&prefix), "{}", sink.keys(&key).frames);
    let conn = queue.redis_connection().unwrap().clone();
    let mut raw = conn.connection().clone();
    let keys: Vec<String> = redis_keys(&mut raw, &prefix).await;
    assert!(!keys.is_empty(), "candidate index under {prefix}");

    d.destroy().await.unwrap();
    assert!(redis_keys(&mut raw, &prefix).await.is_empty());
    let client = mongodb::Client::with_uri_str(&mongo).await.unwrap();
    assert!(!client.list_database_names().await.unwrap().contains(&db.name().to_string()));
}

async fn redis_keys(conn: &mut queue_redis::RedisConn, prefix: &str) -> Vec<String> {
    redis::cmd("KEYS").arg(format!("{prefix}*")).query_async(conn).await.unwrap()
}
