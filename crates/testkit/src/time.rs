//! Arithmetic on test times: a fixed origin plus a few milliseconds.
//!
//! Production code adds spans to instants with [`Instant::checked_add`] or
//! [`Instant::try_add`] and handles the overflow; a test's times are small offsets from a
//! constant origin, where an overflow is a bug in the test, so these panic instead.

use kernel_core::domain::{DurationMs, Instant};

/// `t.plus(ms)` / `t.minus(ms)` for test times; panics when the result is not
/// representable.
///
/// ```
/// use kernel_core::domain::Instant;
/// use testkit::time::TestTime;
/// let t0 = Instant::from_millis(1_000);
/// assert_eq!(t0.plus(500), Instant::from_millis(1_500));
/// assert_eq!(t0.minus(1_000), Instant::ZERO);
/// ```
pub trait TestTime {
    /// `self + ms`.
    fn plus(self, ms: impl Into<DurationMs>) -> Instant;
    /// `self - ms`.
    fn minus(self, ms: impl Into<DurationMs>) -> Instant;
}

impl TestTime for Instant {
    fn plus(self, ms: impl Into<DurationMs>) -> Instant {
        let ms = ms.into();
        self.checked_add(ms).unwrap_or_else(|| panic!("test time {self} + {ms} ms overflows"))
    }
    fn minus(self, ms: impl Into<DurationMs>) -> Instant {
        let ms = ms.into();
        self.checked_add(DurationMs::ZERO - ms).unwrap_or_else(|| panic!("test time {self} - {ms} ms overflows"))
    }
}
