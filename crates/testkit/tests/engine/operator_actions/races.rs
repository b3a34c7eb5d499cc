//! Operator actions raced against claims (K-6.8, K-17.5, K-17.6): random interleavings of
//! two workers (the second on a clock up to 400 ms off, within `max_clock_skew_ms`),
//! holder crashes, lease expiries and every operator action — regenerate, cancel, replay,
//! priority raise, task decisions by eligible and ineligible people and dead-letter
//! decisions (retry, fail, and a forged completion of the approval) — on a payment workflow
//! `reserve → slow → approve (a human task, dead-lettered when not approved) → charge`
//! whose inverses undo `slow` and `reserve`. Prints the `operator-races:` line.
//!
//! Every figure comes from an oracle outside the engine: the activities count their own
//! concurrent entries; the store's state before each write (the reference semantics of
//! its guard and transition) tells whether the write took a live claim's instance or
//! shortened its lease; the task inbox holds who decided; the effect log holds the order
//! the inverses ran in; the audit log counts request and apply writes. "Refused for a live
//! lease" counts actions answered `Conflict` because the instance kept changing under
//! them; refusals for the instance's own state (an ended workflow, a step not completed, a
//! cancel already pending) are answered as such and counted as `refused_by_state`.
//!
//! Cases: 240 by default; set `KERNEL_OPERATOR_RACE_CASES` to run more locally.

use crate::intercept::ApplyHook;
use kernel_core::engine::RoundOutcome;
use kernel_core::operator_request::RequestedAction;
use kernel_core::ports::*;
use kernel_core::transition::{Guard, TransitionKind};
use kernel_core::*;
use kernel_tasks::{HumanTask, Level, TaskDesk};
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use testkit::faults::AuditOutcome;
use testkit::harness::{test_config, World};
use testkit::memory::SkewedClock;
use tokio::sync::Semaphore;

#[derive(Default, Debug)]
struct Tally {
    cases: u64,
    actions: u64,
    requested: u64,
    applied: u64,
    refused_for_live_lease: u64,
    refused_by_state: u64,
    overlapping_executions: u64,
    approvals_without_person: u64,
    dependency_order_violations: u64,
    lease_shortened: u64,
    request_writes: u64,
    replaced: u64,
    dead_letter_decisions: u64,
    cancels_requested: u64,
    charges: u64,
    compensations: u64,
}

/// What the activities did: the order of effects and inverses, and concurrent entries.
#[derive(Default)]
struct Effects {
    log: Mutex<Vec<String>>,
    active_slow: AtomicU64,
    active_charge: AtomicU64,
    overlaps: AtomicU64,
    charges: AtomicU64,
}

/// Decrements the active count when the activity returns or its future is dropped (a
/// crash).
struct Active(Arc<Effects>);
impl Drop for Active {
    fn drop(&mut self) {
        self.0.active_slow.fetch_sub(1, Ordering::SeqCst);
    }
}

fn logged(fx: &Arc<Effects>, what: &'static str) -> impl Activity {
    let fx = fx.clone();
    move |_c: ActivityContext| {
        let fx = fx.clone();
        async move {
            fx.log.lock().unwrap().push(what.to_string());
            Ok(StepOutcome::complete(json!(what)))
        }
    }
}

fn definition(fx: &Arc<Effects>, gate: &Arc<Semaphore>, inbox: &MemoryInboxArc) -> Definition {
    let (f, g) = (fx.clone(), gate.clone());
    let slow = move |c: ActivityContext| {
        let (fx, gate) = (f.clone(), g.clone());
        async move {
            if fx.active_slow.fetch_add(1, Ordering::SeqCst) > 0 {
                fx.overlaps.fetch_add(1, Ordering::SeqCst);
            }
            let _active = Active(fx.clone());
            tokio::select! {
                p = gate.acquire() => {
                    p.expect("gate").forget();
                    fx.log.lock().unwrap().push("slow".into());
                    Ok(StepOutcome::complete(json!("slow")))
                }
                _ = c.cancellation().cancelled() => Err(ActivityError::transient("canceled")),
            }
        }
    };
    let f = fx.clone();
    let charge = move |_c: ActivityContext| {
        let fx = f.clone();
        async move {
            if fx.active_charge.fetch_add(1, Ordering::SeqCst) > 0 {
                fx.overlaps.fetch_add(1, Ordering::SeqCst);
            }
            tokio::task::yield_now().await;
            fx.active_charge.fetch_sub(1, Ordering::SeqCst);
            fx.charges.fetch_add(1, Ordering::SeqCst);
            fx.log.lock().unwrap().push("charge".into());
            Ok(StepOutcome::complete(json!("charged")))
        }
    };
    let approve = HumanTask::builder("Approve the payment")
        .level(Level::roles(["finance"]))
        .build(inbox.clone())
        .expect("a valid human task");
    Definition::builder("pay")
        .step(StepDef::new("reserve", logged(fx, "reserve")).compensate_with(logged(fx, "unreserve")))
        .step(
            StepDef::new("slow", slow)
                .depends_on(["reserve"])
                .timeout_ms(3_600_000)
                .compensate_with(logged(fx, "unslow")),
        )
        .step(StepDef::new("approve", approve).depends_on(["slow"]).max_retry(3).on_failed(OnFailed::DeadLetter))
        .step(StepDef::new("charge", charge).depends_on(["approve"]))
        .build()
        .unwrap()
}

