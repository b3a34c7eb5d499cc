//! The invoice story under a crash at every boundary, with its figure line (`model-steps:`).

use super::*;
use kernel_core::activity::idempotency_key_at;
use kernel_core::definition::QueryAnswer;
use kernel_core::model_call::{ModelRequest, OutputSchema};
use kernel_core::ports::*;
use kernel_core::record::VersionRef;
use kernel_core::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use testkit::harness::{sweep, BoxFuture, Scenario, ScenarioRun, ScenarioVerdict, SweepSample, World};

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
