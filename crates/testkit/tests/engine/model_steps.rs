//! Model steps (K-17.3, K-17.4, K-17.4a): recorded calls are never re-sampled, invalid
//! answers are re-sampled within a bound, a recorded output of an older schema version is
//! migrated or parks the step, and recorded values steer control.
//!
//! The oracle is the scripted model itself: on every call it reads the store and counts a
//! *replay re-sample* when the sample it is asked for is already recorded there.

use kernel_core::activity::idempotency_key_at;
use kernel_core::definition::QueryAnswer;
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

/// Start one workflow of `def` on a fresh engine and drive it until nothing is left to do;
/// the stored instance afterwards.
async fn run_to_rest(world: &World, def: Definition, workflow_type: &str, biz_key: &str) -> WorkflowInstance {
    let engine = world.engine("A", vec![def]);
    engine.publisher().start_or_resume(StartRequest::new(workflow_type, biz_key, json!({}))).await.unwrap();
    world.drive(&engine).await.unwrap();
    world.instances().await.unwrap().pop().unwrap()
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
    let inst = run_to_rest(&world, def, "budget", "biz:b").await;
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
    let inst = run_to_rest(&world, def, "vals", "biz:v").await;
    assert_eq!(inst.status, WorkflowStatus::Completed);
    assert_eq!((draws.load(Ordering::SeqCst), inst.output["route"].clone()), (1, json!(4)), "drawn once, read back");
    let rec = inst.steps[0].record.as_ref().unwrap();
    assert!(matches!(&rec.entries[..], [RecordEntry::Value(v)] if v.label == "dice"), "{rec:?}");
}

// --- the invoice story: re-sampling, a cached lookup, an unknown outcome, dead letters,
// an operator retry and a regenerate, with a crash at every boundary ---------------------

/// Totals over every run of the story, each from an independent oracle: the scripted
/// models' own counters, the query hook's, the dead-letter store and the stored instances.
#[derive(Default, Debug)]
struct StoryCounts {
    recorded_calls: AtomicU64,
    schema_resamples: AtomicU64,
    dead_lettered: AtomicU64,
    operator_retries: AtomicU64,
    cache_hits: AtomicU64,
    regenerated: AtomicU64,
    unknown_outcome_queries: AtomicU64,
}

struct InvoiceStory {
    model: Arc<ModelCounters>,
    counts: Arc<StoryCounts>,
}

struct InvoiceRun {
    extract: Arc<ScriptedModel>,
    vendors: Arc<ScriptedModel>,
    /// Posting requests the ledger received, by idempotency key (it takes each key once).
    ledger: Arc<Mutex<BTreeMap<String, u64>>>,
    /// Attempts of `post` per epoch, as the ledger saw them.
    post_attempts: Arc<Mutex<BTreeMap<u32, u64>>>,
    queries: Arc<AtomicU64>,
    dead_letters: testkit::memory::MemoryDeadLetters,
    counts: Arc<StoryCounts>,
}

fn invoice_schema() -> OutputSchema {
    OutputSchema::new(
        VersionRef::new("invoice", "1"),
        json!({"type": "object", "required": ["vendor", "total"], "properties": {"vendor": {"type": "string"}, "total": {"type": "number"}}}),
    )
    .unwrap()
}

impl Scenario for InvoiceStory {
    fn name(&self) -> String {
        "invoice-story".into()
    }
    fn instantiate(&self, world: &World) -> Box<dyn ScenarioRun> {
        let model = |script| {
            Arc::new(ScriptedModel {
                script,
                asks: Default::default(),
                seen: Default::default(),
                store: world.durable.clone(),
                counters: self.model.clone(),
            })
        };
        Box::new(InvoiceRun {
            extract: model(vec![
                vec![Answer::SchemaViolating(json!({"vendor": "acme"}))],
                vec![Answer::Valid(json!({"vendor": "acme", "total": 120.5}))],
            ]),
            vendors: model(vec![vec![Answer::Valid(json!({"blocked": false}))]]),
            ledger: Default::default(),
            post_attempts: Default::default(),
            queries: Default::default(),
            dead_letters: world.dead_letters.clone(),
            counts: self.counts.clone(),
        })
    }
}

