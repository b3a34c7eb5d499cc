use crate::RedisConn;
use futures::StreamExt;
use kernel_core::ports::{Wakeup, WakeupReceiver};
use kernel_core::Result;
use redis_conn::{check_prefix, map_redis_error};
use std::time::Duration;

/// Longest pause between two resubscribe attempts.
const RESUBSCRIBE_BACKOFF_MAX_MS: u64 = 5_000;

/// The wakeup doorbell over Redis pub/sub on channel `<prefix>:wakeup` (K-13).
///
/// [`Wakeup::subscribe`] opens a dedicated pub/sub connection and spawns a subscriber task
/// that turns every message into a coalesced `()` on an mpsc channel of capacity 1. When the
/// connection drops, the task resubscribes with backoff and rings once, since messages sent
/// meanwhile were lost; lost rings only delay (the engine also polls). The task ends when
/// the receiver is dropped.
///
/// On a Redis Cluster, `PUBLISH` goes to any node and the cluster forwards it to every
/// node, so the subscriber listens on one seed node; when that node fails it moves on to
/// the next seed (round robin) and rings once.
#[derive(Clone)]
pub struct RedisWakeup {
    clients: Vec<redis::Client>,
    conn: RedisConn,
    channel: String,
}

impl std::fmt::Debug for RedisWakeup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisWakeup").field("channel", &self.channel).finish()
    }
}

impl RedisWakeup {
    /// Doorbell under `prefix`; `client` opens the subscriber connections, `conn` publishes.
    pub fn new(client: redis::Client, conn: impl Into<RedisConn>, prefix: &str) -> Result<Self> {
        Self::with_clients(vec![client], conn, prefix)
    }

    /// Doorbell under `prefix` whose subscriber tries `clients` in turn (the seed nodes of
    /// a cluster); `conn` publishes. At least one client.
    pub fn with_clients(clients: Vec<redis::Client>, conn: impl Into<RedisConn>, prefix: &str) -> Result<Self> {
        check_prefix(prefix)?;
        if clients.is_empty() {
            return Err(kernel_core::Error::invalid("redis url", "no node to subscribe on"));
        }
        Ok(RedisWakeup { clients, conn: conn.into(), channel: format!("{prefix}:wakeup") })
    }

    /// The doorbell under `prefix` on a new connection to `url`; see
    /// [`RedisConnection::open`](crate::RedisConnection::open) for the errors.
    pub async fn from_url(url: &str, prefix: &str) -> Result<Self> {
        crate::RedisConnection::open(url).await?.wakeup(prefix)
    }

    /// The pub/sub channel.
    pub fn channel(&self) -> &str {
        &self.channel
    }
}

async fn open(client: &redis::Client, channel: &str) -> redis::RedisResult<redis::aio::PubSub> {
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.subscribe(channel).await?;
    Ok(pubsub)
}

async fn run_subscriber(
    clients: Vec<redis::Client>,
    mut next: usize,
    channel: String,
    mut pubsub: redis::aio::PubSub,
    tx: tokio::sync::mpsc::Sender<()>,
) {
    loop {
        {
            let mut messages = pubsub.into_on_message();
            loop {
                tokio::select! {
                    _ = tx.closed() => return,
                    m = messages.next() => match m {
                        // Full channel: a ring is already pending, which is all a doorbell says.
                        Some(_) => { let _ = tx.try_send(()); }
                        None => break,
                    },
                }
            }
        }
        tracing::debug!(channel, "wakeup subscription lost; resubscribing");
        let mut backoff_ms = 50;
        pubsub = loop {
            tokio::select! {
                _ = tx.closed() => return,
                _ = tokio::time::sleep(Duration::from_millis(backoff_ms)) => {}
            }
            let client = &clients[next % clients.len()];
            next = next.wrapping_add(1);
            match open(client, &channel).await {
                Ok(p) => break p,
                Err(e) => {
                    tracing::debug!(channel, error = %e, "wakeup resubscribe failed");
                    backoff_ms = (backoff_ms * 2).min(RESUBSCRIBE_BACKOFF_MAX_MS);
                }
            }
        };
        let _ = tx.try_send(());
    }
}

#[async_trait::async_trait]
impl Wakeup for RedisWakeup {
    async fn notify(&self) -> Result<()> {
        redis::cmd("PUBLISH")
            .arg(&self.channel)
            .arg("1")
            .query_async::<i64>(&mut self.conn.clone())
            .await
            .map_err(map_redis_error)?;
        Ok(())
    }

    async fn subscribe(&self) -> Result<WakeupReceiver> {
        // The first seed that answers; the next ones are where a resubscription goes.
        let mut first_error = None;
        for (i, client) in self.clients.iter().enumerate() {
            match open(client, &self.channel).await {
                Ok(pubsub) => {
                    let (tx, rx) = tokio::sync::mpsc::channel(1);
                    let clients = self.clients.clone();
                    tokio::spawn(run_subscriber(clients, i + 1, self.channel.clone(), pubsub, tx));
                    return Ok(rx);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        Err(map_redis_error(first_error.expect("at least one client")))
    }
}
