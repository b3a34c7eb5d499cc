//! Recorded model calls (K-17.3, K-17.4, K-17.4a): never re-sampled, invalid answers re-sampled
//! within a bound, older schema versions migrated or parked, recorded values read back, bounded.

use super::*;
use kernel_core::model_call::{Model, ModelAnswer, ModelRequest, OutputSchema};
use kernel_core::ports::*;
use kernel_core::record::{RecordEntry, Usage, VersionRef};
use kernel_core::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use testkit::harness::{sweep, BoxFuture, Scenario, ScenarioRun, ScenarioVerdict, SweepSample, World};

/// A workflow whose middle step calls the model (one schema violation, one rate limit,
/// then a valid answer) after recording the time, and whose last step publishes once per
/// idempotency key.
struct ModelScenario {
    counters: Arc<ModelCounters>,
}

struct ModelRun {
    model: Arc<ScriptedModel>,
    published: Arc<Mutex<BTreeMap<String, u64>>>,
}

impl Scenario for ModelScenario {
    fn name(&self) -> String {
        "model-step".into()
    }
    fn instantiate(&self, world: &World) -> Box<dyn ScenarioRun> {
        Box::new(ModelRun {
            model: Arc::new(ScriptedModel {
                script: vec![
                    vec![Answer::SchemaViolating(json!({"summary": 5}))],
                    vec![Answer::RateLimited, Answer::Valid(json!({"summary": "three words"}))],
                ],
                asks: Default::default(),
                seen: Default::default(),
                store: world.durable.clone(),
                counters: self.counters.clone(),
            }),
            published: Default::default(),
        })
    }
}

impl ScenarioRun for ModelRun {
    fn definitions(&self) -> Vec<Definition> {
        vec![definition(self.model.clone(), self.published.clone())]
    }
    fn start<'a>(&'a self, engine: &'a Engine) -> BoxFuture<'a, kernel_core::Result<()>> {
        Box::pin(async move {
            engine.publisher().start_or_resume(StartRequest::new("model-story", "biz:m1", json!({}))).await?;
            Ok(())
        })
    }
    fn verdict(&self, instances: &[WorkflowInstance]) -> ScenarioVerdict {
        let mut unfinished = vec![];
        for i in instances {
            let compose = &i.steps[1];
            let calls: Vec<_> = compose.record.iter().flat_map(|r| r.model_calls()).collect();
            let ok = i.status == WorkflowStatus::Completed
                && i.output.get("compose") == Some(&json!({"summary": "three words"}))
                && calls.len() == 1
                && calls[0].samples.len() == 2
                && calls[0].samples[0].errors.len() == 1;
            if !ok {
                unfinished.push(i.biz_key.clone());
            }
        }
        ScenarioVerdict {
            expected: vec!["biz:m1".into()],
            unfinished,
            effective_jobs_max: self.published.lock().unwrap().len() as u64,
            late_submissions: 0,
        }
    }
}

/// K-17.3 at every persistence boundary: a crash before or after any write, a zombie
/// returning late, a new worker taking over — the model is never asked again for a sample
/// the store holds, the recorded (re-sampled) output is the one the workflow completes
/// with, and the publish happens under one key.
#[tokio::test]
async fn a_recorded_model_call_is_never_resampled_at_any_crash_point() {
    let counters = Arc::new(ModelCounters::default());
    let sc = ModelScenario { counters: counters.clone() };
    let report = sweep(&[&sc], 17, SweepSample::All).await;
    report.assert_clean();
    assert!(report.runs >= 20, "{report:?}");
    assert_eq!(counters.replay_resamples.load(Ordering::SeqCst), 0, "re-samples of recorded calls");
    assert!(counters.calls.load(Ordering::SeqCst) >= 2 * report.runs, "each run drew its samples");
}

