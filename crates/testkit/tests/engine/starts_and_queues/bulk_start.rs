//! `Publisher::start_many`: the guarantees of `start_or_resume` per workflow (K-5), one
//! enqueue call and one ring per batch.

use kernel_core::*;
use serde_json::json;
use std::sync::Arc;
use testkit::faults::{CountingQueue, QueueCalls};
use testkit::harness::{test_config, World};

/// A type whose only step fails for good when the input says so (to reach `failed`).
fn maybe_failing() -> Definition {
    Definition::builder("maybe")
        .step(StepDef::new("s", |c: ActivityContext| async move {
            if c.input()["fail"] == json!(true) {
                return Err(ActivityError::permanent("asked to fail"));
            }
            Ok(StepOutcome::complete(json!("ok")))
        }))
        .build()
        .unwrap()
}

fn counted() -> (World, Arc<CountingQueue>, Engine) {
    let world = World::new(5);
    let counting = Arc::new(CountingQueue::new(Arc::new(world.queue.clone()), Arc::new(world.wakeup.clone())));
    let engine = world.engine_on(
        counting.wire(world.ports()),
        test_config("w"),
        vec![crate::linear("t", 2, false), maybe_failing()],
    );
    (world, counting, engine)
}

/// Instances in three states before the batch: running (`run`), completed (`done`) and
/// failed (`bad`).
async fn prepare(world: &World, engine: &Engine) {
    let p = engine.publisher();
    p.start_or_resume(StartRequest::new("t", "done", json!({})).workflow_id("wf-done")).await.unwrap();
    p.start_or_resume(StartRequest::new("maybe", "bad", json!({ "fail": true })).workflow_id("wf-bad")).await.unwrap();
    world.drive(engine).await.unwrap();
    p.start_or_resume(StartRequest::new("t", "run", json!({})).workflow_id("wf-run").priority(Priority::P3))
        .await
        .unwrap();
    assert_eq!(world.store.peek("wf-done").unwrap().status, WorkflowStatus::Completed);
    assert_eq!(world.store.peek("wf-bad").unwrap().status, WorkflowStatus::Failed);
}

/// Creates at every priority, a priority raise, a completed one, a replay.
fn batch() -> Vec<StartRequest> {
    let mut v: Vec<StartRequest> = (0..8)
        .map(|i| {
            StartRequest::new("t", format!("new-{i}"), json!({ "i": i }))
                .workflow_id(format!("wf-new-{i}"))
                .priority(Priority::ALL[i % 4])
        })
        .collect();
    v.push(StartRequest::new("t", "run", json!({})).priority(Priority::P1));
    v.push(StartRequest::new("t", "done", json!({})));
    v.push(StartRequest::new("maybe", "bad", json!({ "fail": false })));
    v
}

#[tokio::test]
async fn start_many_stores_and_enqueues_what_start_or_resume_one_by_one_does() {
    // K-5 per workflow: create, priority raise (promote-only), completed (not activated,
    // not enqueued), replay of a failed one (activated).
    let (one, one_calls, one_engine) = counted();
    let (bulk, bulk_calls, bulk_engine) = counted();
    prepare(&one, &one_engine).await;
    prepare(&bulk, &bulk_engine).await;
    assert_eq!(one.store.all(), bulk.store.all(), "same start");
    one_calls.reset();
    bulk_calls.reset();

    let mut singles = Vec::new();
    for r in batch() {
        singles.push(one_engine.publisher().start_or_resume(r).await.unwrap());
    }
    let many: Vec<StartOutcome> =
        bulk_engine.publisher().start_many(batch()).await.unwrap().into_iter().map(Result::unwrap).collect();
    assert_eq!(many, singles, "the same outcome per request");
    assert_eq!(bulk.store.all(), one.store.all(), "the same stored instances");
    assert_eq!(bulk.queue.len(), one.queue.len());
    for i in one.store.all() {
        let id = i.workflow_id.as_str();
        assert_eq!(bulk.queue.lane_of(id), one.queue.lane_of(id), "lane of {id}");
        assert_eq!(bulk.queue.score_of(id), one.queue.score_of(id), "score of {id}");
    }
    assert_eq!(bulk.queue.lane_of("wf-run"), Some(Priority::P1), "raised and promoted");
    assert_eq!(bulk.queue.lane_of("wf-done"), None, "a completed instance is not enqueued");
    assert!(many[10].execution_activated && !many[9].execution_activated);
    assert_eq!(bulk.store.peek("wf-bad").unwrap().status, WorkflowStatus::Running, "replayed");
    let sorted_keys = |w: &World| {
        let mut k: Vec<String> = w.streams.keys().iter().map(|k| format!("{k:?}")).collect();
        k.sort();
        k
    };
    assert_eq!(sorted_keys(&bulk), sorted_keys(&one), "the activated ones' streams reset alike");
    // The store work of a batch runs concurrently: the same observations per workflow, in
    // the same order per workflow.
    let per_workflow = |w: &World| {
        let mut e = w.observations.events();
        e.sort_by(|a, b| (&a.workflow_id, a.revision).cmp(&(&b.workflow_id, b.revision)));
        e
    };
    assert_eq!(per_workflow(&bulk), per_workflow(&one), "the same observations");
    // 10 running instances need a candidate: one call for all, one ring.
    let c = bulk_calls.counts();
    assert_eq!((c.enqueue, c.enqueue_many, c.enqueued_in_batches, c.notify), (0, 1, 10, 1), "{c:?}");
    let c = one_calls.counts();
    assert_eq!((c.enqueue, c.enqueue_many, c.notify), (10, 0, 10), "{c:?}");
    // And the engine runs them all.
    bulk.drive(&bulk_engine).await.unwrap();
    assert!(bulk.store.all().iter().all(|i| i.status == WorkflowStatus::Completed));
}

