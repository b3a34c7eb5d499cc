//! Model-based property test (K-3): random interleavings of start, duplicate start, claims
//! by several workers, crashes and lease expiry, old workers returning late, signals early /
//! late / duplicated / stale, timers, queue flushes, cancel and failed replay. Safety
//! invariants are checked after every operation; liveness after a final drain.
//!
//! Cases: 64 by default (CI); set `KERNEL_MODEL_CASES` to run more locally.

use kernel_core::ports::*;
use kernel_core::WorkflowId;
use kernel_core::*;
use proptest::prelude::*;
use serde_json::json;
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use testkit::faults::{CrashPlan, CrashSwitch, TakeoverPause};
use testkit::harness::{test_config, BoxFuture, World};

const KEYS: u8 = 3;

#[derive(Debug, Clone)]
enum Op {
    Start { k: u8, fail: bool, generation: u8 },
    Tick { w: u8 },
    CrashTick { at: u8, after: bool },
    ZombieReturns,
    TakeoverWithZombie { w: u8 },
    Advance { ms: u32 },
    ExpireLeases,
    Maintain,
    Signal { k: u8, stale: bool, duplicate: bool },
    FlushQueue,
    Cancel { k: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..KEYS, any::<bool>(), 0u8..2).prop_map(|(k, fail, generation)| Op::Start { k, fail, generation }),
        6 => (0u8..3).prop_map(|w| Op::Tick { w }),
        2 => (0u8..12, any::<bool>()).prop_map(|(at, after)| Op::CrashTick { at, after }),
        2 => Just(Op::ZombieReturns),
        2 => (0u8..3).prop_map(|w| Op::TakeoverWithZombie { w }),
        2 => (1u32..20_000).prop_map(|ms| Op::Advance { ms }),
        1 => Just(Op::ExpireLeases),
        2 => Just(Op::Maintain),
        3 => (0..KEYS, any::<bool>(), any::<bool>()).prop_map(|(k, stale, duplicate)| Op::Signal { k, stale, duplicate }),
        1 => Just(Op::FlushQueue),
        1 => (0..KEYS).prop_map(|k| Op::Cancel { k }),
    ]
}

type Facts = Arc<Mutex<HashSet<String>>>;

fn definition(facts: Facts) -> Definition {
    let f = facts.clone();
    Definition::builder("sig")
        .step(StepDef::new("await", move |c: ActivityContext| {
            let f = f.clone();
            async move {
                let key = c.input()["key"].as_str().unwrap_or_default().to_string();
                if f.lock().unwrap().contains(&key) {
                    return Ok(StepOutcome::complete(json!("ready")));
                }
                let generation = c.input()["generation"].as_u64().unwrap_or(0);
                Ok(StepOutcome::wait_for_signal("go", key).generation(generation).poll_after_ms(60_000).into())
            }
        }))
        .step(StepDef::new("nap", |c: ActivityContext| async move {
            if c.checkpoint().is_none() {
                return Ok(StepOutcome::sleep(10_000, json!({ "slept": true })));
            }
            Ok(StepOutcome::complete(json!("rested")))
        }))
        .step(StepDef::new("finish", |c: ActivityContext| async move {
            if c.input()["fail"] == json!(true) {
                return Err(ActivityError::permanent("this round is doomed"));
            }
            Ok(StepOutcome::complete(json!("done")))
        }))
        .failure_finalizer(|_c: ActivityContext| async { Ok(StepOutcome::complete(json!(null))) })
        .build()
        .unwrap()
}