/// K-17.4: an invalid answer is re-sampled up to the step's limit, every sample recorded;
/// still invalid is a permanent error, and the model is not called again for the step.
#[tokio::test]
async fn invalid_answers_exhaust_the_resample_budget_then_fail_for_good() {
    let world = World::new(1);
    let counters = Arc::new(ModelCounters::default());
    let model = Arc::new(ScriptedModel {
        script: vec![
            vec![Answer::InvalidJson],
            vec![Answer::SchemaViolating(json!({}))],
            vec![Answer::InvalidJson],
            vec![Answer::Valid(json!({"summary": "late"}))],
        ],
        asks: Default::default(),
        seen: Default::default(),
        store: world.durable.clone(),
        counters: counters.clone(),
    });
    let m = model.clone();
    let def = Definition::builder("budget")
        .step(
            StepDef::new("compose", move |ctx: ActivityContext| {
                let m = m.clone();
                async move {
                    let out = ctx.model(&*m, ModelRequest::new("c", VersionRef::new("p", "1"), json!(1))).await?;
                    Ok(StepOutcome::complete(out))
                }
            })
            .output_schema(summary_schema("1"))
            .max_retry(5)
            .retry(RetryPolicy::Immediate),
        )
        .build()
        .unwrap();
    let inst = world.run_to_rest(def, "budget", "biz:b").await;
    assert_eq!(inst.status, WorkflowStatus::Failed);
    let call = inst.steps[0].record.as_ref().unwrap().model_calls().next().unwrap().clone();
    assert_eq!((call.samples.len(), call.exhausted, call.output), (3, true, None), "1 + 2 re-samples, all recorded");
    assert_eq!(counters.calls.load(Ordering::SeqCst), 3, "no retry after the permanent error");
    assert_eq!(inst.steps[0].error.as_ref().unwrap().class, ErrorClass::Permanent);
    assert_eq!(counters.replay_resamples.load(Ordering::SeqCst), 0);
}

/// K-17.4: a recorded output of schema v1 read by a worker whose step expects v2 is
/// migrated by the registered migration (recorded); without one the step parks (handed
/// back, never failed, never re-sampled).
#[tokio::test]
async fn an_older_schema_version_is_migrated_or_parks() {
    for with_migration in [true, false] {
        let world = World::new(2);
        let counters = Arc::new(ModelCounters::default());
        let model = Arc::new(ScriptedModel {
            script: vec![vec![Answer::Valid(json!({"summary": "v1 text"}))]],
            asks: Default::default(),
            seen: Default::default(),
            store: world.durable.clone(),
            counters: counters.clone(),
        });
        let gate = Arc::new(AtomicU64::new(0));
        let def = |schema: OutputSchema| {
            let (m, gate) = (model.clone(), gate.clone());
            Definition::builder("mig")
                .step(
                    StepDef::new("compose", move |ctx: ActivityContext| {
                        let (m, gate) = (m.clone(), gate.clone());
                        async move {
                            let out =
                                ctx.model(&*m, ModelRequest::new("c", VersionRef::new("p", "1"), json!(1))).await?;
                            if gate.fetch_add(1, Ordering::SeqCst) == 0 {
                                // The first worker dies after the call was recorded.
                                return Err(ActivityError::transient("crash after the record"));
                            }
                            Ok(StepOutcome::complete(out))
                        }
                    })
                    .output_schema(schema)
                    .max_retry(3)
                    .retry(RetryPolicy::Immediate),
                )
                .build()
                .unwrap()
        };
        let v1 = world.engine("A", vec![def(summary_schema("1"))]);
        v1.publisher().start_or_resume(StartRequest::new("mig", "biz:g", json!({}))).await.unwrap();
        v1.tick().await.unwrap();
        let v2_schema = OutputSchema::new(
            VersionRef::new("summary", "2"),
            json!({"type": "object", "required": ["summary", "lang"]}),
        )
        .unwrap();
        let v2_schema = if with_migration {
            v2_schema.migration("1", |mut v| {
                v["lang"] = json!("en");
                Ok(v)
            })
        } else {
            v2_schema
        };
        let v2 = world.engine("B", vec![def(v2_schema)]);
        world.drive(&v2).await.unwrap();
        let inst = world.instances().await.unwrap().pop().unwrap();
        let call = inst.steps[0].record.as_ref().unwrap().model_calls().next().unwrap().clone();
        assert_eq!(counters.calls.load(Ordering::SeqCst), 1, "never re-sampled");
        if with_migration {
            assert_eq!(inst.status, WorkflowStatus::Completed);
            assert_eq!(inst.output["compose"], json!({"summary": "v1 text", "lang": "en"}));
            assert_eq!(call.migrations.len(), 1, "the migration is recorded");
            assert_eq!(call.migrations[0].before, json!({"summary": "v1 text"}));
        } else {
            assert_eq!(inst.status, WorkflowStatus::Running, "parked, not failed");
            assert_eq!(inst.steps[0].error.as_ref().unwrap().class, ErrorClass::Parked);
            assert!(inst.claimable_time.unwrap() >= world.now(), "handed back for later");
            assert!(call.migrations.is_empty());
        }
    }
}

