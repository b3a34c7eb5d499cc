//! Clocks of different processes disagree (K-6.8): a claim holder starts nothing once its
//! own clock reads `lease_until − max_clock_skew_ms`, so a worker whose clock runs ahead by
//! at most that much — and who takes the instance over when *its* clock reaches the lease
//! end — never runs a step beside it.

use crate::intercept::{ApplyHook, Intercepted};
use crate::support::settle;
use kernel_core::transition::TransitionKind;
use kernel_core::*;
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use testkit::harness::{test_config, World};
use testkit::memory::SkewedClock;
use tokio::sync::Notify;

/// What the steps saw: `second` entries in flight now and at most.
#[derive(Default)]
struct Seen {
    in_flight: AtomicU64,
    most_in_flight: AtomicU64,
    entries: Mutex<Vec<String>>,
}

/// `first` waits for `go`; `second` counts how many of its executions run at once and
/// waits for `done`.
fn two_steps(seen: Arc<Seen>, go: Arc<Notify>, done: Arc<Notify>) -> Definition {
    let first = move |_c: ActivityContext| {
        let go = go.clone();
        async move {
            go.notified().await;
            Ok(StepOutcome::complete(json!(1)))
        }
    };
    let second = move |c: ActivityContext| {
        let (seen, done) = (seen.clone(), done.clone());
        async move {
            let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            seen.most_in_flight.fetch_max(now, Ordering::SeqCst);
            seen.entries.lock().unwrap().push(c.claim_token().to_string());
            done.notified().await;
            seen.in_flight.fetch_sub(1, Ordering::SeqCst);
            Ok(StepOutcome::complete(json!(2)))
        }
    };
    Definition::builder("t")
        .step(StepDef::new("first", first))
        .step(StepDef::new("second", second).depends_on(["first"]))
        .build()
        .unwrap()
}

/// K-6.8: A's lease ends at `t0 + lease`; B's clock runs 400 ms ahead (within the default
/// `max_clock_skew_ms` of 500 ms). A finishes `first` 300 ms before its lease end by its
/// own clock — already after the lease end by B's — and must not start `second`, which B
/// has taken over.
#[tokio::test]
async fn a_holder_starts_nothing_a_worker_with_a_faster_clock_may_already_own() {
    let world = World::new(51);
    let seen = Arc::new(Seen::default());
    let (go, done) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let def = || two_steps(seen.clone(), go.clone(), done.clone());
    let mut a_ports = world.ports();
    // A's heartbeats never answer: its lease is not renewed while it runs (a process
    // paused, or cut off from its primary).
    a_ports.store = Arc::new(ApplyHook {
        inner: a_ports.store.clone(),
        intercept: Box::new(|_, _, t| t.kinds().any(|k| k == TransitionKind::Heartbeat).then_some(Intercepted::Hang)),
    });
    let config = test_config("A");
    let lease = config.lease_ms;
    let a = world.engine_on(a_ports, config, vec![def()]);
    let mut b_ports = world.ports();
    b_ports.clock = Arc::new(SkewedClock::new(world.clock.clone(), 400));
    let b = world.engine_on(b_ports, test_config("B"), vec![def()]);

    world.start_as(&a, "t", "b", "wf").await;
    let t0 = world.now();
    let a_claim = tokio::spawn(async move { a.tick().await });
    settle().await;
    // A is inside `first`; its clock moves to 300 ms before the lease end, B's is past it.
    world.clock.set(t0.saturating_add(lease).saturating_sub(DurationMs::from_millis(300)));
    go.notify_one();
    settle().await;
    // B takes the instance over from the store as soon as its own clock says the lease ended.
    let b_round = tokio::spawn(async move { b.tick_from_store().await });
    settle().await;
    let most = seen.most_in_flight.load(Ordering::SeqCst);
    let entries = seen.entries.lock().unwrap().clone();
    done.notify_waiters();
    settle().await;
    done.notify_waiters();
    a_claim.abort();
    b_round.abort();
    assert_eq!(most, 1, "two executions of `second` ran at once: {entries:?}");
    assert_eq!(entries.len(), 1, "only the new owner entered `second`: {entries:?}");
}
