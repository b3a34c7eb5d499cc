//! The seed's story as a library, so it can run on any durable store.

use super::business::{Business, FakeAsr};
use super::workflows::{self, CrashHook};
use crate::faults::{CrashPlan, CrashPorts, CrashSwitch};
use crate::harness::{test_config, BoxFuture, World};
use crate::memory::PermitLimits;
use kernel_core::engine::{Engine, RoundOutcome};
use kernel_core::ports::Observation;
use kernel_core::transition::TransitionKind;
use kernel_core::{Priority, StartRequest};
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The four workers of the story.
pub const WORKERS: [&str; 4] = ["A", "B", "C", "D"];

/// One line of the timeline for a committed transition.
pub fn describe(o: &Observation) -> String {
    let step = o.step_name.as_deref().map(|s| format!(" {s}")).unwrap_or_default();
    let what = match o.kind {
        TransitionKind::Create => format!("StartOrResume registers {}", o.workflow_id),
        TransitionKind::Replay => format!("StartOrResume replays {}", o.workflow_id),
        TransitionKind::Claim => format!("claims {}", o.workflow_id),
        TransitionKind::MarkRunning => format!("starts{step} (attempt {})", o.attempt),
        TransitionKind::CompleteStep => format!("completes{step}"),
        TransitionKind::SuspendClaim => format!("suspends{step}: waiting, worker released"),
        TransitionKind::Yield => format!("yields{step} with its cursor"),
        TransitionKind::PermitDeferral => format!("permit denied for{step}: deferred, attempt unchanged"),
        TransitionKind::TimerActivation => format!("timer due: {} back to running", o.workflow_id),
        TransitionKind::SignalActivation => format!("signal wakes {}", o.workflow_id),
        TransitionKind::Completed => format!("{} completed", o.workflow_id),
        other => format!("{other:?}{step}"),
    };
    let token = o.claim_token.as_deref().map(|t| format!(" [{t}]")).unwrap_or_default();
    let worker = o.worker_id.as_deref().unwrap_or("-");
    format!("{worker}{token} {what}  (rev {})", o.revision)
}

/// Permit limits of the story: two ASR jobs at once and one start per second; one
/// composition at a time.
pub fn limits() -> HashMap<String, PermitLimits> {
    HashMap::from([
        ("speech_recognition".to_string(), PermitLimits { max_concurrency: 2, max_starts_per_second: 1 }),
        ("content_generation".to_string(), PermitLimits { max_concurrency: 1, max_starts_per_second: 0 }),
    ])
}

