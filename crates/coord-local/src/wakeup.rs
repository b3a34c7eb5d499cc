use crate::db::{Db, Kind};
use kernel_core::ports::{Wakeup, WakeupReceiver};
use kernel_core::{Error, Result};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Most live subscriptions of one [`LocalCoord`](crate::LocalCoord) (a worker needs one).
pub const SUBSCRIBERS_MAX: usize = 1_024;

/// Bump the counter; wraps long before `i64::MAX` (subscribers compare for inequality).
pub(crate) const BUMP: &str =
    "UPDATE coord_wakeup SET seq = CASE WHEN seq >= 4611686018427387904 THEN 0 ELSE seq + 1 END \
     WHERE id = 0 RETURNING seq";
pub(crate) const READ: &str = "SELECT seq FROM coord_wakeup WHERE id = 0";

#[derive(Debug, Default)]
struct Subs {
    senders: Vec<tokio::sync::mpsc::Sender<()>>,
    /// Whether the polling task runs.
    poller: bool,
}

#[derive(Debug)]
pub(crate) struct Shared {
    db: Arc<Db>,
    /// Poll interval of the file's counter; `None` for an in-memory database, which no
    /// other process can ring.
    poll: Option<Duration>,
    subs: Mutex<Subs>,
    /// The counter as this process last saw it (the poller's baseline).
    seen: AtomicI64,
}

impl Shared {
    pub(crate) fn new(db: Arc<Db>, poll: Option<Duration>) -> Shared {
        Shared { db, poll, subs: Mutex::default(), seen: AtomicI64::new(0) }
    }

    fn subs(&self) -> std::sync::MutexGuard<'_, Subs> {
        // The guarded data is a list of senders: always consistent.
        self.subs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ring_local(&self) {
        let mut subs = self.subs();
        subs.senders.retain(|tx| !tx.is_closed());
        for tx in &subs.senders {
            // Full channel: a ring is already pending, which is all a doorbell says.
            let _ = tx.try_send(());
        }
    }
}

/// The wakeup doorbell (K-13) for processes sharing the SQLite file.
///
/// - **In this process** (the same [`LocalCoord`](crate::LocalCoord), any clone): a ring
///   reaches every subscriber at once, through an mpsc channel of capacity 1 per
///   subscriber (bursts coalesce into one pending message).
/// - **Across processes**: [`notify`](Wakeup::notify) also bumps the counter row
///   `coord_wakeup.seq` (one autocommit `UPDATE`); one task per [`LocalCoord`] that has
///   subscribers reads it every poll interval ([`LocalConfig::wakeup_poll_ms`], default
///   25 ms) and rings its subscribers when it changed. A ring from another process
///   therefore arrives within one poll interval plus one read (≈ 25 ms by default), and
///   every process costs one single-row read per interval while it has subscribers.
///
/// The polling task starts with the first subscription and ends at its next tick after
/// the last receiver is dropped: no task outlives its subscribers. A ring is best effort
/// (a failed bump is returned as an error after the local subscribers were rung); the
/// engine also polls the queue.
///
/// [`LocalCoord`]: crate::LocalCoord
/// [`LocalConfig::wakeup_poll_ms`]: crate::LocalConfig::wakeup_poll_ms
#[derive(Debug, Clone)]
pub struct LocalWakeup {
    pub(crate) shared: Arc<Shared>,
}

impl LocalWakeup {
    /// Live subscriptions of this process's [`LocalCoord`](crate::LocalCoord).
    pub fn subscribers(&self) -> usize {
        let mut subs = self.shared.subs();
        subs.senders.retain(|tx| !tx.is_closed());
        subs.senders.len()
    }

    /// Whether the task polling the file runs (it ends after the last receiver is dropped).
    pub fn polling(&self) -> bool {
        self.shared.subs().poller
    }

    async fn read_seq(&self) -> Result<i64> {
        self.shared
            .db
            .call("wakeup.read", Kind::Read, |c, ctx| {
                c.prepare_cached(READ)
                    .and_then(|mut st| st.query_row([], |r| r.get::<_, i64>(0)))
                    .map_err(|e| crate::db::map(ctx.label, "wakeup.read", e))
            })
            .await
    }
}

/// The polling task of one [`Shared`]: ends when it finds no live subscriber.
async fn poll_file(shared: Arc<Shared>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        {
            let mut subs = shared.subs();
            subs.senders.retain(|tx| !tx.is_closed());
            if subs.senders.is_empty() {
                subs.poller = false;
                return;
            }
        }
        let w = LocalWakeup { shared: Arc::clone(&shared) };
        match w.read_seq().await {
            Ok(seq) => {
                if shared.seen.swap(seq, Ordering::SeqCst) != seq {
                    shared.ring_local();
                }
            }
            // Rings that happen meanwhile move the counter, so the next good read finds
            // them: nothing is lost by an error, only delayed.
            Err(e) => tracing::debug!(error = %e, "wakeup poll failed"),
        }
    }
}

#[async_trait::async_trait]
impl Wakeup for LocalWakeup {
    async fn notify(&self) -> Result<()> {
        let bumped = if self.shared.poll.is_some() {
            let r = self
                .shared
                .db
                .call("wakeup.notify", Kind::Write, |c, ctx| {
                    c.prepare_cached(BUMP)
                        .and_then(|mut st| st.query_row([], |r| r.get::<_, i64>(0)))
                        .map_err(|e| crate::db::map(ctx.label, "wakeup.notify", e))
                })
                .await;
            if let Ok(seq) = r {
                // Our own ring need not come back through the poller; a ring from another
                // process in between makes this miss, and the poller rings as usual.
                let _ = self.shared.seen.compare_exchange(seq - 1, seq, Ordering::SeqCst, Ordering::SeqCst);
            }
            r.map(|_| ())
        } else {
            Ok(())
        };
        // After the bump: a subscriber registered before this ring gets it.
        self.shared.ring_local();
        bumped
    }

    async fn subscribe(&self) -> Result<WakeupReceiver> {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let Some(every) = self.shared.poll else {
            let mut subs = self.shared.subs();
            subs.senders.retain(|tx| !tx.is_closed());
            check_room(subs.senders.len())?;
            subs.senders.push(tx);
            return Ok(rx);
        };
        // The baseline is read before the subscription counts as established: every bump
        // after it moves the counter past what the poller has seen.
        let running = self.shared.subs().poller;
        let baseline = if running { None } else { Some(self.read_seq().await?) };
        let mut subs = self.shared.subs();
        subs.senders.retain(|tx| !tx.is_closed());
        check_room(subs.senders.len())?;
        subs.senders.push(tx);
        if !subs.poller {
            let seq = match baseline {
                Some(seq) => seq,
                // The poller ended between the check and now; its baseline is at most one
                // tick old, and a stale baseline costs one extra ring, never a lost one.
                None => self.shared.seen.load(Ordering::SeqCst),
            };
            self.shared.seen.store(seq, Ordering::SeqCst);
            subs.poller = true;
            tokio::spawn(poll_file(Arc::clone(&self.shared), every));
        }
        Ok(rx)
    }
}

fn check_room(live: usize) -> Result<()> {
    if live >= SUBSCRIBERS_MAX {
        return Err(Error::LimitExceeded { what: "wakeup subscribers".into(), max: SUBSCRIBERS_MAX as u64 });
    }
    Ok(())
}
