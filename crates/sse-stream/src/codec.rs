//! The compact frame record of K-16: one header byte `version << 4 | type`, then the
//! payload. Version 1 knows four types; anything else is a typed [`CodecError`], never a
//! panic, so a reader can skip or report a frame written by a newer writer.

use serde_json::Value;

/// The record version this crate writes.
pub const VERSION: u8 = 1;
/// Largest payload a record may carry (a text frame is batched well below this).
pub const PAYLOAD_BYTES_MAX: usize = 256 * 1024;

/// The v1 record types. The numbers are the wire values (type 4 is reserved).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RecordType {
    /// Raw UTF-8 text.
    Text = 1,
    /// Control message, compact JSON.
    Control = 2,
    /// Error message, compact JSON.
    Error = 3,
    /// Terminal reference: a small terminal summary, compact JSON.
    Terminal = 5,
}

impl RecordType {
    /// The wire value of a v1 type, or `None` for an unknown one.
    pub fn from_wire(t: u8) -> Option<RecordType> {
        match t {
            1 => Some(RecordType::Text),
            2 => Some(RecordType::Control),
            3 => Some(RecordType::Error),
            5 => Some(RecordType::Terminal),
            _ => None,
        }
    }
}

/// One decoded record.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// Text.
    Text(String),
    /// Control.
    Control(Value),
    /// Error.
    Error(Value),
    /// Terminal summary (the last frame of a generation, and the terminal reference).
    Terminal(Value),
}

impl Record {
    /// Its type.
    pub fn record_type(&self) -> RecordType {
        match self {
            Record::Text(_) => RecordType::Text,
            Record::Control(_) => RecordType::Control,
            Record::Error(_) => RecordType::Error,
            Record::Terminal(_) => RecordType::Terminal,
        }
    }

    /// The record of a kernel frame.
    pub fn from_frame(frame: kernel_core::ports::Frame) -> Record {
        match frame {
            kernel_core::ports::Frame::Text(s) => Record::Text(s),
            kernel_core::ports::Frame::Control(v) => Record::Control(v),
            kernel_core::ports::Frame::Error(v) => Record::Error(v),
        }
    }
}

/// Why bytes are not a valid record. Every decode failure is one of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// No header byte.
    #[error("empty record")]
    Empty,
    /// A version this reader does not know.
    #[error("unknown record version {0}")]
    UnknownVersion(u8),
    /// A type the version does not define.
    #[error("unknown record type {kind} in version {version}")]
    UnknownType {
        /// Header version.
        version: u8,
        /// Header type.
        kind: u8,
    },
    /// A text payload that is not UTF-8.
    #[error("text payload is not UTF-8")]
    InvalidUtf8,
    /// A JSON payload that does not parse.
    #[error("invalid JSON payload: {0}")]
    InvalidJson(String),
    /// A payload above [`PAYLOAD_BYTES_MAX`].
    #[error("payload of {0} bytes exceeds the limit")]
    TooLarge(usize),
}

/// The header byte of a type.
pub fn header(t: RecordType) -> u8 {
    (VERSION << 4) | t as u8
}

/// Encode a record: header byte, then raw UTF-8 (text) or compact JSON.
pub fn encode(record: &Record) -> Result<Vec<u8>, CodecError> {
    let t = record.record_type();
    let mut out = Vec::new();
    out.push(header(t));
    match record {
        Record::Text(s) => out.extend_from_slice(s.as_bytes()),
        Record::Control(v) | Record::Error(v) | Record::Terminal(v) => {
            serde_json::to_writer(&mut out, v).map_err(|e| CodecError::InvalidJson(e.to_string()))?
        }
    }
    if out.len() - 1 > PAYLOAD_BYTES_MAX {
        return Err(CodecError::TooLarge(out.len() - 1));
    }
    Ok(out)
}

/// Decode a record; unknown versions and types, bad UTF-8 and bad JSON are typed errors.
pub fn decode(bytes: &[u8]) -> Result<Record, CodecError> {
    let (&h, payload) = bytes.split_first().ok_or(CodecError::Empty)?;
    let (version, kind) = (h >> 4, h & 0x0f);
    if version != VERSION {
        return Err(CodecError::UnknownVersion(version));
    }
    let t = RecordType::from_wire(kind).ok_or(CodecError::UnknownType { version, kind })?;
    if payload.len() > PAYLOAD_BYTES_MAX {
        return Err(CodecError::TooLarge(payload.len()));
    }
    let json = || serde_json::from_slice::<Value>(payload).map_err(|e| CodecError::InvalidJson(e.to_string()));
    Ok(match t {
        RecordType::Text => Record::Text(String::from_utf8(payload.to_vec()).map_err(|_| CodecError::InvalidUtf8)?),
        RecordType::Control => Record::Control(json()?),
        RecordType::Error => Record::Error(json()?),
        RecordType::Terminal => Record::Terminal(json()?),
    })
}
