//! Engine behaviours, each tied to its requirement id.

use kernel_core::engine::{ClaimEnd, RoundOutcome};
use kernel_core::ports::*;
use kernel_core::transition::{Guard, Transition};
use kernel_core::*;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use testkit::harness::World;
use testkit::memory::PermitLimits;
use testkit::time::TestTime;

fn one_step(t: &str, a: impl Activity, f: impl FnOnce(StepDef) -> StepDef) -> Definition {
    Definition::builder(t).step(f(StepDef::new("only", a))).build().unwrap()
}

/// A one-step workflow `t` on `resource` whose activity counts its entries.
fn counting_step_on(resource: &str) -> (Definition, Arc<AtomicU32>) {
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let activity = move |_c: ActivityContext| {
        let r = r.clone();
        async move {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(StepOutcome::complete(json!(1)))
        }
    };
    (one_step("t", activity, |s| s.resource(resource)), runs)
}

async fn start(engine: &Engine, t: &str, biz: &str, input: Value) -> StartOutcome {
    engine.publisher().start_or_resume(StartRequest::new(t, biz, input).workflow_id(format!("wf-{biz}"))).await.unwrap()
}

async fn tick_end(engine: &Engine) -> ClaimEnd {
    match engine.tick().await.unwrap() {
        RoundOutcome::Ran { end, .. } => end,
        other => panic!("expected a claim, got {other:?}"),
    }
}

#[tokio::test]
async fn fingerprint_mismatch_pushes_back_without_touching_steps() {
    // K-4.3
    let world = World::new(1);
    let old = world.engine("old", vec![super::linear("t", 2, false)]);
    start(&old, "t", "b", json!({})).await;
    let new = world.engine("new", vec![super::linear("t", 3, false)]);
    let before = world.store.peek("wf-b").unwrap();
    let now = world.now();
    assert_eq!(tick_end(&new).await, ClaimEnd::PushedBack);
    let after = world.store.peek("wf-b").unwrap();
    assert_eq!(after.steps, before.steps, "no step touched");
    assert_eq!(after.status, WorkflowStatus::Running);
    assert_eq!(after.claimable_time, Some(now.plus(3_600_000)));
    assert_eq!(after.claim_token, None);
    assert_eq!(after.revision, before.revision + 1);
    let m = after.fingerprint_mismatch.unwrap();
    assert_eq!(m.persisted, before.definition_fingerprint);
    assert_ne!(m.worker, m.persisted);
}

/// A world whose resource `asr` (one slot) another owner holds, an engine whose one step
/// needs it, and workflow `wf-b` started on it.
async fn asr_held_by_another() -> (World, Engine, Arc<AtomicU32>, PermitOwner) {
    let limits = HashMap::from([("asr".to_string(), PermitLimits { max_concurrency: 1, max_starts_per_second: 0 })]);
    let world = World::with_limits(1, limits);
    let (def, runs) = counting_step_on("asr");
    let engine = world.engine("w", vec![def]);
    let other = PermitOwner { workflow_id: "x".into(), step: "s".into(), claim_token: "t".into() };
    assert!(matches!(world.permits.acquire("asr", &other).await.unwrap(), PermitDecision::Granted { .. }));
    start(&engine, "t", "b", json!({})).await;
    (world, engine, runs, other)
}

