//! The Redis writer: a [`StreamSink`] that batches text and appends with one Lua call.

use crate::codec::{encode, Record};
use crate::keys::StreamKeys;
use crate::{map_redis_error, StreamConfig};
use kernel_core::domain::Instant;
use kernel_core::ports::{DynClock, Frame, StreamKey, StreamOwner, StreamSink};
use kernel_core::{Error, Result};
use redis::Script;
use redis_conn::RedisConn;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

static APPEND: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/append.lua")));
static RESET: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/reset.lua")));
static TERMINAL: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/terminal.lua")));

/// Writer-side state of one stream. Guarded by an async mutex so that a linger flush and
/// an append never reorder frames.
#[derive(Debug, Default)]
struct KeyState {
    /// Text not yet appended.
    pending: String,
    /// When the first pending text arrived.
    pending_since: Option<Instant>,
    /// Offset the next appended frame gets, when known.
    next_offset: Option<u64>,
    /// Bumped on every flush so a stale linger timer does nothing.
    epoch: u64,
    /// Terminal written: every later frame is refused.
    terminal: bool,
    /// The owner the pending text belongs to (K-16 fencing).
    owner: Option<StreamOwner>,
}

type Shared = Arc<tokio::sync::Mutex<KeyState>>;

struct Inner {
    conn: RedisConn,
    clock: Arc<DynClock>,
    config: StreamConfig,
    streams: Mutex<HashMap<StreamKey, Shared>>,
}

/// Client progress streams on Redis (K-16).
///
/// - Text is batched per stream: a frame is appended when ~[`StreamConfig::text_batch_bytes`]
///   are pending or [`StreamConfig::text_linger_ms`] after the first pending text (on the
///   [`Clock`](kernel_core::ports::Clock) port); control, error and terminal frames flush
///   pending text first, in the same Lua call.
/// - Every append is **one** Lua call: `RPUSH`, the offset, the frames' TTL refreshed;
///   refused once the terminal reference exists, and refused with
///   [`Error::InvalidInput`] (nothing appended) when the generation would exceed
///   [`StreamConfig::frames_max`] frames — the terminal frame always fits.
/// - `reset` clears frames and terminal reference and bumps the generation.
/// - `terminal` appends the terminal frame and writes the terminal reference, then
///   shortens only the frames' TTL to the read-out window.
/// - Every script compares the writer's [`StreamOwner`] with the stream's (a fourth key)
///   and refuses an older one, so a zombie's reset, append or terminal changes nothing.
///
/// Cheap to clone; clones share the connection and the batches.
#[derive(Clone)]
pub struct RedisStreamSink {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisStreamSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStreamSink").field("config", &self.inner.config).finish_non_exhaustive()
    }
}

impl RedisStreamSink {
    /// A writer on `conn` with `config`; time comes from `clock`.
    pub fn new(conn: impl Into<RedisConn>, clock: Arc<DynClock>, config: StreamConfig) -> Result<Self> {
        config.validate()?;
        Ok(RedisStreamSink {
            inner: Arc::new(Inner { conn: conn.into(), clock, config, streams: Mutex::new(HashMap::new()) }),
        })
    }

    /// A sink with `config` on a new connection to `url` (see [`connect`](crate::connect)).
    pub async fn from_url(url: &str, clock: Arc<DynClock>, config: StreamConfig) -> Result<Self> {
        config.validate()?;
        Self::new(crate::connect(url).await?, clock, config)
    }

    /// The configuration.
    pub fn config(&self) -> &StreamConfig {
        &self.inner.config
    }

    /// The keys of a stream.
    pub fn keys(&self, key: &StreamKey) -> StreamKeys {
        StreamKeys::new(&self.inner.config.prefix, &self.inner.config.secret, key)
    }

