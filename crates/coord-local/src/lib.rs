//! # coord-local
//!
//! Coordination of the durable workflow kernel on **one machine, without Redis**: the ready
//! lanes ([`LocalQueue`]: [`ReadyQueue`](kernel_core::ports::ReadyQueue)), the wakeup
//! doorbell ([`LocalWakeup`]: [`Wakeup`](kernel_core::ports::Wakeup)), the traffic permits
//! ([`LocalPermits`]: [`Permits`](kernel_core::ports::Permits)) and the dispatch candidate
//! index ([`LocalCandidates`]:
//! [`DispatchCandidates`](kernel_core::ports::DispatchCandidates)) live in one SQLite file,
//! so several worker processes on the machine share them. Semantics are those of the Redis
//! adapters (`queue-redis`, `permit-redis`); the same conformance suites run on both.
//!
//! ```
//! use kernel_core::domain::{Instant, Priority};
//! use kernel_core::ports::{ReadyQueue, Wakeup};
//! use coord_local::{LocalConfig, LocalCoord};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> kernel_core::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let path = dir.path().join("wf.db");
//! // Every worker process opens the same file (created and migrated on first open).
//! let coord = LocalCoord::open(&path, LocalConfig::default()).await?;
//! let (queue, wakeup) = (coord.queue(), coord.wakeup());
//! let mut rung = wakeup.subscribe().await?;
//! queue.enqueue(&"wf-1".into(), Priority::P1, Instant::from_millis(1_000)).await?;
//! wakeup.notify().await?;
//! rung.recv().await;
//! assert_eq!(queue.pop_due(Instant::from_millis(1_000), 8).await?, vec!["wf-1"]);
//! # Ok(()) }
//! ```
//!
//! ## How processes share it
//!
//! Every call that writes is one `BEGIN IMMEDIATE` transaction — a batch pop with the lane
//! rotation, a bulk enqueue, a permit's check-and-take, a candidate pop, and the single
//! upserts (`enqueue`, `add`, one statement each): it takes the file's write lock first,
//! so concurrent callers, threads or processes, are serialized by SQLite's lock and none
//! decides on a stale snapshot. A caller that finds the lock taken waits up to
//! [`LocalConfig::busy_timeout_ms`]. The file is in WAL mode, so reads never block the
//! writer.
//!
//! Wakeups cross processes through a counter row that `notify` bumps and that each
//! process with subscribers reads every [`LocalConfig::wakeup_poll_ms`] (default 25 ms):
//! a ring from another process arrives within about one poll interval; in the same
//! process it arrives at once. See [`LocalWakeup`].
//!
//! ## Calls, deadlines and errors
//!
//! rusqlite is blocking, so every call runs on tokio's blocking pool (`spawn_blocking`) on
//! the one connection of its [`LocalCoord`], never on the async runtime's threads. Every
//! call has a deadline, [`LocalConfig::call_timeout_ms`]; past it the caller is answered at
//! once: [`Error::Unavailable`] when the call had not started (it then never runs) or was a
//! read, and [`Error::Uncertain`] when a started write may have committed — its statement
//! is interrupted, and a write still waiting for the lock or not yet committed rolls back
//! instead of committing later. SQLite failures that certainly committed nothing (locked
//! past the busy timeout, read-only file, full disk) are `Unavailable` with the driver's
//! error as the cause, so the engine falls back as it does when Redis is down
//! (store-fallback claims, deferred permits).
//!
//! ## Time
//!
//! Lane due-ness compares scores with the `now` the kernel passes (K-13). Permits read the
//! [`Clock`] given to [`LocalCoord::permits`] inside their transaction, where the Redis
//! adapter reads Redis `TIME`: with the system clock, every process on the machine reads
//! the same wall clock (see [`LocalPermits`]).
//!
//! ## Durability
//!
//! Like Redis, these tables only recommend (K-1.1): the store's claim grants execution and
//! the rebuild scan restores the lanes. So the default is `synchronous=NORMAL`
//! ([`Synchronous::Normal`]): in WAL mode a commit survives a killed process; the last
//! commits may be lost on power loss, which costs latency only. [`Synchronous::Full`] is
//! there for those who want it.
//!
//! ## Sharing a file with a store
//!
//! Every table is named `coord_…` and the schema version is the `schema_version` row of
//! `coord_meta`, not SQLite's `user_version`, so a store may keep its own tables and
//! versioning in the same file. A file whose coordination tables are newer than this build
//! knows, or a file that is not a SQLite database, is refused on open with an
//! [`Error::InvalidInput`] naming the file (and the
//! versions), and nothing is changed. Two processes opening a new file at once: one
//! migrates, the other waits for its lock and finds the work done.
//!
//! ## In one process
//!
//! [`LocalCoord::in_memory`] runs the same code on an in-memory SQLite database: one
//! implementation of the lane rotation, promote-only enqueue and permit decisions to keep
//! right, checked by the same suites, instead of a second one in plain Rust structures that
//! could drift (testkit's fakes are that, for tests). Its wakeups are in-process only (no
//! polling task); calls still go through the blocking pool.
//!
//! ## The SQLite binding
//!
//! [`rusqlite`] with its `bundled` feature: SQLite is compiled into the binary from the
//! amalgamation, so nothing needs to be installed and every machine runs the same SQLite
//! version (WAL, `RETURNING` and `ON CONFLICT … DO UPDATE` need ≥ 3.35, which a system
//! library may not be). rusqlite is the maintained, widely used synchronous binding; the
//! async ones (sqlx) would add a query-macro layer and a pool the single connection does
//! not need, and would still run SQLite on a blocking thread underneath.
//!
//! ## Limits
//!
//! A batch pop ([`POP_DUE_MAX`](kernel_core::ports::POP_DUE_MAX)) and a bulk enqueue
//! ([`ENQUEUE_MANY_MAX`](kernel_core::ports::ENQUEUE_MANY_MAX)) as every queue adapter;
//! candidate pops ([`DISPATCH_BATCH_MAX`]); wakeup subscriptions ([`SUBSCRIBERS_MAX`]);
//! permit leases ([`LEASE_MS_MAX`]); one set of lanes, permits and candidates per file.