/// K-17.4a: a recorded value is read back on every later invocation of the attempt; a call
/// made in another order is a typed permanent error, not a silent new value.
#[tokio::test]
async fn recorded_values_are_read_back_and_order_is_checked() {
    let world = World::new(3);
    let draws = Arc::new(AtomicU64::new(0));
    let entries = Arc::new(AtomicU64::new(0));
    let (d, e) = (draws.clone(), entries.clone());
    let def = Definition::builder("vals")
        .step(
            StepDef::new("route", move |ctx: ActivityContext| {
                let (d, e) = (d.clone(), e.clone());
                async move {
                    let n = e.fetch_add(1, Ordering::SeqCst);
                    if n == 1 {
                        // Asking for another label where the record holds `dice` is refused.
                        let wrong = ctx.record("other", || async { Ok(json!(0)) }).await;
                        assert!(matches!(wrong, Err(ActivityError { class: ErrorClass::Permanent, .. })), "{wrong:?}");
                    }
                    let v = ctx.record("dice", || async { Ok(json!(d.fetch_add(1, Ordering::SeqCst) + 4)) }).await?;
                    if n == 0 {
                        return Err(ActivityError::transient("flaky after the draw"));
                    }
                    Ok(StepOutcome::complete(v))
                }
            })
            .max_retry(2)
            .retry(RetryPolicy::Immediate),
        )
        .build()
        .unwrap();
    let inst = world.run_to_rest(def, "vals", "biz:v").await;
    assert_eq!(inst.status, WorkflowStatus::Completed);
    assert_eq!((draws.load(Ordering::SeqCst), inst.output["route"].clone()), (1, json!(4)), "drawn once, read back");
    let rec = inst.steps[0].record.as_ref().unwrap();
    assert!(matches!(&rec.entries[..], [RecordEntry::Value(v)] if v.label == "dice"), "{rec:?}");
}

