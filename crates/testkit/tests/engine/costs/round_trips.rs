//! Round trips to the ready lanes and the doorbell on the happy path, counted, not timed
//! (K-6.1, K-13, K-5): each call of the Redis adapters is one round trip, so the counts of
//! a [`CountingQueue`] are what a deployment pays, on any machine. Pinned to the values of
//! the batch pop and the bulk start, so a regression fails here even where timings are
//! noisy.

use kernel_core::engine::RoundOutcome;
use kernel_core::ports::{ReadyQueue, POP_DUE_MAX};
use kernel_core::*;
use serde_json::json;
use std::sync::Arc;
use testkit::faults::{CountingQueue, QueueCalls};
use testkit::harness::{test_config, World};

const WORKFLOWS: usize = 16;
const SLOTS: usize = 8;

/// A world whose queue and doorbell calls are counted, and an engine with `slots` slots
/// running four-step linear workflows of type `four`.
fn counted(slots: usize) -> (World, Arc<CountingQueue>, Engine) {
    let world = World::new(11);
    let counting = Arc::new(CountingQueue::new(Arc::new(world.queue.clone()), Arc::new(world.wakeup.clone())));
    let ports = counting.wire(world.ports());
    let config = EngineConfig { worker_slots: slots, ..test_config("w") };
    let engine = world.engine_on(ports, config, vec![crate::linear("four", 4, false)]);
    (world, counting, engine)
}

fn requests(n: usize) -> Vec<StartRequest> {
    (0..n)
        .map(|i| StartRequest::new("four", format!("b-{i:02}"), json!({ "i": i })).workflow_id(format!("wf-{i:02}")))
        .collect()
}

