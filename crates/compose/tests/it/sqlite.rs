//! `sqlite:<path>` and `local`: one file holds the store and the coordination, shared by
//! every deployment (process) that opens it; `local` without a SQLite store stays in the
//! process.

use compose::{ComposeError, Deployment, QueueOptions, QueueSide, Scheme, StoreSide};
use kernel_core::domain::DurationMs;
use kernel_core::engine::{Engine, EngineConfig};
use kernel_core::{Definition, ObjectId, StartRequest, StepDef, StepOutcome, WorkflowStatus};
use serde_json::json;

fn two_steps() -> Definition {
    Definition::builder("hello")
        .step(StepDef::new("a", |_| async { Ok(StepOutcome::complete(json!(1))) }))
        .step(StepDef::new("b", |_| async { Ok(StepOutcome::complete(json!(2))) }).depends_on(["a"]))
        .build()
        .unwrap()
}

fn tables(path: &std::path::Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut stmt = conn.prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name").unwrap();
    stmt.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect()
}

/// A publisher's deployment and a worker's, opened separately on one file (as two processes
/// would): the worker's engine is woken by the publisher's enqueue through the shared lanes
/// and runs the workflow; the store, the lanes and the business table are all in the file.
#[tokio::test]
async fn two_deployments_on_one_file_share_the_store_and_the_lanes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("wf.db");
    let url = format!("sqlite:{}", file.display());
    let publisher = Deployment::connect(&url, "local", &QueueOptions::default()).await.unwrap();
    let worker = Deployment::connect(&url, "local", &QueueOptions::default()).await.unwrap();
    assert_eq!((worker.store.scheme, worker.queue.scheme), (Scheme::Sqlite, Scheme::Local));
    assert_eq!(worker.describe(), "store=sqlite queue=local");
    assert_eq!(worker.queue.key_prefix(), None);

    let config = EngineConfig {
        worker_id: "w".into(),
        poll_interval_ms: DurationMs::from_millis(20),
        ..EngineConfig::default()
    };
    let engine = Engine::builder(worker.ports().build().unwrap()).config(config).register(two_steps()).build().unwrap();
    let running = engine.spawn();
    let side = publisher.publisher_side();
    let start = kernel_core::engine::Publisher::builder(side.store, side.queue, side.wakeup)
        .plan(two_steps().plan().clone())
        .build()
        .unwrap();
    let id =
        start.start_or_resume(StartRequest::new("hello", "hello:1", json!({}))).await.unwrap().instance.workflow_id;
    let mut status = None;
    for _ in 0..500 {
        status = publisher.store.store.get(&id).await.unwrap().map(|i| i.status);
        if status == Some(WorkflowStatus::Completed) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(running.shutdown().await, "clean shutdown");
    assert_eq!(status, Some(WorkflowStatus::Completed), "the worker's deployment ran the publisher's workflow");

    // Everything is in the one file: the store's tables, the coordination tables, and the
    // business table the outbox creates.
    let outbox = worker.store.dispatch_outbox().await.unwrap();
    assert!(outbox.get(&ObjectId::from("none")).await.unwrap().is_none());
    let names = tables(&file);
    for t in ["workflow_instances", "business_objects"] {
        assert!(names.iter().any(|n| n == t), "{t} in {names:?}");
    }
    assert!(names.iter().any(|n| n.starts_with("coord_")), "{names:?}");
    let repo = worker.store.observation_repository().await.unwrap();
    assert!(repo.snapshot("hello:1").await.unwrap().is_none(), "no observer was wired");
}

/// `--queue sqlite:<path>` names the coordination file itself (here another file than the
/// store's); `local` beside a non-SQLite store is in-process coordination.
#[tokio::test]
async fn a_queue_file_of_its_own_and_in_process_local() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("store.db").display());
    let queue_file = dir.path().join("coord.db");
    let d = Deployment::connect(&store, &format!("sqlite:{}", queue_file.display()), &QueueOptions::default())
        .await
        .unwrap();
    assert_eq!(d.queue.scheme, Scheme::Sqlite);
    assert!(tables(&queue_file).iter().all(|n| n.starts_with("coord_")), "only coordination tables in the queue file");
    let local = QueueSide::connect("local", &QueueOptions::default()).await.unwrap();
    assert_eq!(local.scheme, Scheme::Local);
    local.dispatch_candidates().unwrap();
    d.destroy().await.unwrap();
    assert!(!queue_file.exists() && !dir.path().join("store.db").exists(), "destroy removed both files");
}

