//! # compose
//!
//! The composition root of the durable workflow kernel: the one place that turns a store
//! URL and a queue URL into the engine's [`Ports`](kernel_core::engine::Ports). Workers,
//! publishers and examples pick their adapters here, never by wiring adapter crates by hand.
//!
//! | scheme | role | cargo feature | adapters |
//! |---|---|---|---|
//! | `mongodb://host[:port][/database][?options]`, `mongodb+srv://…` | store | `mongo` | `MongoWorkflowStore`, `MongoSignalInbox`, `MongoDeadLetters`, `MongoResultCache`, `MongoObservationRepository` |
//! | `redis://host[:port][/db][?prefix=<p>]`, `rediss://…`; a Redis Cluster: `redis+cluster://host:port[,host:port…][/][?prefix=<p>]` or `redis://host:port,host:port[,…]` | queue | `redis` | `RedisReadyQueue`, `RedisWakeup`, `RedisPermits` (on a cluster too: see `queue_redis`'s key layout) |
//! | `postgres://[user@]host[:port][/database][?schema=<s>&options]`, `postgresql://…` | store | `postgres` | `PostgresWorkflowStore`, `PostgresSignalInbox`, `PostgresDeadLetters`, `PostgresResultCache`, `PostgresOutbox`, `PostgresObservationRepository` (migrated on connect) |
//! | `sqlite:<path>` | store or queue | `sqlite` | `SqliteWorkflowStore`, `SqliteSignalInbox`, `SqliteDeadLetters`, `SqliteResultCache`, `SqliteOutbox`, `SqliteObservationRepository` (migrated on open); as a queue, coord-local in that file |
//! | `local` | queue | `local` | coord-local: in the `sqlite:` store's file, else in this process |
//! | `memory:` | store or queue | `memory` | kernel-memory's in-process adapters (**demos only**: nothing survives the process, and nothing is shared between processes) |
//!
//! The database defaults to [`DEFAULT_DATABASE`], the PostgreSQL schema to [`DEFAULT_SCHEMA`]
//! and the key prefix to [`DEFAULT_PREFIX`];
//! [`StoreSide::connect_scratch`] and [`QueueSide::connect_scratch`] use a fresh one instead,
//! for a throw-away run that `destroy` deletes.
//!
//! The store side also carries the store's [`dead_letters`](StoreSide::dead_letters) (K-17.2)
//! and [`result_cache`](StoreSide::result_cache) (K-17.7) on the same database, schema or
//! file, and [`Deployment::ports`] sets both, so steps that dead-letter and read-only model
//! calls work on a worker built from URLs; a deployment that wants another cache (Redis's)
//! replaces it with [`PortsBuilder::result_cache`].
//!
//! What the five ports do not cover comes from the same sides, so a demo or a binary never
//! wires an adapter crate itself: [`StoreSide::dispatch_outbox`] (K-11),
//! [`QueueSide::dispatch_candidates`] (K-12), `QueueSide::stream_sink` (K-16, `redis`), and
//! the concrete handles `StoreSide::mongo_database`/`mongo_store` (`mongo`),
//! `StoreSide::postgres_pool`/`postgres_config`/`postgres_store` (`postgres`) and
//! `QueueSide::redis_connection` (`redis`). Asked of a scheme that has none, they return
//! [`ComposeError::NotOffered`]. A process that needs one side reads its URL with
//! [`url_from_args`].
//! Every failure is a typed [`ComposeError`]: an unknown scheme, a malformed URL, a scheme
//! whose driver this build does not have, a scheme used in the wrong role, a server that
//! cannot be reached. URLs in messages have their password replaced by `***`.
//!
//! Further stores add their scheme to [`SCHEMES`], a [`Scheme`] variant, a feature and a
//! driver module next to `mongo.rs` that opens every [`StoreSide`] port (dead letters and
//! result cache included); nothing else changes.
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
//! // The five ports that hold or carry work, the dead letters and the result cache come
//! // from the URLs; name only what you change.
//! let ports = deployment.ports().build()?;
//! let engine = Engine::builder(ports).build()?;
//! # let _ = engine;
//! # Ok(())
//! # }
//! ```

