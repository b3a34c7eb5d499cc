//! An agent resumes from its last recorded sub-step at every crash point; its limits stop it
//! with a recorded outcome that a re-invocation replays; an agent without limits is refused.

use super::*;
use kernel_agents::*;
use kernel_core::ports::*;
use kernel_core::*;
use serde_json::json;
use std::sync::Arc;
use testkit::harness::World;

/// What each limit stops at, given 15 tokens and 7 micros per proposal and 2 s per tick:
/// `(used, max, labels recorded before the stop)`.
fn expected_stop(limit: AgentLimit) -> (u64, u64, usize) {
    match limit {
        // p0 t1 p2 | t3 refused
        AgentLimit::SubSteps => (3, 3, 3),
        // p0 (15) t1 p2 (30) t3 p4 (45) | t5 refused
        AgentLimit::Tokens => (45, 40, 5),
        // p0 (7) t1 p2 (14) | t3 refused
        AgentLimit::CostMicros => (14, 10, 3),
        // p0 t1 (2 s) p2 t3 (4 s) p4 t5 (6 s) | p6 refused
        AgentLimit::Deadline => (6_000, 5_000, 6),
        AgentLimit::RecordBytes => unreachable!("not a declared limit"),
    }
}

// --- tests ----------------------------------------------------------------------------------

/// At every persistence boundary — a crash before or after any write, a zombie coming back
/// late, a new worker taking over — a recorded proposal is never sampled again, a recorded
/// tool call never runs again (two proposed together run one by one), the agent resumes
/// from its record, and the workflow completes with the answer built from the tools'
/// recorded results, under one idempotency key.
#[tokio::test]
async fn agent_resumes_from_its_last_recorded_sub_step_at_every_crash_point() {
    let (report, oracle) = agent_sweep().await;
    report.assert_clean();
    assert!(report.runs >= 20, "{report:?}");
    assert_eq!(get(&oracle.proposal_resamples), 0, "re-samples of recorded proposals");
    assert_eq!(get(&oracle.tool_reexecutions), 0, "re-executions of recorded tool calls");
    assert!(get(&oracle.resumes) > 0, "no invocation resumed from recorded sub-steps");
    assert!(get(&oracle.resumes) < get(&oracle.invocations));
    // Every run drew at least its four samples and ran its three tools.
    assert!(get(&oracle.asks) >= 4 * report.runs && get(&oracle.tool_runs) >= 3 * report.runs, "{oracle:?}");
}

/// Each limit stops the loop with the typed error, recorded as `agent.stop` after exactly
/// the sub-steps the limit allows; with `OnFailed::DeadLetter` the step is dead-lettered
/// with a permanent error naming the limit.
#[tokio::test]
async fn each_limit_stops_the_agent_and_dead_letters_the_step() {
    for limit in LIMITS {
        let oracle = Arc::new(Oracle::default());
        let (world, inst) = limit_case(limit, OnFailed::DeadLetter, &oracle).await;
        let (used, max, before) = expected_stop(limit);
        assert_eq!(inst.status, WorkflowStatus::Waiting, "{limit}: waiting for the operator");
        let rec = inst.steps[0].record.as_ref().unwrap();
        let labels = labels(rec);
        assert_eq!(labels.len(), before + 2, "{limit}: {labels:?}");
        assert_eq!(labels.last().map(String::as_str), Some(LABEL_STOP), "{limit}");
        assert_eq!(
            recorded_stop(&inst.steps[0]),
            Some(json!({"limit": limit.as_str(), "used": used, "max": max})),
            "{limit}"
        );
        let dls = world.dead_letters.list(None, None, 10).await.unwrap();
        assert_eq!(dls.len(), 1, "{limit}");
        assert_eq!(dls[0].error.class, ErrorClass::Permanent, "{limit}");
        let message = AgentError::Limit { limit, used, max }.to_string();
        assert!(dls[0].error.message.contains(&message), "{limit}: {} / {message}", dls[0].error.message);
        let proposals = rec.model_calls().count() as u64;
        assert_eq!(get(&oracle.asks), proposals, "{limit}: one sample per recorded proposal");
        assert_eq!(get(&oracle.tool_runs), before as u64 - proposals, "{limit}: each tool call ran once");
        assert_eq!((get(&oracle.proposal_resamples), get(&oracle.tool_reexecutions)), (0, 0));
    }
}

