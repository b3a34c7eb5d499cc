//! Store, inbox and outbox calls have deadlines on the clock (K-6.8): a hung call returns at
//! its deadline, and a claim on a hung store ends before its lease can be taken over.

use crate::support::{settle, until_cancelled, Trouble, TroubledStore};
use kernel_core::engine::{ClaimEnd, RoundOutcome};
use kernel_core::ports::*;
use kernel_core::*;
use serde_json::json;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use testkit::harness::{test_config, World};

/// An inbox whose every call hangs (a primary that stopped answering), counting calls.
#[derive(Default)]
struct HungInbox {
    calls: AtomicU32,
}

impl HungInbox {
    async fn hang<T>(&self) -> T {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::future::pending().await
    }
}

#[async_trait::async_trait]
impl SignalInbox for HungInbox {
    async fn insert(&self, _record: SignalRecord) -> Result<InsertOutcome> {
        self.hang().await
    }
    async fn get(&self, _signal_id: &str) -> Result<Option<SignalRecord>> {
        self.hang().await
    }
    async fn find_pending(&self, _w: &WorkflowId, _t: &str, _k: &str, _g: u64) -> Result<Option<SignalRecord>> {
        self.hang().await
    }
    async fn mark_matched(&self, _signal_id: &str, _now: Instant) -> Result<bool> {
        self.hang().await
    }
    async fn scan_pending(&self, _after: Option<&str>, _limit: usize) -> Result<SignalPage> {
        self.hang().await
    }
    async fn scan_created_before(&self, _b: Instant, _a: Option<&str>, _l: usize) -> Result<SignalPage> {
        self.hang().await
    }
    async fn scan_workflow(&self, _w: &WorkflowId, _s: SignalStatus, _l: usize) -> Result<Vec<SignalRecord>> {
        self.hang().await
    }
    async fn delete_if(&self, _ids: &[String], _status: SignalStatus) -> Result<u64> {
        self.hang().await
    }
    async fn count_pending_orphans(&self, _w: Option<&WorkflowId>, _limit: u64) -> Result<u64> {
        self.hang().await
    }
    async fn clear_orphans(&self, _w: &WorkflowId) -> Result<u64> {
        self.hang().await
    }
}

/// A dispatch outbox whose every call hangs (a primary that stopped answering), counting
/// calls.
#[derive(Default)]
struct HungOutbox {
    calls: AtomicU32,
}

impl HungOutbox {
    async fn hang<T>(&self) -> T {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::future::pending().await
    }
}

#[async_trait::async_trait]
impl DispatchOutbox for HungOutbox {
    async fn accept(
        &self,
        _o: &ObjectId,
        _f: serde_json::Value,
        _s: &str,
        _i: DispatchIntent,
    ) -> Result<AcceptOutcome> {
        self.hang().await
    }
    async fn get(&self, _o: &ObjectId) -> Result<Option<DispatchRecord>> {
        self.hang().await
    }
    async fn confirm_dispatched(&self, _o: &ObjectId, _f: &FencingToken) -> Result<bool> {
        self.hang().await
    }
    async fn defer_pending(&self, _o: &ObjectId, _f: &FencingToken, _at: Instant) -> Result<bool> {
        self.hang().await
    }
    async fn try_lease(
        &self,
        _o: &ObjectId,
        _n: Instant,
        _l: &LeaseToken,
        _u: Instant,
    ) -> Result<Option<DispatchRecord>> {
        self.hang().await
    }
    async fn renew_lease(&self, _o: &ObjectId, _f: &FencingToken, _l: &LeaseToken, _u: Instant) -> Result<bool> {
        self.hang().await
    }
    async fn confirm_leased(&self, _o: &ObjectId, _f: &FencingToken, _l: &LeaseToken) -> Result<bool> {
        self.hang().await
    }
    async fn revert_leased(&self, _o: &ObjectId, _f: &FencingToken, _l: &LeaseToken, _at: Instant) -> Result<bool> {
        self.hang().await
    }
    async fn scan_due(&self, _n: Instant, _a: Option<&ObjectId>, _l: usize) -> Result<Vec<(ObjectId, Instant)>> {
        self.hang().await
    }
    async fn retry_failed(&self, _o: &ObjectId, _p: &FencingToken, _n: DispatchIntent, _s: &str) -> Result<bool> {
        self.hang().await
    }
    async fn fenced_update(
        &self,
        _o: &ObjectId,
        _f: &FencingToken,
        _fields: serde_json::Value,
        _s: Option<&str>,
    ) -> Result<bool> {
        self.hang().await
    }
    async fn try_lock(&self, _n: &str, _h: &str, _now: Instant, _u: Instant) -> Result<bool> {
        self.hang().await
    }
}

