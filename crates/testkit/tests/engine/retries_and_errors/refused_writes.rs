//! A write the store refuses (`InvalidInput`) or could not reach (`Unavailable`) is not an
//! uncertain outcome (K-6.4): a refused completion fails its step once, through the normal
//! failure path; an unavailable store hands the claim back with a delay.

use crate::intercept::{ApplyHook, Intercepted};
use crate::support::settle;
use kernel_core::domain::*;
use kernel_core::engine::{ClaimEnd, RoundOutcome};
use kernel_core::ports::*;
use kernel_core::transition::TransitionKind;
use kernel_core::{ActivityContext, Definition, Error, StartRequest, StepDef, StepOutcome, WorkflowId};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use testkit::harness::{test_config, World};

/// A two-step workflow whose first step returns `output`, counting its executions.
fn def(output: Value, runs: Arc<AtomicUsize>) -> Definition {
    Definition::builder("t")
        .step(StepDef::new("produce", move |_ctx: ActivityContext| {
            let (output, runs) = (output.clone(), runs.clone());
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(StepOutcome::complete(output))
            }
        }))
        .step(StepDef::new("after", |_ctx: ActivityContext| async { Ok(StepOutcome::complete(json!(1))) }))
        .build()
        .expect("valid")
}

/// `levels` nested objects around a scalar.
fn nested(levels: usize) -> Value {
    (0..levels).fold(json!(1), |v, _| json!({ "n": v }))
}

/// The failed step's error, checked to be a permanent one.
fn permanent_error(inst: &WorkflowInstance) -> StepError {
    assert_eq!(inst.status, WorkflowStatus::Failed, "{inst:?}");
    assert_eq!(inst.steps[0].status, StepStatus::Failed);
    let e = inst.steps[0].error.clone().expect("the failed step keeps its error");
    assert_eq!(e.class, ErrorClass::Permanent);
    e
}

/// Outputs no store can hold end the workflow `failed` after one execution, with a typed,
/// permanent step error naming the reason (before the fix the in-memory store stored them,
/// so the workflow completed, while MongoDB refused them and the step re-ran forever).
#[tokio::test]
async fn outputs_the_store_cannot_represent_fail_the_step_once() {
    let cases: [(&str, Value, &str); 3] = [
        ("integer above i64::MAX", json!({ "amount": u64::MAX }), "integer"),
        ("NUL in a nested key", json!({ "a": { "b\u{0}c": 1 } }), "NUL"),
        ("nesting too deep", nested(150), "nest"),
    ];
    for (what, output, reason) in cases {
        let world = World::new(1);
        let runs = Arc::new(AtomicUsize::new(0));
        let engine = world.engine("w", vec![def(output, runs.clone())]);
        world.start_as(&engine, "t", "b", "wf").await;
        world.drive_until(&engine, 50, &|| false).await.unwrap();
        let inst = world.store.peek("wf").unwrap();
        assert_eq!(inst.status, WorkflowStatus::Failed, "{what}: {inst:?}");
        let e = permanent_error(&inst);
        assert!(e.message.contains(reason), "{what}: {}", e.message);
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{what}: executions");
    }
}

/// How [`refusing`] answers the first completion write of step 0.
#[derive(Clone, Copy, Debug)]
enum Answer {
    Refused,
    Unavailable,
    Uncertain,
}

/// Forwards to the world's store, except the first write that completes step 0, which it
/// answers with `answer` without writing.
fn refusing(inner: Arc<DynStore>, answer: Answer) -> Arc<ApplyHook> {
    let fired = Mutex::new(false);
    let intercept: crate::intercept::Intercept = Box::new(move |_, _, t| {
        if !t.completed_steps().any(|i| i == 0) {
            return None;
        }
        let mut fired = fired.lock().unwrap();
        if *fired {
            return None;
        }
        *fired = true;
        Some(Intercepted::Fail(match answer {
            Answer::Refused => Error::invalid("document", "the document would exceed the size limit"),
            Answer::Unavailable => Error::unavailable("primary stepped down"),
            Answer::Uncertain => Error::uncertain("connection dropped after the write was sent"),
        }))
    });
    Arc::new(ApplyHook { inner, intercept })
}