#[cfg(any(feature = "sqlite", feature = "local"))]
mod local;
#[cfg(feature = "memory")]
mod memory;
#[cfg(feature = "mongo")]
mod mongo;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "sqlite")]
mod sqlite;
mod url;

pub use url::{redact, Role, Scheme, SchemeInfo, Target, DEFAULT_DATABASE, DEFAULT_PREFIX, DEFAULT_SCHEMA, SCHEMES};

use kernel_core::domain::DurationMs;
use kernel_core::engine::{MissingPort, PortsBuilder};
#[cfg(feature = "redis")]
use kernel_core::ports::DynClock;
use kernel_core::ports::{
    DynCandidates, DynDeadLetters, DynInbox, DynOutbox, DynPermits, DynQueue, DynResultCache, DynStore, DynTaskInbox,
    DynWakeup, LaneWeights, PermitLimits,
};
use std::collections::HashMap;
use std::sync::Arc;

/// Environment variable naming the store URL when `--store` is absent.
pub const STORE_ENV: &str = "WFK_STORE";
/// Environment variable naming the queue URL when `--queue` is absent.
pub const QUEUE_ENV: &str = "WFK_QUEUE";
/// Permit lease of the queue side's permits (renewed by the engine while an activity runs).
pub const PERMIT_LEASE_MS_DEFAULT: DurationMs = DurationMs::from_millis(30_000);

/// Longest tag of a scratch namespace (the namespace adds `_` and up to 32 hex digits, and
/// MongoDB database names and PostgreSQL schema names stay under 64 bytes).
pub const SCRATCH_TAG_BYTES_MAX: usize = 24;

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
    /// The deployment's scheme does not offer what was asked for (a MongoDB database handle
    /// from a `memory:` store, a Redis connection from a `memory:` queue).
    #[error("a `{scheme}` {role} offers no {what}")]
    NotOffered {
        /// The side that was asked.
        role: Role,
        /// Its scheme's kind (`mongo`, `redis`, `memory`).
        scheme: &'static str,
        /// What was asked for.
        what: &'static str,
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
        Self::from_args_or(args, env, &[], &[])
    }

    /// [`from_args`](Self::from_args), and when neither the flag nor [`STORE_ENV`]/[`QUEUE_ENV`]
    /// names a URL, the first of `store_fallbacks`/`queue_fallbacks` (environment variable
    /// names such as `MONGODB_URI`, `REDIS_URL`) that is set and not empty.
    pub fn from_args_or(
        args: impl IntoIterator<Item = String>,
        env: impl Fn(&str) -> Option<String>,
        store_fallbacks: &[&str],
        queue_fallbacks: &[&str],
    ) -> Result<(Urls, Vec<String>), ComposeError> {
        let (store, rest) = url_from_args(Role::Store, args, &env, store_fallbacks)?;
        let (queue, rest) = url_from_args(Role::Queue, rest, &env, queue_fallbacks)?;
        let missing = |role: Role| ComposeError::MissingUrl { role, env: role.env() };
        Ok((Urls { store: store.ok_or(missing(Role::Store))?, queue: queue.ok_or(missing(Role::Queue))? }, rest))
    }
}

/// One role's URL for a process that needs only one side (or decides later whether it needs
/// it): take `--store <url>` (or `--queue`, by `role`; also `--store=<url>`) out of `args`,
/// else read [`Role::env`], else the first of `fallbacks` that is set and not empty. `None`
/// when nothing names one; an error only for a flag without its value. The other arguments
/// are returned in order.
pub fn url_from_args(
    role: Role,
    args: impl IntoIterator<Item = String>,
    env: impl Fn(&str) -> Option<String>,
    fallbacks: &[&str],
) -> Result<(Option<String>, Vec<String>), ComposeError> {
    let wanted = format!("--{role}");
    let (mut given, mut rest) = (None, Vec::new());
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        if flag != wanted {
            rest.push(arg);
            continue;
        }
        match inline.or_else(|| it.next()) {
            Some(v) => given = Some(v),
            None => return Err(ComposeError::MissingUrl { role, env: role.env() }),
        }
    }
    let read = |k: &str| env(k).filter(|v| !v.is_empty());
    let url = given.or_else(|| read(role.env())).or_else(|| fallbacks.iter().find_map(|k| read(k)));
    Ok((url, rest))
}

