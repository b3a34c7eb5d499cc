use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// Source of tokens, ids and jitter.
pub trait IdGenerator: Send + Sync + 'static {
    /// A fresh unique token (claim tokens, lease tokens, workflow ids).
    ///
    /// # Contract
    /// Never repeats within the lifetime of the durable state; satisfies the K-2.0
    /// identifier rule.
    fn new_token(&self) -> String;

    /// A uniformly distributed random number (retry jitter).
    ///
    /// # Contract
    /// Never blocks. Used only for jitter, never for identity; a seeded generator returns
    /// the same sequence on every run, so a failing seed replays exactly.
    fn random_u64(&self) -> u64;
}

/// `dyn IdGenerator`.
pub type DynIds = dyn IdGenerator;

/// Random ids from the process's hash keys, a counter and the wall clock.
#[derive(Debug)]
pub struct RandomIds {
    state: RandomState,
    counter: AtomicU64,
    epoch: u64,
}

impl Default for RandomIds {
    fn default() -> Self {
        let epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        RandomIds { state: RandomState::new(), counter: AtomicU64::new(0), epoch }
    }
}

impl IdGenerator for RandomIds {
    fn new_token(&self) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}{:08x}", self.random_u64() ^ self.epoch, n as u32)
    }
    fn random_u64(&self) -> u64 {
        let mut h = self.state.build_hasher();
        h.write_u64(self.counter.fetch_add(1, Ordering::Relaxed));
        h.write_u64(self.epoch);
        h.finish()
    }
}
