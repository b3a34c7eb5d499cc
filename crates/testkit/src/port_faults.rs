//! [`PortFaults`]: a hung-port, refused-call and lost-reply injector for **any** port the
//! engine calls, through the engine's one envelope ([`PortHook`], K-6.8).
//!
//! The crash switch ([`faults`](crate::faults)) decorates ports one by one; this hook sits
//! in the envelope every port call passes through, so a port added to `Ports` is reachable
//! here without a new decorator. A hung call never reaches its port: it waits until
//! [`release`](PortFaults::release) — or until the envelope's deadline ends it, which is
//! what the tests of hung ports check. Every call is counted and every hung call's span
//! (start, end on the engine's clock) is kept, so a test can compare them with what the
//! store saw (an independent oracle: the audit log of the store's writes).
//!
//! A refused call ([`refuse`](PortFaults::refuse)) never reaches its port either; its
//! caller gets [`Error::Unavailable`] at once. A lost reply
//! ([`lose_reply`](PortFaults::lose_reply)) is a fault its caller cannot tell from a slow
//! port: the write reaches its port and takes effect, and its answer is dropped on the way
//! back — the caller gets [`Error::Uncertain`], as from a connection cut after the primary
//! committed.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use testkit::port_faults::PortFaults;
//! use testkit::harness::{test_config, World};
//! use kernel_core::engine::Engine;
//!
//! let world = World::new(1);
//! let faults = PortFaults::new(world.clock.clone());
//! faults.hang("dead_letters");
//! let engine = Engine::builder(world.ports()).config(test_config("w")).port_hook(faults.clone()).build().unwrap();
//! let pass = tokio::spawn(async move { engine.maintain().await });
//! // The hung purge waits until its deadline passes on the engine's (manual) clock.
//! for _ in 0..60 {
//!     tokio::task::yield_now().await;
//!     if pass.is_finished() {
//!         break;
//!     }
//!     world.clock.advance(1_000);
//! }
//! pass.await.unwrap().unwrap();
//! assert_eq!(faults.hung_calls().len(), 1);
//! # }
//! ```
//!
//! Losing the reply of the write that completes a step: the store has the step complete,
//! the claim heard an uncertain outcome and ended without writing again (K-6.4).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use kernel_core::engine::{ClaimEnd, Engine, RoundOutcome};
//! use kernel_core::{ActivityContext, Definition, StartRequest, StepDef, StepOutcome, WorkflowStatus};
//! use testkit::harness::{test_config, World};
//! use testkit::port_faults::PortFaults;
//!
//! let world = World::new(1);
//! let faults = PortFaults::new(world.clock.clone());
//! let step = StepDef::new("a", |_c: ActivityContext| async { Ok(StepOutcome::complete(serde_json::json!(1))) });
//! let def = Definition::builder("t").step(step).build().unwrap();
//! let engine =
//!     Engine::builder(world.ports()).config(test_config("w")).register(def).port_hook(faults.clone()).build().unwrap();
//! engine.publisher().start_or_resume(StartRequest::new("t", "b", serde_json::json!({})).workflow_id("wf")).await.unwrap();
//! // The claim's first write marks the step running; the second completes it and the workflow.
//! faults.lose_replies("store.apply", 1, 1);
//! let round = engine.tick().await.unwrap();
//! assert!(matches!(round, RoundOutcome::Ran { end: ClaimEnd::Uncertain, .. }), "{round:?}");
//! assert_eq!(faults.lost_replies(), 1);
//! assert_eq!(world.store.peek("wf").unwrap().status, WorkflowStatus::Completed);
//! // Create, claim, mark running, complete: the store saw nothing after the lost reply.
//! assert_eq!(world.audit.log().len(), 4);
//! # }
//! ```

