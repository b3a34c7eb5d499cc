//! Conformance cases for the wakeup doorbell (K-13).
//!
//! A ring is delivered asynchronously, so cases wait on real time: for a ring that must
//! arrive, up to [`ARRIVAL_BOUND`] (a liveness bound, never a speed assertion); for what may
//! still arrive after a burst, the fixture's [`settle`](WakeupFixture::settle) time. A case
//! never asserts that a spurious ring is absent: a doorbell may ring without cause (the
//! receiver only looks at the queue), it must not miss a ring nor queue one per notify.
//!
//! The fixture gives two adapter values on the same backing, [`wakeup`](WakeupFixture::wakeup)
//! and [`peer`](WakeupFixture::peer): what two worker processes would hold (two Redis
//! connections on one channel, two openings of one SQLite file).
//!
//! ```ignore
//! testkit::wakeup_conformance!(|| async {
//!     let w = testkit::memory::InMemoryWakeup::new();
//!     Some(testkit::conformance::wakeup::SharedWakeup::new(Arc::new(w.clone()), Arc::new(w)))
//! });
//! ```

use kernel_core::ports::{DynWakeup, WakeupReceiver};
use std::sync::Arc;
use std::time::Duration;

/// Longest wait for a ring that must arrive (liveness only).
pub const ARRIVAL_BOUND: Duration = Duration::from_secs(10);

/// Rings in one burst of the coalescing case.
pub const BURST: usize = 200;

/// What a wakeup case needs.
pub trait WakeupFixture: Send + Sync {
    /// The adapter under test.
    fn wakeup(&self) -> &DynWakeup;
    /// A second adapter value on the same backing (another process's doorbell).
    fn peer(&self) -> &DynWakeup;
    /// How long a ring may take to arrive on an idle machine (a poll interval, a pub/sub
    /// hop), with margin: after it, a finished burst has delivered everything it will.
    fn settle(&self) -> Duration;
    /// What the cases take: the fixture itself.
    fn as_dyn(&self) -> &dyn WakeupFixture
    where
        Self: Sized,
    {
        self
    }
    /// Clean up after the case (it runs also when the case panics); the default does nothing.
    fn teardown(self) -> futures::future::BoxFuture<'static, ()>
    where
        Self: Sized,
    {
        Box::pin(async {})
    }
}

/// Two values of any adapter, for fixtures that need nothing else.
pub struct SharedWakeup {
    a: Arc<DynWakeup>,
    b: Arc<DynWakeup>,
    settle: Duration,
}

impl SharedWakeup {
    /// `a` and `b` on the same backing, settling in 100 ms.
    pub fn new(a: Arc<DynWakeup>, b: Arc<DynWakeup>) -> Self {
        SharedWakeup { a, b, settle: Duration::from_millis(100) }
    }
    /// Another settle time.
    pub fn settle(mut self, settle: Duration) -> Self {
        self.settle = settle;
        self
    }
}

impl WakeupFixture for SharedWakeup {
    fn wakeup(&self) -> &DynWakeup {
        &*self.a
    }
    fn peer(&self) -> &DynWakeup {
        &*self.b
    }
    fn settle(&self) -> Duration {
        self.settle
    }
}

async fn arrives(rx: &mut WakeupReceiver, what: &str) {
    match tokio::time::timeout(ARRIVAL_BOUND, rx.recv()).await {
        Ok(Some(())) => {}
        Ok(None) => panic!("{what}: the subscription ended"),
        Err(_) => panic!("{what}: no ring within {ARRIVAL_BOUND:?}"),
    }
}

/// Drop what is pending now.
fn drain(rx: &mut WakeupReceiver) -> usize {
    let mut n = 0;
    while rx.try_recv().is_ok() {
        n += 1;
    }
    n
}

/// Wait `settle`, then drop what arrived meanwhile (spurious or late rings).
async fn quiet(f: &dyn WakeupFixture, rxs: &mut [&mut WakeupReceiver]) {
    tokio::time::sleep(f.settle()).await;
    for rx in rxs.iter_mut() {
        drain(rx);
    }
}

/// One notify reaches every subscriber of the same value.
pub async fn notify_reaches_every_subscriber(f: &dyn WakeupFixture) {
    let w = f.wakeup();
    let mut subs = Vec::new();
    for _ in 0..3 {
        subs.push(w.subscribe().await.expect("subscribe"));
    }
    let mut refs: Vec<&mut WakeupReceiver> = subs.iter_mut().collect();
    quiet(f, &mut refs).await;
    w.notify().await.expect("notify");
    for (i, rx) in subs.iter_mut().enumerate() {
        arrives(rx, &format!("subscriber {i}")).await;
    }
}

