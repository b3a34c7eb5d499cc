//! Fault decorators over any port: crash before/after a call (by index or by named
//! boundary), an auditing store that counts writes and duplicate completions, lost wakeups
//! and flushed queues (see [`InMemoryQueue::flush`](crate::memory::InMemoryQueue::flush),
//! [`InMemoryWakeup::set_lossy`](crate::memory::InMemoryWakeup::set_lossy)).
//!
//! A crash is modelled as in TigerBeetle's and object_store's harnesses: the durable state
//! survives (it lives behind the decorator), the process's every later call parks forever,
//! and a later [`CrashSwitch::release`] lets the parked "zombie" continue, so its pending
//! write can be shown to be fenced. [`CrashPlan::Every`] instead fails every n-th boundary
//! call and lets the same process go on, so one engine's life crosses many crash points.
//!
//! Every decorator here implements every method of the port it wraps (enforced with
//! `clippy::missing_trait_methods`), so a default body can never change meaning under a
//! wrapper — the way a permit renewal once became a counted start.

mod audit;
mod counting_queue;
mod crash_ports;
mod takeover;

pub use self::audit::*;
pub use self::counting_queue::*;
pub use self::crash_ports::*;
pub use self::takeover::*;

use kernel_core::{Error, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// Name of a persistence boundary: port and operation.
pub type BoundaryName = &'static str;

/// Where to crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPlan {
    /// Never crash; only count boundaries.
    Never,
    /// Crash before the call with this 0-based boundary index reaches the port.
    Before(u64),
    /// Crash after that call took effect, before its result is seen.
    After(u64),
    /// Crash before the n-th (0-based) call of this named boundary.
    BeforeNamed(BoundaryName, u64),
    /// Crash after the n-th (0-based) call of this named boundary.
    AfterNamed(BoundaryName, u64),
    /// Fire at every `n`-th boundary (the n-th, 2n-th, … — 1-based; `n = 1` fires at
    /// every one) without killing the process: on [`CrashSide::Before`] the call never
    /// reaches the port and fails with [`Error::Unavailable`]; on [`CrashSide::After`] the
    /// call takes effect and its result is lost as [`Error::Uncertain`]. The engine's own
    /// error handling is what recovers (an uncertain write ends the claim and leaves the
    /// lease to expire, as a crash would; an unavailable one hands the claim back with a
    /// delay), so one engine lives through many crash points.
    /// `n = 0` never fires. Every firing is listed by [`CrashSwitch::fired`].
    ///
    /// The schedule is deterministic: when a recovery cycle (lease expiry, re-claim, retry)
    /// crosses a multiple of `n` boundaries, a `Before` plan fails the same write on every
    /// cycle and the workflow never gets past it. Pick a period that is not such a multiple,
    /// or use `After`, whose failed writes took effect.
    ///
    /// ```
    /// use testkit::faults::{CrashPlan, CrashSide};
    /// // Lose the result of every third durable call, over the engine's whole life.
    /// let plan = CrashPlan::Every { n: 3, side: CrashSide::After };
    /// # let _ = plan;
    /// ```
    Every {
        /// Period, in boundary calls.
        n: u64,
        /// Whether the call is dropped (before) or its result lost (after).
        side: CrashSide,
    },
}

/// Which side of a boundary call a repeated crash hits ([`CrashPlan::Every`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashSide {
    /// The call does not reach the port.
    Before,
    /// The call took effect; the caller never sees its result.
    After,
}

/// One firing of a [`CrashPlan::Every`] switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fired {
    /// 0-based index of the boundary in the switch's log.
    pub index: u64,
    /// The boundary.
    pub name: BoundaryName,
    /// Before or after the call.
    pub side: CrashSide,
}

/// What the switch decided for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// Let the call through.
    Pass,
    /// Let it through, then die.
    DieAfter,
    /// Refuse it: the port never sees it.
    FailBefore(BoundaryName),
    /// Let it through and lose its result.
    FailAfter(BoundaryName),
}

impl Gate {
    /// Run `call` as this gate says.
    async fn run<T, F: std::future::Future<Output = Result<T>>>(self, switch: &CrashSwitch, call: F) -> Result<T> {
        match self {
            Gate::FailBefore(name) => Err(Error::unavailable(format!("crash switch: fired before {name}"))),
            Gate::FailAfter(name) => {
                call.await.and_then(|_| Err(Error::uncertain(format!("crash switch: fired after {name}"))))
            }
            Gate::Pass => call.await,
            Gate::DieAfter => {
                let r = call.await;
                switch.leave(true).await;
                r
            }
        }
    }
}

#[derive(Debug, Default)]
struct SwitchState {
    log: Vec<BoundaryName>,
    per_name: BTreeMap<BoundaryName, u64>,
    crashed_at: Option<(u64, BoundaryName)>,
    fired: Vec<Fired>,
    idle: BTreeSet<u64>,
}

/// Counters of what a released zombie tried.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ZombieStats {
    /// Token-guarded writes the zombie attempted after release with a token that was no
    /// longer the current one.
    pub stale_writes_attempted: u64,
    /// Of those, how many the store accepted (must be 0).
    pub stale_writes_accepted: u64,
}

/// Shared controller of one simulated process's port calls.
#[derive(Debug)]
pub struct CrashSwitch {
    plan: CrashPlan,
    state: Mutex<SwitchState>,
    crashed: watch::Sender<bool>,
    released: watch::Sender<bool>,
    zombie_attempted: AtomicU64,
    zombie_accepted: AtomicU64,
}