#[tokio::test]
async fn permit_denial_defers_without_counting_an_attempt() {
    // K-7.1 (permit), K-2.1, K-14
    let (world, engine, runs, other) = asr_held_by_another().await;
    let now = world.now();
    assert_eq!(tick_end(&engine).await, ClaimEnd::Released);
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!((i.steps[0].status, i.steps[0].attempt, i.steps[0].traffic_waits), (StepStatus::Pending, 0, 1));
    assert!(i.steps[0].traffic_wait_ms > 0);
    assert!(i.claimable_time.unwrap() > now && i.claim_token.is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the activity never ran unpermitted");
    world.permits.release("asr", &other).await.unwrap();
    world.drive(&engine).await.unwrap();
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!((i.status, i.steps[0].attempt), (WorkflowStatus::Completed, 1));
}

/// A step denied because the resource is full comes back after `permit_retry_ms`, not after
/// the adapter's hint (the soonest holder's lease end, 30 s here): a holder releases when its
/// activity returns, usually long before its lease ends, and a waiter deferred to the lease
/// end would starve while later arrivals take the freed slots (K-14: released "with a
/// wakeup", which finds only due waiters). A shorter hint (the start window) is kept.
#[tokio::test]
async fn a_full_resource_defers_by_the_retry_interval_not_the_holders_lease() {
    let (world, engine, _runs, other) = asr_held_by_another().await;
    let retry = engine.config().permit_retry_ms;
    let now = world.now();
    assert_eq!(tick_end(&engine).await, ClaimEnd::Released);
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!(
        i.claimable_time,
        Some(now.plus(retry.as_millis())),
        "deferred by permit_retry_ms ({retry}), not the 30 s lease"
    );

    // The start window's hint is exact and shorter: it is kept.
    let limits = HashMap::from([("ocr".to_string(), PermitLimits { max_concurrency: 0, max_starts_per_second: 1 })]);
    let world = World::with_limits(2, limits);
    let (def, _runs) = counting_step_on("ocr");
    let engine = world.engine("w", vec![def]);
    assert!(matches!(world.permits.acquire("ocr", &other).await.unwrap(), PermitDecision::Granted { .. }));
    world.clock.advance(900);
    start(&engine, "t", "c", json!({})).await;
    let now = world.now();
    assert_eq!(tick_end(&engine).await, ClaimEnd::Released);
    let i = world.store.peek("wf-c").unwrap();
    let waited = i.claimable_time.unwrap() - now;
    assert!(waited <= DurationMs::from_millis(100) && waited < engine.config().permit_retry_ms, "{waited}");
}

#[tokio::test]
async fn permit_errors_fail_closed() {
    // K-14: Redis error ⇒ defer, never run unpermitted.
    let world = World::new(1);
    let (def, runs) = counting_step_on("asr");
    let engine = world.engine("w", vec![def]);
    world.permits.set_down(true);
    start(&engine, "t", "b", json!({})).await;
    assert_eq!(tick_end(&engine).await, ClaimEnd::Released);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    world.permits.set_down(false);
    world.drive(&engine).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

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

fn signal_waiter(fact: Arc<Mutex<bool>>, generation: u64, poll: Option<i64>) -> Definition {
    one_step(
        "sig",
        move |c: ActivityContext| {
            let fact = fact.clone();
            async move {
                if *fact.lock().unwrap() {
                    return Ok(StepOutcome::complete(json!({ "resume": c.resume().map(|r| format!("{:?}", r.kind)) })));
                }
                let mut w =
                    StepOutcome::wait_for_signal("go", "key-1").generation(generation).checkpoint(json!({ "n": 1 }));
                if let Some(p) = poll {
                    w = w.poll_after_ms(p);
                }
                Ok(w.into())
            }
        },
        |s| s,
    )
}

fn sig(id: &str, generation: u64) -> Signal {
    Signal {
        signal_id: id.into(),
        workflow_id: "wf-b".into(),
        signal_type: "go".into(),
        wait_key: "key-1".into(),
        generation,
    }
}

#[tokio::test]
async fn signal_wait_suspends_in_one_write_and_a_signal_wakes_it_once() {
    // K-9.1, K-9.3, K-2.1
    let world = World::new(1);
    let fact = Arc::new(Mutex::new(false));
    let engine = world.engine("w", vec![signal_waiter(fact.clone(), 2, None)]);
    start(&engine, "sig", "b", json!({})).await;
    world.audit.reset_traffic();
    assert_eq!(tick_end(&engine).await, ClaimEnd::Suspended);
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!(world.audit.counts().writes, 3, "claim, mark running, SuspendClaim");
    assert_eq!((i.status, i.steps[0].status, i.steps[0].attempt), (WorkflowStatus::Waiting, StepStatus::Waiting, 0));
    assert_eq!((i.claim_token.clone(), i.claimable_time), (None, None));
    assert_eq!(i.steps[0].checkpoint, Some(json!({ "n": 1 })));
    // A stale generation never wakes it (K-9.6).
    assert_eq!(engine.deliver_signal(sig("s-old", 1)).await.unwrap(), DeliverOutcome::Pending);
    assert_eq!(world.store.peek("wf-b").unwrap().status, WorkflowStatus::Waiting);
    // Business fact first, then the doorbell.
    *fact.lock().unwrap() = true;
    assert_eq!(engine.deliver_signal(sig("s-1", 2)).await.unwrap(), DeliverOutcome::Activated);
    assert_eq!(engine.deliver_signal(sig("s-1", 2)).await.unwrap(), DeliverOutcome::Duplicate);
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!(i.resume.as_ref().unwrap().signal_id.as_deref(), Some("s-1"));
    world.drive(&engine).await.unwrap();
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!(i.status, WorkflowStatus::Completed);
    assert_eq!(i.output["only"], json!({ "resume": "Signal" }));
    assert_eq!(i.resume, None, "cleared by the completion of that step");
    assert_eq!(i.steps[0].attempt, 1);
}

#[tokio::test]
async fn early_signal_is_consumed_right_after_the_suspend() {
    // K-9.4
    let world = World::new(1);
    let fact = Arc::new(Mutex::new(false));
    let engine = world.engine("w", vec![signal_waiter(fact.clone(), 0, None)]);
    start(&engine, "sig", "b", json!({})).await;
    assert_eq!(engine.deliver_signal(sig("early", 0)).await.unwrap(), DeliverOutcome::Pending);
    assert_eq!(tick_end(&engine).await, ClaimEnd::Suspended);
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!(i.status, WorkflowStatus::Running, "the early signal woke it at once");
    assert_eq!(world.inbox.all()[0].status, SignalStatus::Matched);
}

#[tokio::test]
async fn poll_fallback_wakes_a_signal_wait() {
    // K-9.5, K-9.2
    let world = World::new(1);
    let fact = Arc::new(Mutex::new(false));
    let engine = world.engine("w", vec![signal_waiter(fact.clone(), 0, Some(60_000))]);
    start(&engine, "sig", "b", json!({})).await;
    assert_eq!(tick_end(&engine).await, ClaimEnd::Suspended);
    *fact.lock().unwrap() = true; // the callback was lost, the fact is there
    world.clock.advance(60_000);
    let rep = engine.maintain().await.unwrap();
    assert_eq!(rep.activated, 1);
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!(i.resume.as_ref().unwrap().kind, ResumeKind::Poll);
    world.drive(&engine).await.unwrap();
    assert_eq!(world.store.peek("wf-b").unwrap().output["only"], json!({ "resume": "Poll" }));
}

#[tokio::test]
async fn half_done_signal_match_is_finished_by_the_claimer() {
    // K-9.4: activation committed, inbox not marked.
    let world = World::new(1);
    let fact = Arc::new(Mutex::new(true));
    let engine = world.engine("w", vec![signal_waiter(Arc::new(Mutex::new(false)), 0, None)]);
    start(&engine, "sig", "b", json!({})).await;
    assert_eq!(tick_end(&engine).await, ClaimEnd::Suspended);
    world
        .inbox
        .insert(SignalRecord {
            signal_id: "s-1".into(),
            workflow_id: "wf-b".into(),
            signal_type: "go".into(),
            wait_key: "key-1".into(),
            generation: 0,
            status: SignalStatus::Pending,
            created_at: world.now(),
            match_time: None,
            orphan: false,
        })
        .await
        .unwrap();
    let id = WaitIdentity { signal_type: "go".into(), wait_key: "key-1".into(), generation: 0, step_index: 0 };
    let t = Transition::signal_activation(0, "s-1", world.now());
    assert!(world.store.apply(&"wf-b".into(), &Guard::SignalWait(id), &t).await.unwrap().applied());
    let _ = fact;
    world.queue.enqueue(&"wf-b".into(), Priority::P2, world.now()).await.unwrap();
    let _ = tick_end(&engine).await;
    assert_eq!(world.inbox.all()[0].status, SignalStatus::Matched, "marked before any step ran");
}

#[tokio::test]
async fn cancel_is_idempotent_and_a_late_signal_does_not_revive() {
    // K-8 (cancel / supersede)
    let world = World::new(1);
    let engine = world.engine("w", vec![signal_waiter(Arc::new(Mutex::new(false)), 0, None)]);
    start(&engine, "sig", "b", json!({})).await;
    tick_end(&engine).await;
    assert_eq!(engine.cancel(&"wf-b".into()).await.unwrap(), CancelOutcome::Canceled);
    assert_eq!(engine.cancel(&"wf-b".into()).await.unwrap(), CancelOutcome::NotActive);
    assert_eq!(engine.cancel(&"wf-missing".into()).await.unwrap(), CancelOutcome::NotActive);
    assert_eq!(engine.deliver_signal(sig("late", 0)).await.unwrap(), DeliverOutcome::Pending);
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!((i.status, i.wait.clone(), i.claim_token.clone()), (WorkflowStatus::Canceled, None, None));
}

#[tokio::test]
async fn activity_cancellation_cancels_the_workflow_without_finalizer() {
    // K-7.4 (1)
    let world = World::new(1);
    let finalized = Arc::new(AtomicU32::new(0));
    let f = finalized.clone();
    let def = Definition::builder("t")
        .step(
            StepDef::new("a", |_c: ActivityContext| async {
                Err::<StepOutcome, _>(ActivityError::canceled("object deleted"))
            })
            .max_retry(3),
        )
        .failure_finalizer(move |_c: ActivityContext| {
            let f = f.clone();
            async move {
                f.fetch_add(1, Ordering::SeqCst);
                Ok(StepOutcome::complete(json!(null)))
            }
        })
        .build()
        .unwrap();
    let engine = world.engine("w", vec![def]);
    start(&engine, "t", "b", json!({})).await;
    assert_eq!(tick_end(&engine).await, ClaimEnd::Terminal(WorkflowStatus::Canceled));
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!((i.steps[0].status, i.steps[0].attempt), (StepStatus::Skipped, 1));
    assert_eq!(finalized.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn failed_replay_keeps_completed_steps_and_only_one_replay_wins() {
    // K-5 (failed → replay), K-2.1, K-17.1
    let world = World::new(1);
    let keys: Arc<Mutex<Vec<String>>> = Arc::default();
    let k = keys.clone();
    let def = Definition::builder("t")
        .step(StepDef::new("a", |_c: ActivityContext| async { Ok(StepOutcome::complete(json!("a"))) }))
        .step(StepDef::new("b", move |c: ActivityContext| {
            let k = k.clone();
            async move {
                k.lock().unwrap().push(c.idempotency_key());
                if c.input()["fail"] == json!(true) {
                    Err(ActivityError::permanent("bad input"))
                } else {
                    Ok(StepOutcome::complete(json!("b")))
                }
            }
        }))
        .failure_finalizer(|_c: ActivityContext| async { Ok(StepOutcome::complete(json!(null))) })
        .build()
        .unwrap();
    let engine = world.engine("w", vec![def]);
    start(&engine, "t", "b", json!({ "fail": true })).await;
    world.drive(&engine).await.unwrap();
    let failed = world.store.peek("wf-b").unwrap();
    assert_eq!(failed.status, WorkflowStatus::Failed);
    // Failing/terminal: a start in `failing` would not activate; here the replay does.
    let p = engine.publisher();
    let (r1, r2) = tokio::join!(
        p.start_or_resume(StartRequest::new("t", "b", json!({ "fail": false }))),
        p.start_or_resume(StartRequest::new("t", "b", json!({ "fail": false })))
    );
    let (r1, r2) = (r1.unwrap(), r2.unwrap());
    assert_eq!([r1.execution_activated, r2.execution_activated].iter().filter(|a| **a).count(), 1, "one replay winner");
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!((i.status, i.retry_count), (WorkflowStatus::Running, 1));
    assert_eq!(i.steps[0].status, StepStatus::Completed, "completed steps kept");
    assert_eq!((i.steps[1].status, i.steps[1].attempt, i.steps[1].error.clone()), (StepStatus::Pending, 0, None));
    world.drive(&engine).await.unwrap();
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!(i.status, WorkflowStatus::Completed);
    let keys = keys.lock().unwrap().clone();
    assert_eq!(keys, vec!["4:wf-b|1:b|0".to_string(), "4:wf-b|1:b|1".to_string()], "a new logical attempt per round");
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
async fn priority_is_promote_only() {
    // K-5, K-13
    let world = World::new(1);
    let engine = world.engine("w", vec![super::linear("t", 1, false)]);
    let p = engine.publisher();
    p.start_or_resume(StartRequest::new("t", "b", json!({})).workflow_id("wf-b").priority(Priority::P3)).await.unwrap();
    assert_eq!(world.queue.lane_of("wf-b"), Some(Priority::P3));
    p.start_or_resume(StartRequest::new("t", "b", json!({})).priority(Priority::P1)).await.unwrap();
    assert_eq!(world.store.peek("wf-b").unwrap().business_priority, Priority::P1);
    assert_eq!(world.queue.lane_of("wf-b"), Some(Priority::P1));
    p.start_or_resume(StartRequest::new("t", "b", json!({})).priority(Priority::P3)).await.unwrap();
    assert_eq!(world.store.peek("wf-b").unwrap().business_priority, Priority::P1);
    assert_eq!(world.queue.lane_of("wf-b"), Some(Priority::P1));
}

#[tokio::test]
async fn queue_down_falls_back_to_the_store_and_a_flush_is_rebuilt() {
    // K-6.7, K-13
    let world = World::new(1);
    let engine = world.engine("w", vec![super::linear("t", 2, false)]);
    start(&engine, "t", "a", json!({})).await;
    start(&engine, "t", "b", json!({})).await;
    world.queue.set_down(true);
    assert!(matches!(engine.tick().await.unwrap(), RoundOutcome::Ran { .. }), "claimed straight from the store");
    world.queue.set_down(false);
    world.queue.flush();
    assert!(matches!(engine.tick().await.unwrap(), RoundOutcome::Idle { .. }));
    let rep = engine.maintain().await.unwrap();
    assert!(rep.enqueued >= 1);
    world.drive(&engine).await.unwrap();
    assert!(world.store.all().iter().all(|i| i.status == WorkflowStatus::Completed));
}

#[tokio::test]
async fn yield_hands_back_with_the_checkpoint_and_rolls_the_attempt_back() {
    // K-7.4 (yield), K-10
    let world = World::new(1);
    let def = one_step(
        "t",
        |c: ActivityContext| async move {
            let n = c.checkpoint().and_then(|v| v["cursor"].as_u64()).unwrap_or(0);
            if n < 3 {
                Ok(StepOutcome::yield_with(json!({ "cursor": n + 1 })))
            } else {
                Ok(StepOutcome::complete(json!(n)))
            }
        },
        |s| s,
    );
    let engine = world.engine("w", vec![def]);
    start(&engine, "t", "b", json!({})).await;
    assert_eq!(tick_end(&engine).await, ClaimEnd::Yielded);
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!(
        (i.steps[0].status, i.steps[0].attempt, i.steps[0].checkpoint.clone()),
        (StepStatus::Pending, 0, Some(json!({ "cursor": 1 })))
    );
    assert_eq!(i.claimable_time, Some(world.now()));
    world.drive(&engine).await.unwrap();
    let i = world.store.peek("wf-b").unwrap();
    assert_eq!((i.status, i.steps[0].attempt, i.output["only"].clone()), (WorkflowStatus::Completed, 1, json!(3)));
}

#[tokio::test]
async fn heartbeat_extends_the_lease_and_a_missed_heartbeat_cancels_the_activity() {
    // K-6.3
    let world = World::new(1);
    let def = one_step(
        "t",
        |c: ActivityContext| async move {
            c.cancellation().cancelled().await;
            Err(ActivityError::transient("claim lost"))
        },
        |s| s.timeout_ms(3_600_000),
    );
    let engine = world.engine("w", vec![def]);
    start(&engine, "t", "b", json!({})).await;
    let e = engine.clone();
    let h = tokio::spawn(async move { e.tick().await });
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    let lease1 = world.store.peek("wf-b").unwrap().claimable_time.unwrap();
    world.clock.advance(10_000);
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    let lease2 = world.store.peek("wf-b").unwrap().claimable_time.unwrap();
    assert_eq!(lease2, lease1.plus(10_000), "heartbeat at lease/3 moved the lease");
    // K-6.8: a cancel never takes the instance from its live claim: it is requested, the
    // holder's next heartbeat misses, its activity stops, and the holder applies it.
    let cancel = engine.cancel(&"wf-b".into()).await.unwrap();
    assert!(matches!(cancel, CancelOutcome::Requested { .. }), "supersede while running: {cancel:?}");
    assert_eq!(world.store.peek("wf-b").unwrap().claimable_time, Some(lease2), "the lease is not shortened");
    world.clock.advance(10_000);
    let out = h.await.unwrap().unwrap();
    assert!(matches!(out, RoundOutcome::Ran { end: ClaimEnd::Terminal(WorkflowStatus::Canceled), .. }), "{out:?}");
    assert_eq!(world.store.peek("wf-b").unwrap().status, WorkflowStatus::Canceled);
}

#[tokio::test]
async fn prepare_context_is_rebuilt_from_the_input_at_each_claim() {
    // K-2.3
    let world = World::new(1);
    let def = one_step("t", |c: ActivityContext| async move { Ok(StepOutcome::complete(c.prepared().clone())) }, |s| s);
    let mut ports = world.ports();
    ports.observer = Arc::new(NoopObservationSink);
    let engine = kernel_core::Engine::builder(ports)
        .register(def)
        .prepare_context(Arc::new(|i: &WorkflowInstance| Ok(json!({ "tenant": i.input["tenant"].clone() }))))
        .build()
        .unwrap();
    start(&engine, "t", "b", json!({ "tenant": "acme" })).await;
    world.drive(&engine).await.unwrap();
    assert_eq!(world.store.peek("wf-b").unwrap().output["only"], json!({ "tenant": "acme" }));
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

#[tokio::test]
async fn graceful_shutdown_lets_claims_finish_and_a_timeout_leaves_the_lease() {
    // K-6.6
    let world = World::new(1);
    let gate = Arc::new(tokio::sync::Notify::new());
    let g = gate.clone();
    let def = one_step(
        "t",
        move |_c: ActivityContext| {
            let g = g.clone();
            async move {
                g.notified().await;
                Ok(StepOutcome::complete(json!(1)))
            }
        },
        |s| s.timeout_ms(3_600_000),
    );
    // K-6.6: the observer is drained after the claims finished, through a shutdown hook.
    let drained_after: Arc<Mutex<Option<WorkflowStatus>>> = Arc::default();
    let (d, store) = (drained_after.clone(), world.store.clone());
    let hook: kernel_core::engine::ShutdownHook = Arc::new(move || {
        let (d, store) = (d.clone(), store.clone());
        Box::pin(async move {
            *d.lock().unwrap() = store.peek("wf-b").map(|i| i.status);
        })
    });
    let mut b = Engine::builder(world.ports()).config(testkit::harness::test_config("w")).on_shutdown(hook);
    b = b.register(def);
    let engine = b.build().unwrap();
    let running = engine.spawn();
    start(&engine, "t", "b", json!({})).await;
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    assert!(world.store.peek("wf-b").unwrap().claim_token.is_some(), "claimed via the wakeup");
    let shut = tokio::spawn(running.shutdown());
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    gate.notify_one();
    assert!(shut.await.unwrap(), "clean shutdown after the claim finished");
    assert_eq!(world.store.peek("wf-b").unwrap().status, WorkflowStatus::Completed);
    assert_eq!(*drained_after.lock().unwrap(), Some(WorkflowStatus::Completed), "hook ran after the claim");

    // Now a claim that never finishes: the shutdown times out and leaves the lease.
    let engine2 = world.engine(
        "w2",
        vec![one_step(
            "t2",
            |_c: ActivityContext| async { std::future::pending::<Result<StepOutcome, ActivityError>>().await },
            |s| s.timeout_ms(3_600_000),
        )],
    );
    let running = engine2.spawn();
    engine2.publisher().start_or_resume(StartRequest::new("t2", "c", json!({})).workflow_id("wf-c")).await.unwrap();
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    let shut = tokio::spawn(running.shutdown());
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    world.clock.advance(engine2.config().shutdown_timeout_ms);
    assert!(!shut.await.unwrap(), "timed out");
    let i = world.store.peek("wf-c").unwrap();
    assert!(i.claim_token.is_some(), "the lease is left to expire, never cleared");
}

#[tokio::test]
async fn stale_signals_are_purged_after_retention() {
    // Bound on inbox growth: a doorbell that never meets its wait does not stay forever.
    let world = World::new(1);
    let engine = world.engine("w", vec![signal_waiter(Arc::new(Mutex::new(false)), 3, None)]);
    start(&engine, "sig", "b", json!({})).await;
    tick_end(&engine).await;
    assert_eq!(engine.deliver_signal(sig("stale", 1)).await.unwrap(), DeliverOutcome::Pending);
    assert_eq!(engine.maintain().await.unwrap().signals_purged, 0, "kept within retention");
    world.clock.advance(engine.config().signal_retention_ms + DurationMs::from_millis(1));
    assert_eq!(engine.maintain().await.unwrap().signals_purged, 1);
    assert!(world.inbox.all().is_empty());
    assert_eq!(world.store.peek("wf-b").unwrap().status, WorkflowStatus::Waiting, "the wait is untouched");
}