/// A notify with nobody listening is fine, and a subscription made afterwards still gets
/// the next ring.
pub async fn notify_without_subscriber_is_fine(f: &dyn WakeupFixture) {
    let w = f.wakeup();
    for _ in 0..3 {
        w.notify().await.expect("notify with no subscriber");
    }
    let mut rx = w.subscribe().await.expect("subscribe");
    quiet(f, &mut [&mut rx]).await;
    w.notify().await.expect("notify");
    arrives(&mut rx, "the subscription made after unheard rings").await;
}

/// Dropping one receiver ends only that subscription: notifies keep succeeding and the
/// other subscriber keeps getting rings.
pub async fn dropped_receiver_ends_cleanly(f: &dyn WakeupFixture) {
    let w = f.wakeup();
    let dropped = w.subscribe().await.expect("subscribe");
    let mut kept = w.subscribe().await.expect("subscribe");
    drop(dropped);
    quiet(f, &mut [&mut kept]).await;
    for round in 0..3 {
        w.notify().await.expect("notify after a receiver was dropped");
        arrives(&mut kept, &format!("the remaining subscriber, round {round}")).await;
        quiet(f, &mut [&mut kept]).await;
    }
    drop(kept);
    w.notify().await.expect("notify after every receiver was dropped");
    let mut again = w.subscribe().await.expect("subscribe after every receiver was dropped");
    quiet(f, &mut [&mut again]).await;
    w.notify().await.expect("notify");
    arrives(&mut again, "a new subscription after all were dropped").await;
}

/// A burst of notifies, unread, leaves at most two messages queued (coalesced, never one
/// per notify), then nothing more.
pub async fn many_notifies_coalesce(f: &dyn WakeupFixture) {
    let (w, peer) = (f.wakeup(), f.peer());
    let mut rx = w.subscribe().await.expect("subscribe");
    quiet(f, &mut [&mut rx]).await;
    for i in 0..BURST {
        // Half from this value, half from the peer: both paths coalesce.
        let ringer = if i % 2 == 0 { w } else { peer };
        ringer.notify().await.expect("notify");
    }
    arrives(&mut rx, "a burst").await;
    tokio::time::sleep(f.settle()).await;
    let extra = drain(&mut rx);
    assert!(extra <= 2, "{extra} more rings queued after a burst of {BURST}: not coalesced");
}

/// A subscriber created later gets the notifies made after it, as the earlier one does.
pub async fn later_subscriber_gets_later_notifies(f: &dyn WakeupFixture) {
    let w = f.wakeup();
    let mut first = w.subscribe().await.expect("subscribe");
    quiet(f, &mut [&mut first]).await;
    w.notify().await.expect("notify");
    arrives(&mut first, "the first subscriber").await;
    let mut later = w.subscribe().await.expect("subscribe later");
    quiet(f, &mut [&mut first, &mut later]).await;
    w.notify().await.expect("notify");
    arrives(&mut later, "the later subscriber").await;
    arrives(&mut first, "the first subscriber, again").await;
}

/// A notify on one value reaches the subscribers of the other (another process), both
/// ways.
pub async fn notify_crosses_instances(f: &dyn WakeupFixture) {
    let (a, b) = (f.wakeup(), f.peer());
    let mut on_a = a.subscribe().await.expect("subscribe a");
    let mut on_b = b.subscribe().await.expect("subscribe b");
    quiet(f, &mut [&mut on_a, &mut on_b]).await;
    b.notify().await.expect("notify b");
    arrives(&mut on_a, "a ring from the peer").await;
    arrives(&mut on_b, "a ring from the same value").await;
    quiet(f, &mut [&mut on_a, &mut on_b]).await;
    a.notify().await.expect("notify a");
    arrives(&mut on_b, "a ring reaching the peer").await;
    arrives(&mut on_a, "a ring from the same value").await;
}

/// Expand to one `#[tokio::test]` per wakeup conformance case, on a multi-threaded runtime
/// as a worker runs (see [`conformance`](crate::conformance) for the factory and the fixture).
#[macro_export]
macro_rules! wakeup_conformance {
    ($factory:expr) => {
        $crate::__conformance_cases!(@multi_thread wakeup, WakeupFixture, as_dyn, $factory;
            notify_reaches_every_subscriber,
            notify_without_subscriber_is_fine,
            dropped_receiver_ends_cleanly,
            many_notifies_coalesce,
            later_subscriber_gets_later_notifies,
            notify_crosses_instances,
        );
    };
}
