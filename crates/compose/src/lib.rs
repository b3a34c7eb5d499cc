//! # compose
//!
//! The composition root of the durable workflow kernel: the one place that turns a store
//! URL and a queue URL into the engine's [`Ports`](kernel_core::engine::Ports). Workers,
//! publishers and examples pick their adapters here, never by wiring adapter crates by hand.
//!
//! | scheme | role | cargo feature | adapters |
//! |---|---|---|---|
//! | `mongodb://host[:port][/database][?options]`, `mongodb+srv://…` | store | `mongo` | `MongoWorkflowStore`, `MongoSignalInbox`, `MongoObservationRepository` |
//! | `redis://host[:port][/db][?prefix=<p>]`, `rediss://…` | queue | `redis` | `RedisReadyQueue`, `RedisWakeup`, `RedisPermits` |
//! | `memory:` | store or queue | `memory` | testkit's in-process adapters (**demos only**: nothing survives the process, and nothing is shared between processes) |
//!
//! The database defaults to [`DEFAULT_DATABASE`] and the key prefix to [`DEFAULT_PREFIX`].
//! Every failure is a typed [`ComposeError`]: an unknown scheme, a malformed URL, a scheme
//! whose driver this build does not have, a scheme used in the wrong role, a server that
//! cannot be reached. URLs in messages have their password replaced by `***`.
//!
//! Further stores (PostgreSQL, SQLite, …) add their scheme to [`SCHEMES`], a [`Scheme`]
//! variant, a feature and a driver module next to `mongo.rs`; nothing else changes.
//!
//! # Example
//!
//! ```no_run
//! use kernel_core::engine::Engine;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // Usually from `--store`/`--queue` or `WFK_STORE`/`WFK_QUEUE`: see [`Urls::from_args`].
//! let deployment = compose::Deployment::connect(
//!     "mongodb://127.0.0.1:27017/wfk",
//!     "redis://127.0.0.1:6379/?prefix=wfk",
//!     &compose::QueueOptions::default(),
//! )
//! .await?;
//! // The five ports that hold or carry work come from the URLs; name only what you change.
//! let ports = deployment.ports().build()?;
//! let engine = Engine::builder(ports).build()?;
//! # let _ = engine;
//! # Ok(())
//! # }
//! ```

#[cfg(feature = "memory")]
mod memory;
#[cfg(feature = "mongo")]
mod mongo;
#[cfg(feature = "redis")]
mod redis;
mod url;

pub use url::{redact, Role, Scheme, SchemeInfo, Target, DEFAULT_DATABASE, DEFAULT_PREFIX, SCHEMES};

use kernel_core::engine::{MissingPort, PortsBuilder};
use kernel_core::model::DurationMs;
use kernel_core::ports::{DynInbox, DynPermits, DynQueue, DynStore, DynWakeup, LaneWeights, PermitLimits};
use std::collections::HashMap;
use std::sync::Arc;

/// Environment variable naming the store URL when `--store` is absent.
pub const STORE_ENV: &str = "WFK_STORE";
/// Environment variable naming the queue URL when `--queue` is absent.
pub const QUEUE_ENV: &str = "WFK_QUEUE";
/// Permit lease of the queue side's permits (renewed by the engine while an activity runs).
pub const PERMIT_LEASE_MS_DEFAULT: DurationMs = DurationMs::from_millis(30_000);

/// A driver cause, kept for the log.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong while composing a deployment.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ComposeError {
    /// Neither the flag nor the environment variable names a URL for `role`.
    #[error("no {role} url: pass --{role} <url> or set {env}")]
    MissingUrl {
        /// The role without a URL.
        role: Role,
        /// The environment variable that would have named it.
        env: &'static str,
    },
    /// The URL's scheme is none of [`SCHEMES`].
    #[error("{role} url `{url}`: unknown scheme `{scheme}` (known: {known})")]
    UnknownScheme {
        /// What the URL was for.
        role: Role,
        /// The URL, password redacted.
        url: String,
        /// The scheme as written.
        scheme: String,
        /// The known schemes, comma-separated.
        known: String,
    },
    /// The URL cannot be read (no scheme, no host, a bad database name or key prefix).
    #[error("{role} url `{url}` is malformed: {reason}")]
    Malformed {
        /// What the URL was for.
        role: Role,
        /// The URL, password redacted.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The scheme is known but its driver's cargo feature was not compiled into this build.
    #[error("{role} url `{url}`: the `{scheme}` driver is not compiled in (build compose with feature `{feature}`)")]
    NotCompiledIn {
        /// What the URL was for.
        role: Role,
        /// The URL, password redacted.
        url: String,
        /// The scheme as written.
        scheme: String,
        /// The cargo feature of `compose` that brings the driver.
        feature: &'static str,
    },
    /// The scheme is known but cannot serve in `role` (a Redis URL given as the store).
    #[error("{role} url `{url}`: `{scheme}` cannot serve as the {role} (it serves as: {serves})")]
    WrongRole {
        /// What the URL was for.
        role: Role,
        /// The URL, password redacted.
        url: String,
        /// The scheme as written.
        scheme: String,
        /// The roles the scheme does serve, comma-separated.
        serves: String,
    },
    /// The driver refused the URL or could not reach the server.
    #[error("{role} url `{url}`: {what}")]
    Connect {
        /// What the URL was for.
        role: Role,
        /// The URL, password redacted.
        url: String,
        /// What was being done.
        what: &'static str,
        /// The driver's error.
        #[source]
        source: Cause,
    },
    /// A required port was not given (see [`PortsBuilder::build`]).
    #[error(transparent)]
    MissingPort(#[from] MissingPort),
}

/// The store and queue URLs of a process, from `--store`/`--queue` or, when a flag is
/// absent, from [`STORE_ENV`]/[`QUEUE_ENV`].
#[derive(Clone, PartialEq, Eq)]
pub struct Urls {
    /// Where instances and the signal inbox live.
    pub store: String,
    /// Where the ready lanes, the wakeup doorbell and the permits live.
    pub queue: String,
}

impl std::fmt::Debug for Urls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Urls").field("store", &redact(&self.store)).field("queue", &redact(&self.queue)).finish()
    }
}

