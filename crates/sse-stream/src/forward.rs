//! The reader: one forwarder per client connection, with its own cursor (K-16).

use crate::codec::{decode, Record};
use crate::keys::StreamKeys;
use crate::map_redis_error;
use futures::future::BoxFuture;
use kernel_core::{Error, Result};
use redis::AsyncCommands;
use redis_conn::RedisConn;
use serde_json::Value;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

/// A hook run between the generation check and the list read of every read; tests use it
/// to inject a reset into exactly that window.
pub type ReadHook = Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// What a forwarder hands to its client, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum ForwardEvent {
    /// The stream was already terminal when the client connected: the final result, and
    /// nothing else (no replay).
    Final(Value),
    /// (Re)start of a generation: the client drops what it has shown; frames from 0 follow.
    Replay {
        /// The generation being replayed.
        generation: u64,
    },
    /// A frame of the current generation.
    Frame {
        /// Generation it belongs to.
        generation: u64,
        /// Its index in the generation.
        offset: u64,
        /// The record (never [`Record::Terminal`]).
        record: Record,
    },
    /// The terminal frame, reached while following. Nothing follows.
    Terminal(Value),
}

/// Forwarder settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardConfig {
    /// Frames read per `LRANGE`.
    pub read_batch: usize,
    /// Wait between reads when there is nothing new, in ms.
    pub poll_ms: u64,
    /// Longest wait for a new frame (or a reset, or the terminal): a stream nobody writes —
    /// abandoned, expired or never started — ends the forwarder with a retryable
    /// [`Error::Unavailable`] instead of being polled forever; the client may reconnect.
    /// Counted in polls of `poll_ms`.
    pub idle_ms_max: u64,
}

impl Default for ForwardConfig {
    fn default() -> Self {
        ForwardConfig { read_batch: 256, poll_ms: 50, idle_ms_max: 600_000 }
    }
}

/// Follows one stream for one client: final result if the terminal reference exists,
/// else a replay of the current generation from frame 0, then live frames, then the
/// terminal. Generation is read before and after every list read; a change discards
/// what was read and restarts the replay, so no client ever sees two generations mixed.
pub struct Forwarder {
    conn: RedisConn,
    keys: StreamKeys,
    config: ForwardConfig,
    hook: Option<ReadHook>,
    generation: u64,
    cursor: u64,
    started: bool,
    done: bool,
    out: VecDeque<ForwardEvent>,
    skipped: u64,
    /// Time waited since the last new frame, generation or start, in ms.
    idle_ms: u64,
}

impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder")
            .field("keys", &self.keys)
            .field("generation", &self.generation)
            .field("cursor", &self.cursor)
            .finish_non_exhaustive()
    }
}

impl Forwarder {
    /// A forwarder for the stream whose keys are `keys` ([`StreamKeys::new`] with the
    /// writer's prefix and secret). An endpoint authorises the client first
    /// ([`StreamAuthorizer`](crate::StreamAuthorizer)).
    pub fn new(conn: impl Into<RedisConn>, keys: StreamKeys, config: ForwardConfig) -> Self {
        Forwarder {
            conn: conn.into(),
            keys,
            config,
            hook: None,
            generation: 0,
            cursor: 0,
            started: false,
            done: false,
            out: VecDeque::new(),
            skipped: 0,
            idle_ms: 0,
        }
    }

    /// Install a hook run between the generation check and the list read (tests).
    pub fn with_read_hook(mut self, hook: ReadHook) -> Self {
        self.hook = Some(hook);
        self
    }

