//! `CountingQueue`: a ready queue that counts its lane and doorbell calls.

use kernel_core::domain::*;
use kernel_core::ports::*;
use kernel_core::Result;
use kernel_core::WorkflowId;
use std::sync::{Arc, Mutex};

/// Calls a [`CountingQueue`] saw, per method, failed ones included. On the Redis adapters
/// each call is one round trip (one command or one script), so these are the round trips
/// the engine and the publisher spend on the lanes and the doorbell.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct QueueCalls {
    /// [`ReadyQueue::enqueue`] calls.
    pub enqueue: u64,
    /// [`ReadyQueue::enqueue_many`] calls.
    pub enqueue_many: u64,
    /// Entries those `enqueue_many` calls carried.
    pub enqueued_in_batches: u64,
    /// [`ReadyQueue::pop_due`] calls.
    pub pop_due: u64,
    /// Members those pops returned.
    pub popped: u64,
    /// [`ReadyQueue::stats`] calls.
    pub stats: u64,
    /// [`Wakeup::notify`] calls.
    pub notify: u64,
    /// [`Wakeup::subscribe`] calls.
    pub subscribe: u64,
}

impl QueueCalls {
    /// Calls that reach the queue or the doorbell (every method; `subscribe` opens a
    /// connection rather than making a request, so it is left out).
    pub fn round_trips(&self) -> u64 {
        self.enqueue + self.enqueue_many + self.pop_due + self.stats + self.notify
    }
}

/// A decorator over a ready queue and a doorbell that counts calls per method
/// ([`QueueCalls`]), so a test can pin how many round trips a path makes without timing it.
///
/// ```
/// use std::sync::Arc;
/// use kernel_core::ports::{ReadyQueue, Wakeup};
/// use kernel_core::{Instant, Priority};
/// use testkit::faults::CountingQueue;
/// use testkit::memory::{InMemoryQueue, InMemoryWakeup};
/// # tokio_test_block_on(async {
/// let counting = CountingQueue::new(Arc::new(InMemoryQueue::default()), Arc::new(InMemoryWakeup::new()));
/// counting.enqueue(&"wf-1".into(), Priority::P1, Instant::ZERO).await.unwrap();
/// assert_eq!(counting.pop_due(Instant::ZERO, 8).await.unwrap().len(), 1);
/// counting.notify().await.unwrap();
/// let calls = counting.counts();
/// assert_eq!((calls.enqueue, calls.pop_due, calls.popped, calls.notify), (1, 1, 1, 1));
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Clone)]
pub struct CountingQueue {
    queue: Arc<DynQueue>,
    wakeup: Arc<DynWakeup>,
    counts: Arc<Mutex<QueueCalls>>,
    pops: Arc<Mutex<Vec<(usize, usize)>>>,
}

impl std::fmt::Debug for CountingQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountingQueue").field("counts", &self.counts()).finish_non_exhaustive()
    }
}

impl CountingQueue {
    /// Count the calls to `queue` and `wakeup`.
    pub fn new(queue: Arc<DynQueue>, wakeup: Arc<DynWakeup>) -> Self {
        CountingQueue { queue, wakeup, counts: Arc::default(), pops: Arc::default() }
    }
    /// The calls so far.
    pub fn counts(&self) -> QueueCalls {
        *self.counts.lock().expect("counts lock")
    }
    /// Every successful `pop_due` so far, in order: (`max` asked, members returned).
    pub fn pops(&self) -> Vec<(usize, usize)> {
        self.pops.lock().expect("pops lock").clone()
    }
    /// Start counting from zero.
    pub fn reset(&self) {
        *self.counts.lock().expect("counts lock") = QueueCalls::default();
        self.pops.lock().expect("pops lock").clear();
    }
    /// Replace the queue and the wakeup of `ports` with this decorator.
    pub fn wire(self: &Arc<Self>, mut ports: kernel_core::engine::Ports) -> kernel_core::engine::Ports {
        ports.queue = self.clone();
        ports.wakeup = self.clone();
        ports
    }
    fn count(&self, f: impl FnOnce(&mut QueueCalls)) {
        f(&mut self.counts.lock().expect("counts lock"));
    }
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl ReadyQueue for CountingQueue {
    async fn enqueue(&self, workflow_id: &WorkflowId, priority: Priority, claimable_at: Instant) -> Result<()> {
        self.count(|c| c.enqueue += 1);
        self.queue.enqueue(workflow_id, priority, claimable_at).await
    }
    async fn enqueue_many(&self, entries: &[LaneEntry]) -> Result<()> {
        self.count(|c| {
            c.enqueue_many += 1;
            c.enqueued_in_batches += entries.len() as u64;
        });
        self.queue.enqueue_many(entries).await
    }
    async fn pop_due(&self, now: Instant, max: usize) -> Result<Vec<WorkflowId>> {
        self.count(|c| c.pop_due += 1);
        let r = self.queue.pop_due(now, max).await;
        if let Ok(ids) = &r {
            self.count(|c| c.popped += ids.len() as u64);
            self.pops.lock().expect("pops lock").push((max, ids.len()));
        }
        r
    }
    async fn stats(&self, now: Instant) -> Result<[LaneStats; 4]> {
        self.count(|c| c.stats += 1);
        self.queue.stats(now).await
    }
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl Wakeup for CountingQueue {
    async fn notify(&self) -> Result<()> {
        self.count(|c| c.notify += 1);
        self.wakeup.notify().await
    }
    async fn subscribe(&self) -> Result<WakeupReceiver> {
        self.count(|c| c.subscribe += 1);
        self.wakeup.subscribe().await
    }
}