impl Urls {
    /// Take `--store <url>` and `--queue <url>` (also `--store=<url>`) out of `args` (the
    /// program name already removed), fall back to the environment, and return the URLs
    /// with the arguments left for the caller. `env` reads a variable (`std::env::var(..).ok()`
    /// in a program; a map in a test).
    pub fn from_args(
        args: impl IntoIterator<Item = String>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<(Urls, Vec<String>), ComposeError> {
        let (mut store, mut queue, mut rest) = (None, None, Vec::new());
        let mut it = args.into_iter();
        while let Some(arg) = it.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
                _ => (arg.clone(), None),
            };
            let slot = match flag.as_str() {
                "--store" => &mut store,
                "--queue" => &mut queue,
                _ => {
                    rest.push(arg);
                    continue;
                }
            };
            let role = if flag == "--store" { Role::Store } else { Role::Queue };
            let value = match inline.or_else(|| it.next()) {
                Some(v) => v,
                None => return Err(ComposeError::MissingUrl { role, env: role.env() }),
            };
            *slot = Some(value);
        }
        let pick = |given: Option<String>, role: Role| {
            given
                .or_else(|| env(role.env()).filter(|v| !v.is_empty()))
                .ok_or(ComposeError::MissingUrl { role, env: role.env() })
        };
        Ok((Urls { store: pick(store, Role::Store)?, queue: pick(queue, Role::Queue)? }, rest))
    }
}

/// Settings of the queue side: lane weights and permit limits.
#[derive(Debug, Clone)]
pub struct QueueOptions {
    /// Weighted round-robin of the ready lanes (K-13).
    pub lane_weights: LaneWeights,
    /// Application-configured limits per resource (K-14), used where the live configuration
    /// has none.
    pub permit_defaults: HashMap<String, PermitLimits>,
    /// Limits of resources configured nowhere; the default (all zero) leaves them unlimited.
    pub permit_fallback: PermitLimits,
    /// Lease of a granted or renewed permit.
    pub permit_lease_ms: DurationMs,
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions {
            lane_weights: LaneWeights::default(),
            permit_defaults: HashMap::new(),
            permit_fallback: PermitLimits::default(),
            permit_lease_ms: PERMIT_LEASE_MS_DEFAULT,
        }
    }
}

/// What a store URL gives: the durable ports.
#[derive(Clone)]
pub struct StoreSide {
    /// Durable instances.
    pub store: Arc<DynStore>,
    /// Durable signal inbox.
    pub inbox: Arc<DynInbox>,
    /// The scheme the URL named.
    pub scheme: Scheme,
    handle: StoreHandle,
}

#[derive(Clone)]
enum StoreHandle {
    #[cfg(feature = "mongo")]
    Mongo(::mongodb::Database),
    #[cfg(feature = "memory")]
    Memory,
}

impl std::fmt::Debug for StoreSide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSide").field("scheme", &self.scheme).finish_non_exhaustive()
    }
}

impl StoreSide {
    /// Connect to the store at `url`.
    pub async fn connect(url: &str) -> Result<StoreSide, ComposeError> {
        let target = Target::parse(Role::Store, url)?;
        match target.scheme {
            #[cfg(feature = "mongo")]
            Scheme::Mongo => mongo::store(&target).await,
            #[cfg(feature = "memory")]
            Scheme::Memory => Ok(memory::store()),
            // `Target::parse` refused every scheme whose driver is absent or cannot store.
            #[allow(unreachable_patterns)]
            _ => unreachable!("Target::parse admitted {:?} as a store", target.scheme),
        }
    }

    /// The observation repository (K-15) next to the instances: the same database on
    /// MongoDB, a fresh in-process one for `memory:`.
    pub async fn observation_repository(&self) -> Result<Arc<observer::DynRepository>, ComposeError> {
        match self.handle.clone() {
            #[cfg(feature = "mongo")]
            StoreHandle::Mongo(db) => mongo::observation_repository(&db).await,
            #[cfg(feature = "memory")]
            StoreHandle::Memory => Ok(Arc::new(observer::InMemoryObservationRepository::new())),
        }
    }

