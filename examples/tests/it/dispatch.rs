//! K-11, K-12, K-3.1: from request to workflow, through crashes at every write boundary of
//! the realtime and the recovery path, racing dispatchers and flushed candidates.

use kernel_core::dispatch::*;
use kernel_core::ports::*;
use kernel_core::ObjectId;
use kernel_core::*;
use serde_json::json;
use std::sync::Arc;
use testkit::dispatch::{crash_windows, DispatchEnv};
use testkit::harness::{BoxFuture, World};
use testkit::memory::{InMemoryCandidates, InMemoryOutbox};
use testkit::time::TestTime;

use kernel_examples::workflows::{order, ORDER as TYPE};

fn request(i: usize, fail: bool) -> AcceptRequest {
    let object_id = format!("obj-{i}");
    AcceptRequest {
        fields: json!({ "title": format!("note {i}") }),
        workflow_type: TYPE.into(),
        biz_key: format!("{TYPE}:{object_id}"),
        fencing_token: "f1".into(),
        input: json!({ "object_id": object_id, "fencing_token": "f1", "fail": fail, "stream": i.is_multiple_of(2) }),
        priority: Priority::P1,
        object_id: object_id.into(),
    }
}

struct Env {
    inner: DispatchEnv,
    world: World,
    outbox: InMemoryOutbox,
    candidates: InMemoryCandidates,
}

impl Env {
    fn new(seed: u64) -> Self {
        let (outbox, candidates) = (InMemoryOutbox::new(), InMemoryCandidates::new());
        let world = World::new(seed);
        let inner = DispatchEnv {
            world: world.clone(),
            outbox: Arc::new(outbox.clone()),
            candidates: Arc::new(candidates.clone()),
            defs: Arc::new(|o| vec![order(o)]),
        };
        Env { inner, world, outbox, candidates }
    }
    fn defs(&self) -> Vec<Definition> {
        vec![order(Arc::new(self.outbox.clone()))]
    }
    fn dispatcher(&self, id: &str) -> Dispatch {
        self.inner.dispatcher(id)
    }
    async fn verdict(&self) -> (usize, usize, usize, usize, usize) {
        let ids: Vec<ObjectId> = self.outbox.all().into_iter().map(|r| r.object_id).collect();
        let v = self.inner.verdict(&ids).await.unwrap();
        (v.accepted, v.registered, v.duplicate_instances, v.stuck_pending, v.input_mismatch)
    }
}

/// K-3.1, K-3.2 through a crash at every write boundary of both paths, 8 seeds.
#[tokio::test]
async fn both_paths_survive_a_crash_at_every_boundary() {
    let factory = |seed: u64| -> BoxFuture<'static, DispatchEnv> { Box::pin(async move { Env::new(seed).inner }) };
    let report = crash_windows(&factory, &[0, 1, 2, 3, 4, 5, 6, 7], 3, Arc::new(|i| request(i, false)), 0).await;
    println!("{report}");
    assert!(report.realtime_boundaries >= 9, "{report:?}");
    assert!(report.recovery_boundaries >= 10, "{report:?}");
    assert_eq!(report.dirty_runs, 0, "{report:?}");
    assert_eq!(report.stale_writes_accepted, 0, "{report:?}");
    assert!(report.stale_writes_attempted > 0, "a dead dispatcher tried a late write: {report:?}");
}

#[tokio::test]
async fn confirm_rereads_on_a_miss() {
    // K-11.2
    let env = Env::new(1);
    let d = env.dispatcher("api");
    d.accept(request(1, false)).await.unwrap();
    assert_eq!(d.dispatch_now(&"obj-1".into()).await.unwrap(), RealtimeOutcome::Dispatched);
    let stored = env.outbox.get(&"obj-1".into()).await.unwrap().unwrap().dispatch.unwrap();
    assert_eq!(stored.status, DispatchStatus::Dispatched, "confirmed in the store, not just reported");
    assert_eq!(d.dispatch_now(&"obj-1".into()).await.unwrap(), RealtimeOutcome::Dispatched, "idempotent");
    // A recovery dispatcher holds the next one: the realtime path leaves it alone.
    d.accept(request(2, false)).await.unwrap();
    env.world.clock.advance(10_000);
    let rec = env
        .outbox
        .try_lease(&"obj-2".into(), env.world.now(), &"d-1".into(), env.world.now().plus(30_000))
        .await
        .unwrap();
    assert!(rec.is_some());
    assert_eq!(d.dispatch_now(&"obj-2".into()).await.unwrap(), RealtimeOutcome::LeftToDispatcher);
}

