//! The dispatch outbox on MongoDB (K-11, K-12): the shared conformance suite, the crash
//! windows of both dispatch paths on the Mongo-wire server with Redis candidates, and the
//! concurrent new-round race.

use super::support::TestDb;
use kernel_core::dispatch::*;
use kernel_core::ports::*;
use kernel_core::{Error, WorkflowStatus};
use mongodb::Database;
use queue_redis::test_support::{require_redis, TestKeys};
use queue_redis::RedisDispatchCandidates;
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use store_mongo::{MongoConfig, MongoOutbox, MongoSignalInbox, MongoWorkflowStore, OutboxSchema};
use testkit::dispatch::{crash_windows, DispatchEnv};
use testkit::harness::{BoxFuture, Lister, World};
use testkit::scenarios::workflows::{order, ORDER};

/// Outbox fixture: a business collection in a fresh database.
pub struct OutboxDb(TestDb, MongoOutbox);

impl testkit::conformance::outbox::OutboxFixture for OutboxDb {
    fn outbox(&self) -> &DynOutbox {
        &self.1
    }
    fn teardown(self) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(self.0.drop_db())
    }
}

/// A fresh fixture, or `None` when the Mongo tests are skipped.
pub async fn outbox_fixture() -> Option<OutboxDb> {
    let t = TestDb::new().await?;
    let o = MongoOutbox::open(&t.db, OutboxSchema::default(), MongoConfig::default()).await.expect("open outbox");
    Some(OutboxDb(t, o))
}

mod conformance {
    testkit::outbox_conformance!(super::outbox_fixture);
}

fn request(i: usize, fail: bool) -> AcceptRequest {
    let object_id = format!("obj-{i}");
    AcceptRequest {
        fields: json!({ "title": format!("note {i}") }),
        workflow_type: ORDER.into(),
        biz_key: format!("{ORDER}:{object_id}"),
        fencing_token: "f1".into(),
        input: json!({ "object_id": object_id, "fencing_token": "f1", "fail": fail, "stream": false }),
        priority: kernel_core::Priority::P1,
        object_id: object_id.into(),
    }
}

/// A dispatch environment wholly on MongoDB (store, inbox, business collection) and Redis
/// (candidates) in a fresh database and key prefix.
async fn mongo_env(t: &TestDb, redis_url: &str, prefix: &str, seed: u64) -> DispatchEnv {
    let store = MongoWorkflowStore::open(&t.db, MongoConfig::default()).await.expect("store");
    let inbox = MongoSignalInbox::open(&t.db, MongoConfig::default()).await.expect("inbox");
    let outbox = MongoOutbox::open(&t.db, OutboxSchema::default(), MongoConfig::default()).await.expect("outbox");
    let conn = queue_redis::connect(redis_url).await.expect("redis");
    let candidates = RedisDispatchCandidates::new(conn, prefix).expect("prefix");
    let listed = store.clone();
    let lister: Lister = Arc::new(move || {
        let s = listed.clone();
        Box::pin(async move { s.list(1_000).await })
    });
    let world = World::with_durable(seed, HashMap::new(), Arc::new(store), Arc::new(inbox), lister);
    DispatchEnv {
        world,
        outbox: Arc::new(outbox),
        candidates: Arc::new(candidates),
        defs: Arc::new(|o| vec![order(o)]),
    }
}

