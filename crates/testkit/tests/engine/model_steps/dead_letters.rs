//! Dead letters and unknown outcomes (K-17.2): an operator completes or fails a dead-lettered
//! step, a lost record is written at the poll, retries are bounded in time, a done query
//! completes the step, and maintenance purges expired cache entries and closed dead letters.

use kernel_core::activity::idempotency_key_at;
use kernel_core::definition::QueryAnswer;
use kernel_core::model_call::OutputSchema;
use kernel_core::ports::*;
use kernel_core::record::{RecordEntry, VersionRef};
use kernel_core::*;
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use testkit::harness::World;

fn always_refused(schema: bool) -> Definition {
    let mut post = StepDef::new("post", |_| async { Err(ActivityError::permanent("the ledger refused the vendor")) })
        .on_failed(OnFailed::DeadLetter);
    if schema {
        post = post.output_schema(
            OutputSchema::new(VersionRef::new("posting", "1"), json!({"type": "object", "required": ["posting_id"]}))
                .unwrap(),
        );
    }
    Definition::builder("post").step(post).build().unwrap()
}

/// One step `charge` whose every call loses its reply (unknown outcome), with a query hook
/// answering `answer()`; `runs` and `queries` count calls and queries.
fn lost_reply(
    workflow_type: &str,
    runs: &Arc<AtomicU64>,
    queries: &Arc<AtomicU64>,
    max_retry: u32,
    answer: fn() -> QueryAnswer,
) -> Definition {
    let (r, q) = (runs.clone(), queries.clone());
    Definition::builder(workflow_type)
        .step(
            StepDef::new("charge", move |_| {
                let r = r.clone();
                async move {
                    r.fetch_add(1, Ordering::SeqCst);
                    Err(ActivityError::unknown_outcome("reply lost"))
                }
            })
            .max_retry(max_retry)
            .retry(RetryPolicy::Immediate)
            .on_unknown_outcome(move |_ctx: ActivityContext| {
                let q = q.clone();
                async move {
                    q.fetch_add(1, Ordering::SeqCst);
                    Ok(answer())
                }
            }),
        )
        .build()
        .unwrap()
}

/// K-17.2: a dead letter is listed from the records; an operator output that fails the
/// step's schema is refused with nothing written; a valid one completes the step, recorded
/// as operator-supplied; "fail" fails the workflow; both close the record.
#[tokio::test]
async fn dead_letter_complete_and_fail() {
    let world = World::new(7);
    let engine = world.engine("A", vec![always_refused(true)]);
    let p = engine.publisher();
    let w1 = p.start_or_resume(StartRequest::new("post", "biz:p1", json!({}))).await.unwrap().instance.workflow_id;
    let w2 = p.start_or_resume(StartRequest::new("post", "biz:p2", json!({}))).await.unwrap().instance.workflow_id;
    world.drive(&engine).await.unwrap();
    let open = engine.dead_letters(Some(DeadLetterStatus::Open), None, 10).await.unwrap();
    assert_eq!(open.len(), 2);
    for w in [&w1, &w2] {
        let i = world.instance(w.as_str()).await.unwrap();
        assert_eq!((i.status, i.claim_token.clone()), (WorkflowStatus::Waiting, None), "no new status, no worker held");
    }
    let id1 = idempotency_key_at(w1.as_str(), "post", 0, 0);
    let before = world.instance(w1.as_str()).await.unwrap();
    let bad =
        engine.decide_dead_letter(&id1, DeadLetterAction::Complete { output: json!({"nope": 1}) }, "ops", None).await;
    assert!(matches!(bad, Err(Error::InvalidInput { .. })), "{bad:?}");
    assert_eq!(world.dead_letters.get(&id1).await.unwrap().unwrap().status, DeadLetterStatus::Open);
    assert_eq!(world.instance(w1.as_str()).await.unwrap(), before);
    let ok = engine
        .decide_dead_letter(&id1, DeadLetterAction::Complete { output: json!({"posting_id": "P-1"}) }, "ops", None)
        .await;
    assert_eq!(ok.unwrap(), DecideOutcome::Decided);
    let id2 = idempotency_key_at(w2.as_str(), "post", 0, 0);
    engine.decide_dead_letter(&id2, DeadLetterAction::Fail, "ops", Some("vendor unknown")).await.unwrap();
    world.drive(&engine).await.unwrap();
    let i1 = world.instance(w1.as_str()).await.unwrap();
    assert_eq!((i1.status, i1.output["post"].clone()), (WorkflowStatus::Completed, json!({"posting_id": "P-1"})));
    let entries = &i1.steps[0].record.as_ref().unwrap().entries;
    assert!(matches!(entries.last(), Some(RecordEntry::Operator(o)) if o.action == "complete" && o.actor == "ops"));
    assert_eq!(world.instance(w2.as_str()).await.unwrap().status, WorkflowStatus::Failed);
    assert_eq!(engine.dead_letters(Some(DeadLetterStatus::Closed), None, 10).await.unwrap().len(), 2);
    let again = engine.decide_dead_letter(&id1, DeadLetterAction::Retry, "ops", None).await.unwrap();
    assert_eq!(again, DecideOutcome::Closed, "a closed dead letter takes no new decision");
}