use kernel_core::domain::{DurationMs, Instant};
use kernel_core::engine::{CallEnd, PortCall, PortHook};
use kernel_core::ports::DynClock;
use kernel_core::{Error, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// One hung call: which, and when it started and ended on the engine's clock (`end` is
/// `None` while it still waits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HungCall {
    /// `port.op`.
    pub call: String,
    /// When it reached the hook.
    pub start: Instant,
    /// When the envelope let the caller go (its deadline, or a release).
    pub end: Option<Instant>,
}

/// One lost reply: which write, and when its answer was dropped on the engine's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostReply {
    /// `port.op`.
    pub call: String,
    /// When the port's answer was dropped.
    pub at: Instant,
}

/// Replies of `target` to lose: let `skip` answered writes through, then lose `left`.
#[derive(Debug)]
struct LoseRule {
    target: String,
    skip: u64,
    left: u64,
}

#[derive(Debug, Default)]
struct State {
    hung: BTreeSet<String>,
    refused: BTreeSet<String>,
    calls: BTreeMap<String, u64>,
    ends: BTreeMap<String, BTreeMap<&'static str, u64>>,
    spans: Vec<HungCall>,
    lose: Vec<LoseRule>,
    answered_writes: BTreeMap<String, u64>,
    lost: Vec<LostReply>,
}

/// A [`PortHook`] that hangs or refuses the calls of chosen ports, loses the replies of
/// chosen writes, and counts every call.
pub struct PortFaults {
    clock: Arc<DynClock>,
    state: Mutex<State>,
    release: watch::Sender<u64>,
}

impl std::fmt::Debug for PortFaults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.state.lock().expect("faults lock");
        f.debug_struct("PortFaults")
            .field("hung", &st.hung)
            .field("refused", &st.refused)
            .field("lost", &st.lost.len())
            .finish_non_exhaustive()
    }
}

fn matches(target: &str, call: &PortCall) -> bool {
    target == call.port || target == format!("{}.{}", call.port, call.op)
}

impl PortFaults {
    /// A hook that hangs nothing yet; spans are read on `clock`.
    pub fn new(clock: Arc<DynClock>) -> Arc<Self> {
        Arc::new(PortFaults { clock, state: Mutex::default(), release: watch::channel(0).0 })
    }

    /// Hang every later call of `target`: a port (`dead_letters`) or one method
    /// (`dead_letters.record`).
    pub fn hang(&self, target: &str) {
        self.state.lock().expect("faults lock").hung.insert(target.to_string());
    }

    /// Refuse every later call of `target` (a port or `port.op`): it never reaches its
    /// port, the caller gets [`Error::Unavailable`] (an error that certainly had no effect).
    pub fn refuse(&self, target: &str) {
        self.state.lock().expect("faults lock").refused.insert(target.to_string());
    }

    /// Hang and refuse nothing more, and let every waiting call go on to its port.
    pub fn release(&self) {
        let mut st = self.state.lock().expect("faults lock");
        st.hung.clear();
        st.refused.clear();
        drop(st);
        self.release.send_modify(|n| *n += 1);
    }

    /// Lose the reply of the next write of `target` (a port, `dead_letters`, or one method,
    /// `store.apply`) its port answers: the write takes effect, the caller gets
    /// [`Error::Uncertain`]. Reads are never touched.
    pub fn lose_reply(&self, target: &str) {
        self.lose_replies(target, 0, 1);
    }

    /// Let the next `skip` answered writes of `target` through, then lose the replies of
    /// the `n` after them. Each rule counts the writes of its target from the moment it is
    /// made; a write is lost when any rule says so.
    pub fn lose_replies(&self, target: &str, skip: u64, n: u64) {
        let rule = LoseRule { target: target.to_string(), skip, left: n };
        self.state.lock().expect("faults lock").lose.push(rule);
    }

    /// How many replies were lost so far.
    pub fn lost_replies(&self) -> u64 {
        self.state.lock().expect("faults lock").lost.len() as u64
    }

    /// The lost replies, in order.
    pub fn lost(&self) -> Vec<LostReply> {
        self.state.lock().expect("faults lock").lost.clone()
    }

