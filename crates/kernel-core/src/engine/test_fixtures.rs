//! Plain values the table tests of the engine's decisions share: an activity that is never
//! run, a definition and an instance whose steps stand as a row says.

use crate::activity::{ActivityContext, ActivityError, StepOutcome};
use crate::definition::{Definition, StepDef};
use crate::domain::{Instant, Priority, Step, StepStatus, WorkflowInstance, WorkflowStatus};
use serde_json::Value;
use std::collections::BTreeMap;

/// The fixed time of every row.
pub(crate) const NOW: Instant = Instant::from_millis(1_000_000);

/// A step definition whose activity the decisions never run.
pub(crate) fn step(name: &str) -> StepDef {
    StepDef::new(name, |_ctx: ActivityContext| async { Ok::<_, ActivityError>(StepOutcome::Complete(Value::Null)) })
}

/// The definition `t` of these steps.
pub(crate) fn def(steps: Vec<StepDef>) -> Definition {
    steps.into_iter().fold(Definition::builder("t"), |b, s| b.step(s)).build().expect("a valid definition")
}

/// A step of `def` standing at `status`.
pub(crate) fn at(name: &str, status: StepStatus) -> Step {
    let mut s = Step::pending(name);
    s.status = status;
    if status != StepStatus::Pending {
        s.attempt = 1;
    }
    s
}

/// A running instance of `def` with these steps.
pub(crate) fn instance(def: &Definition, steps: Vec<Step>) -> WorkflowInstance {
    WorkflowInstance {
        workflow_id: "wf-1".into(),
        workflow_type: "t".into(),
        biz_key: "b".into(),
        status: WorkflowStatus::Running,
        steps,
        input: Value::Null,
        output: Default::default(),
        claimable_time: None,
        claim_token: Some("tok".into()),
        wait: None,
        resume: None,
        definition_fingerprint: def.plan().fingerprint().to_string(),
        fingerprint_mismatch: None,
        business_priority: Priority::P2,
        retry_count: 0,
        prepare_failures: 0,
        refused_writes: 0,
        revision: 1,
        created_at: Instant::ZERO,
        updated_at: Instant::ZERO,
        finished_at: None,
        compensation: None,
        trace_parent: None,
        operator_request: None,
    }
}

/// Outputs by step name.
pub(crate) fn outputs(pairs: &[(&str, Value)]) -> BTreeMap<String, Value> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}