#[tokio::test]
async fn a_hung_store_ends_the_claim_before_its_lease_can_be_taken_over() {
    // The heartbeat's deadline is shorter than the lease: a process that cannot renew
    // cancels its activity before another worker could claim the instance.
    let world = World::new(10);
    let (cancelled, second) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let store = TroubledStore::new(world.ports().store);
    let mut ports = world.ports();
    ports.store = store.clone();
    let engine = world.engine_on(ports, test_config("w"), vec![until_cancelled(cancelled.clone(), second.clone())]);
    world.start_as(&engine, "t", "b", "wf-10").await;
    let e = engine.clone();
    let claim = tokio::spawn(async move { e.tick().await });
    settle().await;
    let lease_end = world.store.peek("wf-10").unwrap().claimable_time.unwrap();
    store.set(Trouble::Hung);
    while cancelled.load(Ordering::SeqCst) == 0 && world.now() < lease_end {
        world.clock.advance(1_000);
        settle().await;
    }
    assert_eq!(cancelled.load(Ordering::SeqCst), 1, "the activity was not cancelled before the lease ran out");
    assert!(world.now() < lease_end, "cancelled at {} with the lease ending at {lease_end}", world.now());
    let out = claim.await.unwrap().unwrap();
    assert!(matches!(out, RoundOutcome::Ran { end: ClaimEnd::Uncertain, .. }), "{out:?}");
    assert_eq!(store.calls_in_trouble.load(Ordering::SeqCst), 1, "only the heartbeat reached the hung store");
    assert_eq!(second.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_hung_store_call_returns_at_its_deadline() {
    // A claim against a hung store gives up at the store deadline of the engine's clock.
    let world = World::new(10);
    let store = TroubledStore::new(world.ports().store);
    let mut ports = world.ports();
    ports.store = store.clone();
    let engine = world.engine_on(ports, test_config("w"), vec![crate::linear("t", 1, false)]);
    world.start_as(&engine, "t", "b", "wf-10").await;
    store.set(Trouble::Hung);
    let e = engine.clone();
    let round = tokio::spawn(async move { e.tick().await });
    for _ in 0..120 {
        if round.is_finished() {
            break;
        }
        world.clock.advance(1_000);
        settle().await;
    }
    assert!(round.is_finished(), "the scheduling round still waits on the hung store");
    let out = round.await.unwrap();
    assert!(matches!(out, Ok(RoundOutcome::Idle { .. }) | Err(_)), "{out:?}");
    assert_eq!(store.calls_in_trouble.load(Ordering::SeqCst), 1, "one claim call, not retried");
    assert_eq!(world.store.peek("wf-10").unwrap().steps[0].status, StepStatus::Pending);
}

#[tokio::test]
async fn a_hung_inbox_call_returns_at_its_deadline() {
    // The inbox lives on the durable store too: a signal delivery against a hung primary
    // gives up at the store deadline of the engine's clock, as an uncertain write (the
    // producer retries; the signal id makes the retry idempotent, K-9).
    let world = World::new(10);
    let inbox = Arc::new(HungInbox::default());
    let mut ports = world.ports();
    ports.inbox = inbox.clone();
    let engine = world.engine_on(ports, test_config("w"), vec![crate::linear("t", 1, false)]);
    let signal = Signal::builder("wf-10", "approve").wait_key("doc:1").generation(1).signal_id("s-1").build().unwrap();
    let e = engine.clone();
    let delivery = tokio::spawn(async move { e.deliver_signal(signal).await });
    for _ in 0..120 {
        if delivery.is_finished() {
            break;
        }
        world.clock.advance(1_000);
        settle().await;
    }
    assert!(delivery.is_finished(), "the delivery still waits on the hung inbox");
    let out = delivery.await.unwrap();
    assert!(matches!(out, Err(Error::Uncertain { .. }) | Err(Error::Unavailable { .. })), "{out:?}");
    assert_eq!(inbox.calls.load(Ordering::SeqCst), 1, "one inbox call, not retried");
}

#[tokio::test]
async fn a_standalone_publisher_gives_up_on_a_hung_store_at_its_deadline() {
    // An API process that only starts workflows has store deadlines too: a start against
    // a hung primary answers (uncertain: the create may still land; the caller retries,
    // StartOrResume is idempotent on the business key, K-5).
    let world = World::new(10);
    let store = TroubledStore::new(world.ports().store);
    let ports = world.ports();
    let plan = crate::linear("t", 1, false).plan().clone();
    let publisher = Publisher::builder(store.clone(), ports.queue.clone(), ports.wakeup.clone())
        .clock(ports.clock.clone())
        .plan(plan)
        .store_call_deadline_ms(5_000)
        .build()
        .unwrap();
    store.set(Trouble::Hung);
    let start = tokio::spawn(async move {
        publisher.start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf-10")).await
    });
    for _ in 0..120 {
        if start.is_finished() {
            break;
        }
        world.clock.advance(1_000);
        settle().await;
    }
    assert!(start.is_finished(), "the start still waits on the hung store");
    let out = start.await.unwrap();
    assert!(matches!(out, Err(Error::Uncertain { .. }) | Err(Error::Unavailable { .. })), "{out:?}");
    assert_eq!(store.calls_in_trouble.load(Ordering::SeqCst), 1, "one store call, not retried");
}

#[tokio::test]
async fn a_dispatch_gives_up_on_a_hung_outbox_at_its_deadline() {
    // The dispatch outbox lives on the durable store: an accept against a hung primary
    // answers at the deadline of the dispatch's clock, as an uncertain write (accept is
    // idempotent per object and round, K-11, so the caller may retry).
    let world = World::new(10);
    let outbox = Arc::new(HungOutbox::default());
    let engine = world.engine("w", vec![crate::linear("t", 1, false)]);
    let dispatch = kernel_core::dispatch::Dispatch::builder()
        .outbox(outbox.clone())
        .candidates(Arc::new(testkit::memory::InMemoryCandidates::new()))
        .publisher(engine.publisher())
        .clock(world.clock.clone())
        .build()
        .unwrap();
    let req = kernel_core::dispatch::AcceptRequest {
        object_id: "o-1".into(),
        fields: json!({}),
        workflow_type: "t".into(),
        biz_key: "b".into(),
        fencing_token: "f1".into(),
        input: json!({"object_id": "o-1", "fencing_token": "f1"}),
        priority: Priority::P1,
    };
    let accept = tokio::spawn(async move { dispatch.accept(req).await });
    for _ in 0..120 {
        if accept.is_finished() {
            break;
        }
        world.clock.advance(1_000);
        settle().await;
    }
    assert!(accept.is_finished(), "the accept still waits on the hung outbox");
    let out = accept.await.unwrap();
    assert!(matches!(out, Err(Error::Uncertain { .. })), "{out:?}");
    assert_eq!(outbox.calls.load(Ordering::SeqCst), 1, "one outbox call, not retried");
}
