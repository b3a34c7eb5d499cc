//! Retries and errors (K-7.3, K-7.4, K-8, K-17.2): persisted retries with backoff, permanent
//! errors, timeouts, panics, the most severe outcome of a wave, a failing instance's finalizer.

use crate::support::{one_step, start, tick_end};
use kernel_core::engine::{ClaimEnd, RoundOutcome};
use kernel_core::*;
use serde_json::json;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use testkit::harness::World;

#[tokio::test]
async fn retries_are_persisted_with_backoff_and_unknown_outcomes_query_first() {
    // K-7.4 (2), K-17.2
    let world = World::new(3);
    type Seen = Vec<(u32, bool, Option<ErrorClass>)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let s = seen.clone();
    let def = one_step(
        "t",
        move |c: ActivityContext| {
            let s = s.clone();
            async move {
                s.lock().unwrap().push((c.attempt(), c.must_query_before_retry(), c.previous_error().map(|e| e.class)));
                match c.attempt() {
                    1 => Err(ActivityError::unknown_outcome("reply lost")),
                    2 => Err(ActivityError::transient("503")),
                    _ => Ok(StepOutcome::complete(json!("ok"))),
                }
            }
        },
        |s| {
            s.max_retry(2).retry(RetryPolicy::Exponential {
                base_ms: DurationMs::from_millis(1_000),
                cap_ms: DurationMs::from_millis(60_000),
            })
        },
    );
    let engine = world.engine("w", vec![def]);
    start(&engine, "t", "b", json!({})).await;
    let t0 = world.now();
    assert_eq!(tick_end(&engine).await, ClaimEnd::Released);
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!(i.steps[0].status, StepStatus::Pending);
    assert_eq!(i.steps[0].error.as_ref().unwrap().class, ErrorClass::UnknownOutcome);
    let delay = i.claimable_time.unwrap() - t0;
    assert!((0..=1_000).contains(&delay.as_millis()), "full jitter within base: {delay}");
    assert!(i.claim_token.is_none(), "retry is persisted, not slept in a task");
    world.drive(&engine).await.unwrap();
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!((i.status, i.steps[0].attempt), (WorkflowStatus::Completed, 3));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![(1, false, None), (2, true, Some(ErrorClass::UnknownOutcome)), (3, false, Some(ErrorClass::Transient))]
    );
}

#[tokio::test]
async fn permanent_errors_are_not_retried_and_immediate_policy_has_no_delay() {
    // K-17.2, K-7.4
    let world = World::new(1);
    let def = Definition::builder("t")
        .step(
            StepDef::new("flaky", |c: ActivityContext| async move {
                if c.attempt() == 1 {
                    Err(ActivityError::transient("blip"))
                } else {
                    Ok(StepOutcome::complete(json!(1)))
                }
            })
            .max_retry(5)
            .retry(RetryPolicy::Immediate),
        )
        .step(
            StepDef::new("bad", |_c: ActivityContext| async {
                Err::<StepOutcome, _>(ActivityError::permanent("schema mismatch"))
            })
            .max_retry(5),
        )
        .build()
        .unwrap();
    let engine = world.engine("w", vec![def]);
    start(&engine, "t", "b", json!({})).await;
    let now = world.now();
    assert_eq!(tick_end(&engine).await, ClaimEnd::Released);
    assert_eq!(world.store.peek("wf-b").unwrap().claimable_time, Some(now));
    world.drive(&engine).await.unwrap();
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!(i.status, WorkflowStatus::Failed);
    assert_eq!((i.steps[1].status, i.steps[1].attempt), (StepStatus::Failed, 1));
    assert_eq!(i.steps[1].checkpoint, None);
}

