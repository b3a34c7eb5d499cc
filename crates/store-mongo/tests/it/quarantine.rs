//! One undecodable instance must not stop maintenance for the others (quarantine).

use super::support::TestDb;
use kernel_core::ports::*;
use kernel_core::*;
use mongodb::bson::{doc, Document};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use store_mongo::INSTANCES;
use testkit::harness::{test_config, Lister, World};

fn sleeper() -> Definition {
    Definition::builder("t")
        .step(StepDef::new("nap", |c: ActivityContext| async move {
            if c.resume().is_some() {
                return Ok(StepOutcome::complete(json!("rested")));
            }
            Ok(StepOutcome::sleep(60_000, json!({})))
        }))
        .build()
        .unwrap()
}

#[tokio::test]
async fn hardening_04_undecodable_instances_are_quarantined_and_timers_still_fire() {
    // K-9.2, K-13: an instance with an unknown wait kind and one with an out-of-range
    // priority, written outside the kernel, are skipped by id, counted, reported; the
    // timers of every other instance still fire and the rebuild scan goes on.
    let Some(t) = TestDb::new().await else { return };
    let store = t.store().await;
    let inbox = t.inbox().await;
    let listed = store.clone();
    let lister: Lister = Arc::new(move || {
        let s = listed.clone();
        Box::pin(async move { s.list(100).await })
    });
    let world = World::with_durable(1, HashMap::new(), Arc::new(store.clone()), Arc::new(inbox), lister);
    let engine = world.engine_on(world.ports(), test_config("w"), vec![sleeper()]);
    for k in 0..4 {
        let req = StartRequest::new("t", format!("b{k}"), json!({})).workflow_id(format!("wf-{k}"));
        engine.publisher().start_or_resume(req).await.unwrap();
    }
    for _ in 0..4 {
        assert!(matches!(engine.tick().await.unwrap(), engine::RoundOutcome::Ran { .. }));
    }
    // Two more waiting instances, copied raw and broken the way another writer could.
    let coll = t.db.collection::<Document>(INSTANCES);
    let mut template = coll.find_one(doc! { "workflow_id": "wf-0" }).await.unwrap().expect("wf-0");
    template.remove("_id");
    for (id, field, value) in [
        ("wf-bad-kind", "wait.kind", mongodb::bson::Bson::from("hibernate")),
        ("wf-bad-prio", "business_priority", 9.into()),
    ] {
        let mut d = template.clone();
        d.insert("workflow_id", id);
        d.insert("biz_key", format!("biz-{id}"));
        coll.insert_one(d).await.unwrap();
        coll.update_one(doc! { "workflow_id": id }, doc! { "$set": { field: value } }).await.unwrap();
    }
    // A running instance with a broken priority, for the rebuild scan.
    let mut d = template.clone();
    d.insert("workflow_id", "wf-bad-running");
    d.insert("biz_key", "biz-wf-bad-running");
    d.insert("status", "running");
    d.insert("business_priority", -1);
    d.remove("wait");
    coll.insert_one(d).await.unwrap();

    world.clock.advance(60_000);
    let report = engine.maintain().await.expect("a maintenance pass survives undecodable documents");
    assert_eq!(report.activated, 4, "every good timer fired");
    let mut q = report.quarantined.clone();
    q.sort();
    assert_eq!(q, ["wf-bad-kind", "wf-bad-prio", "wf-bad-running"], "{report:?}");
    for _ in 0..4 {
        assert!(matches!(engine.tick().await.unwrap(), engine::RoundOutcome::Ran { .. }));
    }
    for k in 0..4 {
        let i = store.get(&format!("wf-{k}").into()).await.unwrap().unwrap();
        assert_eq!(i.status, model::WorkflowStatus::Completed, "wf-{k}");
    }
    // The next pass reports them again (they are still there); they are logged once.
    let again = engine.maintain().await.unwrap();
    assert_eq!(again.quarantined.len(), 3, "still reported while they are there: {again:?}");
    let running = engine.spawn();
    assert_eq!(running.health().quarantined, q, "exposed in the engine's health");
    running.shutdown().await;
    t.drop_db().await;
}
