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

    /// A fresh capability token for a human task (K-17.5): whoever presents it may decide
    /// the task, so it is a secret, not an id.
    ///
    /// # Contract
    /// Drawn from a cryptographically secure random source (the operating system's CSPRNG,
    /// as [`os_task_token`] does): unguessable, at least 128 random bits, at least
    /// [`TASK_TOKEN_BYTES_MIN`](super::TASK_TOKEN_BYTES_MIN) bytes of lowercase hex. Never
    /// derived from a seed or a counter, also in a deterministic generator for tests (a
    /// task token never takes part in a replay). A failing source is
    /// [`Error::Unavailable`](crate::error::Error::Unavailable): the caller opens no task
    /// rather than one with a guessable token.
    fn task_token(&self) -> crate::error::Result<String>;
}

/// 128 bits from the operating system's CSPRNG, as 32 lowercase hex characters: the task
/// token of [`IdGenerator::task_token`]'s contract, for every generator to use.
pub fn os_task_token() -> crate::error::Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::getrandom(&mut bytes)
        .map_err(|e| crate::error::Error::unavailable(format!("the secure random source failed: {e}")))?;
    Ok(hex::encode(bytes))
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
    fn task_token(&self) -> crate::error::Result<String> {
        os_task_token()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k17_5_task_tokens_are_128_random_bits_in_hex_and_fresh() {
        let ids = RandomIds::default();
        let tokens: std::collections::BTreeSet<String> = (0..64).map(|_| ids.task_token().unwrap()).collect();
        assert_eq!(tokens.len(), 64);
        for t in &tokens {
            assert_eq!(t.len(), 32, "{t}");
            assert!(t.len() >= crate::ports::TASK_TOKEN_BYTES_MIN);
            assert!(t.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()), "{t}");
        }
    }
}