/// A fresh namespace `<tag>_<hex>` (database name or key prefix) for a throw-away run; the
/// suffix is the wall clock in nanoseconds mixed with the process id, so two runs started
/// at once do not share it.
fn scratch_namespace(tag: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{tag}_{:x}", nanos ^ (u128::from(std::process::id()) << 96))
}

fn scratch_target(role: Role, url: &str, tag: &str) -> Result<Target, ComposeError> {
    let mut target = Target::parse(role, url)?;
    let valid = !tag.is_empty()
        && tag.len() <= SCRATCH_TAG_BYTES_MAX
        && tag.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !valid {
        return Err(ComposeError::Malformed {
            role,
            url: redact(url),
            reason: format!("bad scratch tag `{tag}`: 1..={SCRATCH_TAG_BYTES_MAX} ASCII letters, digits, `_`, `-`"),
        });
    }
    if target.scheme == Scheme::Postgres {
        // A schema name is `[a-z0-9_]` not starting with a digit.
        let tag = tag.to_ascii_lowercase().replace('-', "_");
        let tag = if tag.starts_with(|c: char| c.is_ascii_digit()) { format!("_{tag}") } else { tag };
        target.namespace = scratch_namespace(&tag);
    } else if target.scheme == Scheme::Sqlite {
        // A fresh file beside the one named: `<dir>/<tag>_<hex>.db`.
        let dir =
            std::path::Path::new(&target.namespace).parent().map(std::path::Path::to_path_buf).unwrap_or_default();
        let file = dir.join(format!("{}.db", scratch_namespace(tag)));
        let query = target.url.split_once('?').map(|(_, q)| format!("?{q}")).unwrap_or_default();
        target.namespace = file.display().to_string();
        target.url = format!("sqlite:{}{query}", target.namespace);
    } else if !matches!(target.scheme, Scheme::Memory | Scheme::Local) {
        target.namespace = scratch_namespace(tag);
    }
    Ok(target)
}

