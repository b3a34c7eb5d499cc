//! Conformance suites: one per port, as `pub async fn` cases, plus a macro per suite that
//! expands to one named `#[tokio::test]` per case. Every adapter crate invokes the macro once;
//! the in-memory adapters run it too.
//!
//! Every suite has the same shape. The macro's argument is a factory returning a future of
//! `Option<F>`, where `F` implements the suite's fixture trait (`StoreFixture`,
//! `QueueFixture`, `PermitFixture`, `WakeupFixture`, …): accessors for what the cases take,
//! and an async `teardown` (by default nothing) that runs after the case, also when the case
//! panics; the panic is then resumed. `None` skips the case (the factory prints why). The
//! factory is `|| async { … }`, or `|case: &'static str| async { … }` when the fixture names
//! its namespace after the case (see [`CaseFactory`]).

pub mod cache;
pub mod dead_letter;
pub mod inbox;
pub mod outbox;
pub mod permits;
pub mod queue;
pub mod store;
pub mod task_inbox;
pub mod task_inbox_extra;
pub mod wakeup;

use std::future::Future;

#[doc(hidden)]
pub use futures as __futures;

/// A fixture factory of a conformance macro: a function of no argument, or of the case's name
/// (`&'static str`). `Marker` tells the two apart and is inferred.
pub trait CaseFactory<Marker> {
    /// The future of the fixture (`Option<F>`).
    type Future: Future;
    /// Builds the fixture of `case`.
    fn make(&self, case: &'static str) -> Self::Future;
}

impl<G, Fut> CaseFactory<()> for G
where
    G: Fn() -> Fut,
    Fut: Future,
{
    type Future = Fut;
    fn make(&self, _case: &'static str) -> Fut {
        self()
    }
}

impl<G, Fut> CaseFactory<(&'static str,)> for G
where
    G: Fn(&'static str) -> Fut,
    Fut: Future,
{
    type Future = Fut;
    fn make(&self, case: &'static str) -> Fut {
        self(case)
    }
}

/// Shared expansion of every conformance macro: one test per case, on a fixture from the
/// factory, the case called with the fixture's accessors (`$port`, or `[$port, …]` for a case
/// of several arguments), teardown even when the case panics, then the panic resumed.
/// `@pairs` cases take two fixtures of the same adapter (the factory is called twice, the
/// second time with the case's name and `_twin`). `@multi_thread` runs the cases on a
/// multi-threaded runtime, as a worker does.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    (@pairs $module:ident, $fixture:ident, $port:ident, $factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[::tokio::test]
            async fn $case() {
                use $crate::conformance::__futures::FutureExt as _;
                let factory = $factory;
                let make = |name| $crate::conformance::CaseFactory::make(&factory, name);
                let Some(first) = make(stringify!($case)).await else { return };
                let Some(second) = make(concat!(stringify!($case), "_twin")).await else {
                    // The twin is not available: the first fixture is still cleaned up.
                    $crate::conformance::$module::$fixture::teardown(first).await;
                    return;
                };
                let outcome = ::std::panic::AssertUnwindSafe($crate::conformance::$module::$case(
                    $crate::conformance::$module::$fixture::$port(&first),
                    $crate::conformance::$module::$fixture::$port(&second),
                ))
                .catch_unwind()
                .await;
                $crate::conformance::$module::$fixture::teardown(first).await;
                $crate::conformance::$module::$fixture::teardown(second).await;
                if let Err(panic) = outcome {
                    ::std::panic::resume_unwind(panic);
                }
            }
        )*
    };
    (@multi_thread $module:ident, $fixture:ident, $ports:tt, $factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::__conformance_cases!(@body $module, $fixture, $ports, $factory, $case);
            }
        )*
    };
    (@body $module:ident, $fixture:ident, $port:ident, $factory:expr, $case:ident) => {
        $crate::__conformance_cases!(@body $module, $fixture, [$port], $factory, $case);
    };
    (@body $module:ident, $fixture:ident, [$($port:ident),+], $factory:expr, $case:ident) => {
        use $crate::conformance::__futures::FutureExt as _;
        let Some(fixture) = $crate::conformance::CaseFactory::make(&$factory, stringify!($case)).await else { return };
        let outcome = ::std::panic::AssertUnwindSafe($crate::conformance::$module::$case(
            $($crate::conformance::$module::$fixture::$port(&fixture)),+
        ))
        .catch_unwind()
        .await;
        $crate::conformance::$module::$fixture::teardown(fixture).await;
        if let Err(panic) = outcome {
            ::std::panic::resume_unwind(panic);
        }
    };
    ($module:ident, $fixture:ident, $ports:tt, $factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[::tokio::test]
            async fn $case() {
                $crate::__conformance_cases!(@body $module, $fixture, $ports, $factory, $case);
            }
        )*
    };
}
