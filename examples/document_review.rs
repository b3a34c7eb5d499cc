//! The document-review loop of the orchestration design on the embedded default (a SQLite
//! file, no servers): the file is sent back to the applicant until the documents are
//! complete (a durable loop with a maximum, each iteration in its own epoch), a bounded
//! agent triages the complete file with recorded tool calls, and a legal review runs only
//! when the triage says the risk is high (a branch on a recorded output).
//!
//! ```bash
//! cargo run -p kernel-examples --example document_review
//! ```

use kernel_agents::AgentStepDef;
use kernel_agents::{Agent, AgentLimits, Tool, ToolCall};
use kernel_core::model_call::{Model, ModelAnswer, ModelRequest};
use kernel_core::record::{RecordEntry, Usage, VersionRef};
use kernel_core::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A scripted stand-in for the triage model: first it reads two documents at once, then it
/// checks the applicant against a registry, then it rates the risk. It decides from the
/// transcript it is shown (the recorded sub-steps), as a real model would.
struct TriageModel;

#[async_trait::async_trait]
impl Model for TriageModel {
    fn version(&self) -> VersionRef {
        VersionRef::new("fake-triage", "1")
    }
    async fn generate(&self, req: &ModelRequest, _ctx: &ActivityContext) -> Result<ModelAnswer, ActivityError> {
        let seen = req.input["transcript"].as_array().map_or(0, Vec::len);
        let raw = match seen {
            0 => json!({"tool_calls": [
                {"tool": "read_document", "args": {"n": 1}},
                {"tool": "read_document", "args": {"n": 2}}
            ]}),
            3 => {
                json!({"tool_calls": [{"tool": "check_registry", "args": {"applicant": req.input["task"]["applicant"]}}]})
            }
            _ => json!({"done": {"risk": "low", "reason": "documents consistent, applicant not listed"}}),
        };
        Ok(ModelAnswer { raw: raw.to_string(), usage: Usage { input_tokens: 120, output_tokens: 30, cost_micros: 45 } })
    }
}

/// Reads one document of the file (a stand-in for a document store).
struct ReadDocument;

#[async_trait::async_trait]
impl Tool for ReadDocument {
    fn name(&self) -> &str {
        "read_document"
    }
    async fn call(&self, call: &ToolCall, _key: &str, _ctx: &ActivityContext) -> Result<Value, ActivityError> {
        Ok(json!({"n": call.args["n"], "kind": "bank statement", "pages": 3}))
    }
}

/// Looks the applicant up in a sanctions registry (a stand-in); `key` is the sub-step's
/// idempotency key, the one to hand to a real registry's API.
struct CheckRegistry;

#[async_trait::async_trait]
impl Tool for CheckRegistry {
    fn name(&self) -> &str {
        "check_registry"
    }
    async fn call(&self, call: &ToolCall, key: &str, _ctx: &ActivityContext) -> Result<Value, ActivityError> {
        Ok(json!({"applicant": call.args["applicant"], "listed": false, "request": key}))
    }
}

fn triage() -> Result<Agent, Error> {
    Agent::builder(Arc::new(TriageModel), VersionRef::new("triage-prompt", "2"))
        .tool(ReadDocument)
        .tool(CheckRegistry)
        // Every agent declares its bounds: sub-steps, a budget, a deadline.
        .limits(AgentLimits {
            max_sub_steps: 12,
            max_tokens: Some(10_000),
            max_cost_micros: Some(5_000),
            deadline_ms: Some(DurationMs::from_secs(300)),
        })
        .task(|ctx| json!({"applicant": ctx.input()["applicant"], "documents": ctx.output("check")}))
        .build()
}

/// The applicant's document portal (a stand-in): asked under a new idempotency key — a new
/// iteration of the loop — the applicant hands in one more document; asked again under the
/// same key (a re-run of the same iteration after a crash), nothing new arrives.
#[derive(Default)]
struct Portal {
    asked: Mutex<BTreeSet<String>>,
}