fn not_offered(role: Role, scheme: Scheme, what: &'static str) -> ComposeError {
    ComposeError::NotOffered { role, scheme: scheme.kind(), what }
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

/// What a store URL gives: the durable ports, all on one database (MongoDB), schema
/// (PostgreSQL) or file (SQLite).
#[derive(Clone)]
pub struct StoreSide {
    /// Durable instances.
    pub store: Arc<DynStore>,
    /// Durable signal inbox.
    pub inbox: Arc<DynInbox>,
    /// Dead-letter records (K-17.2) next to the instances: the same database, schema or
    /// file; an in-process one for `memory:`.
    pub dead_letters: Arc<DynDeadLetters>,
    /// Human tasks (K-17.5) next to the instances: the same database, schema or file; an
    /// in-process one for `memory:`. A `TaskDesk` reads and decides them.
    pub task_inbox: Arc<DynTaskInbox>,
    /// Result cache of read-only model calls (K-17.7) next to the instances: the same
    /// database, schema or file; an in-process one for `memory:`.
    pub result_cache: Arc<DynResultCache>,
    /// The scheme the URL named.
    pub scheme: Scheme,
    handle: StoreHandle,
}

#[derive(Clone)]
enum StoreHandle {
    #[cfg(feature = "mongo")]
    Mongo(::mongodb::Database, store_mongo::MongoWorkflowStore),
    #[cfg(feature = "postgres")]
    Postgres(store_postgres::Pool, store_postgres::PostgresConfig, store_postgres::PostgresWorkflowStore),
    #[cfg(feature = "sqlite")]
    Sqlite(store_sqlite::SqliteDb, std::path::PathBuf),
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
        Self::connect_target(Target::parse(Role::Store, url)?).await
    }

    /// Connect to the server `url` names, but in a fresh database `<tag>_<hex>` instead of
    /// the URL's: a throw-away run (a demo, a benchmark) that [`destroy`](Self::destroy)
    /// deletes at its end without touching anything else on the server. `memory:` is fresh
    /// anyway. `tag` is 1..=[`SCRATCH_TAG_BYTES_MAX`] ASCII letters, digits, `_`, `-`.
    pub async fn connect_scratch(url: &str, tag: &str) -> Result<StoreSide, ComposeError> {
        Self::connect_target(scratch_target(Role::Store, url, tag)?).await
    }

    async fn connect_target(target: Target) -> Result<StoreSide, ComposeError> {
        match target.scheme {
            #[cfg(feature = "mongo")]
            Scheme::Mongo => mongo::store(&target).await,
            #[cfg(feature = "postgres")]
            Scheme::Postgres => postgres::store(&target).await,
            #[cfg(feature = "sqlite")]
            Scheme::Sqlite => sqlite::store(&target).await,
            #[cfg(feature = "memory")]
            Scheme::Memory => Ok(memory::store()),
            // `Target::parse` refused every scheme whose driver is absent or cannot store.
            #[allow(unreachable_patterns)]
            _ => unreachable!("Target::parse admitted {:?} as a store", target.scheme),
        }
    }

    /// The observation repository (K-15) next to the instances: the same database on
    /// MongoDB, a fresh in-process one for `memory:`. PostgreSQL offers none yet
    /// ([`ComposeError::NotOffered`]).
    pub async fn observation_repository(&self) -> Result<Arc<observer::DynRepository>, ComposeError> {
        match self.handle.clone() {
            #[cfg(feature = "mongo")]
            StoreHandle::Mongo(db, _) => mongo::observation_repository(&db).await,
            #[cfg(feature = "postgres")]
            StoreHandle::Postgres(pool, config, _) => postgres::observation_repository(&pool, &config),
            #[cfg(feature = "sqlite")]
            StoreHandle::Sqlite(db, _) => Ok(sqlite::observation_repository(&db)),
            #[cfg(feature = "memory")]
            StoreHandle::Memory => Ok(Arc::new(observer::InMemoryObservationRepository::new())),
        }
    }

    /// The store's kind and schema version, for an operator (`wfk migrate`): connecting
    /// to a SQL store applied its migrations, so this is the version it is at now.
    pub fn schema_description(&self) -> String {
        match &self.handle {
            #[cfg(feature = "mongo")]
            StoreHandle::Mongo(db, _) => {
                format!("mongodb database `{}`: no migrations (indexes ensured on connect)", db.name())
            }
            #[cfg(feature = "postgres")]
            StoreHandle::Postgres(_, config, _) => format!(
                "postgres schema `{}` at migration {}",
                config.schema,
                store_postgres::MIGRATIONS.iter().map(|(v, _, _)| *v).max().unwrap_or(0)
            ),
            #[cfg(feature = "sqlite")]
            StoreHandle::Sqlite(_, path) => {
                format!("sqlite file `{}` at schema version {}", path.display(), store_sqlite::SCHEMA_VERSION)
            }
            #[cfg(feature = "memory")]
            StoreHandle::Memory => "memory: nothing to migrate".to_string(),
            // Only in a build without store drivers, where no `StoreSide` exists.
            #[allow(unreachable_patterns)]
            _ => format!("{}: no store driver in this build", self.scheme.kind()),
        }
    }

    /// Delete everything this store holds (drop the database; on PostgreSQL, drop the
    /// schema with everything in it): the end of a throw-away deployment such as a test
    /// run. Never call it on a deployment that matters.
    pub async fn destroy(self) -> Result<(), ComposeError> {
        match self.handle {
            #[cfg(feature = "mongo")]
            StoreHandle::Mongo(db, _) => mongo::destroy(db).await,
            #[cfg(feature = "postgres")]
            StoreHandle::Postgres(pool, config, _) => postgres::destroy(pool, config).await,
            #[cfg(feature = "sqlite")]
            StoreHandle::Sqlite(_, path) => sqlite::remove_files(&path, Role::Store),
            #[cfg(feature = "memory")]
            StoreHandle::Memory => Ok(()),
        }
    }

    /// The business collection with its dispatch intents (K-11), next to the instances so
    /// that accept is one write there: `MongoOutbox` (default schema) in the same database
    /// on MongoDB, `PostgresOutbox` on the table `business_objects` (default columns,
    /// created when absent) in the same schema on PostgreSQL, a fresh in-process one for
    /// `memory:`.
    pub async fn dispatch_outbox(&self) -> Result<Arc<DynOutbox>, ComposeError> {
        match &self.handle {
            #[cfg(feature = "mongo")]
            StoreHandle::Mongo(db, _) => mongo::outbox(db).await,
            #[cfg(feature = "postgres")]
            StoreHandle::Postgres(pool, config, _) => postgres::outbox(pool, config).await,
            #[cfg(feature = "sqlite")]
            StoreHandle::Sqlite(db, path) => sqlite::outbox(db, path).await,
            #[cfg(feature = "memory")]
            StoreHandle::Memory => Ok(Arc::new(kernel_memory::InMemoryOutbox::new())),
            // Only in a build without store drivers, where no `StoreSide` exists.
            #[allow(unreachable_patterns)]
            _ => Err(not_offered(Role::Store, self.scheme, "dispatch outbox")),
        }
    }

    /// The MongoDB database the instances live in, to open further collections of the same
    /// deployment (a business outbox with its own schema, a report) or read its name.
    /// [`ComposeError::NotOffered`] for any other scheme.
    #[cfg(feature = "mongo")]
    pub fn mongo_database(&self) -> Result<&::mongodb::Database, ComposeError> {
        match &self.handle {
            StoreHandle::Mongo(db, _) => Ok(db),
            #[allow(unreachable_patterns)]
            _ => Err(not_offered(Role::Store, self.scheme, "MongoDB database")),
        }
    }

    /// The concrete MongoDB store behind [`store`](Self::store), for what the port does not
    /// offer (listing instances for a report, `MongoWorkflowStore::list`).
    /// [`ComposeError::NotOffered`] for any other scheme.
    #[cfg(feature = "mongo")]
    pub fn mongo_store(&self) -> Result<&store_mongo::MongoWorkflowStore, ComposeError> {
        match &self.handle {
            StoreHandle::Mongo(_, store) => Ok(store),
            #[allow(unreachable_patterns)]
            _ => Err(not_offered(Role::Store, self.scheme, "MongoDB store")),
        }
    }
}

