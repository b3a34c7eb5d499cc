use crate::model::Millis;

/// Time source. Leases, backoffs, timers and scans read it; tests drive a manual one.
#[async_trait::async_trait]
pub trait Clock: Send + Sync + 'static {
    /// Current time in ms.
    ///
    /// # Contract
    /// Monotonic non-decreasing within one process.
    fn now(&self) -> Millis;

    /// Resolve once `now() >= t`.
    ///
    /// # Contract
    /// Returns immediately when `t` has passed; cancel-safe (dropping the future is fine).
    async fn sleep_until(&self, t: Millis);
}

/// `dyn Clock`.
pub type DynClock = dyn Clock;

/// Wall clock on tokio timers.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

#[async_trait::async_trait]
impl Clock for SystemClock {
    fn now(&self) -> Millis {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as Millis).unwrap_or(0)
    }
    async fn sleep_until(&self, t: Millis) {
        let d = t - self.now();
        if d > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(d as u64)).await;
        }
    }
}
