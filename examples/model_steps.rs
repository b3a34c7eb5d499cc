//! Model steps on the embedded default (a SQLite file, no servers): an invoice is extracted
//! by a (fake) model whose first answer breaks the versioned schema and is re-sampled, a
//! read-only vendor check is served from the result cache the second time, the posting is
//! dead-lettered and retried by an operator, and the extraction is regenerated. Every
//! model call is recorded with its step and read back, never re-sampled (K-17).
//!
//! ```bash
//! cargo run -p kernel-examples --example model_steps
//! ```

use kernel_core::activity::idempotency_key_at;
use kernel_core::model_call::{Model, ModelAnswer, ModelRequest, OutputSchema};
use kernel_core::ports::{DeadLetterAction, DeadLetterStatus};
use kernel_core::record::{RecordEntry, Usage, VersionRef};
use kernel_core::*;
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A scripted stand-in for a provider: the first extraction misses `total`, then answers.
struct FakeExtractor(AtomicU64);

#[async_trait::async_trait]
impl Model for FakeExtractor {
    fn version(&self) -> VersionRef {
        VersionRef::new("fake-extractor", "1")
    }
    async fn generate(&self, req: &ModelRequest, _ctx: &ActivityContext) -> Result<ModelAnswer, ActivityError> {
        let n = self.0.fetch_add(1, Ordering::SeqCst);
        let raw = match (req.label.as_str(), n) {
            ("extract", 0) => json!({"vendor": "acme"}).to_string(),
            ("extract", _) => json!({"vendor": "acme", "total": 120.5}).to_string(),
            _ => json!({"blocked": false}).to_string(),
        };
        Ok(ModelAnswer { raw, usage: Usage { input_tokens: 40, output_tokens: 12, cost_micros: 9 } })
    }
}

fn invoice() -> Result<Definition, Error> {
    let model = Arc::new(FakeExtractor(AtomicU64::new(0)));
    let (m1, m2) = (model.clone(), model);
    let schema = OutputSchema::new(
        VersionRef::new("invoice", "1"),
        json!({"type": "object", "required": ["vendor", "total"], "properties": {"total": {"type": "number"}}}),
    )?;
    Definition::builder("invoice")
        .step(
            StepDef::new("extract", move |ctx: ActivityContext| {
                let m = m1.clone();
                async move {
                    let req =
                        ModelRequest::new("extract", VersionRef::new("invoice-extract", "3"), ctx.input().clone());
                    Ok(StepOutcome::complete(ctx.model(&*m, req).await?))
                }
            })
            .output_schema(schema)
            .max_retry(2),
        )
        .step(
            StepDef::new("check_vendor", move |ctx: ActivityContext| {
                let m = m2.clone();
                async move {
                    let vendor = ctx.output("extract").map(|o| o["vendor"].clone()).unwrap_or_default();
                    let req =
                        ModelRequest::new("vendor", VersionRef::new("vendor-check", "1"), json!({"vendor": vendor}))
                            .cached("tools-1", "vendors-2026-12", 3_600_000);
                    Ok(StepOutcome::complete(ctx.model(&*m, req).await?))
                }
            })
            .read_only(),
        )
        .step(
            StepDef::new("post", |ctx: ActivityContext| async move {
                // The ledger refuses the first two logical attempts; the key changes per epoch.
                if ctx.epoch() < 2 {
                    return Err(ActivityError::permanent("the ledger refused the vendor"));
                }
                Ok(StepOutcome::complete(json!({"posting": ctx.idempotency_key()})))
            })
            .on_failed(OnFailed::DeadLetter),
        )
        .build()
}

async fn until<F, Fut>(what: &str, mut f: F) -> Result<WorkflowInstance, Box<dyn std::error::Error>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<WorkflowInstance>, Error>>,
{
    for _ in 0..400 {
        if let Some(i) = f().await? {
            return Ok(i);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("timed out waiting for {what}").into())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("wfk-model-steps-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let store_url = format!("sqlite:{}", dir.join("workflows.db").display());
    let deployment = compose::Deployment::connect(&store_url, "local", &Default::default()).await?;
    let engine = Engine::builder(deployment.ports().build()?).register(invoice()?).build()?;
    let store = engine.ports().store.clone();
    let running = engine.spawn();
    let engine = running.engine();
    let wf = engine
        .publisher()
        .start_or_resume(StartRequest::new("invoice", "invoice:sha256:ab12", json!({"file": "sha256:ab12"})))
        .await?
        .instance
        .workflow_id;
    let parked = |status: WorkflowStatus| {
        let (store, wf) = (store.clone(), wf.clone());
        move || {
            let (store, wf) = (store.clone(), wf.clone());
            async move { Ok(store.get(&wf).await?.filter(|i| i.status == status)) }
        }
    };
    let first = until("the dead letter", parked(WorkflowStatus::Waiting)).await?;
    println!(
        "posting dead-lettered: {} open dead letter(s)",
        engine.dead_letters(Some(DeadLetterStatus::Open), None, 10).await?.len()
    );
    // The operator regenerates the extraction (the model is asked again, in epoch 1) …
    // The workflow waits on its dead letter (no claim holds it): applied at once.
    match engine.regenerate(&wf, "extract").await? {
        kernel_core::Acted::Applied(r) => println!("regenerated {:?} (extract epoch {})", r.steps, r.epoch),
        kernel_core::Acted::Requested { request_id } => println!("regenerate requested ({request_id})"),
    }
    until("the second dead letter", || {
        let (store, wf) = (store.clone(), wf.clone());
        async move { Ok(store.get(&wf).await?.filter(|i| i.status == WorkflowStatus::Waiting && i.steps[2].epoch == 1)) }
    })
    .await?;
    // … which re-runs the posting too (epoch 1, refused again); the operator retries it,
    // and the ledger takes it in its next epoch.
    let id = idempotency_key_at(wf.as_str(), "post", 0, 1);
    engine.decide_dead_letter(&id, DeadLetterAction::Retry, "ops@example", Some("vendor unblocked")).await?;
    let done = until("completion", parked(WorkflowStatus::Completed)).await?;
    running.shutdown().await;

    let calls = |i: &WorkflowInstance, step: usize| -> Vec<String> {
        let s = &i.steps[step];
        s.history
            .iter()
            .filter_map(|h| h.record.as_ref())
            .chain(s.record.iter())
            .flat_map(|r| r.entries.iter())
            .filter_map(|e| match e {
                RecordEntry::Model(c) => Some(format!(
                    "{} samples={} invalid={} cached={}",
                    c.label,
                    c.samples.len(),
                    c.samples.iter().filter(|s| !s.errors.is_empty()).count(),
                    c.cache.is_some()
                )),
                _ => None,
            })
            .collect()
    };
    println!("extract, first run and regenerated: {:?}", calls(&done, 0));
    println!("check_vendor: {:?}", calls(&done, 1));
    println!("post: epoch {} output {}", done.steps[2].epoch, done.output["post"]);
    println!("first run's extraction, before regenerate: {}", first.output["extract"]);
    println!("the database file: {}", dir.join("workflows.db").display());
    Ok(())
}
