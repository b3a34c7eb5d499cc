//! Trace context carried from a start request to the activities: the W3C `traceparent`
//! header value, validated once and stored with the instance.

use crate::error::{Error, Result};
use std::fmt;

/// A W3C Trace Context `traceparent` value: `00-<32 hex trace id>-<16 hex parent id>-<2 hex
/// flags>`, 55 characters, lowercase. Made only by [`TraceParent::parse`], so a value of
/// this type always has that form.
///
/// ```
/// use kernel_core::trace::TraceParent;
/// let tp = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
/// assert_eq!(tp.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert_eq!(tp.parent_id(), "00f067aa0ba902b7");
/// assert!(tp.sampled());
/// assert!(TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TraceParent(String);

/// Length of a version-00 `traceparent`.
pub const TRACE_PARENT_LEN: usize = 55;

fn lower_hex(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl TraceParent {
    /// Check `value` against the version-00 form: exactly [`TRACE_PARENT_LEN`] characters,
    /// `00-`, a 32-digit trace id, `-`, a 16-digit parent id, `-`, 2 flag digits, all
    /// lowercase hex, and neither id all zeros (W3C Trace Context, level 1). Anything else
    /// is [`Error::InvalidInput`] on field `trace_parent`.
    pub fn parse(value: &str) -> Result<TraceParent> {
        let bad = |why: &str| Error::invalid("trace_parent", format_args!("not a W3C traceparent: {why}"));
        if value.len() != TRACE_PARENT_LEN {
            return Err(bad(&format!("{} bytes, expected {TRACE_PARENT_LEN}", value.len())));
        }
        let parts: Vec<&str> = value.split('-').collect();
        let [version, trace_id, parent_id, flags] = parts[..] else {
            return Err(bad("expected four `-`-separated parts"));
        };
        if version != "00" {
            return Err(bad("version must be 00"));
        }
        if trace_id.len() != 32 || parent_id.len() != 16 || flags.len() != 2 {
            return Err(bad("parts must be 2, 32, 16 and 2 hex digits"));
        }
        if !(lower_hex(trace_id) && lower_hex(parent_id) && lower_hex(flags)) {
            return Err(bad("parts must be lowercase hex"));
        }
        if trace_id.bytes().all(|b| b == b'0') || parent_id.bytes().all(|b| b == b'0') {
            return Err(bad("an all-zero id is invalid"));
        }
        Ok(TraceParent(value.to_string()))
    }

    /// The whole header value.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The 32 hex digits of the trace id.
    pub fn trace_id(&self) -> &str {
        &self.0[3..35]
    }

    /// The 16 hex digits of the parent span id.
    pub fn parent_id(&self) -> &str {
        &self.0[36..52]
    }

    /// Whether the caller sampled the trace (flag bit 0).
    pub fn sampled(&self) -> bool {
        u8::from_str_radix(&self.0[53..55], 16).is_ok_and(|f| f & 1 == 1)
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<TraceParent> for String {
    fn from(t: TraceParent) -> String {
        t.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn check(value: &str, ok: bool) {
        let r = TraceParent::parse(value);
        match (ok, r) {
            (true, Ok(t)) => assert_eq!(t.as_str(), value),
            (false, Err(Error::InvalidInput { field, .. })) => assert_eq!(field, "trace_parent", "{value}"),
            (ok, r) => panic!("{value:?}: expected ok={ok}, got {r:?}"),
        }
    }

    #[test]
    fn only_the_version_00_form_is_accepted() {
        check(GOOD, true);
        check("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", true);
        check("", false);
        check(&GOOD[..54], false);
        check(&format!("{GOOD}0"), false);
        check(&GOOD.replace("00-4b", "01-4b"), false);
        check(&GOOD.to_uppercase(), false);
        check("00-4bf92f3577b34da6a3ce929d0e0e4736x00f067aa0ba902b7-01", false);
        check("00-00000000000000000000000000000000-00f067aa0ba902b7-01", false);
        check("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", false);
        check("00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01", false);
        check("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g", false);
        check("00-4bf92f3577b34da6a3ce929d0e0e47é-00f067aa0ba902b7-01", false);
    }

    #[test]
    fn parts_are_read_back() {
        let t = TraceParent::parse(GOOD).unwrap();
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.parent_id(), "00f067aa0ba902b7");
        assert!(t.sampled());
        assert!(!TraceParent::parse(&GOOD.replace("-01", "-00")).unwrap().sampled());
    }
}
