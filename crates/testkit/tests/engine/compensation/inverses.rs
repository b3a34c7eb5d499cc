//! Compensation declarations (K-17.6): a side-effecting step declares its idempotent
//! inverse, a step that nothing can undo is marked irreversible, and a definition that lets
//! an irreversible step run before a compensable one is refused when it is built.

use crate::support::refused;
use kernel_core::*;
use serde_json::json;

fn step(name: &str) -> StepDef {
    StepDef::new(name, |_: ActivityContext| async { Ok(StepOutcome::complete(json!(null))) })
}

fn inverse() -> impl Activity {
    |_: ActivityContext| async { Ok(StepOutcome::complete(json!("reversed"))) }
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

// --- the failure path's compensation (K-17.6) ----------------------------------------------

mod failure_path {
    use kernel_core::compensation::{CompensationOutcome, InverseResult};
    use kernel_core::ports::{Clock, TaskStatus};
    use kernel_core::*;
    use serde_json::json;
    use std::sync::{Arc, Mutex};
    use testkit::harness::World;

    /// What the fake downstream saw: (activity, idempotency key), in order.
    type Log = Arc<Mutex<Vec<(String, String)>>>;

    fn effect(name: &'static str, log: &Log) -> impl Activity {
        let log = log.clone();
        move |c: ActivityContext| {
            let log = log.clone();
            async move {
                log.lock().unwrap().push((name.to_string(), c.idempotency_key()));
                Ok(StepOutcome::complete(json!(name)))
            }
        }
    }

    /// An inverse that fails transiently `fails` times (per key), then completes.
    fn flaky_inverse(name: &'static str, fails: usize, log: &Log) -> impl Activity {
        let log = log.clone();
        move |c: ActivityContext| {
            let log = log.clone();
            async move {
                let key = c.idempotency_key();
                let mut l = log.lock().unwrap();
                let seen = l.iter().filter(|(n, k)| n == name && *k == key).count();
                l.push((name.to_string(), key));
                assert!(c.is_compensation(), "an inverse knows it compensates");
                if seen < fails {
                    Err(ActivityError::transient("ledger unavailable"))
                } else {
                    Ok(StepOutcome::complete(json!("reversed")))
                }
            }
        }
    }

    fn failing() -> impl Activity {
        |_: ActivityContext| async { Err::<StepOutcome, _>(ActivityError::permanent("vendor unknown")) }
    }

    /// reserve → post → (notify fails): both completed steps are undone, the later one first.
    fn def(log: &Log, post_inverse_fails: usize) -> Definition {
        Definition::builder("inv")
            .step(StepDef::new("reserve", effect("reserve", log)).compensate_with(flaky_inverse("unreserve", 0, log)))
            .step(StepDef::new("post", effect("post", log)).depends_on(["reserve"]).compensate_with(flaky_inverse(
                "reverse",
                post_inverse_fails,
                log,
            )))
            .step(StepDef::new("check", failing()).depends_on(["post"]))
            .step(StepDef::new("archive", effect("archive", log)).compensate_with(flaky_inverse("unarchive", 0, log)))
            .build()
            .unwrap()
    }

    async fn run(world: &World, engine: &Engine) -> WorkflowInstance {
        let req = StartRequest::new("inv", "i-1", json!({})).workflow_id("wf-i-1");
        engine.publisher().start_or_resume(req).await.unwrap();
        world.drive(engine).await.unwrap();
        world.store.peek("wf-i-1").unwrap()
    }

    /// K-17.6: the inverses of the completed compensable steps run in reverse completion
    /// order, each once, with its own key derived from the original's; a compensable step
    /// that did not complete (`archive`, independent of the failure) is undone only if it
    /// completed; the report says `recovered` and is stored with `failed`.
    #[tokio::test]
    async fn inverses_run_in_reverse_completion_order_with_derived_keys() {
        let world = World::new(7);
        let log: Log = Default::default();
        let engine = world.engine("w", vec![def(&log, 0)]);
        let inst = run(&world, &engine).await;
        assert_eq!(inst.status, WorkflowStatus::Failed);
        let log = log.lock().unwrap().clone();
        let key = |n: &str| log.iter().find(|(a, _)| a == n).map(|(_, k)| k.clone()).unwrap();
        let inverses: Vec<&str> =
            log.iter().map(|(n, _)| n.as_str()).filter(|n| ["unreserve", "reverse", "unarchive"].contains(n)).collect();
        // The order is the reverse of the store's completion order (the revision of each
        // step's completing write; a dependent, `post` of `reserve`, always first), then
        // the later step. The undone steps are failed ("compensated"), so a replay runs
        // them again.
        let done: Vec<(usize, u64)> = inst
            .steps
            .iter()
            .enumerate()
            .filter(|(_, s)| s.error.as_ref().is_some_and(|e| e.message.starts_with("compensated")))
            .map(|(i, s)| (i, s.completed_revision.expect("stamped")))
            .collect();
        assert!(done.iter().all(|(i, _)| inst.steps[*i].status == StepStatus::Failed));
        let mut expected = done.clone();
        expected.sort_by(|a, b| b.1.cmp(&a.1).then(b.0.cmp(&a.0)));
        assert_eq!(&inverses[..2], ["reverse", "unreserve"], "post is undone before reserve: {log:?}");
        let names = ["unreserve", "reverse", "check", "unarchive"];
        assert_eq!(inverses, expected.iter().map(|(i, _)| names[*i]).collect::<Vec<_>>(), "{log:?}");
        assert_eq!(key("reverse"), format!("{}|c", key("post")), "derived from the original's key");
        assert_eq!(key("unreserve"), format!("{}|c", key("reserve")));
        let report = inst.compensation.expect("recorded on the instance");
        assert_eq!(report.outcome, CompensationOutcome::Recovered);
        assert!(report.steps.iter().all(|r| r.result == InverseResult::Compensated && r.attempts == 1), "{report:?}");
        assert_eq!(report.steps.len(), done.len(), "one inverse per completed compensable step");
        assert!(done.len() >= 2, "reserve and post completed: {done:?}");
    }

    /// A clock that runs `ms` behind the world's: another process's clock, skewed.
    struct Behind {
        world: Arc<testkit::memory::ManualClock>,
        ms: i64,
    }

    #[async_trait::async_trait]
    impl Clock for Behind {
        fn now(&self) -> Instant {
            Instant::from_millis(self.world.now().as_millis() - self.ms)
        }
        async fn sleep_until(&self, t: Instant) {
            self.world.sleep_until(Instant::from_millis(t.as_millis() + self.ms)).await
        }
    }

    /// Regression (K-17.6 amendment): `capture` depends on `reserve`; `reserve` and the
    /// independent `audit` complete on one worker, `capture` (after a signal) on a second
    /// whose clock runs a minute behind, so its stored completion time is *earlier* than
    /// `reserve`'s. The compensation still refunds the capture before it releases the
    /// reservation (the dependency order, not the clocks), and the independent steps go
    /// by the store's completion order (the revision of the completing write).
    #[tokio::test]
    async fn a_dependent_is_undone_before_its_dependency_whatever_the_clocks_say() {
        let world = World::new(17);
        let log: Log = Default::default();
        let captured = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let capture = {
            let (log, captured) = (log.clone(), captured.clone());
            move |c: ActivityContext| {
                let (log, captured) = (log.clone(), captured.clone());
                async move {
                    if !captured.load(std::sync::atomic::Ordering::SeqCst) {
                        return Ok(StepOutcome::wait_for_signal("captured", "k").into());
                    }
                    log.lock().unwrap().push(("capture".to_string(), c.idempotency_key()));
                    Ok(StepOutcome::complete(json!("capture")))
                }
            }
        };
        let def = || {
            Definition::builder("inv")
                .step(StepDef::new("reserve", effect("reserve", &log)).compensate_with(flaky_inverse(
                    "unreserve",
                    0,
                    &log,
                )))
                .step(
                    StepDef::new("capture", capture.clone())
                        .depends_on(["reserve"])
                        .compensate_with(flaky_inverse("refund", 0, &log)),
                )
                .step(StepDef::new("audit", effect("audit", &log)).compensate_with(flaky_inverse("unaudit", 0, &log)))
                .step(StepDef::new("check", failing()).depends_on(["capture"]))
                .build()
                .unwrap()
        };
        let ahead = world.engine("ahead", vec![def()]);
        let mut ports = world.ports();
        ports.clock = Arc::new(Behind { world: world.clock.clone(), ms: 60_000 });
        let behind = world.engine_on(ports, testkit::harness::test_config("behind"), vec![def()]);
        let req = StartRequest::new("inv", "i-1", json!({})).workflow_id("wf-i-1");
        ahead.publisher().start_or_resume(req).await.unwrap();
        world.drive(&ahead).await.unwrap();
        let parked = world.store.peek("wf-i-1").unwrap();
        assert_eq!((parked.status, parked.steps[1].status), (WorkflowStatus::Waiting, StepStatus::Waiting));
        captured.store(true, std::sync::atomic::Ordering::SeqCst);
        let signal = kernel_core::ports::Signal {
            signal_id: "s-1".into(),
            workflow_id: "wf-i-1".into(),
            signal_type: "captured".into(),
            wait_key: "k".into(),
            generation: 0,
        };
        behind.deliver_signal(signal).await.unwrap();
        world.drive(&behind).await.unwrap();
        let inst = world.store.peek("wf-i-1").unwrap();
        assert_eq!(inst.status, WorkflowStatus::Failed);
        // The premise: the capture's stored time is a minute before the reservation's.
        let (reserve, capture) = (&inst.steps[0], &inst.steps[1]);
        assert!(capture.finished_at < reserve.finished_at, "{:?} vs {:?}", capture.finished_at, reserve.finished_at);
        let names: Vec<String> = log.lock().unwrap().iter().map(|(n, _)| n.clone()).collect();
        let inverses: Vec<&str> =
            names.iter().map(String::as_str).filter(|n| ["unreserve", "refund", "unaudit"].contains(n)).collect();
        let at = |n: &str| inverses.iter().position(|i| *i == n).unwrap_or_else(|| panic!("{n} ran: {names:?}"));
        assert!(
            at("refund") < at("unreserve"),
            "the capture is refunded before its reservation is released: {names:?}"
        );
        // The independent `audit` goes by the store's completion order (the revision of
        // its completing write), placed among the others accordingly.
        let rev = |i: usize| inst.steps[i].completed_revision.expect("stamped by its completing write");
        assert!(rev(1) > rev(0), "the capture's write came after the reservation's");
        let expected = match rev(2) {
            r if r > rev(1) => ["unaudit", "refund", "unreserve"],
            r if r > rev(0) => ["refund", "unaudit", "unreserve"],
            _ => ["refund", "unreserve", "unaudit"],
        };
        assert_eq!(inverses, expected, "{names:?}");
    }

    /// Regression (K-17.6 amendment, K-2.3): inverses run only with their prepared context.
    /// `reserve` completes while PrepareContext works; then it keeps failing. At
    /// `prepare_attempts_max` the workflow fails without running any business code — no
    /// inverse, no failure finalizer (both used to run with `prepared = null`) — and the
    /// completed step is escalated to a person once; the report says `escalated`.
    #[tokio::test]
    async fn without_a_prepared_context_no_inverse_runs_and_a_person_is_asked_once() {
        let world = World::new(18);
        let log: Log = Default::default();
        let seen = |name: &'static str, log: &Log| {
            let log = log.clone();
            move |c: ActivityContext| {
                let log = log.clone();
                async move {
                    log.lock().unwrap().push((name.to_string(), c.prepared().to_string()));
                    Ok(StepOutcome::complete(json!(name)))
                }
            }
        };
        // `check` waits for a signal; when it comes, PrepareContext is down.
        let check = |_: ActivityContext| async { Ok(StepOutcome::wait_for_signal("go", "k").into()) };
        let def = Definition::builder("inv")
            .step(StepDef::new("reserve", effect("reserve", &log)).compensate_with(seen("unreserve", &log)))
            .step(StepDef::new("check", check).depends_on(["reserve"]))
            .failure_finalizer(seen("finalizer", &log))
            .build()
            .unwrap();
        let broken = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let hook = {
            let broken = broken.clone();
            move |_: &WorkflowInstance| {
                if broken.load(std::sync::atomic::Ordering::SeqCst) {
                    Err("tenant directory down".to_string())
                } else {
                    Ok(json!({ "tenant": "t-1" }))
                }
            }
        };
        let config = testkit::harness::test_config("w");
        let attempts_max = config.prepare_attempts_max;
        let engine = Engine::builder(world.ports())
            .config(config)
            .register(def)
            .prepare_context(Arc::new(hook))
            .build()
            .unwrap();
        let req = StartRequest::new("inv", "i-1", json!({})).workflow_id("wf-i-1");
        engine.publisher().start_or_resume(req).await.unwrap();
        world.drive(&engine).await.unwrap();
        let parked = world.store.peek("wf-i-1").unwrap();
        assert_eq!((parked.status, parked.steps[0].status), (WorkflowStatus::Waiting, StepStatus::Completed));
        broken.store(true, std::sync::atomic::Ordering::SeqCst);
        let signal = kernel_core::ports::Signal {
            signal_id: "s-1".into(),
            workflow_id: "wf-i-1".into(),
            signal_type: "go".into(),
            wait_key: "k".into(),
            generation: 0,
        };
        engine.deliver_signal(signal).await.unwrap();
        world.drive(&engine).await.unwrap();
        let inst = world.store.peek("wf-i-1").unwrap();
        assert_eq!((inst.status, inst.prepare_failures), (WorkflowStatus::Failed, attempts_max));
        let log = log.lock().unwrap().clone();
        let business: Vec<&(String, String)> = log.iter().filter(|(n, _)| n != "reserve").collect();
        assert!(business.is_empty(), "no business code ran without its context: {business:?}");
        assert_eq!(inst.steps[0].status, StepStatus::Completed, "nothing was undone");
        let report = inst.compensation.expect("the report says what did not run");
        assert_eq!(report.outcome, CompensationOutcome::Escalated, "{report:?}");
        let r = &report.steps[0];
        assert_eq!((r.step.as_str(), r.result, r.attempts), ("reserve", InverseResult::Escalated, 0));
        assert!(r.error.as_deref().unwrap().contains("no prepared context"), "{r:?}");
        let tasks = world.task_inbox.all();
        assert_eq!(tasks.len(), 1, "escalated once: {tasks:?}");
        assert_eq!((Some(tasks[0].id.as_str()), tasks[0].status), (r.task.as_deref(), TaskStatus::Open));
        assert!(tasks[0].title.contains("no inverse ran"), "{}", tasks[0].title);
    }

    /// K-17.6: a transient failure of an inverse is retried (attempts counted); one that
    /// keeps failing is escalated to a person — a task in the inbox, roles from the config —
    /// not dropped, and the report says `escalated`.
    #[tokio::test]
    async fn an_inverse_that_keeps_failing_escalates_to_a_person() {
        let world = World::new(8);
        let log: Log = Default::default();
        let engine = world.engine("w", vec![def(&log, 10)]);
        let inst = run(&world, &engine).await;
        let report = inst.compensation.expect("recorded");
        assert_eq!(report.outcome, CompensationOutcome::Escalated, "{report:?}");
        let post = report.steps.iter().find(|r| r.step == "post").unwrap();
        assert_eq!((post.result, post.attempts), (InverseResult::Escalated, 3));
        assert!(post.error.as_deref().unwrap().contains("ledger unavailable"));
        let reverse_calls = log.lock().unwrap().iter().filter(|(n, _)| n == "reverse").count();
        assert_eq!(reverse_calls, 3, "three attempts, then a person");
        let tasks = world.task_inbox.all();
        assert_eq!(tasks.len(), 1);
        let t = &tasks[0];
        assert_eq!(
            (Some(t.id.as_str()), t.status, t.roles.clone()),
            (post.task.as_deref(), TaskStatus::Open, vec!["operator".to_string()])
        );
        assert!(t.title.contains("post"), "{}", t.title);
        let reserve = report.steps.iter().find(|r| r.step == "reserve").unwrap();
        assert_eq!(reserve.result, InverseResult::Compensated, "the other inverses still ran");
    }

    /// K-17.6: without a task inbox the inverse that kept failing is recorded as failed and
    /// the others' success makes it `partially_recovered`; a recovered retry within the
    /// attempts makes it `recovered`.
    #[tokio::test]
    async fn without_an_inbox_a_failing_inverse_is_recorded_failed() {
        let world = World::new(9);
        let log: Log = Default::default();
        let mut ports = world.ports();
        ports.task_inbox = None;
        let engine = world.engine_on(ports, testkit::harness::test_config("w"), vec![def(&log, 10)]);
        let report = run(&world, &engine).await.compensation.unwrap();
        assert_eq!(report.outcome, CompensationOutcome::PartiallyRecovered, "{report:?}");
        assert_eq!(report.steps.iter().find(|r| r.step == "post").unwrap().result, InverseResult::Failed);
        assert!(world.task_inbox.all().is_empty());

        let world = World::new(10);
        let log: Log = Default::default();
        let engine = world.engine("w", vec![def(&log, 2)]);
        let report = run(&world, &engine).await.compensation.unwrap();
        assert_eq!(report.outcome, CompensationOutcome::Recovered);
        assert_eq!(report.steps.iter().find(|r| r.step == "post").unwrap().attempts, 3);
    }

    /// A definition without inverses records no report; a successful workflow runs none.
    #[tokio::test]
    async fn no_inverse_no_report_and_success_runs_none() {
        let world = World::new(11);
        let log: Log = Default::default();
        let plain = Definition::builder("inv")
            .step(StepDef::new("post", effect("post", &log)))
            .step(StepDef::new("check", failing()).depends_on(["post"]))
            .build()
            .unwrap();
        let engine = world.engine("w", vec![plain]);
        let inst = run(&world, &engine).await;
        assert_eq!((inst.status, inst.compensation), (WorkflowStatus::Failed, None));

        let world = World::new(12);
        let log: Log = Default::default();
        let ok = Definition::builder("inv")
            .step(StepDef::new("post", effect("post", &log)).compensate_with(flaky_inverse("reverse", 0, &log)))
            .build()
            .unwrap();
        let engine = world.engine("w", vec![ok]);
        let inst = run(&world, &engine).await;
        assert_eq!((inst.status, inst.compensation), (WorkflowStatus::Completed, None));
        assert!(log.lock().unwrap().iter().all(|(n, _)| n != "reverse"));
    }

    /// Regression (K-17.6): an inverse whose error carries a NUL (a binary reply body)
    /// still gets its report written — the text is made printable — instead of the failed
    /// write being refused on every claim and the instance staying `failing`.
    #[tokio::test]
    async fn an_inverse_error_with_a_nul_is_recorded() {
        let world = World::new(13);
        let log: Log = Default::default();
        let nul =
            |_: ActivityContext| async { Err::<StepOutcome, _>(ActivityError::permanent("ledger said \0\u{1}x")) };
        let def = Definition::builder("inv")
            .step(StepDef::new("post", effect("post", &log)).compensate_with(nul))
            .step(StepDef::new("check", failing()).depends_on(["post"]))
            .build()
            .unwrap();
        let engine = world.engine("w", vec![def]);
        let inst = run(&world, &engine).await;
        assert_eq!(inst.status, WorkflowStatus::Failed);
        let report = inst.compensation.unwrap();
        assert_eq!(report.steps[0].error.as_deref(), Some("ledger said   x"));
        assert_eq!(report.outcome, CompensationOutcome::Escalated);
        assert_eq!(world.task_inbox.all().len(), 1);
    }

    /// K-17.6: a workflow canceled during its compensation stops it: the inverses after the
    /// cancel are not started, nothing is escalated for them, and no report is written.
    #[tokio::test]
    async fn a_cancel_during_the_compensation_stops_it_without_escalating() {
        let world = World::new(14);
        let log: Log = Default::default();
        let engine_cell: Arc<std::sync::OnceLock<Engine>> = Default::default();
        let cancel_then_fail = {
            let (cell, log) = (engine_cell.clone(), log.clone());
            move |c: ActivityContext| {
                let (cell, log) = (cell.clone(), log.clone());
                async move {
                    log.lock().unwrap().push(("reverse".into(), c.idempotency_key()));
                    let engine = cell.get().expect("engine set").clone();
                    assert!(matches!(
                        engine.cancel(&c.workflow_id().into()).await.unwrap(),
                        kernel_core::CancelOutcome::Requested { .. }
                    ));
                    Err::<StepOutcome, _>(ActivityError::transient("ledger unavailable"))
                }
            }
        };
        let def = Definition::builder("inv")
            .step(StepDef::new("reserve", effect("reserve", &log)).compensate_with(flaky_inverse("unreserve", 0, &log)))
            .step(StepDef::new("post", effect("post", &log)).depends_on(["reserve"]).compensate_with(cancel_then_fail))
            .step(StepDef::new("check", failing()).depends_on(["post"]))
            .build()
            .unwrap();
        let engine = world.engine("w", vec![def]);
        engine_cell.set(engine.clone()).ok();
        let inst = run(&world, &engine).await;
        assert_eq!(inst.status, WorkflowStatus::Canceled);
        // The progress recorded before the cancel stays: what was started, never finished.
        let progress = inst.compensation.expect("the progress recorded before the cancel");
        assert_eq!(progress.outcome, CompensationOutcome::InProgress);
        assert_eq!(
            progress.steps.iter().map(|r| (r.step.as_str(), r.result, r.attempts)).collect::<Vec<_>>(),
            vec![("post", InverseResult::Retrying, 1)]
        );
        let names: Vec<String> = log.lock().unwrap().iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(names.iter().filter(|n| *n == "reverse").count(), 1, "no retry after the cancel: {names:?}");
        assert!(!names.contains(&"unreserve".to_string()), "no inverse started after the cancel: {names:?}");
        assert!(world.task_inbox.all().is_empty(), "nothing escalated for a canceled claim");
    }

    /// K-17.6 with K-5: a replay after a compensated failure runs the undone steps again
    /// (their effect was reversed), under the new run's keys.
    #[tokio::test]
    async fn a_replay_runs_the_undone_steps_again() {
        let world = World::new(15);
        let log: Log = Default::default();
        let broken = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let check = {
            let broken = broken.clone();
            move |_: ActivityContext| {
                let broken = broken.load(std::sync::atomic::Ordering::SeqCst);
                async move {
                    if broken {
                        Err(ActivityError::permanent("vendor unknown"))
                    } else {
                        Ok(StepOutcome::complete(json!("ok")))
                    }
                }
            }
        };
        let def = Definition::builder("inv")
            .step(StepDef::new("post", effect("post", &log)).compensate_with(flaky_inverse("reverse", 0, &log)))
            .step(StepDef::new("check", check).depends_on(["post"]))
            .build()
            .unwrap();
        let engine = world.engine("w", vec![def]);
        assert_eq!(run(&world, &engine).await.status, WorkflowStatus::Failed);
        broken.store(false, std::sync::atomic::Ordering::SeqCst);
        let inst = run(&world, &engine).await;
        assert_eq!((inst.status, inst.compensation), (WorkflowStatus::Completed, None));
        let posts: Vec<String> =
            log.lock().unwrap().iter().filter(|(n, _)| n == "post").map(|(_, k)| k.clone()).collect();
        assert_eq!(posts.len(), 2, "posted, reversed, posted again: {posts:?}");
        assert_ne!(posts[0], posts[1], "the new run's key");
    }

    /// K-17.6: the outcome is observable — the terminal frame of the workflow's progress
    /// stream carries it next to the status.
    #[tokio::test]
    async fn the_outcome_is_in_the_terminal_stream_frame() {
        let world = World::new(16);
        let log: Log = Default::default();
        let def = Definition::builder("inv")
            .step(
                StepDef::new("post", effect("post", &log))
                    .compensate_with(flaky_inverse("reverse", 0, &log))
                    .streaming(),
            )
            .step(StepDef::new("check", failing()).depends_on(["post"]))
            .build()
            .unwrap();
        let engine = world.engine("w", vec![def]);
        assert_eq!(run(&world, &engine).await.status, WorkflowStatus::Failed);
        let keys = world.streams.keys();
        assert_eq!(keys.len(), 1);
        let terminal = world.streams.get(&keys[0]).and_then(|s| s.terminal).expect("terminal frame");
        assert_eq!(
            (terminal["status"].as_str(), terminal["compensation"].as_str()),
            (Some("failed"), Some("recovered"))
        );
    }
}
