//! Fixtures: a fresh SQLite file per test, in a temporary directory removed on drop.

use kernel_core::ports::{DynDeadLetters, DynInbox, DynResultCache, DynStore, DynTaskInbox, SignalInbox as _};
use store_sqlite::{
    SqliteConfig, SqliteDb, SqliteDeadLetters, SqliteResultCache, SqliteSignalInbox, SqliteTaskInbox,
    SqliteWorkflowStore, Synchronous,
};
use testkit::conformance::cache::CacheFixture;
use testkit::conformance::dead_letter::DeadLetterFixture;
use testkit::conformance::inbox::InboxFixture;
use testkit::conformance::store::StoreFixture;
use testkit::conformance::task_inbox::TaskInboxFixture;

/// The configuration of the tests: `synchronous=NORMAL` (see the crate's test docs).
pub fn config() -> SqliteConfig {
    SqliteConfig { synchronous: Synchronous::Normal, ..SqliteConfig::default() }
}

/// A fresh file, opened and migrated; the directory goes with the value.
pub struct TestDb {
    pub dir: tempfile::TempDir,
    pub db: SqliteDb,
}

impl TestDb {
    pub async fn new() -> TestDb {
        Self::with(config()).await
    }

    pub async fn with(config: SqliteConfig) -> TestDb {
        let dir = tempfile::tempdir().expect("temporary directory");
        let db = SqliteDb::open(dir.path().join("wf.db"), config).await.expect("open");
        TestDb { dir, db }
    }

    pub fn store(&self) -> SqliteWorkflowStore {
        SqliteWorkflowStore::new(self.db.clone())
    }

    pub fn inbox(&self) -> SqliteSignalInbox {
        SqliteSignalInbox::new(self.db.clone())
    }

    pub fn dead_letters(&self) -> SqliteDeadLetters {
        SqliteDeadLetters::new(self.db.clone())
    }

    pub fn task_inbox(&self) -> SqliteTaskInbox {
        SqliteTaskInbox::new(self.db.clone())
    }

    /// Close the pool and delete the directory (a failure to delete is reported, not fatal).
    pub fn close(self) {
        drop(self.db);
        if let Err(e) = self.dir.close() {
            eprintln!("could not remove a test directory: {e}");
        }
    }

    /// One integer from a query, on a connection of its own.
    pub fn scalar(&self, sql: &str) -> i64 {
        let c = rusqlite::Connection::open(self.db.path()).expect("open");
        c.query_row(sql, [], |r| r.get(0)).unwrap_or_else(|e| panic!("{sql}: {e}"))
    }
}

/// Store conformance fixture: a store in a fresh file.
pub struct StoreDb(pub TestDb, pub SqliteWorkflowStore);

impl StoreDb {
    pub async fn new() -> Option<StoreDb> {
        let t = TestDb::new().await;
        let s = t.store();
        Some(StoreDb(t, s))
    }
}

impl StoreFixture for StoreDb {
    fn store(&self) -> &DynStore {
        &self.1
    }
    fn teardown(self) -> futures::future::BoxFuture<'static, ()> {
        drop(self.1);
        self.0.close();
        Box::pin(async {})
    }
}

/// Inbox conformance fixture: an inbox in a fresh file.
pub struct InboxDb(pub TestDb, pub SqliteSignalInbox);

impl InboxDb {
    pub async fn new() -> Option<InboxDb> {
        let t = TestDb::new().await;
        let s = t.inbox();
        Some(InboxDb(t, s))
    }
}

impl InboxFixture for InboxDb {
    fn inbox(&self) -> &DynInbox {
        &self.1
    }
    /// A record whose `wait_key` is no longer UTF-8 text.
    fn plant_undecodable<'a>(
        &'a self,
        signal_id: &'a str,
        created_at: kernel_core::domain::Instant,
    ) -> futures::future::BoxFuture<'a, bool> {
        Box::pin(async move {
            let record = testkit::conformance::inbox::record(signal_id, created_at);
            self.1.insert(record).await.expect("insert");
            let c = rusqlite::Connection::open(self.0.db.path()).expect("open");
            let sql = "UPDATE signal_inbox SET wait_key = CAST(x'ff' AS TEXT) WHERE signal_id = ?1";
            assert_eq!(c.execute(sql, [signal_id]).expect("plant"), 1);
            true
        })
    }
    fn teardown(self) -> futures::future::BoxFuture<'static, ()> {
        drop(self.1);
        self.0.close();
        Box::pin(async {})
    }
}

/// Result-cache conformance fixture: a cache in a fresh file.
pub struct CacheDb(pub TestDb, pub SqliteResultCache);

impl CacheDb {
    pub async fn new() -> Option<CacheDb> {
        let t = TestDb::new().await;
        let c = SqliteResultCache::new(t.db.clone());
        Some(CacheDb(t, c))
    }
}

impl CacheFixture for CacheDb {
    fn cache(&self) -> &DynResultCache {
        &self.1
    }
    fn teardown(self) -> futures::future::BoxFuture<'static, ()> {
        drop(self.1);
        self.0.close();
        Box::pin(async {})
    }
}

/// Dead-letter conformance fixture: the dead letters in a fresh file.
pub struct DeadLetterDb(pub TestDb, pub SqliteDeadLetters);

impl DeadLetterDb {
    pub async fn new() -> Option<DeadLetterDb> {
        let t = TestDb::new().await;
        let s = t.dead_letters();
        Some(DeadLetterDb(t, s))
    }
}

impl DeadLetterFixture for DeadLetterDb {
    fn dead_letters(&self) -> &DynDeadLetters {
        &self.1
    }
    fn teardown(self) -> futures::future::BoxFuture<'static, ()> {
        drop(self.1);
        self.0.close();
        Box::pin(async {})
    }
}

/// Task-inbox conformance fixture: the human tasks in a fresh file.
pub struct TaskInboxDb(pub TestDb, pub SqliteTaskInbox);

impl TaskInboxDb {
    pub async fn new() -> Option<TaskInboxDb> {
        let t = TestDb::new().await;
        let s = t.task_inbox();
        Some(TaskInboxDb(t, s))
    }
}

impl TaskInboxFixture for TaskInboxDb {
    fn task_inbox(&self) -> &DynTaskInbox {
        &self.1
    }
    fn teardown(self) -> futures::future::BoxFuture<'static, ()> {
        drop(self.1);
        self.0.close();
        Box::pin(async {})
    }
}
