//! A small workflow driven through metered ports, and a reader of the rendered text.

use kernel_core::definition::RetryPolicy;
use kernel_core::engine::Engine;
use kernel_core::ports::PermitLimits;
use kernel_core::{ActivityContext, ActivityError, Definition, StartRequest, StepDef, StepOutcome};
use kernel_metrics::{metered, Metrics};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use testkit::harness::{DriveReport, World};

/// The resource every workflow's first step takes unless its input names another.
pub const HOT: &str = "hot";

/// `t`: step `a` takes the permit named by `input.res` and fails once, retryably, when
/// `input.flaky`; step `b` completes.
pub fn definition() -> Definition {
    let a = StepDef::new("a", |c: ActivityContext| async move {
        if c.input()["flaky"] == json!(true) && c.attempt() == 1 {
            return Err(ActivityError::transient("503"));
        }
        Ok(StepOutcome::complete(json!("a")))
    })
    .resource_from(|input, _| input["res"].as_str().unwrap_or(HOT).to_string())
    .retry(RetryPolicy::Immediate)
    .max_retry(2);
    let b = StepDef::new("b", |_c: ActivityContext| async { Ok(StepOutcome::complete(json!("b"))) });
    Definition::builder("t").step(a).step(b).build().expect("valid definition")
}

/// A world whose `hot` resource admits one start per second, so starts in the same
/// simulated second are denied and deferred.
pub fn world(seed: u64) -> World {
    World::with_limits(
        seed,
        HashMap::from([(HOT.to_string(), PermitLimits { max_concurrency: 0, max_starts_per_second: 1 })]),
    )
}

/// Workflow ids of a run: `wf-<i>`.
pub fn workflow_id(i: usize) -> String {
    format!("wf-{i}")
}

/// Start `n` workflows on `engine` (every third flaky; resource `res-<i % resources>`, or
/// `hot` when `resources` is 0) and drive to quiescence.
pub async fn run(world: &World, engine: &Engine, n: usize, resources: usize) -> DriveReport {
    for i in 0..n {
        let res = if resources == 0 { HOT.to_string() } else { format!("res-{}", i % resources) };
        let input = json!({ "flaky": i % 3 == 0, "res": res });
        let req = StartRequest::new("t", format!("biz-{i}"), input).workflow_id(workflow_id(i));
        engine.publisher().start_or_resume(req).await.expect("started");
    }
    world.drive(engine).await.expect("driven")
}

/// A metered engine on `world`.
pub fn metered_engine(world: &World, metrics: &Arc<Metrics>) -> Engine {
    world.engine_on(metered(world.ports(), metrics), testkit::harness::test_config("A"), vec![definition()])
}

/// One sample of the text format: name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Every sample line of `text` (OpenMetrics text; label values hold no `,` or `"` here).
pub fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (head, value) = l.rsplit_once(' ').expect("name and value");
            let (name, labels) = match head.split_once('{') {
                Some((n, rest)) => {
                    let inner = rest.strip_suffix('}').expect("closing brace");
                    let labels = inner
                        .split(',')
                        .filter(|p| !p.is_empty())
                        .map(|p| {
                            let (k, v) = p.split_once('=').expect("key=value");
                            (k.to_string(), v.trim_matches('"').to_string())
                        })
                        .collect();
                    (n.to_string(), labels)
                }
                None => (head.to_string(), BTreeMap::new()),
            };
            Sample { name, labels, value: value.parse().expect("numeric value") }
        })
        .collect()
}

/// The value of the sample `name` whose labels include every pair of `labels` (summed
/// over the others); 0 when there is none.
pub fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples(text)
        .into_iter()
        .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
        .map(|s| s.value)
        .sum()
}
