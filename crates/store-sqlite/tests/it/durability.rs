//! Real processes on one file: reopening after a kill loses nothing that was committed,
//! and several processes share the file.
//!
//! The test re-executes its own binary as a child process (`STORE_SQLITE_KILL_CHILD` names
//! the file): the child opens the file with the default durability (`synchronous=FULL`),
//! creates an instance, claims it, commits `mark_running` of step 0 and the outcome of
//! step 0, reports each commit on stdout, and then blocks before the next write. The parent
//! waits for the last report and kills the child with `SIGKILL`, reopens the file and reads
//! every committed write back: the revision, the step statuses, the output, the lease.

use crate::support::TestDb;
use kernel_core::domain::*;
use kernel_core::ports::{ClaimSpec, CreateOutcome, WorkflowStore, WriteOutcome};
use kernel_core::transition::{Guard, Transition};
use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use store_sqlite::{SqliteConfig, SqliteDb, SqliteWorkflowStore};

const CHILD: &str = "STORE_SQLITE_KILL_CHILD";
const T0: Instant = Instant::from_millis(1_700_000_000_000);

fn instance() -> WorkflowInstance {
    let mut w = testkit::conformance::store::claimed("wf-kill", "unused");
    w.claim_token = None;
    w.status = WorkflowStatus::Running;
    w.claimable_time = Some(T0);
    w.steps = vec![Step::pending("fetch"), Step::pending("publish")];
    w.output = Default::default();
    w.revision = 0;
    w
}

/// The child's part: commit, report, commit, report, then wait to be killed.
async fn child(path: &str) {
    let db = SqliteDb::open(path, SqliteConfig::default()).await.expect("child: open");
    let store = SqliteWorkflowStore::new(db);
    let inst = instance();
    let types = vec![inst.workflow_type.clone()];
    assert!(matches!(store.create(inst).await.expect("create"), CreateOutcome::Created(_)));
    let spec = ClaimSpec { now: T0, lease_ms: DurationMs::from_millis(60_000), token: "tok-1".into(), types };
    store.claim(&"wf-kill".into(), &spec).await.expect("claim").expect("claimed");
    let running = Guard::Running { token: "tok-1".into() };
    let r = store.apply(&"wf-kill".into(), &running, &Transition::mark_running(0, T0)).await.expect("mark running");
    assert!(matches!(r, WriteOutcome::Applied { .. }));
    println!("committed mark_running");
    let done = Transition::complete_step(0, "fetch", json!({"rows": 3}), DurationMs::from_millis(5), T0, true);
    let r = store.apply(&"wf-kill".into(), &running, &done).await.expect("complete step");
    assert!(matches!(r, WriteOutcome::Applied { revision: 2 }), "{r:?}");
    println!("committed complete_step");
    std::io::stdout().flush().unwrap();
    // The next write would come now; the parent kills the process first.
    std::thread::sleep(std::time::Duration::from_secs(60));
    panic!("child: not killed within 60 s");
}

