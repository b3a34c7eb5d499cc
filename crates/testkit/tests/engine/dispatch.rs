//! The recovery dispatcher's lease under store trouble (K-11.3, defect 10): a dispatcher
//! that cannot renew its lease stops before the lease can be taken over.

use crate::support::settle;
use kernel_core::dispatch::{AcceptRequest, Dispatch, DispatchConfig, Processed};
use kernel_core::ports::*;
use kernel_core::transition::{Guard, Transition};
use kernel_core::*;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use testkit::harness::World;
use testkit::memory::{InMemoryCandidates, InMemoryOutbox};

/// A workflow store whose every call hangs (the publisher's start never answers).
struct HungStore;

#[async_trait::async_trait]
impl WorkflowStore for HungStore {
    async fn create(&self, _i: WorkflowInstance) -> Result<CreateOutcome> {
        std::future::pending().await
    }
    async fn get(&self, _w: &WorkflowId) -> Result<Option<WorkflowInstance>> {
        std::future::pending().await
    }
    async fn get_by_biz_key(&self, _b: &str) -> Result<Option<WorkflowInstance>> {
        std::future::pending().await
    }
    async fn claim(&self, _w: &WorkflowId, _s: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        std::future::pending().await
    }
    async fn claim_any(&self, _s: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        std::future::pending().await
    }
    async fn apply(&self, _w: &WorkflowId, _g: &Guard, _t: &Transition) -> Result<WriteOutcome> {
        std::future::pending().await
    }
    async fn scan_due_waits(&self, _n: Instant, _a: Option<&DueCursor>, _l: usize) -> Result<ScanPage<DueWait>> {
        std::future::pending().await
    }
    async fn scan_claimable(&self, _a: Option<&WorkflowId>, _l: usize) -> Result<ScanPage<Candidate>> {
        std::future::pending().await
    }
}

/// The in-memory outbox, except that every lease renewal fails as unavailable.
struct NoRenewals {
    inner: InMemoryOutbox,
    renewals: AtomicU32,
}

#[async_trait::async_trait]
impl DispatchOutbox for NoRenewals {
    async fn accept(&self, o: &ObjectId, f: Value, s: &str, i: DispatchIntent) -> Result<AcceptOutcome> {
        self.inner.accept(o, f, s, i).await
    }
    async fn get(&self, o: &ObjectId) -> Result<Option<DispatchRecord>> {
        self.inner.get(o).await
    }
    async fn confirm_dispatched(&self, o: &ObjectId, f: &FencingToken) -> Result<bool> {
        self.inner.confirm_dispatched(o, f).await
    }
    async fn defer_pending(&self, o: &ObjectId, f: &FencingToken, at: Instant) -> Result<bool> {
        self.inner.defer_pending(o, f, at).await
    }
    async fn try_lease(&self, o: &ObjectId, n: Instant, l: &LeaseToken, u: Instant) -> Result<Option<DispatchRecord>> {
        self.inner.try_lease(o, n, l, u).await
    }
    async fn renew_lease(&self, _o: &ObjectId, _f: &FencingToken, _l: &LeaseToken, _u: Instant) -> Result<bool> {
        self.renewals.fetch_add(1, Ordering::SeqCst);
        Err(Error::unavailable("primary stepped down"))
    }
    async fn confirm_leased(&self, o: &ObjectId, f: &FencingToken, l: &LeaseToken) -> Result<bool> {
        self.inner.confirm_leased(o, f, l).await
    }
    async fn revert_leased(&self, o: &ObjectId, f: &FencingToken, l: &LeaseToken, at: Instant) -> Result<bool> {
        self.inner.revert_leased(o, f, l, at).await
    }
    async fn scan_due(&self, n: Instant, a: Option<&ObjectId>, l: usize) -> Result<Vec<(ObjectId, Instant)>> {
        self.inner.scan_due(n, a, l).await
    }
    async fn retry_failed(&self, o: &ObjectId, p: &FencingToken, n: DispatchIntent, s: &str) -> Result<bool> {
        self.inner.retry_failed(o, p, n, s).await
    }
    async fn fenced_update(&self, o: &ObjectId, f: &FencingToken, fields: Value, s: Option<&str>) -> Result<bool> {
        self.inner.fenced_update(o, f, fields, s).await
    }
    async fn try_lock(&self, n: &str, h: &str, now: Instant, u: Instant) -> Result<bool> {
        self.inner.try_lock(n, h, now, u).await
    }
}

#[tokio::test]
async fn a_dispatcher_that_cannot_renew_its_lease_stops_before_it_ends() {
    let world = World::new(10);
    let outbox = Arc::new(NoRenewals { inner: InMemoryOutbox::new(), renewals: AtomicU32::new(0) });
    let ports = world.ports();
    let plan = crate::linear("t", 1, false).plan().clone();
    // A start that hangs far longer than the dispatch lease.
    let publisher = Publisher::builder(Arc::new(HungStore), ports.queue.clone(), ports.wakeup.clone())
        .clock(ports.clock.clone())
        .plan(plan)
        .store_call_deadline_ms(3_600_000)
        .build()
        .unwrap();
    let config = DispatchConfig::default();
    let lease = config.lease_ms;
    let dispatch = Dispatch::builder()
        .outbox(outbox.clone())
        .candidates(Arc::new(InMemoryCandidates::new()))
        .publisher(publisher)
        .clock(world.clock.clone())
        .config(config.clone())
        .build()
        .unwrap();
    let req = AcceptRequest {
        object_id: "o-1".into(),
        fields: json!({}),
        workflow_type: "t".into(),
        biz_key: "b".into(),
        fencing_token: "f1".into(),
        input: json!({"object_id": "o-1", "fencing_token": "f1"}),
        priority: Priority::P1,
    };
    dispatch.accept(req).await.unwrap();
    world.clock.advance(config.realtime_grace_ms);
    let leased_at = world.now();
    let lease_end = leased_at.saturating_add(lease);
    let d = dispatch.clone();
    let run = tokio::spawn(async move { d.process(&"o-1".into()).await });
    settle().await;
    for _ in 0..600 {
        if run.is_finished() {
            break;
        }
        world.clock.advance(1_000);
        settle().await;
    }
    assert!(run.is_finished(), "the dispatch still runs at {} (its lease ended at {lease_end})", world.now());
    assert!(world.now() < lease_end, "stopped at {} with the lease ending at {lease_end}", world.now());
    assert_eq!(run.await.unwrap().unwrap(), Processed::LeaseLost);
    assert!(outbox.renewals.load(Ordering::SeqCst) >= 1, "it tried to renew");
}
