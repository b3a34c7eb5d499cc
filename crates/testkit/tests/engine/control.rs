//! Control beyond a DAG (K-4 amendment, K-17.1, K-17.4a): loops that send the workflow
//! back with a new epoch per iteration and a declared maximum, branches decided on
//! recorded outputs, under a crash at every persistence boundary.
//!
//! The oracles are the fake business world (documents submitted per idempotency key, runs
//! per step and key) and the stored instances — never the engine's own claims.

use kernel_core::activity::idempotency_key_at;
use kernel_core::ports::*;
use kernel_core::record::HistoryReason;
use kernel_core::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use testkit::harness::{sweep, BoxFuture, Scenario, ScenarioRun, ScenarioVerdict, SweepSample, World};

/// Runs per step: (step, idempotency key) in the order they happened.
type Runs = Arc<Mutex<Vec<(String, String)>>>;

fn keys_of(runs: &Runs, step: &str) -> Vec<String> {
    runs.lock().unwrap().iter().filter(|(s, _)| s == step).map(|(_, k)| k.clone()).collect()
}

fn distinct(keys: &[String]) -> usize {
    keys.iter().collect::<BTreeSet<_>>().len()
}

/// The document-review loop of the orchestration design: `collect` reads how many
/// documents the applicant has handed in (the applicant hands in one more each time the
/// file is sent back — once per idempotency key, so a re-run of one iteration hands in
/// nothing new), `check` says whether the file is complete and sends it back to `collect`
/// until it is (at most `max` times), then `approve` runs once.
struct Review {
    runs: Runs,
    /// Idempotency keys of `collect` the applicant has answered: one document each.
    handed_in: Arc<Mutex<BTreeSet<String>>>,
    /// Documents needed for a complete file.
    needed: u64,
}

impl Review {
    fn new(needed: u64) -> Review {
        Review { runs: Default::default(), handed_in: Default::default(), needed }
    }

    fn definition(&self, max: u32, on_failed: OnFailed) -> Definition {
        let (runs, handed_in) = (self.runs.clone(), self.handed_in.clone());
        let collect = StepDef::new("collect", move |ctx: ActivityContext| {
            let (runs, handed_in) = (runs.clone(), handed_in.clone());
            async move {
                runs.lock().unwrap().push(("collect".into(), ctx.idempotency_key()));
                let docs = {
                    let mut h = handed_in.lock().unwrap();
                    h.insert(ctx.idempotency_key());
                    h.len() as u64
                };
                Ok(StepOutcome::complete(json!({ "documents": docs })))
            }
        });
        let (runs, needed) = (self.runs.clone(), self.needed);
        let check = StepDef::new("check", move |ctx: ActivityContext| {
            let runs = runs.clone();
            async move {
                runs.lock().unwrap().push(("check".into(), ctx.idempotency_key()));
                let docs = ctx.output("collect").and_then(|o| o["documents"].as_u64()).unwrap_or(0);
                Ok(StepOutcome::complete(json!({ "complete": docs >= needed, "documents": docs })))
            }
        })
        .loop_to("collect", |out| out["complete"] != json!(true))
        .max_iterations(max)
        .on_failed(on_failed);
        let runs = self.runs.clone();
        let approve = StepDef::new("approve", move |ctx: ActivityContext| {
            let runs = runs.clone();
            async move {
                runs.lock().unwrap().push(("approve".into(), ctx.idempotency_key()));
                Ok(StepOutcome::complete(json!({ "approved": ctx.output("check").cloned() })))
            }
        });
        Definition::builder("review").step(collect).step(check).step(approve).build().unwrap()
    }

    /// The review with one more step after `approve`.
    fn extended(&self, max: u32, on_failed: OnFailed, last: StepDef) -> Definition {
        let mut b = Definition::builder("review");
        for s in self.definition(max, on_failed).steps() {
            b = b.step(s.clone());
        }
        b.step(last).build().unwrap()
    }
}

async fn start(engine: &Engine, workflow_type: &str, biz_key: &str) -> WorkflowId {
    engine
        .publisher()
        .start_or_resume(StartRequest::new(workflow_type, biz_key, json!({})))
        .await
        .unwrap()
        .instance
        .workflow_id
}

