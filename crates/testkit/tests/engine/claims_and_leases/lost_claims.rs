//! Ports misbehaving in scripted ways, with mockall: a claim lost at step 3, an uncertain
//! write. The engine must stop, never retry the write, and touch nothing else.

use kernel_core::engine::{ClaimEnd, RoundOutcome};
use kernel_core::ports::*;
use kernel_core::transition::{Guard, Transition, TransitionKind};
use kernel_core::WorkflowId;
use kernel_core::*;
use serde_json::json;
use std::sync::Arc;
use testkit::harness::World;
use testkit::time::TestTime;

/// The store calls a scenario scripts; `MockStore` forwards the port to it. (mockall
/// cannot mock `Option<&str>` parameters, so the two scan reads return nothing here.)
#[mockall::automock]
#[async_trait::async_trait]
trait Scripted {
    async fn create(&self, instance: WorkflowInstance) -> Result<CreateOutcome>;
    async fn get(&self, workflow_id: &str) -> Result<Option<WorkflowInstance>>;
    async fn get_by_biz_key(&self, biz_key: &str) -> Result<Option<WorkflowInstance>>;
    async fn claim(&self, workflow_id: &str, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>>;
    async fn claim_any(&self, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>>;
    async fn apply(&self, workflow_id: &str, guard: &Guard, transition: &Transition) -> Result<WriteOutcome>;
}

type MockStore = MockScripted;

struct Forward(MockScripted);

#[async_trait::async_trait]
impl WorkflowStore for Forward {
    async fn create(&self, instance: WorkflowInstance) -> Result<CreateOutcome> {
        self.0.create(instance).await
    }
    async fn get(&self, workflow_id: &WorkflowId) -> Result<Option<WorkflowInstance>> {
        self.0.get(workflow_id).await
    }
    async fn get_by_biz_key(&self, biz_key: &str) -> Result<Option<WorkflowInstance>> {
        self.0.get_by_biz_key(biz_key).await
    }
    async fn claim(&self, workflow_id: &WorkflowId, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        self.0.claim(workflow_id, spec).await
    }
    async fn claim_any(&self, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        self.0.claim_any(spec).await
    }
    async fn apply(&self, workflow_id: &WorkflowId, guard: &Guard, transition: &Transition) -> Result<WriteOutcome> {
        self.0.apply(workflow_id, guard, transition).await
    }
    async fn scan_due_waits(
        &self,
        _now: Instant,
        _after: Option<&DueCursor>,
        _limit: usize,
    ) -> Result<ScanPage<DueWait>> {
        Ok(ScanPage::default())
    }
    async fn scan_claimable(&self, _after: Option<&WorkflowId>, _limit: usize) -> Result<ScanPage<Candidate>> {
        Ok(ScanPage::default())
    }
}

/// A claimed 4-step instance as the store would return it.
async fn claimed_instance(world: &World) -> WorkflowInstance {
    let e = world.engine("seed", vec![crate::linear("t", 4, false)]);
    e.publisher().start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf-b")).await.unwrap();
    let mut i = world.store.peek("wf-b").unwrap();
    i.claim_token = Some("tok-1".into());
    i.claimable_time = Some(world.now().plus(30_000));
    i
}

/// Mints `tok-1`, the token of the scripted claimed document: the engine runs a claim with
/// the token it minted (K-6.2), as a real store would have stored it.
struct OneToken;

impl IdGenerator for OneToken {
    fn new_token(&self) -> String {
        "tok-1".into()
    }
    fn random_u64(&self) -> u64 {
        0
    }
    fn task_token(&self) -> kernel_core::Result<String> {
        kernel_core::ports::os_task_token()
    }
}

fn engine_with(world: &World, store: MockStore) -> Engine {
    let mut ports = world.ports();
    ports.store = Arc::new(Forward(store));
    ports.ids = Arc::new(OneToken);
    world.engine_on(ports, testkit::harness::test_config("m"), vec![crate::linear("t", 4, false)])
}

#[tokio::test]
async fn claim_lost_at_the_third_write_stops_the_claim() {
    let world = World::new(1);
    let inst = claimed_instance(&world).await;
    let claimed_instance_copy = inst.clone();
    let mut store = MockStore::new();
    store.expect_claim().times(1).returning(move |_, _| Ok(Some(inst.clone())));
    let mut seq = mockall::Sequence::new();
    for rev in 1..=2 {
        store.expect_apply().times(1).in_sequence(&mut seq).returning(move |_, g, _| {
            assert!(matches!(g, Guard::Running { token } if token == "tok-1"));
            Ok(WriteOutcome::Applied { revision: rev })
        });
    }
    // Third write: another worker took over.
    store.expect_apply().times(1).in_sequence(&mut seq).returning(|_, _, t| {
        assert_eq!(t.kinds().collect::<Vec<_>>(), vec![TransitionKind::CompleteStep, TransitionKind::MarkRunning]);
        Ok(WriteOutcome::Missed)
    });
    // One read after the miss (K-6.8: was it an operator's request to this claim?): no,
    // another worker holds it.
    let mut taken = claimed_instance_copy.clone();
    taken.claim_token = Some("tok-other".into());
    store.expect_get().times(1).in_sequence(&mut seq).returning(move |_| Ok(Some(taken.clone())));
    let engine = engine_with(&world, store);
    let out = engine.tick().await.unwrap();
    assert_eq!(out, RoundOutcome::Ran { workflow_id: "wf-b".into(), end: ClaimEnd::ClaimLost });
    // The mock panics on any further call: no retry, no other write.
}

#[tokio::test]
async fn an_uncertain_write_ends_the_claim_without_retrying() {
    let world = World::new(1);
    let inst = claimed_instance(&world).await;
    let mut store = MockStore::new();
    store.expect_claim().times(1).returning(move |_, _| Ok(Some(inst.clone())));
    let mut seq = mockall::Sequence::new();
    store.expect_apply().times(1).in_sequence(&mut seq).returning(|_, _, _| Ok(WriteOutcome::Applied { revision: 1 }));
    store
        .expect_apply()
        .times(1)
        .in_sequence(&mut seq)
        .returning(|_, _, _| Err(Error::uncertain("socket closed after the write was sent")));
    let engine = engine_with(&world, store);
    let out = engine.tick().await.unwrap();
    assert_eq!(out, RoundOutcome::Ran { workflow_id: "wf-b".into(), end: ClaimEnd::Uncertain });
}

#[tokio::test]
async fn a_store_outage_during_start_is_reported_and_writes_nothing_else() {
    let world = World::new(1);
    let mut store = MockStore::new();
    // The create is the start's first store call (no read before it): the mock panics on
    // any other call.
    store.expect_create().times(1).returning(|_| Err(Error::unavailable("primary stepped down")));
    let engine = engine_with(&world, store);
    let r = engine.publisher().start_or_resume(StartRequest::new("t", "b", json!({}))).await;
    assert!(matches!(r, Err(Error::Unavailable { .. })));
    assert!(r.unwrap_err().is_retryable());
    assert!(world.queue.is_empty(), "nothing enqueued for an instance that was not stored");
}
