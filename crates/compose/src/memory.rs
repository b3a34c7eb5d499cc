//! The `memory:` driver, for demos only: kernel-memory's in-process adapters on the wall clock.
//! Nothing survives the process and nothing is shared with another process, so a
//! separate publisher cannot reach a `memory:` worker.

use crate::{QueueHandle, QueueOptions, QueueSide, StoreHandle, StoreSide};
use kernel_core::ports::SystemClock;
use kernel_memory::{
    InMemoryInbox, InMemoryPermits, InMemoryQueue, InMemoryStore, InMemoryWakeup, MemoryDeadLetters, MemoryResultCache,
    MemoryTaskInbox,
};
use std::sync::Arc;

pub(crate) fn store() -> StoreSide {
    StoreSide {
        store: Arc::new(InMemoryStore::new()),
        inbox: Arc::new(InMemoryInbox::new()),
        dead_letters: Arc::new(MemoryDeadLetters::new()),
        task_inbox: Arc::new(MemoryTaskInbox::new()),
        result_cache: Arc::new(MemoryResultCache::new()),
        scheme: crate::Scheme::Memory,
        handle: StoreHandle::Memory,
    }
}

pub(crate) fn queue(options: &QueueOptions) -> QueueSide {
    let permits = InMemoryPermits::new(Arc::new(SystemClock), options.permit_defaults.clone(), options.permit_lease_ms)
        .with_fallback(options.permit_fallback);
    QueueSide {
        queue: Arc::new(InMemoryQueue::new(options.lane_weights)),
        wakeup: Arc::new(InMemoryWakeup::new()),
        permits: Arc::new(permits),
        scheme: crate::Scheme::Memory,
        handle: QueueHandle::Memory,
    }
}
