//! Control beyond a DAG (K-4 amendment, K-17.1, K-17.4a): loops that send the workflow
//! back with a new epoch per iteration and a declared maximum, branches decided on
//! recorded outputs, under a crash at every persistence boundary.
//!
//! The oracles are the fake business world (documents submitted per idempotency key, runs
//! per step and key) and the stored instances — never the engine's own claims.

mod branches_and_shapes;
mod loops;
mod sweep;

use kernel_core::*;
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

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