/// K-3.1: a process killed with SIGKILL right after a commit loses nothing of it: the
/// reopened file holds every committed write and nothing after it.
#[tokio::test]
async fn k3_1_reopening_after_sigkill_loses_nothing_committed() {
    if let Ok(path) = std::env::var(CHILD) {
        child(&path).await;
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("killed.db");
    let exe = std::env::current_exe().unwrap();
    let mut proc = Command::new(exe)
        .args(["durability::k3_1_reopening_after_sigkill_loses_nothing_committed", "--exact", "--nocapture"])
        .env(CHILD, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the child");
    let out = BufReader::new(proc.stdout.take().unwrap());
    let mut seen = Vec::new();
    for line in out.lines() {
        let line = line.unwrap();
        if line.starts_with("committed ") {
            seen.push(line.clone());
        }
        if line == "committed complete_step" {
            break;
        }
    }
    assert_eq!(seen, ["committed mark_running", "committed complete_step"], "the child reported its commits");
    // SIGKILL: no destructor, no checkpoint, no close of the database.
    proc.kill().expect("SIGKILL");
    let status = proc.wait().unwrap();
    assert!(!status.success(), "killed: {status:?}");
    let db = SqliteDb::open(&path, crate::support::config()).await.expect("reopen");
    let inst = SqliteWorkflowStore::new(db).get(&"wf-kill".into()).await.unwrap().expect("committed instance");
    assert_eq!(inst.revision, 2, "{inst:?}");
    assert_eq!(inst.claim_token.as_ref().map(|t| t.as_str()), Some("tok-1"));
    assert_eq!(inst.steps[0].status, StepStatus::Completed);
    assert_eq!(inst.steps[0].attempt, 1);
    assert_eq!(inst.steps[1].status, StepStatus::Pending);
    assert_eq!(inst.output.get("fetch"), Some(&json!({"rows": 3})));
    // The file is consistent, and every committed row of the log is readable.
    let t = TestDb { dir, db: SqliteDb::open(&path, crate::support::config()).await.unwrap() };
    assert_eq!(t.scalar("SELECT count(*) FROM workflow_instances"), 1);
    assert_eq!(
        rusqlite::Connection::open(&path)
            .unwrap()
            .query_row("PRAGMA integrity_check", [], |r| r.get::<_, String>(0))
            .unwrap(),
        "ok"
    );
}

const RACER: &str = "STORE_SQLITE_RACE_CHILD";

/// The racer's part: claim due instances with `claim_any` until none is left, printing
/// each claimed id.
async fn racer(path: &str) {
    let db = SqliteDb::open(path, SqliteConfig::default()).await.expect("racer: open");
    let store = SqliteWorkflowStore::new(db);
    let pid = std::process::id();
    let mut n = 0u32;
    loop {
        n += 1;
        let spec = ClaimSpec {
            now: T0,
            lease_ms: DurationMs::from_millis(600_000),
            token: format!("p{pid}-{n}").as_str().into(),
            types: vec!["summary".into()],
        };
        match store.claim_any(&spec).await.expect("racer: claim_any") {
            Some(w) => println!("claimed {}", w.workflow_id),
            None => break,
        }
    }
    println!("done");
}

/// Several processes share one file: three processes (default durability, `FULL`) race
/// `claim_any` over 60 due instances, their writes serialised by SQLite's file lock and
/// the busy timeout: every instance is claimed by exactly one process, no call fails.
#[tokio::test]
async fn three_processes_claim_each_instance_once() {
    if let Ok(path) = std::env::var(RACER) {
        racer(&path).await;
        return;
    }
    let t = TestDb::with(SqliteConfig::default()).await;
    let store = t.store();
    for i in 0..60 {
        let mut w = instance();
        w.workflow_id = format!("wf-{i:02}").as_str().into();
        w.biz_key = format!("biz-{i:02}");
        assert!(matches!(store.create(w).await.unwrap(), CreateOutcome::Created(_)));
    }
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..3)
        .map(|_| {
            Command::new(&exe)
                .args(["durability::three_processes_claim_each_instance_once", "--exact", "--nocapture"])
                .env(RACER, t.db.path())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn a racer")
        })
        .collect();
    let mut claimed = Vec::new();
    let mut per_process = Vec::new();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "racer failed: {:?}", out.status);
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.lines().any(|l| l == "done"), "{text}");
        let mine: Vec<String> = text.lines().filter_map(|l| l.strip_prefix("claimed ")).map(str::to_string).collect();
        per_process.push(mine.len());
        claimed.extend(mine);
    }
    let distinct: std::collections::HashSet<&String> = claimed.iter().collect();
    assert_eq!((claimed.len(), distinct.len()), (60, 60), "each instance claimed once: {per_process:?}");
    assert_eq!(t.scalar("SELECT count(*) FROM workflow_instances WHERE claim_token IS NOT NULL"), 60);
    println!("processes: store=sqlite processes=3 instances=60 claimed={} per_process={per_process:?}", claimed.len());
}
