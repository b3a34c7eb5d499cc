//! The in-memory adapters, re-exported from the `kernel-memory` crate where they live (a
//! production crate: `compose` serves `memory:` with them), so tests keep importing
//! `testkit::memory::…`. The fault and crash decorators that wrap them are in
//! [`faults`](crate::faults) and [`port_faults`](crate::port_faults).

pub use kernel_memory::*;
