//! Tool calls and the record of an agent: tool errors are recorded and fed back, the answer is
//! held to the step's schema, the record is bounded by bytes, a sub-step costs one write.

use super::*;
use kernel_agents::*;
use kernel_core::record::{RecordEntry, VersionRef};
use kernel_core::*;
use serde_json::{json, Value};
use std::sync::Arc;
use testkit::harness::World;

/// The pay agent: it proposes a payment and a refund together (the agent has no `refund`
/// tool, and `pay` is declined), then finishes with the errors it saw.
fn pay_agent(world: &World, oracle: &Arc<Oracle>, limits: AgentLimits) -> Agent {
    let script: Script = Arc::new(|req, _| {
        let transcript = req.input["transcript"].as_array().cloned().unwrap_or_default();
        if transcript.is_empty() {
            json!({"tool_calls": [{"tool": "pay", "args": {"amount": 5}}, {"tool": "refund", "args": {}}]})
        } else {
            let errors: Vec<Value> = transcript.iter().filter_map(|t| t["tool_result"].get("error").cloned()).collect();
            json!({ "done": { "errors": errors } })
        }
    });
    let model = ScriptedModel { script, usage: usage(), store: world.durable.clone(), oracle: oracle.clone() };
    let refuse: Behaviour = Arc::new(|_, _| Err(ActivityError::permanent("card declined")));
    Agent::builder(Arc::new(model), VersionRef::new("pay-prompt", "1"))
        .tool(FakeTool::new("pay", world, oracle, refuse))
        .limits(limits)
        .task(|_| json!({"order": 7}))
        .build()
        .unwrap()
}

async fn run_pay(world: &World, agent: Agent) -> WorkflowInstance {
    let def = Definition::builder("pay").step(StepDef::agent("pay", agent)).build().unwrap();
    world.run_to_rest(def, "pay", "pay:1").await
}

fn one_agent_step(
    world: &World,
    oracle: &Arc<Oracle>,
    script: Script,
    tool: Behaviour,
    schema: Option<kernel_core::model_call::OutputSchema>,
) -> Definition {
    let model = ScriptedModel { script, usage: usage(), store: world.durable.clone(), oracle: oracle.clone() };
    let mut limits = limits_for(AgentLimit::SubSteps);
    limits.max_sub_steps = 40;
    let agent = Agent::builder(Arc::new(model), VersionRef::new("p", "1"))
        .tool(FakeTool::new("fetch", world, oracle, tool))
        .limits(limits)
        .build()
        .unwrap();
    let mut step = StepDef::agent("work", agent);
    if let Some(s) = schema {
        step = step.output_schema(s);
    }
    Definition::builder("one").step(step).build().unwrap()
}

async fn run_one(world: &World, def: Definition) -> WorkflowInstance {
    world.run_to_rest(def, "one", "one:1").await
}