/// K-4 amendment, K-17.1: each iteration re-runs the loop's body in its next epoch — a
/// new idempotency key per iteration — keeps each iteration's outputs in the bounded
/// history (reason `loop`), counts the iterations on the sender, and the steps after the
/// loop run once.
#[tokio::test]
async fn a_loop_reruns_its_body_in_a_new_epoch_per_iteration() {
    let world = World::new(11);
    let review = Review::new(4);
    let engine = world.engine("A", vec![review.definition(5, OnFailed::Stop)]);
    let wf = start(&engine, "review", "file:1").await;
    world.drive(&engine).await.unwrap();
    let inst = world.instance(wf.as_str()).await.unwrap();
    assert_eq!(inst.status, WorkflowStatus::Completed);
    let collect = keys_of(&review.runs, "collect");
    let expected: Vec<String> = (0..4).map(|e| idempotency_key_at(wf.as_str(), "collect", 0, e)).collect();
    assert_eq!(collect, expected, "one run per iteration, each under its epoch's key");
    assert_eq!(distinct(&keys_of(&review.runs, "check")), 4);
    assert_eq!(
        keys_of(&review.runs, "approve"),
        vec![idempotency_key_at(wf.as_str(), "approve", 0, 0)],
        "after the loop: once, in its first epoch (the steps after the sender are not in the body)"
    );
    let (c, k) = (&inst.steps[0], &inst.steps[1]);
    assert_eq!((c.epoch, k.epoch, k.iterations), (3, 3, 3));
    assert_eq!(c.history.len(), 3);
    assert!(c.history.iter().all(|h| h.reason == HistoryReason::Loop));
    let docs: Vec<_> = c.history.iter().map(|h| h.output.clone().unwrap()["documents"].clone()).collect();
    assert_eq!(docs, vec![json!(1), json!(2), json!(3)], "every iteration's output, oldest first");
    assert_eq!(k.history[0].output.as_ref().unwrap()["complete"], json!(false));
    assert_eq!(inst.output["check"], json!({"complete": true, "documents": 4}));
    assert_eq!(inst.steps[2].iterations, 0);
}

/// A loop past its declared maximum is a permanent error of its sender, handled by the
/// sender's policy: `stop` fails the workflow (the last output kept for diagnosis),
/// `skip` goes on after the loop, `dead_letter` parks it for an operator. The body never
/// runs more than `1 + max` times.
#[tokio::test]
async fn a_loop_past_its_maximum_stops_by_the_senders_policy() {
    for (policy, status) in [
        (OnFailed::Stop, WorkflowStatus::Failed),
        (OnFailed::Skip, WorkflowStatus::Completed),
        (OnFailed::DeadLetter, WorkflowStatus::Waiting),
    ] {
        let world = World::new(12);
        let review = Review::new(100);
        let engine = world.engine("A", vec![review.definition(2, policy)]);
        let wf = start(&engine, "review", "file:2").await;
        world.drive(&engine).await.unwrap();
        let inst = world.instance(wf.as_str()).await.unwrap();
        assert_eq!(inst.status, status, "{policy:?}");
        assert_eq!(distinct(&keys_of(&review.runs, "collect")), 3, "1 + max iterations, {policy:?}");
        let check = &inst.steps[1];
        assert_eq!(check.iterations, 2);
        let error = check.error.as_ref().expect("the stop is recorded");
        assert_eq!(error.class, ErrorClass::Permanent);
        assert!(error.message.contains("maximum of 2 iterations"), "{}", error.message);
        match policy {
            OnFailed::Stop => {
                assert_eq!(check.status, StepStatus::Failed);
                assert_eq!(inst.output["check"]["documents"], json!(3), "the last output stays for diagnosis");
                assert!(keys_of(&review.runs, "approve").is_empty());
            }
            OnFailed::Skip => {
                assert_eq!(check.status, StepStatus::Skipped);
                assert!(!check.not_taken(), "skipped by its policy, not by a branch");
                assert!(!inst.output.contains_key("check"), "a skipped step has no output");
                assert_eq!(keys_of(&review.runs, "approve").len(), 1);
            }
            _ => {
                let dls = world.dead_letters.list(None, None, 10).await.unwrap();
                assert_eq!(dls.len(), 1);
                assert_eq!(dls[0].step, "check");
                assert!(keys_of(&review.runs, "approve").is_empty());
            }
        }
    }
}

// --- branches ---------------------------------------------------------------------------

/// Invoice or receipt: `classify` records a kind; `invoice` and `receipt` run only for
/// theirs; `post` follows a taken `invoice` only; `archive` joins both branches.
fn routing(runs: Runs) -> Definition {
    let step = |name: &'static str, runs: Runs| {
        StepDef::new(name, move |ctx: ActivityContext| {
            let runs = runs.clone();
            async move {
                runs.lock().unwrap().push((name.to_string(), ctx.idempotency_key()));
                let kind = ctx.input()["kind"].clone();
                Ok(StepOutcome::complete(json!({ "step": name, "kind": kind })))
            }
        })
    };
    Definition::builder("routing")
        .step(step("classify", runs.clone()))
        .step(
            step("invoice", runs.clone())
                .depends_on(["classify"])
                .when(["classify"], |o| o.output("classify").is_some_and(|c| c["kind"] == "invoice")),
        )
        .step(
            step("receipt", runs.clone())
                .depends_on(["classify"])
                .when(["classify"], |o| o.output("classify").is_some_and(|c| c["kind"] == "receipt")),
        )
        .step(step("post", runs.clone()).depends_on(["invoice"]).when(["invoice"], |o| o.output("invoice").is_some()))
        .step(step("archive", runs).depends_on(["post", "receipt"]))
        .build()
        .unwrap()
}

