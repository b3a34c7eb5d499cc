//! Loops and branches under a crash at every boundary, random shapes against a crash-free run,
//! and the figure lines (`control:`, `control sweep:`).

use super::*;
use kernel_core::record::HistoryReason;
use kernel_core::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use testkit::harness::{sweep, BoxFuture, Scenario, ScenarioRun, ScenarioVerdict, SweepSample, World};

// --- the crash-window sweep --------------------------------------------------------------

/// Totals over every run of a control sweep, from the fake business world and the stored
/// instances after each run.
#[derive(Default, Debug)]
pub(crate) struct ControlTotals {
    /// Runs whose final instance was checked.
    pub(crate) runs: u64,
    /// Most loop iterations any stored sender holds.
    pub(crate) loop_iterations_max: u32,
    /// Runs where the loop's body ran under more than `1 + max` keys.
    pub(crate) past_max: u64,
    /// Runs of the branch scenario.
    pub(crate) branch_runs: u64,
    /// Steps stored as not taken, summed over runs.
    pub(crate) branches_skipped: u64,
}

/// The document-review loop under a crash at every boundary: three iterations (four
/// documents needed), maximum four.
struct LoopScenario {
    totals: Arc<Mutex<ControlTotals>>,
    needed: u64,
    max: u32,
}

struct LoopRun {
    review: Review,
    max: u32,
    needed: u64,
    totals: Arc<Mutex<ControlTotals>>,
}

impl Scenario for LoopScenario {
    fn name(&self) -> String {
        "control-loop".into()
    }
    fn instantiate(&self, _world: &World) -> Box<dyn ScenarioRun> {
        Box::new(LoopRun {
            review: Review::new(self.needed),
            max: self.max,
            needed: self.needed,
            totals: self.totals.clone(),
        })
    }
}

impl ScenarioRun for LoopRun {
    fn definitions(&self) -> Vec<Definition> {
        vec![self.review.definition(self.max, OnFailed::Stop)]
    }
    fn start<'a>(&'a self, engine: &'a Engine) -> BoxFuture<'a, kernel_core::Result<()>> {
        Box::pin(async move {
            engine.publisher().start_or_resume(StartRequest::new("review", "file:sweep", json!({}))).await?;
            Ok(())
        })
    }
    fn verdict(&self, instances: &[WorkflowInstance]) -> ScenarioVerdict {
        let collect = distinct(&keys_of(&self.review.runs, "collect")) as u64;
        let approve = distinct(&keys_of(&self.review.runs, "approve")) as u64;
        let mut unfinished = vec![];
        let mut t = self.totals.lock().unwrap();
        t.runs += 1;
        if collect > u64::from(self.max) + 1 {
            t.past_max += 1;
        }
        for i in instances {
            let check = &i.steps[1];
            t.loop_iterations_max = t.loop_iterations_max.max(check.iterations);
            let ok = i.status == WorkflowStatus::Completed
                && u64::from(check.iterations) == self.needed - 1
                && i.output["check"] == json!({"complete": true, "documents": self.needed})
                && collect == self.needed
                && i.steps[0].history.iter().filter(|h| h.reason == HistoryReason::Loop).count() as u64
                    == self.needed - 1;
            if !ok {
                unfinished.push(i.biz_key.clone());
            }
        }
        ScenarioVerdict {
            expected: vec!["file:sweep".into()],
            unfinished,
            effective_jobs_max: approve,
            late_submissions: 0,
        }
    }
}

/// The routing branches under a crash at every boundary: an invoice, so `receipt` is not
/// taken and `post` is.
struct BranchScenario {
    totals: Arc<Mutex<ControlTotals>>,
}

struct BranchRun {
    runs: Runs,
    totals: Arc<Mutex<ControlTotals>>,
}

impl Scenario for BranchScenario {
    fn name(&self) -> String {
        "control-branch".into()
    }
    fn instantiate(&self, _world: &World) -> Box<dyn ScenarioRun> {
        Box::new(BranchRun { runs: Default::default(), totals: self.totals.clone() })
    }
}

