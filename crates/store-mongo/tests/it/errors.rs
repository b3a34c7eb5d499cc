//! Driver failures map to the kernel's error semantics (no server needed).

use kernel_core::domain::Instant;
use kernel_core::ports::WorkflowStore;
use kernel_core::transition::{Guard, Transition};
use kernel_core::Error;
use store_mongo::{MongoConfig, MongoWorkflowStore};

/// No server answers: nothing can have happened, for reads and writes alike.
#[tokio::test]
async fn unreachable_server_is_unavailable() {
    // Port 1 is never a MongoDB server; fail fast instead of the default 30 s.
    let db = store_mongo::connect(
        "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200&connectTimeoutMS=200",
        "wfk_unreachable",
    )
    .await
    .expect("a URI parses without a round trip");
    let store = MongoWorkflowStore::without_indexes(&db, MongoConfig::default());
    let read = store.get(&"wf-1".into()).await;
    assert!(matches!(read, Err(Error::Unavailable { .. })), "read: {read:?}");
    let write = store.apply(&"wf-1".into(), &Guard::Active, &Transition::supersede(Instant::from_millis(0))).await;
    assert!(matches!(write, Err(Error::Unavailable { .. })), "write: {write:?}");
    assert!(write.unwrap_err().is_retryable());
}

/// Bad input is rejected before any I/O, so it is `InvalidInput` even without a server.
#[tokio::test]
async fn invalid_input_needs_no_server() {
    let db =
        store_mongo::connect("mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200", "wfk_unreachable").await.unwrap();
    let store = MongoWorkflowStore::without_indexes(&db, MongoConfig::default());
    let r = store.get(&"bad\0id".into()).await;
    assert!(matches!(r, Err(Error::InvalidInput { .. })), "{r:?}");
}

/// The one MongoDB mapping keeps the driver's error as the cause: `source()` of a mapped
/// failure is the `mongodb::error::Error`, and retryability is unchanged (K-6.4).
#[tokio::test]
async fn a_driver_failure_keeps_the_drivers_error_as_its_source() {
    use std::error::Error as _;
    let db = store_mongo::connect(
        "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200&connectTimeoutMS=200",
        "wfk_unreachable",
    )
    .await
    .expect("a URI parses without a round trip");
    let store = MongoWorkflowStore::without_indexes(&db, MongoConfig::default());
    let e = store.get(&"wf-1".into()).await.unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }) && e.is_retryable(), "{e:?}");
    let driver = e.source().and_then(|s| s.downcast_ref::<mongodb::error::Error>()).expect("the driver's error");
    assert_eq!(e.to_string(), format!("unavailable: find instance: {driver}"));

    // A write whose outcome is unknown keeps its cause too, and stays not retryable.
    let io = mongodb::error::Error::custom(std::io::Error::other("reset"));
    let e = store_mongo::error::map(store_mongo::error::Op::Write, "apply", io);
    assert!(matches!(e, Error::Uncertain { .. }) && !e.is_retryable(), "{e:?}");
    assert!(e.source().and_then(|s| s.downcast_ref::<mongodb::error::Error>()).is_some());
}
