//! A lease lost mid-activity (K-6.3, K-6.4, K-6.8): the heartbeat writes of a claim stop
//! working while its one long activity runs — they hang until their deadline, are refused,
//! or take effect with their reply lost. The holder must cancel the activity and start
//! nothing more by the time its lease ends minus `max_clock_skew_ms`; a second worker whose
//! clock runs that much ahead takes the instance over only once the lease (as the store
//! holds it) has ended; the two executions of the step never overlap.
//!
//! `clock_skew.rs` checks the same bound at a step boundary (a step that would start late);
//! here the activity is running when the lease is lost. The oracles: the activity records
//! its own executions on the true clock, and the store's audit log gives every claim's
//! lease end and every write under its token.

use crate::support::settle;
use kernel_core::domain::DurationMs;
use kernel_core::engine::{CallEnd, ClaimEnd, Engine, RoundOutcome};
use kernel_core::ports::DynClock;
use kernel_core::*;
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use testkit::faults::{AuditOutcome, WriteOp};
use testkit::harness::{test_config, World};
use testkit::memory::SkewedClock;
use testkit::port_faults::PortFaults;

/// One execution of the step, on the true clock.
#[derive(Debug, Clone)]
struct Execution {
    token: String,
    entered: Instant,
    left: Option<Instant>,
    cancelled: bool,
}

/// What the step saw: its executions, how many ran at once now and at most.
#[derive(Default)]
struct Seen {
    executions: Mutex<Vec<Execution>>,
    in_flight: AtomicU64,
    most_in_flight: AtomicU64,
}

/// One long step: the first execution runs until it is cancelled; a later one completes
/// after a few turns of the scheduler (long enough to meet an execution still running).
fn long_step(seen: Arc<Seen>, clock: Arc<DynClock>) -> Definition {
    let work = move |c: ActivityContext| {
        let (seen, clock) = (seen.clone(), clock.clone());
        async move {
            let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            seen.most_in_flight.fetch_max(now, Ordering::SeqCst);
            let n = {
                let mut ex = seen.executions.lock().unwrap();
                let e = Execution {
                    token: c.claim_token().to_string(),
                    entered: clock.now(),
                    left: None,
                    cancelled: false,
                };
                ex.push(e);
                ex.len() - 1
            };
            let cancelled = if n == 0 {
                c.cancellation().cancelled().await;
                true
            } else {
                settle().await;
                false
            };
            {
                let mut ex = seen.executions.lock().unwrap();
                ex[n].left = Some(clock.now());
                ex[n].cancelled = cancelled;
            }
            seen.in_flight.fetch_sub(1, Ordering::SeqCst);
            if cancelled {
                Err(ActivityError::transient("cancelled"))
            } else {
                Ok(StepOutcome::complete(json!("done")))
            }
        }
    };
    Definition::builder("t").step(StepDef::new("long", work).timeout_ms(3_600_000)).build().unwrap()
}

/// How the heartbeat writes of the holder fail.
#[derive(Debug, Clone, Copy)]
enum HeartbeatFault {
    /// Every heartbeat write hangs until the heartbeat's deadline (an uncertain outcome).
    Hang,
    /// Every heartbeat write is refused at once (certainly not applied: retried while a
    /// retry can still end before the lease does).
    Refuse,
    /// The first heartbeat write extends the lease and its reply is lost (uncertain); the
    /// lease the store holds is the extended one.
    LoseReply,
}

/// What one case showed, from the activity and the audit log.
#[derive(Debug)]
struct Case {
    holder_end: ClaimEnd,
    /// The holder's lease end as the store holds it (its claim or its last applied
    /// heartbeat), and that minus the allowed skew.
    lease_until: Instant,
    stop_by: Instant,
    holder: Execution,
    holder_entries: usize,
    holder_writes_after_stop: usize,
    taker_claimed_at: Instant,
    taker: Execution,
    most_in_flight: u64,
    status: WorkflowStatus,
}

