//! # sse-stream
//!
//! Resumable client progress streams of the durable workflow kernel (SPEC K-16). A stream
//! belongs to one business round: its key is `object_id + workflow_id + fencing_token`
//! ([`StreamKey`]). It is a side channel: it never decides a result (K-1.3), and a failed
//! append or reset never affects the workflow.
//!
//! - [`codec`]: the compact record, one header byte `version << 4 | type` then the payload
//!   (v1: 1 text, 2 control, 3 error, 5 terminal reference); unknown versions and types are
//!   typed errors.
//! - [`event`]: the full SSE JSON event (`code`, `retry`, `msg_type`, `data`) a decoder
//!   restores with the project's defaults.
//! - [`RedisStreamSink`]: the [`StreamSink`](kernel_core::ports::StreamSink) the engine
//!   writes through: text batching, one Lua call per append, reset, terminal.
//! - [`Forwarder`]: one per client connection, with its own cursor; final result when the
//!   terminal reference exists, otherwise replay from frame 0 and follow, checking the
//!   generation around every read.
//!
//! ```
//! use sse_stream::codec::{decode, encode, Record};
//! use sse_stream::event::{MsgType, SseEvent};
//!
//! let bytes = encode(&Record::Text("hello".into())).unwrap();
//! assert_eq!(bytes[0], 0x11); // version 1, type 1
//! let event = SseEvent::from_record(decode(&bytes).unwrap());
//! assert_eq!(event.msg_type, MsgType::Text);
//! assert_eq!(event.to_json(), r#"{"code":0,"retry":1000,"msg_type":"text","data":"hello"}"#);
//! ```
//!
//! Keys live under a configurable prefix, are passed to scripts in `KEYS` and share one
//! hash tag per stream, an HMAC under the server's [`StreamSecret`], so a stream's keys
//! cannot be derived from its public identity; values travel in `ARGV`. An endpoint that
//! serves streams checks each request with a [`StreamAuthorizer`] ([`ReadGrants`]: grants
//! signed with the same secret).

pub mod codec;
pub mod event;
mod forward;
mod keys;
mod writer;

pub use forward::{ForwardConfig, ForwardEvent, Forwarder, ReadHook};
pub use keys::{ReadGrants, StreamAuthorizer, StreamKeys, StreamSecret};
pub use writer::RedisStreamSink;

use kernel_core::domain::DurationMs;
pub use kernel_core::ports::StreamKey;
use kernel_core::{Error, Result};
use redis_conn::map_redis_error;
/// The connection types [`RedisStreamSink::new`] and [`Forwarder::new`] take (one server or a
/// cluster), so callers need no `redis` dependency.
pub use redis_conn::{ConnectionManager, RedisConn};

/// The shared Redis connection helper and its timeouts (a frame append that takes longer
/// than `RESPONSE_TIMEOUT_MS` is dropped; streams are best effort, K-16).
pub use redis_conn::{connect, CONNECT_TIMEOUT_MS, RESPONSE_TIMEOUT_MS};

/// Writer settings. Times in ms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamConfig {
    /// Key prefix (the identifier rule of K-2.0).
    pub prefix: String,
    /// The server's secret that keys stream names (shared by every writer and reader).
    pub secret: StreamSecret,
    /// Append pending text once this many bytes are pending (~1 KB).
    pub text_batch_bytes: usize,
    /// Append pending text this long after the first of it arrived (~100 ms).
    pub text_linger_ms: DurationMs,
    /// Largest single frame.
    pub frame_bytes_max: usize,
    /// Frames' TTL while generating, refreshed on every append.
    pub frames_ttl_ms: u64,
    /// Frames' TTL after the terminal frame: the read-out window.
    pub readout_ttl_ms: u64,
    /// TTL of the generation key and the terminal reference.
    pub reconnect_ttl_ms: u64,
    /// Most streams whose batching state the writer keeps in memory.
    pub streams_max: usize,
    /// Most frames of one generation; an append beyond it is refused with
    /// [`Error::InvalidInput`] and appends nothing (the terminal frame always fits).
    pub frames_max: u64,
}

impl StreamConfig {
    /// Default settings under `prefix`, keyed by `secret`.
    pub fn new(prefix: &str, secret: StreamSecret) -> Self {
        StreamConfig {
            prefix: prefix.to_string(),
            secret,
            text_batch_bytes: 1_024,
            text_linger_ms: DurationMs::from_millis(100),
            frame_bytes_max: 64 * 1024,
            frames_ttl_ms: 6 * 3_600_000,
            readout_ttl_ms: 60_000,
            reconnect_ttl_ms: 24 * 3_600_000,
            streams_max: 10_000,
            frames_max: 10_000,
        }
    }

    /// Check the limits.
    pub fn validate(&self) -> Result<()> {
        redis_conn::check_prefix(&self.prefix)?;
        let positive = |field: &str, v: u64| {
            if v == 0 {
                Err(Error::invalid(field, "must be positive"))
            } else {
                Ok(())
            }
        };
        positive("text_batch_bytes", self.text_batch_bytes as u64)?;
        positive("frame_bytes_max", self.frame_bytes_max as u64)?;
        positive("frames_ttl_ms", self.frames_ttl_ms)?;
        positive("readout_ttl_ms", self.readout_ttl_ms)?;
        positive("reconnect_ttl_ms", self.reconnect_ttl_ms)?;
        positive("streams_max", self.streams_max as u64)?;
        positive("frames_max", self.frames_max)?;
        if self.text_linger_ms < 0 {
            return Err(Error::invalid("text_linger_ms", "must not be negative"));
        }
        if self.frame_bytes_max > codec::PAYLOAD_BYTES_MAX {
            return Err(Error::invalid("frame_bytes_max", format_args!("exceeds {}", codec::PAYLOAD_BYTES_MAX)));
        }
        Ok(())
    }
}