impl CrashSwitch {
    /// A switch following `plan`.
    pub fn new(plan: CrashPlan) -> Arc<Self> {
        Arc::new(CrashSwitch {
            plan,
            state: Mutex::default(),
            crashed: watch::Sender::new(false),
            released: watch::Sender::new(false),
            zombie_attempted: AtomicU64::new(0),
            zombie_accepted: AtomicU64::new(0),
        })
    }
    /// Boundaries crossed so far, in order.
    pub fn log(&self) -> Vec<BoundaryName> {
        self.state.lock().expect("switch lock").log.clone()
    }
    /// The boundary the process died at.
    pub fn crashed_at(&self) -> Option<(u64, BoundaryName)> {
        self.state.lock().expect("switch lock").crashed_at
    }
    /// Every firing of a [`CrashPlan::Every`] plan so far, in order (empty for the other
    /// plans, whose one crash is [`crashed_at`](Self::crashed_at)).
    pub fn fired(&self) -> Vec<Fired> {
        self.state.lock().expect("switch lock").fired.clone()
    }
    /// Indices (in [`log`](Self::log)) of boundary calls that changed nothing: a purge
    /// that deleted no record. A crash on either side of such a call is the same state as
    /// a crash next to it, so a sweep does not count them as crash points.
    pub fn idle(&self) -> BTreeSet<u64> {
        self.state.lock().expect("switch lock").idle.clone()
    }
    /// Whether the process has died.
    pub fn is_crashed(&self) -> bool {
        *self.crashed.borrow()
    }
    /// Resolves when the process dies.
    pub async fn wait_crashed(&self) {
        let mut rx = self.crashed.subscribe();
        while !*rx.borrow_and_update() {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
    /// Die now: every later call of this process parks (a crash injected from inside an
    /// activity, e.g. "the process died during compose").
    pub fn crash_now(&self) {
        {
            let mut st = self.state.lock().expect("switch lock");
            let idx = st.log.len() as u64;
            st.crashed_at.get_or_insert((idx, "crash_now"));
        }
        self.crashed.send_replace(true);
    }

    /// Let the parked zombie continue.
    pub fn release(&self) {
        self.released.send_replace(true);
    }
    /// What the zombie tried after release.
    pub fn zombie_stats(&self) -> ZombieStats {
        ZombieStats {
            stale_writes_attempted: self.zombie_attempted.load(Ordering::SeqCst),
            stale_writes_accepted: self.zombie_accepted.load(Ordering::SeqCst),
        }
    }

    async fn wait_released(&self) {
        let mut rx = self.released.subscribe();
        while !*rx.borrow_and_update() {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Gate one call: whether it passes, fails on one side, or the process dies after it.
    async fn enter(&self, name: BoundaryName, boundary: bool) -> Gate {
        self.enter_at(name, boundary).await.0
    }

    /// [`enter`](Self::enter), also returning the boundary's index in the log (`None` for
    /// a call that is not a boundary or comes after the crash).
    async fn enter_at(&self, name: BoundaryName, boundary: bool) -> (Gate, Option<u64>) {
        if self.is_crashed() {
            self.wait_released().await;
            return (Gate::Pass, None);
        }
        if !boundary {
            return (Gate::Pass, None);
        }
        let (index, nth) = {
            let mut st = self.state.lock().expect("switch lock");
            let index = st.log.len() as u64;
            st.log.push(name);
            let nth = st.per_name.entry(name).or_insert(0);
            let n = *nth;
            *nth += 1;
            (index, n)
        };
        let (before, after) = match self.plan {
            CrashPlan::Never => (false, false),
            CrashPlan::Before(i) => (i == index, false),
            CrashPlan::After(i) => (false, i == index),
            CrashPlan::BeforeNamed(b, n) => (b == name && n == nth, false),
            CrashPlan::AfterNamed(b, n) => (false, b == name && n == nth),
            CrashPlan::Every { n, side } => {
                if n == 0 || (index + 1) % n != 0 {
                    return (Gate::Pass, Some(index));
                }
                self.state.lock().expect("switch lock").fired.push(Fired { index, name, side });
                let gate = match side {
                    CrashSide::Before => Gate::FailBefore(name),
                    CrashSide::After => Gate::FailAfter(name),
                };
                return (gate, Some(index));
            }
        };
        if before {
            self.die(index, name);
            self.wait_released().await;
        }
        if after {
            self.state.lock().expect("switch lock").crashed_at = Some((index, name));
            return (Gate::DieAfter, Some(index));
        }
        (Gate::Pass, Some(index))
    }

    /// Note that the boundary call at `index` changed nothing.
    fn mark_idle(&self, index: Option<u64>) {
        if let Some(i) = index {
            self.state.lock().expect("switch lock").idle.insert(i);
        }
    }

    fn die(&self, index: u64, name: BoundaryName) {
        self.state.lock().expect("switch lock").crashed_at = Some((index, name));
        self.crashed.send_replace(true);
    }

    async fn leave(&self, die_after: bool) {
        if die_after {
            self.crashed.send_replace(true);
            self.wait_released().await;
        }
    }

    fn zombie_write(&self, applied: bool) {
        self.zombie_attempted.fetch_add(1, Ordering::SeqCst);
        if applied {
            self.zombie_accepted.fetch_add(1, Ordering::SeqCst);
        }
    }
}
