//! The conformance suite on the in-memory repository, plus the out-of-order property
//! under proptest.

use observer::conformance::RepositoryFixture;
use observer::{DynRepository, InMemoryObservationRepository};
use proptest::prelude::*;

struct Mem(InMemoryObservationRepository);

#[async_trait::async_trait]
impl RepositoryFixture for Mem {
    fn repo(&self) -> &DynRepository {
        &self.0
    }
    async fn teardown(self) {}
}

async fn fixture(_case: &str) -> Option<Mem> {
    Some(Mem(InMemoryObservationRepository::new()))
}

observer::repository_conformance!(fixture);

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn out_of_order_older_revisions_never_overwrite_newer_snapshots(seed in any::<u64>()) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let repo = InMemoryObservationRepository::new();
            observer::conformance::out_of_order_revisions_keep_the_newest(&repo, seed, 3).await;
        });
    }
}