#[tokio::test]
async fn two_concurrent_retries_install_one_round_and_old_writes_are_fenced() {
    // K-11.4, K-11.5, K-12
    let env = Env::new(2);
    let d = env.dispatcher("api");
    d.accept(request(1, true)).await.unwrap();
    d.dispatch_now(&"obj-1".into()).await.unwrap();
    let worker = env.world.engine("W", env.defs());
    env.world.drive(&worker).await.unwrap();
    assert_eq!(env.outbox.get(&"obj-1".into()).await.unwrap().unwrap().business_status.as_deref(), Some("failed"));
    let input = |f: &str| json!({ "object_id": "obj-1", "fencing_token": f, "fail": false, "stream": false });
    let (obj, f1, f2, f3) = ("obj-1".into(), "f1".into(), "f2".into(), "f3".into());
    let (a, b) = tokio::join!(d.retry_failed(&obj, &f1, &f2, input("f2")), d.retry_failed(&obj, &f1, &f3, input("f3")));
    let outcomes = [a, b];
    assert_eq!(outcomes.iter().filter(|r| r.is_ok()).count(), 1, "{outcomes:?}");
    assert!(outcomes.iter().any(|r| matches!(r, Err(Error::RoundChanged(_)))));
    let rec = env.outbox.get(&"obj-1".into()).await.unwrap().unwrap();
    let f = rec.dispatch.as_ref().unwrap().fencing_token.clone();
    assert!(f == "f2" || f == "f3");
    env.world.drive(&worker).await.unwrap();
    let inst = env.world.store.all().pop().unwrap();
    assert_eq!((inst.status, inst.retry_count), (WorkflowStatus::Completed, 1), "the same instance replayed");
    assert_eq!(inst.input["fencing_token"], json!(f));
    // A late write of the first round's activity changes nothing.
    assert!(!env
        .outbox
        .fenced_update(&"obj-1".into(), &"f1".into(), json!({ "result": "stale" }), Some("done"))
        .await
        .unwrap());
    let rec = env.outbox.get(&"obj-1".into()).await.unwrap().unwrap();
    assert_eq!(rec.fields["result"], json!(format!("done in {f}")));
}

#[tokio::test]
async fn an_expired_dispatcher_cannot_confirm_renew_or_revert() {
    // K-11.3
    let env = Env::new(3);
    env.dispatcher("api").accept(request(1, false)).await.unwrap();
    let now = env.world.now().plus(10_000);
    assert!(env.outbox.try_lease(&"obj-1".into(), now, &"d-old".into(), now.plus(30_000)).await.unwrap().is_some());
    assert!(
        env.outbox
            .try_lease(&"obj-1".into(), now.plus(1), &"d-other".into(), now.plus(30_000))
            .await
            .unwrap()
            .is_none(),
        "held"
    );
    let later = now.plus(30_001);
    assert!(
        env.outbox.try_lease(&"obj-1".into(), later, &"d-new".into(), later.plus(30_000)).await.unwrap().is_some(),
        "expired ⇒ taken over"
    );
    let before = env.outbox.get(&"obj-1".into()).await.unwrap();
    assert!(!env.outbox.renew_lease(&"obj-1".into(), &"f1".into(), &"d-old".into(), later.plus(99_000)).await.unwrap());
    assert!(!env.outbox.confirm_leased(&"obj-1".into(), &"f1".into(), &"d-old".into()).await.unwrap());
    assert!(!env.outbox.revert_leased(&"obj-1".into(), &"f1".into(), &"d-old".into(), later).await.unwrap());
    assert_eq!(env.outbox.get(&"obj-1".into()).await.unwrap(), before, "no document changed");
}

