//! Points in time and spans of time, as two types (K-2).
//!
//! An [`Instant`] is a reading of the [`Clock`](crate::ports::Clock) port: milliseconds since
//! the Unix epoch (or since the start of a manual clock). A [`DurationMs`] is a span in
//! milliseconds. Only the arithmetic that makes sense exists: an instant plus a span is
//! checked ([`Instant::checked_add`], [`Instant::try_add`]) because a caller-supplied span
//! (a sleep, a lease, a backoff) can be large enough to overflow; an instant minus an
//! instant is a span; two instants never add.
//!
//! Both serialize as a bare `i64` (`#[serde(transparent)]`), print as the bare number and
//! convert to and from `i64` for adapters (BSON DateTime, Redis scores, Lua ARGV), so a
//! stored document, a script argument and a printed line are the same as with a plain
//! integer.
//!
//! ```
//! use kernel_core::{DurationMs, Instant};
//! let now = Instant::from_millis(1_000);
//! assert_eq!(now.checked_add(DurationMs::from_secs(2)), Some(Instant::from_millis(3_000)));
//! assert_eq!(now.checked_add(DurationMs::MAX), None);
//! assert_eq!(Instant::from_millis(3_000) - now, DurationMs::from_millis(2_000));
//! ```

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::{Add, AddAssign, Div, Mul, Sub, SubAssign};

/// A point in time: milliseconds since the Unix epoch, or since the start of a manual
/// clock. Ordered; serialized as the bare `i64`.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Instant(i64);

/// A span of time in milliseconds.
///
/// Signed: the difference of two instants is negative when the second is later, and a
/// caller-supplied value (a sleep, a config field) may be negative or zero until it is
/// validated. Fields that must be positive say so and are checked where they enter
/// ([`EngineConfig::validate`](crate::EngineConfig::validate), the K-7 classification of a
/// sleep). Serialized as the bare `i64`.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DurationMs(i64);

impl Instant {
    /// The epoch itself (or a manual clock's zero).
    pub const ZERO: Instant = Instant(0);
    /// The latest representable instant; what saturating additions stop at.
    pub const MAX: Instant = Instant(i64::MAX);

    /// The instant `ms` milliseconds after the epoch.
    pub const fn from_millis(ms: i64) -> Self {
        Instant(ms)
    }

    /// Milliseconds since the epoch, for adapters that store a plain integer.
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// `self + d`, or `None` when the sum is not representable.
    pub fn checked_add(self, d: DurationMs) -> Option<Instant> {
        self.0.checked_add(d.0).map(Instant)
    }

    /// `self + d`, refused as [`Error::InvalidInput`] on `field` when the sum is not
    /// representable: an overflowing deadline is bad input, never a wrapped time.
    pub fn try_add(self, d: DurationMs, field: &str) -> Result<Instant> {
        self.checked_add(d).ok_or_else(|| Error::invalid(field, format_args!("{self} + {d} ms overflows")))
    }

    /// `self + d`, clamped to the representable range. For engine-internal deadlines built
    /// from validated configuration, where "never" is an acceptable reading of an overflow.
    pub fn saturating_add(self, d: DurationMs) -> Instant {
        Instant(self.0.saturating_add(d.0))
    }

    /// `self - d`, clamped to the representable range.
    pub fn saturating_sub(self, d: DurationMs) -> Instant {
        Instant(self.0.saturating_sub(d.0))
    }

    /// The span from `earlier` to `self` (negative when `earlier` is later), clamped.
    pub fn duration_since(self, earlier: Instant) -> DurationMs {
        DurationMs(self.0.saturating_sub(earlier.0))
    }
}

impl DurationMs {
    /// No time at all.
    pub const ZERO: DurationMs = DurationMs(0);
    /// The longest representable span; adding it to any positive instant overflows.
    pub const MAX: DurationMs = DurationMs(i64::MAX);

    /// A span of `ms` milliseconds.
    pub const fn from_millis(ms: i64) -> Self {
        DurationMs(ms)
    }

    /// A span of `s` seconds (saturating).
    pub const fn from_secs(s: i64) -> Self {
        DurationMs(s.saturating_mul(1_000))
    }

    /// The span in milliseconds, for adapters and arithmetic on plain integers.
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// Whether the span is longer than zero.
    pub const fn is_positive(self) -> bool {
        self.0 > 0
    }

    /// `self + other`, or `None` on overflow.
    pub fn checked_add(self, other: DurationMs) -> Option<DurationMs> {
        self.0.checked_add(other.0).map(DurationMs)
    }

    /// `self * n`, clamped to the representable range.
    pub fn saturating_mul(self, n: i64) -> DurationMs {
        DurationMs(self.0.saturating_mul(n))
    }

    /// The span as a [`std::time::Duration`]; negative spans become zero.
    pub fn to_std(self) -> std::time::Duration {
        std::time::Duration::from_millis(self.0.max(0) as u64)
    }
}

impl From<i64> for Instant {
    fn from(ms: i64) -> Self {
        Instant(ms)
    }
}

impl From<Instant> for i64 {
    fn from(t: Instant) -> i64 {
        t.0
    }
}

