//! The observer's repository conformance suite on PostgreSQL (each case in a fresh schema),
//! the ops view over it, and the refusals particular to PostgreSQL.

use crate::support::TestSchema;
use kernel_core::transition::TransitionKind;
use observer::conformance::{obs, RepositoryFixture};
use observer::{DynRepository, Error, ObservationRepository};
use store_postgres::PostgresObservationRepository;

pub struct ObsDb(pub TestSchema, pub PostgresObservationRepository);

impl ObsDb {
    pub async fn new() -> Option<ObsDb> {
        let t = TestSchema::new().await?;
        let r = PostgresObservationRepository::new(t.pool.clone(), t.config.clone()).expect("repository");
        Some(ObsDb(t, r))
    }
}

#[async_trait::async_trait]
impl RepositoryFixture for ObsDb {
    fn repo(&self) -> &DynRepository {
        &self.1
    }
    async fn teardown(self) {
        self.0.drop_schema().await;
    }
}

async fn fixture(_case: &str) -> Option<ObsDb> {
    ObsDb::new().await
}

mod conformance {
    use super::fixture;
    observer::repository_conformance!(fixture);
}

/// What PostgreSQL cannot store is refused as a record, the batch's other records written;
/// nothing of the refused record is written.
#[tokio::test]
async fn values_postgres_cannot_store_are_invalid_records() {
    let Some(db) = ObsDb::new().await else { return };
    let mut nul = obs("nul", 1, TransitionKind::MarkRunning, Some("s1"), 1);
    nul.worker_id = Some("w\0x".into());
    let mut huge = obs("huge", 1, TransitionKind::Create, None, 0);
    huge.revision = u64::MAX;
    let ok = obs("ok", 1, TransitionKind::MarkRunning, Some("s1"), 1);
    let r = db.1.write_batch(&[nul, huge, ok]).await;
    assert!(matches!(r, Err(Error::InvalidRecord(_))), "{r:?}");
    assert!(db.1.snapshot("nul").await.unwrap().is_none());
    assert!(db.1.snapshot("huge").await.unwrap().is_none());
    assert!(db.1.snapshot("ok").await.unwrap().is_some());
    assert_eq!(db.0.scalar("SELECT count(*) FROM {s}.observation_attempts").await, 1);
    db.0.drop_schema().await;
}

/// An unreachable server is `Unavailable` (retryable), not a refused record.
#[tokio::test]
async fn no_server_is_unavailable() {
    let config =
        store_postgres::PostgresConfig { call_timeout_ms: 500, statement_timeout_ms: 250, ..Default::default() };
    let pool = store_postgres::connect("postgres://postgres@127.0.0.1:1/test", &config).unwrap();
    let repo = PostgresObservationRepository::new(pool, config).unwrap();
    let r = repo.write_batch(&[obs("k", 1, TransitionKind::Create, None, 0)]).await;
    assert!(matches!(&r, Err(e) if e.is_retryable()), "{r:?}");
    let r = repo.snapshot("k").await;
    assert!(matches!(&r, Err(e) if e.is_retryable()), "{r:?}");
}

/// 100 observations through the observer's writer, one PostgreSQL refuses (NUL in its
/// worker id): 99 written, the poison isolated by bisection and nothing of it stored.
#[tokio::test]
async fn poison_in_a_batch_of_100_through_the_writer() {
    use kernel_core::ports::{DynClock, ObservationSink};
    use observer::{Observer, ObserverConfig};
    use std::sync::Arc;
    let Some(db) = ObsDb::new().await else { return };
    let clock = Arc::new(testkit::memory::ManualClock::default());
    let config = ObserverConfig { queue_capacity: 200, batch_size_max: 100, ..ObserverConfig::default() };
    let (observer, writer) = Observer::start(Arc::new(db.1.clone()), clock as Arc<DynClock>, config).expect("observer");
    for i in 0..100u64 {
        let mut o = obs(&format!("k{i:03}"), 1, TransitionKind::MarkRunning, Some("s1"), 1);
        if i == 61 {
            o.worker_id = Some("w\0".into());
        }
        observer.emit(o);
    }
    writer.flush().await.expect("flush");
    let s = observer.stats();
    assert_eq!((s.written, s.poison), (99, 1), "{s:?}");
    assert_eq!(db.0.scalar("SELECT count(*) FROM {s}.observation_snapshots").await, 99);
    assert_eq!(db.0.scalar("SELECT count(*) FROM {s}.observation_attempts").await, 99);
    assert!(db.1.snapshot("k061").await.unwrap().is_none());
    writer.close().await;
    db.0.drop_schema().await;
}

/// The out-of-order property on more seeds than the suite's one.
#[tokio::test]
async fn out_of_order_revisions_keep_the_newest_on_more_seeds() {
    let Some(db) = ObsDb::new().await else { return };
    for seed in [1u64, 2, 3, 0xdead_beef] {
        observer::conformance::out_of_order_revisions_keep_the_newest(&db.1, seed, 3).await;
    }
    db.0.drop_schema().await;
}

/// The same batches written to PostgreSQL and to the in-memory reference leave the same
/// snapshots and attempt rows: terminal times kept across terminal observations and cleared
/// by a later non-terminal one, step maps merged, the earliest `started_at` kept, older
/// revisions ignored.
#[tokio::test]
async fn same_state_as_the_in_memory_reference() {
    let Some(db) = ObsDb::new().await else { return };
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
    let t = db.1.snapshot("t").await.unwrap().unwrap();
    assert_eq!(
        t.finished_at.map(|f| f.as_millis()),
        Some(observer::conformance::T0.as_millis() + 7_000),
        "first terminal time"
    );
    assert_eq!(db.1.snapshot("u").await.unwrap().unwrap().finished_at, None, "non-terminal again");
    db.0.drop_schema().await;
}