#[tokio::test]
async fn recovery_works_while_the_candidate_index_is_down_or_flushed() {
    // K-11.3: the store scan under the mutex keeps recovery going without Redis.
    let env = Env::new(4);
    for i in 0..5 {
        env.dispatcher("api").accept(request(i, false)).await.unwrap();
    }
    env.candidates.flush();
    env.candidates.set_down(true);
    env.world.clock.advance(10_000);
    let r = env.dispatcher("R1");
    let rep = r.scan().await.unwrap().expect("mutex taken");
    assert_eq!(rep.dispatched, 5);
    assert!(env.dispatcher("R2").scan().await.unwrap().is_none(), "the mutex is held by R1");
    env.candidates.set_down(false);
    let (accepted, registered, duplicates, stuck, mismatch) = env.verdict().await;
    assert_eq!((accepted, registered, duplicates, stuck, mismatch), (5, 5, 0, 0, 0));
}

#[tokio::test]
async fn legacy_objects_get_a_conservative_input_from_stable_fields() {
    // K-11.3
    let env = Env::new(5);
    let intent = DispatchIntent::pending(TYPE, "order:old-1", &"f7".into(), json!(null), Priority::P3, env.world.now());
    env.outbox.insert_legacy("old-1", json!({ "title": "old note", "client_caps": "whatever" }), "initial", intent);
    let d = env.dispatcher("R1").with_legacy_input(Arc::new(|rec: &DispatchRecord| {
        let f = rec.dispatch.as_ref().map(|d| d.fencing_token.clone()).unwrap_or_default();
        json!({ "object_id": rec.object_id, "fencing_token": f, "fail": false, "stream": false })
    }));
    assert_eq!(d.process(&"old-1".into()).await.unwrap(), Processed::Dispatched);
    let inst = env.world.store.all().pop().unwrap();
    assert_eq!(inst.input, json!({ "object_id": "old-1", "fencing_token": "f7", "fail": false, "stream": false }));
    // Without a builder the intent is reverted, never dispatched with a guessed input.
    let intent = DispatchIntent::pending(TYPE, "order:old-2", &"f1".into(), json!(null), Priority::P3, env.world.now());
    env.outbox.insert_legacy("old-2", json!({}), "initial", intent);
    assert_eq!(env.dispatcher("R2").process(&"old-2".into()).await.unwrap(), Processed::Reverted);
}

#[tokio::test]
async fn accept_rejects_a_snapshot_of_another_round() {
    let env = Env::new(6);
    let mut req = request(1, false);
    req.input["fencing_token"] = json!("f0");
    assert!(matches!(env.dispatcher("api").accept(req).await, Err(Error::InvalidInput { .. })));
    assert!(env.outbox.all().is_empty());
}