/// K-4 amendment: a step whose predicate does not hold is skipped without an error (not
/// taken); skipped satisfies its dependents (K-4.4), so the join runs; a step guarded on a
/// taken branch is skipped with it.
#[tokio::test]
async fn a_branch_not_taken_is_skipped_and_its_join_runs() {
    for (kind, taken, not_taken) in [
        ("invoice", vec!["classify", "invoice", "post", "archive"], vec!["receipt"]),
        ("receipt", vec!["classify", "receipt", "archive"], vec!["invoice", "post"]),
    ] {
        let world = World::new(14);
        let runs: Runs = Default::default();
        let engine = world.engine("A", vec![routing(runs.clone())]);
        engine
            .publisher()
            .start_or_resume(StartRequest::new("routing", format!("doc:{kind}"), json!({ "kind": kind })))
            .await
            .unwrap();
        world.drive(&engine).await.unwrap();
        let inst = world.instances().await.unwrap().pop().unwrap();
        assert_eq!(inst.status, WorkflowStatus::Completed);
        let ran: Vec<String> = runs.lock().unwrap().iter().map(|(s, _)| s.clone()).collect();
        assert_eq!(ran, taken, "{kind}");
        for s in &inst.steps {
            let expect_skipped = not_taken.contains(&s.name.as_str());
            assert_eq!(s.not_taken(), expect_skipped, "{kind}: {}", s.name);
            assert_eq!(inst.output.contains_key(&s.name), !expect_skipped, "{kind}: {}", s.name);
        }
    }
}

/// A predicate that panics is a permanent failure of its step (handled by its policy),
/// never a crash of the worker.
#[tokio::test]
async fn a_panicking_predicate_fails_its_step() {
    let world = World::new(15);
    let def = Definition::builder("panicky")
        .step(StepDef::new("a", |_: ActivityContext| async { Ok(StepOutcome::complete(json!(1))) }))
        .step(
            StepDef::new("b", |_: ActivityContext| async { Ok(StepOutcome::complete(json!(2))) })
                .when(["a"], |_| panic!("bad predicate")),
        )
        .build()
        .unwrap();
    let engine = world.engine("A", vec![def]);
    start(&engine, "panicky", "p:1").await;
    world.drive(&engine).await.unwrap();
    let inst = world.instances().await.unwrap().pop().unwrap();
    assert_eq!(inst.status, WorkflowStatus::Failed);
    assert_eq!(inst.steps[1].status, StepStatus::Failed);
    assert!(inst.steps[1].error.as_ref().unwrap().message.contains("bad predicate"));
}

// --- bad input --------------------------------------------------------------------------

fn noop(name: &str) -> StepDef {
    StepDef::new(name, |_: ActivityContext| async { Ok(StepOutcome::complete(json!(null))) })
}