impl StoreSide {
    /// The PostgreSQL connection pool the store, inbox and outbox share, for what the ports
    /// do not offer (a business table of the same deployment, a report, a benchmark's raw
    /// statements). [`ComposeError::NotOffered`] for any other scheme.
    #[cfg(feature = "postgres")]
    pub fn postgres_pool(&self) -> Result<&store_postgres::Pool, ComposeError> {
        match &self.handle {
            StoreHandle::Postgres(pool, ..) => Ok(pool),
            #[allow(unreachable_patterns)]
            _ => Err(not_offered(Role::Store, self.scheme, "PostgreSQL pool")),
        }
    }

    /// The store-postgres configuration in use; its `schema` is the URL's `?schema=`,
    /// [`DEFAULT_SCHEMA`], or the scratch schema. [`ComposeError::NotOffered`] for any
    /// other scheme.
    #[cfg(feature = "postgres")]
    pub fn postgres_config(&self) -> Result<&store_postgres::PostgresConfig, ComposeError> {
        match &self.handle {
            StoreHandle::Postgres(_, config, _) => Ok(config),
            #[allow(unreachable_patterns)]
            _ => Err(not_offered(Role::Store, self.scheme, "PostgreSQL configuration")),
        }
    }

    /// The concrete PostgreSQL store behind [`store`](Self::store), for what the port does
    /// not offer (listing instances for a report, `PostgresWorkflowStore::list`).
    /// [`ComposeError::NotOffered`] for any other scheme.
    #[cfg(feature = "postgres")]
    pub fn postgres_store(&self) -> Result<&store_postgres::PostgresWorkflowStore, ComposeError> {
        match &self.handle {
            StoreHandle::Postgres(_, _, store) => Ok(store),
            #[allow(unreachable_patterns)]
            _ => Err(not_offered(Role::Store, self.scheme, "PostgreSQL store")),
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
    #[cfg(any(feature = "sqlite", feature = "local"))]
    Local(coord_local::LocalCoord, Option<std::path::PathBuf>),
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
        Self::connect_target(Target::parse(Role::Queue, url)?, options).await
    }

    /// Connect to the server `url` names, but under a fresh key prefix `<tag>_<hex>` instead
    /// of the URL's: a throw-away run that [`destroy`](Self::destroy) cleans up without
    /// touching any other key. `memory:` is fresh anyway. `tag` as for
    /// [`StoreSide::connect_scratch`].
    pub async fn connect_scratch(url: &str, options: &QueueOptions, tag: &str) -> Result<QueueSide, ComposeError> {
        Self::connect_target(scratch_target(Role::Queue, url, tag)?, options).await
    }

    async fn connect_target(target: Target, options: &QueueOptions) -> Result<QueueSide, ComposeError> {
        let _ = options;
        match target.scheme {
            #[cfg(feature = "redis")]
            Scheme::Redis => redis::queue(&target, options).await,
            #[cfg(feature = "sqlite")]
            Scheme::Sqlite => local::queue(Some(std::path::Path::new(&target.namespace)), target.scheme, options).await,
            #[cfg(feature = "local")]
            Scheme::Local => local::queue(None, target.scheme, options).await,
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
            #[cfg(any(feature = "sqlite", feature = "local"))]
            QueueHandle::Local(_, Some(path)) => local::remove_files(&path, Role::Queue),
            #[cfg(any(feature = "sqlite", feature = "local"))]
            QueueHandle::Local(_, None) => Ok(()),
            #[cfg(feature = "memory")]
            QueueHandle::Memory => Ok(()),
        }
    }

    /// The dispatch candidate index (K-12) next to the lanes: under the same Redis
    /// connection and key prefix, a fresh in-process one for `memory:`. Losing it (a
    /// [`destroy`](Self::destroy)) costs latency only: recovery scans rebuild it.
    pub fn dispatch_candidates(&self) -> Result<Arc<DynCandidates>, ComposeError> {
        match &self.handle {
            #[cfg(feature = "redis")]
            QueueHandle::Redis(conn, prefix) => redis::candidates(conn, prefix),
            #[cfg(any(feature = "sqlite", feature = "local"))]
            QueueHandle::Local(coord, _) => Ok(Arc::new(coord.dispatch_candidates())),
            #[cfg(feature = "memory")]
            QueueHandle::Memory => Ok(Arc::new(kernel_memory::InMemoryCandidates::new())),
            // Only in a build without queue drivers, where no `QueueSide` exists.
            #[allow(unreachable_patterns)]
            _ => Err(not_offered(Role::Queue, self.scheme, "dispatch candidates")),
        }
    }

    /// The key prefix every key of this side lives under (`?prefix=`, the default, or the
    /// scratch prefix); `None` for `memory:`, which has no keys.
    pub fn key_prefix(&self) -> Option<&str> {
        match &self.handle {
            #[cfg(feature = "redis")]
            QueueHandle::Redis(_, prefix) => Some(prefix),
            #[cfg(any(feature = "sqlite", feature = "local"))]
            QueueHandle::Local(_, _) => None,
            #[cfg(feature = "memory")]
            QueueHandle::Memory => None,
            // Only in a build without queue drivers, where no `QueueSide` exists.
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// The shared Redis connection of the lanes, wakeup and permits, for adapters of the
    /// same deployment that are not ports (a stream [`Forwarder`](sse_stream::Forwarder),
    /// a benchmark's raw commands). [`ComposeError::NotOffered`] for any other scheme.
    #[cfg(feature = "redis")]
    pub fn redis_connection(&self) -> Result<&queue_redis::RedisConnection, ComposeError> {
        match &self.handle {
            QueueHandle::Redis(conn, _) => Ok(conn),
            #[allow(unreachable_patterns)]
            _ => Err(not_offered(Role::Queue, self.scheme, "Redis connection")),
        }
    }

    /// The progress stream sink (K-16) on the same Redis connection, its keys under the
    /// same prefix and keyed by `secret` (shared with the processes that serve the
    /// streams), stamping frames with `clock`; set it with [`PortsBuilder::stream`].
    /// [`ComposeError::NotOffered`] for any other scheme.
    #[cfg(feature = "redis")]
    pub fn stream_sink(
        &self,
        clock: Arc<DynClock>,
        secret: sse_stream::StreamSecret,
    ) -> Result<sse_stream::RedisStreamSink, ComposeError> {
        match &self.handle {
            QueueHandle::Redis(conn, prefix) => redis::stream_sink(conn, prefix, clock, secret),
            #[allow(unreachable_patterns)]
            _ => Err(not_offered(Role::Queue, self.scheme, "stream sink")),
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
    /// Connect both sides. A `local` queue with a `sqlite:` store keeps its coordination in
    /// the store's file, so every process of the deployment shares it; with any other store
    /// it lives in this process only.
    pub async fn connect(store_url: &str, queue_url: &str, options: &QueueOptions) -> Result<Self, ComposeError> {
        let store = StoreSide::connect(store_url).await?;
        let queue_target = Target::parse(Role::Queue, queue_url)?;
        let queue = match (&store.handle, queue_target.scheme) {
            #[cfg(feature = "sqlite")]
            (StoreHandle::Sqlite(_, path), Scheme::Local) => local::queue(Some(path), Scheme::Local, options).await?,
            _ => QueueSide::connect_target(queue_target, options).await?,
        };
        Ok(Deployment { store, queue })
    }

    /// Connect to [`Urls`].
    pub async fn from_urls(urls: &Urls, options: &QueueOptions) -> Result<Self, ComposeError> {
        Self::connect(&urls.store, &urls.queue, options).await
    }

    /// A [`PortsBuilder`] with the five required ports set, and the store side's
    /// [`dead_letters`](StoreSide::dead_letters),
    /// [`task_inbox`](StoreSide::task_inbox) and
    /// [`result_cache`](StoreSide::result_cache); add an observer, a stream sink, another
    /// clock as needed (or replace the cache) and [`build`](PortsBuilder::build).
    pub fn ports(&self) -> PortsBuilder {
        kernel_core::engine::Ports::builder()
            .store(self.store.store.clone())
            .inbox(self.store.inbox.clone())
            .queue(self.queue.queue.clone())
            .wakeup(self.queue.wakeup.clone())
            .permits(self.queue.permits.clone())
            .dead_letters(self.store.dead_letters.clone())
            .task_inbox(self.store.task_inbox.clone())
            .result_cache(self.store.result_cache.clone())
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

    /// [`StoreSide::destroy`] and [`QueueSide::destroy`]: both are attempted; the store's
    /// error, if any, is returned first.
    pub async fn destroy(self) -> Result<(), ComposeError> {
        let store = self.store.destroy().await;
        let queue = self.queue.destroy().await;
        store.and(queue)
    }
}