    /// Frames that did not decode and were skipped.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// The cursor: frames of the current generation handed out so far.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    async fn generation_now(&mut self) -> Result<u64> {
        let g: Option<u64> = self.conn.get(&self.keys.generation).await.map_err(map_redis_error)?;
        Ok(g.unwrap_or(0))
    }

    async fn terminal_reference(&mut self) -> Result<Option<Value>> {
        let raw: Option<Vec<u8>> = self.conn.get(&self.keys.terminal).await.map_err(map_redis_error)?;
        Ok(raw.and_then(|b| match decode(&b) {
            Ok(Record::Terminal(v)) => Some(v),
            Ok(_) | Err(_) => {
                tracing::warn!(key = %self.keys.terminal, "terminal reference does not decode");
                None
            }
        }))
    }

    fn restart(&mut self, generation: u64) -> ForwardEvent {
        self.generation = generation;
        self.cursor = 0;
        self.out.clear();
        self.idle_ms = 0;
        ForwardEvent::Replay { generation }
    }

    /// The next event, or `None` after [`ForwardEvent::Final`] / [`ForwardEvent::Terminal`].
    /// Waits (polling) while the stream has nothing new.
    pub async fn next(&mut self) -> Result<Option<ForwardEvent>> {
        if let Some(e) = self.out.pop_front() {
            return Ok(Some(e));
        }
        if self.done {
            return Ok(None);
        }
        if !self.started {
            self.started = true;
            if let Some(summary) = self.terminal_reference().await? {
                self.done = true;
                return Ok(Some(ForwardEvent::Final(summary)));
            }
            let g = self.generation_now().await?;
            return Ok(Some(self.restart(g)));
        }
        loop {
            let before = self.generation_now().await?;
            if before != self.generation {
                return Ok(Some(self.restart(before)));
            }
            if let Some(hook) = &self.hook {
                hook().await;
            }
            let stop = self.cursor as isize + self.config.read_batch.max(1) as isize - 1;
            let raw: Vec<Vec<u8>> =
                self.conn.lrange(&self.keys.frames, self.cursor as isize, stop).await.map_err(map_redis_error)?;
            let after = self.generation_now().await?;
            if after != self.generation {
                return Ok(Some(self.restart(after)));
            }
            let raw = if raw.is_empty() {
                // Nothing new: either still generating, or the frames' read-out window has
                // passed after the terminal (the reference outlives the frames).
                match self.terminal_reference().await? {
                    Some(summary) => {
                        // The last frames and the terminal may have landed between the
                        // read above and this check: read once more, so they are delivered
                        // before the terminal, never skipped.
                        let rest: Vec<Vec<u8>> = self
                            .conn
                            .lrange(&self.keys.frames, self.cursor as isize, -1)
                            .await
                            .map_err(map_redis_error)?;
                        if rest.is_empty() || self.generation_now().await? != self.generation {
                            self.done = true;
                            return Ok(Some(ForwardEvent::Terminal(summary)));
                        }
                        rest
                    }
                    None => raw,
                }
            } else {
                raw
            };
            if raw.is_empty() {
                if self.idle_ms >= self.config.idle_ms_max {
                    self.done = true;
                    return Err(Error::unavailable(format!(
                        "no new frame for {} ms: the stream looks abandoned",
                        self.idle_ms
                    )));
                }
                tokio::time::sleep(Duration::from_millis(self.config.poll_ms)).await;
                self.idle_ms = self.idle_ms.saturating_add(self.config.poll_ms.max(1));
                continue;
            }
            self.idle_ms = 0;
            for bytes in raw {
                let offset = self.cursor;
                self.cursor += 1;
                match decode(&bytes) {
                    Ok(Record::Terminal(v)) => {
                        self.done = true;
                        self.out.push_back(ForwardEvent::Terminal(v));
                        break;
                    }
                    Ok(record) => {
                        self.out.push_back(ForwardEvent::Frame { generation: self.generation, offset, record })
                    }
                    Err(e) => {
                        self.skipped += 1;
                        tracing::warn!(offset, error = %e, "skipping a frame that does not decode");
                    }
                }
            }
            if let Some(e) = self.out.pop_front() {
                return Ok(Some(e));
            }
        }
    }
}