/// K-16 with K-17.3: a streaming model step streams tokens while it generates; re-run
/// after a failure that followed the record, it streams the recorded output — the reader
/// sees the same text, and the model generated once.
#[tokio::test]
async fn a_streaming_step_replays_the_recorded_output_to_its_readers() {
    struct Streaming(Arc<AtomicU64>);
    #[async_trait::async_trait]
    impl Model for Streaming {
        fn version(&self) -> VersionRef {
            VersionRef::new("streamer", "1")
        }
        async fn generate(&self, _req: &ModelRequest, ctx: &ActivityContext) -> Result<ModelAnswer, ActivityError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            let raw = r#"{"summary": "first and only"}"#;
            if let Some(s) = ctx.stream() {
                for chunk in raw.as_bytes().chunks(7) {
                    let _ = s.text(String::from_utf8_lossy(chunk)).await;
                }
            }
            Ok(ModelAnswer { raw: raw.into(), usage: Usage::default() })
        }
    }
    let world = World::new(12);
    let calls = Arc::new(AtomicU64::new(0));
    let (m, entries) = (Arc::new(Streaming(calls.clone())), Arc::new(AtomicU64::new(0)));
    let def = Definition::builder("streamer")
        .step(
            StepDef::new("compose", move |ctx: ActivityContext| {
                let (m, e) = (m.clone(), entries.clone());
                async move {
                    let out = ctx.model(&*m, ModelRequest::new("c", VersionRef::new("p", "1"), json!(1))).await?;
                    if e.fetch_add(1, Ordering::SeqCst) == 0 {
                        return Err(ActivityError::transient("lost after the record"));
                    }
                    Ok(StepOutcome::complete(out))
                }
            })
            .output_schema(summary_schema("1"))
            .streaming()
            .max_retry(1)
            .retry(RetryPolicy::Immediate),
        )
        .build()
        .unwrap();
    let engine = world.engine("A", vec![def]);
    engine
        .publisher()
        .start_or_resume(StartRequest::new("streamer", "biz:st", json!({"object_id": "o-1", "fencing_token": "f-1"})))
        .await
        .unwrap();
    world.drive(&engine).await.unwrap();
    assert_eq!(world.instances().await.unwrap()[0].status, WorkflowStatus::Completed);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "generated once");
    let key = world.streams.keys().pop().expect("a stream");
    let s = world.streams.get(&key).unwrap();
    let text: String = s
        .frames
        .iter()
        .filter_map(|f| match f {
            kernel_core::ports::Frame::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(s.generation, 2, "reset before the re-execution");
    assert_eq!(text, r#"{"summary": "first and only"}"#, "the reader sees the recorded output, once");
}

/// A recorded call made from inside another one (or concurrently) cannot be matched to
/// its record on the next run: a typed permanent error, never a hang.
#[tokio::test]
async fn a_nested_recorded_call_is_a_typed_error_not_a_hang() {
    let world = World::new(15);
    let def = Definition::builder("nested")
        .step(StepDef::new("s", |ctx: ActivityContext| async move {
            let inner = ctx.clone();
            let r = ctx.record("outer", || async move { inner.record("inner", || async { Ok(json!(1)) }).await }).await;
            match r {
                Err(e) if e.class == ErrorClass::Permanent => Ok(StepOutcome::complete(json!({"refused": e.message}))),
                other => Ok(StepOutcome::complete(json!({"unexpected": format!("{other:?}")}))),
            }
        }))
        .build()
        .unwrap();
    let engine = world.engine("A", vec![def]);
    engine.publisher().start_or_resume(StartRequest::new("nested", "biz:n", json!({}))).await.unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(20), world.drive(&engine)).await.expect("no hang").unwrap();
    let inst = world.instances().await.unwrap().pop().unwrap();
    assert!(inst.output["s"].get("refused").is_some(), "{:?}", inst.output);
}

/// A parked step keeps its checkpoint and its attempt count (K-4.3: parking is not a
/// failure), however often it is parked.
#[tokio::test]
async fn a_parked_step_keeps_its_checkpoint_and_attempts() {
    let world = World::new(16);
    let def = Definition::builder("park")
        .step(
            StepDef::new("s", |ctx: ActivityContext| async move {
                if ctx.checkpoint().is_none() {
                    return Ok(StepOutcome::yield_with(json!({"page": 3})));
                }
                Err(ActivityError::parked("cannot migrate"))
            })
            .max_retry(0),
        )
        .build()
        .unwrap();
    let engine = world.engine("A", vec![def]);
    engine.publisher().start_or_resume(StartRequest::new("park", "biz:pk", json!({}))).await.unwrap();
    for _ in 0..3 {
        world.drive_until(&engine, 3, &|| false).await.unwrap();
        world.clock.advance(engine.config().fingerprint_pushback_ms);
    }
    let inst = world.instances().await.unwrap().pop().unwrap();
    assert_eq!(inst.status, WorkflowStatus::Running, "never failed");
    let s = &inst.steps[0];
    assert_eq!((s.checkpoint.clone(), s.attempt), (Some(json!({"page": 3})), 0), "{s:?}");
    assert_eq!(s.error.as_ref().map(|e| e.class), Some(ErrorClass::Parked));
}

/// A call recorded under one model version is read back after a model upgrade (K-17.3):
/// the recorded branch is the branch.
#[tokio::test]
async fn a_recorded_call_is_read_back_after_a_model_upgrade() {
    struct Versioned(&'static str, Arc<AtomicU64>);
    #[async_trait::async_trait]
    impl Model for Versioned {
        fn version(&self) -> VersionRef {
            VersionRef::new("m", self.0)
        }
        async fn generate(&self, _r: &ModelRequest, _c: &ActivityContext) -> Result<ModelAnswer, ActivityError> {
            self.1.fetch_add(1, Ordering::SeqCst);
            Ok(ModelAnswer { raw: format!(r#"{{"summary": "{}"}}"#, self.0), usage: Usage::default() })
        }
    }
    let world = World::new(17);
    let calls = Arc::new(AtomicU64::new(0));
    let def = |version: &'static str| {
        let m = Arc::new(Versioned(version, calls.clone()));
        Definition::builder("up")
            .step(
                StepDef::new("s", move |ctx: ActivityContext| {
                    let m = m.clone();
                    async move {
                        let out = ctx.model(&*m, ModelRequest::new("c", VersionRef::new("p", "1"), json!(1))).await?;
                        if m.0 == "1" {
                            return Err(ActivityError::transient("the old worker stops here"));
                        }
                        Ok(StepOutcome::complete(out))
                    }
                })
                .output_schema(summary_schema("1"))
                .max_retry(2)
                .retry(RetryPolicy::Immediate),
            )
            .build()
            .unwrap()
    };
    let old = world.engine("A", vec![def("1")]);
    old.publisher().start_or_resume(StartRequest::new("up", "biz:up", json!({}))).await.unwrap();
    old.tick().await.unwrap();
    let new = world.engine("B", vec![def("2")]);
    world.drive(&new).await.unwrap();
    let inst = world.instances().await.unwrap().pop().unwrap();
    assert_eq!(inst.status, WorkflowStatus::Completed);
    assert_eq!(inst.output["s"], json!({"summary": "1"}), "the recorded answer, not a new one");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A model that times out is cut by the step's timeout (nothing recorded, the step
/// retries), and a slow one within the timeout is recorded once.
#[tokio::test]
async fn a_timed_out_model_call_records_nothing_and_a_slow_one_records_once() {
    struct Flaky(Arc<AtomicU64>, Arc<testkit::memory::ManualClock>);
    #[async_trait::async_trait]
    impl Model for Flaky {
        fn version(&self) -> VersionRef {
            VersionRef::new("flaky", "1")
        }
        async fn generate(&self, _r: &ModelRequest, ctx: &ActivityContext) -> Result<ModelAnswer, ActivityError> {
            if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
                ctx.cancellation().cancelled().await; // never answers: the step's timeout ends it
                return Err(ActivityError::transient("provider timeout"));
            }
            let due = Clock::now(&*self.1).saturating_add(DurationMs::from_millis(1_000));
            Clock::sleep_until(&*self.1, due).await; // slow, but within the timeout
            Ok(ModelAnswer { raw: r#"{"summary": "slow"}"#.into(), usage: Usage::default() })
        }
    }
    let world = World::new(18);
    let calls = Arc::new(AtomicU64::new(0));
    let m = Arc::new(Flaky(calls.clone(), world.clock.clone()));
    let def = Definition::builder("t")
        .step(
            StepDef::new("s", move |ctx: ActivityContext| {
                let m = m.clone();
                async move {
                    Ok(StepOutcome::complete(
                        ctx.model(&*m, ModelRequest::new("c", VersionRef::new("p", "1"), json!(1))).await?,
                    ))
                }
            })
            .output_schema(summary_schema("1"))
            .timeout_ms(5_000)
            .max_retry(1)
            .retry(RetryPolicy::Immediate),
        )
        .build()
        .unwrap();
    let engine = world.engine("A", vec![def]);
    engine.publisher().start_or_resume(StartRequest::new("t", "biz:t", json!({}))).await.unwrap();
    for advance in [5_000, 1_000] {
        let e = engine.clone();
        let h = tokio::spawn(async move { e.tick().await });
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        world.clock.advance(advance);
        h.await.unwrap().unwrap();
    }
    let inst = world.instances().await.unwrap().pop().unwrap();
    assert_eq!(inst.status, WorkflowStatus::Completed, "{:?}", inst.steps[0]);
    let call = inst.steps[0].record.as_ref().unwrap().model_calls().next().unwrap().clone();
    assert_eq!((call.samples.len(), calls.load(Ordering::SeqCst)), (1, 2), "the timed-out call left no sample");
}

/// K-2 with K-17.3: an answer whose record would exceed the payload limit is a typed,
/// permanent error; nothing of it is written.
#[tokio::test]
async fn a_record_over_the_limits_is_a_permanent_error_and_nothing_is_written() {
    let world = World::new(20);
    let counters = Arc::new(ModelCounters::default());
    let huge = json!({"summary": "x".repeat(kernel_core::validate::STORE_PAYLOAD_BYTES_MAX)});
    let model = Arc::new(ScriptedModel {
        script: vec![vec![Answer::Valid(huge)]],
        asks: Default::default(),
        seen: Default::default(),
        store: world.durable.clone(),
        counters,
    });
    let def = Definition::builder("big")
        .step(StepDef::new("s", move |ctx: ActivityContext| {
            let m = model.clone();
            async move {
                Ok(StepOutcome::complete(
                    ctx.model(&*m, ModelRequest::new("c", VersionRef::new("p", "1"), json!(1))).await?,
                ))
            }
        }))
        .build()
        .unwrap();
    let inst = world.run_to_rest(def, "big", "biz:big").await;
    assert_eq!(inst.status, WorkflowStatus::Failed);
    let e = inst.steps[0].error.clone().unwrap();
    assert_eq!(e.class, ErrorClass::Permanent);
    assert!(e.message.contains("exceed"), "{}", e.message);
    assert_eq!(inst.steps[0].record, None, "nothing of the oversized record was written");
}
