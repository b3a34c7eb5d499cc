//! Branches decided on recorded outputs, and the control shapes a definition may declare: bad
//! shapes refused at build, the shape in the fingerprint (K-4.2 amendment).

use super::*;
use crate::support::refused;
use kernel_core::*;
use serde_json::{json, Value};
use testkit::harness::World;

// --- bad input --------------------------------------------------------------------------

fn noop(name: &str) -> StepDef {
    StepDef::new(name, |_: ActivityContext| async { Ok(StepOutcome::complete(json!(null))) })
}

const GOLDEN_LOOP: &str = "09adb7947466a6e8d9c0074b78a387c3d3acfd5701bfed2174ee435b770d2232";

const GOLDEN_BRANCH: &str = "ff4abe98770b7987d6d1eb388190994edc0a716ce9e1eb5fcc6ff32a90988420";

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
    world.start(&engine, "panicky", "p:1").await;
    world.drive(&engine).await.unwrap();
    let inst = world.instances().await.unwrap().pop().unwrap();
    assert_eq!(inst.status, WorkflowStatus::Failed);
    assert_eq!(inst.steps[1].status, StepStatus::Failed);
    assert!(inst.steps[1].error.as_ref().unwrap().message.contains("bad predicate"));
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