mod candidates;
mod db;
mod permits;
mod queue;
mod wakeup;

pub use candidates::{LocalCandidates, DISPATCH_BATCH_MAX};
pub use db::{Synchronous, SCHEMA_VERSION};
pub use permits::{LocalPermits, LocalPermitsConfig, LEASE_MS_DEFAULT, LEASE_MS_MAX};
pub use queue::LocalQueue;
pub use wakeup::{LocalWakeup, SUBSCRIBERS_MAX};

pub use kernel_core::ports::{LaneWeights, PermitLimits};

use kernel_core::domain::DurationMs;
use kernel_core::ports::Clock;
use kernel_core::{validate, Error, Result};
use std::path::Path;
use std::sync::Arc;

/// Longest busy timeout, call deadline or poll interval.
pub const CONFIG_MS_MAX: DurationMs = DurationMs::from_millis(600_000);

/// Settings of a [`LocalCoord`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalConfig {
    /// How long a call waits for another connection's write lock before it fails as
    /// `Unavailable` (SQLite's `busy_timeout`). Default 5 s; below
    /// [`call_timeout_ms`](Self::call_timeout_ms).
    pub busy_timeout_ms: DurationMs,
    /// Deadline of every call, from the caller's side. Default 10 s.
    pub call_timeout_ms: DurationMs,
    /// How often a process with subscribers reads the wakeup counter: the latency of a
    /// ring from another process. Default 25 ms.
    pub wakeup_poll_ms: DurationMs,
    /// Commit durability. Default [`Synchronous::Normal`].
    pub synchronous: Synchronous,
    /// The lanes' weighted round robin. Default 8:6:4:2, burst 8.
    pub weights: LaneWeights,
}

