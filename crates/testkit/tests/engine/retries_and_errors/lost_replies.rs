//! Lost replies (K-6.8 with K-6.4 and K-7.3): a write the engine makes takes effect and its
//! answer is dropped on the way back, so the engine hears an uncertain outcome. For every
//! write of a few representative workflows — the store's create, claims and guarded writes
//! (mark running, complete, suspend, retry), the signal inbox, the ready queue, the wakeup,
//! the permits, the result cache, the dead letters, the task inbox — the reply of that one
//! write is lost, and the workflow is driven to rest again.
//!
//! The oracles are independent of the engine's own account: the activities count what they
//! really did, the store's audit log lists every write with its claim token, and the world's
//! dead-letter and task records are read after the run. The faults come from [`PortFaults`]
//! in the engine's one port envelope.

use kernel_core::domain::DurationMs;
use kernel_core::engine::{CallEnd, Engine, PortCall, PortHook};
use kernel_core::model_call::{Model, ModelAnswer, ModelRequest};
use kernel_core::ports::Signal;
use kernel_core::record::{Usage, VersionRef};
use kernel_core::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use testkit::faults::{AuditOutcome, AuditStore};
use testkit::harness::{test_config, World};
use testkit::port_faults::PortFaults;

/// What the activities really did: completing invocations per step, and every invocation.
#[derive(Default)]
struct Effects {
    completed: Mutex<BTreeMap<&'static str, u64>>,
    invoked: Mutex<BTreeMap<&'static str, u64>>,
    model_calls: AtomicU64,
}

impl Effects {
    fn invoked(&self, step: &'static str) -> u64 {
        let mut m = self.invoked.lock().unwrap();
        let n = m.entry(step).or_insert(0);
        *n += 1;
        *n
    }
    fn complete(&self, step: &'static str, v: Value) -> std::result::Result<StepOutcome, ActivityError> {
        *self.completed.lock().unwrap().entry(step).or_insert(0) += 1;
        Ok(StepOutcome::complete(v))
    }
    fn completed(&self) -> BTreeMap<&'static str, u64> {
        self.completed.lock().unwrap().clone()
    }
}

/// A model that answers at once and counts its calls (the effect a cache saves).
struct CountingModel(Arc<Effects>);

#[async_trait::async_trait]
impl Model for CountingModel {
    fn version(&self) -> VersionRef {
        VersionRef::new("counting", "1")
    }
    async fn generate(
        &self,
        _req: &ModelRequest,
        _ctx: &ActivityContext,
    ) -> std::result::Result<ModelAnswer, ActivityError> {
        self.0.model_calls.fetch_add(1, Ordering::SeqCst);
        Ok(ModelAnswer { raw: json!({"vendor": "acme"}).to_string(), usage: Usage::default() })
    }
}