impl From<i64> for DurationMs {
    fn from(ms: i64) -> Self {
        DurationMs(ms)
    }
}

impl From<DurationMs> for i64 {
    fn from(d: DurationMs) -> i64 {
        d.0
    }
}

impl PartialEq<i64> for Instant {
    fn eq(&self, other: &i64) -> bool {
        self.0 == *other
    }
}

impl PartialOrd<i64> for Instant {
    fn partial_cmp(&self, other: &i64) -> Option<std::cmp::Ordering> {
        self.0.partial_cmp(other)
    }
}

impl PartialEq<i64> for DurationMs {
    fn eq(&self, other: &i64) -> bool {
        self.0 == *other
    }
}

impl PartialOrd<i64> for DurationMs {
    fn partial_cmp(&self, other: &i64) -> Option<std::cmp::Ordering> {
        self.0.partial_cmp(other)
    }
}

/// The span between two instants, clamped (see [`Instant::duration_since`]).
impl Sub for Instant {
    type Output = DurationMs;
    fn sub(self, rhs: Instant) -> DurationMs {
        self.duration_since(rhs)
    }
}

/// Saturating: span sums are counters and limits, where clamping is the safe reading.
impl Add for DurationMs {
    type Output = DurationMs;
    fn add(self, rhs: DurationMs) -> DurationMs {
        DurationMs(self.0.saturating_add(rhs.0))
    }
}

impl AddAssign for DurationMs {
    fn add_assign(&mut self, rhs: DurationMs) {
        *self = *self + rhs;
    }
}

/// Saturating, like [`Add`].
impl Sub for DurationMs {
    type Output = DurationMs;
    fn sub(self, rhs: DurationMs) -> DurationMs {
        DurationMs(self.0.saturating_sub(rhs.0))
    }
}

impl SubAssign for DurationMs {
    fn sub_assign(&mut self, rhs: DurationMs) {
        *self = *self - rhs;
    }
}

/// Saturating, like [`Add`].
impl Mul<i64> for DurationMs {
    type Output = DurationMs;
    fn mul(self, n: i64) -> DurationMs {
        self.saturating_mul(n)
    }
}

/// A fraction of a span (a heartbeat at a third of a lease); panics on division by zero,
/// like integer division.
impl Div<i64> for DurationMs {
    type Output = DurationMs;
    fn div(self, n: i64) -> DurationMs {
        DurationMs(self.0.saturating_div(n))
    }
}

impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// The bare number, so `{:?}` of a record reads as it did with plain integers.
impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for DurationMs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// The bare number, like [`Instant`]'s.
impl fmt::Debug for DurationMs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instant_plus_span_is_checked() {
        let t = Instant::from_millis(1_700_000_000_000);
        assert_eq!(t.checked_add(DurationMs::from_millis(5)), Some(Instant::from_millis(1_700_000_000_005)));
        assert_eq!(t.checked_add(DurationMs::MAX), None);
        let e = t.try_add(DurationMs::MAX, "sleep_ms").unwrap_err();
        assert!(matches!(e, Error::InvalidInput { ref field, .. } if field == "sleep_ms"), "{e:?}");
        assert_eq!(t.saturating_add(DurationMs::MAX), Instant::MAX);
        assert_eq!(Instant::from_millis(i64::MIN).checked_add(DurationMs::from_millis(-1)), None);
    }

    #[test]
    fn instant_minus_instant_is_a_span() {
        let a = Instant::from_millis(1_000);
        let b = Instant::from_millis(4_500);
        assert_eq!(b - a, DurationMs::from_millis(3_500));
        assert_eq!(a - b, DurationMs::from_millis(-3_500));
        assert_eq!(Instant::MAX - Instant::from_millis(-1), DurationMs::MAX);
    }

    #[test]
    fn spans_add_saturating_and_convert() {
        assert_eq!(DurationMs::from_secs(2) + DurationMs::from_millis(5), DurationMs::from_millis(2_005));
        assert_eq!(DurationMs::MAX + DurationMs::from_millis(1), DurationMs::MAX);
        assert_eq!(DurationMs::from_secs(i64::MAX), DurationMs::MAX);
        assert_eq!(DurationMs::from_millis(-3).to_std(), std::time::Duration::ZERO);
        assert_eq!(DurationMs::from_secs(3) / 3, DurationMs::from_secs(1));
        assert_eq!(DurationMs::from_secs(3) * 2, DurationMs::from_secs(6));
        assert_eq!(DurationMs::MAX * 2, DurationMs::MAX);
        assert_eq!(i64::from(DurationMs::from(7)), 7);
        assert!(Instant::from_millis(1) < Instant::from_millis(2));
    }

    #[test]
    fn serialize_and_print_as_the_bare_number() {
        let t = Instant::from_millis(1_234);
        assert_eq!(serde_json::to_string(&t).unwrap(), "1234");
        assert_eq!(serde_json::from_str::<Instant>("1234").unwrap(), t);
        assert_eq!(serde_json::to_string(&DurationMs::from_millis(-5)).unwrap(), "-5");
        assert_eq!(format!("{t} {t:?} {:?}", Some(DurationMs::from_millis(9))), "1234 1234 Some(9)");
    }
}