    /// Writes their port answered with a value, by `port.op` (a lost reply included): the
    /// writes whose reply could be lost.
    pub fn answered_writes(&self) -> BTreeMap<String, u64> {
        self.state.lock().expect("faults lock").answered_writes.clone()
    }

    /// Calls of `target` (a port or `port.op`) that reached the hook.
    pub fn calls(&self, target: &str) -> u64 {
        let st = self.state.lock().expect("faults lock");
        st.calls
            .iter()
            .filter(|(k, _)| k.as_str() == target || k.split('.').next() == Some(target))
            .map(|(_, n)| n)
            .sum()
    }

    /// The hung calls, in order.
    pub fn hung_calls(&self) -> Vec<HungCall> {
        self.state.lock().expect("faults lock").spans.clone()
    }

    /// Calls of `target` that ended as `end` (`answered`, `failed`, `deadline_passed`,
    /// `reply_lost`).
    pub fn ended(&self, target: &str, end: CallEnd) -> u64 {
        let key = end_name(end);
        let st = self.state.lock().expect("faults lock");
        st.ends
            .iter()
            .filter(|(k, _)| k.as_str() == target || k.split('.').next() == Some(target))
            .map(|(_, m)| m.get(key).copied().unwrap_or(0))
            .sum()
    }

    /// The ports whose calls reached the hook.
    pub fn ports_seen(&self) -> BTreeSet<String> {
        let st = self.state.lock().expect("faults lock");
        st.calls.keys().filter_map(|k| k.split('.').next()).map(str::to_string).collect()
    }
}

fn end_name(end: CallEnd) -> &'static str {
    match end {
        CallEnd::Answered => "answered",
        CallEnd::Failed => "failed",
        CallEnd::DeadlinePassed => "deadline_passed",
        CallEnd::ReplyLost => "reply_lost",
        CallEnd::Abandoned => "abandoned",
    }
}

#[async_trait::async_trait]
impl PortHook for PortFaults {
    async fn before(&self, call: &PortCall) -> Result<()> {
        let name = call.to_string();
        let hung = {
            let mut st = self.state.lock().expect("faults lock");
            *st.calls.entry(name.clone()).or_insert(0) += 1;
            if st.refused.iter().any(|t| matches(t, call)) {
                return Err(Error::unavailable(format!("{name}: refused (injected)")));
            }
            let hung = st.hung.iter().any(|t| matches(t, call));
            if hung {
                st.spans.push(HungCall { call: name.clone(), start: self.clock.now(), end: None });
            }
            hung
        };
        if !hung {
            return Ok(());
        }
        let mut rx = self.release.subscribe();
        let seen = *rx.borrow_and_update();
        // Dropped by the envelope at its deadline; a release lets the call go on.
        let _ = rx.wait_for(|n| *n != seen).await;
        Ok(())
    }

    fn reply(&self, call: &PortCall) -> Option<Error> {
        let name = call.to_string();
        let mut st = self.state.lock().expect("faults lock");
        *st.answered_writes.entry(name.clone()).or_insert(0) += 1;
        let mut lose = false;
        for rule in st.lose.iter_mut().filter(|r| matches(&r.target, call)) {
            if rule.skip > 0 {
                rule.skip -= 1;
            } else if rule.left > 0 {
                rule.left -= 1;
                lose = true;
            }
        }
        st.lose.retain(|r| r.left > 0);
        if !lose {
            return None;
        }
        st.lost.push(LostReply { call: name.clone(), at: self.clock.now() });
        Some(Error::uncertain(format!("{name}: the write was applied and its reply lost (injected)")))
    }

    fn after(&self, call: &PortCall, end: CallEnd, _elapsed: DurationMs) {
        let name = call.to_string();
        let now = self.clock.now();
        let mut st = self.state.lock().expect("faults lock");
        *st.ends.entry(name.clone()).or_default().entry(end_name(end)).or_insert(0) += 1;
        if let Some(span) = st.spans.iter_mut().rev().find(|s| s.call == name && s.end.is_none()) {
            span.end = Some(now);
        }
    }
}
