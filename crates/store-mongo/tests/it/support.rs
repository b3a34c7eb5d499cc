//! The one place that decides whether the Mongo tests run, and their fixtures.

use kernel_core::ports::{DynDeadLetters, DynInbox, DynResultCache, DynStore, DynTaskInbox, SignalInbox as _};
use mongodb::{Client, Database};
use rand::Rng;
use store_mongo::{
    MongoConfig, MongoDeadLetters, MongoResultCache, MongoSignalInbox, MongoTaskInbox, MongoWorkflowStore,
};
use testkit::conformance::cache::CacheFixture;
use testkit::conformance::dead_letter::DeadLetterFixture;
use testkit::conformance::inbox::InboxFixture;
use testkit::conformance::store::StoreFixture;
use testkit::conformance::task_inbox::TaskInboxFixture;

/// `MONGODB_URI`, or `None` after printing why the test is skipped. Under CI (`CI=true` or
/// `CI=1`, `testkit::ci`) a missing URI is a failure: CI must always exercise the adapter
/// against a server.
pub fn mongo_uri() -> Option<String> {
    match std::env::var("MONGODB_URI") {
        Ok(uri) if !uri.trim().is_empty() => Some(uri),
        _ => testkit::ci::skip_or_fail(
            "store-mongo",
            "MONGODB_URI is not set (run `eval \"$(scripts/mongo-wire.sh start)\"; export MONGODB_URI`)",
        ),
    }
}

/// A fresh, randomly named database on the test server.
pub struct TestDb {
    /// The client (one per test: each test has its own runtime).
    pub client: Client,
    /// The database; dropped by [`TestDb::drop_db`].
    pub db: Database,
}

impl TestDb {
    /// Connect, or `None` when the tests are skipped.
    pub async fn new() -> Option<TestDb> {
        let uri = mongo_uri()?;
        let client = Client::with_uri_str(&uri).await.expect("valid MONGODB_URI");
        let name = format!("wfk_test_{:016x}", rand::thread_rng().gen::<u64>());
        Some(TestDb { db: client.database(&name), client })
    }

    /// Drop the database (best effort: a failed drop must not hide the test's verdict).
    pub async fn drop_db(self) {
        if let Err(e) = self.db.drop().await {
            eprintln!("could not drop test database {}: {e}", self.db.name());
        }
        self.client.shutdown().await;
    }

    /// The store on this database, indexes created.
    pub async fn store(&self) -> MongoWorkflowStore {
        MongoWorkflowStore::open(&self.db, MongoConfig::default()).await.expect("open store")
    }

    /// The inbox on this database, indexes created.
    pub async fn inbox(&self) -> MongoSignalInbox {
        MongoSignalInbox::open(&self.db, MongoConfig::default()).await.expect("open inbox")
    }

    /// The dead letters on this database, on a collection named apart from the default
    /// (the name is configurable), indexes created.
    pub async fn dead_letters(&self) -> MongoDeadLetters {
        MongoDeadLetters::open_in(&self.db, "ops_dead_letters", MongoConfig::default())
            .await
            .expect("open dead letters")
    }

    /// The task inbox on this database, on a collection named apart from the default (the
    /// name is configurable), indexes created.
    pub async fn task_inbox(&self) -> MongoTaskInbox {
        MongoTaskInbox::open_in(&self.db, "ops_task_inbox", MongoConfig::default()).await.expect("open task inbox")
    }

    /// Documents in a collection (one round trip).
    pub async fn count(&self, collection: &str) -> u64 {
        self.db
            .collection::<mongodb::bson::Document>(collection)
            .count_documents(mongodb::bson::doc! {})
            .await
            .expect("count")
    }
}

/// Store conformance fixture: a store on a fresh database.
pub struct StoreDb(pub TestDb, pub MongoWorkflowStore);

impl StoreDb {
    pub async fn new() -> Option<StoreDb> {
        let t = TestDb::new().await?;
        let s = t.store().await;
        Some(StoreDb(t, s))
    }
}

impl StoreFixture for StoreDb {
    fn store(&self) -> &DynStore {
        &self.1
    }
    fn teardown(self) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(self.0.drop_db())
    }
}

/// Inbox conformance fixture: an inbox on a fresh database.
pub struct InboxDb(pub TestDb, pub MongoSignalInbox);

impl InboxDb {
    pub async fn new() -> Option<InboxDb> {
        let t = TestDb::new().await?;
        let s = t.inbox().await;
        Some(InboxDb(t, s))
    }
}

impl InboxFixture for InboxDb {
    fn inbox(&self) -> &DynInbox {
        &self.1
    }
    /// A record whose `generation` is a string.
    fn plant_undecodable<'a>(
        &'a self,
        signal_id: &'a str,
        created_at: kernel_core::domain::Instant,
    ) -> futures::future::BoxFuture<'a, bool> {
        Box::pin(async move {
            let record = testkit::conformance::inbox::record(signal_id, created_at);
            self.1.insert(record).await.expect("insert");
            let coll = self.0.db.collection::<mongodb::bson::Document>(store_mongo::INBOX);
            let update = mongodb::bson::doc! { "$set": { "generation": "not a number" } };
            let r = coll.update_one(mongodb::bson::doc! { "signal_id": signal_id }, update).await.expect("plant");
            assert_eq!(r.modified_count, 1);
            true
        })
    }
    fn teardown(self) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(self.0.drop_db())
    }
}

/// Result-cache conformance fixture: a cache on a fresh database.
pub struct CacheDb(pub TestDb, pub MongoResultCache);

impl CacheDb {
    pub async fn new() -> Option<CacheDb> {
        let t = TestDb::new().await?;
        let c = MongoResultCache::open(&t.db, &MongoConfig::default(), store_mongo::RESULT_CACHE)
            .await
            .expect("open result cache");
        Some(CacheDb(t, c))
    }
}

impl CacheFixture for CacheDb {
    fn cache(&self) -> &DynResultCache {
        &self.1
    }
    fn teardown(self) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(self.0.drop_db())
    }
}

/// Dead-letter conformance fixture: the dead letters on a fresh database.
pub struct DeadLetterDb(pub TestDb, pub MongoDeadLetters);

impl DeadLetterDb {
    pub async fn new() -> Option<DeadLetterDb> {
        let t = TestDb::new().await?;
        let s = t.dead_letters().await;
        Some(DeadLetterDb(t, s))
    }
}

impl DeadLetterFixture for DeadLetterDb {
    fn dead_letters(&self) -> &DynDeadLetters {
        &self.1
    }
    fn teardown(self) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(self.0.drop_db())
    }
}

/// Task-inbox conformance fixture: the task inbox on a fresh database.
pub struct TaskInboxDb(pub TestDb, pub MongoTaskInbox);

impl TaskInboxDb {
    pub async fn new() -> Option<TaskInboxDb> {
        let t = TestDb::new().await?;
        let s = t.task_inbox().await;
        Some(TaskInboxDb(t, s))
    }
}

impl TaskInboxFixture for TaskInboxDb {
    fn task_inbox(&self) -> &DynTaskInbox {
        &self.1
    }
    fn teardown(self) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(self.0.drop_db())
    }
}