impl InvoiceRun {
    fn definition(&self) -> Definition {
        let extract = self.extract.clone();
        let vendors = self.vendors.clone();
        let (ledger, attempts) = (self.ledger.clone(), self.post_attempts.clone());
        let (ledger_q, queries) = (self.ledger.clone(), self.queries.clone());
        Definition::builder("invoice")
            .step(
                StepDef::new("extract", move |ctx: ActivityContext| {
                    let m = extract.clone();
                    async move {
                        let req = ModelRequest::new(
                            "extract",
                            VersionRef::new("invoice-extract", "3"),
                            json!({"file": "sha256:ab12"}),
                        );
                        Ok(StepOutcome::complete(ctx.model(&*m, req).await?))
                    }
                })
                .output_schema(invoice_schema())
                .max_retry(2)
                .retry(RetryPolicy::Immediate),
            )
            .step(
                StepDef::new("lookup", move |ctx: ActivityContext| {
                    let m = vendors.clone();
                    async move {
                        let vendor = ctx.output("extract").and_then(|o| o.get("vendor")).cloned().unwrap_or_default();
                        let req = ModelRequest::new(
                            "vendor",
                            VersionRef::new("vendor-check", "1"),
                            json!({"vendor": vendor}),
                        )
                        .cached("tools-1", "vendors-2026-11", DurationMs::from_secs(3_600));
                        Ok(StepOutcome::complete(ctx.model(&*m, req).await?))
                    }
                })
                .read_only(),
            )
            .step(
                StepDef::new("post", move |ctx: ActivityContext| {
                    let (ledger, attempts) = (ledger.clone(), attempts.clone());
                    async move {
                        let n = {
                            let mut a = attempts.lock().unwrap();
                            let n = a.entry(ctx.epoch()).or_default();
                            *n += 1;
                            *n
                        };
                        match (ctx.epoch(), n) {
                            // The request went out and the reply was lost.
                            (0, 1) => Err(ActivityError::unknown_outcome("posting timed out")),
                            (0, _) | (1, _) => Err(ActivityError::permanent("the ledger refused the vendor")),
                            _ => {
                                *ledger.lock().unwrap().entry(ctx.idempotency_key()).or_default() += 1;
                                Ok(StepOutcome::complete(json!({"posting": ctx.idempotency_key()})))
                            }
                        }
                    }
                })
                .max_retry(3)
                .retry(RetryPolicy::Immediate)
                .on_unknown_outcome(move |ctx: ActivityContext| {
                    let (ledger, queries) = (ledger_q.clone(), queries.clone());
                    async move {
                        queries.fetch_add(1, Ordering::SeqCst);
                        Ok(match ledger.lock().unwrap().get(&ctx.idempotency_key()) {
                            Some(_) => QueryAnswer::Done(json!({"posting": ctx.idempotency_key()})),
                            None => QueryAnswer::NotDone,
                        })
                    }
                })
                .on_failed(OnFailed::DeadLetter),
            )
            .step(StepDef::new("notify", |_| async { Ok(StepOutcome::complete(json!("sent"))) }))
            .build()
            .unwrap()
    }
}

