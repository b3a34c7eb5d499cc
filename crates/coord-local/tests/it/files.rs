//! Opening files: refusals that change nothing, sharing a file with a store, racing
//! migrations, a locked file, and the wakeup task's lifetime.

use crate::fresh;
use coord_local::{LocalConfig, LocalCoord, SCHEMA_VERSION, SUBSCRIBERS_MAX};
use kernel_core::domain::{DurationMs, Instant, Priority};
use kernel_core::ports::{ReadyQueue, Wakeup};
use kernel_core::Error;
use std::time::Duration;

fn schema_version(path: &std::path::Path) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row("SELECT value FROM coord_meta WHERE key = 'schema_version'", [], |r| r.get(0)).unwrap()
}

#[tokio::test]
async fn a_file_that_is_not_a_database_is_refused_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    let bytes: Vec<u8> = b"these are somebody's notes, not a database\n".repeat(200);
    std::fs::write(&path, &bytes).unwrap();
    let e = LocalCoord::open(&path, LocalConfig::default()).await.expect_err("not a database");
    assert!(matches!(e, Error::InvalidInput { .. }), "{e:?}");
    assert!(e.to_string().contains("notes.txt"), "names the file: {e}");
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "nothing changed");
}

#[tokio::test]
async fn a_newer_schema_is_refused_naming_file_and_versions() {
    let (coord, dir) = fresh(LocalConfig::default()).await;
    coord.queue().enqueue(&"wf-1".into(), Priority::P1, Instant::ZERO).await.unwrap();
    let path = coord.path().unwrap().to_path_buf();
    drop(coord);
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute("UPDATE coord_meta SET value = ?1 WHERE key = 'schema_version'", [SCHEMA_VERSION + 1]).unwrap();
    }
    let e = LocalCoord::open(&path, LocalConfig::default()).await.expect_err("newer schema");
    let msg = e.to_string();
    assert!(matches!(e, Error::InvalidInput { .. }), "{e:?}");
    assert!(msg.contains("coord.db"), "names the file: {msg}");
    assert!(
        msg.contains(&format!("version {}", SCHEMA_VERSION + 1)) && msg.contains(&format!("version {SCHEMA_VERSION}")),
        "{msg}"
    );
    assert_eq!(schema_version(&path), SCHEMA_VERSION + 1, "nothing changed");
    let conn = rusqlite::Connection::open(&path).unwrap();
    let n: i64 = conn.query_row("SELECT count(*) FROM coord_lane", [], |r| r.get(0)).unwrap();
    assert_eq!(n, 1, "the lanes are untouched");
    drop(dir);
}

