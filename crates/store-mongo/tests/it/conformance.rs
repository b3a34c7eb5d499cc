//! The testkit conformance suites against MongoDB.

mod store {
    use crate::support::StoreDb;
    testkit::store_conformance!(StoreDb::new);
}

mod inbox {
    use crate::support::InboxDb;
    testkit::inbox_conformance!(InboxDb::new);
}

mod cache {
    use crate::support::CacheDb;
    testkit::result_cache_conformance!(CacheDb::new);
}
