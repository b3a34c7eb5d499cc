//! Every port call the engine makes has a deadline on the `Clock` port (K-6.8): a port that
//! stops answering — dead letters, task inbox, result cache, permits, queue, wakeup, stream,
//! signal inbox — ends its call at the deadline, so no claim and no maintenance pass waits
//! on it forever, and no heartbeat keeps a lease alive for a call that hangs.
//!
//! The hung calls come from [`PortFaults`], a hook in the engine's one port envelope; what
//! the store saw comes from the world's audit log (every write with the writer's clock), an
//! oracle independent of the engine's own account.

use crate::support::settle;
use kernel_core::domain::{DurationMs, Instant};
use kernel_core::engine::{CallEnd, Engine};
use kernel_core::transition::TransitionKind;
use kernel_core::*;
use serde_json::{json, Value};
use testkit::harness::{test_config, World};
use testkit::port_faults::PortFaults;

fn done(v: Value) -> std::result::Result<StepOutcome, ActivityError> {
    Ok(StepOutcome::complete(v))
}

/// One step holding a permit on `r` (the release rings the wakeup).
fn with_permit() -> Definition {
    Definition::builder("t")
        .step(StepDef::new("a", |_c: ActivityContext| async { done(json!(1)) }).resource("r"))
        .build()
        .unwrap()
}

/// A streaming step: the stream is reset before it runs and written while it runs.
fn streaming() -> Definition {
    let compose = |c: ActivityContext| async move {
        let stream = c.stream().expect("a streaming step has a stream").clone();
        let _ = stream.text("hello").await;
        done(json!("done"))
    };
    Definition::builder("t").step(StepDef::new("a", compose).streaming()).build().unwrap()
}

/// A step that fails permanently into a dead letter (K-17.2).
fn dead_lettered() -> Definition {
    let fail = |_c: ActivityContext| async { Err::<StepOutcome, _>(ActivityError::permanent("vendor unknown")) };
    Definition::builder("t").step(StepDef::new("a", fail).on_failed(OnFailed::DeadLetter)).build().unwrap()
}

/// A compensable step whose inverse keeps failing, then a permanent failure: the failure
/// path escalates the inverse to a person through the task inbox (K-17.6).
fn escalating() -> Definition {
    // Permanent: escalated at once, in the first claim (a transient one is retried by later
    // claims, K-17.6 amendment).
    let inverse = |_c: ActivityContext| async { Err::<StepOutcome, _>(ActivityError::permanent("ledger refused")) };
    let fail = |_c: ActivityContext| async { Err::<StepOutcome, _>(ActivityError::permanent("check failed")) };
    Definition::builder("t")
        .step(StepDef::new("post", |_c: ActivityContext| async { done(json!("posted")) }).compensate_with(inverse))
        .step(StepDef::new("check", fail).depends_on(["post"]))
        .build()
        .unwrap()
}

/// A step that waits for a signal (the suspend looks for one already in the inbox).
fn waiting() -> Definition {
    let wait = |_c: ActivityContext| async { Ok(StepOutcome::wait_for_signal("go", "k").into()) };
    Definition::builder("t").step(StepDef::new("a", wait)).build().unwrap()
}

/// Where the hung call happens: inside a claim (`tick`) or in a maintenance pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Claim,
    Maintain,
}

struct Case {
    port: &'static str,
    phase: Phase,
    def: fn() -> Definition,
    input: Value,
}

/// What one hung case showed.
#[derive(Debug, Default)]
struct Seen {
    hung_calls: u64,
    ended_at_deadline: u64,
    stuck: bool,
    heartbeats_while_hung_past_deadline: u64,
}

