//! Model steps (K-17.3, K-17.4, K-17.4a): recorded calls are never re-sampled, invalid
//! answers are re-sampled within a bound, a recorded output of an older schema version is
//! migrated or parks the step, and recorded values steer control.
//!
//! The oracle is the scripted model itself: on every call it reads the store and counts a
//! *replay re-sample* when the sample it is asked for is already recorded there.

mod dead_letters;
mod recorded_calls;
mod regenerate;
mod report;

use kernel_core::model_call::{Model, ModelAnswer, ModelRequest, OutputSchema};
use kernel_core::ports::*;
use kernel_core::record::{Usage, VersionRef};
use kernel_core::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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

fn ran(runs: &Arc<Mutex<Vec<(String, String)>>>, step: &str) -> Vec<String> {
    runs.lock().unwrap().iter().filter(|(s, _)| s == step).map(|(_, k)| k.clone()).collect()
}