/// The dead-letter record is written after the instance's wait; when that write is lost,
/// the poll fallback's visit writes it (K-17.2, K-9.5).
#[tokio::test]
async fn a_lost_dead_letter_record_is_written_at_the_poll() {
    #[derive(Clone)]
    struct LosesFirst(testkit::memory::MemoryDeadLetters, Arc<AtomicU64>);
    #[async_trait::async_trait]
    impl DeadLetters for LosesFirst {
        async fn record(&self, dl: &DeadLetter) -> kernel_core::Result<bool> {
            if self.1.fetch_add(1, Ordering::SeqCst) == 0 {
                return Err(Error::unavailable("lost"));
            }
            self.0.record(dl).await
        }
        async fn get(&self, id: &str) -> kernel_core::Result<Option<DeadLetter>> {
            self.0.get(id).await
        }
        async fn list(
            &self,
            s: Option<DeadLetterStatus>,
            a: Option<&str>,
            l: usize,
        ) -> kernel_core::Result<Vec<DeadLetter>> {
            self.0.list(s, a, l).await
        }
        async fn decide(&self, id: &str, d: &DeadLetterDecision) -> kernel_core::Result<DecideOutcome> {
            self.0.decide(id, d).await
        }
        async fn close(&self, id: &str, now: kernel_core::Instant) -> kernel_core::Result<bool> {
            self.0.close(id, now).await
        }
        async fn purge_closed(&self, before: kernel_core::Instant, limit: usize) -> kernel_core::Result<u64> {
            self.0.purge_closed(before, limit).await
        }
    }
    let world = World::new(8);
    let mut ports = world.ports();
    ports.dead_letters = Some(Arc::new(LosesFirst(world.dead_letters.clone(), Default::default())));
    let config = testkit::harness::test_config("A");
    let poll = config.dead_letter_poll_ms;
    let engine = world.engine_on(ports, config, vec![always_refused(false)]);
    engine.publisher().start_or_resume(StartRequest::new("post", "biz:p", json!({}))).await.unwrap();
    world.drive(&engine).await.unwrap();
    assert!(world.dead_letters.list(None, None, 10).await.unwrap().is_empty(), "the first record write was lost");
    world.clock.advance(poll);
    world.drive(&engine).await.unwrap();
    let dls = world.dead_letters.list(None, None, 10).await.unwrap();
    assert_eq!(dls.len(), 1);
    assert_eq!((dls[0].status, dls[0].error.class), (DeadLetterStatus::Open, ErrorClass::Permanent));
    assert_eq!(world.instances().await.unwrap()[0].status, WorkflowStatus::Waiting, "waiting again for the operator");
}

