//! Model steps (K-17.3, K-17.4, K-17.4a): recorded calls are never re-sampled, invalid
//! answers are re-sampled within a bound, a recorded output of an older schema version is
//! migrated or parks the step, and recorded values steer control.
//!
//! The oracle is the scripted model itself: on every call it reads the store and counts a
//! *replay re-sample* when the sample it is asked for is already recorded there.

use kernel_core::model_call::{Model, ModelAnswer, ModelRequest, OutputSchema};
use kernel_core::ports::*;
use kernel_core::record::{RecordEntry, Usage, VersionRef};
use kernel_core::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use testkit::harness::{sweep, BoxFuture, Scenario, ScenarioRun, ScenarioVerdict, SweepSample, World};

/// What the scripted model answers for the n-th sample of a call.
#[derive(Clone, Debug)]
enum Answer {
    Valid(Value),
    InvalidJson,
    SchemaViolating(Value),
    RateLimited,
}

/// Counters of the scripted model: calls it served, and calls for a sample the store had
/// already recorded (re-samples of a recorded call).
#[derive(Default, Debug)]
struct ModelCounters {
    calls: AtomicU64,
    replay_resamples: AtomicU64,
}

/// A scripted fake model: no network. `script[i]` lists the answers to successive asks
/// for sample `i` of a call (the last one repeats), so a rate limit is answered once and
/// the retry gets the next answer.
struct ScriptedModel {
    script: Vec<Vec<Answer>>,
    asks: Mutex<BTreeMap<(String, usize), usize>>,
    seen: Mutex<BTreeMap<(String, u32, u32, String), usize>>,
    store: Arc<DynStore>,
    counters: Arc<ModelCounters>,
}

#[async_trait::async_trait]
impl Model for ScriptedModel {
    fn version(&self) -> VersionRef {
        VersionRef::new("scripted", "1")
    }
    async fn generate(&self, req: &ModelRequest, ctx: &ActivityContext) -> Result<ModelAnswer, ActivityError> {
        self.counters.calls.fetch_add(1, Ordering::SeqCst);
        let sample: usize =
            req.sample_key.rsplit('|').next().and_then(|s| s.parse().ok()).expect("sample key ends with the index");
        // The oracle: is this sample already recorded in the store?
        if let Ok(Some(inst)) = self.store.get(&WorkflowId::from(ctx.workflow_id())).await {
            let step = &inst.steps[ctx.step_index()];
            let recorded = step
                .record_of(inst.retry_count)
                .into_iter()
                .flat_map(|r| r.model_calls())
                .filter(|c| c.label == req.label)
                .map(|c| c.samples.len())
                .max()
                .unwrap_or(0);
            // The most samples the store was ever seen holding for this call: a sample once
            // recorded stays recorded, so asking for one below it is a re-sample.
            let mut seen = self.seen.lock().unwrap();
            let hw = seen
                .entry((ctx.workflow_id().to_string(), inst.retry_count, step.epoch, req.label.clone()))
                .or_default();
            *hw = (*hw).max(recorded);
            if sample < *hw {
                self.counters.replay_resamples.fetch_add(1, Ordering::SeqCst);
            }
        }
        let usage = Usage { input_tokens: 10, output_tokens: 5, cost_micros: 7 };
        let ask = {
            let mut asks = self.asks.lock().unwrap();
            let n = asks.entry((ctx.workflow_id().to_string(), sample)).or_default();
            *n += 1;
            *n - 1
        };
        let answers = self.script.get(sample).cloned().unwrap_or_default();
        match answers.get(ask).or(answers.last()).cloned().unwrap_or(Answer::InvalidJson) {
            Answer::Valid(v) | Answer::SchemaViolating(v) => Ok(ModelAnswer { raw: v.to_string(), usage }),
            Answer::InvalidJson => Ok(ModelAnswer { raw: "{not json".into(), usage }),
            Answer::RateLimited => Err(ActivityError::transient("rate limited")),
        }
    }
}

fn summary_schema(version: &str) -> OutputSchema {
    OutputSchema::new(
        VersionRef::new("summary", version),
        json!({"type": "object", "required": ["summary"], "properties": {"summary": {"type": "string"}}}),
    )
    .unwrap()
}

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

fn definition(model: Arc<ScriptedModel>, published: Arc<Mutex<BTreeMap<String, u64>>>) -> Definition {
    let compose = move |ctx: ActivityContext| {
        let model = model.clone();
        async move {
            let now = ctx.record("now", || async { Ok(json!(ctx.now().as_millis())) }).await?;
            let req = ModelRequest::new("compose", VersionRef::new("summary-prompt", "1"), json!({"at": now}));
            let out = ctx.model(&*model, req).await?;
            Ok(StepOutcome::complete(out))
        }
    };
    let publish = move |ctx: ActivityContext| {
        let published = published.clone();
        async move {
            *published.lock().unwrap().entry(ctx.idempotency_key()).or_default() += 1;
            Ok(StepOutcome::complete(json!("published")))
        }
    };
    Definition::builder("model-story")
        .step(StepDef::new("fetch", |_| async { Ok(StepOutcome::complete(json!({"words": 3}))) }))
        .step(
            StepDef::new("compose", compose)
                .output_schema(summary_schema("1"))
                .max_retry(3)
                .retry(RetryPolicy::Immediate),
        )
        .step(StepDef::new("publish", publish))
        .build()
        .unwrap()
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
    let engine = world.engine("A", vec![def]);
    engine.publisher().start_or_resume(StartRequest::new("budget", "biz:b", json!({}))).await.unwrap();
    world.drive(&engine).await.unwrap();
    let inst = world.instances().await.unwrap().pop().unwrap();
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
    let engine = world.engine("A", vec![def]);
    engine.publisher().start_or_resume(StartRequest::new("vals", "biz:v", json!({}))).await.unwrap();
    world.drive(&engine).await.unwrap();
    let inst = world.instances().await.unwrap().pop().unwrap();
    assert_eq!(inst.status, WorkflowStatus::Completed);
    assert_eq!((draws.load(Ordering::SeqCst), inst.output["route"].clone()), (1, json!(4)), "drawn once, read back");
    let rec = inst.steps[0].record.as_ref().unwrap();
    assert!(matches!(&rec.entries[..], [RecordEntry::Value(v)] if v.label == "dice"), "{rec:?}");
}
