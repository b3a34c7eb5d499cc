use crate::error::Result;
use crate::id::{FencingToken, ObjectId, WorkflowId};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;

/// Identity of a client stream: `object_id + workflow_id + fencing_token` (K-16).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StreamKey {
    /// The business object the client watches.
    pub object_id: ObjectId,
    /// The instance producing the frames.
    pub workflow_id: WorkflowId,
    /// The business round (K-12): a new round is a new stream, so a stale round's frames
    /// never reach a client of the current one.
    pub fencing_token: FencingToken,
}

/// A progress frame (K-16 v1 types).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Frame {
    /// Raw UTF-8 text.
    Text(String),
    /// Control message (compact JSON).
    Control(Value),
    /// Error message (compact JSON).
    Error(Value),
}

/// Where streaming steps write client progress. Best effort: a failure never affects the
/// workflow (K-16).
#[async_trait::async_trait]
pub trait StreamSink: Send + Sync + 'static {
    /// Clear frames and terminal reference, bump the generation.
    ///
    /// # Contract
    /// Atomic; returns the new generation.
    async fn reset(&self, key: &StreamKey) -> Result<u64>;

    /// Append one frame; returns its offset.
    ///
    /// # Contract
    /// Refused after the terminal frame.
    async fn append(&self, key: &StreamKey, frame: Frame) -> Result<u64>;

    /// Append the terminal frame and reference (after the store committed the terminal
    /// state).
    ///
    /// # Contract
    /// Called only after the store committed the terminal state (K-1.3), so a reader that
    /// sees the terminal frame may read the final result from the store. Idempotent per
    /// generation: a second call leaves one terminal frame. After it, `append` is refused.
    /// Best effort: an error changes nothing about the workflow.
    async fn terminal(&self, key: &StreamKey, summary: Value) -> Result<()>;
}

/// `dyn StreamSink`.
pub type DynStreamSink = dyn StreamSink;

/// Discards frames.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoopStreamSink;

#[async_trait::async_trait]
impl StreamSink for NoopStreamSink {
    async fn reset(&self, _key: &StreamKey) -> Result<u64> {
        Ok(0)
    }
    async fn append(&self, _key: &StreamKey, _frame: Frame) -> Result<u64> {
        Ok(0)
    }
    async fn terminal(&self, _key: &StreamKey, _summary: Value) -> Result<()> {
        Ok(())
    }
}

/// A stream bound to one key, handed to a streaming step's activity.
#[derive(Clone)]
pub struct StreamHandle {
    pub(crate) sink: Arc<DynStreamSink>,
    pub(crate) key: StreamKey,
}

impl std::fmt::Debug for StreamHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamHandle").field("key", &self.key).finish_non_exhaustive()
    }
}

impl StreamHandle {
    /// Bind a sink to a key.
    pub fn new(sink: Arc<DynStreamSink>, key: StreamKey) -> Self {
        StreamHandle { sink, key }
    }
    /// The key.
    pub fn key(&self) -> &StreamKey {
        &self.key
    }
    /// Append text (best effort; errors are returned for the caller to ignore or log).
    pub async fn text(&self, s: impl Into<String>) -> Result<u64> {
        self.sink.append(&self.key, Frame::Text(s.into())).await
    }
    /// Append any frame.
    pub async fn append(&self, f: Frame) -> Result<u64> {
        self.sink.append(&self.key, f).await
    }
}
