//! The observer's repository conformance suite on SQLite (each case in a fresh file), the
//! ops view over it, and the refusals particular to SQLite.

use crate::support::TestDb;
use kernel_core::transition::TransitionKind;
use observer::conformance::{obs, RepositoryFixture};
use observer::{DynRepository, Error, ObservationRepository};
use store_sqlite::SqliteObservationRepository;

pub struct ObsDb(pub TestDb, pub SqliteObservationRepository);

impl ObsDb {
    pub async fn new() -> Option<ObsDb> {
        let t = TestDb::new().await;
        let r = SqliteObservationRepository::new(t.db.clone());
        Some(ObsDb(t, r))
    }
}

#[async_trait::async_trait]
impl RepositoryFixture for ObsDb {
    fn repo(&self) -> &DynRepository {
        &self.1
    }
    async fn teardown(self) {
        drop(self.1);
        self.0.close();
    }
}

async fn fixture(_case: &str) -> Option<ObsDb> {
    ObsDb::new().await
}

mod conformance {
    use super::fixture;
    observer::repository_conformance!(fixture);
}

/// What SQLite cannot hold is refused as a record (a revision past its 64-bit integers, a
/// NUL in a key column), the batch's other records written; nothing of the refused record
/// is written. A NUL inside the record's JSON (a worker id) is kept and read back whole.
#[tokio::test]
async fn values_sqlite_cannot_store_are_invalid_records() {
    let db = ObsDb::new().await.unwrap();
    let mut nul = obs("nul", 1, TransitionKind::MarkRunning, Some("s1"), 1);
    nul.worker_id = Some("w\0x".into());
    let mut huge = obs("huge", 1, TransitionKind::MarkRunning, Some("s1"), 1);
    huge.revision = u64::MAX;
    let mut key = obs("ok", 1, TransitionKind::MarkRunning, Some("s1"), 1);
    key.workflow_type = "t\0".into();
    let ok = obs("ok", 1, TransitionKind::MarkRunning, Some("s1"), 1);
    let r = db.1.write_batch(&[nul, huge, key, ok]).await;
    assert!(matches!(r, Err(Error::InvalidRecord(_))), "{r:?}");
    assert_eq!(db.1.snapshot("nul").await.unwrap().unwrap().worker_id.as_deref(), Some("w\0x"));
    assert!(db.1.snapshot("huge").await.unwrap().is_none());
    assert_eq!(db.1.snapshot("ok").await.unwrap().unwrap().workflow_type, "summary");
    assert_eq!(db.0.scalar("SELECT count(*) FROM observation_attempts"), 2);
}

/// 100 observations through the observer's writer, one SQLite refuses (a revision past its
/// 64-bit integers): 99 written, the poison isolated by bisection and nothing of it stored.
#[tokio::test]
async fn poison_in_a_batch_of_100_through_the_writer() {
    use kernel_core::ports::{DynClock, ObservationSink};
    use observer::{Observer, ObserverConfig};
    use std::sync::Arc;
    let db = ObsDb::new().await.unwrap();
    let clock = Arc::new(testkit::memory::ManualClock::default());
    let config = ObserverConfig { queue_capacity: 200, batch_size_max: 100, ..ObserverConfig::default() };
    let (observer, writer) = Observer::start(Arc::new(db.1.clone()), clock as Arc<DynClock>, config).expect("observer");
    for i in 0..100u64 {
        let mut o = obs(&format!("k{i:03}"), 1, TransitionKind::MarkRunning, Some("s1"), 1);
        if i == 61 {
            o.revision = u64::MAX;
        }
        observer.emit(o);
    }
    writer.flush().await.expect("flush");
    let s = observer.stats();
    assert_eq!((s.written, s.poison), (99, 1), "{s:?}");
    assert_eq!(db.0.scalar("SELECT count(*) FROM observation_snapshots"), 99);
    assert_eq!(db.0.scalar("SELECT count(*) FROM observation_attempts"), 99);
    assert!(db.1.snapshot("k061").await.unwrap().is_none());
    writer.close().await;
}

/// The out-of-order property on more seeds than the suite's one.
#[tokio::test]
async fn out_of_order_revisions_keep_the_newest_on_more_seeds() {
    let db = ObsDb::new().await.unwrap();
    for seed in [1u64, 2, 3, 0xdead_beef] {
        observer::conformance::out_of_order_revisions_keep_the_newest(&db.1, seed, 3).await;
    }
}

/// The same batches written to SQLite and to the in-memory reference leave the same
/// snapshots and attempt rows.
#[tokio::test]
async fn same_state_as_the_in_memory_reference() {
    let db = ObsDb::new().await.unwrap();
    let reference = observer::InMemoryObservationRepository::new();
    let mut late = obs("t", 8, TransitionKind::Completed, None, 0);
    late.at = late.at.checked_add(kernel_core::domain::DurationMs::from_secs(60)).unwrap();
    let batches: Vec<Vec<kernel_core::ports::Observation>> = vec![
        vec![obs("t", 1, TransitionKind::Create, None, 0), obs("t", 2, TransitionKind::MarkRunning, Some("a"), 1)],
        vec![obs("t", 3, TransitionKind::RetryRelease, Some("a"), 1), obs("u", 1, TransitionKind::Create, None, 0)],
        vec![
            obs("t", 4, TransitionKind::MarkRunning, Some("a"), 2),
            obs("t", 5, TransitionKind::CompleteStep, Some("a"), 2),
        ],
        vec![obs("t", 7, TransitionKind::Completed, None, 0), obs("t", 6, TransitionKind::MarkRunning, Some("b"), 1)],
        vec![
            late,
            obs("u", 3, TransitionKind::Failed, None, 0),
            obs("u", 2, TransitionKind::MarkRunning, Some("a"), 1),
        ],
        vec![obs("u", 4, TransitionKind::MarkRunning, Some("a"), 2)],
    ];
    for b in &batches {
        db.1.write_batch(b).await.unwrap();
        reference.write_batch(b).await.unwrap();
        for key in ["t", "u"] {
            assert_eq!(db.1.snapshot(key).await.unwrap(), reference.snapshot(key).await.unwrap(), "snapshot {key}");
            let q = observer::AttemptQuery { biz_key: Some(key.into()), ..Default::default() };
            assert_eq!(db.1.find_attempts(&q).await.unwrap(), reference.find_attempts(&q).await.unwrap(), "rows {key}");
        }
    }
    assert_eq!(db.1.snapshot("u").await.unwrap().unwrap().finished_at, None, "non-terminal again");
}

/// The ops view answers from the SQLite projection.
#[tokio::test]
async fn ops_view_reads_the_projection() {
    let db = ObsDb::new().await.unwrap();
    db.1.write_batch(&[
        obs("a", 1, TransitionKind::Create, None, 0),
        obs("a", 2, TransitionKind::MarkRunning, Some("fetch"), 1),
        obs("b", 1, TransitionKind::Create, None, 0),
    ])
    .await
    .unwrap();
    let q = observer::SnapshotQuery { step_name: Some("fetch".into()), ..Default::default() };
    let found = db.1.find_snapshots(&q).await.unwrap();
    assert_eq!(found.iter().map(|s| s.biz_key.as_str()).collect::<Vec<_>>(), ["a"]);
    assert_eq!(db.1.find_snapshots(&observer::SnapshotQuery::default()).await.unwrap().len(), 2);
}