/// Play the story on `world` (in memory, or on a real store) and print its timeline.
/// Fails when the story does not end with every workflow completed and every result done.
pub async fn run(world: World) -> Result<(), Box<dyn std::error::Error>> {
    let biz = Arc::new(Business::default());
    let asr = Arc::new(FakeAsr::new(2, Some(world.durable.clone()), "transcribe"));

    // Which worker is running the current round, and one crash switch per worker.
    let current = Arc::new(AtomicUsize::new(0));
    let switches: Vec<Arc<CrashSwitch>> = WORKERS.iter().map(|_| CrashSwitch::new(CrashPlan::Never)).collect();
    let crashed_once = Arc::new(Mutex::new(false));
    let hook: CrashHook = {
        let (current, switches, crashed_once) = (current.clone(), switches.clone(), crashed_once.clone());
        Arc::new(move |ctx| {
            let mut done = crashed_once.lock().expect("lock");
            if !*done && ctx.workflow_id() == "sum-li" {
                *done = true;
                switches[current.load(Ordering::SeqCst)].crash_now();
            }
        })
    };
    let defs =
        vec![workflows::live_summary(biz.clone(), asr.clone(), Some(hook)), workflows::live_fanout(biz.clone(), 1)];
    let engines: Vec<Engine> = WORKERS
        .iter()
        .zip(&switches)
        .map(|(w, sw)| {
            let p = world.ports();
            let gated = Arc::new(CrashPorts::new(
                sw.clone(),
                p.store.clone(),
                p.inbox.clone(),
                p.queue.clone(),
                p.permits.clone(),
                p.wakeup.clone(),
            ));
            world.engine_on(gated.wire(p), test_config(w), defs.clone())
        })
        .collect();

    let t0 = world.now();
    let mut seen = 0;
    let print_new = |seen: &mut usize| {
        let events = world.observations.events();
        for o in &events[*seen..] {
            println!("{:>7.1}s  {}", (o.at - t0).as_millis() as f64 / 1000.0, describe(o));
        }
        *seen = events.len();
    };

    println!("== accept: two listeners subscribe to the summary of live-7 (not ended yet)");
    let publisher = engines[0].publisher();
    for (obj, wf) in [("note-li", "sum-li"), ("note-wang", "sum-wang")] {
        biz.accept(obj, "f1");
        biz.subscribe("live-7", wf);
        let req = StartRequest::new(
            workflows::LIVE_SUMMARY,
            format!("summary:{obj}"),
            json!({ "object_id": obj, "live_id": "live-7", "fencing_token": "f1" }),
        )
        .workflow_id(wf)
        .priority(Priority::P0);
        let out = publisher.start_or_resume(req).await?;
        println!("   StartOrResume {wf}: created={} activated={}", out.created, out.execution_activated);
    }

    let mut zombie: Option<(usize, BoxFuture<'_, ()>)> = None;
    let mut next_worker = 0usize;
    let mut fanout_started = false;
    for _round in 0..400 {
        engines[0].maintain().await?;
        print_new(&mut seen);
        // Four workers take turns, one scheduling round each; a dead one is skipped.
        let mut ran = false;
        for _ in 0..WORKERS.len() {
            let w = next_worker % WORKERS.len();
            next_worker += 1;
            if switches[w].is_crashed() {
                continue;
            }
            current.store(w, Ordering::SeqCst);
            let engine = engines[w].clone();
            let mut round: BoxFuture<'_, Option<RoundOutcome>> = Box::pin(async move { engine.tick().await.ok() });
            let outcome = tokio::select! {
                r = &mut round => r,
                _ = switches[w].wait_crashed() => None,
            };
            print_new(&mut seen);
            if switches[w].is_crashed() && zombie.is_none() {
                println!(
                    "      !! worker {} dies inside compose, after its fenced business write, before CompleteStep",
                    WORKERS[w]
                );
                println!("      -- nobody runs sum-li until the lease of worker {} expires", WORKERS[w]);
                zombie = Some((
                    w,
                    Box::pin(async move {
                        round.await;
                    }),
                ));
                continue;
            }
            if let Some(RoundOutcome::Ran { .. }) = outcome {
                ran = true;
                break;
            }
        }
        // After the takeover, the dead worker comes back and tries its pending write.
        if let Some((w, _)) = &zombie {
            let taken_over =
                world.instance("sum-li").await.is_some_and(|i| i.steps[2].status == kernel_core::StepStatus::Completed);
            if taken_over {
                let (w, fut) = (*w, zombie.take().map(|z| z.1).expect("zombie"));
                println!("      -- worker {} wakes up late and tries to commit compose with its old token", WORKERS[w]);
                switches[w].release();
                fut.await;
                let z = switches[w].zombie_stats();
                println!(
                    "      -- its writes: attempted={} accepted={} (fenced by claim_token, K-3.4)",
                    z.stale_writes_attempted, z.stale_writes_accepted
                );
            }
        }
        if ran {
            continue;
        }
        let all_now = world.instances().await?;
        let all_waiting = ["sum-li", "sum-wang"]
            .iter()
            .all(|id| all_now.iter().any(|i| i.workflow_id == *id && i.status == kernel_core::WorkflowStatus::Waiting));
        if all_waiting && !fanout_started {
            fanout_started = true;
            world.clock.advance(60_000);
            println!("== the live ends: a fan-out workflow announces it to every subscriber");
            publisher
                .start_or_resume(
                    StartRequest::new(workflows::LIVE_FANOUT, "fanout:live-7", json!({ "live_id": "live-7" }))
                        .workflow_id("fan-live-7"),
                )
                .await?;
            continue;
        }
        let now = world.now();
        let next = world
            .store
            .all()
            .iter()
            .filter(|i| !i.status.is_terminal())
            .filter_map(|i| i.claimable_time)
            .filter(|t| *t > now)
            .min();
        match next {
            Some(t) => world.clock.set(t),
            None if world.instances().await?.iter().all(|i| i.status.is_terminal()) => break,
            None => world.clock.advance(1_000),
        }
    }
    print_new(&mut seen);

    println!("== result");
    for (id, o) in biz.all() {
        println!("   {id}: status={} round={} result={:?}", o.status, o.fencing_token, o.result);
    }
    for i in world.instances().await? {
        let attempts: Vec<String> = i.steps.iter().map(|s| format!("{}:{}", s.name, s.attempt)).collect();
        let waits: i64 = i.steps.iter().map(|s| s.traffic_wait_ms.as_millis()).sum();
        println!(
            "   {} {} revision={} attempts=[{}] permit_wait_ms={}",
            i.workflow_id,
            i.status.as_str(),
            i.revision,
            attempts.join(" "),
            waits
        );
    }
    println!(
        "   ASR submissions={} effective_jobs_per_run_max={} late_business_writes_rejected={} notifications={}",
        asr.submissions(),
        asr.effective_jobs_max(),
        biz.late_writes_rejected(),
        biz.notifications()
    );
    let ok = biz.all().values().filter(|o| o.result.is_some()).all(|o| o.status == "done")
        && world.instances().await?.iter().all(|i| i.status == kernel_core::WorkflowStatus::Completed);
    if !ok {
        return Err("the story did not finish".into());
    }
    Ok(())
}
