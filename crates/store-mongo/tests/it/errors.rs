//! Driver failures map to the kernel's error semantics (no server needed).

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
    assert!(matches!(read, Err(Error::Unavailable(_))), "read: {read:?}");
    let write = store.apply(&"wf-1".into(), &Guard::Active, &Transition::supersede(0)).await;
    assert!(matches!(write, Err(Error::Unavailable(_))), "write: {write:?}");
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
