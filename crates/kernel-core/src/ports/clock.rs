use crate::domain::Instant;

/// Time source. Leases, backoffs, timers and scans read it; tests drive a manual one.
#[async_trait::async_trait]
pub trait Clock: Send + Sync + 'static {
    /// Current time in ms.
    ///
    /// # Contract
    /// Monotonic non-decreasing within one process.
    fn now(&self) -> Instant;

    /// Resolve once `now() >= t`.
    ///
    /// # Contract
    /// Returns immediately when `t` has passed; cancel-safe (dropping the future is fine).
    async fn sleep_until(&self, t: Instant);
}

/// `dyn Clock`.
pub type DynClock = dyn Clock;

/// Wall clock on tokio timers.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

#[async_trait::async_trait]
impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::from_millis(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0),
        )
    }
    async fn sleep_until(&self, t: Instant) {
        let d = t - self.now();
        if d.is_positive() {
            tokio::time::sleep(d.to_std()).await;
        }
    }
}