/// `lookup → reserve → pause → approve → flaky → ship`: a cached model call in a read-only
/// step (the result cache), a step holding a permit (permits, wakeup on release), a durable
/// sleep and a signal wait (suspends, the inbox, the timer activation), a transient failure
/// retried once (the queue), and a last step.
fn order(fx: &Arc<Effects>) -> Definition {
    let f = fx.clone();
    let lookup = move |ctx: ActivityContext| {
        let f = f.clone();
        async move {
            f.invoked("lookup");
            let req = ModelRequest::new("vendor", VersionRef::new("vendor-check", "1"), json!({"v": 1})).cached(
                "tools-1",
                "vendors-1",
                DurationMs::from_secs(3_600),
            );
            let out = ctx.model(&CountingModel(f.clone()), req).await?;
            f.complete("lookup", out)
        }
    };
    let f = fx.clone();
    let reserve = move |_c: ActivityContext| {
        let f = f.clone();
        async move {
            f.invoked("reserve");
            f.complete("reserve", json!("reserved"))
        }
    };
    let f = fx.clone();
    let pause = move |c: ActivityContext| {
        let f = f.clone();
        async move {
            f.invoked("pause");
            match c.resume() {
                Some(_) => f.complete("pause", json!("rested")),
                None => Ok(StepOutcome::sleep(DurationMs::from_secs(5), json!("asleep"))),
            }
        }
    };
    let f = fx.clone();
    let approve = move |c: ActivityContext| {
        let f = f.clone();
        async move {
            f.invoked("approve");
            match c.resume() {
                Some(_) => f.complete("approve", json!("approved")),
                None => Ok(StepOutcome::wait_for_signal("go", "k").into()),
            }
        }
    };
    let f = fx.clone();
    let flaky = move |_c: ActivityContext| {
        let f = f.clone();
        async move {
            if f.invoked("flaky") == 1 {
                return Err(ActivityError::transient("vendor busy"));
            }
            f.complete("flaky", json!("done"))
        }
    };
    let f = fx.clone();
    let ship = move |_c: ActivityContext| {
        let f = f.clone();
        async move {
            f.invoked("ship");
            f.complete("ship", json!("shipped"))
        }
    };
    Definition::builder("order")
        .step(StepDef::new("lookup", lookup).read_only())
        .step(StepDef::new("reserve", reserve).resource("r").depends_on(["lookup"]))
        .step(StepDef::new("pause", pause).depends_on(["reserve"]))
        .step(StepDef::new("approve", approve).depends_on(["pause"]))
        .step(StepDef::new("flaky", flaky).depends_on(["approve"]).max_retry(3))
        .step(StepDef::new("ship", ship).depends_on(["flaky"]))
        .build()
        .unwrap()
}

/// An activity counted as `name` whose answer `answer` gives from the effects.
fn counted(
    fx: &Arc<Effects>,
    name: &'static str,
    answer: fn(&Effects) -> std::result::Result<StepOutcome, ActivityError>,
) -> impl Activity {
    let f = fx.clone();
    move |_c: ActivityContext| {
        let f = f.clone();
        async move {
            f.invoked(name);
            answer(&f)
        }
    }
}

/// `post → charge`: `charge` fails permanently into a dead letter (K-17.2); the workflow
/// waits for an operator.
fn dead_lettered(fx: &Arc<Effects>) -> Definition {
    let post = counted(fx, "post", |f| f.complete("post", json!("posted")));
    let charge = counted(fx, "charge", |_| Err(ActivityError::permanent("vendor unknown")));
    Definition::builder("dead_letter")
        .step(StepDef::new("post", post))
        .step(StepDef::new("charge", charge).depends_on(["post"]).on_failed(OnFailed::DeadLetter))
        .build()
        .unwrap()
}

/// `post → check`: `check` fails permanently, `post`'s inverse keeps failing, and the
/// failure path escalates it to a person through the task inbox (K-17.6).
fn escalating(fx: &Arc<Effects>) -> Definition {
    let post = counted(fx, "post", |f| f.complete("post", json!("posted")));
    let inverse = counted(fx, "post.inverse", |_| Err(ActivityError::transient("ledger unavailable")));
    let check = counted(fx, "check", |_| Err(ActivityError::permanent("check failed")));
    Definition::builder("escalation")
        .step(StepDef::new("post", post).compensate_with(inverse))
        .step(StepDef::new("check", check).depends_on(["post"]))
        .build()
        .unwrap()
}

#[derive(Clone, Copy)]
struct Scenario {
    name: &'static str,
    def: fn(&Arc<Effects>) -> Definition,
    /// Send the `go` signal once the first drive has come to rest.
    signal: bool,
    /// Let the dead-letter poll come due once the run is at rest: its visit writes a
    /// dead-letter record whose write was lost (K-17.2, K-9.5).
    poll: bool,
}

fn scenarios() -> [Scenario; 3] {
    [
        Scenario { name: "order", def: order, signal: true, poll: false },
        Scenario { name: "dead_letter", def: dead_lettered, signal: false, poll: true },
        Scenario { name: "escalation", def: escalating, signal: false, poll: false },
    ]
}

/// [`PortFaults`], and for every lost reply the position its write took in the store's
/// audit log (the write the store saw last when its answer was dropped).
struct Marking {
    faults: Arc<PortFaults>,
    audit: AuditStore,
    lost_at: Mutex<Vec<(String, usize)>>,
}

