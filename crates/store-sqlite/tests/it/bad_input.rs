//! Bad input and faults: a file that is not ours or of a newer schema, migrations racing,
//! a read-only file, a lock held by another connection, oversize values, NUL and integers
//! SQLite cannot hold. Each refusal is typed and leaves the file as it was.

use crate::support::{config, TestDb};
use kernel_core::domain::*;
use kernel_core::ports::{
    ClaimSpec, CreateOutcome, SignalInbox, SignalRecord, SignalStatus, WorkflowStore, WriteOutcome,
};
use kernel_core::transition::{Guard, Transition};
use kernel_core::Error;
use serde_json::json;
use store_sqlite::{Limits, SqliteConfig, SqliteDb, SqliteWorkflowStore, SCHEMA_VERSION};

const T0: Instant = Instant::from_millis(1_700_000_000_000);

fn running(id: &str) -> WorkflowInstance {
    let mut w = testkit::conformance::store::claimed(id, "tok");
    w.steps = vec![Step::pending("fetch"), Step::pending("publish")];
    w.output = Default::default();
    w
}

/// The file's bytes (and its WAL's, if any), to show nothing changed.
fn bytes(path: &std::path::Path) -> (Vec<u8>, Option<Vec<u8>>) {
    let wal = path.with_extension("db-wal");
    (std::fs::read(path).unwrap(), std::fs::read(wal).ok().filter(|w| !w.is_empty()))
}

fn conflict_message(r: kernel_core::Result<SqliteDb>) -> String {
    match r {
        Err(Error::Conflict(m)) => m,
        other => panic!("expected Conflict, got {other:?}"),
    }
}

/// Another application's SQLite database is refused, naming the file and what it holds;
/// not a byte of it changes (no WAL switch, no table, no header write).
#[tokio::test]
async fn a_database_that_is_not_ours_is_refused_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("theirs.db");
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch(
            "CREATE TABLE invoices (id INTEGER PRIMARY KEY, total INTEGER); INSERT INTO invoices VALUES (1, 10);",
        )
        .unwrap();
    }
    let before = bytes(&path);
    let m = conflict_message(SqliteDb::open(&path, config()).await);
    assert!(m.contains(&path.display().to_string()) && m.contains("not a workflow-kernel database"), "{m}");
    assert!(m.contains("application_id 0x0") && m.contains("user_version 0"), "{m}");
    assert_eq!(bytes(&path), before, "nothing changed");
    // A file that is not a database at all: Corrupt, naming the file, unchanged.
    let junk = dir.path().join("notes.db");
    std::fs::write(&junk, "these are my notes, not a database; ".repeat(200)).unwrap();
    let before = bytes(&junk);
    match SqliteDb::open(&junk, config()).await {
        Err(Error::Corrupt { message, .. }) => assert!(message.contains("notes.db"), "{message}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(bytes(&junk), before, "nothing changed");
}

/// A file of a newer schema version is refused naming the file and both versions; nothing
/// is migrated or changed. Reopening at the current version migrates nothing.
#[tokio::test]
async fn a_newer_schema_version_is_refused_unchanged() {
    let t = TestDb::new().await;
    let path = t.db.path().to_path_buf();
    assert_eq!(t.db.migrate().await.unwrap(), Vec::<u32>::new(), "idempotent");
    drop(t.db);
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch(&format!("PRAGMA user_version = {}; PRAGMA wal_checkpoint(TRUNCATE);", SCHEMA_VERSION + 7))
            .unwrap();
    }
    let before = bytes(&path);
    let m = conflict_message(SqliteDb::open(&path, config()).await);
    assert!(m.contains(&path.display().to_string()), "{m}");
    assert!(m.contains(&format!("schema version {}", SCHEMA_VERSION + 7)), "{m}");
    assert!(m.contains(&format!("version {SCHEMA_VERSION} this build knows")), "{m}");
    assert_eq!(bytes(&path), before, "nothing changed");
}

