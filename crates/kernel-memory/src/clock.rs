use kernel_core::domain::{DurationMs, Instant};
use kernel_core::ports::{Clock, IdGenerator};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use tokio::sync::watch;

/// A clock that moves only when told to. `sleep_until` resolves when [`advance`](Self::advance)
/// or [`set`](Self::set) passes the deadline, so leases, backoffs, timers and scans run in
/// simulated time.
///
/// ```
/// use kernel_memory::ManualClock;
/// use kernel_core::ports::Clock;
/// let c = ManualClock::new(1_000);
/// c.advance(500);
/// assert_eq!(c.now(), 1_500);
/// ```
#[derive(Debug)]
pub struct ManualClock {
    tx: watch::Sender<Instant>,
}

impl ManualClock {
    /// A clock reading `start` (an [`Instant`] or plain milliseconds).
    pub fn new(start: impl Into<Instant>) -> Self {
        ManualClock { tx: watch::Sender::new(start.into()) }
    }
    /// Move forward by `ms` (a [`DurationMs`] or plain milliseconds; never backwards, and
    /// never past [`Instant::MAX`]).
    pub fn advance(&self, ms: impl Into<DurationMs>) {
        let ms = ms.into().max(DurationMs::ZERO);
        self.tx.send_modify(|t| *t = t.saturating_add(ms));
    }
    /// Move to `t` if it is later than now.
    pub fn set(&self, t: impl Into<Instant>) {
        let t = t.into();
        self.tx.send_modify(|now| *now = (*now).max(t));
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new(1_700_000_000_000)
    }
}

#[async_trait::async_trait]
impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.tx.borrow()
    }
    async fn sleep_until(&self, t: Instant) {
        let mut rx = self.tx.subscribe();
        while *rx.borrow_and_update() < t {
            if rx.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }
}

/// Another process's view of a shared [`ManualClock`]: the same time shifted by a fixed
/// skew (positive: this process's clock runs ahead). Engines of one test world given
/// different skews disagree about time as processes on different machines do, within the
/// bound a deployment configures (`EngineConfig::max_clock_skew_ms`, K-6.8).
///
/// ```
/// use std::sync::Arc;
/// use kernel_memory::{ManualClock, SkewedClock};
/// use kernel_core::ports::Clock;
/// let base = Arc::new(ManualClock::new(10_000));
/// let ahead = SkewedClock::new(base.clone(), 250);
/// assert_eq!(ahead.now(), 10_250);
/// base.advance(100);
/// assert_eq!(ahead.now(), 10_350);
/// ```
#[derive(Debug, Clone)]
pub struct SkewedClock {
    base: std::sync::Arc<ManualClock>,
    skew_ms: i64,
}

impl SkewedClock {
    /// `base` shifted by `skew_ms` (negative: behind).
    pub fn new(base: std::sync::Arc<ManualClock>, skew_ms: i64) -> Self {
        SkewedClock { base, skew_ms }
    }
}

#[async_trait::async_trait]
impl Clock for SkewedClock {
    fn now(&self) -> Instant {
        shift(self.base.now(), self.skew_ms)
    }
    async fn sleep_until(&self, t: Instant) {
        self.base.sleep_until(shift(t, -self.skew_ms)).await
    }
}

fn shift(t: Instant, by_ms: i64) -> Instant {
    if by_ms >= 0 {
        t.saturating_add(DurationMs::from_millis(by_ms))
    } else {
        t.saturating_sub(DurationMs::from_millis(by_ms.saturating_neg()))
    }
}

/// Deterministic ids (`<prefix>-000001`, …) and seeded jitter, so a failing seed replays.
#[derive(Debug)]
pub struct SeqIds {
    prefix: String,
    n: AtomicU64,
    rng: Mutex<SmallRng>,
}

impl SeqIds {
    /// Ids `prefix-000001…`, jitter from `seed`.
    pub fn new(prefix: &str, seed: u64) -> Self {
        SeqIds { prefix: prefix.to_string(), n: AtomicU64::new(0), rng: Mutex::new(SmallRng::seed_from_u64(seed)) }
    }
}

impl Default for SeqIds {
    fn default() -> Self {
        SeqIds::new("t", 0)
    }
}

impl IdGenerator for SeqIds {
    fn new_token(&self) -> String {
        format!("{}-{:06}", self.prefix, self.n.fetch_add(1, Ordering::Relaxed) + 1)
    }
    fn random_u64(&self) -> u64 {
        self.rng.lock().expect("rng lock").gen()
    }
    /// From the operating system's CSPRNG, never from the seed or the sequence: a task
    /// token is a secret (K-17.5), and a test that could predict it would not notice a
    /// decision presenting a guessed one.
    fn task_token(&self) -> kernel_core::Result<String> {
        kernel_core::ports::os_task_token()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k17_5_seq_ids_task_tokens_are_neither_seeded_nor_sequential() {
        // Two generators with the same prefix and seed agree on every id and every jitter…
        let (a, b) = (SeqIds::new("t", 7), SeqIds::new("t", 7));
        let ta: Vec<String> = (0..16).map(|_| a.task_token().unwrap()).collect();
        let tb: Vec<String> = (0..16).map(|_| b.task_token().unwrap()).collect();
        assert_eq!((a.new_token(), a.random_u64()), (b.new_token(), b.random_u64()));
        // …but not on a task token: each is 128 fresh bits from the OS, unrelated to the
        // sequence (which task tokens do not advance either).
        assert_eq!(a.new_token(), "t-000002");
        let all: std::collections::BTreeSet<&String> = ta.iter().chain(&tb).collect();
        assert_eq!(all.len(), 32, "no task token repeats, across generators with one seed");
        for t in all {
            assert_eq!(t.len(), 32, "{t}");
            assert!(t.chars().all(|c| c.is_ascii_hexdigit()), "{t}");
            assert!(!t.starts_with("t-"), "{t}");
        }
    }
}
