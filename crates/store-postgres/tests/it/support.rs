//! The one place that decides whether the PostgreSQL tests run, and their fixtures.

use kernel_core::ports::{DynDeadLetters, DynInbox, DynResultCache, DynStore, DynTaskInbox, SignalInbox as _};
use rand::Rng;
use std::sync::OnceLock;
use std::time::Duration;
use store_postgres::{
    PostgresConfig, PostgresDeadLetters, PostgresResultCache, PostgresSignalInbox, PostgresTaskInbox,
    PostgresWorkflowStore,
};
use testkit::conformance::cache::CacheFixture;
use testkit::conformance::dead_letter::DeadLetterFixture;
use testkit::conformance::inbox::InboxFixture;
use testkit::conformance::store::StoreFixture;
use testkit::conformance::task_inbox::TaskInboxFixture;

/// Whether the server answered the first probe of this test binary.
static SERVER: OnceLock<Result<(), String>> = OnceLock::new();

/// The server's URL, or `None` after printing why the test is skipped. Under CI (`CI=true`
/// or `CI=1`, `testkit::ci`) a server that does not answer is a failure: CI must always
/// exercise the adapter against a server.
pub async fn server_url() -> Option<String> {
    let url = store_postgres::database_url();
    let probe = match SERVER.get() {
        Some(p) => p.clone(),
        None => {
            let p = probe(&url).await;
            SERVER.get_or_init(|| p).clone()
        }
    };
    match probe {
        Ok(()) => Some(without_flush(&url)),
        Err(why) => testkit::ci::skip_or_fail(
            "store-postgres",
            &format!("no PostgreSQL server answers at {url} ({why}); set DATABASE_URL or start the local server"),
        ),
    }
}