/// A definition that dead-letters needs a DeadLetters port: refused at build.
#[tokio::test]
async fn an_engine_without_a_dead_letter_port_is_refused() {
    let world = World::new(9);
    let mut ports = world.ports();
    ports.dead_letters = None;
    let r = Engine::builder(ports).register(always_refused(false)).build();
    assert!(matches!(r, Err(Error::InvalidInput { ref field, .. }) if field == "ports.dead_letters"), "{:?}", r.err());
}

/// K-17.2: retries are bounded by time as well as count, from the first retryable failure.
#[tokio::test]
async fn max_retry_duration_bounds_the_retries() {
    let world = World::new(10);
    let tries = Arc::new(AtomicU64::new(0));
    let t = tries.clone();
    let def = Definition::builder("slow")
        .step(
            StepDef::new("call", move |_| {
                let t = t.clone();
                async move {
                    t.fetch_add(1, Ordering::SeqCst);
                    Err(ActivityError::transient("down"))
                }
            })
            .max_retry(1_000)
            .retry(RetryPolicy::Exponential { base_ms: DurationMs::from_secs(2), cap_ms: DurationMs::from_secs(2) })
            .max_retry_duration(DurationMs::from_secs(60)),
        )
        .build()
        .unwrap();
    let engine = world.engine("A", vec![def]);
    engine.publisher().start_or_resume(StartRequest::new("slow", "biz:s", json!({}))).await.unwrap();
    let start = world.now();
    world.drive(&engine).await.unwrap();
    let inst = world.instances().await.unwrap().pop().unwrap();
    assert_eq!(inst.status, WorkflowStatus::Failed);
    let n = tries.load(Ordering::SeqCst);
    assert!(n > 2 && n < 1_000, "{n} attempts");
    assert!(world.now() - start >= DurationMs::from_secs(60), "retried for the whole minute");
    assert!(inst.steps[0].retrying_since.is_some());
}

/// K-17.2 query before retry: after an unknown outcome the hook is asked first; "done"
/// completes the step with its output and the activity never runs again.
#[tokio::test]
async fn a_done_query_completes_the_step_without_running_it_again() {
    let world = World::new(11);
    let (runs, queries) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let def = lost_reply("q", &runs, &queries, 3, || QueryAnswer::Done(json!({"charged": true})));
    let inst = world.run_to_rest(def, "q", "biz:q").await;
    assert_eq!(inst.status, WorkflowStatus::Completed);
    assert_eq!((runs.load(Ordering::SeqCst), queries.load(Ordering::SeqCst)), (1, 1));
}

/// Two dead-lettered steps of one wave: both get a dead letter, and each waits for its own
/// decision; neither is silently failed.
#[tokio::test]
async fn two_dead_letters_in_one_wave_each_wait_for_their_decision() {
    let world = World::new(14);
    let refused = |name: &'static str| {
        StepDef::new(name, |ctx: ActivityContext| async move {
            if ctx.epoch() == 0 {
                Err(ActivityError::permanent("refused"))
            } else {
                Ok(StepOutcome::complete(json!(ctx.step_name())))
            }
        })
        .on_failed(OnFailed::DeadLetter)
        .depends_on(Vec::<String>::new())
    };
    let def = Definition::builder("pair").step(refused("p")).step(refused("q")).build().unwrap();
    let engine = world.engine("A", vec![def]);
    let wf = engine
        .publisher()
        .start_or_resume(StartRequest::new("pair", "biz:pair", json!({})))
        .await
        .unwrap()
        .instance
        .workflow_id;
    world.drive(&engine).await.unwrap();
    assert_eq!(engine.dead_letters(Some(DeadLetterStatus::Open), None, 10).await.unwrap().len(), 2, "both recorded");
    for step in ["p", "q"] {
        let inst = world.instance(wf.as_str()).await.unwrap();
        assert_eq!(inst.status, WorkflowStatus::Waiting, "before deciding {step}");
        let id = idempotency_key_at(wf.as_str(), step, 0, 0);
        engine.decide_dead_letter(&id, DeadLetterAction::Retry, "ops", None).await.unwrap();
        world.drive(&engine).await.unwrap();
        world.clock.advance(engine.config().dead_letter_poll_ms);
        world.drive(&engine).await.unwrap();
    }
    let inst = world.instance(wf.as_str()).await.unwrap();
    assert_eq!(inst.status, WorkflowStatus::Completed, "{:?}", inst.steps);
    assert_eq!((inst.steps[0].epoch, inst.steps[1].epoch), (1, 1));
}

