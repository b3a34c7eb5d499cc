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

mod dead_letter {
    use crate::support::DeadLetterDb;
    testkit::dead_letter_conformance!(DeadLetterDb::new);
}

mod task_inbox {
    use crate::support::TaskInboxDb;
    testkit::task_inbox_conformance!(TaskInboxDb::new);
}
