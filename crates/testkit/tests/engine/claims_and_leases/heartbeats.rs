//! The engine's one heartbeat driver (K-6.3): heartbeats run detached from the activities,
//! also from an activity that blocks its thread.

use crate::intercept::{ApplyHook, Intercepted};
use crate::support::settle;
use kernel_core::engine::{ClaimEnd, RoundOutcome};
use kernel_core::ports::*;
use kernel_core::transition::TransitionKind;
use kernel_core::*;
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;
use testkit::harness::World;

/// Wait (in real time, bounded) until `cond` holds; false if it never did.
async fn eventually(cond: impl Fn() -> bool) -> bool {
    for _ in 0..2_000 {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cond()
}

fn heartbeats(world: &World) -> usize {
    world.audit.log().iter().filter(|w| w.kinds.contains(&TransitionKind::Heartbeat)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k6_3_heartbeats_go_on_while_an_activity_blocks_its_thread() {
    // K-6.3: the heartbeat is independent of the activity. The activity blocks its worker
    // thread (a blocking receive, no await) while the clock passes several heartbeat
    // intervals: every interval still writes a heartbeat that extends the lease, and once
    // released the workflow completes under the same claim.
    let world = World::new(63);
    let (release, released) = mpsc::channel::<()>();
    let released = Arc::new(Mutex::new(released));
    let entered = Arc::new(AtomicBool::new(false));
    let (r, e) = (released.clone(), entered.clone());
    let blocking = move |_c: ActivityContext| {
        let (r, e) = (r.clone(), e.clone());
        async move {
            e.store(true, Ordering::SeqCst);
            // Bounded, so a broken engine fails the test instead of hanging it.
            let got = r.lock().unwrap().recv_timeout(Duration::from_secs(20));
            Ok(StepOutcome::complete(json!(got.is_ok())))
        }
    };
    let def = Definition::builder("t").step(StepDef::new("block", blocking).timeout_ms(3_600_000)).build().unwrap();
    let engine = world.engine("w", vec![def]);
    let (hb, lease_ms) = (engine.config().heartbeat_ms, engine.config().lease_ms);
    world.start_as(&engine, "t", "b", "wf-1").await;
    world.audit.reset_traffic();
    let e = engine.clone();
    let claim = tokio::spawn(async move { e.tick().await });
    assert!(eventually(|| entered.load(Ordering::SeqCst)).await, "the activity never started");
    let claimed_until = world.store.peek("wf-1").unwrap().claimable_time.unwrap();
    for n in 1..=4 {
        world.clock.advance(hb);
        let until = world.now().saturating_add(lease_ms);
        let extended = eventually(|| world.store.peek("wf-1").unwrap().claimable_time == Some(until)).await;
        assert!(extended, "heartbeat {n} did not extend the lease while the activity blocked its thread");
        assert_eq!(heartbeats(&world), n, "one heartbeat write per interval");
    }
    assert!(world.now() > claimed_until, "the claim outlived the lease it was claimed with");
    release.send(()).unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), claim).await.expect("the claim ended").unwrap().unwrap();
    assert_eq!(
        out,
        RoundOutcome::Ran { workflow_id: "wf-1".into(), end: ClaimEnd::Terminal(WorkflowStatus::Completed) }
    );
    let inst = world.store.peek("wf-1").unwrap();
    assert_eq!(inst.status, WorkflowStatus::Completed);
    assert_eq!(inst.output["block"], json!(true), "the activity was released, not timed out");
    assert_eq!(heartbeats(&world), 4, "no heartbeat after the claim ended");
}

#[tokio::test]
async fn claims_of_one_engine_share_the_driver_and_each_keeps_its_own_schedule() {
    // Two claims started half an interval apart: each is beaten one interval after it was
    // claimed, and every interval after, one write per claim per interval.
    let world = World::new(64);
    let gate = Arc::new(tokio::sync::Notify::new());
    let def = gated(gate.clone());
    let engine = world.engine("w", vec![def]);
    let hb = engine.config().heartbeat_ms;
    let half = DurationMs::from_millis(hb.as_millis() / 2);
    let publisher = engine.publisher();
    world.audit.reset_traffic();
    let claims = claim_two_apart(&world, &engine, &publisher, half).await;
    // Now: a claimed 1 interval ago, b half an interval ago.
    let t_a = world.now();
    assert_eq!(beats_of(&world, "wf-a"), vec![t_a], "a is beaten one interval after its claim");
    assert!(beats_of(&world, "wf-b").is_empty(), "b is not due yet");
    world.clock.advance(half);
    settle().await;
    let t_b = world.now();
    assert_eq!(beats_of(&world, "wf-a"), vec![t_a]);
    assert_eq!(beats_of(&world, "wf-b"), vec![t_b], "b is beaten one interval after its claim");
    world.clock.advance(half);
    settle().await;
    assert_eq!(beats_of(&world, "wf-a"), vec![t_a, world.now()], "then every interval");
    assert_eq!(beats_of(&world, "wf-b"), vec![t_b]);
    gate.notify_waiters();
    for c in claims {
        let out = c.await.unwrap().unwrap();
        assert!(matches!(out, RoundOutcome::Ran { end: ClaimEnd::Terminal(WorkflowStatus::Completed), .. }), "{out:?}");
    }
    let before = world.audit.log().len();
    for _ in 0..3 {
        world.clock.advance(hb);
        settle().await;
    }
    assert_eq!(world.audit.log().len(), before, "no heartbeat once the claims ended");
}

/// A store whose heartbeat writes for one workflow hang (until the caller's deadline);
/// everything else passes through. The counter says how many hung.
fn hung_heartbeats_of(inner: Arc<DynStore>, workflow_id: &str) -> (Arc<ApplyHook>, Arc<AtomicU32>) {
    let counted = Arc::new(AtomicU32::new(0));
    let (victim, count) = (WorkflowId::from(workflow_id), counted.clone());
    let intercept: crate::intercept::Intercept = Box::new(move |id, _, t| {
        let heartbeat = *id == victim && t.kinds().any(|k| k == TransitionKind::Heartbeat);
        heartbeat.then(|| {
            count.fetch_add(1, Ordering::SeqCst);
            Intercepted::Hang
        })
    });
    (Arc::new(ApplyHook { inner, intercept }), counted)
}

#[tokio::test]
async fn a_hung_heartbeat_write_delays_no_other_claims_heartbeat() {
    // K-6.3 with one driver per engine: a's heartbeat write hangs until its deadline; b's
    // heartbeat, due while a's is in flight, is written at its own time, not after a's
    // deadline. a then ends uncertain (K-6.4), b keeps its schedule and completes.
    let world = World::new(65);
    let gate = Arc::new(tokio::sync::Notify::new());
    let def = gated(gate.clone());
    let (store, hung) = hung_heartbeats_of(world.ports().store, "wf-a");
    let mut ports = world.ports();
    ports.store = store.clone();
    let engine = world.engine_on(ports, testkit::harness::test_config("w"), vec![def]);
    let (hb, deadline) = (engine.config().heartbeat_ms, engine.config().heartbeat_deadline_ms);
    assert!(deadline.as_millis() > hb.as_millis() / 4, "b must fall due while a's write still hangs");
    let quarter = DurationMs::from_millis(hb.as_millis() / 4);
    let publisher = engine.publisher();
    world.audit.reset_traffic();
    let claims = claim_two_apart(&world, &engine, &publisher, quarter).await;
    // a was claimed 2 quarters ago, b 1 quarter ago: a falls due first and hangs.
    world.clock.advance(DurationMs::from_millis(hb.as_millis() - 2 * quarter.as_millis()));
    settle().await;
    assert_eq!(hung.load(Ordering::SeqCst), 1, "a's heartbeat is in flight");
    world.clock.advance(quarter);
    settle().await;
    let t_b = world.now();
    assert_eq!(beats_of(&world, "wf-b"), vec![t_b], "b is beaten at its own time while a's write hangs");
    // a's deadline passes: its claim ends uncertain; b goes on one interval after its beat.
    let b_next = t_b.saturating_add(hb);
    while world.now() < b_next {
        world.clock.advance(quarter);
        settle().await;
    }
    assert_eq!(beats_of(&world, "wf-b"), vec![t_b, b_next], "b keeps its schedule");
    assert!(beats_of(&world, "wf-a").is_empty());
    assert_eq!(hung.load(Ordering::SeqCst), 1, "a ended at its first hung heartbeat");
    gate.notify_waiters();
    let ends: Vec<_> = futures::future::join_all(claims).await.into_iter().map(|c| c.unwrap().unwrap()).collect();
    assert!(matches!(&ends[0], RoundOutcome::Ran { end: ClaimEnd::Uncertain, .. }), "{:?}", ends[0]);
    assert!(
        matches!(&ends[1], RoundOutcome::Ran { end: ClaimEnd::Terminal(WorkflowStatus::Completed), .. }),
        "{:?}",
        ends[1]
    );
}

/// A one-step workflow whose activity waits for `gate` or its cancellation.
fn gated(gate: Arc<tokio::sync::Notify>) -> Definition {
    let wait = move |c: ActivityContext| {
        let g = gate.clone();
        async move {
            tokio::select! {
                _ = g.notified() => Ok(StepOutcome::complete(json!(null))),
                _ = c.cancellation().cancelled() => Err(ActivityError::canceled("cancelled")),
            }
        }
    };
    Definition::builder("t").step(StepDef::new("wait", wait).timeout_ms(3_600_000)).build().unwrap()
}

fn beats_of(world: &World, id: &str) -> Vec<Instant> {
    world
        .audit
        .log_of(id)
        .iter()
        .filter(|w| w.kinds.contains(&TransitionKind::Heartbeat))
        .map(|w| w.at.unwrap())
        .collect()
}

#[tokio::test]
async fn a_claim_registered_while_every_heartbeat_hangs_is_beaten_on_time() {
    // The driver waits only for writes in flight when every claim's heartbeat hangs; a claim
    // registered then must still be beaten one interval after its claim, not once the hung
    // write's deadline (here longer than the interval) has passed.
    let world = World::new(66);
    let gate = Arc::new(tokio::sync::Notify::new());
    let (store, hung) = hung_heartbeats_of(world.ports().store, "wf-a");
    let mut ports = world.ports();
    ports.store = store.clone();
    let config = EngineConfig {
        lease_ms: DurationMs::from_secs(30),
        heartbeat_ms: DurationMs::from_secs(2),
        heartbeat_deadline_ms: DurationMs::from_secs(27),
        ..testkit::harness::test_config("w")
    };
    let engine = world.engine_on(ports, config, vec![gated(gate.clone())]);
    let publisher = engine.publisher();
    world.audit.reset_traffic();
    let mut claims = Vec::new();
    let start = |id: &'static str| {
        let (e, p) = (engine.clone(), publisher.clone());
        tokio::spawn(async move {
            p.start_or_resume(StartRequest::new("t", id, json!({})).workflow_id(id)).await.unwrap();
            e.tick().await
        })
    };
    claims.push(start("wf-a"));
    settle().await;
    world.clock.advance(DurationMs::from_secs(2));
    settle().await;
    assert_eq!(hung.load(Ordering::SeqCst), 1, "a's heartbeat hangs");
    world.clock.advance(DurationMs::from_secs(1));
    claims.push(start("wf-b"));
    settle().await;
    let t_b = world.now();
    world.clock.advance(DurationMs::from_secs(2));
    settle().await;
    assert_eq!(beats_of(&world, "wf-b"), vec![t_b.saturating_add(DurationMs::from_secs(2))], "b is beaten on time");
    gate.notify_waiters();
    world.clock.advance(DurationMs::from_secs(30));
    settle().await;
    for c in claims {
        c.await.unwrap().unwrap();
    }
}