#[tokio::test]
async fn a_bad_request_does_not_hide_the_others_outcomes() {
    let (world, calls, engine) = counted();
    engine.publisher().start_or_resume(StartRequest::new("maybe", "taken", json!({}))).await.unwrap();
    calls.reset();
    let results = engine
        .publisher()
        .start_many(vec![
            StartRequest::new("t", "good-1", json!({})).workflow_id("wf-g1"),
            StartRequest::new("t", "bad\nkey", json!({})),
            StartRequest::new("nope", "good-2", json!({})),
            StartRequest::new("t", "taken", json!({})),
            StartRequest::new("t", "good-3", json!({})).workflow_id("wf-g3"),
        ])
        .await
        .unwrap();
    assert_eq!(results.len(), 5);
    assert!(results[0].as_ref().is_ok_and(|s| s.created && s.instance.workflow_id == "wf-g1"), "{results:?}");
    assert!(matches!(results[1], Err(Error::InvalidInput { ref field, .. }) if field == "biz_key"), "{results:?}");
    assert!(matches!(results[2], Err(Error::UnregisteredType(_))), "{results:?}");
    assert!(matches!(results[3], Err(Error::Conflict(_))), "another type's biz key: {results:?}");
    assert!(results[4].as_ref().is_ok_and(|s| s.created && s.instance.workflow_id == "wf-g3"), "{results:?}");
    assert!(world.store.peek("wf-g1").is_some() && world.store.peek("wf-g3").is_some());
    assert_eq!(world.store.all().len(), 3, "nothing written for the bad ones");
    assert!(world.queue.lane_of("wf-g1").is_some() && world.queue.lane_of("wf-g3").is_some());
    let c = calls.counts();
    assert_eq!((c.enqueue_many, c.enqueued_in_batches, c.notify), (1, 2, 1), "{c:?}");
}

#[tokio::test]
async fn an_oversized_batch_is_refused_before_any_call_and_an_empty_one_makes_none() {
    let (world, calls, engine) = counted();
    let over: Vec<StartRequest> =
        (0..=Publisher::START_MANY_MAX).map(|i| StartRequest::new("t", format!("b-{i}"), json!({}))).collect();
    let r = engine.publisher().start_many(over).await;
    assert!(matches!(r, Err(Error::InvalidInput { ref field, .. }) if field == "requests"), "{r:?}");
    assert!(world.store.all().is_empty(), "refused before any store call");
    assert_eq!(engine.publisher().start_many(Vec::new()).await.unwrap().len(), 0);
    assert_eq!(calls.counts(), QueueCalls::default());
    // The limit itself is one batch: one call.
    let full: Vec<StartRequest> =
        (0..Publisher::START_MANY_MAX).map(|i| StartRequest::new("t", format!("b-{i}"), json!({}))).collect();
    let results = engine.publisher().start_many(full).await.unwrap();
    assert!(results.iter().all(Result::is_ok));
    let c = calls.counts();
    assert_eq!((c.enqueue_many, c.enqueued_in_batches, c.notify), (1, Publisher::START_MANY_MAX as u64, 1), "{c:?}");
    assert_eq!(world.queue.len(), Publisher::START_MANY_MAX);
}

#[tokio::test]
async fn nothing_to_enqueue_rings_nothing_and_a_queue_outage_undoes_nothing() {
    let (world, calls, engine) = counted();
    engine.publisher().start_or_resume(StartRequest::new("t", "done", json!({}))).await.unwrap();
    world.drive(&engine).await.unwrap();
    calls.reset();
    let r = engine.publisher().start_many(vec![StartRequest::new("t", "done", json!({}))]).await.unwrap();
    assert!(r[0].as_ref().is_ok_and(|s| !s.execution_activated));
    assert_eq!(calls.counts(), QueueCalls::default(), "a completed instance needs no candidate");

    // K-5: queue failures never undo the stored instance; no ring for what was not enqueued.
    world.queue.set_down(true);
    let r =
        engine.publisher().start_many(vec![StartRequest::new("t", "x", json!({})).workflow_id("wf-x")]).await.unwrap();
    assert!(r[0].as_ref().is_ok_and(|s| s.created));
    assert_eq!(world.store.peek("wf-x").unwrap().status, WorkflowStatus::Running);
    let c = calls.counts();
    assert_eq!((c.enqueue_many, c.notify), (1, 0), "{c:?}");
    world.queue.set_down(false);
    // The rebuild scan restores the lane.
    assert_eq!(engine.maintain().await.unwrap().enqueued, 1);
    assert!(world.queue.lane_of("wf-x").is_some());
}

#[tokio::test]
async fn one_biz_key_twice_in_a_batch_creates_once() {
    // As concurrent start_or_resume calls: one creates, the other reuses it.
    let (world, _calls, engine) = counted();
    let results = engine
        .publisher()
        .start_many(vec![StartRequest::new("t", "same", json!({})), StartRequest::new("t", "same", json!({}))])
        .await
        .unwrap();
    let outs: Vec<&StartOutcome> = results.iter().map(|r| r.as_ref().unwrap()).collect();
    assert_eq!(outs.iter().filter(|o| o.created).count(), 1);
    assert_eq!(outs[0].instance.workflow_id, outs[1].instance.workflow_id);
    assert_eq!(world.store.all().len(), 1);
    assert_eq!(world.queue.len(), 1);
}