impl ScenarioRun for InvoiceRun {
    fn definitions(&self) -> Vec<Definition> {
        vec![self.definition()]
    }
    fn start<'a>(&'a self, engine: &'a Engine) -> BoxFuture<'a, kernel_core::Result<()>> {
        Box::pin(async move {
            engine.publisher().start_or_resume(StartRequest::new("invoice", "invoice:sha256:ab12", json!({}))).await?;
            Ok(())
        })
    }
    /// The operator: the first dead letter (epoch 0) is retried; when the retry is
    /// dead-lettered too (epoch 1), the extraction is regenerated, which re-runs every step
    /// after it (the post in epoch 2, which the ledger takes).
    fn operate<'a>(&'a self, engine: &'a Engine, world: &'a World) -> BoxFuture<'a, kernel_core::Result<bool>> {
        Box::pin(async move {
            let Some(inst) = world.durable.get_by_biz_key("invoice:sha256:ab12").await? else { return Ok(false) };
            let waiting_on_post = inst.status == WorkflowStatus::Waiting
                && inst
                    .wait
                    .as_ref()
                    .and_then(|w| w.signal_identity())
                    .is_some_and(|w| w.signal_type == kernel_core::engine::DEAD_LETTER_SIGNAL);
            if !waiting_on_post {
                return Ok(false);
            }
            let post = &inst.steps[2];
            let id = idempotency_key_at(inst.workflow_id.as_str(), "post", inst.retry_count, post.epoch);
            if self.dead_letters.get(&id).await?.is_none() {
                return Ok(false);
            }
            match post.epoch {
                0 => {
                    engine
                        .decide_dead_letter(&id, DeadLetterAction::Retry, "ops@example", Some("vendor unblocked"))
                        .await?;
                }
                _ => {
                    engine.regenerate(&inst.workflow_id, "extract").await?;
                }
            }
            Ok(true)
        })
    }
    fn verdict(&self, instances: &[WorkflowInstance]) -> ScenarioVerdict {
        let mut unfinished = vec![];
        for i in instances {
            let ok = i.status == WorkflowStatus::Completed && i.output.contains_key("notify") && i.steps[2].epoch == 2;
            if !ok {
                unfinished.push(i.biz_key.clone());
            }
            for s in &i.steps {
                let records = s.record.iter().chain(s.history.iter().filter_map(|h| h.record.as_ref()));
                for c in records.flat_map(|r| r.model_calls()) {
                    self.counts.recorded_calls.fetch_add(1, Ordering::SeqCst);
                    let invalid = c.samples.iter().filter(|s| !s.errors.is_empty()).count() as u64;
                    self.counts.schema_resamples.fetch_add(invalid, Ordering::SeqCst);
                    if c.cache.is_some() {
                        self.counts.cache_hits.fetch_add(1, Ordering::SeqCst);
                    }
                }
                let regenerated =
                    s.history.iter().filter(|h| h.reason == kernel_core::record::HistoryReason::Regenerate).count();
                self.counts.regenerated.fetch_add(regenerated as u64, Ordering::SeqCst);
            }
        }
        let dls = futures::executor::block_on(self.dead_letters.list(None, None, 1_000)).unwrap_or_default();
        self.counts.dead_lettered.fetch_add(dls.len() as u64, Ordering::SeqCst);
        let retries = dls
            .iter()
            .filter(|d| matches!(d.decision.as_ref().map(|x| &x.action), Some(DeadLetterAction::Retry)))
            .count();
        self.counts.operator_retries.fetch_add(retries as u64, Ordering::SeqCst);
        self.counts.unknown_outcome_queries.fetch_add(self.queries.load(Ordering::SeqCst), Ordering::SeqCst);
        // The ledger dedupes by idempotency key, as a finance API does; what must hold is
        // that every posting came under one key — the post's last logical attempt.
        let ledger = self.ledger.lock().unwrap();
        ScenarioVerdict {
            expected: vec!["invoice:sha256:ab12".into()],
            unfinished,
            effective_jobs_max: ledger.len() as u64,
            late_submissions: 0,
        }
    }
}

/// The model-steps report (K-17.2, K-17.3, K-17.4, K-17.7): the invoice story under a crash
/// at every persistence boundary, the counts from the scripted models, the query hook, the
/// dead-letter store and the stored instances — never from the engine's claims.
#[tokio::test]
async fn model_steps_report() {
    let model = Arc::new(ModelCounters::default());
    let counts = Arc::new(StoryCounts::default());
    let sc = InvoiceStory { model: model.clone(), counts: counts.clone() };
    let report = sweep(&[&sc], 23, SweepSample::All).await;
    report.assert_clean();
    let get = |a: &AtomicU64| a.load(Ordering::SeqCst);
    let line = format!(
        "model-steps: recorded_calls={} replay_resamples={} schema_resamples={} dead_lettered={} operator_retries={} cache_hits={} regenerated={} unknown_outcome_queries={}",
        get(&counts.recorded_calls),
        get(&model.replay_resamples),
        get(&counts.schema_resamples),
        get(&counts.dead_lettered),
        get(&counts.operator_retries),
        get(&counts.cache_hits),
        get(&counts.regenerated),
        get(&counts.unknown_outcome_queries),
    );
    println!("{line} (runs={}, boundaries={})", report.runs, report.boundaries);
    assert_eq!(get(&model.replay_resamples), 0, "{line}");
    for (name, n) in [
        ("recorded_calls", &counts.recorded_calls),
        ("schema_resamples", &counts.schema_resamples),
        ("dead_lettered", &counts.dead_lettered),
        ("operator_retries", &counts.operator_retries),
        ("cache_hits", &counts.cache_hits),
        ("regenerated", &counts.regenerated),
        ("unknown_outcome_queries", &counts.unknown_outcome_queries),
    ] {
        assert!(get(n) > 0, "{name} is 0: {line}");
    }
}