/// `url` with `synchronous_commit=off` for the connections of the tests: a commit is as atomic
/// and as visible as before, the server just does not wait for the disk (the tests never
/// crash the server, so they cannot tell; the benchmark and the races' figures do not
/// depend on it). It keeps the sweep's thousands of commits off the shared disk.
fn without_flush(url: &str) -> String {
    if url.contains("options=") {
        return url.to_string();
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-c%20synchronous_commit%3Doff")
}

async fn probe(url: &str) -> Result<(), String> {
    let connect = tokio_postgres::connect(url, tokio_postgres::NoTls);
    match tokio::time::timeout(Duration::from_secs(3), connect).await {
        Ok(Ok((client, conn))) => {
            let task = tokio::spawn(conn);
            let r = client.simple_query("SELECT 1").await.map(|_| ()).map_err(|e| e.to_string());
            drop(client);
            let _ = task.await;
            r
        }
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("connect timed out after 3 s".to_string()),
    }
}

/// A fresh, randomly named schema, migrated, with a pool on it. Dropped by
/// [`TestSchema::drop_schema`], or by `Drop` (on another thread, with its own connection)
/// when a test panicked before.
pub struct TestSchema {
    pub pool: store_postgres::Pool,
    pub config: PostgresConfig,
    url: String,
    dropped: bool,
}

impl TestSchema {
    /// Connect and migrate, or `None` when the tests are skipped.
    pub async fn new() -> Option<TestSchema> {
        Self::with_pool_size(4).await
    }

    /// As [`new`](Self::new), with a pool of up to `pool_size_max` connections.
    pub async fn with_pool_size(pool_size_max: usize) -> Option<TestSchema> {
        let url = server_url().await?;
        let schema = format!("wfk_test_{:016x}", rand::thread_rng().gen::<u64>());
        let config = PostgresConfig { schema, pool_size_max, ..PostgresConfig::default() };
        let pool = store_postgres::connect(&url, &config).expect("valid database URL");
        let s = TestSchema { pool, config, url, dropped: false };
        store_postgres::migrate(&s.pool, &s.config.schema).await.expect("migrate");
        Some(s)
    }

    pub fn schema(&self) -> &str {
        &self.config.schema
    }

    pub fn store(&self) -> PostgresWorkflowStore {
        PostgresWorkflowStore::new(self.pool.clone(), self.config.clone()).expect("store")
    }

    pub fn inbox(&self) -> PostgresSignalInbox {
        PostgresSignalInbox::new(self.pool.clone(), self.config.clone()).expect("inbox")
    }

    pub fn dead_letters(&self) -> PostgresDeadLetters {
        PostgresDeadLetters::new(self.pool.clone(), self.config.clone()).expect("dead letters")
    }

    pub fn task_inbox(&self) -> PostgresTaskInbox {
        PostgresTaskInbox::new(self.pool.clone(), self.config.clone()).expect("task inbox")
    }

    /// A client of the pool, for reading the tables directly.
    pub async fn client(&self) -> deadpool_postgres::Object {
        self.pool.get().await.expect("connection")
    }

    /// One `bigint` from a query (`{s}` stands for the quoted schema).
    pub async fn scalar(&self, sql: &str) -> i64 {
        let sql = sql.replace("{s}", &format!("\"{}\"", self.schema()));
        self.client().await.query_one(sql.as_str(), &[]).await.unwrap_or_else(|e| panic!("{sql}: {e}")).get(0)
    }

    /// Drop the schema (best effort: a failed drop must not hide the test's verdict).
    pub async fn drop_schema(mut self) {
        let sql = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.schema());
        match self.pool.get().await {
            Ok(c) => match c.batch_execute(&sql).await {
                Ok(()) => self.dropped = true,
                Err(e) => eprintln!("could not drop test schema {}: {e}", self.schema()),
            },
            Err(e) => eprintln!("could not drop test schema {}: {e}", self.schema()),
        }
        self.pool.close();
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        // A panicking test, or a test that never called `drop_schema`: drop it on a fresh
        // runtime on another thread, which works whatever runtime (if any) is unwinding here.
        let (url, schema) = (self.url.clone(), self.config.schema.clone());
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            rt.block_on(async {
                let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.ok()?;
                tokio::spawn(conn);
                client.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE")).await.ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("could not drop test schema {}", self.config.schema);
        }
    }
}

/// Schemas made for many runs of one test (a sweep), all dropped at the end — by
/// [`SchemaSet::drop_all`], or by `Drop` of the last handle when the test panicked.
#[derive(Clone)]
pub struct SchemaSet(std::sync::Arc<SchemaNames>);

pub struct SchemaNames {
    url: String,
    names: std::sync::Mutex<Vec<String>>,
}

impl SchemaSet {
    pub fn new(url: &str) -> SchemaSet {
        SchemaSet(std::sync::Arc::new(SchemaNames { url: url.to_string(), names: Default::default() }))
    }

    /// A new random schema name, remembered for the drop.
    pub fn fresh(&self) -> String {
        let name = format!("wfk_test_{:016x}", rand::thread_rng().gen::<u64>());
        self.0.names.lock().unwrap().push(name.clone());
        name
    }

    /// A fresh schema, migrated on `pool`, and the default configuration in it.
    pub async fn fresh_migrated(&self, pool: &store_postgres::Pool) -> PostgresConfig {
        let schema = self.fresh();
        store_postgres::migrate(pool, &schema).await.expect("migrate");
        PostgresConfig { schema, ..PostgresConfig::default() }
    }

    /// Drop every schema made so far.
    pub async fn drop_all(&self) {
        let names: Vec<String> = std::mem::take(&mut *self.0.names.lock().unwrap());
        if names.is_empty() {
            return;
        }
        match tokio_postgres::connect(&self.0.url, tokio_postgres::NoTls).await {
            Ok((client, conn)) => {
                tokio::spawn(conn);
                // One statement (one transaction) each: dropping hundreds at once would
                // exceed the server's lock table.
                for n in &names {
                    if let Err(e) = client.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{n}\" CASCADE")).await {
                        eprintln!("could not drop test schema {n}: {e}");
                    }
                }
            }
            Err(e) => eprintln!("could not drop {} test schemas: {e}", names.len()),
        }
    }
}

