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
async fn undecodable_instances_are_quarantined_and_timers_still_fire() {
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
        assert_eq!(i.status, domain::WorkflowStatus::Completed, "wf-{k}");
    }
    // The next pass reports them again (they are still there); they are logged once.
    let again = engine.maintain().await.unwrap();
    assert_eq!(again.quarantined.len(), 3, "still reported while they are there: {again:?}");
    let running = engine.spawn();
    assert_eq!(running.health().quarantined, q, "exposed in the engine's health");
    running.shutdown().await;
    t.drop_db().await;
}

/// Copy the waiting `wf-0` raw under `id`, with `field` set to `value` (broken the way
/// another writer could break it).
async fn broken_copy(t: &TestDb, from: &str, id: &str, set: Document) {
    let coll = t.db.collection::<Document>(INSTANCES);
    let mut d = coll.find_one(doc! { "workflow_id": from }).await.unwrap().expect("template");
    d.remove("_id");
    d.insert("workflow_id", id);
    d.insert("biz_key", format!("biz-{id}"));
    for (k, v) in set {
        d.insert(k, v);
    }
    coll.insert_one(d).await.unwrap();
}

#[tokio::test]
async fn undecodable_waits_due_first_do_not_stall_the_timer_scan() {
    // K-9.2: the scan reads longest due first and quarantined documents stay due; with a
    // full page of them sorting first, a pass must page past them to the good timer.
    let Some(t) = TestDb::new().await else { return };
    let store = t.store().await;
    let inbox = t.inbox().await;
    let listed = store.clone();
    let lister: Lister = Arc::new(move || {
        let s = listed.clone();
        Box::pin(async move { s.list(100).await })
    });
    let world = World::with_durable(1, HashMap::new(), Arc::new(store.clone()), Arc::new(inbox), lister);
    let config = engine::EngineConfig { scan_page_size: 2, ..test_config("w") };
    let engine = world.engine_on(world.ports(), config, vec![sleeper()]);
    let req = StartRequest::new("t", "b0", json!({})).workflow_id("wf-0");
    engine.publisher().start_or_resume(req).await.unwrap();
    assert!(matches!(engine.tick().await.unwrap(), engine::RoundOutcome::Ran { .. }));
    let due = store.get(&"wf-0".into()).await.unwrap().unwrap().claimable_time.unwrap();
    // Two broken waits due one millisecond earlier: the whole first page.
    let earlier = mongodb::bson::DateTime::from_millis(due.as_millis() - 1);
    for id in ["wf-bad-1", "wf-bad-2"] {
        broken_copy(&t, "wf-0", id, doc! { "claimable_time": earlier }).await;
        let coll = t.db.collection::<Document>(INSTANCES);
        coll.update_one(doc! { "workflow_id": id }, doc! { "$set": { "wait.kind": "hibernate" } }).await.unwrap();
    }
    world.clock.advance(60_000);
    let report = engine.maintain().await.unwrap();
    assert_eq!(report.activated, 1, "the good timer fired past a page of bad ones: {report:?}");
    let mut q = report.quarantined.clone();
    q.sort();
    assert_eq!(q, ["wf-bad-1", "wf-bad-2"]);
    t.drop_db().await;
}

#[tokio::test]
async fn claims_quarantine_an_undecodable_instance_and_go_on() {
    // K-6.2, K-6.7: the claim writes its lease before the document fails to decode. The
    // queue claim and the store-fallback claim each quarantine it (counted, logged once,
    // in health) and carry on to the next candidate instead of failing the round.
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
    for k in 0..2 {
        let req = StartRequest::new("t", format!("b{k}"), json!({})).workflow_id(format!("wf-{k}"));
        engine.publisher().start_or_resume(req).await.unwrap();
    }
    // Broken running copies, due before the good ones (the fallback claims longest due first).
    let due = store.get(&"wf-0".into()).await.unwrap().unwrap().claimable_time.unwrap();
    let earlier = mongodb::bson::DateTime::from_millis(due.as_millis() - 1);
    for id in ["wf-bad-q", "wf-bad-s"] {
        broken_copy(&t, "wf-0", id, doc! { "claimable_time": earlier, "business_priority": 9 }).await;
    }
    // The queue path: the bad id is popped first.
    world.queue.enqueue(&"wf-bad-q".into(), domain::Priority::P0, domain::Instant::ZERO).await.unwrap();
    let out = engine.tick().await.expect("a round survives an undecodable claim");
    assert!(
        matches!(out, engine::RoundOutcome::Ran { ref workflow_id, .. } if workflow_id.as_str() != "wf-bad-q"),
        "{out:?}"
    );
    // The store-fallback path: the other bad document is the longest due.
    let out = engine.tick_from_store().await.expect("the fallback survives an undecodable claim");
    assert!(
        matches!(out, engine::RoundOutcome::Ran { ref workflow_id, .. } if workflow_id.as_str() != "wf-bad-s"),
        "{out:?}"
    );
    let running = engine.spawn();
    assert_eq!(running.health().quarantined, ["wf-bad-q", "wf-bad-s"], "exposed in the engine's health");
    running.shutdown().await;
    t.drop_db().await;
}

#[tokio::test]
async fn a_document_without_a_string_id_does_not_skip_ids_in_the_rebuild_scan() {
    // K-13: paging with `last` visits every claimable instance; an unreadable id must not
    // become a cursor that skips the ids sorting below `_`.
    let Some(t) = TestDb::new().await else { return };
    let store = t.store().await;
    let coll = t.db.collection::<Document>(INSTANCES);
    let base = |id: mongodb::bson::Bson, biz: &str| {
        doc! { "workflow_id": id, "biz_key": biz, "status": "running", "claimable_time": mongodb::bson::DateTime::from_millis(0), "business_priority": 1 }
    };
    coll.insert_many([base(7.into(), "b7"), base("Wa".into(), "ba"), base("Wb".into(), "bb")]).await.unwrap();
    let mut seen = Vec::new();
    let mut after: Option<WorkflowId> = None;
    for _ in 0..5 {
        let page = store.scan_claimable(after.as_ref(), 1).await.unwrap();
        seen.extend(page.rows.iter().map(|c| c.workflow_id.to_string()));
        if !page.is_full(1) {
            break;
        }
        after = page.last.clone();
    }
    assert_eq!(seen, ["Wa", "Wb"], "every readable candidate visited");
    t.drop_db().await;
}