#[tokio::test]
async fn both_paths_survive_crashes_on_mongo_and_redis() {
    let Some(probe) = TestDb::new().await else { return };
    let Some(url) = require_redis("both_paths_survive_crashes_on_mongo_and_redis") else {
        return probe.drop_db().await;
    };
    let keys = TestKeys::new(&url, "dispatch_crash_windows");
    let dbs: Arc<Mutex<Vec<Database>>> = Arc::default();
    let factory = {
        let (dbs, url, prefix, client) = (dbs.clone(), url.clone(), keys.prefix.clone(), probe.client.clone());
        move |seed: u64| -> BoxFuture<'static, DispatchEnv> {
            let (dbs, url, client) = (dbs.clone(), url.clone(), client.clone());
            let prefix = format!("{prefix}:{}", dbs.lock().unwrap().len());
            Box::pin(async move {
                let name = format!("{}_{}", probe_name(), dbs.lock().unwrap().len());
                let t = TestDb { db: client.database(&name), client };
                dbs.lock().unwrap().push(t.db.clone());
                mongo_env(&t, &url, &prefix, seed).await
            })
        }
    };
    // Two seeds, three spread crash points per path and side: 24 runs on the slow server.
    let report = crash_windows(&factory, &[1, 2], 2, Arc::new(|i| request(i, false)), 3).await;
    let made: Vec<Database> = dbs.lock().unwrap().drain(..).collect();
    for db in made {
        let _ = db.drop().await;
    }
    probe.drop_db().await;
    drop(keys);
    println!("{report} store=mongo candidates=redis");
    assert_eq!(report.dirty_runs, 0, "{report:?}");
    assert_eq!(report.stale_writes_accepted, 0, "{report:?}");
    assert!(report.runs >= 12, "{report:?}");
}

fn probe_name() -> String {
    use rand::Rng;
    format!("wfk_dispatch_{:012x}", rand::thread_rng().gen::<u64>() & 0xffff_ffff_ffff)
}

#[tokio::test]
async fn concurrent_new_rounds_install_one_and_old_writes_change_nothing() {
    // K-11.4, K-11.5 on the Mongo-wire server.
    let Some(t) = TestDb::new().await else { return };
    let Some(url) = require_redis("concurrent_new_rounds_install_one") else { return t.drop_db().await };
    let keys = TestKeys::new(&url, "concurrent_new_rounds");
    let env = mongo_env(&t, &url, &keys.prefix, 3).await;
    let d = env.dispatcher("api");
    d.accept(request(1, true)).await.unwrap();
    d.dispatch_now(&"obj-1".into()).await.unwrap();
    let worker = env.world.engine("W", vec![order(env.outbox.clone())]);
    env.world.drive(&worker).await.unwrap();
    assert_eq!(env.outbox.get(&"obj-1".into()).await.unwrap().unwrap().business_status.as_deref(), Some("failed"));
    let input = |f: &str| json!({ "object_id": "obj-1", "fencing_token": f, "fail": false, "stream": false });
    let (obj, f1, f2, f3) = ("obj-1".into(), "f1".into(), "f2".into(), "f3".into());
    let (a, b) = tokio::join!(d.retry_failed(&obj, &f1, &f2, input("f2")), d.retry_failed(&obj, &f1, &f3, input("f3")));
    let outcomes = [a, b];
    assert_eq!(outcomes.iter().filter(|r| r.is_ok()).count(), 1, "{outcomes:?}");
    assert!(outcomes.iter().any(|r| matches!(r, Err(Error::RoundChanged(_)))), "{outcomes:?}");
    env.world.drive(&worker).await.unwrap();
    let rec = env.outbox.get(&"obj-1".into()).await.unwrap().unwrap();
    let f = rec.dispatch.as_ref().unwrap().fencing_token.clone();
    let inst = env.world.instances().await.unwrap().pop().unwrap();
    assert_eq!((inst.status, inst.retry_count), (WorkflowStatus::Completed, 1), "the same instance replayed");
    // A late write of the first round's activity changes no document on the server.
    let coll = t.db.collection::<mongodb::bson::Document>("business_objects");
    let before = coll.find_one(mongodb::bson::doc! { "_id": "obj-1" }).await.unwrap();
    assert!(!env
        .outbox
        .fenced_update(&"obj-1".into(), &"f1".into(), json!({ "result": "stale" }), Some("done"))
        .await
        .unwrap());
    let after = coll.find_one(mongodb::bson::doc! { "_id": "obj-1" }).await.unwrap();
    assert_eq!(before, after, "zero documents changed");
    assert_eq!(rec.fields["result"], json!(format!("done in {f}")));
    drop(keys);
    t.drop_db().await;
}