impl Portal {
    fn documents(&self, key: &str) -> u64 {
        let mut asked = self.asked.lock().expect("portal lock");
        asked.insert(key.to_string());
        asked.len() as u64
    }
}

const NEEDED: u64 = 3;

fn review(portal: Arc<Portal>) -> Result<Definition, Error> {
    Definition::builder("document_review")
        .step(StepDef::new("collect", move |ctx: ActivityContext| {
            let portal = portal.clone();
            async move {
                let documents = portal.documents(&ctx.idempotency_key());
                Ok(StepOutcome::complete(json!({ "documents": documents })))
            }
        }))
        .step(
            StepDef::new("check", |ctx: ActivityContext| async move {
                let documents = ctx.output("collect").and_then(|o| o["documents"].as_u64()).unwrap_or(0);
                Ok(StepOutcome::complete(json!({ "complete": documents >= NEEDED, "documents": documents })))
            })
            // Sent back while incomplete, read from the recorded output; at most 5 times,
            // then an operator decides (a dead letter).
            .loop_to("collect", |out| out["complete"] != json!(true))
            .max_iterations(5)
            .on_failed(OnFailed::DeadLetter),
        )
        // A bounded agent: each proposal and each tool call is a recorded sub-step.
        .step(StepDef::agent("triage", triage()?))
        .step(
            StepDef::new("legal_review", |_ctx: ActivityContext| async move {
                Ok(StepOutcome::complete(json!({ "reviewed": true })))
            })
            .when(["triage"], |o| o.output("triage").is_some_and(|t| t["risk"] == "high")),
        )
        .step(StepDef::new("approve", |ctx: ActivityContext| async move {
            Ok(StepOutcome::complete(json!({ "approved": true, "by": ctx.idempotency_key() })))
        }))
        .build()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("wfk-document-review-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let store_url = format!("sqlite:{}", dir.join("workflows.db").display());
    let deployment = compose::Deployment::connect(&store_url, "local", &Default::default()).await?;
    let portal = Arc::new(Portal::default());
    let engine = Engine::builder(deployment.ports().build()?).register(review(portal.clone())?).build()?;
    let store = engine.ports().store.clone();
    let running = engine.spawn();
    let wf = running
        .engine()
        .publisher()
        .start_or_resume(StartRequest::new("document_review", "application:42", json!({"applicant": "a-42"})))
        .await?
        .instance
        .workflow_id;
    let mut done = None;
    for _ in 0..400 {
        if let Some(i) = store.get(&wf).await?.filter(|i| i.status.is_terminal()) {
            done = Some(i);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.shutdown().await;
    let done = done.ok_or("timed out waiting for the review")?;
    // Every figure below is read from the stored instance, not from the engine.
    let step = |name: &str| done.steps.iter().find(|s| s.name == name).ok_or("missing step");
    let (collect, check, triage, legal) = (step("collect")?, step("check")?, step("triage")?, step("legal_review")?);
    let documents: Vec<Value> = collect
        .history
        .iter()
        .filter_map(|h| h.output.as_ref().map(|o| o["documents"].clone()))
        .chain(done.output.get("collect").map(|o| o["documents"].clone()))
        .collect();
    println!("documents seen per iteration: {documents:?}");
    let (mut proposals, mut tool_calls) = (0, 0);
    for e in triage.record.iter().flat_map(|r| r.entries.iter()) {
        match e {
            RecordEntry::Model(c) if c.label.starts_with("agent.p") => proposals += 1,
            RecordEntry::Value(v) if v.label.starts_with("agent.t") => tool_calls += 1,
            _ => {}
        }
    }
    println!("triage: {} (recorded: {proposals} proposals, {tool_calls} tool calls)", done.output["triage"]);
    println!(
        "document-review: status={} iterations={} collect_epoch={} agent_sub_steps={} legal_review={} approved={}",
        done.status.as_str(),
        check.iterations,
        collect.epoch,
        proposals + tool_calls,
        if legal.not_taken() { "not_taken" } else { legal.status.as_str() },
        done.output.contains_key("approve")
    );
    println!("the database file: {}", dir.join("workflows.db").display());
    Ok(())
}
