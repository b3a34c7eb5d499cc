//! The one identifier rule of K-2.0, shared by the engine and every adapter.
//!
//! ```
//! use kernel_core::validate;
//! assert!(validate::identifier("biz_key", "content:tenant-1:object-42").is_ok());
//! assert!(validate::identifier("biz_key", "").is_err());
//! assert!(validate::key_name("step", "$where").is_err());
//! assert!(validate::key_name("step", "a.b").is_err());
//! ```

use crate::error::{Error, Result};

/// Longest identifier in bytes.
pub const IDENTIFIER_BYTES_MAX: usize = 256;

/// Workflow ids, biz keys, signal ids and types, wait keys, tokens: 1–256 bytes of UTF-8 with
/// no NUL or other control character.
pub fn identifier(field: &str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if value.len() > IDENTIFIER_BYTES_MAX {
        return Err(Error::invalid(
            field,
            format_args!("{} bytes exceeds the limit of {IDENTIFIER_BYTES_MAX}", value.len()),
        ));
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(Error::invalid(field, format_args!("contains control character {:?}", c)));
    }
    Ok(())
}

/// Names that become document keys (step names, resource names, output keys): the
/// [`identifier`] rule, and never starting with `$` nor containing `.`, so that a name can
/// never be read as a query operator or a nested path.
pub fn key_name(field: &str, value: &str) -> Result<()> {
    identifier(field, value)?;
    if value.starts_with('$') {
        return Err(Error::invalid(field, "must not start with `$`"));
    }
    if value.contains('.') {
        return Err(Error::invalid(field, "must not contain `.`"));
    }
    Ok(())
}

/// Serialized size check for payloads (input, output, checkpoint).
pub fn payload(field: &str, value: &serde_json::Value, bytes_max: usize) -> Result<()> {
    let bytes = serde_json::to_vec(value).map_err(|e| Error::invalid(field, e))?.len();
    if bytes > bytes_max {
        return Err(Error::invalid(field, format_args!("{bytes} bytes exceeds the payload limit of {bytes_max}")));
    }
    Ok(())
}

/// A duration in milliseconds that must be strictly positive.
pub fn positive_ms(field: &str, ms: i64) -> Result<()> {
    if ms <= 0 {
        return Err(Error::invalid(field, format_args!("must be > 0 ms, got {ms}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifier_rule() {
        assert!(identifier("f", "a").is_ok());
        assert!(identifier("f", &"x".repeat(256)).is_ok());
        assert!(identifier("f", &"x".repeat(257)).is_err());
        assert!(identifier("f", "a\0b").is_err());
        assert!(identifier("f", "a\nb").is_err());
        assert!(identifier("f", "ünïcode-ok").is_ok());
        assert!(identifier("f", "$ne").is_ok(), "ids are data; only key names forbid `$`");
        assert!(key_name("f", "$ne").is_err());
        assert!(key_name("f", "steps.0").is_err());
        assert!(key_name("f", "compose_content").is_ok());
    }

    #[test]
    fn payload_limit() {
        let v = serde_json::json!({"a": "x".repeat(100)});
        assert!(payload("input", &v, 1000).is_ok());
        assert!(payload("input", &v, 50).is_err());
    }
}
