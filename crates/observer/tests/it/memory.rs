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

    /// The range `[prefix, prefix_upper_bound(prefix))` every store queries holds exactly
    /// the strings that start with the prefix, around the surrogate gap and the highest
    /// code point included.
    #[test]
    fn the_prefix_range_is_exactly_starts_with(
        key in prop::collection::vec(prop::sample::select(ALPHABET.to_vec()), 0..6),
        prefix in prop::collection::vec(prop::sample::select(ALPHABET.to_vec()), 1..4),
    ) {
        let (key, prefix): (String, String) = (key.into_iter().collect(), prefix.into_iter().collect());
        let upper = observer::projection::prefix_upper_bound(&prefix);
        let in_range = key >= prefix && upper.as_ref().is_none_or(|u| key < *u);
        prop_assert_eq!(in_range, key.starts_with(&prefix), "key {:?} prefix {:?} bound {:?}", key, prefix, upper);
        // Strings compare as their UTF-8 bytes do, the order of SQLite, PostgreSQL "C" and MongoDB.
        if let Some(u) = &upper {
            prop_assert_eq!(key.as_bytes() < u.as_bytes(), key < *u);
        }
    }
}

/// Characters around the edges of the code point range.
const ALPHABET: [char; 8] = ['a', 'b', '%', '\u{7f}', '\u{d7ff}', '\u{e000}', '\u{fffd}', '\u{10ffff}'];