/// Eight openers race on one new file (one thread and connection each, as separate
/// processes would): exactly one applies the migrations, the others wait for its
/// transaction and find nothing to do; the schema is there once.
#[tokio::test]
async fn racing_migrations_apply_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("race.db");
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (path, barrier) = (path.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                store_sqlite::migrate(&path, &config())
            })
        })
        .collect();
    let mut applied: Vec<Vec<u32>> = threads.into_iter().map(|t| t.join().unwrap().expect("migrate")).collect();
    applied.sort();
    let all: Vec<u32> = store_sqlite::MIGRATIONS.iter().map(|m| m.0).collect();
    assert_eq!(applied.iter().filter(|a| !a.is_empty()).count(), 1, "{applied:?}");
    assert_eq!(applied.last().unwrap(), &all);
    let c = rusqlite::Connection::open(&path).unwrap();
    let tables: i64 = c
        .query_row("SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'workflow_instances'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(tables, 1);
    let v: i64 = c.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    assert_eq!(v, i64::from(SCHEMA_VERSION));
    let mode: String = c.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
    assert_eq!(mode, "wal");
}

/// A read-only file: every write is a typed, retryable `Unavailable` (SQLITE_READONLY,
/// the statement rolled back) and the workflow state is unchanged; reads work.
#[tokio::test]
async fn a_read_only_file_refuses_writes_and_keeps_the_state() {
    let t = TestDb::new().await;
    let store = t.store();
    assert!(matches!(store.create(running("wf-1")).await.unwrap(), CreateOutcome::Created(_)));
    let before = store.get(&"wf-1".into()).await.unwrap().unwrap();
    let ro = SqliteDb::open(t.db.path(), SqliteConfig { read_only: true, ..config() }).await.expect("read-only open");
    let ro_store = SqliteWorkflowStore::new(ro);
    assert_eq!(ro_store.get(&"wf-1".into()).await.unwrap().as_ref(), Some(&before), "reads work");
    let r =
        ro_store.apply(&"wf-1".into(), &Guard::Running { token: "tok".into() }, &Transition::mark_running(0, T0)).await;
    match &r {
        Err(e @ Error::Unavailable { message, .. }) => {
            assert!(e.is_retryable());
            assert!(
                message.contains("readonly") || message.contains("read-only") || message.contains("read only"),
                "{message}"
            );
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let r = ro_store.create(running("wf-2")).await;
    assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
    assert_eq!(store.get(&"wf-1".into()).await.unwrap(), Some(before), "state unchanged");
    assert!(store.get(&"wf-2".into()).await.unwrap().is_none());
    // A file whose schema is behind cannot be opened read-only (it cannot be migrated).
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.db");
    rusqlite::Connection::open(&empty).unwrap().execute_batch("PRAGMA user_version = 0").unwrap();
    let r = SqliteDb::open(&empty, SqliteConfig { read_only: true, ..config() }).await;
    assert!(matches!(r, Err(Error::Conflict(_))), "{r:?}");
}

/// Another connection (or process) holding the write lock past the busy timeout: the
/// write is `Unavailable` after waiting, nothing written; once the lock is released the
/// same write succeeds.
#[tokio::test]
async fn a_lock_held_past_the_busy_timeout_is_unavailable() {
    let t = TestDb::with(SqliteConfig { busy_timeout_ms: 200, call_timeout_ms: 2_000, ..config() }).await;
    let store = t.store();
    store.create(running("wf-1")).await.unwrap();
    let holder = rusqlite::Connection::open(t.db.path()).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = std::time::Instant::now();
    let guard = Guard::Running { token: "tok".into() };
    let r = store.apply(&"wf-1".into(), &guard, &Transition::mark_running(0, T0)).await;
    assert!(matches!(&r, Err(e @ Error::Unavailable { .. }) if e.is_retryable()), "{r:?}");
    assert!(started.elapsed() >= std::time::Duration::from_millis(150), "waited for the lock");
    holder.execute_batch("ROLLBACK").unwrap();
    assert_eq!(store.get(&"wf-1".into()).await.unwrap().unwrap().revision, 5, "nothing written");
    let r = store.apply(&"wf-1".into(), &guard, &Transition::mark_running(0, T0)).await.unwrap();
    assert_eq!(r, WriteOutcome::Applied { revision: 6 });
}

fn invalid_field<T: std::fmt::Debug>(r: kernel_core::Result<T>) -> String {
    match r {
        Err(Error::InvalidInput { field, .. }) => field,
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

/// Oversize values are refused before anything is written: a payload over the payload
/// limit, a statement over the statement limit, and — through the table's CHECK
/// constraint — an instance that would grow past 16 MiB of JSON, refused by SQLite with
/// nothing written.
#[tokio::test]
async fn oversize_values_are_refused_and_nothing_written() {
    let t = TestDb::new().await;
    let store = t.store();
    store.create(running("wf-1")).await.unwrap();
    let guard = Guard::Running { token: "tok".into() };
    let big = json!("x".repeat(kernel_core::validate::STORE_PAYLOAD_BYTES_MAX + 1));
    let r = store
        .apply(
            &"wf-1".into(),
            &guard,
            &Transition::complete_step(0, "fetch", big, DurationMs::from_millis(1), T0, false),
        )
        .await;
    assert!(invalid_field(r).starts_with("output"));
    assert_eq!(store.get(&"wf-1".into()).await.unwrap().unwrap().revision, 5);

    // The 16 MiB document limit, enforced by SQLite itself: limits raised so that only the
    // table's CHECK constraint stands in the way of a sixth 3 MiB output.
    let limits = Limits { payload_bytes_max: 4 << 20, document_bytes_max: 5 << 20 };
    let t = TestDb::with(SqliteConfig { limits, ..config() }).await;
    let store = t.store();
    let mut w = running("wf-big");
    w.steps = (0..8).map(|i| Step::pending(format!("s{i}"))).collect();
    store.create(w).await.unwrap();
    let chunk = json!("y".repeat(3 << 20));
    let mut refused = None;
    for i in 0..8usize {
        let step = format!("s{i}");
        let tr = Transition::complete_step(i, &step, chunk.clone(), DurationMs::from_millis(1), T0, false);
        match store.apply(&"wf-big".into(), &guard, &tr).await {
            Ok(WriteOutcome::Applied { .. }) => {}
            Err(Error::InvalidInput { field, .. }) => {
                refused = Some((i, field));
                break;
            }
            other => panic!("step {i}: {other:?}"),
        }
    }
    let (i, field) = refused.expect("refused before 24 MiB");
    assert_eq!((i, field.as_str()), (5, "document"), "the sixth 3 MiB output passes 16 MiB");
    let inst = store.get(&"wf-big".into()).await.unwrap().unwrap();
    assert_eq!(inst.output.len(), 5, "nothing of the refused write");
    assert_eq!(inst.revision, 5 + 5);
}

/// Integers beyond the signed 64-bit range and NUL in a key or a string (K-2.0's rule, the
/// same on every store) are refused naming the field, nothing written. (An output name with
/// quotes or backslashes is admitted, as on every store: the store conformance suite's
/// `k2_0_names_with_*` cases.)
#[tokio::test]
async fn out_of_range_integers_and_nul_are_refused() {
    let t = TestDb::new().await;
    let store = t.store();
    store.create(running("wf-1")).await.unwrap();
    let guard = Guard::Running { token: "tok".into() };
    let step = |v| Transition::complete_step(0, "fetch", v, DurationMs::from_millis(1), T0, false);
    assert!(invalid_field(store.apply(&"wf-1".into(), &guard, &step(json!(u64::MAX))).await).starts_with("output"));
    assert_eq!(store.get(&"wf-1".into()).await.unwrap().unwrap().revision, 5, "nothing written");
    // NUL in an object key is K-2.0's refusal, the same in every store.
    assert_eq!(invalid_field(store.apply(&"wf-1".into(), &guard, &step(json!({"k\u{0}": 1}))).await), "output.fetch");
    let nul = json!({"a": "x\u{0}y", "k": ["\u{0}"]});
    assert_eq!(invalid_field(store.apply(&"wf-1".into(), &guard, &step(nul)).await), "output.fetch");
    assert_eq!(store.get(&"wf-1".into()).await.unwrap().unwrap().revision, 5, "nothing written");
    let mut w = running("wf-2");
    w.revision = u64::MAX;
    assert_eq!(invalid_field(store.create(w).await), "revision");
    let mut w = running("wf-3");
    w.input = json!({"n": "a\u{0}"});
    assert_eq!(invalid_field(store.create(w).await), "input");
    assert!(store.get(&"wf-3".into()).await.unwrap().is_none());
    assert!(store.get(&"wf-2".into()).await.unwrap().is_none());
    let inbox = t.inbox();
    let rec = SignalRecord {
        signal_id: "sig-1".into(),
        workflow_id: "wf-1".into(),
        signal_type: "approved".into(),
        wait_key: "k".into(),
        generation: u64::MAX,
        status: SignalStatus::Pending,
        created_at: T0,
        match_time: None,
        orphan: false,
    };
    assert_eq!(invalid_field(inbox.insert(rec).await), "generation");
    assert_eq!(t.scalar("SELECT count(*) FROM signal_inbox"), 0);
    // Integers at the edges of the range are held exactly.
    let mut w = running("wf-4");
    w.input = json!({"min": i64::MIN, "max": i64::MAX});
    store.create(w).await.unwrap();
    let spec =
        ClaimSpec { now: T0, lease_ms: DurationMs::from_millis(1), token: "t2".into(), types: vec!["summary".into()] };
    let _ = store.claim(&"wf-4".into(), &spec).await.unwrap();
    assert_eq!(store.get(&"wf-4".into()).await.unwrap().unwrap().input, json!({"min": i64::MIN, "max": i64::MAX}));
}

/// A NUL inside a JSON value is kept escaped and read back whole by the bundled SQLite's
/// JSON functions (which the guards read strings with): `"x\u0000y"` is not `"x"`. The
/// store never writes one (K-2.0 refuses it for every store); this pins what the library
/// would do with a file written by something else.
#[test]
fn sqlite_keeps_nul_inside_json_strings() {
    let c = rusqlite::Connection::open_in_memory().unwrap();
    let (v, same): (String, bool) = c
        .query_row(r#"SELECT '{"a":"x\u0000y"}' ->> '$.a', ('{"a":"x\u0000y"}' ->> '$.a') = 'x'"#, [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!((v.as_str(), same), ("x\0y", false));
}

/// Every call has a deadline, the wait for a pooled connection included: with one pooled
/// connection and the write lock held elsewhere, the first write fails after the busy
/// timeout (`Unavailable`), the second — which waited for the connection first — reaches
/// the call deadline while waiting for the lock and is interrupted (`Uncertain`: a write
/// past its deadline may have committed; here it did not). The busy timeout must be
/// shorter than the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_past_their_deadline_are_interrupted() {
    let bad = SqliteConfig { busy_timeout_ms: 1_000, call_timeout_ms: 1_000, ..config() };
    assert_eq!(invalid_field(SqliteDb::open("unused.db", bad).await), "call_timeout_ms");
    let t =
        TestDb::with(SqliteConfig { busy_timeout_ms: 800, call_timeout_ms: 1_200, pool_size_max: 1, ..config() }).await;
    let store = t.store();
    store.create(running("wf-1")).await.unwrap();
    let holder = rusqlite::Connection::open(t.db.path()).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let guard = Guard::Running { token: "tok".into() };
    let id: kernel_core::WorkflowId = "wf-1".into();
    let (t0, t1) = (Transition::mark_running(0, T0), Transition::mark_running(1, T0));
    let started = std::time::Instant::now();
    let (a, b) = tokio::join!(store.apply(&id, &guard, &t0), store.apply(&id, &guard, &t1));
    let elapsed = started.elapsed();
    let mut outcomes = [&a, &b].map(|r| match r {
        Err(Error::Unavailable { .. }) => "unavailable",
        Err(Error::Uncertain { .. }) => "uncertain",
        other => panic!("{other:?}"),
    });
    outcomes.sort();
    assert_eq!(outcomes, ["unavailable", "uncertain"], "{a:?} {b:?}");
    assert!(elapsed < std::time::Duration::from_millis(2_500), "bounded by the deadline: {elapsed:?}");
    holder.execute_batch("ROLLBACK").unwrap();
    let inst = store.get(&"wf-1".into()).await.unwrap().unwrap();
    assert_eq!(inst.revision, 5, "nothing written");
    assert_eq!(
        store.apply(&"wf-1".into(), &guard, &Transition::mark_running(0, T0)).await.unwrap(),
        WriteOutcome::Applied { revision: 6 },
        "the pooled connection serves again"
    );
}

/// A small filesystem of its own (tmpfs), unmounted when dropped.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    /// Mount a `bytes`-sized tmpfs on a fresh directory; `Err` with the reason when this
    /// process may not mount (not root, or no tmpfs).
    fn mount(bytes: usize) -> Result<SmallDisk, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            return Err(format!("mount -t tmpfs: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(SmallDisk { dir })
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(self.dir.path()).status();
    }
}

/// A full disk (a 2 MiB filesystem of the test's own): the create and the guarded write
/// that do not fit are typed errors (`Unavailable`, SQLite's `SQLITE_FULL`), nothing of
/// them is written, and every instance keeps its committed state; once space is freed the
/// same write applies. Needs permission to mount (root); skipped otherwise, failed under CI.
#[tokio::test]
async fn a_full_disk_is_unavailable_and_the_state_unchanged() {
    let test = "a_full_disk_is_unavailable_and_the_state_unchanged";
    let disk = match SmallDisk::mount(2 * 1024 * 1024) {
        Ok(d) => d,
        Err(reason) => {
            return testkit::ci::skip_or_fail(test, &format!("cannot mount a small filesystem: {reason}")).unwrap_or(())
        }
    };
    // Ballast that the test removes at the end to make room again.
    let ballast = disk.dir.path().join("ballast");
    std::fs::write(&ballast, vec![0u8; 768 * 1024]).unwrap();
    let path = disk.dir.path().join("wf.db");
    let db = SqliteDb::open(&path, config()).await.expect("open on the small disk");
    let store = SqliteWorkflowStore::new(db.clone());
    store.create(running("wf-0")).await.unwrap();
    let guard = Guard::Running { token: "tok".into() };
    let filler = |i: usize| json!(format!("{i:06}").repeat(100 * 1024 / 6));
    // Fill the disk: ~100 KiB instances until one does not fit.
    let mut created = Vec::new();
    let mut full = None;
    for i in 1..=64 {
        let mut w = running(&format!("wf-{i}"));
        w.input = filler(i);
        match store.create(w).await {
            Ok(CreateOutcome::Created(_)) => created.push(i),
            Ok(other) => panic!("create wf-{i}: {other:?}"),
            Err(e) => {
                full = Some((i, e));
                break;
            }
        }
    }
    let (i, e) = full.expect("a 2 MiB disk fills before 64 instances of 100 KiB");
    assert!(matches!(e, Error::Unavailable { .. }), "a full disk is Unavailable: {e:?}");
    assert!(created.len() >= 2, "some instances fit first: {created:?}");
    assert!(store.get(&format!("wf-{i}").as_str().into()).await.unwrap().is_none(), "the refused create wrote nothing");
    for &c in &created {
        let w = store.get(&format!("wf-{c}").as_str().into()).await.unwrap().expect("committed instance kept");
        assert_eq!(w.input, filler(c), "wf-{c} intact");
    }
    // Top the disk up with small instances until even those do not fit.
    let mut small = 0;
    for j in 0..256 {
        let mut w = running(&format!("small-{j}"));
        w.input = json!("s".repeat(8 * 1024));
        if store.create(w).await.is_err() {
            break;
        }
        small += 1;
    }
    assert!(small < 256, "the disk filled up");
    // A guarded write that needs room: refused, the instance unchanged.
    let before = store.get(&"wf-0".into()).await.unwrap().unwrap();
    let big_output = json!("b".repeat(kernel_core::validate::STORE_PAYLOAD_BYTES_MAX - 16));
    let big = Transition::complete_step(0, "fetch", big_output, DurationMs::from_millis(1), T0, false);
    let r = store.apply(&"wf-0".into(), &guard, &big).await;
    assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
    assert_eq!(store.get(&"wf-0".into()).await.unwrap().unwrap(), before, "state unchanged");
    // Room again (the ballast file removed): the same write applies.
    std::fs::remove_file(&ballast).unwrap();
    let r = store.apply(&"wf-0".into(), &guard, &big).await.unwrap();
    assert_eq!(r, WriteOutcome::Applied { revision: before.revision + 1 });
    drop(store);
    drop(db);
}

/// A call whose deadline passes before its blocking task even started (every blocking
/// thread busy) never runs: the caller is told `Unavailable` — nothing written — and indeed
/// nothing is written once a thread frees up. (Answering `Uncertain` and then committing
/// later would be allowed by K-6.4 but would end a claim for nothing.)
#[test]
fn a_call_past_its_deadline_before_it_started_never_runs() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let t = TestDb::with(SqliteConfig { busy_timeout_ms: 50, call_timeout_ms: 200, ..config() }).await;
        let store = t.store();
        // The one blocking thread is busy for 600 ms.
        let blocker = tokio::task::spawn_blocking(|| std::thread::sleep(std::time::Duration::from_millis(600)));
        let r = store.create(running("wf-late")).await;
        assert!(matches!(&r, Err(e @ Error::Unavailable { .. }) if e.is_retryable()), "{r:?}");
        blocker.await.unwrap();
        // Give the abandoned task its turn on the freed thread.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(store.get(&"wf-late".into()).await.unwrap().is_none(), "the abandoned create never ran");
    });
}

/// An existing file of schema version 8 (before `operator_request`), holding an instance,
/// is upgraded by `migrate`: only version 9 is applied, the instance reads back as it was
/// with no request pending, and a request (K-6.8) can then be written to it.
#[tokio::test]
async fn a_version_8_file_is_upgraded_and_keeps_its_instances() {
    use kernel_core::operator_request::{OperatorRequest, RequestedAction};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v8.db");
    let inst = running("wf-1");
    {
        // The file as the previous release left it: migrations 1 to 8 and their header.
        let mut c = rusqlite::Connection::open(&path).unwrap();
        let tx = c.transaction().unwrap();
        for (_, _, sql) in store_sqlite::MIGRATIONS.iter().filter(|(v, _, _)| *v <= 8) {
            tx.execute_batch(sql).unwrap();
        }
        tx.execute_batch(&format!(
            "PRAGMA application_id = {}; PRAGMA user_version = 8;",
            store_sqlite::APPLICATION_ID
        ))
        .unwrap();
        tx.execute(
            "INSERT INTO workflow_instances (workflow_id, biz_key, workflow_type, status, claimable_time, claim_token, \
             business_priority, revision, retry_count, prepare_failures, definition_fingerprint, created_at, \
             updated_at, steps, input, output) \
             VALUES (?1, ?2, ?3, 'running', ?4, 'tok', 2, ?5, 0, 0, ?6, ?7, ?8, ?9, ?10, ?11)",
            rusqlite::params![
                inst.workflow_id.as_str(),
                inst.biz_key,
                inst.workflow_type,
                inst.claimable_time.unwrap().as_millis(),
                inst.revision as i64,
                inst.definition_fingerprint,
                inst.created_at.as_millis(),
                inst.updated_at.as_millis(),
                serde_json::to_string(&inst.steps).unwrap(),
                inst.input.to_string(),
                serde_json::to_string(&inst.output).unwrap(),
            ],
        )
        .unwrap();
        tx.commit().unwrap();
    }
    assert_eq!(store_sqlite::migrate(&path, &config()).unwrap(), vec![9, 10], "only the newer versions are applied");
    let store = SqliteWorkflowStore::new(SqliteDb::open(&path, config()).await.expect("open"));
    assert_eq!(store.get(&"wf-1".into()).await.unwrap(), Some(inst.clone()), "the instance reads back as it was");
    let req = OperatorRequest {
        id: "req-1".into(),
        action: RequestedAction::Regenerate { step: "fetch".into() },
        holder: "tok".into(),
        requested_at: T0,
    };
    let t = Transition::operator_request(req.clone(), "tok-2".into(), T0);
    let r = store.apply(&"wf-1".into(), &Guard::Token { token: "tok".into() }, &t).await.unwrap();
    assert_eq!(r, WriteOutcome::Applied { revision: inst.revision + 1 });
    assert_eq!(store.get(&"wf-1".into()).await.unwrap().unwrap().operator_request, Some(req));
}
