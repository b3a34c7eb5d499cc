//! [`PortFaults`]: a hung-port injector for **any** port the engine calls, through the
//! engine's one envelope ([`PortHook`], K-6.8).
//!
//! The crash switch ([`faults`](crate::faults)) decorates ports one by one; this hook sits
//! in the envelope every port call passes through, so a port added to `Ports` is reachable
//! here without a new decorator. A hung call never reaches its port: it waits until
//! [`release`](PortFaults::release) — or until the envelope's deadline ends it, which is
//! what the tests of hung ports check. Every call is counted and every hung call's span
//! (start, end on the engine's clock) is kept, so a test can compare them with what the
//! store saw (an independent oracle: the audit log of the store's writes).
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

use kernel_core::engine::{CallEnd, PortCall, PortHook};
use kernel_core::model::{DurationMs, Instant};
use kernel_core::ports::DynClock;
use kernel_core::Result;
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

#[derive(Debug, Default)]
struct State {
    hung: BTreeSet<String>,
    calls: BTreeMap<String, u64>,
    ends: BTreeMap<String, BTreeMap<&'static str, u64>>,
    spans: Vec<HungCall>,
}

/// A [`PortHook`] that hangs the calls of chosen ports and counts every call.
pub struct PortFaults {
    clock: Arc<DynClock>,
    state: Mutex<State>,
    release: watch::Sender<u64>,
}

impl std::fmt::Debug for PortFaults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortFaults").field("hung", &self.state.lock().expect("faults lock").hung).finish()
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

    /// Hang nothing more, and let every waiting call go on to its port.
    pub fn release(&self) {
        self.state.lock().expect("faults lock").hung.clear();
        self.release.send_modify(|n| *n += 1);
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

    /// Calls of `target` that ended as `end` (`answered`, `failed`, `deadline_passed`).
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
    }
}

#[async_trait::async_trait]
impl PortHook for PortFaults {
    async fn before(&self, call: &PortCall) -> Result<()> {
        let name = call.to_string();
        let hung = {
            let mut st = self.state.lock().expect("faults lock");
            *st.calls.entry(name.clone()).or_insert(0) += 1;
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