fn refused(b: kernel_core::definition::DefinitionBuilder) -> (String, String) {
    match b.build() {
        Err(Error::InvalidInput { field, reason, .. }) => (field, reason),
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

/// Bad control shapes are typed errors when the definition is built, naming the field.
#[test]
fn bad_control_shapes_are_refused_when_the_definition_is_built() {
    let again = |_: &Value| true;
    let cases: Vec<(kernel_core::definition::DefinitionBuilder, &str, &str)> = vec![
        (
            Definition::builder("t").step(noop("a").loop_to("b", again).max_iterations(2)).step(noop("b")),
            "steps[0].loop_to",
            "comes after its sender",
        ),
        (
            Definition::builder("t").step(noop("a")).step(noop("b").loop_to("a", again)),
            "steps[1].max_iterations",
            "no maximum",
        ),
        (
            Definition::builder("t").step(noop("a")).step(noop("b").loop_to("a", again).max_iterations(0)),
            "steps[1].max_iterations",
            "not within",
        ),
        (
            Definition::builder("t").step(noop("a")).step(noop("b").loop_to("a", again).max_iterations(1_001)),
            "steps[1].max_iterations",
            "not within",
        ),
        (
            Definition::builder("t").step(noop("a")).step(noop("b").max_iterations(3)),
            "steps[1].max_iterations",
            "without a loop",
        ),
        (
            Definition::builder("t").step(noop("a")).step(noop("b").loop_to("zz", again).max_iterations(2)),
            "steps[1].loop_to",
            "unknown step",
        ),
        (
            Definition::builder("t")
                .step(noop("a"))
                .step(noop("b").depends_on(Vec::<String>::new()).loop_to("a", again).max_iterations(2)),
            "steps[1].loop_to",
            "not upstream",
        ),
        (
            Definition::builder("t").step(noop("a")).step(noop("b").when(["nope"], |_| true)),
            "steps[1].when",
            "unknown step",
        ),
        (
            Definition::builder("t")
                .step(noop("a"))
                .step(noop("b").depends_on(Vec::<String>::new()).when(["a"], |_| true)),
            "steps[1].when",
            "not upstream",
        ),
        (
            Definition::builder("t").step(noop("a")).step(noop("b").when(["b"], |_| true)),
            "steps[1].when",
            "not upstream",
        ),
        (
            Definition::builder("t").step(noop("a")).step(noop("b").when(Vec::<String>::new(), |_| true)),
            "steps[1].when",
            "at least one",
        ),
    ];
    for (b, field, reason) in cases {
        let (f, r) = refused(b);
        assert_eq!(f, field);
        assert!(r.contains(reason), "{field}: {r}");
    }
    // A step may loop to itself (poll until done).
    assert!(Definition::builder("t")
        .step(noop("a"))
        .step(noop("b").loop_to("b", again).max_iterations(3))
        .build()
        .is_ok());
}

/// K-4.2 and its amendment: a definition without loops or branches keeps its fingerprint;
/// the control shape enters it (golden values, cross-checked with an independent Python
/// `hashlib` implementation of the encoding documented on `definition::fingerprint`); the
/// maximum and the predicates' code do not.
#[test]
fn the_control_shape_enters_the_fingerprint() {
    let plain = Definition::builder("review").step(noop("collect")).step(noop("check")).step(noop("approve"));
    let plain = plain.build().unwrap();
    let looped = |max: u32| {
        Definition::builder("review")
            .step(noop("collect"))
            .step(noop("check").loop_to("collect", |_| true).max_iterations(max))
            .step(noop("approve"))
            .build()
            .unwrap()
    };
    let branched = Definition::builder("review")
        .step(noop("collect"))
        .step(noop("check").when(["collect"], |_| false))
        .step(noop("approve"))
        .build()
        .unwrap();
    let fp = |d: &Definition| d.plan().fingerprint().to_string();
    assert_eq!(
        fp(&plain),
        Plan::new("review", &[("collect".into(), None), ("check".into(), None), ("approve".into(), None)])
            .unwrap()
            .fingerprint()
    );
    assert_eq!(fp(&looped(3)), fp(&looped(7)), "the maximum is policy");
    assert_ne!(fp(&looped(3)), fp(&plain));
    assert_ne!(fp(&branched), fp(&plain));
    assert_ne!(fp(&branched), fp(&looped(3)));
    assert_eq!(fp(&looped(3)), GOLDEN_LOOP);
    assert_eq!(fp(&branched), GOLDEN_BRANCH);
    // A publisher declares the same shape and gets the same fingerprint.
    let steps = [("collect".to_string(), None), ("check".to_string(), None), ("approve".to_string(), None)];
    let control =
        [StepControl::default(), StepControl { loop_to: Some("collect".into()), reads: None }, StepControl::default()];
    assert_eq!(Plan::with_control("review", &steps, &control).unwrap().fingerprint(), GOLDEN_LOOP);
}

const GOLDEN_LOOP: &str = "09adb7947466a6e8d9c0074b78a387c3d3acfd5701bfed2174ee435b770d2232";
const GOLDEN_BRANCH: &str = "ff4abe98770b7987d6d1eb388190994edc0a716ce9e1eb5fcc6ff32a90988420";

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

// --- property: random loops and branches, random crash points -----------------------------

/// A generated definition: `deps[i]` the earlier steps step `i` depends on, an optional
/// loop (sender, target, iterations wanted, maximum), optional branches (step, the
/// upstream step it reads).
#[derive(Debug, Clone)]
struct Shape {
    deps: Vec<Vec<usize>>,
    looped: Option<(usize, usize, u32, u32)>,
    branches: Vec<(usize, usize)>,
}

fn upstream(deps: &[Vec<usize>], i: usize) -> BTreeSet<usize> {
    let mut seen = BTreeSet::new();
    let mut stack = deps[i].clone();
    while let Some(j) = stack.pop() {
        if seen.insert(j) {
            stack.extend(deps[j].iter().copied());
        }
    }
    seen
}

/// FNV-1a over the parts, separated: the same answer for the same question.
fn h(parts: &[&str]) -> u64 {
    let mut x: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.join("\u{1f}").bytes() {
        x ^= u64::from(b);
        x = x.wrapping_mul(0x0100_0000_01b3);
    }
    x
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

fn shape() -> impl proptest::strategy::Strategy<Value = Shape> {
    use proptest::prelude::*;
    (3usize..=6, any::<u64>()).prop_map(|(n, seed)| {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let mut deps: Vec<Vec<usize>> = vec![vec![]];
        for i in 1..n {
            let mut d: Vec<usize> = (0..i).filter(|_| rng.gen_bool(0.4)).collect();
            if d.is_empty() {
                d.push(i - 1);
            }
            deps.push(d);
        }
        let looped = rng.gen_bool(0.8).then(|| {
            let sender = rng.gen_range(1..n);
            let mut candidates: Vec<usize> = upstream(&deps, sender).into_iter().collect();
            candidates.push(sender);
            let target = candidates[rng.gen_range(0..candidates.len())];
            let wanted: u32 = rng.gen_range(1..=3);
            // Sometimes below what the loop wants: the run ends at the limit, by policy.
            let max = rng.gen_range(wanted.saturating_sub(1).max(1)..=wanted + 1);
            (sender, target, wanted, max)
        });
        let mut branches = vec![];
        for i in 1..n {
            if rng.gen_bool(0.35) && looped.is_none_or(|l| l.0 != i) {
                let ups: Vec<usize> = upstream(&deps, i).into_iter().collect();
                branches.push((i, ups[rng.gen_range(0..ups.len())]));
            }
        }
        Shape { deps, looped, branches }
    })
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

/// Nested loops: an outer loop (`appeal` back to `draft`) re-runs an inner one (`check`
/// back to `collect`) whose counter starts again at 0 on every outer iteration; every
/// iteration of either has its own keys.
#[tokio::test]
async fn an_outer_loop_restarts_the_inner_loops_counter() {
    let world = World::new(16);
    let runs: Runs = Default::default();
    let counting = |name: &'static str, runs: Runs, out: fn(&ActivityContext) -> Value| {
        StepDef::new(name, move |ctx: ActivityContext| {
            let runs = runs.clone();
            async move {
                runs.lock().unwrap().push((name.to_string(), ctx.idempotency_key()));
                Ok(StepOutcome::complete(out(&ctx)))
            }
        })
    };
    // `check` wants two rounds of `collect` per draft (its epoch counts them within the run,
    // so compare with the draft's epoch); `appeal` wants two drafts.
    let def = Definition::builder("nested")
        .step(counting("draft", runs.clone(), |ctx| json!({ "draft": ctx.epoch() })))
        .step(counting("collect", runs.clone(), |ctx| json!({ "round": ctx.epoch() })))
        .step(
            counting("check", runs.clone(), |ctx| {
                let draft = ctx.output("draft").and_then(|d| d["draft"].as_u64()).unwrap_or(0);
                let round = ctx.output("collect").and_then(|c| c["round"].as_u64()).unwrap_or(0);
                // Rounds of this draft: the collect epochs since the draft's own epoch began.
                json!({ "again": round < draft * 2 + 1 })
            })
            .loop_to("collect", |out| out["again"] == json!(true))
            .max_iterations(1),
        )
        .step(
            counting("appeal", runs.clone(), |ctx| json!({ "again": ctx.epoch() < 1 }))
                .loop_to("draft", |out| out["again"] == json!(true))
                .max_iterations(1),
        )
        .build()
        .unwrap();
    let engine = world.engine("A", vec![def]);
    let wf = start(&engine, "nested", "n:1").await;
    world.drive(&engine).await.unwrap();
    let inst = world.instance(wf.as_str()).await.unwrap();
    assert_eq!(inst.status, WorkflowStatus::Completed, "{:?}", inst.steps);
    assert_eq!(distinct(&keys_of(&runs, "draft")), 2);
    assert_eq!(distinct(&keys_of(&runs, "collect")), 4, "two rounds per draft");
    assert_eq!(distinct(&keys_of(&runs, "appeal")), 2);
    let check = &inst.steps[2];
    assert_eq!(check.iterations, 1, "the inner counter started again in the second draft (max 1)");
    assert_eq!((inst.steps[3].iterations, inst.steps[0].epoch, inst.steps[1].epoch), (1, 1, 3));
}

// --- interplay: sibling loops, operators, waits, streams -----------------------------------

fn again_step(name: &'static str, runs: Runs) -> StepDef {
    StepDef::new(name, move |ctx: ActivityContext| {
        let runs = runs.clone();
        async move {
            runs.lock().unwrap().push((name.to_string(), ctx.idempotency_key()));
            Ok(StepOutcome::complete(json!({ "again": true })))
        }
    })
}

/// A sender back to `t` that always asks for another round, at most `max` times.
fn sender_to_t(name: &'static str, runs: &Runs, max: u32, policy: OnFailed) -> StepDef {
    again_step(name, runs.clone())
        .depends_on(["t"])
        .loop_to("t", |o| o["again"] == json!(true))
        .max_iterations(max)
        .on_failed(policy)
}

/// Two sibling senders back to the same target never reset each other's counters (only a
/// loop strictly inside another restarts): each stops at its own maximum, so the workflow
/// ends — before, each loop-back of one restarted the other and it never did.
#[tokio::test]
async fn sibling_loops_stay_bounded() {
    let world = World::new(17);
    let runs: Runs = Default::default();
    let def = Definition::builder("siblings")
        .step(again_step("t", runs.clone()))
        .step(sender_to_t("a", &runs, 2, OnFailed::Skip))
        .step(sender_to_t("b", &runs, 2, OnFailed::Skip))
        .build()
        .unwrap();
    let engine = world.engine("A", vec![def]);
    let wf = start(&engine, "siblings", "s:1").await;
    let report = world.drive_until(&engine, 200, &|| false).await.unwrap();
    let inst = world.instance(wf.as_str()).await.unwrap();
    assert_eq!(inst.status, WorkflowStatus::Completed, "{} claims; {:?}", report.claims(), inst.steps);
    assert!(distinct(&keys_of(&runs, "t")) <= 5, "{:?}", keys_of(&runs, "t"));
    assert_eq!((inst.steps[1].iterations, inst.steps[2].iterations), (2, 2));
}

/// A sender dead-lettered at its maximum and completed by an operator leaves the loop with
/// the operator's output, even when the predicate would still send it back — before, the
/// control pass stopped it again under the same dead letter, every poll, forever.
#[tokio::test]
async fn an_operator_completion_at_the_maximum_leaves_the_loop() {
    let world = World::new(18);
    let review = Review::new(100);
    let engine = world.engine("A", vec![review.definition(1, OnFailed::DeadLetter)]);
    let wf = start(&engine, "review", "file:dl").await;
    world.drive(&engine).await.unwrap();
    let dls = world.dead_letters.list(Some(DeadLetterStatus::Open), None, 10).await.unwrap();
    assert_eq!(dls.len(), 1);
    let output = json!({ "complete": false, "documents": 2, "waived": true });
    engine
        .decide_dead_letter(
            &dls[0].id,
            DeadLetterAction::Complete { output: output.clone() },
            "ops@example",
            Some("waived"),
        )
        .await
        .unwrap();
    world.drive(&engine).await.unwrap();
    let inst = world.instance(wf.as_str()).await.unwrap();
    assert_eq!(inst.status, WorkflowStatus::Completed, "{:?}", inst.steps[1]);
    assert_eq!(inst.output["check"], output);
    assert_eq!(keys_of(&review.runs, "approve").len(), 1);
    assert_eq!(world.dead_letters.list(Some(DeadLetterStatus::Open), None, 10).await.unwrap().len(), 0);
}

/// A regenerate that re-runs a loop sender restarts its counter (the loop is entered
/// afresh), so the loop has its whole budget again.
#[tokio::test]
async fn a_regenerate_restarts_the_loop_counter() {
    let world = World::new(19);
    let review = Review::new(3);
    let runs = review.runs.clone();
    let gate = StepDef::new("gate", move |ctx: ActivityContext| {
        let runs = runs.clone();
        async move {
            runs.lock().unwrap().push(("gate".into(), ctx.idempotency_key()));
            Ok(match ctx.resume() {
                Some(Resume { kind: ResumeKind::Signal, .. }) => StepOutcome::complete(json!("open")),
                _ => StepOutcome::wait_for_signal("go", "g").generation(ctx.logical_generation()).into(),
            })
        }
    });
    let engine = world.engine("A", vec![review.extended(2, OnFailed::Stop, gate)]);
    let wf = start(&engine, "review", "file:regen").await;
    world.drive(&engine).await.unwrap();
    let before = world.instance(wf.as_str()).await.unwrap();
    assert_eq!((before.status, before.steps[1].iterations), (WorkflowStatus::Waiting, 2));
    engine.regenerate(&wf, "collect").await.unwrap();
    let after = world.instance(wf.as_str()).await.unwrap();
    assert_eq!(after.steps[1].iterations, 0, "the counter starts over");
    world.drive(&engine).await.unwrap();
    let again = world.instance(wf.as_str()).await.unwrap();
    assert_eq!(again.status, WorkflowStatus::Waiting, "the regenerated loop completes within its budget");
    assert!(again.output.contains_key("approve"));
}

/// A sibling in the loop's body that suspends in the sender's wave does not hold the
/// loop-back: the iteration is over, the loop goes back at once, and the sibling runs again
/// in the next iteration — before, the workflow waited for a signal meant for an iteration
/// that was already over.
#[tokio::test]
async fn a_waiting_sibling_in_the_body_does_not_hold_the_loop_back() {
    let world = World::new(20);
    let runs: Runs = Default::default();
    let r = runs.clone();
    let def = Definition::builder("wave")
        .step(again_step("t", runs.clone()))
        .step(
            StepDef::new("s", |ctx: ActivityContext| async move {
                Ok(StepOutcome::complete(json!({ "again": ctx.epoch() < 1 })))
            })
            .depends_on(["t"])
            .loop_to("t", |o| o["again"] == json!(true))
            .max_iterations(2),
        )
        .step(
            StepDef::new("x", move |ctx: ActivityContext| {
                let r = r.clone();
                async move {
                    r.lock().unwrap().push(("x".into(), ctx.idempotency_key()));
                    Ok(if ctx.epoch() == 0 {
                        StepOutcome::wait_for_signal("never", "x").generation(ctx.logical_generation()).into()
                    } else {
                        StepOutcome::complete(json!("done"))
                    })
                }
            })
            .depends_on(["t"]),
        )
        .build()
        .unwrap();
    let engine = world.engine("A", vec![def]);
    let wf = start(&engine, "wave", "w:1").await;
    world.drive(&engine).await.unwrap();
    let inst = world.instance(wf.as_str()).await.unwrap();
    assert_eq!(inst.status, WorkflowStatus::Completed, "{:?}", inst.steps);
    assert_eq!(distinct(&keys_of(&runs, "x")), 2);
    assert_eq!(inst.steps[1].iterations, 1);
}

/// A streaming step in the loop's body starts its readers over on every iteration (K-16):
/// the stream holds the last iteration's frames only.
#[tokio::test]
async fn a_streaming_step_in_the_body_resets_its_stream_per_iteration() {
    let world = World::new(21);
    let def = Definition::builder("streamed")
        .step(
            StepDef::new("draft", |ctx: ActivityContext| async move {
                if let Some(s) = ctx.stream() {
                    s.text(format!("draft {}", ctx.epoch()))
                        .await
                        .map_err(|e| ActivityError::transient(e.to_string()))?;
                }
                Ok(StepOutcome::complete(json!({ "again": ctx.epoch() < 2 })))
            })
            .streaming()
            .loop_to("draft", |o| o["again"] == json!(true))
            .max_iterations(3),
        )
        .build()
        .unwrap();
    let engine = world.engine("A", vec![def]);
    start(&engine, "streamed", "st:1").await;
    world.drive(&engine).await.unwrap();
    let key = world.streams.keys().pop().expect("one stream");
    let stream = world.streams.get(&key).unwrap();
    let texts: Vec<String> = stream.frames.iter().map(|f| format!("{f:?}")).collect();
    assert_eq!(texts.len(), 1, "only the last iteration's frame: {texts:?}");
    assert!(texts[0].contains("draft 2"), "{texts:?}");
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
        start(&engine, "review", "file:limit").await;
        world.drive(&engine).await.unwrap();
        for i in world.instances().await.unwrap() {
            loop_stops += i
                .steps
                .iter()
                .filter(|s| s.error.as_ref().is_some_and(|e| e.message.contains("reached its maximum")))
                .count() as u64;
        }
    }
    let (event_starts, duplicate_event_starts) = super::events::event_counts().await;
    let agent = super::agent::agent_counts().await;
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

/// K-7.1 for loops: an iteration of the review loop costs four durable writes — the
/// target's start, its completion fused with the sender's start, the sender's completion
/// (never fused with a loop-back) and the loop-back — and the last pass the linear path's
/// writes. Counted by the store's audit, not by the engine.
#[tokio::test]
async fn a_loop_iteration_costs_four_writes() {
    for needed in [1u64, 2, 4] {
        let world = World::new(22);
        let review = Review::new(needed);
        let engine = world.engine("A", vec![review.definition(5, OnFailed::Stop)]);
        start(&engine, "review", "file:writes").await;
        world.audit.reset_traffic(); // from the claim on: the create is the publisher's
        world.drive(&engine).await.unwrap();
        let inst = world.instances().await.unwrap().pop().unwrap();
        assert_eq!(inst.status, WorkflowStatus::Completed);
        let iterations = needed - 1;
        let writes = world.audit.counts().writes;
        println!("loop-writes: iterations={iterations} writes={writes}");
        // claim + 4 per iteration + start, complete/start, complete/start, complete+completed.
        assert_eq!(writes, 1 + 4 * iterations + 4, "{iterations} iterations");
        let loop_backs = world
            .observations
            .events()
            .iter()
            .filter(|o| o.kind == kernel_core::transition::TransitionKind::LoopBack)
            .count() as u64;
        assert_eq!(loop_backs, iterations);
    }
}

/// The wave's supersede follows exactly the control pass's decision: when the first sender
/// in step order is at its maximum (a stop), a later sender's due loop-back does not drop a
/// body sibling's wait — before, the wait was never written and the sibling was left
/// running while the stop dead-lettered the first sender.
#[tokio::test]
async fn a_stop_at_the_maximum_never_drops_a_siblings_wait() {
    let world = World::new(23);
    let runs: Runs = Default::default();
    let r = runs.clone();
    let def = Definition::builder("two")
        .step(again_step("t", runs.clone()))
        .step(sender_to_t("a", &runs, 1, OnFailed::DeadLetter))
        .step(sender_to_t("b", &runs, 5, OnFailed::Stop))
        .step(
            StepDef::new("x", move |ctx: ActivityContext| {
                let r = r.clone();
                async move {
                    r.lock().unwrap().push(("x".into(), ctx.idempotency_key()));
                    Ok(StepOutcome::wait_for_signal("go", "x").generation(ctx.logical_generation()).into())
                }
            })
            .depends_on(["t"]),
        )
        .build()
        .unwrap();
    let engine = world.engine("A", vec![def]);
    let wf = start(&engine, "two", "two:1").await;
    world.drive(&engine).await.unwrap();
    let inst = world.instance(wf.as_str()).await.unwrap();
    assert!(
        inst.steps.iter().all(|s| s.status != StepStatus::Running),
        "no step is left running: {:?}",
        inst.steps.iter().map(|s| (s.name.as_str(), s.status)).collect::<Vec<_>>()
    );
    assert_eq!(inst.status, WorkflowStatus::Waiting);
    let wait = inst.wait.as_ref().expect("a stored wait");
    assert_eq!(wait.step_index(), 3, "x's wait was written (K-4.5), not dropped");
    assert_eq!(inst.steps[1].iterations, 1);
}

/// A halted sibling outside the loop's body keeps its halt: the loop-back waits for it.
#[tokio::test]
async fn a_halted_sibling_outside_the_body_keeps_its_wait() {
    let world = World::new(24);
    let runs: Runs = Default::default();
    let def = Definition::builder("outside")
        .step(again_step("pre", runs.clone()))
        .step(again_step("t", runs.clone()).depends_on(["pre"]))
        .step(
            StepDef::new("s", |ctx: ActivityContext| async move {
                Ok(StepOutcome::complete(json!({ "again": ctx.epoch() < 1 })))
            })
            .depends_on(["t"])
            .loop_to("t", |o| o["again"] == json!(true))
            .max_iterations(2),
        )
        .step(
            StepDef::new("y", |ctx: ActivityContext| async move {
                Ok(match ctx.resume() {
                    Some(Resume { kind: ResumeKind::Signal, .. }) => StepOutcome::complete(json!("woken")),
                    _ => StepOutcome::wait_for_signal("go", "y").generation(ctx.logical_generation()).into(),
                })
            })
            .depends_on(["pre"]),
        )
        .build()
        .unwrap();
    let engine = world.engine("A", vec![def]);
    let wf = start(&engine, "outside", "o:1").await;
    world.drive(&engine).await.unwrap();
    let inst = world.instance(wf.as_str()).await.unwrap();
    // y (outside the body) is waiting; its wait was stored.
    assert_eq!(inst.status, WorkflowStatus::Waiting, "{:?}", inst.steps);
    assert_eq!(inst.wait.as_ref().map(|w| w.step_index()), Some(3));
    let signal = Signal::builder(wf.clone(), "go").wait_key("y").generation(0).signal_id("go-y").build().unwrap();
    engine.deliver_signal(signal).await.unwrap();
    world.drive(&engine).await.unwrap();
    let inst = world.instance(wf.as_str()).await.unwrap();
    assert_eq!(inst.status, WorkflowStatus::Completed, "{:?}", inst.steps);
    assert_eq!((inst.steps[2].iterations, inst.output["y"].clone()), (1, json!("woken")));
}

/// An operator's completion of a sender survives a replayed round (K-5 keeps completed
/// steps): the loop is not stopped again — before, the control pass looked for the
/// operator's entry in the new run only and stopped the sender at its maximum again.
#[tokio::test]
async fn an_operator_completion_survives_a_replay() {
    let world = World::new(25);
    let review = Review::new(100);
    let fails = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let f = fails.clone();
    let file = StepDef::new("file", move |_: ActivityContext| {
        let f = f.clone();
        async move {
            if f.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(ActivityError::permanent("archive unavailable"));
            }
            Ok(StepOutcome::complete(json!("filed")))
        }
    });
    let def = review.extended(1, OnFailed::DeadLetter, file);
    let engine = world.engine("A", vec![def]);
    let wf = start(&engine, "review", "file:replay").await;
    world.drive(&engine).await.unwrap();
    let dl = world.dead_letters.list(Some(DeadLetterStatus::Open), None, 10).await.unwrap().pop().unwrap();
    let output = json!({ "complete": false, "documents": 2, "waived": true });
    engine
        .decide_dead_letter(&dl.id, DeadLetterAction::Complete { output: output.clone() }, "ops", None)
        .await
        .unwrap();
    world.drive(&engine).await.unwrap();
    assert_eq!(world.instance(wf.as_str()).await.unwrap().status, WorkflowStatus::Failed, "`file` failed");
    fails.store(false, std::sync::atomic::Ordering::SeqCst);
    engine.publisher().start_or_resume(StartRequest::new("review", "file:replay", json!({}))).await.unwrap();
    world.drive(&engine).await.unwrap();
    let inst = world.instance(wf.as_str()).await.unwrap();
    assert_eq!(inst.status, WorkflowStatus::Completed, "{:?}", inst.steps[1]);
    assert_eq!((inst.retry_count, inst.output["check"].clone()), (1, output));
    assert_eq!(world.dead_letters.list(Some(DeadLetterStatus::Open), None, 10).await.unwrap().len(), 0);
}