#[tokio::test]
async fn a_store_shares_the_file_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wf.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "PRAGMA user_version = 7; CREATE TABLE workflow_instances (workflow_id TEXT PRIMARY KEY, doc TEXT);
             INSERT INTO workflow_instances VALUES ('wf-1', '{}');",
        )
        .unwrap();
    }
    let coord = LocalCoord::open(&path, LocalConfig::default()).await.expect("open");
    coord.queue().enqueue(&"wf-1".into(), Priority::P0, Instant::ZERO).await.unwrap();
    let conn = rusqlite::Connection::open(&path).unwrap();
    let user_version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    assert_eq!(user_version, 7, "SQLite's user_version is the store's");
    let n: i64 = conn.query_row("SELECT count(*) FROM workflow_instances", [], |r| r.get(0)).unwrap();
    assert_eq!(n, 1);
    assert_eq!(schema_version(&path), SCHEMA_VERSION);
    let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
    assert_eq!(mode, "wal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_openings_migrate_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("race.db");
    let opens = (0..6).map(|_| LocalCoord::open(path.clone(), LocalConfig::default()));
    let coords: Vec<LocalCoord> =
        futures::future::join_all(opens).await.into_iter().map(|r| r.expect("open")).collect();
    assert_eq!(schema_version(&path), SCHEMA_VERSION);
    coords[0].queue().enqueue(&"wf".into(), Priority::P2, Instant::ZERO).await.unwrap();
    assert_eq!(coords[5].queue().pop_due(Instant::ZERO, 1).await.unwrap(), vec!["wf"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_locked_past_the_busy_timeout_is_unavailable_and_nothing_is_written() {
    let config = LocalConfig {
        busy_timeout_ms: DurationMs::from_millis(200),
        call_timeout_ms: DurationMs::from_millis(5_000),
        ..LocalConfig::default()
    };
    let (coord, _dir) = fresh(config).await;
    let other = rusqlite::Connection::open(coord.path().unwrap()).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let q = coord.queue();
    let started = std::time::Instant::now();
    let e = q.enqueue(&"wf-1".into(), Priority::P1, Instant::ZERO).await.expect_err("locked");
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    assert!(e.to_string().contains("locked"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(5), "answered before the call deadline");
    let e = q.pop_due(Instant::ZERO, 8).await.expect_err("locked");
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    other.execute_batch("ROLLBACK").unwrap();
    assert_eq!(q.stats(Instant::ZERO).await.unwrap().map(|s| s.depth), [0; 4], "nothing written");
    q.enqueue(&"wf-1".into(), Priority::P1, Instant::ZERO).await.expect("unlocked");
}

#[tokio::test]
async fn the_polling_task_ends_with_its_last_receiver() {
    let (coord, _dir) = fresh(LocalConfig::default()).await;
    let w = coord.wakeup();
    assert!(!w.polling());
    let a = w.subscribe().await.unwrap();
    let b = coord.wakeup().subscribe().await.unwrap();
    assert!(w.polling());
    assert_eq!(w.subscribers(), 2);
    drop(a);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(w.polling(), "one receiver is left");
    drop(b);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while w.polling() {
        assert!(std::time::Instant::now() < deadline, "the polling task outlived its receivers");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(w.subscribers(), 0);
    let mut again = w.subscribe().await.unwrap();
    assert!(w.polling(), "a new subscription starts a new task");
    w.notify().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), again.recv()).await.expect("ring").expect("open");
}

#[tokio::test]
async fn subscriptions_are_bounded() {
    let coord = LocalCoord::in_memory(LocalConfig::default()).await.unwrap();
    let w = coord.wakeup();
    let mut rxs = Vec::new();
    for _ in 0..SUBSCRIBERS_MAX {
        rxs.push(w.subscribe().await.expect("within the limit"));
    }
    let e = w.subscribe().await.expect_err("over the limit");
    assert!(matches!(e, Error::LimitExceeded { .. }), "{e:?}");
    rxs.pop();
    w.subscribe().await.expect("a dropped receiver frees its place");
}

/// Every call answers by its deadline: one waits out the busy timeout (`Unavailable`,
/// nothing written); the one queued behind it starts, is still waiting for the lock at its
/// deadline and is answered `Uncertain` (a started write), not left hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_write_past_its_deadline_is_uncertain() {
    let config = LocalConfig {
        // `b` starts when `a` gives up (1 s) and would give up at 2 s: its deadline,
        // 1.5 s, falls in between with 0.5 s of slack on either side.
        busy_timeout_ms: DurationMs::from_millis(1_000),
        call_timeout_ms: DurationMs::from_millis(1_500),
        ..LocalConfig::default()
    };
    let (coord, _dir) = fresh(config).await;
    let other = rusqlite::Connection::open(coord.path().unwrap()).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let q = coord.queue();
    let (id_a, id_b) = ("wf-a".into(), "wf-b".into());
    let started = std::time::Instant::now();
    let (a, b) = tokio::join!(q.enqueue(&id_a, Priority::P1, Instant::ZERO), async {
        // Queued behind `a` on the connection.
        tokio::time::sleep(Duration::from_millis(50)).await;
        q.enqueue(&id_b, Priority::P1, Instant::ZERO).await
    });
    let elapsed = started.elapsed();
    let a = a.expect_err("locked");
    let b = b.expect_err("past its deadline");
    assert!(matches!(a, Error::Unavailable { .. }) && a.to_string().contains("locked"), "{a:?}");
    assert!(matches!(b, Error::Uncertain { .. }) && b.to_string().contains("no answer within 1500 ms"), "{b:?}");
    assert!(
        elapsed < Duration::from_millis(2_000),
        "answered at the deadline, not after the busy timeout: {elapsed:?}"
    );
    other.execute_batch("ROLLBACK").unwrap();
    assert_eq!(q.stats(Instant::ZERO).await.unwrap().map(|s| s.depth), [0; 4], "nothing written");
}

/// Tests in paused tokio time (simulated) can use the adapter: the call deadline does not
/// fire while a call runs on the blocking pool.
#[tokio::test(start_paused = true)]
async fn paused_tokio_time_does_not_expire_calls() {
    let (coord, _dir) = fresh(LocalConfig::default()).await;
    let q = coord.queue();
    for i in 0..50 {
        q.enqueue(&format!("wf-{i}").into(), Priority::P2, Instant::ZERO).await.expect("enqueue");
    }
    assert_eq!(q.pop_due(Instant::ZERO, 100).await.expect("pop").len(), 50);
}