impl ScenarioRun for BranchRun {
    fn definitions(&self) -> Vec<Definition> {
        vec![routing(self.runs.clone())]
    }
    fn start<'a>(&'a self, engine: &'a Engine) -> BoxFuture<'a, kernel_core::Result<()>> {
        Box::pin(async move {
            let req = StartRequest::new("routing", "doc:sweep", json!({"kind": "invoice"}));
            engine.publisher().start_or_resume(req).await?;
            Ok(())
        })
    }
    fn verdict(&self, instances: &[WorkflowInstance]) -> ScenarioVerdict {
        let mut unfinished = vec![];
        let mut t = self.totals.lock().unwrap();
        t.runs += 1;
        t.branch_runs += 1;
        let ran_receipt = !keys_of(&self.runs, "receipt").is_empty();
        for i in instances {
            t.branches_skipped += i.steps.iter().filter(|s| s.not_taken()).count() as u64;
            let not_taken: Vec<&str> = i.steps.iter().filter(|s| s.not_taken()).map(|s| s.name.as_str()).collect();
            let ok = i.status == WorkflowStatus::Completed
                && not_taken == ["receipt"]
                && !ran_receipt
                && i.output.contains_key("post")
                && i.output.contains_key("archive");
            if !ok {
                unfinished.push(i.biz_key.clone());
            }
        }
        ScenarioVerdict {
            expected: vec!["doc:sweep".into()],
            unfinished,
            effective_jobs_max: distinct(&keys_of(&self.runs, "archive")) as u64,
            late_submissions: 0,
        }
    }
}

/// Run the loop and branch scenarios of the sweep; the totals of every run.
pub(crate) async fn control_sweep(sample: SweepSample) -> (testkit::harness::SweepReport, ControlTotals) {
    let totals = Arc::new(Mutex::new(ControlTotals::default()));
    let lp = LoopScenario { totals: totals.clone(), needed: 4, max: 4 };
    let br = BranchScenario { totals: totals.clone() };
    let report = sweep(&[&lp, &br], 21, sample).await;
    let totals = std::mem::take(&mut *totals.lock().unwrap());
    (report, totals)
}

/// Every step's output is a function of its name, its epoch and its dependencies'
/// recorded outputs — the same "model answer" for the same question, with or without a
/// crash. The loop's sender asks for another round while its epoch is below the wanted
/// iterations; a branch runs when its read's value is even.
fn shaped(shape: &Shape) -> Definition {
    let mut b = Definition::builder("shaped");
    for (i, deps) in shape.deps.iter().enumerate() {
        let name = format!("s{i}");
        let dep_names: Vec<String> = deps.iter().map(|d| format!("s{d}")).collect();
        let dn = dep_names.clone();
        let wanted = shape.looped.filter(|l| l.0 == i).map(|l| l.2);
        let mut sd = StepDef::new(name.clone(), move |ctx: ActivityContext| {
            let dn = dn.clone();
            async move {
                let mut parts = vec![ctx.step_name().to_string(), ctx.epoch().to_string()];
                for d in &dn {
                    parts.push(ctx.output(d).map(|v| v["v"].to_string()).unwrap_or_else(|| "skipped".into()));
                }
                let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
                let mut out = json!({ "v": h(&refs) % 1_000 });
                if let Some(k) = wanted {
                    out["again"] = json!(ctx.epoch() < k);
                }
                Ok(StepOutcome::complete(out))
            }
        })
        .depends_on(dep_names);
        if let Some((_, target, _, max)) = shape.looped.filter(|l| l.0 == i) {
            sd = sd.loop_to(format!("s{target}"), |out| out["again"] == json!(true)).max_iterations(max);
        }
        if let Some(&(_, read)) = shape.branches.iter().find(|b| b.0 == i) {
            let r = format!("s{read}");
            let r2 = r.clone();
            sd = sd.when([r], move |o| o.output(&r2).is_some_and(|v| v["v"].as_u64().unwrap_or(1) % 2 == 0));
        }
        b = b.step(sd);
    }
    b.build().expect("generated shapes are valid")
}

