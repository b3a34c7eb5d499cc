use kernel_core::domain::{DurationMs, Instant, Priority};
use kernel_core::ports::*;
use kernel_core::WorkflowId;
use kernel_core::{validate, Error, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

pub use kernel_core::ports::LaneWeights;

#[derive(Debug, Default, Clone)]
struct Lane {
    by_member: BTreeMap<String, Instant>,
    by_score: BTreeSet<(Instant, String)>,
}

impl Lane {
    fn remove(&mut self, m: &str) -> bool {
        match self.by_member.remove(m) {
            Some(s) => {
                self.by_score.remove(&(s, m.to_string()));
                true
            }
            None => false,
        }
    }
    fn insert(&mut self, m: &str, score: Instant) {
        self.remove(m);
        self.by_member.insert(m.to_string(), score);
        self.by_score.insert((score, m.to_string()));
    }
    fn pop_due(&mut self, now: Instant) -> Option<String> {
        let first = self.by_score.iter().next().cloned()?;
        if first.0 > now {
            return None;
        }
        self.by_score.remove(&first);
        self.by_member.remove(&first.1);
        Some(first.1)
    }
    fn has_due(&self, now: Instant) -> bool {
        self.by_score.iter().next().is_some_and(|(s, _)| *s <= now)
    }
}

#[derive(Debug, Default, Clone)]
struct State {
    lanes: [Lane; 4],
    /// Lane whose block is being served.
    current: usize,
    /// Pops served in the current block.
    served: u32,
    /// Pops left in the burst window.
    burst_left: u32,
    /// Members popped per lane (what [`LaneStats::pops`] reports), bumped by every pop.
    pops: [u64; 4],
}

/// In-memory [`ReadyQueue`] implementing the 4-lane 8:6:4:2 weighted pop with the burst
/// window of K-13, exactly as the Redis adapter's Lua does (both run testkit's
/// `conformance::queue`).
///
/// The rotation, precisely:
/// - a block of lane `i` serves at most `weights[i]` pops, then the next lane's block
///   starts; a lane with nothing due is skipped at once and forfeits the rest of its block;
/// - one pop looks at five blocks at most: each lane once, then the starting lane again
///   with a fresh block; a pop that finds nothing therefore leaves the rotation on the lane
///   after the one it started on;
/// - a pop that finds nothing due in any lane arms the burst window: the next ≤ `burst`
///   pops take P0's earliest due member without touching the rotation, and the window ends
///   the first time P0 has nothing due (that pop then follows the rotation);
/// - within a lane, members leave by (score, member bytes), like a Redis ZSET;
/// - `pop_due(now, max)` is up to `max` of these pops in a row under one lock, stopped by
///   the first that finds nothing (which arms the burst window as a single empty pop
///   does); `enqueue_many` is its entries' enqueues in order under one lock;
/// - every popped member bumps its lane's pop counter ([`LaneStats::pops`]) under the same
///   lock; [`flush`](Self::flush) resets the counters with everything else.
#[derive(Debug, Clone)]
pub struct InMemoryQueue {
    state: Arc<Mutex<State>>,
    weights: LaneWeights,
    down: Arc<std::sync::atomic::AtomicBool>,
}

impl Default for InMemoryQueue {
    fn default() -> Self {
        Self::new(LaneWeights::default())
    }
}

impl InMemoryQueue {
    /// An empty queue.
    ///
    /// # Panics
    /// When `weights` fail [`LaneWeights::validate`].
    pub fn new(weights: LaneWeights) -> Self {
        if let Err(e) = weights.validate() {
            panic!("InMemoryQueue::new: {e}");
        }
        InMemoryQueue { state: Arc::default(), weights, down: Arc::default() }
    }
    /// Drop every member, the rotation state and the pop counters (a flushed Redis).
    pub fn flush(&self) {
        *self.state.lock().expect("queue lock") = State::default();
    }
    /// Make every call fail with `Unavailable` (a Redis outage) until called with `false`.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, std::sync::atomic::Ordering::SeqCst);
    }
    /// Lane of a member, if queued.
    pub fn lane_of(&self, member: &str) -> Option<Priority> {
        let st = self.state.lock().expect("queue lock");
        (0..4).find(|i| st.lanes[*i].by_member.contains_key(member)).map(|i| Priority::ALL[i])
    }
    /// Score of a member in its lane, if queued.
    pub fn score_of(&self, member: &str) -> Option<Instant> {
        let st = self.state.lock().expect("queue lock");
        st.lanes.iter().find_map(|l| l.by_member.get(member).copied())
    }
    /// Total members.
    pub fn len(&self) -> usize {
        self.state.lock().expect("queue lock").lanes.iter().map(|l| l.by_member.len()).sum()
    }
    /// Whether the queue holds no member.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn check_up(&self) -> Result<()> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::unavailable("in-memory queue is down"));
        }
        Ok(())
    }
}