/// Safety invariants of one instance and of its change since the previous snapshot.
fn check_instance(prev: Option<&WorkflowInstance>, i: &WorkflowInstance) -> Result<(), String> {
    let waiting_steps: Vec<usize> =
        i.steps.iter().enumerate().filter(|(_, s)| s.status == StepStatus::Waiting).map(|(n, _)| n).collect();
    match i.status {
        WorkflowStatus::Waiting => {
            let w = i.wait.as_ref().ok_or("waiting without a wait")?;
            if i.claim_token.is_some() {
                return Err("waiting instance holds a claim".into());
            }
            if waiting_steps != vec![w.step_index() as usize] {
                return Err(format!("waiting steps {waiting_steps:?} vs wait.step_index {}", w.step_index()));
            }
        }
        s => {
            if i.wait.is_some() {
                return Err(format!("{s:?} instance has a wait"));
            }
            // A supersede freezes the steps as they were; every other state has no waiting step.
            if s != WorkflowStatus::Canceled && !waiting_steps.is_empty() {
                return Err(format!("{s:?} instance has waiting steps {waiting_steps:?}"));
            }
        }
    }
    if i.status.is_terminal() && i.claim_token.is_some() {
        return Err("terminal instance holds a claim".into());
    }
    for s in &i.steps {
        if s.status == StepStatus::Completed && !i.output.contains_key(&s.name) {
            return Err(format!("completed step {} without output", s.name));
        }
    }
    if let Some(p) = prev {
        if i.revision < p.revision {
            return Err(format!("revision went back {} → {}", p.revision, i.revision));
        }
        if i.retry_count < p.retry_count {
            return Err("retry_count went back".into());
        }
        if matches!(p.status, WorkflowStatus::Completed | WorkflowStatus::Canceled) && i != p {
            return Err(format!("{:?} instance changed", p.status));
        }
        if p.status == WorkflowStatus::Failed
            && i.status != WorkflowStatus::Failed
            && i.retry_count != p.retry_count + 1
        {
            return Err("left failed without a replay".into());
        }
        for (a, b) in p.steps.iter().zip(&i.steps) {
            if a.status == StepStatus::Completed && b.status != StepStatus::Completed {
                return Err(format!("completed step {} reverted to {:?}", a.name, b.status));
            }
        }
    }
    Ok(())
}

struct Model {
    world: World,
    facts: Facts,
    workers: Vec<Engine>,
    zombies: Vec<(Arc<CrashSwitch>, BoxFuture<'static, ()>)>,
    switches: Vec<Arc<CrashSwitch>>,
    ids: BTreeMap<String, WorkflowId>,
    last_signal: BTreeMap<u8, String>,
    signals: u32,
    snapshot: BTreeMap<WorkflowId, WorkflowInstance>,
}

impl Model {
    fn new(seed: u64) -> Self {
        let world = World::new(seed);
        let facts: Facts = Arc::default();
        let workers = (0..3).map(|w| world.engine(&format!("w{w}"), vec![definition(facts.clone())])).collect();
        Model {
            world,
            facts,
            workers,
            zombies: vec![],
            switches: vec![],
            ids: BTreeMap::new(),
            last_signal: BTreeMap::new(),
            signals: 0,
            snapshot: BTreeMap::new(),
        }
    }

    fn key(k: u8) -> String {
        format!("k{k}")
    }

