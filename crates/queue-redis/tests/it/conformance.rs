//! The shared queue conformance suite on Redis.

use kernel_core::ports::DynQueue;

impl testkit::conformance::queue::QueueFixture for crate::QueueFixture {
    fn queue(&self) -> &DynQueue {
        &self.queue
    }
}

testkit::queue_conformance!(crate::queue_fixture);