#[test]
fn a_driver_dropped_with_its_runtime_is_replaced_by_the_next_claim() {
    // The driver's runtime goes away while a claim is registered (an engine shared by two
    // runtimes, the first one shut down): the next claim, on another runtime, starts a new
    // driver and is heartbeaten.
    let world = World::new(67);
    let gate = Arc::new(tokio::sync::Notify::new());
    let engine = world.engine("w", vec![gated(gate.clone())]);
    let hb = engine.config().heartbeat_ms;
    let runtime = || tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let first = runtime();
    first.block_on(async {
        world.start_as(&engine, "t", "one", "wf-1").await;
        let e = engine.clone();
        tokio::spawn(async move { e.tick().await });
        settle().await;
        assert!(world.store.peek("wf-1").unwrap().claim_token.is_some(), "wf-1 is claimed");
    });
    drop(first);
    let second = runtime();
    second.block_on(async {
        world.start_as(&engine, "t", "two", "wf-2").await;
        let e = engine.clone();
        let claim = tokio::spawn(async move { e.tick().await });
        settle().await;
        world.audit.reset_traffic();
        world.clock.advance(hb);
        settle().await;
        assert_eq!(beats_of(&world, "wf-2"), vec![world.now()], "the new claim is heartbeaten");
        gate.notify_waiters();
        let out = claim.await.unwrap().unwrap();
        assert!(matches!(out, RoundOutcome::Ran { end: ClaimEnd::Terminal(WorkflowStatus::Completed), .. }), "{out:?}");
    });
}

/// Claims `wf-a`, then `wf-b` `apart` later, each on a tick of its own; the clock ends
/// `apart` after b's claim.
async fn claim_two_apart(
    world: &World,
    engine: &Engine,
    publisher: &Publisher,
    apart: DurationMs,
) -> Vec<tokio::task::JoinHandle<Result<RoundOutcome>>> {
    let mut claims = Vec::new();
    for id in ["wf-a", "wf-b"] {
        publisher.start_or_resume(StartRequest::new("t", id, json!({})).workflow_id(id)).await.unwrap();
        let e = engine.clone();
        claims.push(tokio::spawn(async move { e.tick().await }));
        settle().await;
        world.clock.advance(apart);
        settle().await;
    }
    claims
}