/// K-17.2: an outcome still unknown past the retry bound is dead-lettered (the engine keeps
/// dead letters), never failed or retried blindly; the activity never ran after the first
/// unknown outcome — only the query was asked.
#[tokio::test]
async fn an_outcome_still_unknown_past_its_bound_is_dead_lettered() {
    let world = World::new(19);
    let (runs, queries) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let def = lost_reply("unknown", &runs, &queries, 2, || QueryAnswer::StillUnknown);
    let engine = world.engine("A", vec![def]);
    let wf = engine
        .publisher()
        .start_or_resume(StartRequest::new("unknown", "biz:u", json!({})))
        .await
        .unwrap()
        .instance
        .workflow_id;
    world.drive(&engine).await.unwrap();
    let inst = world.instance(wf.as_str()).await.unwrap();
    assert_eq!(inst.status, WorkflowStatus::Waiting, "{:?}", inst.steps[0]);
    let dls = engine.dead_letters(None, None, 10).await.unwrap();
    assert_eq!((dls.len(), dls[0].error.class), (1, ErrorClass::UnknownOutcome));
    assert_eq!((runs.load(Ordering::SeqCst), queries.load(Ordering::SeqCst)), (1, 2), "one call, then queries only");
}

/// Everything that grows is bounded: maintenance deletes expired cache entries and dead
/// letters closed longer than their retention, and nothing else.
#[tokio::test]
async fn maintenance_purges_expired_cache_entries_and_old_closed_dead_letters() {
    use kernel_core::ports::{CacheKey, CacheVersions, ResultCache};
    let world = World::new(21);
    let engine = world.engine("A", vec![always_refused(false)]);
    let versions = CacheVersions { prompt: "p1".into(), model: "m1".into(), tool: "t1".into(), data: "d1".into() };
    let now = world.now();
    let key = |n: i64| CacheKey::new("lookup", &versions, &json!(n)).unwrap();
    world.result_cache.put(&key(1), &json!("short"), now, DurationMs::from_secs(60)).await.unwrap();
    world.result_cache.put(&key(2), &json!("long"), now, DurationMs::from_secs(86_400)).await.unwrap();
    let wf = engine
        .publisher()
        .start_or_resume(StartRequest::new("post", "biz:p", json!({})))
        .await
        .unwrap()
        .instance
        .workflow_id;
    world.drive(&engine).await.unwrap();
    let id = idempotency_key_at(wf.as_str(), "post", 0, 0);
    engine.decide_dead_letter(&id, DeadLetterAction::Fail, "ops", None).await.unwrap();
    world.drive(&engine).await.unwrap();
    assert_eq!(world.dead_letters.get(&id).await.unwrap().unwrap().status, DeadLetterStatus::Closed);
    world.clock.advance(DurationMs::from_secs(120));
    let r = engine.maintain().await.unwrap();
    assert_eq!((r.cache_purged, r.dead_letters_purged), (1, 0), "the closed dead letter is within its retention");
    assert!(world.result_cache.get(&key(2), world.now()).await.unwrap().is_some());
    world.clock.advance(engine.config().dead_letter_retention_ms);
    let r = engine.maintain().await.unwrap();
    assert_eq!((r.cache_purged, r.dead_letters_purged), (1, 1));
    assert_eq!(world.dead_letters.get(&id).await.unwrap(), None);
}