type MemoryInboxArc = Arc<DynTaskInbox>;

async fn settle() {
    for _ in 0..40 {
        tokio::task::yield_now().await;
    }
}

/// What one write would do to the stored instance, by the reference semantics, judged
/// before the store sees it: a write that needs no token must not take a live claim's
/// instance (clear or change its token) or move its lease earlier; a request write must
/// leave the lease alone.
fn watch(
    world: &World,
    shortened: Arc<AtomicU64>,
    replaced: Arc<AtomicU64>,
    last_request: Arc<Mutex<Option<RequestedAction>>>,
) -> Arc<DynStore> {
    let (mem, clock) = (world.store.clone(), world.clock.clone());
    Arc::new(ApplyHook {
        inner: Arc::new(world.audit.clone()),
        intercept: Box::new(move |id, guard, t| {
            let before = mem.peek(id.as_str())?;
            if !guard.matches(&before) {
                return None;
            }
            let mut after = before.clone();
            t.apply_to(&mut after);
            let now = clock.now();
            let live = before.claim_token.is_some() && before.claimable_time.is_some_and(|c| c > now);
            let earlier =
                matches!((before.claimable_time, after.claimable_time), (Some(b), a) if a.is_none_or(|a| a < b));
            let request = t.kinds().any(|k| k == TransitionKind::OperatorRequest);
            if let Some(kernel_core::transition::Patch::Set(r)) = &t.operator_request {
                *last_request.lock().unwrap() = Some(r.action.clone());
            }
            if request && before.operator_request.is_some() {
                // A cancel that replaced a pending regenerate: one request, applied once.
                replaced.fetch_add(1, Ordering::SeqCst);
            }
            let tokenless = !guard.is_token_guard() && !matches!(guard, Guard::Claimable { .. });
            if live && ((tokenless && (after.claim_token != before.claim_token || earlier)) || (request && earlier)) {
                shortened.fetch_add(1, Ordering::SeqCst);
            }
            None
        }),
    })
}