async fn run_with(answer: Answer) -> (World, Vec<ClaimEnd>, usize, Vec<TransitionKind>) {
    let world = World::new(1);
    let runs = Arc::new(AtomicUsize::new(0));
    let mut ports = world.ports();
    ports.store = refusing(ports.store.clone(), answer);
    let engine = world.engine_on(ports, test_config("w"), vec![def(json!({"ok": true}), runs.clone())]);
    world.start_as(&engine, "t", "b", "wf").await;
    let report = world.drive_until(&engine, 50, &|| false).await.unwrap();
    let kinds = world.audit.log_of("wf").iter().flat_map(|w| w.kinds.clone()).collect();
    (world, report.ends_of("wf"), runs.load(Ordering::SeqCst), kinds)
}

/// A completion the store refuses fails the completing step for good through the normal
/// failure path (step failed → failing → failed), after exactly one execution; the claim
/// is not left to expire and the step is never re-run.
#[tokio::test]
async fn a_refused_completion_fails_the_step_once() {
    let (world, ends, runs, kinds) = run_with(Answer::Refused).await;
    assert_eq!(runs, 1, "executions; claim ends {ends:?}");
    assert_eq!(ends, vec![ClaimEnd::Terminal(WorkflowStatus::Failed)]);
    let e = permanent_error(&world.store.peek("wf").unwrap());
    assert!(e.message.contains("refused"), "{}", e.message);
    assert!(e.message.contains("size limit"), "the store's reason is kept: {}", e.message);
    assert!(kinds.contains(&TransitionKind::StepFailed) && kinds.contains(&TransitionKind::Failed), "{kinds:?}");
}

/// A completion write that certainly had no effect (`Unavailable`) hands the claim back
/// with a delay instead of leaving the lease to expire; the step runs again later.
#[tokio::test]
async fn an_unavailable_store_hands_the_claim_back() {
    let (world, ends, runs, _) = run_with(Answer::Unavailable).await;
    assert_eq!(ends.first(), Some(&ClaimEnd::Released), "{ends:?}");
    assert_eq!(ends.last(), Some(&ClaimEnd::Terminal(WorkflowStatus::Completed)), "{ends:?}");
    assert_eq!(runs, 2, "the lost output is produced again, once");
    assert_eq!(world.store.peek("wf").unwrap().status, WorkflowStatus::Completed);
}

/// A wave of two parallel steps: `fast` (index 0) completes (the first time, as soon as
/// `slow` is inside its activity), `slow` waits for `gate`; entries of each are counted.
fn wave_def(gate: Arc<tokio::sync::Notify>, entries: Arc<[AtomicUsize; 2]>) -> Definition {
    let started = Arc::new(tokio::sync::Notify::new());
    let (e, s) = (entries.clone(), started.clone());
    let fast = move |_c: ActivityContext| {
        let (e, s) = (e.clone(), s.clone());
        async move {
            if e[0].fetch_add(1, Ordering::SeqCst) == 0 {
                // The first time, return only once the sibling is inside its activity.
                s.notified().await;
            }
            Ok(StepOutcome::complete(json!("fast")))
        }
    };
    let slow = move |_c: ActivityContext| {
        let (g, e, s) = (gate.clone(), entries.clone(), started.clone());
        async move {
            e[1].fetch_add(1, Ordering::SeqCst);
            s.notify_one();
            g.notified().await;
            Ok(StepOutcome::complete(json!("slow")))
        }
    };
    Definition::builder("t")
        .step(StepDef::new("fast", fast).depends_on(Vec::<String>::new()))
        .step(StepDef::new("slow", slow).depends_on(Vec::<String>::new()).timeout_ms(3_600_000))
        .build()
        .expect("valid")
}