/// A scratch store is a fresh file beside the one named, removed by `destroy`.
#[tokio::test]
async fn a_scratch_sqlite_store_is_a_fresh_file_that_destroy_removes() {
    let dir = tempfile::tempdir().unwrap();
    let named = dir.path().join("wf.db");
    let store =
        StoreSide::connect_scratch(&format!("sqlite:{}?synchronous=normal", named.display()), "demo").await.unwrap();
    assert!(!named.exists(), "the named file is not touched");
    let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(files.iter().any(|f| f.to_string_lossy().starts_with("demo_")), "{files:?}");
    let kept = store.store.clone();
    store.destroy().await.unwrap();
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the file and its WAL files are gone");
    // A handle kept past destroy gets an error for calls that need a new connection; it
    // never creates the file again.
    for _ in 0..8 {
        let _ = kept.get(&"wf-none".into()).await;
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "no empty file re-created");
}

/// A file that is not a workflow database is refused on connect, naming the file; nothing
/// in it changes.
#[tokio::test]
async fn a_foreign_file_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("other.db");
    std::fs::write(&file, b"not a database at all, just some bytes that are long enough").unwrap();
    let before = std::fs::read(&file).unwrap();
    let e = StoreSide::connect(&format!("sqlite:{}", file.display())).await.unwrap_err();
    assert!(matches!(e, ComposeError::Connect { .. }), "{e:?}");
    assert!(e.to_string().contains("other.db"), "{e}");
    assert_eq!(std::fs::read(&file).unwrap(), before);
}

/// Coordination first, store second, on one file: coord-local keeps its tables apart
/// (`coord_…`, its own version row) precisely so that a store may share the file, and the
/// `local` driver says the store's file is the natural place for it. A process that opened
/// the coordination of `wf.db` before any store did (a publisher-only tool, or a
/// `--queue sqlite:wf.db` deployment later moved to `--store sqlite:wf.db`) must not make
/// the file unusable as a store.
#[tokio::test]
async fn a_store_opens_a_file_whose_coordination_was_created_first() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("wf.db");
    let url = format!("sqlite:{}", file.display());
    let queue = QueueSide::connect(&url, &QueueOptions::default()).await.unwrap();
    assert!(tables(&file).iter().any(|n| n.starts_with("coord_")));
    let store = StoreSide::connect(&url).await;
    assert!(store.is_ok(), "the store refuses a file holding only coordination tables: {:?}", store.err());
    drop(queue);
}

/// The dead letters and the result cache a deployment's ports carry are the store file's:
/// the round trip works, the rows are in that file's tables, and a second deployment on the
/// file (another process) reads them back.
#[tokio::test]
async fn dead_letters_and_the_result_cache_live_in_the_store_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("wf.db");
    let url = format!("sqlite:{}", file.display());
    let d = Deployment::connect(&url, "local", &QueueOptions::default()).await.unwrap();
    let cached_at = crate::ports::round_trip_through_the_ports(&d, "wf-sqlite").await;

    let conn = rusqlite::Connection::open(&file).unwrap();
    for table in [store_sqlite::DEAD_LETTERS, store_sqlite::RESULT_CACHE] {
        let n: i64 = conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0)).unwrap();
        assert_eq!(n, 1, "one row in {table}");
    }
    drop(conn);
    let other = Deployment::connect(&url, "local", &QueueOptions::default()).await.unwrap();
    let ports = other.ports().build().unwrap();
    crate::ports::reads_back(&*ports.dead_letters.unwrap(), &*ports.result_cache.unwrap(), "wf-sqlite", cached_at)
        .await;
    other.destroy().await.unwrap();
    assert!(!file.exists(), "destroy removed the file with the records");
}