impl Default for LocalConfig {
    fn default() -> Self {
        LocalConfig {
            busy_timeout_ms: DurationMs::from_millis(5_000),
            call_timeout_ms: DurationMs::from_millis(10_000),
            wakeup_poll_ms: DurationMs::from_millis(25),
            synchronous: Synchronous::Normal,
            weights: LaneWeights::default(),
        }
    }
}

impl LocalConfig {
    /// Check every field.
    pub fn validate(&self) -> Result<()> {
        let LocalConfig { busy_timeout_ms, call_timeout_ms, wakeup_poll_ms, synchronous: _, weights } = self;
        for (field, ms) in [
            ("busy_timeout_ms", busy_timeout_ms),
            ("call_timeout_ms", call_timeout_ms),
            ("wakeup_poll_ms", wakeup_poll_ms),
        ] {
            validate::positive_ms(field, *ms)?;
            if *ms > CONFIG_MS_MAX {
                return Err(Error::invalid(field, format_args!("{ms} exceeds {CONFIG_MS_MAX}")));
            }
        }
        if busy_timeout_ms >= call_timeout_ms {
            return Err(Error::invalid(
                "busy_timeout_ms",
                format_args!("{busy_timeout_ms} must be below call_timeout_ms ({call_timeout_ms})"),
            ));
        }
        weights.validate()
    }
}

/// One SQLite file (or in-memory database) holding the coordination tables, and the
/// handles on it. Cheap to clone; clones and handles share one connection and one set of
/// wakeup subscribers.
#[derive(Debug, Clone)]
pub struct LocalCoord {
    db: Arc<db::Db>,
    config: LocalConfig,
    wake: Arc<wakeup::Shared>,
}

impl LocalCoord {
    /// Open `path` (created if missing), switch it to WAL, and create or migrate the
    /// coordination tables.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a bad config, a file that is not a SQLite database or
    /// whose coordination tables are from a newer version (nothing changed);
    /// [`Error::Unavailable`] when the file cannot be opened or stays locked past the busy
    /// timeout.
    pub async fn open(path: impl AsRef<Path>, config: LocalConfig) -> Result<LocalCoord> {
        config.validate()?;
        let path = path.as_ref().to_path_buf();
        let db = tokio::task::spawn_blocking(move || {
            db::Db::open(Some(&path), config.busy_timeout_ms, config.call_timeout_ms, config.synchronous)
        })
        .await
        .map_err(|e| Error::unavailable(format!("sqlite coordination: open failed: {e}")))??;
        Ok(Self::wrap(db, config, true))
    }

    /// The same tables in a private in-memory database: coordination for one process.
    pub async fn in_memory(config: LocalConfig) -> Result<LocalCoord> {
        config.validate()?;
        let db = tokio::task::spawn_blocking(move || {
            db::Db::open(None, config.busy_timeout_ms, config.call_timeout_ms, config.synchronous)
        })
        .await
        .map_err(|e| Error::unavailable(format!("sqlite coordination: open failed: {e}")))??;
        Ok(Self::wrap(db, config, false))
    }

    fn wrap(db: db::Db, config: LocalConfig, poll: bool) -> LocalCoord {
        let db = Arc::new(db);
        let every = poll.then(|| config.wakeup_poll_ms.to_std());
        let wake = Arc::new(wakeup::Shared::new(Arc::clone(&db), every));
        LocalCoord { db, config, wake }
    }

    /// The file, `None` for an in-memory database.
    pub fn path(&self) -> Option<&Path> {
        self.db.path()
    }

    /// Settings in use.
    pub fn config(&self) -> &LocalConfig {
        &self.config
    }

    /// The ready lanes, with [`LocalConfig::weights`].
    pub fn queue(&self) -> LocalQueue {
        LocalQueue { db: Arc::clone(&self.db), weights: self.config.weights }
    }

    /// The wakeup doorbell (all handles of this value share its subscribers).
    pub fn wakeup(&self) -> LocalWakeup {
        LocalWakeup { shared: Arc::clone(&self.wake) }
    }