/// A tool's permanent error and a call to a tool the agent does not have are recorded as
/// error results and shown to the model, which goes on; nothing crashes.
#[tokio::test]
async fn tool_errors_are_recorded_and_fed_back() {
    let world = World::new(60);
    let oracle = Arc::new(Oracle::default());
    let agent = pay_agent(&world, &oracle, limits_for(AgentLimit::SubSteps));
    assert_eq!(agent.limits().max_sub_steps, 3);
    let inst = run_pay(&world, agent).await;
    // Three sub-steps were allowed: the proposal and both calls; the next proposal is refused.
    assert_eq!(inst.status, WorkflowStatus::Failed);
    assert_eq!(
        labels(inst.steps[0].record.as_ref().unwrap()),
        ["agent.start", "agent.p0", "agent.t1", "agent.t2", "agent.stop"]
    );
    let values: Vec<Value> = inst.steps[0]
        .record
        .as_ref()
        .unwrap()
        .entries
        .iter()
        .filter_map(|e| match e {
            RecordEntry::Value(v) => Some(v.value.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(values[0]["task"], json!({"order": 7}), "the task is recorded with the start");
    assert_eq!(values[1], json!({"tool": "pay", "error": "card declined"}));
    assert_eq!(values[2], json!({"tool": "refund", "error": "unknown tool `refund`"}));
    assert_eq!(get(&oracle.tool_runs), 1, "the unknown tool ran nothing");

    // With one more sub-step the model sees both errors and finishes.
    let world = World::new(61);
    let oracle = Arc::new(Oracle::default());
    let mut limits = limits_for(AgentLimit::SubSteps);
    limits.max_sub_steps = 4;
    let inst = run_pay(&world, pay_agent(&world, &oracle, limits)).await;
    assert_eq!(inst.status, WorkflowStatus::Completed);
    assert_eq!(inst.output["pay"], json!({"errors": ["card declined", "unknown tool `refund`"]}));
}

/// The step's own output schema holds the agent's answer (K-17.4), as it holds an
/// operator's: an answer that fails it is a permanent error of the step — before, any
/// `done` value completed the step.
#[tokio::test]
async fn the_agents_answer_is_held_to_the_steps_schema() {
    let world = World::new(80);
    let oracle = Arc::new(Oracle::default());
    let script: Script = Arc::new(|_, _| json!({"done": {"total": "not a number"}}));
    let schema = kernel_core::model_call::OutputSchema::new(
        VersionRef::new("answer", "1"),
        json!({"type": "object", "required": ["total"], "properties": {"total": {"type": "number"}}}),
    )
    .unwrap();
    let inst =
        run_one(&world, one_agent_step(&world, &oracle, script, Arc::new(|_, _| Ok(json!(1))), Some(schema))).await;
    assert_eq!(inst.status, WorkflowStatus::Failed);
    let error = inst.steps[0].error.as_ref().unwrap();
    assert_eq!(error.class, ErrorClass::Permanent);
    assert!(error.message.contains("fails the step's schema answer@1"), "{}", error.message);
}

/// The record is bounded by bytes whatever the declared limits allow: a tool result too
/// large for what is left is recorded as an error (the model sees it), and an agent whose
/// record reaches three quarters of the payload limit stops with the recorded limit
/// `record_bytes` — before, the record write failed after the tool's side effect, with no
/// recorded stop.
#[tokio::test]
async fn the_record_is_bounded_by_bytes() {
    let world = World::new(81);
    let oracle = Arc::new(Oracle::default());
    // Always one more fetch; a 40 KiB result first, then 12 KiB ones.
    let script: Script = Arc::new(|_, _| json!({"tool_calls": [{"tool": "fetch", "args": {}}]}));
    let big: Behaviour = Arc::new(|_, _| Ok(json!("x".repeat(40 * 1024))));
    let inst = run_one(&world, one_agent_step(&world, &oracle, script.clone(), big, None)).await;
    let rec = inst.steps[0].record.as_ref().unwrap();
    let first = rec.entries.iter().find_map(|e| match e {
        RecordEntry::Value(v) if v.label == "agent.t1" => Some(v.value.clone()),
        _ => None,
    });
    assert!(first.unwrap()["error"].as_str().unwrap().contains("too large to record"));

    let world = World::new(82);
    let oracle = Arc::new(Oracle::default());
    let mid: Behaviour = Arc::new(|_, _| Ok(json!("y".repeat(12 * 1024))));
    let inst = run_one(&world, one_agent_step(&world, &oracle, script, mid, None)).await;
    assert_eq!(inst.status, WorkflowStatus::Failed);
    let rec = inst.steps[0].record.as_ref().unwrap();
    let stop = rec.entries.iter().find_map(|e| match e {
        RecordEntry::Value(v) if v.label == LABEL_STOP => Some(v.value.clone()),
        _ => None,
    });
    assert_eq!(stop.as_ref().map(|s| s["limit"].clone()), Some(json!("record_bytes")), "{stop:?}");
    let bytes = serde_json::to_vec(rec).unwrap().len();
    assert!(bytes < 64 * 1024, "the record stayed within the payload limit: {bytes}");
    assert!(get(&oracle.tool_runs) >= 3 && get(&oracle.tool_runs) < 8, "{}", get(&oracle.tool_runs));
}

/// The write cost of an agent (K-7.1's budget, for sub-steps): one durable write per
/// recorded sub-step (each proposal and each tool call, written before the loop goes on),
/// one for the recorded start, plus the step's own mark-running and completion. Counted by
/// the store's audit, not by the engine.
#[tokio::test]
async fn an_agent_sub_step_costs_one_write() {
    for rounds in [1u64, 3, 6] {
        let world = World::new(83);
        let oracle = Arc::new(Oracle::default());
        // `rounds` proposals of one fetch each, then done.
        let script: Script = Arc::new(move |req, _| {
            let seen = req.input["transcript"].as_array().map_or(0, Vec::len) as u64;
            if seen < 2 * rounds {
                json!({"tool_calls": [{"tool": "fetch", "args": {}}]})
            } else {
                json!({"done": {"rounds": rounds}})
            }
        });
        let def = one_agent_step(&world, &oracle, script, Arc::new(|_, _| Ok(json!("page"))), None);
        let engine = world.engine("A", vec![def]);
        engine.publisher().start_or_resume(StartRequest::new("one", "one:1", json!({}))).await.unwrap();
        world.audit.reset_traffic();
        world.drive(&engine).await.unwrap();
        let inst = world.instances().await.unwrap().pop().unwrap();
        assert_eq!(inst.status, WorkflowStatus::Completed);
        let sub_steps = 2 * rounds + 1; // proposals with a call each, then the done proposal
        let writes = world.audit.counts().writes;
        println!("agent-writes: sub_steps={sub_steps} writes={writes}");
        // claim + mark running + start + one per sub-step + completion fused with completed.
        assert_eq!(writes, 1 + 1 + 1 + sub_steps + 1, "{sub_steps} sub-steps");
    }
}
