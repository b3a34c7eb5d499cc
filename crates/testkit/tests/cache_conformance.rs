//! The result-cache conformance suite against the in-memory adapter, directly and through
//! `Arc<dyn ResultCache>` (the way a deployment holds it).

mod direct {
    use testkit::memory::MemoryResultCache;
    testkit::result_cache_conformance!(|| async { Some(MemoryResultCache::new()) });
}

mod through_arc_dyn {
    use kernel_core::ports::DynResultCache;
    use std::sync::Arc;
    use testkit::memory::MemoryResultCache;
    testkit::result_cache_conformance!(|| async { Some(Arc::new(MemoryResultCache::new()) as Arc<DynResultCache>) });
}
