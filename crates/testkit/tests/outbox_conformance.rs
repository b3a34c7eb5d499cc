//! The dispatch outbox and candidates conformance suites against the in-memory adapters,
//! directly and through `Arc<dyn …>`.

mod direct {
    use testkit::memory::{InMemoryCandidates, InMemoryOutbox};
    testkit::outbox_conformance!(|| async { Some(InMemoryOutbox::new()) });
    mod candidates {
        use super::*;
        testkit::candidates_conformance!(|| async { Some(InMemoryCandidates::new()) });
    }
}

mod through_arc_dyn {
    use kernel_core::ports::{DynCandidates, DynOutbox};
    use std::sync::Arc;
    use testkit::memory::{InMemoryCandidates, InMemoryOutbox};
    testkit::outbox_conformance!(|| async { Some(Arc::new(InMemoryOutbox::new()) as Arc<DynOutbox>) });
    mod candidates {
        use super::*;
        testkit::candidates_conformance!(|| async { Some(Arc::new(InMemoryCandidates::new()) as Arc<DynCandidates>) });
    }
}