#[tokio::test]
async fn timeout_cancels_and_waits_for_the_activity_to_return() {
    // K-7.3
    let world = World::new(1);
    let returned = Arc::new(AtomicU32::new(0));
    let r = returned.clone();
    let def = one_step(
        "t",
        move |c: ActivityContext| {
            let r = r.clone();
            async move {
                c.cancellation().cancelled().await;
                r.fetch_add(1, Ordering::SeqCst);
                Err(ActivityError::transient("cancelled"))
            }
        },
        |s| s.timeout_ms(5_000),
    );
    let engine = world.engine("w", vec![def]);
    start(&engine, "t", "b", json!({})).await;
    let e = engine.clone();
    let h = tokio::spawn(async move { e.tick().await });
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert!(!h.is_finished(), "the activity is still running");
    world.clock.advance(5_000);
    let out = h.await.unwrap().unwrap();
    assert!(matches!(out, RoundOutcome::Ran { end: ClaimEnd::Terminal(WorkflowStatus::Failed), .. }), "{out:?}");
    assert_eq!(returned.load(Ordering::SeqCst), 1, "the engine waited for the activity to return");
    let i = world.store.peek("wf-b").unwrap();
    assert!(i.steps[0].error.as_ref().unwrap().message.contains("timed out"));
}

#[tokio::test]
async fn panics_become_step_errors() {
    // K-7.3
    let world = World::new(1);
    let def = one_step(
        "t",
        |_c: ActivityContext| async move {
            if true {
                panic!("boom");
            }
            Ok(StepOutcome::complete(json!(1)))
        },
        |s| s,
    );
    let engine = world.engine("w", vec![def]);
    start(&engine, "t", "b", json!({})).await;
    world.drive(&engine).await.unwrap();
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!(i.status, WorkflowStatus::Failed);
    assert_eq!(i.steps[0].error.as_ref().unwrap().message, "panic: boom");
}

#[tokio::test]
async fn failing_instance_is_not_activated_and_the_finalizer_retries() {
    // K-5 (failing), K-8
    let world = World::new(1);
    let calls = Arc::new(AtomicU32::new(0));
    let c2 = calls.clone();
    let def = Definition::builder("t")
        .step(StepDef::new("a", |_c: ActivityContext| async { Err::<StepOutcome, _>(ActivityError::permanent("no")) }))
        .failure_finalizer(move |_c: ActivityContext| {
            let c = c2.clone();
            async move {
                if c.fetch_add(1, Ordering::SeqCst) == 0 {
                    Err(ActivityError::transient("business store down"))
                } else {
                    Ok(StepOutcome::complete(json!(null)))
                }
            }
        })
        .build()
        .unwrap();
    let engine = world.engine("w", vec![def]);
    start(&engine, "t", "b", json!({})).await;
    assert_eq!(tick_end(&engine).await, ClaimEnd::Released);
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!((i.status, i.claim_token.clone()), (WorkflowStatus::Failing, None));
    let again = engine.publisher().start_or_resume(StartRequest::new("t", "b", json!({}))).await.unwrap();
    assert!(!again.execution_activated && !again.created);
    world.drive(&engine).await.unwrap();
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!((i.status, i.steps[0].attempt), (WorkflowStatus::Failed, 1), "failed steps never re-run");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn wave_outcome_most_severe_wins_and_suspending_sibling_is_parked() {
    // K-4.5
    let world = World::new(1);
    let def = Definition::builder("t")
        .step(StepDef::new("root", |_c: ActivityContext| async { Ok(StepOutcome::complete(json!(0))) }))
        .step(
            StepDef::new("fails", |_c: ActivityContext| async {
                Err::<StepOutcome, _>(ActivityError::permanent("no"))
            })
            .depends_on(["root"]),
        )
        .step(
            StepDef::new("sleeps", |_c: ActivityContext| async { Ok(StepOutcome::sleep(1_000, json!({ "cp": 1 }))) })
                .depends_on(["root"]),
        )
        .step(
            StepDef::new("ok", |_c: ActivityContext| async { Ok(StepOutcome::complete(json!(1))) })
                .depends_on(["root"]),
        )
        .build()
        .unwrap();
    let engine = world.engine("w", vec![def]);
    start(&engine, "t", "b", json!({})).await;
    assert_eq!(tick_end(&engine).await, ClaimEnd::Terminal(WorkflowStatus::Failed));
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!(i.steps[1].status, StepStatus::Failed);
    assert_eq!(
        (i.steps[2].status, i.steps[2].attempt, i.steps[2].checkpoint.clone()),
        (StepStatus::Pending, 0, Some(json!({ "cp": 1 })))
    );
    assert_eq!(i.steps[3].status, StepStatus::Completed, "a sibling commits its own completion");
    assert_eq!(i.wait, None);
}