    /// Append pending text of every stream now (e.g. before shutdown).
    pub async fn flush_all(&self) -> Result<()> {
        let all: Vec<(StreamKey, Shared)> =
            self.inner.streams.lock().expect("streams lock").iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let mut first_err = None;
        for (key, state) in all {
            let mut st = state.lock().await;
            if let Err(e) = self.inner.append_records(&key, &mut st, Vec::new()).await {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn state(&self, key: &StreamKey) -> Shared {
        let mut map = self.inner.streams.lock().expect("streams lock");
        if let Some(s) = map.get(key) {
            return s.clone();
        }
        if map.len() >= self.inner.config.streams_max {
            // Forget idle streams; their offsets are re-learnt on the next append.
            map.retain(|_, s| Arc::strong_count(s) > 1 || s.try_lock().map_or(true, |st| !st.pending.is_empty()));
        }
        map.entry(key.clone()).or_default().clone()
    }

    fn forget(&self, key: &StreamKey) {
        self.inner.streams.lock().expect("streams lock").remove(key);
    }

    fn arm_linger(&self, key: StreamKey, state: Shared, due: Instant, epoch: u64) {
        let inner = self.inner.clone();
        tokio::spawn(async move {
            inner.clock.sleep_until(due).await;
            let mut st = state.lock().await;
            if st.epoch == epoch && !st.pending.is_empty() {
                if let Err(e) = inner.append_records(&key, &mut st, Vec::new()).await {
                    tracing::debug!(error = %e, "linger flush failed; pending text dropped");
                }
            }
        });
    }
}

fn terminal_refused() -> Error {
    Error::Conflict("stream is terminal: no frames after the terminal frame".into())
}

fn owner_refused() -> Error {
    Error::Conflict("stream is owned by a newer writer".into())
}

fn owner_arg(owner: Option<StreamOwner>) -> i64 {
    owner.map_or(i64::MIN, |o| o.lease_until.as_millis())
}

fn encoded(record: &Record) -> Result<Vec<u8>> {
    encode(record).map_err(|e| Error::invalid("frame", e))
}

impl Inner {
    /// One Lua call: pending text (if any), then `extra`. Returns the offset of the first
    /// frame of `extra` (or of the text frame when `extra` is empty).
    async fn append_records(&self, key: &StreamKey, st: &mut KeyState, extra: Vec<Record>) -> Result<Option<u64>> {
        let mut records = Vec::with_capacity(extra.len() + 1);
        let had_text = !st.pending.is_empty();
        if had_text {
            records.push(encoded(&Record::Text(std::mem::take(&mut st.pending)))?);
        }
        st.pending_since = None;
        st.epoch += 1;
        for r in &extra {
            records.push(encoded(r)?);
        }
        if records.is_empty() {
            return Ok(None);
        }
        let keys = StreamKeys::new(&self.config.prefix, &self.config.secret, key);
        let mut inv = APPEND.prepare_invoke();
        inv.key(&keys.frames).key(&keys.terminal).key(&keys.generation).key(&keys.owner);
        inv.arg(self.config.frames_ttl_ms)
            .arg(self.config.reconnect_ttl_ms)
            .arg(owner_arg(st.owner))
            .arg(self.config.frames_max);
        for r in &records {
            inv.arg(r.as_slice());
        }
        let mut conn = self.conn.clone();
        let (offset, _gen): (i64, u64) = inv.invoke_async(&mut conn).await.map_err(map_redis_error)?;
        if offset == -2 {
            return Err(owner_refused());
        }
        if offset == -3 {
            return Err(Error::invalid(
                "stream",
                format_args!("the generation holds its limit of {} frames; frame dropped", self.config.frames_max),
            ));
        }
        if offset < 0 {
            st.terminal = true;
            return Err(terminal_refused());
        }
        let offset = offset as u64;
        st.next_offset = Some(offset + records.len() as u64);
        let skip = u64::from(had_text && !extra.is_empty());
        Ok(Some(offset + skip))
    }
}

#[async_trait::async_trait]
impl StreamSink for RedisStreamSink {
    async fn reset(&self, key: &StreamKey, owner: StreamOwner) -> Result<u64> {
        let state = self.state(key);
        let mut st = state.lock().await;
        let keys = self.keys(key);
        let mut conn = self.inner.conn.clone();
        let gen: i64 = RESET
            .key(&keys.frames)
            .key(&keys.terminal)
            .key(&keys.generation)
            .key(&keys.owner)
            .arg(self.inner.config.reconnect_ttl_ms)
            .arg(owner_arg(Some(owner)))
            .invoke_async(&mut conn)
            .await
            .map_err(map_redis_error)?;
        if gen < 0 {
            return Err(owner_refused());
        }
        // Text of the previous generation must never land in the new one.
        st.pending.clear();
        st.pending_since = None;
        st.epoch += 1;
        st.terminal = false;
        st.next_offset = Some(0);
        st.owner = Some(owner);
        Ok(gen as u64)
    }

    async fn append(&self, key: &StreamKey, owner: StreamOwner, frame: Frame) -> Result<u64> {
        let cfg = &self.inner.config;
        let state = self.state(key);
        let mut st = state.lock().await;
        if st.owner.is_some_and(|o| o > owner) {
            return Err(owner_refused());
        }
        if st.owner != Some(owner) {
            // Pending text is appended under the owner that wrote it, never under another.
            if !st.pending.is_empty() {
                self.inner.append_records(key, &mut st, Vec::new()).await?;
            }
            st.owner = Some(owner);
        }
        if st.terminal {
            return Err(terminal_refused());
        }
        let text = match frame {
            Frame::Text(t) => t,
            other => {
                let r = Record::from_frame(other);
                let off = self.inner.append_records(key, &mut st, vec![r]).await?;
                return Ok(off.unwrap_or(0));
            }
        };
        if text.len() > cfg.frame_bytes_max {
            return Err(Error::invalid("frame", format_args!("{} bytes exceed {}", text.len(), cfg.frame_bytes_max)));
        }
        if !st.pending.is_empty() && st.pending.len() + text.len() > cfg.text_batch_bytes {
            self.inner.append_records(key, &mut st, Vec::new()).await?;
        }
        let now = self.inner.clock.now();
        let started = st.pending.is_empty();
        let since = *st.pending_since.get_or_insert(now);
        st.pending.push_str(&text);
        let linger_over = now - since >= cfg.text_linger_ms;
        match st.next_offset {
            // Unknown offset (no reset seen by this writer): append now to learn it.
            None => Ok(self.inner.append_records(key, &mut st, Vec::new()).await?.unwrap_or(0)),
            Some(_) if st.pending.len() >= cfg.text_batch_bytes || linger_over => {
                Ok(self.inner.append_records(key, &mut st, Vec::new()).await?.unwrap_or(0))
            }
            Some(next) => {
                if started {
                    self.arm_linger(key.clone(), state.clone(), since.saturating_add(cfg.text_linger_ms), st.epoch);
                }
                Ok(next)
            }
        }
    }

    async fn terminal(&self, key: &StreamKey, owner: StreamOwner, summary: Value) -> Result<()> {
        let cfg = &self.inner.config;
        let state = self.state(key);
        let mut st = state.lock().await;
        if st.owner.is_some_and(|o| o != owner) && !st.pending.is_empty() {
            // Another owner's pending text goes under its own owner (or is refused).
            if let Err(e) = self.inner.append_records(key, &mut st, Vec::new()).await {
                tracing::debug!(error = %e, "pending text of another owner dropped");
            }
        }
        let keys = self.keys(key);
        let mut inv = TERMINAL.prepare_invoke();
        inv.key(&keys.frames).key(&keys.terminal).key(&keys.generation).key(&keys.owner);
        inv.arg(encoded(&Record::Terminal(summary))?)
            .arg(cfg.readout_ttl_ms)
            .arg(cfg.reconnect_ttl_ms)
            .arg(owner_arg(Some(owner)));
        if !st.pending.is_empty() {
            inv.arg(encoded(&Record::Text(std::mem::take(&mut st.pending)))?);
        }
        st.pending_since = None;
        st.epoch += 1;
        st.terminal = true;
        let mut conn = self.inner.conn.clone();
        let r: std::result::Result<i64, _> = inv.invoke_async(&mut conn).await;
        drop(st);
        self.forget(key);
        match r.map_err(map_redis_error)? {
            -2 => Err(owner_refused()),
            _ => Ok(()),
        }
    }
}