/// The other `on_failed` policies handle a limit like any permanent error: the default
/// fails the workflow, `skip` skips the step and goes on.
#[tokio::test]
async fn a_limit_fails_or_skips_the_step_as_declared() {
    let oracle = Arc::new(Oracle::default());
    let (_, failed) = limit_case(AgentLimit::SubSteps, OnFailed::Stop, &oracle).await;
    assert_eq!(failed.status, WorkflowStatus::Failed);
    assert!(failed.steps[0].error.as_ref().unwrap().message.contains("agent limit sub_steps reached"));
    let (_, skipped) = limit_case(AgentLimit::SubSteps, OnFailed::Skip, &oracle).await;
    assert_eq!(skipped.status, WorkflowStatus::Completed);
    assert_eq!(skipped.steps[0].status, StepStatus::Skipped);
    assert_eq!(skipped.output.get("after"), Some(&json!("after")));
    assert!(recorded_stop(&skipped.steps[0]).is_some());
}

/// A stop recorded before a crash is read back by the next invocation, with every
/// sub-step before it: the model is not asked again, no tool runs again, and the stop is
/// the recorded one even though the clock has moved on.
#[tokio::test]
async fn a_recorded_stop_is_replayed_without_asking_the_model() {
    let oracle = Arc::new(Oracle::default());
    let (inst, seen) = replayed_stop(&oracle).await;
    let stop = Err(AgentError::Limit { limit: AgentLimit::Deadline, used: 6_000, max: 5_000 });
    assert_eq!(seen, vec![(3, stop.clone()), (0, stop)], "asks and outcome of each invocation");
    assert_eq!(get(&oracle.tool_runs), 3, "three ticks, each once");
    assert_eq!(get(&oracle.resumes), 1);
    assert_eq!(inst.status, WorkflowStatus::Waiting, "dead-lettered");
    let stops = inst.steps[0].record.as_ref().unwrap().entries.iter().filter(|e| e.label() == LABEL_STOP).count();
    assert_eq!(stops, 1, "recorded once");
}

/// An agent step without a sub-step bound, a deadline or a budget is refused when the
/// definition is built, naming the field.
#[tokio::test]
async fn an_agent_without_limits_is_refused_at_build() {
    let world = World::new(70);
    let oracle = Arc::new(Oracle::default());
    let ok = limits_for(AgentLimit::Tokens);
    let cases = [
        (AgentLimits::default(), "steps[1].agent.max_sub_steps"),
        (AgentLimits { max_sub_steps: 0, ..ok }, "steps[1].agent.max_sub_steps"),
        (AgentLimits { max_sub_steps: AGENT_SUB_STEPS_MAX + 1, ..ok }, "steps[1].agent.max_sub_steps"),
        (AgentLimits { deadline_ms: None, ..ok }, "steps[1].agent.deadline_ms"),
        (AgentLimits { deadline_ms: Some(DurationMs::ZERO), ..ok }, "steps[1].agent.deadline_ms"),
        (AgentLimits { max_tokens: None, max_cost_micros: None, ..ok }, "steps[1].agent.budget"),
        (AgentLimits { max_tokens: Some(0), ..ok }, "steps[1].agent.budget"),
    ];
    for (limits, expected) in cases {
        let def = Definition::builder("bad")
            .step(StepDef::new("first", |_| async { Ok(StepOutcome::complete(json!(1))) }))
            .step(StepDef::agent("plan", ticking_agent(&world, &oracle, limits)))
            .build();
        match def {
            Err(Error::InvalidInput { field, .. }) => assert_eq!(field, expected, "{limits:?}"),
            other => panic!("{limits:?} was not refused: {:?}", other.map(|_| ())),
        }
    }
    // The same limits refused when the agent runs inside a custom activity.
    let agent = Arc::new(ticking_agent(&world, &oracle, AgentLimits::default()));
    let def = Definition::builder("custom")
        .step(StepDef::new("plan", move |ctx: ActivityContext| {
            let agent = agent.clone();
            async move {
                let r = agent.run(&ctx, json!({})).await;
                assert!(matches!(&r, Err(AgentError::InvalidLimits(Error::InvalidInput { .. }))), "{r:?}");
                Ok(StepOutcome::complete(json!(r?.output)))
            }
        }))
        .build()
        .unwrap();
    let engine = world.engine("A", vec![def]);
    engine.publisher().start_or_resume(StartRequest::new("custom", "custom:1", json!({}))).await.unwrap();
    world.drive(&engine).await.unwrap();
    let inst = world.instances().await.unwrap().pop().unwrap();
    assert_eq!(inst.status, WorkflowStatus::Failed);
    assert_eq!(get(&oracle.asks), 0, "the model is never asked");
}

/// The counts other reports print: every one from an oracle, each as the cases promise.
#[tokio::test]
async fn agent_counts_come_from_the_oracles() {
    let c = agent_counts().await;
    assert!(c.runs > 20, "{c:?}");
    assert!(c.resumes > 0, "{c:?}");
    assert_eq!((c.proposal_resamples, c.tool_reexecutions), (0, 0), "{c:?}");
    assert_eq!(c.limit_stops, LIMITS.len() as u64 + 1, "{c:?}");
}