/// Let the spawned engine's tasks run (simulated time never moves here) until `done`.
async fn run_until(world: &World, done: impl Fn(&[WorkflowInstance]) -> bool) {
    for _ in 0..10_000 {
        if done(&world.store.all()) {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the engine did not get there: {:?}", world.store.all().iter().map(|i| i.status).collect::<Vec<_>>());
}

fn all_completed(n: usize) -> impl Fn(&[WorkflowInstance]) -> bool {
    move |all| all.len() == n && all.iter().all(|i| i.status == WorkflowStatus::Completed)
}

#[tokio::test]
async fn start_many_of_16_is_one_enqueue_call_and_one_ring() {
    // K-5 in bulk: 16 creates, one enqueue script call for all, one doorbell.
    let (world, counting, engine) = counted(SLOTS);
    let results = engine.publisher().start_many(requests(WORKFLOWS)).await.unwrap();
    assert!(results.iter().all(|r| r.as_ref().is_ok_and(|s| s.created && s.execution_activated)), "{results:?}");
    let c = counting.counts();
    assert_eq!(
        c,
        QueueCalls { enqueue_many: 1, enqueued_in_batches: WORKFLOWS as u64, notify: 1, ..QueueCalls::default() },
        "{c:?}"
    );
    assert_eq!(c.round_trips(), 2);
    assert_eq!(world.queue.len(), WORKFLOWS);

    // The same starts one by one: a script call and a ring each (the cost before the bulk
    // start).
    let (world, counting, engine) = counted(SLOTS);
    for r in requests(WORKFLOWS) {
        engine.publisher().start_or_resume(r).await.unwrap();
    }
    let c = counting.counts();
    assert_eq!((c.enqueue, c.enqueue_many, c.notify), (WORKFLOWS as u64, 0, WORKFLOWS as u64), "{c:?}");
    assert_eq!(c.round_trips(), 2 * WORKFLOWS as u64);
    assert_eq!(world.queue.len(), WORKFLOWS);
}

#[tokio::test]
async fn sixteen_workflows_on_eight_slots_take_three_pops() {
    // K-6.1 with batch pops: the run loop takes its free slots, pops that many in one call
    // and claims them concurrently. One pop per workflow before (16, plus the empty pops
    // that find the queue dry); now: 8 + 8 + the empty pop that finds it dry.
    let (world, counting, engine) = counted(SLOTS);
    engine.publisher().start_many(requests(WORKFLOWS)).await.unwrap();
    counting.reset();
    let running = engine.spawn();
    run_until(&world, all_completed(WORKFLOWS)).await;
    // Let the loop see the last claims end before it is stopped.
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(running.shutdown().await, "clean shutdown");
    let c = counting.counts();
    println!("round-trips: workflows={WORKFLOWS} slots={SLOTS} pops={:?} calls={c:?}", counting.pops());
    assert_eq!(counting.pops(), [(SLOTS, SLOTS), (SLOTS, SLOTS), (SLOTS, 0)], "(max asked, members returned)");
    assert_eq!(c.pop_due, 3);
    assert_eq!(c.popped, WORKFLOWS as u64);
    // A linear workflow that completes in one claim writes nothing to the lanes and rings
    // nothing; the engine subscribed once.
    assert_eq!(c, QueueCalls { pop_due: 3, popped: WORKFLOWS as u64, subscribe: 1, ..QueueCalls::default() }, "{c:?}");
    assert_eq!(c.round_trips(), 3, "per completed workflow: 3/16 of a round trip to the lanes");
    assert!(world.queue.is_empty());
}

#[tokio::test]
async fn a_round_never_pops_more_than_its_free_slots() {
    // K-6.1: 10 due workflows, 3 slots, activities that block: the first round pops 3 and
    // leaves 7 queued; each slot freed later lets exactly one more out of the lane.
    let world = World::new(3);
    let counting = Arc::new(CountingQueue::new(Arc::new(world.queue.clone()), Arc::new(world.wakeup.clone())));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = gate.clone();
    let def = Definition::builder("held")
        .step(StepDef::new("wait", move |_c: ActivityContext| {
            let g = g.clone();
            async move {
                g.acquire().await.expect("gate open").forget();
                Ok(StepOutcome::complete(json!(1)))
            }
        }))
        .build()
        .unwrap();
    let config = EngineConfig { worker_slots: 3, ..test_config("w") };
    let engine = world.engine_on(counting.wire(world.ports()), config, vec![def]);
    let starts = (0..10).map(|i| StartRequest::new("held", format!("h-{i}"), json!({})).workflow_id(format!("wf-{i}")));
    engine.publisher().start_many(starts.collect()).await.unwrap();
    counting.reset();
    let running = engine.spawn();
    let claimed =
        |n: usize| move |all: &[WorkflowInstance]| all.iter().filter(|i| i.claim_token.is_some()).count() == n;
    run_until(&world, claimed(3)).await;
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(counting.pops(), [(3, 3)], "one pop for the three free slots");
    assert_eq!(world.queue.len(), 7, "nothing popped beyond the free slots");
    // One activity returns: its slot is the only free one.
    gate.add_permits(1);
    run_until(&world, |all| all.iter().filter(|i| i.status == WorkflowStatus::Completed).count() == 1).await;
    run_until(&world, claimed(3)).await;
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(counting.pops(), [(3, 3), (1, 1)]);
    assert_eq!(world.queue.len(), 6);
    gate.add_permits(100);
    run_until(&world, all_completed(10)).await;
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(running.shutdown().await);
    for (max, got) in counting.pops() {
        assert!(max <= 3 && got <= max, "asked {max}, got {got}");
    }
    assert_eq!(counting.counts().popped, 10);
}

#[tokio::test]
async fn tick_stays_a_single_candidate_round() {
    // `Engine::tick` (and so the drive harness) pops one candidate per call.
    let (world, counting, engine) = counted(SLOTS);
    engine.publisher().start_many(requests(2)).await.unwrap();
    counting.reset();
    let out = engine.tick().await.unwrap();
    assert!(matches!(out, RoundOutcome::Ran { .. }), "{out:?}");
    assert_eq!(counting.pops(), [(1, 1)]);
    assert_eq!(world.queue.len(), 1);
    world.drive(&engine).await.unwrap();
    assert!(counting.pops().iter().all(|(max, _)| *max == 1), "{:?}", counting.pops());
    assert!(all_completed(2)(&world.store.all()));
    // The port refuses what no round asks for.
    assert!(matches!(world.queue.pop_due(world.now(), POP_DUE_MAX + 1).await, Err(Error::InvalidInput { .. })));
}

#[tokio::test]
async fn one_workflow_started_on_a_running_engine() {
    // The single-workflow path: the start's enqueue and ring, then the woken engine's batch
    // pop (it asks for all its free slots and gets the one), and the pop after the claim's
    // end that finds the lanes dry.
    let (world, counting, engine) = counted(SLOTS);
    let running = engine.spawn();
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(counting.pops(), [(SLOTS, 0)], "the first round finds nothing");
    counting.reset();
    engine.publisher().start_or_resume(requests(1).remove(0)).await.unwrap();
    run_until(&world, all_completed(1)).await;
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(running.shutdown().await);
    let c = counting.counts();
    println!("round-trips: one workflow pops={:?} calls={c:?}", counting.pops());
    assert_eq!(counting.pops(), [(SLOTS, 1), (SLOTS, 0)]);
    assert_eq!(c, QueueCalls { enqueue: 1, notify: 1, pop_due: 2, popped: 1, ..QueueCalls::default() }, "{c:?}");
    assert_eq!(c.round_trips(), 4);
}

#[tokio::test]
async fn a_round_meets_at_most_its_stale_candidate_budget() {
    // K-6.1: ≤ `candidates_per_round_max` (8) stale candidates per round, with batch pops
    // too. Five lane entries without an instance are due first, then 16 workflows: the
    // first pop (8) meets 5 stale and wins 3; the round may meet only 3 more stale
    // candidates, so its second pop asks for 3 (not for the 5 free slots).
    let (world, counting, engine) = counted(SLOTS);
    assert_eq!(engine.config().candidates_per_round_max, 8);
    let early = world.now().saturating_sub(DurationMs::from_millis(1_000));
    for i in 0..5 {
        world.queue.enqueue(&WorkflowId::from(format!("ghost-{i}")), Priority::P2, early).await.unwrap();
    }
    engine.publisher().start_many(requests(WORKFLOWS)).await.unwrap();
    counting.reset();
    let running = engine.spawn();
    run_until(&world, all_completed(WORKFLOWS)).await;
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(running.shutdown().await, "clean shutdown");
    let pops = counting.pops();
    assert_eq!(pops[..2], [(SLOTS, SLOTS), (3, 3)], "(max asked, members returned): {pops:?}");
    assert_eq!(counting.counts().popped, WORKFLOWS as u64 + 5, "every entry popped once: {pops:?}");
    assert!(world.queue.is_empty());
}
