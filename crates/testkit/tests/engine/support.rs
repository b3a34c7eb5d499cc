//! Helpers several behaviour modules share: a store that fails or hangs on demand, the
//! signal-waiting definitions, and the small start/tick/settle steps the tests repeat.

#![allow(dead_code)]

use kernel_core::engine::{ClaimEnd, RoundOutcome};
use kernel_core::ports::*;
use kernel_core::transition::{Guard, Transition, TransitionKind};
use kernel_core::*;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

pub(crate) async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// How a [`TroubledStore`] answers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Trouble {
    None,
    /// A heartbeat write's outcome is unknown (a timeout, a lost connection).
    HeartbeatUncertain,
    /// Every call hangs forever: a primary that stopped answering.
    Hung,
}

/// A store decorator whose calls fail or hang on demand, counting the calls made since the
/// trouble started.
pub(crate) struct TroubledStore {
    pub(crate) inner: Arc<DynStore>,
    pub(crate) trouble: std::sync::Mutex<Trouble>,
    pub(crate) calls_in_trouble: AtomicU32,
    pub(crate) writes_after_uncertain: AtomicU32,
}

impl TroubledStore {
    pub(crate) fn new(inner: Arc<DynStore>) -> Arc<Self> {
        Arc::new(TroubledStore {
            inner,
            trouble: std::sync::Mutex::new(Trouble::None),
            calls_in_trouble: AtomicU32::new(0),
            writes_after_uncertain: AtomicU32::new(0),
        })
    }
    pub(crate) fn set(&self, t: Trouble) {
        *self.trouble.lock().unwrap() = t;
    }
    /// Hang if the store is hung; count the call otherwise in trouble.
    pub(crate) async fn gate(&self) {
        let t = *self.trouble.lock().unwrap();
        if t != Trouble::None {
            self.calls_in_trouble.fetch_add(1, Ordering::SeqCst);
        }
        if t == Trouble::Hung {
            std::future::pending::<()>().await;
        }
    }
}

#[async_trait::async_trait]
impl WorkflowStore for TroubledStore {
    async fn create(&self, instance: WorkflowInstance) -> Result<CreateOutcome> {
        self.gate().await;
        self.inner.create(instance).await
    }
    async fn get(&self, workflow_id: &WorkflowId) -> Result<Option<WorkflowInstance>> {
        self.gate().await;
        self.inner.get(workflow_id).await
    }
    async fn get_by_biz_key(&self, biz_key: &str) -> Result<Option<WorkflowInstance>> {
        self.gate().await;
        self.inner.get_by_biz_key(biz_key).await
    }
    async fn claim(&self, workflow_id: &WorkflowId, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        self.gate().await;
        self.inner.claim(workflow_id, spec).await
    }
    async fn claim_any(&self, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        self.gate().await;
        self.inner.claim_any(spec).await
    }
    async fn apply(&self, workflow_id: &WorkflowId, guard: &Guard, transition: &Transition) -> Result<WriteOutcome> {
        self.gate().await;
        if *self.trouble.lock().unwrap() == Trouble::HeartbeatUncertain {
            if transition.kinds().any(|k| k == TransitionKind::Heartbeat) {
                return Err(Error::uncertain("heartbeat: connection lost after send"));
            }
            self.writes_after_uncertain.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.apply(workflow_id, guard, transition).await
    }
    async fn scan_due_waits(&self, now: Instant, after: Option<&DueCursor>, limit: usize) -> Result<ScanPage<DueWait>> {
        self.gate().await;
        self.inner.scan_due_waits(now, after, limit).await
    }
    async fn scan_claimable(&self, after: Option<&WorkflowId>, limit: usize) -> Result<ScanPage<Candidate>> {
        self.gate().await;
        self.inner.scan_claimable(after, limit).await
    }
}

/// A one-step workflow whose activity runs until it is cancelled, counting cancellations;
/// a second step counts its entries.
pub(crate) fn until_cancelled(cancelled: Arc<AtomicU32>, second: Arc<AtomicU32>) -> Definition {
    let first = move |c: ActivityContext| {
        let cancelled = cancelled.clone();
        async move {
            c.cancellation().cancelled().await;
            cancelled.fetch_add(1, Ordering::SeqCst);
            Err(ActivityError::transient("cancelled"))
        }
    };
    let next = move |_c: ActivityContext| {
        let second = second.clone();
        async move {
            second.fetch_add(1, Ordering::SeqCst);
            Ok(StepOutcome::complete(json!(2)))
        }
    };
    Definition::builder("t")
        .step(StepDef::new("long", first).timeout_ms(3_600_000).max_retry(3))
        .step(StepDef::new("after", next))
        .build()
        .unwrap()
}

pub(crate) async fn tick_end(engine: &Engine) -> ClaimEnd {
    match engine.tick().await.unwrap() {
        RoundOutcome::Ran { end, .. } => end,
        other => panic!("expected a claim, got {other:?}"),
    }
}

pub(crate) fn signal_waiter(fact: Arc<Mutex<bool>>, generation: u64, poll: Option<i64>) -> Definition {
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

pub(crate) fn sig(id: &str, generation: u64) -> Signal {
    Signal {
        signal_id: id.into(),
        workflow_id: "wf-b".into(),
        signal_type: "go".into(),
        wait_key: "key-1".into(),
        generation,
    }
}

pub(crate) fn refused(b: kernel_core::definition::DefinitionBuilder) -> (String, String) {
    match b.build() {
        Err(Error::InvalidInput { field, reason, .. }) => (field, reason),
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

pub(crate) fn waits_for_approval(name: &str) -> Definition {
    Definition::builder(name)
        .step(StepDef::new("ask", |c: ActivityContext| async move {
            if c.resume().is_some() {
                return Ok(StepOutcome::complete(json!("approved")));
            }
            Ok(StepOutcome::wait_for_signal("approved", "doc:1").into())
        }))
        .build()
        .unwrap()
}

pub(crate) fn one_step(t: &str, a: impl Activity, f: impl FnOnce(StepDef) -> StepDef) -> Definition {
    Definition::builder(t).step(f(StepDef::new("only", a))).build().unwrap()
}

pub(crate) async fn start(engine: &Engine, t: &str, biz: &str, input: Value) -> StartOutcome {
    engine.publisher().start_or_resume(StartRequest::new(t, biz, input).workflow_id(format!("wf-{biz}"))).await.unwrap()
}