/// K-4.5 + K-7.3: a sibling's completion write answered `Unavailable` does not hand the
/// claim back while another sibling of the wave is still running; the one hand-back is
/// written after every sibling returned, so no other worker can claim the instance and
/// re-enter the running sibling.
#[tokio::test]
async fn an_unavailable_write_in_a_wave_hands_back_only_after_every_sibling_returned() {
    let world = World::new(2);
    let gate = Arc::new(tokio::sync::Notify::new());
    let entries: Arc<[AtomicUsize; 2]> = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let mut ports = world.ports();
    ports.store = refusing(ports.store.clone(), Answer::Unavailable);
    let engine = world.engine_on(ports.clone(), test_config("A"), vec![wave_def(gate.clone(), entries.clone())]);
    let other = world.engine_on(ports, test_config("B"), vec![wave_def(gate.clone(), entries.clone())]);
    world.start_as(&engine, "t", "b", "wf").await;
    let e = engine.clone();
    let claim = tokio::spawn(async move { e.tick().await });
    settle().await;
    assert_eq!(entries[1].load(Ordering::SeqCst), 1, "the slow sibling is running");
    let inst = world.store.peek("wf").unwrap();
    assert!(inst.claim_token.is_some(), "the claim was handed back while a sibling still runs: {inst:?}");
    // Past the hand-back delay, another worker finds nothing to claim.
    world.clock.advance(test_config("A").permit_retry_ms);
    let out = other.tick().await.unwrap();
    assert!(matches!(out, RoundOutcome::Idle { .. }), "another worker claimed a running wave: {out:?}");
    assert_eq!(entries[1].load(Ordering::SeqCst), 1, "the running sibling was not re-entered");
    gate.notify_one();
    let out = claim.await.unwrap().unwrap();
    assert!(matches!(out, RoundOutcome::Ran { end: ClaimEnd::Released, .. }), "{out:?}");
    let inst = world.store.peek("wf").unwrap();
    assert!(inst.claim_token.is_none(), "handed back once every sibling returned");
    assert_eq!(inst.steps[1].status, StepStatus::Completed, "the sibling's completion is kept");
    world.drive_until(&engine, 50, &|| false).await.unwrap();
    let inst = world.store.peek("wf").unwrap();
    assert_eq!(inst.status, WorkflowStatus::Completed);
    assert_eq!(entries[1].load(Ordering::SeqCst), 1, "the slow sibling ran once");
}