/// What a run ends with: status, outputs, and per step its status and iterations.
type Outcome = (WorkflowStatus, BTreeMap<String, Value>, Vec<(StepStatus, u32, u32)>);

fn outcome(i: &WorkflowInstance) -> Outcome {
    (i.status, i.output.clone(), i.steps.iter().map(|s| (s.status, s.iterations, s.epoch)).collect())
}

/// Whether a crash run ended as the crash-free one: a completed run exactly (every output,
/// every step's status, iterations and epoch); a run that failed at a loop's maximum by its
/// status and its loop sender's state and output — which parallel siblings of the sender
/// finished before the stop depends on where a crash split their wave (K-4.5 resolves a wave
/// once all its members returned; a wave a crash interrupted is not formed again).
fn same_end(got: &Outcome, want: &Outcome, def: &Definition) -> bool {
    if want.0 == WorkflowStatus::Completed || got.0 != want.0 {
        return got == want;
    }
    def.steps()
        .iter()
        .enumerate()
        .filter(|(_, s)| s.get_loop_to().is_some())
        .all(|(i, s)| got.2[i] == want.2[i] && got.1.get(s.name()) == want.1.get(s.name()))
}

struct ShapeScenario {
    def: Definition,
    expected: Outcome,
    mismatches: Arc<Mutex<Vec<String>>>,
}

struct ShapeRun {
    def: Definition,
    expected: Outcome,
    mismatches: Arc<Mutex<Vec<String>>>,
}

impl Scenario for ShapeScenario {
    fn name(&self) -> String {
        "control-shape".into()
    }
    fn instantiate(&self, _world: &World) -> Box<dyn ScenarioRun> {
        Box::new(ShapeRun {
            def: self.def.clone(),
            expected: self.expected.clone(),
            mismatches: self.mismatches.clone(),
        })
    }
}

impl ScenarioRun for ShapeRun {
    fn definitions(&self) -> Vec<Definition> {
        vec![self.def.clone()]
    }
    fn start<'a>(&'a self, engine: &'a Engine) -> BoxFuture<'a, kernel_core::Result<()>> {
        Box::pin(async move {
            // One business round: a client retry never replays a run that failed at a loop's
            // maximum (K-5), so every run ends as the crash-free one did.
            let req = StartRequest::new("shaped", "shape:1", json!({"fencing_token": "round-1"}));
            engine.publisher().start_or_resume(req).await?;
            Ok(())
        })
    }
    fn verdict(&self, instances: &[WorkflowInstance]) -> ScenarioVerdict {
        let mut unfinished = vec![];
        for i in instances {
            let got = outcome(i);
            if !same_end(&got, &self.expected, &self.def) {
                self.mismatches.lock().unwrap().push(format!("got {got:?}\nwant {:?}", self.expected));
                unfinished.push(i.biz_key.clone());
            }
        }
        ScenarioVerdict { expected: vec!["shape:1".into()], unfinished, effective_jobs_max: 1, late_submissions: 0 }
    }
}

