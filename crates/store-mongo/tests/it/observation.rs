//! The observer's repository on a Mongo-wire server (`MONGODB_URI`): the conformance
//! suite, the property test, and a poison record the server itself refuses. Each test uses
//! a fresh random database, dropped afterwards; the whole file stays well under 1 500
//! operations.

use kernel_core::ports::{DynClock, ObservationSink};
use kernel_core::transition::TransitionKind;
use mongodb::bson::{doc, Bson};
use mongodb::{Client, Database};
use observer::conformance::{obs, poison, RepositoryFixture};
use observer::{DynRepository, Observer, ObserverConfig};
use proptest::prelude::*;
use rand::Rng;
use std::sync::Arc;
use store_mongo::{MongoObservationRepository, ATTEMPTS_COLLECTION, SNAPSHOTS_COLLECTION};
use testkit::memory::ManualClock;

pub struct MongoFixture {
    client: Client,
    db: Database,
    repo: MongoObservationRepository,
}

impl MongoFixture {
    async fn new() -> Option<MongoFixture> {
        let uri = crate::support::mongo_uri()?;
        let client = Client::with_uri_str(&uri).await.expect("valid MONGODB_URI");
        let db = client.database(&format!("wfk_obs_{:016x}", rand::thread_rng().gen::<u64>()));
        let repo = MongoObservationRepository::open(&db).await.expect("open repository");
        Some(MongoFixture { client, db, repo })
    }
}

#[async_trait::async_trait]
impl RepositoryFixture for MongoFixture {
    fn repo(&self) -> &DynRepository {
        &self.repo
    }
    async fn teardown(self) {
        if let Err(e) = self.db.drop().await {
            eprintln!("could not drop test database {}: {e}", self.db.name());
        }
        self.client.shutdown().await;
    }
}

async fn fixture(_case: &str) -> Option<MongoFixture> {
    MongoFixture::new().await
}

observer::repository_conformance!(fixture);

/// The poison record is refused by the server itself, not by a client-side check: the
/// raw snapshot update of a `$`-prefixed step path comes back as a write error.
#[tokio::test]
async fn server_really_rejects_the_poison_record() {
    let Some(fx) = MongoFixture::new().await else { return };
    let reply = fx
        .db
        .run_command(doc! {
            "update": SNAPSHOTS_COLLECTION,
            "updates": [ { "q": { "_id": "k" }, "u": { "$set": { "steps.$poison": { "attempt": 1 } } }, "upsert": true } ],
            "ordered": false,
        })
        .await
        .expect("command");
    let errors = reply.get_array("writeErrors").expect("the server refuses the record");
    assert_eq!(errors.len(), 1);
    let code = errors[0].as_document().and_then(|d| d.get("code")).cloned();
    assert!(!matches!(code, Some(Bson::Int32(11000))), "not a duplicate key: {code:?}");
    assert!(observer::check_step_key("$poison").is_err(), "K-2.0 forbids it too");
    fx.teardown().await;
}

/// 100 observations, one the server refuses: 99 written, 1 isolated by bisection.
#[tokio::test]
async fn poison_in_a_batch_of_100_on_mongo() {
    let Some(fx) = MongoFixture::new().await else { return };
    let clock = Arc::new(ManualClock::default());
    let config = ObserverConfig { queue_capacity: 200, batch_size_max: 100, ..ObserverConfig::default() };
    let (observer, writer) =
        Observer::start(Arc::new(fx.repo.clone()), clock as Arc<DynClock>, config).expect("observer");
    for i in 0..100u64 {
        let key = format!("k{i:03}");
        observer.emit(if i == 61 { poison(&key, 1) } else { obs(&key, 1, TransitionKind::MarkRunning, Some("s1"), 1) });
    }
    writer.flush().await.expect("flush");
    let s = observer.stats();
    assert_eq!((s.written, s.poison), (99, 1), "{s:?}");
    let snapshots = fx.db.collection::<mongodb::bson::Document>(SNAPSHOTS_COLLECTION).count_documents(doc! {}).await;
    assert_eq!(snapshots.unwrap(), 99);
    let attempts = fx.db.collection::<mongodb::bson::Document>(ATTEMPTS_COLLECTION).count_documents(doc! {}).await;
    // The poison's attempt row (its step name is only a value there) may exist; its
    // snapshot, where the name is a key, does not.
    assert!(attempts.unwrap() >= 99);
    assert!(observer::ObservationRepository::snapshot(&fx.repo, "k061").await.unwrap().is_none());
    writer.close().await;
    fx.teardown().await;
}

proptest! {
    // Few cases: each costs ~60 operations on a slow test server.
    #![proptest_config(ProptestConfig { cases: 4, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn out_of_order_older_revisions_never_overwrite_newer_snapshots_on_mongo(seed in any::<u64>()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let Some(fx) = MongoFixture::new().await else { return };
            observer::conformance::out_of_order_revisions_keep_the_newest(&fx.repo, seed, 2).await;
            fx.teardown().await;
        });
    }
}

/// A MongoDB driver failure keeps the driver's error as the cause: a closed port is
/// `Unavailable` (retryable) and `source()` is the `mongodb::error::Error`.
#[tokio::test]
async fn a_driver_failure_keeps_the_drivers_error_as_its_source() {
    use std::error::Error as _;
    // Port 1 is never a MongoDB server; fail fast instead of the default 30 s.
    let client = Client::with_uri_str("mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200&connectTimeoutMS=200")
        .await
        .expect("a URI parses without a round trip");
    let e = MongoObservationRepository::open(&client.database("wfk_obs_unreachable")).await.unwrap_err();
    assert!(matches!(e, observer::Error::Unavailable { .. }) && e.is_retryable(), "{e:?}");
    assert!(e.source().and_then(|s| s.downcast_ref::<mongodb::error::Error>()).is_some(), "{e:?}");
}