/// Defect 1 (K-5, K-11.4, K-17.1): the API process dies between StartOrResume and confirm,
/// the workflow then fails, and recovery takes the intent of the same round. Recovery must
/// settle the intent against the failed instance, not replay it: a replay would re-run the
/// failed payment step under a new idempotency key (charge twice), and the user's retry
/// (round f2) would then be confirmed against the f1 replay with its own input never run.
#[tokio::test]
async fn same_round_recovery_settles_a_failed_instance_and_the_next_round_runs() {
    // Every execution of the payment step: (round, idempotency key).
    let charges: Arc<std::sync::Mutex<Vec<(String, String)>>> = Arc::default();
    let defs = {
        let charges = charges.clone();
        move |outbox: Arc<DynOutbox>| {
            let (charges, o1, o2) = (charges.clone(), outbox.clone(), outbox);
            let pay = move |c: ActivityContext| {
                let (charges, outbox) = (charges.clone(), o1.clone());
                async move {
                    let round = c.round().clone();
                    let (id, f) = (round.object_id.unwrap_or_default(), round.fencing_token.unwrap_or_default());
                    charges.lock().unwrap().push((f.to_string(), c.idempotency_key()));
                    if c.input()["fail"] == json!(true) {
                        return Err(ActivityError::permanent("payment declined"));
                    }
                    let ok = outbox
                        .fenced_update(&id, &f, json!({ "result": format!("done in {f}") }), Some("done"))
                        .await
                        .map_err(|e| ActivityError::transient(e.to_string()))?;
                    if !ok {
                        return Err(ActivityError::canceled("the round moved on"));
                    }
                    Ok(StepOutcome::complete(json!({ "charged": true })))
                }
            };
            let on_failure = move |c: ActivityContext| {
                let outbox = o2.clone();
                async move {
                    let round = c.round().clone();
                    let (id, f) = (round.object_id.unwrap_or_default(), round.fencing_token.unwrap_or_default());
                    outbox
                        .fenced_update(&id, &f, json!({ "error": "payment declined" }), Some("failed"))
                        .await
                        .map_err(|e| ActivityError::transient(e.to_string()))?;
                    Ok(StepOutcome::complete(serde_json::Value::Null))
                }
            };
            vec![Definition::builder(TYPE)
                .step(StepDef::new("pay", pay))
                .failure_finalizer(on_failure)
                .build()
                .unwrap()]
        }
    };
    let base = Env::new(11);
    let env = DispatchEnv { defs: Arc::new(defs), ..base.inner.clone() };
    let obj: ObjectId = "obj-1".into();
    let api = env.dispatcher("api");
    api.accept(request(1, true)).await.unwrap();
    // The API process's StartOrResume ran; it died before confirm.
    let intent = base.outbox.get(&obj).await.unwrap().unwrap().dispatch.unwrap();
    let start = StartRequest::new(TYPE, intent.biz_key.clone(), intent.input.clone().unwrap()).priority(Priority::P1);
    let dead = env.world.engine("dead-api", (env.defs)(env.outbox.clone()));
    assert!(dead.publisher().start_or_resume(start).await.unwrap().execution_activated);
    let worker = env.world.engine("W", (env.defs)(env.outbox.clone()));
    env.world.drive(&worker).await.unwrap();
    assert_eq!(base.outbox.get(&obj).await.unwrap().unwrap().business_status.as_deref(), Some("failed"));
    // Recovery takes the still-pending f1 intent.
    env.world.clock.advance(DispatchConfig::default().realtime_grace_ms);
    let report = env.dispatcher("R1").recover_round().await.unwrap();
    assert_eq!(report.dispatched, 1, "the f1 intent is settled against the failed f1 instance: {report:?}");
    // The user retries with round f2 before any worker runs again.
    let f2_input = json!({ "object_id": "obj-1", "fencing_token": "f2", "fail": false, "stream": false });
    assert_eq!(
        api.retry_failed(&obj, &"f1".into(), &"f2".into(), f2_input.clone()).await.unwrap(),
        RealtimeOutcome::Dispatched
    );
    env.world.drive(&worker).await.unwrap();
    let charges = charges.lock().unwrap().clone();
    let f1: Vec<_> = charges.iter().filter(|(f, _)| f == "f1").collect();
    assert_eq!(f1.len(), 1, "the failed f1 payment ran once, never under a new key: {charges:?}");
    let inst = env.world.store.all().pop().unwrap();
    assert_eq!(
        (inst.status, inst.retry_count, &inst.input),
        (WorkflowStatus::Completed, 1, &f2_input),
        "the f2 retry replayed the instance with f2's input"
    );
    let rec = base.outbox.get(&obj).await.unwrap().unwrap();
    assert_eq!(rec.fields["result"], json!("done in f2"));
    assert_eq!(rec.dispatch.map(|d| (d.fencing_token, d.status)), Some(("f2".into(), DispatchStatus::Dispatched)));
}

/// No silent passes: a sweep whose verdict cannot be read (here: the store cannot list its
/// instances) fails, instead of counting an unreadable run as a clean one.
#[tokio::test]
async fn no_silent_pass_an_unreadable_verdict_fails_the_dispatch_sweep() {
    use futures::FutureExt;
    let factory = |seed: u64| -> BoxFuture<'static, DispatchEnv> {
        Box::pin(async move {
            let store = testkit::memory::InMemoryStore::new();
            let inbox = testkit::memory::InMemoryInbox::new();
            let blind: testkit::harness::Lister =
                Arc::new(|| Box::pin(async { Err(Error::unavailable("the store cannot list instances")) }));
            let world = World::with_durable(seed, Default::default(), Arc::new(store), Arc::new(inbox), blind);
            DispatchEnv {
                world,
                outbox: Arc::new(InMemoryOutbox::new()),
                candidates: Arc::new(InMemoryCandidates::new()),
                defs: Arc::new(|o| vec![order(o)]),
            }
        })
    };
    let run = crash_windows(&factory, &[0], 1, Arc::new(|i| request(i, false)), 2);
    let outcome = std::panic::AssertUnwindSafe(run).catch_unwind().await;
    assert!(outcome.is_err(), "the sweep passed on verdicts it could not read: {:?}", outcome.ok());
}