    /// The permits, timed by `clock` (the system clock in production: the same wall clock
    /// for every process on the machine).
    pub fn permits(&self, clock: Arc<dyn Clock>, config: LocalPermitsConfig) -> Result<LocalPermits> {
        config.validate()?;
        Ok(LocalPermits { db: Arc::clone(&self.db), clock, config: Arc::new(config) })
    }

    /// The dispatch candidate index.
    pub fn dispatch_candidates(&self) -> LocalCandidates {
        LocalCandidates { db: Arc::clone(&self.db) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Processes of different versions share the tables during a rolling upgrade, so the
    /// schema and every statement of the ports are a protocol: this snapshot makes a change
    /// deliberate. Update it (`UPDATE_SNAPSHOTS=1 cargo test -p coord-local --lib`) only
    /// together with docs/coord-local.md and, for a schema change, a new migration.
    #[test]
    fn sql_protocol_is_pinned() {
        let statements: &[(&str, &str)] = &[
            ("migration 1", db::MIGRATIONS[0]),
            ("migration 2", db::MIGRATIONS[1]),
            ("queue.enqueue (and each entry of enqueue_many)", queue::ENQUEUE),
            ("queue.pop_due: due members of one lane", queue::DUE),
            ("queue.pop_due: take one", queue::TAKE),
            ("queue.pop_due: rotation", queue::ROTATION),
            ("queue.pop_due: save rotation", queue::SAVE_ROTATION),
            ("queue.stats", queue::STATS),
            ("queue.pop_due: count pops", queue::COUNT_POPS),
            ("queue.stats: pops", queue::POPS),
            ("wakeup.notify", wakeup::BUMP),
            ("wakeup poll", wakeup::READ),
            ("permits: purge holders", permits::PURGE_HOLDERS),
            ("permits: purge starts", permits::PURGE_STARTS),
            ("permits: renew", permits::RENEW),
            ("permits: insert holder", permits::INSERT_HOLDER),
            ("permits: live limits", permits::LIVE_LIMITS),
            ("permits: holders", permits::HOLDERS),
            ("permits: starts", permits::STARTS),
            ("permits: insert start", permits::INSERT_START),
            ("permits.release", permits::RELEASE),
            ("permits.set_limits", permits::SET_LIMITS),
            ("permits.usage: holders", permits::USAGE_HOLDERS),
            ("permits.usage: starts", permits::USAGE_STARTS),
            ("permits.resources", permits::RESOURCES),
            ("dispatch.add", candidates::ADD),
            ("dispatch.pop_due: due", candidates::DUE),
            ("dispatch.pop_due: take one", candidates::TAKE),
        ];
        let mut text = String::new();
        for (name, sql) in statements {
            text.push_str(&format!("## {name}\n{}\n\n", sql.trim_end()));
        }
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("snapshots/protocol.sql");
        if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &text).unwrap();
        }
        let pinned = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(pinned == text, "the SQL protocol changed; see this test's docs. Now:\n{text}");
    }

    #[test]
    fn config_limits() {
        assert!(LocalConfig::default().validate().is_ok());
        let ms = DurationMs::from_millis;
        let bad = [
            LocalConfig { busy_timeout_ms: ms(0), ..LocalConfig::default() },
            LocalConfig { wakeup_poll_ms: ms(0), ..LocalConfig::default() },
            LocalConfig { call_timeout_ms: CONFIG_MS_MAX + ms(1), ..LocalConfig::default() },
            LocalConfig { busy_timeout_ms: ms(10_000), call_timeout_ms: ms(10_000), ..LocalConfig::default() },
            LocalConfig { weights: LaneWeights { weights: [8, 6, 4, 0], burst: 8 }, ..LocalConfig::default() },
        ];
        for c in bad {
            assert!(matches!(c.validate(), Err(Error::InvalidInput { .. })), "{c:?}");
        }
    }
}