impl Drop for SchemaNames {
    fn drop(&mut self) {
        let names: Vec<String> = std::mem::take(&mut *self.names.lock().unwrap_or_else(|p| p.into_inner()));
        if names.is_empty() {
            return;
        }
        let url = self.url.clone();
        let count = names.len();
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            rt.block_on(async {
                let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.ok()?;
                tokio::spawn(conn);
                // Every schema, whatever failed before it.
                for n in &names {
                    if let Err(e) = client.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{n}\" CASCADE")).await {
                        eprintln!("could not drop test schema {n}: {e}");
                    }
                }
                Some(())
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("could not drop {count} test schemas (no connection)");
        }
    }
}

/// Store conformance fixture: a store in a fresh schema.
pub struct StoreDb(pub TestSchema, pub PostgresWorkflowStore);

impl StoreDb {
    pub async fn new() -> Option<StoreDb> {
        let t = TestSchema::new().await?;
        let s = t.store();
        Some(StoreDb(t, s))
    }
}

impl StoreFixture for StoreDb {
    fn store(&self) -> &DynStore {
        &self.1
    }
    fn teardown(self) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(self.0.drop_schema())
    }
}

/// Inbox conformance fixture: an inbox in a fresh schema.
pub struct InboxDb(pub TestSchema, pub PostgresSignalInbox);

impl InboxDb {
    pub async fn new() -> Option<InboxDb> {
        let t = TestSchema::new().await?;
        let s = t.inbox();
        Some(InboxDb(t, s))
    }
}

impl InboxFixture for InboxDb {
    fn inbox(&self) -> &DynInbox {
        &self.1
    }
    /// A record with a negative `generation`, as a version without the column's check
    /// would have written it.
    fn plant_undecodable<'a>(
        &'a self,
        signal_id: &'a str,
        created_at: kernel_core::domain::Instant,
    ) -> futures::future::BoxFuture<'a, bool> {
        Box::pin(async move {
            let record = testkit::conformance::inbox::record(signal_id, created_at);
            self.1.insert(record).await.expect("insert");
            let c = self.0.client().await;
            let s = format!("\"{}\"", self.0.schema());
            c.batch_execute(&format!("ALTER TABLE {s}.signal_inbox DROP CONSTRAINT signal_inbox_generation_check"))
                .await
                .expect("drop the check");
            let sql = format!("UPDATE {s}.signal_inbox SET generation = -1 WHERE signal_id = $1");
            assert_eq!(c.execute(sql.as_str(), &[&signal_id]).await.expect("plant"), 1);
            true
        })
    }
    fn teardown(self) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(self.0.drop_schema())
    }
}

/// Result-cache conformance fixture: a cache in a fresh schema.
pub struct CacheDb(pub TestSchema, pub PostgresResultCache);

impl CacheDb {
    pub async fn new() -> Option<CacheDb> {
        let t = TestSchema::new().await?;
        let c = PostgresResultCache::new(t.pool.clone(), t.config.clone()).expect("cache");
        Some(CacheDb(t, c))
    }
}

impl CacheFixture for CacheDb {
    fn cache(&self) -> &DynResultCache {
        &self.1
    }
    fn teardown(self) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(self.0.drop_schema())
    }
}

/// Dead-letter conformance fixture: the dead letters in a fresh schema.
pub struct DeadLetterDb(pub TestSchema, pub PostgresDeadLetters);

impl DeadLetterDb {
    pub async fn new() -> Option<DeadLetterDb> {
        let t = TestSchema::new().await?;
        let s = t.dead_letters();
        Some(DeadLetterDb(t, s))
    }
}

impl DeadLetterFixture for DeadLetterDb {
    fn dead_letters(&self) -> &DynDeadLetters {
        &self.1
    }
    fn teardown(self) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(self.0.drop_schema())
    }
}

/// Task-inbox conformance fixture: the human tasks in a fresh schema.
pub struct TaskInboxDb(pub TestSchema, pub PostgresTaskInbox);

impl TaskInboxDb {
    pub async fn new() -> Option<TaskInboxDb> {
        let t = TestSchema::new().await?;
        let s = t.task_inbox();
        Some(TaskInboxDb(t, s))
    }
}

impl TaskInboxFixture for TaskInboxDb {
    fn task_inbox(&self) -> &DynTaskInbox {
        &self.1
    }
    fn teardown(self) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(self.0.drop_schema())
    }
}