impl State {
    /// One promote-only enqueue (K-13).
    fn enqueue(&mut self, workflow_id: &str, priority: Priority, claimable_at: Instant) {
        let target = priority.index();
        // Promote-only: a member already in a more urgent lane stays where it is.
        if (0..target).any(|i| self.lanes[i].by_member.contains_key(workflow_id)) {
            return;
        }
        for i in target + 1..4 {
            self.lanes[i].remove(workflow_id);
        }
        self.lanes[target].insert(workflow_id, claimable_at);
    }

    /// One weighted pop (K-13), advancing the rotation and burst state.
    fn pop(&mut self, weights: &LaneWeights, now: Instant) -> Option<String> {
        if self.burst_left > 0 {
            if let Some(m) = self.lanes[0].pop_due(now) {
                self.burst_left -= 1;
                self.pops[0] += 1;
                return Some(m);
            }
            // The window ends early the first time P0 has nothing due.
            self.burst_left = 0;
        }
        for _ in 0..5 {
            let cur = self.current;
            if self.served < weights.weights[cur] {
                if let Some(m) = self.lanes[cur].pop_due(now) {
                    self.served += 1;
                    self.pops[cur] += 1;
                    if self.served >= weights.weights[cur] {
                        self.current = (cur + 1) % 4;
                        self.served = 0;
                    }
                    return Some(m);
                }
            }
            // Nothing due (or block used up): skip at once, forfeiting the rest of the block.
            self.current = (cur + 1) % 4;
            self.served = 0;
        }
        if !(0..4).any(|i| self.lanes[i].has_due(now)) {
            self.burst_left = weights.burst;
        }
        None
    }
}

#[async_trait::async_trait]
impl ReadyQueue for InMemoryQueue {
    async fn enqueue(&self, workflow_id: &WorkflowId, priority: Priority, claimable_at: Instant) -> Result<()> {
        validate::identifier("workflow_id", workflow_id)?;
        self.check_up()?;
        self.state.lock().expect("queue lock").enqueue(workflow_id, priority, claimable_at);
        Ok(())
    }

    async fn enqueue_many(&self, entries: &[LaneEntry]) -> Result<()> {
        check_enqueue_many(entries)?;
        if entries.is_empty() {
            return Ok(());
        }
        self.check_up()?;
        // One lock: the batch is one atomic operation, as the Redis script is.
        let mut st = self.state.lock().expect("queue lock");
        for LaneEntry { workflow_id, priority, claimable_at } in entries {
            st.enqueue(workflow_id, *priority, *claimable_at);
        }
        Ok(())
    }

    async fn pop_due(&self, now: Instant, max: usize) -> Result<Vec<WorkflowId>> {
        check_pop_max(max)?;
        self.check_up()?;
        let mut st = self.state.lock().expect("queue lock");
        let mut out = Vec::new();
        while out.len() < max {
            match st.pop(&self.weights, now) {
                Some(m) => out.push(WorkflowId::from(m)),
                // The empty pop has armed the burst window; further pops would only turn
                // the rotation, which the contract stops at the first empty one.
                None => break,
            }
        }
        Ok(out)
    }

    async fn stats(&self, now: Instant) -> Result<[LaneStats; 4]> {
        self.check_up()?;
        let st = self.state.lock().expect("queue lock");
        let mut out = [LaneStats::default(); 4];
        for (i, lane) in st.lanes.iter().enumerate() {
            let ready = lane.by_score.iter().take_while(|(s, _)| *s <= now).count() as u64;
            out[i] = LaneStats {
                depth: lane.by_member.len() as u64,
                ready,
                delayed: lane.by_member.len() as u64 - ready,
                oldest_wait_ms: lane
                    .by_score
                    .iter()
                    .next()
                    .filter(|(s, _)| *s <= now)
                    .map_or(DurationMs::ZERO, |(s, _)| now - *s),
                pops: st.pops[i],
            };
        }
        Ok(out)
    }
}

/// In-memory doorbell: every subscriber gets a (coalesced) message per ring.
#[derive(Debug, Default, Clone)]
pub struct InMemoryWakeup {
    subs: Arc<Mutex<Vec<tokio::sync::mpsc::Sender<()>>>>,
    lose: Arc<std::sync::atomic::AtomicBool>,
}

impl InMemoryWakeup {
    /// A doorbell with no subscriber.
    pub fn new() -> Self {
        Self::default()
    }
    /// Drop every ring from now on (lost wakeups) until called with `false`.
    pub fn set_lossy(&self, lose: bool) {
        self.lose.store(lose, std::sync::atomic::Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl Wakeup for InMemoryWakeup {
    async fn notify(&self) -> Result<()> {
        if self.lose.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(());
        }
        let mut subs = self.subs.lock().expect("wakeup lock");
        subs.retain(|tx| !tx.is_closed());
        for tx in subs.iter() {
            let _ = tx.try_send(());
        }
        Ok(())
    }
    async fn subscribe(&self) -> Result<WakeupReceiver> {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        self.subs.lock().expect("wakeup lock").push(tx);
        Ok(rx)
    }
}
