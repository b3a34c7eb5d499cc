//! The full SSE JSON event a browser receives, restored from a compact [`Record`].
//!
//! The envelope defaults are defined here once ([`DEFAULTS`]) and pinned by a snapshot
//! test: a change of these values is a protocol change for every client.

use crate::codec::Record;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The envelope values the compact record leaves out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EventDefaults {
    /// `code` of text, control and terminal events.
    pub code_ok: i64,
    /// `code` of an error event whose payload carries no integer `code`.
    pub code_error: i64,
    /// `retry`: the reconnect delay a client should use, in ms.
    pub retry_ms: u64,
}

/// The project's one set of defaults.
pub const DEFAULTS: EventDefaults = EventDefaults { code_ok: 0, code_error: 500, retry_ms: 1_000 };

/// `msg_type` of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MsgType {
    /// Text (`data` is a string).
    Text,
    /// Control (`data` is the control JSON).
    Control,
    /// Error (`data` is the error JSON).
    Error,
    /// Terminal (`data` is the terminal summary).
    Terminal,
}

/// The full SSE JSON event (`code`, `retry`, `msg_type`, `data`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SseEvent {
    /// 0 for normal events; for errors the payload's `code` or [`EventDefaults::code_error`].
    pub code: i64,
    /// Reconnect delay in ms.
    pub retry: u64,
    /// Kind of event.
    pub msg_type: MsgType,
    /// Payload.
    pub data: Value,
}

impl SseEvent {
    /// Restore the full event of a compact record with [`DEFAULTS`].
    pub fn from_record(record: Record) -> SseEvent {
        let d = DEFAULTS;
        let (code, msg_type, data) = match record {
            Record::Text(s) => (d.code_ok, MsgType::Text, Value::String(s)),
            Record::Control(v) => (d.code_ok, MsgType::Control, v),
            Record::Error(v) => (error_code(&v), MsgType::Error, v),
            Record::Terminal(v) => (d.code_ok, MsgType::Terminal, v),
        };
        SseEvent { code, retry: d.retry_ms, msg_type, data }
    }

    /// The compact record of this event, or `None` when its envelope differs from what
    /// [`from_record`](Self::from_record) would restore (such an event has no compact form).
    pub fn to_record(&self) -> Option<Record> {
        let record = match (&self.msg_type, &self.data) {
            (MsgType::Text, Value::String(s)) => Record::Text(s.clone()),
            (MsgType::Text, _) => return None,
            (MsgType::Control, v) => Record::Control(v.clone()),
            (MsgType::Error, v) => Record::Error(v.clone()),
            (MsgType::Terminal, v) => Record::Terminal(v.clone()),
        };
        (SseEvent::from_record(record.clone()) == *self).then_some(record)
    }

    /// Compact JSON of the full event (the SSE `data:` line).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| String::from("{}"))
    }
}

fn error_code(v: &Value) -> i64 {
    v.get("code").and_then(Value::as_i64).unwrap_or(DEFAULTS.code_error)
}
