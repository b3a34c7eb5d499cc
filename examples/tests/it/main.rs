//! Integration tests of the kernel on in-memory adapters, driven by the example workflows.

mod crash_sweep;
mod dispatch;
mod story;