// --- operator actions and bounds ----------------------------------------------------------

fn counting(name: &'static str, runs: Arc<Mutex<Vec<(String, String)>>>) -> StepDef {
    StepDef::new(name, move |ctx: ActivityContext| {
        let runs = runs.clone();
        async move {
            runs.lock().unwrap().push((ctx.step_name().to_string(), ctx.idempotency_key()));
            Ok(StepOutcome::complete(json!({ "by": ctx.idempotency_key() })))
        }
    })
}

/// A workflow a → b, c (independent), then `gate` (after b and c) waiting for a signal.
fn gated(runs: Arc<Mutex<Vec<(String, String)>>>) -> Definition {
    let r = runs.clone();
    Definition::builder("gated")
        .step(counting("a", runs.clone()))
        .step(counting("b", runs.clone()).depends_on(["a"]))
        .step(counting("c", runs.clone()).depends_on(Vec::<String>::new()))
        .step(
            StepDef::new("gate", move |ctx: ActivityContext| {
                let r = r.clone();
                async move {
                    r.lock().unwrap().push(("gate".into(), ctx.idempotency_key()));
                    Ok(match ctx.resume() {
                        Some(Resume { kind: ResumeKind::Signal, .. }) => StepOutcome::complete(json!("open")),
                        _ => StepOutcome::wait_for_signal("go", "g-1").generation(u64::from(ctx.epoch())).into(),
                    })
                }
            })
            .depends_on(["b", "c"]),
        )
        .build()
        .unwrap()
}

fn ran(runs: &Arc<Mutex<Vec<(String, String)>>>, step: &str) -> Vec<String> {
    runs.lock().unwrap().iter().filter(|(s, _)| s == step).map(|(_, k)| k.clone()).collect()
}

/// K-17.3 regenerate: the step and its dependents that ran get a new epoch (a new K-17.1
/// key) and run again, their previous results in their history; an independent step does
/// not run again; a terminal instance is refused.
#[tokio::test]
async fn regenerate_reruns_the_step_and_its_dependents_only() {
    let world = World::new(5);
    let runs = Arc::new(Mutex::new(Vec::new()));
    let engine = world.engine("A", vec![gated(runs.clone())]);
    let wf = engine
        .publisher()
        .start_or_resume(StartRequest::new("gated", "biz:g", json!({})))
        .await
        .unwrap()
        .instance
        .workflow_id;
    world.drive(&engine).await.unwrap();
    let before = world.instance(wf.as_str()).await.unwrap();
    assert_eq!(before.status, WorkflowStatus::Waiting);
    let r = engine.regenerate(&wf, "a").await.unwrap().applied().expect("no claim holds it");
    assert_eq!((r.epoch, r.steps.clone(), r.woken), (1, vec!["a".to_string(), "b".into(), "gate".into()], true));
    let after = world.instance(wf.as_str()).await.unwrap();
    assert!(!after.output.contains_key("a") && !after.output.contains_key("b") && after.output.contains_key("c"));
    assert_eq!(
        after.steps[0].history[0].output,
        before.output.get("a").cloned(),
        "the previous result is kept for audit"
    );
    assert_eq!(after.steps[0].history[0].reason, kernel_core::record::HistoryReason::Regenerate);
    assert_eq!(after.steps[1].history[0].reason, kernel_core::record::HistoryReason::Upstream);
    world.drive(&engine).await.unwrap();
    let a = ran(&runs, "a");
    assert_eq!(a.len(), 2);
    assert_eq!(a[1], idempotency_key_at(wf.as_str(), "a", 0, 1), "a new logical attempt has a new key");
    assert_ne!(a[0], a[1]);
    assert_eq!(ran(&runs, "b").len(), 2);
    assert_eq!(ran(&runs, "c").len(), 1, "an independent step never runs again");
    let signal = Signal::builder(wf.clone(), "go").wait_key("g-1").generation(1).signal_id("go-1").build().unwrap();
    engine.deliver_signal(signal).await.unwrap();
    world.drive(&engine).await.unwrap();
    assert_eq!(world.instance(wf.as_str()).await.unwrap().status, WorkflowStatus::Completed);
    assert!(matches!(engine.regenerate(&wf, "a").await, Err(Error::Conflict(_))), "terminal");
}

