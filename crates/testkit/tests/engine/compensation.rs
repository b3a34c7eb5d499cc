//! Compensation declarations (K-17.6): a side-effecting step declares its idempotent
//! inverse, a step that nothing can undo is marked irreversible, and a definition that lets
//! an irreversible step run before a compensable one is refused when it is built.

use kernel_core::*;
use serde_json::json;

fn step(name: &str) -> StepDef {
    StepDef::new(name, |_: ActivityContext| async { Ok(StepOutcome::complete(json!(null))) })
}

fn inverse() -> impl Activity {
    |_: ActivityContext| async { Ok(StepOutcome::complete(json!("reversed"))) }
}

fn refused(b: kernel_core::definition::DefinitionBuilder) -> (String, String) {
    match b.build() {
        Err(Error::InvalidInput { field, reason, .. }) => (field, reason),
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

/// The invoice shape passes: post (compensable) → notify (irreversible, last).
#[test]
fn an_irreversible_step_after_every_compensable_one_is_accepted() {
    let def = Definition::builder("invoice")
        .step(step("extract"))
        .step(step("post").compensate_with(inverse()))
        .step(step("notify").irreversible())
        .build()
        .unwrap();
    assert!(def.steps()[1].get_inverse().is_some() && def.steps()[2].is_irreversible());
    // The declarations are policy: the fingerprint is the plain one.
    let plain = Definition::builder("invoice").step(step("extract")).step(step("post")).step(step("notify"));
    assert_eq!(def.plan().fingerprint(), plain.build().unwrap().plan().fingerprint());
}

/// K-17.6: an irreversible step that could run before a compensable step — placed early on
/// the path, or on a parallel branch the compensable step does not precede — is refused,
/// naming the field; so is one inside a loop's body and one that declares an inverse.
#[test]
fn an_irreversible_step_placed_early_is_refused() {
    let cases = vec![
        (
            Definition::builder("t").step(step("notify").irreversible()).step(step("post").compensate_with(inverse())),
            "steps[0].irreversible",
            "could run before compensable `post`",
        ),
        (
            Definition::builder("t")
                .step(step("fetch"))
                .step(step("post").depends_on(["fetch"]).compensate_with(inverse()))
                .step(step("notify").depends_on(["fetch"]).irreversible()),
            "steps[2].irreversible",
            "could run before compensable `post`",
        ),
        (
            Definition::builder("t")
                .step(step("post").compensate_with(inverse()))
                .step(step("notify").irreversible())
                .step(step("check").loop_to("post", |_| false).max_iterations(2)),
            "steps[1].irreversible",
            "in the body of the loop sent by `check`",
        ),
        (
            Definition::builder("t").step(step("post").compensate_with(inverse()).irreversible()),
            "steps[0].irreversible",
            "declares an inverse",
        ),
    ];
    for (b, field, reason) in cases {
        let (f, r) = refused(b);
        assert_eq!(f, field);
        assert!(r.contains(reason), "{field}: {r}");
    }
}
