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
    let config = store_postgres::PostgresConfig { call_timeout_ms: 500, ..Default::default() };
    let pool = store_postgres::connect("postgres://postgres@127.0.0.1:1/test", &config).unwrap();
    let repo = PostgresObservationRepository::new(pool, config).unwrap();
    let r = repo.write_batch(&[obs("k", 1, TransitionKind::Create, None, 0)]).await;
    assert!(matches!(&r, Err(e) if e.is_retryable()), "{r:?}");
    let r = repo.snapshot("k").await;
    assert!(matches!(&r, Err(e) if e.is_retryable()), "{r:?}");
}