async fn run_case(seed: u64, fault: HeartbeatFault) -> Case {
    let world = World::new(seed);
    let seen = Arc::new(Seen::default());
    let truth: Arc<DynClock> = world.clock.clone();
    let config = test_config("A");
    let skew = config.max_clock_skew_ms;
    let faults = PortFaults::new(world.clock.clone());
    match fault {
        HeartbeatFault::Hang => faults.hang("heartbeat"),
        HeartbeatFault::Refuse => faults.refuse("heartbeat"),
        HeartbeatFault::LoseReply => faults.lose_reply("heartbeat"),
    }
    let a = Engine::builder(world.ports())
        .config(config)
        .register(long_step(seen.clone(), truth.clone()))
        .port_hook(faults.clone())
        .build()
        .unwrap();
    let mut b_ports = world.ports();
    b_ports.clock = Arc::new(SkewedClock::new(world.clock.clone(), skew.as_millis()));
    let b = world.engine_on(b_ports, test_config("B"), vec![long_step(seen.clone(), truth.clone())]);

    world.start_as(&a, "t", "b", "wf").await;
    let lease = a.config().lease_ms;
    let holder = tokio::spawn(async move { a.tick().await });
    settle().await;
    assert_eq!(seen.executions.lock().unwrap().len(), 1, "the holder is inside the step");
    // Quarter seconds of true time, up to three leases; B tries to take over at every one.
    let give_up = world.now().saturating_add(DurationMs::from_millis(3 * lease.as_millis()));
    let mut taken = false;
    while !taken && world.now() < give_up {
        world.clock.advance(250);
        settle().await;
        match b.tick_from_store().await.unwrap() {
            RoundOutcome::Ran { end, .. } => {
                assert_eq!(end, ClaimEnd::Terminal(WorkflowStatus::Completed), "{fault:?}: the taker completes");
                taken = true;
            }
            _ => continue,
        }
    }
    assert!(taken, "{fault:?}: no worker took the instance over within three leases");
    if matches!(fault, HeartbeatFault::Hang) {
        // The heartbeat gives up at its own, shorter deadline: the envelope tells the hook.
        assert!(faults.ended("heartbeat", CallEnd::Abandoned) >= 1, "the abandoned heartbeat was reported");
        assert!(faults.hung_calls().iter().all(|c| c.end.is_some()), "no hung span stays open");
    }
    faults.release();
    let holder_end = match holder.await.unwrap().unwrap() {
        RoundOutcome::Ran { end, .. } => end,
        other => panic!("{fault:?}: the holder ran no claim: {other:?}"),
    };

    let log = world.audit.log();
    let claims: Vec<_> = log
        .iter()
        .filter(|w| {
            matches!(w.op, WriteOp::Claim | WriteOp::ClaimAny) && matches!(w.outcome, AuditOutcome::Applied { .. })
        })
        .collect();
    assert_eq!(claims.len(), 2, "{fault:?}: one claim each: {claims:?}");
    let (a_token, b_claim) = (claims[0].token.clone().unwrap(), claims[1]);
    let lease_until = log
        .iter()
        .filter(|w| w.token.as_ref() == Some(&a_token) && matches!(w.outcome, AuditOutcome::Applied { .. }))
        .filter_map(|w| w.lease_until)
        .max()
        .expect("the holder's claim set a lease end");
    let stop_by = lease_until.saturating_sub(skew);
    let holder_writes_after_stop =
        log.iter().filter(|w| w.token.as_ref() == Some(&a_token) && w.at.is_some_and(|at| at >= stop_by)).count();
    let executions = seen.executions.lock().unwrap().clone();
    let of = |token: &str| executions.iter().filter(|e| e.token == token).cloned().collect::<Vec<_>>();
    let holder_runs = of(a_token.as_str());
    let taker_runs = of(b_claim.token.as_ref().unwrap().as_str());
    assert_eq!(taker_runs.len(), 1, "{fault:?}: the taker ran the step once: {executions:?}");
    Case {
        holder_end,
        lease_until,
        stop_by,
        holder: holder_runs[0].clone(),
        holder_entries: holder_runs.len(),
        holder_writes_after_stop,
        taker_claimed_at: b_claim.at.unwrap(),
        taker: taker_runs[0].clone(),
        most_in_flight: seen.most_in_flight.load(Ordering::SeqCst),
        status: world.store.peek("wf").unwrap().status,
    }
}

/// K-6.3, K-6.4, K-6.8: whichever way the heartbeat fails — hung to its deadline, refused,
/// or applied with its reply lost — the holder's running activity is cancelled and has
/// returned by `lease_until − max_clock_skew_ms` (true time), the holder writes and starts
/// nothing after that, a worker whose clock runs `max_clock_skew_ms` ahead claims only once
/// its clock has passed the lease end the store holds, and the two executions of the step
/// never overlap. Prints the `lease-loss:` figure line.
#[tokio::test]
async fn a_lease_lost_mid_activity_cancels_it_before_a_skewed_worker_takes_over() {
    let faults = [HeartbeatFault::Hang, HeartbeatFault::Refuse, HeartbeatFault::LoseReply];
    let (mut cancelled_in_time, mut late_starts, mut early_takeovers, mut overlaps) = (0, 0, 0, 0);
    let mut margin_ms = i64::MAX;
    for (i, fault) in faults.into_iter().enumerate() {
        let c = run_case(400 + i as u64, fault).await;
        let left = c.holder.left.unwrap_or_else(|| panic!("{fault:?}: the holder's activity never returned: {c:?}"));
        assert!(c.holder.cancelled, "{fault:?}: the holder's activity was not cancelled: {c:?}");
        assert_eq!(c.holder_end, ClaimEnd::Uncertain, "{fault:?}: {c:?}");
        assert!(left <= c.stop_by, "{fault:?}: the holder's activity ran past lease end − skew: {c:?}");
        cancelled_in_time += 1;
        margin_ms = margin_ms.min(c.stop_by.duration_since(left).as_millis());
        late_starts += c.holder_entries - 1 + c.holder_writes_after_stop;
        assert_eq!(c.holder_entries, 1, "{fault:?}: the holder entered the step again: {c:?}");
        assert_eq!(c.holder_writes_after_stop, 0, "{fault:?}: the holder wrote after lease end − skew: {c:?}");
        early_takeovers += usize::from(c.taker_claimed_at < c.lease_until);
        assert!(c.taker_claimed_at >= c.lease_until, "{fault:?}: taken over before the lease ended: {c:?}");
        overlaps += usize::from(c.most_in_flight > 1 || c.taker.entered < left);
        assert_eq!(c.most_in_flight, 1, "{fault:?}: two executions of the step ran at once: {c:?}");
        assert!(c.taker.entered >= left, "{fault:?}: the taker entered before the holder left: {c:?}");
        assert_eq!(c.status, WorkflowStatus::Completed, "{fault:?}: {c:?}");
    }
    println!(
        "lease-loss: cases={} cancelled_by_lease_end_minus_skew={cancelled_in_time} least_margin_ms={margin_ms} holder_starts_or_writes_after={late_starts} takeovers_before_lease_end={early_takeovers} overlaps={overlaps}",
        faults.len()
    );
}