    async fn apply(&mut self, op: &Op) -> Result<(), String> {
        match op {
            Op::Start { k, fail, generation } => {
                let input = json!({ "key": Self::key(*k), "fail": fail, "generation": generation });
                let out = self.workers[0]
                    .publisher()
                    .start_or_resume(StartRequest::new("sig", format!("biz-{k}"), input))
                    .await
                    .map_err(|e| e.to_string())?;
                let id = self.ids.entry(format!("biz-{k}")).or_insert_with(|| out.instance.workflow_id.clone());
                if *id != out.instance.workflow_id {
                    return Err("K-3.2: a second workflow id for one biz_key".into());
                }
            }
            Op::Tick { w } => {
                self.workers[*w as usize].tick().await.map_err(|e| e.to_string())?;
            }
            Op::CrashTick { at, after } => {
                let plan = if *after { CrashPlan::After(*at as u64) } else { CrashPlan::Before(*at as u64) };
                let (engine, switch) = self.world.crashing_engine("z", vec![definition(self.facts.clone())], plan);
                let mut fut: BoxFuture<'static, ()> = Box::pin(async move {
                    let _ = engine.tick().await;
                });
                let crashed = tokio::select! {
                    _ = &mut fut => false,
                    _ = switch.wait_crashed() => true,
                };
                self.switches.push(switch.clone());
                if crashed {
                    self.zombies.push((switch, fut));
                }
            }
            Op::ZombieReturns => {
                if !self.zombies.is_empty() {
                    let (switch, fut) = self.zombies.remove(0);
                    switch.release();
                    tokio::time::timeout(std::time::Duration::from_secs(20), fut)
                        .await
                        .map_err(|_| "zombie hung".to_string())?;
                }
            }
            Op::TakeoverWithZombie { w } => {
                if self.zombies.is_empty() {
                    return self.check();
                }
                // Leases expire, a worker takes over and is paused right after its claim;
                // the oldest zombie returns and tries its pending write against the new token.
                self.world.clock.advance(30_001);
                self.workers[*w as usize].maintain().await.map_err(|e| e.to_string())?;
                let pause = Arc::new(TakeoverPause::new(self.world.ports().store, self.world.durable.clone()));
                let mut ports = self.world.ports();
                ports.store = pause.clone();
                let engine = self.world.engine_on(ports, test_config("taker"), vec![definition(self.facts.clone())]);
                let mut fut: BoxFuture<'static, ()> = Box::pin(async move {
                    let _ = engine.tick().await;
                });
                let paused = tokio::select! {
                    _ = &mut fut => false,
                    _ = pause.wait_paused() => true,
                };
                let (switch, zombie) = self.zombies.remove(0);
                switch.release();
                tokio::time::timeout(std::time::Duration::from_secs(20), zombie)
                    .await
                    .map_err(|_| "zombie hung".to_string())?;
                pause.resume();
                if paused {
                    fut.await;
                }
            }
            Op::Advance { ms } => self.world.clock.advance(*ms as i64),
            Op::ExpireLeases => self.world.clock.advance(30_001),
            Op::Maintain => {
                self.workers[0].maintain().await.map_err(|e| e.to_string())?;
            }
            Op::Signal { k, stale, duplicate } => {
                let Some(id) = self.ids.get(&format!("biz-{k}")).cloned() else { return Ok(()) };
                let inst = self.world.store.peek(&id).expect("started");
                let generation = inst.input["generation"].as_u64().unwrap_or(0);
                let generation = if *stale { generation + 7 } else { generation };
                // Business fact first, then the doorbell (K-9.3); a stale doorbell carries none.
                if !stale {
                    self.facts.lock().unwrap().insert(Self::key(*k));
                }
                let signal_id = match (duplicate, self.last_signal.get(k)) {
                    (true, Some(prev)) => prev.clone(),
                    _ => {
                        self.signals += 1;
                        format!("sig-{k}-{}", self.signals)
                    }
                };
                self.last_signal.insert(*k, signal_id.clone());
                let s = Signal {
                    signal_id,
                    workflow_id: id.clone(),
                    signal_type: "go".into(),
                    wait_key: Self::key(*k),
                    generation,
                };
                let out = self.workers[1].deliver_signal(s).await.map_err(|e| e.to_string())?;
                if *stale && out == DeliverOutcome::Activated {
                    return Err("K-9.6: a stale-generation signal woke a wait".into());
                }
            }
            Op::FlushQueue => self.world.queue.flush(),
            Op::Cancel { k } => {
                if let Some(id) = self.ids.get(&format!("biz-{k}")) {
                    self.workers[2].cancel(id).await.map_err(|e| e.to_string())?;
                }
            }
        }
        self.check()
    }

    fn check(&mut self) -> Result<(), String> {
        let all = self.world.store.all();
        for (biz, id) in &self.ids {
            let n = all.iter().filter(|i| &i.biz_key == biz).count();
            if n != 1 || !all.iter().any(|i| &i.workflow_id == id) {
                return Err(format!("K-3.2: {n} instances for {biz}"));
            }
        }
        for i in &all {
            check_instance(self.snapshot.get(&i.workflow_id), i).map_err(|e| format!("{}: {e}", i.workflow_id))?;
        }
        let dup = self.world.audit.counts().duplicate_step_completions();
        if dup > 0 {
            return Err(format!("K-3.4: {dup} duplicate step completions"));
        }
        for s in &self.switches {
            if s.zombie_stats().stale_writes_accepted > 0 {
                return Err("K-3.4: a stale token write was accepted".into());
            }
        }
        self.snapshot = all.into_iter().map(|i| (i.workflow_id.clone(), i)).collect();
        Ok(())
    }

    /// Liveness: release every zombie, make every business fact true, drain with a fresh
    /// worker in simulated time; every instance must end terminal.
    async fn drain(&mut self) -> Result<(), String> {
        while !self.zombies.is_empty() {
            self.apply(&Op::ZombieReturns).await?;
        }
        for k in 0..KEYS {
            self.facts.lock().unwrap().insert(Self::key(k));
        }
        self.world.clock.advance(30_001);
        let fresh = self.world.engine("drain", vec![definition(self.facts.clone())]);
        self.world.drive(&fresh).await.map_err(|e| e.to_string())?;
        self.check()?;
        for i in self.world.store.all() {
            if !i.status.is_terminal() {
                return Err(format!("liveness: {} ended {:?}", i.workflow_id, i.status));
            }
        }
        Ok(())
    }
}

