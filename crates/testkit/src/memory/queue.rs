use kernel_core::model::{Millis, Priority};
use kernel_core::ports::*;
use kernel_core::WorkflowId;
use kernel_core::{validate, Error, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

pub use kernel_core::ports::LaneWeights;

#[derive(Debug, Default, Clone)]
struct Lane {
    by_member: BTreeMap<String, Millis>,
    by_score: BTreeSet<(Millis, String)>,
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
    fn insert(&mut self, m: &str, score: Millis) {
        self.remove(m);
        self.by_member.insert(m.to_string(), score);
        self.by_score.insert((score, m.to_string()));
    }
    fn pop_due(&mut self, now: Millis) -> Option<String> {
        let first = self.by_score.iter().next().cloned()?;
        if first.0 > now {
            return None;
        }
        self.by_score.remove(&first);
        self.by_member.remove(&first.1);
        Some(first.1)
    }
    fn has_due(&self, now: Millis) -> bool {
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
}

/// In-memory [`ReadyQueue`] implementing the 4-lane 8:6:4:2 weighted pop with the burst
/// window of K-13, exactly as the Redis adapter's Lua does (both run
/// [`conformance::queue`](crate::conformance::queue)).
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
/// - within a lane, members leave by (score, member bytes), like a Redis ZSET.
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
    /// Drop every member and the rotation state (a flushed Redis).
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

#[async_trait::async_trait]
impl ReadyQueue for InMemoryQueue {
    async fn enqueue(&self, workflow_id: &WorkflowId, priority: Priority, claimable_at: Millis) -> Result<()> {
        validate::identifier("workflow_id", workflow_id)?;
        self.check_up()?;
        let mut st = self.state.lock().expect("queue lock");
        let target = priority.index();
        // Promote-only: a member already in a more urgent lane stays where it is.
        if (0..target).any(|i| st.lanes[i].by_member.contains_key(workflow_id.as_str())) {
            return Ok(());
        }
        for i in target + 1..4 {
            st.lanes[i].remove(workflow_id);
        }
        st.lanes[target].insert(workflow_id, claimable_at);
        Ok(())
    }

    async fn pop_due(&self, now: Millis) -> Result<Option<WorkflowId>> {
        self.check_up()?;
        let mut st = self.state.lock().expect("queue lock");
        if st.burst_left > 0 {
            if let Some(m) = st.lanes[0].pop_due(now) {
                st.burst_left -= 1;
                return Ok(Some(m.into()));
            }
            // The window ends early the first time P0 has nothing due.
            st.burst_left = 0;
        }
        for _ in 0..5 {
            let cur = st.current;
            if st.served < self.weights.weights[cur] {
                if let Some(m) = st.lanes[cur].pop_due(now) {
                    st.served += 1;
                    if st.served >= self.weights.weights[cur] {
                        st.current = (cur + 1) % 4;
                        st.served = 0;
                    }
                    return Ok(Some(m.into()));
                }
            }
            // Nothing due (or block used up): skip at once, forfeiting the rest of the block.
            st.current = (cur + 1) % 4;
            st.served = 0;
        }
        if !(0..4).any(|i| st.lanes[i].has_due(now)) {
            st.burst_left = self.weights.burst;
        }
        Ok(None)
    }

    async fn stats(&self, now: Millis) -> Result<[LaneStats; 4]> {
        self.check_up()?;
        let st = self.state.lock().expect("queue lock");
        let mut out = [LaneStats::default(); 4];
        for (i, lane) in st.lanes.iter().enumerate() {
            let ready = lane.by_score.iter().take_while(|(s, _)| *s <= now).count() as u64;
            out[i] = LaneStats {
                depth: lane.by_member.len() as u64,
                ready,
                delayed: lane.by_member.len() as u64 - ready,
                oldest_wait_ms: lane.by_score.iter().next().filter(|(s, _)| *s <= now).map_or(0, |(s, _)| now - s),
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