fn control_cases() -> u32 {
    std::env::var("KERNEL_CONTROL_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(24)
}

/// K-4 amendment and K-17.1 at every persistence boundary: a crash before or after any
/// write, a zombie returning late, a new worker taking over — the loop runs its body once
/// per iteration key and never past its maximum, finishes with the same outputs, and the
/// branch not taken never runs.
#[tokio::test]
async fn loops_and_branches_survive_a_crash_at_every_boundary() {
    let (report, totals) = control_sweep(SweepSample::All).await;
    report.assert_clean();
    assert!(report.points_at("store.apply") > 20, "{report}");
    assert_eq!(totals.past_max, 0, "{totals:?}");
    assert_eq!(totals.loop_iterations_max, 3, "{totals:?}");
    assert!(totals.branch_runs > 10, "{totals:?}");
    assert_eq!(totals.branches_skipped, totals.branch_runs, "one not taken per branch run: {totals:?}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: control_cases(), ..Default::default() })]

    /// Over random loop/branch definitions and crash points: the final outputs (and every
    /// step's status, iterations and epoch) equal those of a crash-free run with the same
    /// answers; nothing completes twice, no zombie write is accepted.
    #[test]
    fn random_loops_and_branches_end_as_a_crash_free_run(shape in shape(), seed in 0u64..1_000) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let def = shaped(&shape);
            let world = World::new(seed);
            let engine = world.engine("A", vec![def.clone()]);
            let req = StartRequest::new("shaped", "shape:1", json!({"fencing_token": "round-1"}));
            engine.publisher().start_or_resume(req).await.unwrap();
            world.drive(&engine).await.unwrap();
            let clean = world.instances().await.unwrap().pop().unwrap();
            assert!(clean.status.is_terminal(), "{shape:?}: {clean:?}");
            let sc = ShapeScenario { def, expected: outcome(&clean), mismatches: Default::default() };
            let report = sweep(&[&sc], seed, SweepSample::Seeded { points: 6, seed }).await;
            let mismatches = sc.mismatches.lock().unwrap().clone();
            assert!(mismatches.is_empty(), "{shape:?}\n{}", mismatches.join("\n"));
            assert_eq!(report.crashes_fired, report.runs, "{report}");
            assert_eq!((report.lost, report.unfinished, report.duplicate_step_completions, report.stale_writes_accepted), (0, 0, 0, 0), "{shape:?} {report}");
        });
    }
}

// --- the report ---------------------------------------------------------------------------

/// The control report (K-4 amendment, K-5 amendment, K-17.1 sub-steps): every count from an
/// independent oracle — the stored instances after each run, the fake business world, the
/// events' stored inputs, the agent's fake model and tools reading the store — never from
/// the engine's own claims. Run by the test script's reports section.
#[tokio::test]
async fn control_report() {
    let (report, totals) = control_sweep(SweepSample::All).await;
    report.assert_clean();
    assert_eq!(totals.past_max, 0, "{totals:?}");
    // Loops stopped at their maximum, one per policy, counted from the stored senders.
    let mut loop_stops = 0u64;
    for policy in [OnFailed::Stop, OnFailed::Skip, OnFailed::DeadLetter] {
        let world = World::new(31);
        let review = Review::new(100);
        let engine = world.engine("A", vec![review.definition(2, policy)]);
        world.start(&engine, "review", "file:limit").await;
        world.drive(&engine).await.unwrap();
        for i in world.instances().await.unwrap() {
            loop_stops += i
                .steps
                .iter()
                .filter(|s| s.error.as_ref().is_some_and(|e| e.message.contains("reached its maximum")))
                .count() as u64;
        }
    }
    let (event_starts, duplicate_event_starts) = crate::events::event_counts().await;
    let agent = crate::agents::agent_counts().await;
    let limit_stops = loop_stops + agent.limit_stops;
    println!(
        "control: loop_iterations_max={} branches_skipped={} event_starts={event_starts} duplicate_event_starts={duplicate_event_starts} agent_resumes={} agent_proposal_resamples={} agent_tool_reexecutions={} limit_stops={limit_stops}",
        totals.loop_iterations_max, totals.branches_skipped, agent.resumes, agent.proposal_resamples, agent.tool_reexecutions,
    );
    println!(
        "control sweep: runs={} loop_and_branch_runs={} agent_runs={} loop_stops={loop_stops} agent_limit_stops={}",
        report.runs, totals.runs, agent.runs, agent.limit_stops
    );
    assert!(totals.loop_iterations_max >= 3 && totals.branches_skipped > 0 && event_starts > 0, "{totals:?}");
    assert_eq!(duplicate_event_starts, 0);
    assert!(agent.resumes > 0, "{agent:?}");
    assert_eq!((agent.proposal_resamples, agent.tool_reexecutions), (0, 0), "{agent:?}");
    assert_eq!(loop_stops, 3);
    assert!(agent.limit_stops > 0, "{agent:?}");
}
