//! The store and inbox conformance suites against the in-memory adapters, directly and
//! through `Arc<dyn …>` (the way a deployment holds them).

mod direct {
    use testkit::memory::{InMemoryInbox, InMemoryStore};
    testkit::store_conformance!(|| async { Some(InMemoryStore::new()) });
    mod inbox {
        use super::*;
        testkit::inbox_conformance!(|| async { Some(InMemoryInbox::new()) });
    }
}

mod through_arc_dyn {
    use kernel_core::ports::{DynInbox, DynStore};
    use std::sync::Arc;
    use testkit::memory::{InMemoryInbox, InMemoryStore};
    testkit::store_conformance!(|| async { Some(Arc::new(InMemoryStore::new()) as Arc<DynStore>) });
    mod inbox {
        use super::*;
        testkit::inbox_conformance!(|| async { Some(Arc::new(InMemoryInbox::new()) as Arc<DynInbox>) });
    }
}