#[async_trait::async_trait]
impl PortHook for Marking {
    async fn before(&self, call: &PortCall) -> Result<()> {
        self.faults.before(call).await
    }
    fn reply(&self, call: &PortCall) -> Option<Error> {
        let lost = self.faults.reply(call)?;
        let at = self.audit.log().len();
        self.lost_at.lock().unwrap().push((call.to_string(), at));
        Some(lost)
    }
    fn after(&self, call: &PortCall, end: CallEnd, elapsed: DurationMs) {
        self.faults.after(call, end, elapsed);
    }
}

/// What one run showed.
#[derive(Debug)]
struct Run {
    status: WorkflowStatus,
    /// Completing invocations per step, and the model calls of `lookup`.
    completed: BTreeMap<&'static str, u64>,
    dead_letters: usize,
    tasks: usize,
    answered_writes: BTreeMap<String, u64>,
    lost: u64,
    /// Store writes under a claim token whose reply was lost.
    store_replies_lost: usize,
    /// Writes made under the token of a store write whose reply was lost, after that
    /// write (accepted or not: the claim must end, K-6.4).
    writes_after_uncertain: usize,
    /// Requests a client (the test) repeated because their reply was lost.
    client_retries: u64,
    /// Drive passes run again after one failed on a lost reply.
    drive_retries: u64,
}

/// Run `scenario` to rest; `lose`: the reply of the `skip`-th later answered write of
/// `port.op` is lost.
async fn run(seed: u64, scenario: Scenario, lose: Option<(&str, u64)>) -> Run {
    let world = World::new(seed);
    let fx = Arc::new(Effects::default());
    let faults = PortFaults::new(world.clock.clone());
    let hook = Arc::new(Marking { faults: faults.clone(), audit: world.audit.clone(), lost_at: Mutex::default() });
    let engine = Engine::builder(world.ports())
        .config(test_config("w"))
        .register((scenario.def)(&fx))
        .port_hook(hook.clone())
        .build()
        .unwrap();
    if let Some((call, skip)) = lose {
        faults.lose_replies(call, skip, 1);
    }
    let mut client_retries = 0;
    // A client repeats a request whose reply it did not get; both requests are idempotent.
    let start = StartRequest::new(scenario.name, "b", json!({})).workflow_id("wf");
    while let Err(e) = engine.publisher().start_or_resume(start.clone()).await {
        assert!(matches!(e, Error::Uncertain { .. }) && client_retries < 5, "start failed: {e}");
        client_retries += 1;
    }
    let mut drive_retries = drive(&world, &engine).await;
    if scenario.signal {
        let go = Signal {
            signal_id: "go-1".into(),
            workflow_id: "wf".into(),
            signal_type: "go".into(),
            wait_key: "k".into(),
            generation: 0,
        };
        while let Err(e) = engine.deliver_signal(go.clone()).await {
            assert!(matches!(e, Error::Uncertain { .. }) && client_retries < 5, "the signal failed: {e}");
            client_retries += 1;
        }
        drive_retries += drive(&world, &engine).await;
    }
    if scenario.poll {
        world.clock.advance(engine.config().dead_letter_poll_ms);
        drive_retries += drive(&world, &engine).await;
    }
    let inst = world.store.peek("wf").expect("the instance exists");
    let log = world.audit.log();
    let (mut store_replies_lost, mut writes_after_uncertain) = (0, 0);
    for (call, at) in hook.lost_at.lock().unwrap().iter() {
        if !(call.starts_with("store.") || call.starts_with("heartbeat.")) {
            continue;
        }
        let lost = &log[at - 1];
        assert!(matches!(lost.outcome, AuditOutcome::Applied { .. }), "{call}: the lost write took effect: {lost:?}");
        let Some(token) = lost.token.clone() else { continue };
        store_replies_lost += 1;
        writes_after_uncertain += log[*at..].iter().filter(|w| w.token.as_ref() == Some(&token)).count();
    }
    let mut completed = fx.completed();
    completed.insert("lookup.model", fx.model_calls.load(Ordering::SeqCst));
    completed.retain(|_, n| *n > 0);
    Run {
        status: inst.status,
        completed,
        dead_letters: world.dead_letters.all().len(),
        tasks: world.task_inbox.all().len(),
        answered_writes: faults.answered_writes(),
        lost: faults.lost_replies(),
        store_replies_lost,
        writes_after_uncertain,
        client_retries,
        drive_retries,
    }
}

