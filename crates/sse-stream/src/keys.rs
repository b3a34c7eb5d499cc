//! Redis key names of one stream.

use kernel_core::ports::StreamKey;
use sha2::{Digest, Sha256};

/// The four keys of a stream. They share one hash tag, so a Lua script touching all of
/// them also works on Redis Cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamKeys {
    /// The frame list.
    pub frames: String,
    /// The generation counter.
    pub generation: String,
    /// The terminal reference.
    pub terminal: String,
    /// The greatest owner that wrote (K-16 fencing).
    pub owner: String,
}

impl StreamKeys {
    /// Keys of `key` under `prefix`: `<prefix>:sse:{<digest>}:frames|gen|term|owner`, where the
    /// digest covers the length-prefixed `object_id`, `workflow_id` and `fencing_token`, so
    /// two different identities never share keys whatever characters they contain.
    pub fn new(prefix: &str, key: &StreamKey) -> StreamKeys {
        let mut h = Sha256::new();
        for part in [key.object_id.as_str(), key.workflow_id.as_str(), key.fencing_token.as_str()] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part.as_bytes());
        }
        let digest = hex::encode(&h.finalize()[..16]);
        let base = format!("{prefix}:sse:{{{digest}}}");
        StreamKeys {
            frames: format!("{base}:frames"),
            generation: format!("{base}:gen"),
            terminal: format!("{base}:term"),
            owner: format!("{base}:owner"),
        }
    }
}