fn run(seed: u64, ops: &[Op]) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut m = Model::new(seed);
        for (n, op) in ops.iter().enumerate() {
            m.apply(op).await.map_err(|e| format!("after op {n} {op:?}: {e}"))?;
        }
        m.drain().await.map_err(|e| format!("drain: {e}"))
    })
}

fn cases() -> u32 {
    std::env::var("KERNEL_MODEL_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn random_interleavings_keep_k3(seed in 0u64..1_000, ops in proptest::collection::vec(op(), 1..=40)) {
        if let Err(e) = run(seed, &ops) {
            prop_assert!(false, "{}", e);
        }
    }
}

/// A fixed interleaving that exercises every operation once, so a regression in any of them
/// fails even when the random search is unlucky.
#[test]
fn every_operation_once() {
    let ops = vec![
        Op::Start { k: 0, fail: true, generation: 1 },
        Op::Start { k: 1, fail: false, generation: 0 },
        Op::Signal { k: 1, stale: false, duplicate: false },
        Op::Start { k: 0, fail: true, generation: 1 },
        Op::Tick { w: 0 },
        Op::CrashTick { at: 2, after: false },
        Op::Signal { k: 0, stale: true, duplicate: false },
        Op::Signal { k: 1, stale: false, duplicate: true },
        Op::ExpireLeases,
        Op::Tick { w: 1 },
        Op::ZombieReturns,
        Op::CrashTick { at: 1, after: true },
        Op::TakeoverWithZombie { w: 2 },
        Op::FlushQueue,
        Op::Maintain,
        Op::Advance { ms: 10_000 },
        Op::Maintain,
        Op::Tick { w: 2 },
        Op::Signal { k: 0, stale: false, duplicate: false },
        Op::Tick { w: 0 },
        Op::Advance { ms: 10_000 },
        Op::Maintain,
        Op::Tick { w: 0 },
        Op::Start { k: 0, fail: false, generation: 1 },
        Op::Start { k: 2, fail: false, generation: 0 },
        Op::Cancel { k: 2 },
        Op::Tick { w: 1 },
    ];
    run(11, &ops).unwrap();
}