/// Regenerate refuses with a typed error and writes nothing: an unknown workflow or step,
/// a step that never ran.
#[tokio::test]
async fn regenerate_refuses_bad_requests_and_writes_nothing() {
    let world = World::new(6);
    let runs = Arc::new(Mutex::new(Vec::new()));
    let engine = world.engine("A", vec![gated(runs)]);
    let wf = engine
        .publisher()
        .start_or_resume(StartRequest::new("gated", "biz:g", json!({})))
        .await
        .unwrap()
        .instance
        .workflow_id;
    let before = world.instance(wf.as_str()).await.unwrap();
    assert!(matches!(engine.regenerate(&"wf-nope".into(), "a").await, Err(Error::NotFound(_))));
    assert!(matches!(engine.regenerate(&wf, "zz").await, Err(Error::InvalidInput { .. })));
    assert!(matches!(engine.regenerate(&wf, "a").await, Err(Error::Conflict(_))), "never ran");
    assert!(matches!(engine.regenerate(&wf, "bad\0name").await, Err(Error::InvalidInput { .. })));
    assert_eq!(world.instance(wf.as_str()).await.unwrap(), before, "nothing written");
}

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

/// K-17.2 query before retry: after an unknown outcome the hook is asked first; "done"
/// completes the step with its output and the activity never runs again.
#[tokio::test]
async fn a_done_query_completes_the_step_without_running_it_again() {
    let world = World::new(11);
    let (runs, queries) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let def = lost_reply("q", &runs, &queries, 3, || QueryAnswer::Done(json!({"charged": true})));
    let inst = run_to_rest(&world, def, "q", "biz:q").await;
    assert_eq!(inst.status, WorkflowStatus::Completed);
    assert_eq!((runs.load(Ordering::SeqCst), queries.load(Ordering::SeqCst)), (1, 1));
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

// --- regressions found in review ----------------------------------------------------------

/// Regenerate reaches a dependent declared before the step it depends on (plan order is
/// not dependency order).
#[tokio::test]
async fn regenerate_reaches_a_dependent_declared_before_its_dependency() {
    let world = World::new(13);
    let runs = Arc::new(Mutex::new(Vec::new()));
    let r = runs.clone();
    let def = Definition::builder("back")
        .step(counting("c", runs.clone()).depends_on(["b"]))
        .step(counting("b", runs.clone()).depends_on(["a"]))
        .step(counting("a", runs.clone()).depends_on(Vec::<String>::new()))
        .step(
            StepDef::new("hold", move |ctx: ActivityContext| {
                let r = r.clone();
                async move {
                    r.lock().unwrap().push(("hold".into(), ctx.idempotency_key()));
                    Ok(StepOutcome::wait_for_signal("go", "h").generation(99).into())
                }
            })
            .depends_on(["c"]),
        )
        .build()
        .unwrap();
    let engine = world.engine("A", vec![def]);
    let wf = engine
        .publisher()
        .start_or_resume(StartRequest::new("back", "biz:back", json!({})))
        .await
        .unwrap()
        .instance
        .workflow_id;
    world.drive(&engine).await.unwrap();
    let r = engine.regenerate(&wf, "a").await.unwrap().applied().expect("no claim holds it");
    assert_eq!(
        r.steps,
        vec!["c".to_string(), "b".into(), "a".into(), "hold".into()],
        "c depends on b, which depends on a"
    );
    assert!(r.woken, "the wait was in `hold`, which was reset");
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
    let inst = run_to_rest(&world, def, "big", "biz:big").await;
    assert_eq!(inst.status, WorkflowStatus::Failed);
    let e = inst.steps[0].error.clone().unwrap();
    assert_eq!(e.class, ErrorClass::Permanent);
    assert!(e.message.contains("exceed"), "{}", e.message);
    assert_eq!(inst.steps[0].record, None, "nothing of the oversized record was written");
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
