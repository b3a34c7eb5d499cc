use crate::domain::Instant;
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

/// Who writes a stream, for fencing (K-16, K-6.4): the end of the lease under which the
/// writer acts, as the store accepted it — a claim's lease end (its claim or its last
/// applied heartbeat), or the `claimable_time` a start wrote.
///
/// A later owner of the instance always has a greater value: a claim is taken only when
/// the stored lease end is `≤ now` and writes `now + lease`, and a zombie's heartbeats miss
/// once its token is replaced. So a sink that remembers the greatest owner it has seen can
/// refuse a zombie's reset or append inside the one atomic operation, without asking the
/// store.
///
/// ```
/// use kernel_core::domain::Instant;
/// use kernel_core::ports::StreamOwner;
/// let zombie = StreamOwner { lease_until: Instant::from_millis(30_000) };
/// let successor = StreamOwner { lease_until: Instant::from_millis(60_001) };
/// assert!(zombie < successor);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct StreamOwner {
    /// End of the writer's lease as the store accepted it.
    pub lease_until: Instant,
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
///
/// Every write carries its [`StreamOwner`]; a sink keeps the greatest owner it has seen per
/// stream and refuses, inside the same atomic operation, any write of a smaller one with
/// [`Error::Conflict`](crate::Error::Conflict): a zombie whose claim was taken over can
/// neither wipe its successor's frames nor delete the terminal reference.
#[async_trait::async_trait]
pub trait StreamSink: Send + Sync + 'static {
    /// Clear frames and terminal reference, bump the generation.
    ///
    /// # Contract
    /// Atomic with the owner check: refused ([`Error::Conflict`](crate::Error::Conflict),
    /// nothing changed) when the stream has seen a greater owner; otherwise `owner` becomes
    /// the stream's owner. Returns the new generation.
    async fn reset(&self, key: &StreamKey, owner: StreamOwner) -> Result<u64>;

    /// Append one frame; returns its offset.
    ///
    /// # Contract
    /// Refused after the terminal frame, and when the stream has seen a greater owner
    /// ([`Error::Conflict`](crate::Error::Conflict), nothing appended); a greater owner
    /// than the stream's becomes its owner. An adapter may bound the frames of one
    /// generation; beyond its bound the append is refused with
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) and nothing is appended.
    async fn append(&self, key: &StreamKey, owner: StreamOwner, frame: Frame) -> Result<u64>;

    /// Append the terminal frame and reference (after the store committed the terminal
    /// state).
    ///
    /// # Contract
    /// Called only after the store committed the terminal state (K-1.3), so a reader that
    /// sees the terminal frame may read the final result from the store. Idempotent per
    /// generation: a second call leaves one terminal frame. After it, `append` is refused.
    /// Refused like `append` when the stream has seen a greater owner. Best effort: an
    /// error changes nothing about the workflow.
    async fn terminal(&self, key: &StreamKey, owner: StreamOwner, summary: Value) -> Result<()>;
}

/// `dyn StreamSink`.
pub type DynStreamSink = dyn StreamSink;

/// Discards frames.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoopStreamSink;

#[async_trait::async_trait]
impl StreamSink for NoopStreamSink {
    async fn reset(&self, _key: &StreamKey, _owner: StreamOwner) -> Result<u64> {
        Ok(0)
    }
    async fn append(&self, _key: &StreamKey, _owner: StreamOwner, _frame: Frame) -> Result<u64> {
        Ok(0)
    }
    async fn terminal(&self, _key: &StreamKey, _owner: StreamOwner, _summary: Value) -> Result<()> {
        Ok(())
    }
}

/// A stream bound to one key, handed to a streaming step's activity.
#[derive(Clone)]
pub struct StreamHandle {
    pub(crate) sink: Arc<DynStreamSink>,
    pub(crate) key: StreamKey,
    pub(crate) owner: StreamOwner,
}

impl std::fmt::Debug for StreamHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamHandle").field("key", &self.key).field("owner", &self.owner).finish_non_exhaustive()
    }
}

impl StreamHandle {
    /// Bind a sink to a key, writing as `owner`.
    pub fn new(sink: Arc<DynStreamSink>, key: StreamKey, owner: StreamOwner) -> Self {
        StreamHandle { sink, key, owner }
    }
    /// The key.
    pub fn key(&self) -> &StreamKey {
        &self.key
    }
    /// Append text (best effort; errors are returned for the caller to ignore or log).
    pub async fn text(&self, s: impl Into<String>) -> Result<u64> {
        self.sink.append(&self.key, self.owner, Frame::Text(s.into())).await
    }
    /// Append any frame.
    pub async fn append(&self, f: Frame) -> Result<u64> {
        self.sink.append(&self.key, self.owner, f).await
    }
}