async fn run_case(seed: u64, case: &Case) -> Seen {
    let world = World::new(seed);
    let faults = PortFaults::new(world.clock.clone());
    let config = test_config("w");
    let (deadline, lease) = (config.store_call_deadline_ms, config.lease_ms);
    let engine =
        Engine::builder(world.ports()).config(config).register((case.def)()).port_hook(faults.clone()).build().unwrap();
    engine
        .publisher()
        .start_or_resume(StartRequest::new("t", "b", case.input.clone()).workflow_id("wf"))
        .await
        .unwrap();
    faults.hang(case.port);
    let start = world.now();
    let e = engine.clone();
    let task = match case.phase {
        Phase::Claim => tokio::spawn(async move { e.tick().await.map(|_| ()) }),
        Phase::Maintain => tokio::spawn(async move { e.maintain().await.map(|_| ()) }),
    };
    // Three leases of simulated time, a second at a time.
    let give_up = start.saturating_add(DurationMs::from_millis(3 * lease.as_millis()));
    settle().await;
    while !task.is_finished() && world.now() < give_up {
        world.clock.advance(1_000);
        settle().await;
    }
    let stuck = !task.is_finished();
    faults.release();
    settle().await;
    if !stuck {
        let _ = task.await;
    }
    let spans = faults.hung_calls();
    // Heartbeats the store accepted while a hung call was past its deadline and still open.
    let heartbeats: Vec<Instant> = world
        .audit
        .log()
        .iter()
        .filter(|w| w.kinds.contains(&TransitionKind::Heartbeat))
        .filter(|w| matches!(w.outcome, testkit::faults::AuditOutcome::Applied { .. }))
        .filter_map(|w| w.at)
        .collect();
    let past = heartbeats
        .iter()
        .filter(|at| {
            spans.iter().any(|s| {
                let late = s.start.saturating_add(deadline);
                **at > late && s.end.is_none_or(|end| **at <= end)
            })
        })
        .count() as u64;
    Seen {
        hung_calls: spans.len() as u64,
        ended_at_deadline: faults.ended(case.port, CallEnd::DeadlinePassed),
        stuck,
        heartbeats_while_hung_past_deadline: past,
    }
}

fn cases() -> Vec<Case> {
    let none = json!({});
    let round = json!({ "object_id": "o-1", "fencing_token": "f1" });
    vec![
        Case { port: "dead_letters", phase: Phase::Claim, def: dead_lettered, input: none.clone() },
        Case { port: "task_inbox", phase: Phase::Claim, def: escalating, input: none.clone() },
        Case { port: "permits", phase: Phase::Claim, def: with_permit, input: none.clone() },
        Case { port: "wakeup", phase: Phase::Claim, def: with_permit, input: none.clone() },
        Case { port: "queue", phase: Phase::Claim, def: with_permit, input: none.clone() },
        Case { port: "stream", phase: Phase::Claim, def: streaming, input: round },
        Case { port: "inbox", phase: Phase::Claim, def: waiting, input: none.clone() },
        Case { port: "cache", phase: Phase::Maintain, def: with_permit, input: none.clone() },
        Case { port: "dead_letters", phase: Phase::Maintain, def: with_permit, input: none.clone() },
        Case { port: "inbox", phase: Phase::Maintain, def: with_permit, input: none.clone() },
        Case { port: "queue", phase: Phase::Maintain, def: with_permit, input: none },
    ]
}

/// K-6.8: a hung side port ends its call at the deadline; no claim or maintenance pass
/// stays stuck and no heartbeat extends a lease for a call past its deadline.
/// Prints the `side-ports:` figure line.
#[tokio::test]
async fn a_hung_side_port_holds_no_claim_and_no_maintenance_pass() {
    let mut ports = std::collections::BTreeSet::new();
    let (mut hung_cases, mut claims_stuck, mut maintenance_stuck, mut extended) = (0u64, 0u64, 0u64, 0u64);
    for (i, case) in cases().iter().enumerate() {
        let seen = run_case(100 + i as u64, case).await;
        assert!(seen.hung_calls > 0, "case {} ({:?}) never reached the hung port", case.port, case.phase);
        ports.insert(case.port);
        hung_cases += 1;
        match case.phase {
            Phase::Claim => claims_stuck += u64::from(seen.stuck),
            Phase::Maintain => maintenance_stuck += u64::from(seen.stuck),
        }
        extended += seen.heartbeats_while_hung_past_deadline;
        assert!(!seen.stuck, "{} ({:?}) still waits on the hung port after three leases", case.port, case.phase);
        assert_eq!(seen.ended_at_deadline, seen.hung_calls, "{}: every hung call ended at its deadline", case.port);
    }
    println!(
        "side-ports: ports={} hung_cases={hung_cases} claims_stuck={claims_stuck} maintenance_stuck={maintenance_stuck} leases_extended_by_hung={extended}",
        ports.len()
    );
    assert_eq!(extended, 0, "a heartbeat extended a lease while a call hung past its deadline");
}