    /// Delete everything this store holds (drop the database): the end of a throw-away
    /// deployment such as a test run. Never call it on a deployment that matters.
    pub async fn destroy(self) -> Result<(), ComposeError> {
        match self.handle {
            #[cfg(feature = "mongo")]
            StoreHandle::Mongo(db) => mongo::destroy(db).await,
            #[cfg(feature = "memory")]
            StoreHandle::Memory => Ok(()),
        }
    }
}

/// What a queue URL gives: the acceleration ports, whose loss costs latency only.
#[derive(Clone)]
pub struct QueueSide {
    /// Ready lanes.
    pub queue: Arc<DynQueue>,
    /// Wakeup doorbell.
    pub wakeup: Arc<DynWakeup>,
    /// Traffic permits.
    pub permits: Arc<DynPermits>,
    /// The scheme the URL named.
    pub scheme: Scheme,
    handle: QueueHandle,
}

#[derive(Clone)]
enum QueueHandle {
    #[cfg(feature = "redis")]
    Redis(queue_redis::RedisConnection, String),
    #[cfg(feature = "memory")]
    Memory,
}

impl std::fmt::Debug for QueueSide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueSide").field("scheme", &self.scheme).finish_non_exhaustive()
    }
}

impl QueueSide {
    /// Connect to the queue at `url` with `options`.
    pub async fn connect(url: &str, options: &QueueOptions) -> Result<QueueSide, ComposeError> {
        let target = Target::parse(Role::Queue, url)?;
        let _ = options;
        match target.scheme {
            #[cfg(feature = "redis")]
            Scheme::Redis => redis::queue(&target, options).await,
            #[cfg(feature = "memory")]
            Scheme::Memory => Ok(memory::queue(options)),
            // `Target::parse` refused every scheme whose driver is absent or cannot queue.
            #[allow(unreachable_patterns)]
            _ => unreachable!("Target::parse admitted {:?} as a queue", target.scheme),
        }
    }

    /// Delete every key under the queue's prefix: the end of a throw-away deployment.
    pub async fn destroy(self) -> Result<(), ComposeError> {
        match self.handle {
            #[cfg(feature = "redis")]
            QueueHandle::Redis(conn, prefix) => redis::destroy(conn, prefix).await,
            #[cfg(feature = "memory")]
            QueueHandle::Memory => Ok(()),
        }
    }
}

/// The three ports a publisher (an API or cron process that only starts workflows) needs:
/// it writes instances, offers them to the lanes and rings the doorbell.
#[derive(Clone)]
pub struct PublisherSide {
    /// Durable instances.
    pub store: Arc<DynStore>,
    /// Ready lanes.
    pub queue: Arc<DynQueue>,
    /// Wakeup doorbell.
    pub wakeup: Arc<DynWakeup>,
}

impl std::fmt::Debug for PublisherSide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PublisherSide")
    }
}

/// A store side and a queue side: everything a worker needs but its clock, ids and side
/// channels, which [`Ports::builder`](kernel_core::engine::Ports::builder) defaults.
#[derive(Debug, Clone)]
pub struct Deployment {
    /// From the store URL.
    pub store: StoreSide,
    /// From the queue URL.
    pub queue: QueueSide,
}

impl Deployment {
    /// Connect both sides.
    pub async fn connect(store_url: &str, queue_url: &str, options: &QueueOptions) -> Result<Self, ComposeError> {
        Ok(Deployment {
            store: StoreSide::connect(store_url).await?,
            queue: QueueSide::connect(queue_url, options).await?,
        })
    }

    /// Connect to [`Urls`].
    pub async fn from_urls(urls: &Urls, options: &QueueOptions) -> Result<Self, ComposeError> {
        Self::connect(&urls.store, &urls.queue, options).await
    }

    /// A [`PortsBuilder`] with the five required ports set; add an observer, a stream sink,
    /// another clock as needed and [`build`](PortsBuilder::build).
    pub fn ports(&self) -> PortsBuilder {
        kernel_core::engine::Ports::builder()
            .store(self.store.store.clone())
            .inbox(self.store.inbox.clone())
            .queue(self.queue.queue.clone())
            .wakeup(self.queue.wakeup.clone())
            .permits(self.queue.permits.clone())
    }

    /// The publisher's three ports.
    pub fn publisher_side(&self) -> PublisherSide {
        PublisherSide {
            store: self.store.store.clone(),
            queue: self.queue.queue.clone(),
            wakeup: self.queue.wakeup.clone(),
        }
    }

    /// `store=<kind> queue=<kind>`, for a process's first log line.
    pub fn describe(&self) -> String {
        format!("store={} queue={}", self.store.scheme.kind(), self.queue.scheme.kind())
    }

    /// [`StoreSide::destroy`] and [`QueueSide::destroy`].
    pub async fn destroy(self) -> Result<(), ComposeError> {
        self.store.destroy().await?;
        self.queue.destroy().await
    }
}