/// A step whose completion is refused (the document would outgrow the store's size limit)
/// and whose failure with the store's reason is refused as well (that message does not fit
/// either) still fails once: the failure is written with a short fixed message, instead of
/// handing the claim back and re-running the step forever.
#[tokio::test]
async fn a_refused_failure_at_the_size_limit_still_fails_the_step_once() {
    // The size of the document while the step runs, with an empty padding.
    let probe = World::new(2);
    let seen = Arc::new(AtomicUsize::new(0));
    let def_sized = |store: testkit::memory::InMemoryStore, seen: Arc<AtomicUsize>, runs: Arc<AtomicUsize>| {
        Definition::builder("t")
            .step(StepDef::new("produce", move |_c: ActivityContext| {
                let (store, seen, runs) = (store.clone(), seen.clone(), runs.clone());
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let doc = store.peek("wf").unwrap();
                    seen.store(serde_json::to_vec(&doc).unwrap().len(), Ordering::SeqCst);
                    Ok(StepOutcome::complete(json!({ "blob": "x".repeat(4_000) })))
                }
            }))
            .build()
            .expect("valid")
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = probe.engine("w", vec![def_sized(probe.store.clone(), seen.clone(), runs.clone())]);
    let req = |pad: usize| StartRequest::new("t", "b", json!({ "pad": "p".repeat(pad) })).workflow_id("wf");
    engine.publisher().start_or_resume(req(0)).await.unwrap();
    probe.drive_until(&engine, 50, &|| false).await.unwrap();
    let base = seen.load(Ordering::SeqCst);
    assert!(base > 0);
    // A limit that leaves 100 bytes free while the step runs: the output does not fit, nor
    // does the store's reason (over 100 bytes); a short fixed message does.
    let limit = 8_192;
    let store = testkit::memory::InMemoryStore::new().with_document_bytes_max(limit);
    let world = World::with_memory_store(2, Default::default(), store);
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = world.engine("w", vec![def_sized(world.store.clone(), seen.clone(), runs.clone())]);
    engine.publisher().start_or_resume(req(limit - 100 - base)).await.unwrap();
    let report = world.drive_until(&engine, 50, &|| false).await.unwrap();
    let free = limit - seen.load(Ordering::SeqCst);
    assert!((90..=110).contains(&free), "bytes free while the step runs: {free}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "executions; claim ends {:?}", report.ends_of("wf"));
    let inst = world.store.peek("wf").unwrap();
    let e = permanent_error(&inst);
    assert!(e.message.contains("refused"), "{}", e.message);
    assert_eq!(report.ends_of("wf"), vec![ClaimEnd::Terminal(WorkflowStatus::Failed)]);
}

/// Defect 9 (K-15): a claim handed back after an unavailable store is observed as a
/// release, not as a finalizer's release.
#[tokio::test]
async fn a_hand_back_is_written_as_a_release() {
    let (_world, ends, _, kinds) = run_with(Answer::Unavailable).await;
    assert_eq!(ends.first(), Some(&ClaimEnd::Released), "{ends:?}");
    assert!(!kinds.contains(&TransitionKind::FinalizerRelease), "no finalizer ran: {kinds:?}");
    assert!(kinds.contains(&TransitionKind::Release), "{kinds:?}");
}

/// Defect 9 (K-13): a claim that ends uncertain puts the instance in its lane at the end of
/// its lease, when it becomes claimable again, instead of leaving it to the lane rebuild.
#[tokio::test]
async fn an_uncertain_claim_is_enqueued_at_its_lease_end() {
    let world = World::new(9);
    let runs = Arc::new(AtomicUsize::new(0));
    let mut ports = world.ports();
    ports.store = refusing(ports.store.clone(), Answer::Uncertain);
    let engine = world.engine_on(ports, test_config("w"), vec![def(json!({"ok": true}), runs.clone())]);
    world.start_as(&engine, "t", "b", "wf").await;
    let out = engine.tick().await.unwrap();
    assert!(matches!(out, RoundOutcome::Ran { end: ClaimEnd::Uncertain, .. }), "{out:?}");
    let lease_until = world.store.peek("wf").unwrap().claimable_time.expect("leased");
    assert!(world.queue.lane_of("wf").is_some(), "the instance is back in its lane");
    let before = Instant::from_millis(lease_until.as_millis() - 1);
    assert!(world.queue.pop_due(before, 1).await.unwrap().is_empty(), "not due before the lease ends");
    assert_eq!(world.queue.pop_due(lease_until, 1).await.unwrap(), [WorkflowId::from("wf")]);
}

/// K-6.4: a plain write the store refuses is counted on the instance with each hand-back
/// and bounded per run: the third refusal of a step's mark-running fails that step (through
/// the refusal ladder) and the workflow ends `failed`, instead of handing the claim back
/// forever.
#[tokio::test]
async fn refused_plain_writes_are_bounded_and_fail_the_workflow() {
    let world = World::new(9);
    let refusals = Arc::new(AtomicUsize::new(0));
    let r = refusals.clone();
    let store = Arc::new(ApplyHook {
        inner: Arc::new(world.audit.clone()),
        intercept: Box::new(move |_, _, t| {
            if t.kinds().any(|k| k == TransitionKind::MarkRunning) {
                r.fetch_add(1, Ordering::SeqCst);
                return Some(Intercepted::Fail(Error::invalid("document", "the row is over the store's limit")));
            }
            None
        }),
    });
    let mut ports = world.ports();
    ports.store = store;
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = world.engine_on(ports, test_config("w"), vec![def(json!(1), runs.clone())]);
    world.start_as(&engine, "t", "b", "wf").await;
    for _ in 0..20 {
        if world.store.peek("wf").unwrap().status.is_terminal() {
            break;
        }
        world.drive(&engine).await.unwrap();
        world.clock.advance(60_000);
    }
    let inst = world.store.peek("wf").unwrap();
    assert_eq!(inst.status, WorkflowStatus::Failed, "{inst:?}");
    assert_eq!(refusals.load(Ordering::SeqCst), kernel_core::engine::REFUSED_WRITES_MAX as usize);
    assert_eq!(inst.refused_writes, kernel_core::engine::REFUSED_WRITES_MAX - 1, "each hand-back counted the refusal");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the step never ran");
    let e = inst.steps[0].error.clone().expect("the failed step keeps the store's reason");
    assert!(e.message.contains("over the store's limit"), "{e:?}");
}

#[test]
fn k6_4_the_limit_of_refused_plain_writes_is_one_named_constant() {
    assert_eq!(kernel_core::engine::REFUSED_WRITES_MAX, 3);
}