async fn run_case(seed: u64, t: &mut Tally) {
    let world = World::new(seed);
    let mut rng = StdRng::seed_from_u64(seed);
    let fx = Arc::new(Effects::default());
    let gate = Arc::new(Semaphore::new(0));
    let inbox: MemoryInboxArc = Arc::new(world.task_inbox.clone());
    let (shortened, replaced) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let last_request: Arc<Mutex<Option<RequestedAction>>> = Arc::default();
    let store = watch(&world, shortened.clone(), replaced.clone(), last_request.clone());
    let mut pa = world.ports();
    pa.store = store.clone();
    let mut pb = world.ports();
    pb.store = store;
    let skew: i64 = rng.gen_range(-400..=400);
    pb.clock = Arc::new(SkewedClock::new(world.clock.clone(), skew));
    let a = world.engine_on(pa, test_config("A"), vec![definition(&fx, &gate, &inbox)]);
    let b = world.engine_on(pb, test_config("B"), vec![definition(&fx, &gate, &inbox)]);
    let desk = TaskDesk::new(inbox.clone(), a.signal_sender(), world.clock.clone());
    let wf: WorkflowId = "wf-pay".into();
    let req = StartRequest::new("pay", "order-1", json!({"amount": 12_400})).workflow_id(wf.clone());
    a.publisher().start_or_resume(req).await.unwrap();

    let mut ticks: Vec<tokio::task::JoinHandle<Result<RoundOutcome>>> = Vec::new();
    let tick = |e: &Engine| {
        let e = e.clone();
        tokio::spawn(async move { e.tick().await })
    };
    ticks.push(tick(&a));
    settle().await;
    let events = rng.gen_range(4..10);
    for _ in 0..events {
        let who = if rng.gen_bool(0.5) { &a } else { &b };
        match rng.gen_range(0..12) {
            0 | 1 => {
                t.actions += 1;
                let step = ["reserve", "slow"][rng.gen_range(0..2)];
                classify(who.regenerate(&wf, step).await.map(|_| ()), t);
            }
            2 => {
                t.actions += 1;
                classify(who.cancel(&wf).await.map(|_| ()), t);
            }
            3 => {
                t.actions += 1;
                classify(who.publisher().replay(&wf).await.map(|_| ()), t);
            }
            4 => {
                t.actions += 1;
                let raise = StartRequest::new("pay", "order-1", json!({"amount": 12_400})).priority(Priority::P0);
                classify(who.publisher().start_or_resume(raise).await.map(|_| ()), t);
            }
            5 => {
                t.actions += 1;
                let eligible = rng.gen_bool(0.6);
                let actor = if eligible { Actor::new("fin-1", ["finance"]) } else { Actor::new("ops-9", ["ops"]) };
                let outcome = if rng.gen_bool(0.7) { TaskOutcome::Approve } else { TaskOutcome::Reject };
                let open =
                    world.task_inbox.all().into_iter().filter(|r| r.status == TaskStatus::Open).collect::<Vec<_>>();
                for r in open {
                    let _ = desk.decide(&r.id, &r.token, &actor, outcome, None).await;
                }
            }
            6 | 7 => {
                ticks.push(tick(who));
                settle().await;
            }
            8 => {
                world.clock.advance(rng.gen_range(1..14_000));
                settle().await;
            }
            9 => {
                gate.add_permits(1);
                settle().await;
            }
            11 => {
                // An operator decides the open dead letters (a rejected approval): retry
                // (re-opens the task), fail, or a forged completion with an approval-shaped
                // output, which a human task's authority refuses.
                for dl in who.dead_letters(Some(DeadLetterStatus::Open), None, 100).await.unwrap_or_default() {
                    t.actions += 1;
                    t.dead_letter_decisions += 1;
                    let action = match rng.gen_range(0..3) {
                        0 => DeadLetterAction::Retry,
                        1 => DeadLetterAction::Fail,
                        _ => DeadLetterAction::Complete { output: json!({"outcome": "approve", "actor": "ops-9"}) },
                    };
                    classify(who.decide_dead_letter(&dl.id, action, "ops-9", Some("race")).await.map(|_| ()), t);
                }
            }
            _ => {
                // A worker process dies: every claim it runs ends with it.
                for h in &ticks {
                    h.abort();
                }
                settle().await;
            }
        }
    }
    // Drain: the gate stays open, an eligible person decides (approves or rejects, as the
    // seed says), time moves past every lease.
    gate.add_permits(1_000);
    let last_word = if rng.gen_bool(0.5) { TaskOutcome::Approve } else { TaskOutcome::Reject };
    for round in 0..60 {
        let inst = world.store.peek(wf.as_str()).unwrap();
        if inst.status.is_terminal() {
            break;
        }
        for r in world.task_inbox.all().into_iter().filter(|r| r.status == TaskStatus::Open) {
            let _ = desk.decide(&r.id, &r.token, &Actor::new("fin-2", ["finance"]), last_word, None).await;
        }
        // Dead letters (a rejected approval): the operator's decision is random for the
        // first rounds, a forged completion among them, then `fail` so every case ends.
        for dl in a.dead_letters(Some(DeadLetterStatus::Open), None, 100).await.unwrap_or_default() {
            let action = match (round < 4, rng.gen_range(0..3)) {
                (true, 0) => DeadLetterAction::Retry,
                (true, 1) => DeadLetterAction::Complete { output: json!({"outcome": "approve", "actor": "ops-9"}) },
                _ => DeadLetterAction::Fail,
            };
            t.actions += 1;
            t.dead_letter_decisions += 1;
            classify(a.decide_dead_letter(&dl.id, action, "ops-1", Some("drain")).await.map(|_| ()), t);
        }
        world.clock.advance(11_000);
        settle().await;
        let _ = a.maintain().await;
        ticks.push(tick(&a));
        ticks.push(tick(&b));
        settle().await;
    }
    for h in ticks {
        h.abort();
        let _ = h.await;
    }
    let end = world.store.peek(wf.as_str()).unwrap();
    assert!(end.status.is_terminal(), "seed {seed}: the workflow ends ({:?})", end.status);
    assert!(end.operator_request.is_none(), "seed {seed}: no request is left pending");
    if *last_request.lock().unwrap() == Some(RequestedAction::Cancel) {
        // The last request written was a cancel (a replaced regenerate never wins over it).
        assert_eq!(end.status, WorkflowStatus::Canceled, "seed {seed}: a requested cancel is what happened");
        t.cancels_requested += 1;
    }

    // The oracles.
    t.cases += 1;
    t.overlapping_executions += fx.overlaps.load(Ordering::SeqCst);
    t.lease_shortened += shortened.load(Ordering::SeqCst);
    let charges = fx.charges.load(Ordering::SeqCst);
    t.charges += charges;
    let approved_by_person =
        world.task_inbox.all().iter().any(|r| {
            r.decision.as_ref().is_some_and(|d| d.outcome == TaskOutcome::Approve && d.actor.starts_with("fin-"))
        });
    if charges > 0 && !approved_by_person {
        t.approvals_without_person += 1;
    }
    let log = fx.log.lock().unwrap().clone();
    // Each compensation undoes `slow` before `reserve` (the reservation backs it).
    let mut unslowed_since_reserve = false;
    let mut slowed = false;
    for e in &log {
        match e.as_str() {
            "reserve" => (slowed, unslowed_since_reserve) = (false, false),
            "slow" => slowed = true,
            "unslow" => unslowed_since_reserve = true,
            "unreserve" => {
                t.compensations += 1;
                if slowed && !unslowed_since_reserve {
                    t.dependency_order_violations += 1;
                }
            }
            _ => {}
        }
    }
    t.replaced += replaced.load(Ordering::SeqCst);
    for w in world.audit.log() {
        if !matches!(w.outcome, AuditOutcome::Applied { .. }) {
            continue;
        }
        if w.kinds.contains(&TransitionKind::OperatorRequest) {
            t.request_writes += 1;
        }
        if w.kinds.contains(&TransitionKind::RequestApplied) {
            t.applied += 1;
        }
    }
}

