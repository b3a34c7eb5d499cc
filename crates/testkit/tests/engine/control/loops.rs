//! Loops (K-4 amendment, K-17.1): each iteration a new epoch, bounded by its maximum, nested
//! and sibling loops, operator actions on a loop, waits of siblings kept.

use super::*;
use kernel_core::activity::idempotency_key_at;
use kernel_core::ports::*;
use kernel_core::record::HistoryReason;
use kernel_core::*;
use serde_json::{json, Value};
use std::sync::Arc;
use testkit::harness::World;

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

/// K-4 amendment, K-17.1: each iteration re-runs the loop's body in its next epoch — a
/// new idempotency key per iteration — keeps each iteration's outputs in the bounded
/// history (reason `loop`), counts the iterations on the sender, and the steps after the
/// loop run once.
#[tokio::test]
async fn a_loop_reruns_its_body_in_a_new_epoch_per_iteration() {
    let world = World::new(11);
    let review = Review::new(4);
    let engine = world.engine("A", vec![review.definition(5, OnFailed::Stop)]);
    let wf = world.start(&engine, "review", "file:1").await;
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
        let wf = world.start(&engine, "review", "file:2").await;
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
    let wf = world.start(&engine, "nested", "n:1").await;
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
    let wf = world.start(&engine, "siblings", "s:1").await;
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
    let wf = world.start(&engine, "review", "file:dl").await;
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
    let wf = world.start(&engine, "review", "file:regen").await;
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
    let wf = world.start(&engine, "wave", "w:1").await;
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
    world.start(&engine, "streamed", "st:1").await;
    world.drive(&engine).await.unwrap();
    let key = world.streams.keys().pop().expect("one stream");
    let stream = world.streams.get(&key).unwrap();
    let texts: Vec<String> = stream.frames.iter().map(|f| format!("{f:?}")).collect();
    assert_eq!(texts.len(), 1, "only the last iteration's frame: {texts:?}");
    assert!(texts[0].contains("draft 2"), "{texts:?}");
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
        world.start(&engine, "review", "file:writes").await;
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
    let wf = world.start(&engine, "two", "two:1").await;
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
    let wf = world.start(&engine, "outside", "o:1").await;
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
    let wf = world.start(&engine, "review", "file:replay").await;
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