/// Drive to rest; a pass that failed on a lost reply (a maintenance or scheduling call
/// outside a claim) is run again, as a worker's loop would. Returns the passes run again.
async fn drive(world: &World, engine: &Engine) -> u64 {
    let mut again = 0;
    while let Err(e) = world.drive(engine).await {
        assert!(matches!(e, Error::Uncertain { .. }) && again < 5, "the drive failed: {e}");
        again += 1;
    }
    again
}

/// K-6.8, K-6.4, K-7.3: the reply of any one write of the engine can be lost — the effect
/// happened, the engine heard "uncertain" — and the workflow still ends as it does without
/// the fault; every step that completed without the fault completed with it, none ran more
/// than twice, and no claim wrote again under its token after a store write whose reply it
/// lost. Prints the `lost-replies:` figure line.
#[tokio::test]
async fn a_lost_reply_of_any_write_ends_like_the_faultless_run_with_no_blind_retry() {
    let mut calls = std::collections::BTreeSet::new();
    let mut n = Figures::default();
    for (i, scenario) in scenarios().into_iter().enumerate() {
        let seed = 300 + i as u64;
        let base = run(seed, scenario, None).await;
        assert_eq!(base.lost, 0);
        assert!(!base.completed.is_empty(), "{}: nothing completed without a fault", scenario.name);
        assert!(
            base.completed.values().all(|n| *n == 1),
            "{}: the faultless run re-ran a step: {base:?}",
            scenario.name
        );
        for (call, writes) in &base.answered_writes {
            calls.insert(call.clone());
            for skip in 0..*writes {
                let r = run(seed, scenario, Some((call, skip))).await;
                let what = format!("{}: reply {} of {call} lost", scenario.name, skip + 1);
                assert_eq!(r.lost, 1, "{what}: the fault did not fire");
                n.lost += r.lost;
                n.store_lost += r.store_replies_lost as u64;
                assert_eq!(r.status, base.status, "{what}: ended otherwise: {r:#?}");
                n.same_end += 1;
                n.completed += u64::from(r.status == WorkflowStatus::Completed);
                for step in base.completed.keys() {
                    let ran = r.completed.get(step).copied().unwrap_or(0);
                    assert!(ran >= 1, "{what}: {step} never completed: {r:#?}");
                    n.reruns += ran - 1;
                    n.beyond += ran.saturating_sub(2);
                }
                assert_eq!(r.dead_letters, base.dead_letters, "{what}: dead letters recorded: {r:#?}");
                assert_eq!(r.tasks, base.tasks, "{what}: tasks opened: {r:#?}");
                n.unconditional += r.writes_after_uncertain as u64;
                n.client += r.client_retries;
                n.drives += r.drive_retries;
            }
        }
    }
    println!(
        "lost-replies: calls={} writes_lost={} store_writes_lost={} same_end={} workflows_completed={} steps_rerun={} client_retries={} drive_retries={} duplicate_effects_beyond_one_retry={} unconditional_retries={}",
        calls.len(),
        n.lost,
        n.store_lost,
        n.same_end,
        n.completed,
        n.reruns,
        n.client,
        n.drives,
        n.beyond,
        n.unconditional
    );
    assert_eq!(n.beyond, 0, "a completed step (or the model call) ran more than twice");
    assert_eq!(n.unconditional, 0, "a claim wrote again under its token after a store write whose reply it lost");
}

/// The counts of the figure line.
#[derive(Default)]
struct Figures {
    lost: u64,
    store_lost: u64,
    same_end: u64,
    completed: u64,
    reruns: u64,
    beyond: u64,
    unconditional: u64,
    client: u64,
    drives: u64,
}
