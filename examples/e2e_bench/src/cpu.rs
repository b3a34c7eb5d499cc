//! CPU accounting: this process (getrusage, user + system) and the Redis server (`INFO cpu`,
//! `used_cpu_user + used_cpu_sys`). The floor does its work inside Redis, so only the sum of
//! both is a fair cost per workflow.

use redis::aio::MultiplexedConnection;

/// CPU used so far, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CpuSnapshot {
    /// This process, user + system.
    pub process_us: f64,
    /// The Redis server (every client's work, not only ours), user + system.
    pub redis_us: f64,
}

impl CpuSnapshot {
    /// Read both now.
    pub async fn take(redis: &mut MultiplexedConnection) -> Result<CpuSnapshot, String> {
        let info: String =
            redis::cmd("INFO").arg("cpu").query_async(redis).await.map_err(|e| format!("redis INFO cpu: {e}"))?;
        Ok(CpuSnapshot { process_us: process_us()?, redis_us: redis_cpu_us(&info)? })
    }

    /// CPU spent between `before` and `self`.
    pub fn since(self, before: CpuSnapshot) -> CpuSnapshot {
        CpuSnapshot { process_us: self.process_us - before.process_us, redis_us: self.redis_us - before.redis_us }
    }

    /// Process plus Redis.
    pub fn total_us(self) -> f64 {
        self.process_us + self.redis_us
    }
}

/// This process's user + system CPU.
pub fn process_us() -> Result<f64, String> {
    use nix::sys::resource::{getrusage, UsageWho};
    let u = getrusage(UsageWho::RUSAGE_SELF).map_err(|e| format!("getrusage: {e}"))?;
    let us = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 * 1e6 + t.tv_usec() as f64;
    Ok(us(u.user_time()) + us(u.system_time()))
}

/// `used_cpu_user + used_cpu_sys` of an `INFO cpu` reply, in microseconds.
pub fn redis_cpu_us(info: &str) -> Result<f64, String> {
    let field = |name: &str| -> Result<f64, String> {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
            .ok_or_else(|| format!("INFO cpu has no `{name}`"))?
            .parse::<f64>()
            .map_err(|e| format!("INFO cpu `{name}`: {e}"))
    };
    Ok((field("used_cpu_user")? + field("used_cpu_sys")?) * 1e6)
}

/// A field of an `INFO` reply (`redis_version`, …).
pub fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_cpu_is_user_plus_system_not_the_main_thread_fields() {
        let info = "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.250000\r\n\
                    used_cpu_sys_children:9.0\r\nused_cpu_sys_main_thread:1.0\r\nused_cpu_user_main_thread:2.0\r\n";
        assert_eq!(redis_cpu_us(info), Ok(3_750_000.0));
        assert!(redis_cpu_us("# CPU\r\nused_cpu_sys:1.0\r\n").unwrap_err().contains("used_cpu_user"));
        assert_eq!(info_field("redis_version:7.0.15\r\n", "redis_version"), Some("7.0.15"));
    }

    #[test]
    fn process_cpu_grows_with_work() {
        let before = process_us().unwrap();
        let mut x = 0u64;
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(30) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        assert!(process_us().unwrap() > before);
    }
}
