//! The dead-letter conformance suite against the in-memory adapter, directly and through
//! `Arc<dyn …>` (the way a deployment holds it).

mod direct {
    use testkit::memory::MemoryDeadLetters;
    testkit::dead_letter_conformance!(|| async { Some(MemoryDeadLetters::new()) });
}

mod through_arc_dyn {
    use kernel_core::ports::DynDeadLetters;
    use std::sync::Arc;
    use testkit::memory::MemoryDeadLetters;
    testkit::dead_letter_conformance!(|| async { Some(Arc::new(MemoryDeadLetters::new()) as Arc<DynDeadLetters>) });
}