fn classify(r: Result<()>, t: &mut Tally) {
    match r {
        Ok(()) => {}
        Err(Error::Conflict(m)) if m.contains("kept changing") => t.refused_for_live_lease += 1,
        Err(_) => t.refused_by_state += 1,
    }
}

/// K-6.8, K-17.5, K-17.6: no operator action takes a live claim's instance or shortens its
/// lease; no two executions of one step overlap; no charge without an eligible person's
/// approval; compensation never undoes a dependency before its dependent; every request
/// recorded is applied.
#[tokio::test(flavor = "current_thread")]
async fn operator_actions_raced_against_claims_keep_every_promise() {
    let cases: u64 = std::env::var("KERNEL_OPERATOR_RACE_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(240);
    let mut t = Tally::default();
    for seed in 0..cases {
        run_case(seed, &mut t).await;
    }
    t.requested = t.request_writes - t.replaced;
    println!(
        "operator-races: cases={} actions={} requested={} applied={} refused_for_live_lease={} overlapping_executions={} \
         approvals_without_person={} dependency_order_violations={} lease_shortened={}",
        t.cases,
        t.actions,
        t.requested,
        t.applied,
        t.refused_for_live_lease,
        t.overlapping_executions,
        t.approvals_without_person,
        t.dependency_order_violations,
        t.lease_shortened
    );
    println!("operator-races detail: {t:?}");
    assert_eq!(t.overlapping_executions, 0);
    assert_eq!(t.approvals_without_person, 0);
    assert_eq!(t.dependency_order_violations, 0);
    assert_eq!(t.lease_shortened, 0);
    assert_eq!(t.requested, t.applied, "every request recorded is applied");
    assert!(
        t.requested > 0 && t.compensations > 0 && t.charges > 0 && t.dead_letter_decisions > 0,
        "the cases reach every path: {t:?}"
    );
}
