//! The repository conformance suite: plain `pub async fn` cases over `&DynRepository`,
//! plus [`repository_conformance!`](crate::repository_conformance) which expands to one
//! named `#[tokio::test]` per case. Every repository runs it: in memory, MongoDB, SQLite
//! and PostgreSQL.

use crate::audit::{AuditEntry, AuditQuery, AuditResult, AUDIT_DETAIL_BYTES_MAX, AUDIT_PURGE_MAX};
use crate::projection::{AttemptOutcome, AttemptQuery, Snapshot, SnapshotQuery};
use crate::repo::{DynRepository, FINISHED_PURGE_MAX};
use crate::Error;
use kernel_core::domain::{DurationMs, ErrorClass, Instant, WorkflowStatus};
use kernel_core::ports::Observation;
use kernel_core::transition::TransitionKind;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// A fresh repository for one case, torn down afterwards.
#[async_trait::async_trait]
pub trait RepositoryFixture: Send + Sync {
    /// The repository under test.
    fn repo(&self) -> &DynRepository;
    /// Clean up (drop the test database, …).
    async fn teardown(self);
}

/// Base time of the observations the cases build.
pub const T0: Instant = Instant::from_millis(1_700_000_000_000);

/// `T0 + ms`.
fn after(ms: i64) -> Instant {
    T0.checked_add(DurationMs::from_millis(ms)).expect("a test time near T0")
}

/// An observation of `kind` on `step` of `biz_key` at `revision`.
pub fn obs(biz_key: &str, revision: u64, kind: TransitionKind, step: Option<&str>, attempt: u32) -> Observation {
    let status = match kind {
        TransitionKind::Completed => WorkflowStatus::Completed,
        TransitionKind::Failed => WorkflowStatus::Failed,
        TransitionKind::SuspendClaim => WorkflowStatus::Waiting,
        _ => WorkflowStatus::Running,
    };
    Observation {
        workflow_id: format!("wf-{biz_key}").into(),
        biz_key: biz_key.to_string(),
        workflow_type: "summary".into(),
        workflow_run: 0,
        revision,
        kind,
        status,
        step_name: step.map(str::to_string),
        attempt,
        elapsed_ms: DurationMs::from_millis(revision as i64 * 10),
        traffic_wait_ms: DurationMs::ZERO,
        error_class: None,
        at: after(revision as i64 * 1_000),
        worker_id: Some("w1".into()),
        claim_token: Some("tok".into()),
        wait_signal: None,
    }
}

/// A suspension of `biz_key` at `revision` on a signal wait for `signal` (`None`: a timer).
pub fn waiting(biz_key: &str, revision: u64, signal: Option<&str>) -> Observation {
    let mut o = obs(biz_key, revision, TransitionKind::SuspendClaim, Some("s1"), 0);
    o.wait_signal = signal.map(str::to_string);
    o
}

/// An audit entry `id` at `T0 + ms`, by `actor`, doing `action` to `target`.
pub fn audit_entry(id: &str, ms: i64, actor: &str, action: &str, target: &str) -> AuditEntry {
    AuditEntry {
        id: id.to_string(),
        at: after(ms),
        actor: actor.to_string(),
        role: "operator".into(),
        action: action.to_string(),
        target: target.to_string(),
        detail: serde_json::json!({"request": {"id": id, "n": -3, "ratio": 0.5, "tags": ["a", "é"]}}),
        result: AuditResult::Ok,
        reason: None,
    }
}

/// A record every repository refuses for good: a step name starting with `$` cannot
/// become a document key (the Mongo server itself refuses it).
pub fn poison(biz_key: &str, revision: u64) -> Observation {
    obs(biz_key, revision, TransitionKind::MarkRunning, Some("$poison"), 1)
}

/// Attempt rows and the snapshot appear.
pub async fn write_creates_attempt_rows_and_snapshot(repo: &DynRepository) {
    let batch = vec![
        obs("a", 1, TransitionKind::Create, None, 0),
        obs("a", 2, TransitionKind::MarkRunning, Some("fetch"), 1),
        obs("a", 3, TransitionKind::CompleteStep, Some("fetch"), 1),
        obs("a", 3, TransitionKind::MarkRunning, Some("compose"), 1),
    ];
    repo.write_batch(&batch).await.expect("write");
    let s = repo.snapshot("a").await.expect("read").expect("snapshot");
    assert_eq!(s.revision, 3);
    assert_eq!(s.last_kind, TransitionKind::MarkRunning);
    assert_eq!(s.step_name.as_deref(), Some("compose"));
    assert_eq!(s.steps.len(), 2);
    assert_eq!(s.steps["fetch"].kind, TransitionKind::CompleteStep);
    let rows = repo.find_attempts(&AttemptQuery { biz_key: Some("a".into()), ..Default::default() }).await.unwrap();
    assert_eq!(rows.len(), 2);
    let fetch = rows.iter().find(|r| r.step_name == "fetch").expect("fetch row");
    assert_eq!((fetch.attempt, fetch.outcome, fetch.revision), (1, AttemptOutcome::Completed, 3));
    assert_eq!(fetch.started_at, Some(after(2_000)), "started_at kept from mark-running");
    assert!(repo.snapshot("nope").await.unwrap().is_none());
}

/// Writing the same batch twice leaves the same state.
pub async fn rewriting_a_batch_is_idempotent(repo: &DynRepository) {
    let batch = vec![
        obs("b", 1, TransitionKind::MarkRunning, Some("s1"), 1),
        obs("b", 2, TransitionKind::RetryRelease, Some("s1"), 1),
        obs("b", 3, TransitionKind::MarkRunning, Some("s1"), 2),
    ];
    repo.write_batch(&batch).await.unwrap();
    let before = (repo.snapshot("b").await.unwrap(), all_rows(repo, "b").await);
    repo.write_batch(&batch).await.unwrap();
    let after = (repo.snapshot("b").await.unwrap(), all_rows(repo, "b").await);
    assert_eq!(before, after);
    assert_eq!(after.1.len(), 2, "one row per attempt");
}

async fn all_rows(repo: &DynRepository, biz_key: &str) -> Vec<crate::AttemptRow> {
    let mut rows =
        repo.find_attempts(&AttemptQuery { biz_key: Some(biz_key.into()), ..Default::default() }).await.unwrap();
    rows.sort_by(|a, b| (a.workflow_run, &a.step_name, a.attempt).cmp(&(b.workflow_run, &b.step_name, b.attempt)));
    rows
}

/// Suspend, yield and permit deferral concern the entry after the rolled-back attempt;
/// a new run gets its own rows.
pub async fn attempt_rows_key_on_run_step_and_attempt(repo: &DynRepository) {
    let mut replay = obs("c", 6, TransitionKind::MarkRunning, Some("s1"), 1);
    replay.workflow_run = 1;
    let batch = vec![
        obs("c", 1, TransitionKind::PermitDeferral, Some("s1"), 0),
        obs("c", 2, TransitionKind::MarkRunning, Some("s1"), 1),
        obs("c", 3, TransitionKind::SuspendClaim, Some("s1"), 0),
        obs("c", 4, TransitionKind::MarkRunning, Some("s1"), 1),
        obs("c", 5, TransitionKind::StepFailed, Some("s1"), 1),
        replay,
    ];
    repo.write_batch(&batch).await.unwrap();
    let rows = all_rows(repo, "c").await;
    let keys: Vec<(u32, u32, AttemptOutcome)> = rows.iter().map(|r| (r.workflow_run, r.attempt, r.outcome)).collect();
    assert_eq!(keys, vec![(0, 1, AttemptOutcome::Failed), (1, 1, AttemptOutcome::Running)]);
}

/// A row keeps the earliest `started_at` it has seen. A suspension rolls the attempt back
/// in the same write, so the resumed mark-running lands on the same row: the row still
/// starts when the attempt first ran, and the wait between shows as outside time. An
/// older revision changes nothing, not even with an earlier start; a row first seen
/// without a start takes the first one it is given.
pub async fn attempt_row_keeps_the_earliest_start(repo: &DynRepository) {
    let at = |mut o: Observation, ms: i64| {
        o.at = after(ms);
        o
    };
    // Running at t0, suspended on a signal, running again at t2, completed at t3: one
    // observation per write, as the writer may batch them.
    let history = [
        at(obs("st", 10, TransitionKind::MarkRunning, Some("s1"), 1), 10_000),
        at(waiting("st", 11, Some("approved")), 11_000),
        at(obs("st", 12, TransitionKind::MarkRunning, Some("s1"), 1), 20_000),
        at(obs("st", 13, TransitionKind::CompleteStep, Some("s1"), 1), 21_000),
    ];
    for o in &history {
        repo.write_batch(std::slice::from_ref(o)).await.unwrap();
    }
    let rows = all_rows(repo, "st").await;
    assert_eq!(rows.len(), 1, "the suspension and the resumption are one attempt row: {rows:?}");
    let row = &rows[0];
    assert_eq!((row.attempt, row.outcome, row.revision), (1, AttemptOutcome::Completed, 13));
    assert_eq!(row.started_at, Some(after(10_000)), "the first mark-running, not the resumption");
    assert_eq!(row.updated_at, after(21_000));
    // The same history in one batch leaves the same row.
    let one: Vec<Observation> = history
        .iter()
        .map(|o| Observation { biz_key: "st-batch".into(), workflow_id: "wf-st-batch".into(), ..o.clone() })
        .collect();
    repo.write_batch(&one).await.unwrap();
    let batched = all_rows(repo, "st-batch").await;
    assert_eq!(
        batched.iter().map(|r| (r.outcome, r.started_at, r.updated_at)).collect::<Vec<_>>(),
        [(AttemptOutcome::Completed, Some(after(10_000)), after(21_000))]
    );
    // An older revision, even one that started earlier, changes nothing.
    repo.write_batch(&[at(obs("st", 9, TransitionKind::MarkRunning, Some("s1"), 1), 1_000)]).await.unwrap();
    repo.write_batch(&[at(obs("st", 12, TransitionKind::MarkRunning, Some("s1"), 1), 5_000)]).await.unwrap();
    assert_eq!(all_rows(repo, "st").await, rows, "older observations change nothing");
    // A row first seen without a start (its mark-running not observed) takes the first
    // one it is given; a newer observation with an earlier start (another worker's clock)
    // moves it earlier, and one without a start keeps it.
    repo.write_batch(&[at(waiting("ns", 3, Some("approved")), 3_000)]).await.unwrap();
    let first = all_rows(repo, "ns").await;
    assert_eq!(first.iter().map(|r| (r.attempt, r.started_at)).collect::<Vec<_>>(), [(1, None)]);
    repo.write_batch(&[at(obs("ns", 4, TransitionKind::MarkRunning, Some("s1"), 1), 8_000)]).await.unwrap();
    assert_eq!(all_rows(repo, "ns").await[0].started_at, Some(after(8_000)), "absent: the first start is taken");
    repo.write_batch(&[at(obs("ns", 5, TransitionKind::MarkRunning, Some("s1"), 1), 6_000)]).await.unwrap();
    assert_eq!(all_rows(repo, "ns").await[0].started_at, Some(after(6_000)), "an earlier start replaces a later");
    repo.write_batch(&[at(obs("ns", 6, TransitionKind::StepFailed, Some("s1"), 1), 9_000)]).await.unwrap();
    let last = all_rows(repo, "ns").await;
    assert_eq!(
        last.iter().map(|r| (r.outcome, r.revision, r.started_at, r.updated_at)).collect::<Vec<_>>(),
        [(AttemptOutcome::Failed, 6, Some(after(6_000)), after(9_000))],
        "no start: the stored one is kept"
    );
}

/// A snapshot and an attempt row ignore an older revision, deterministically.
pub async fn older_revision_never_overwrites(repo: &DynRepository) {
    let mut newer = obs("d", 9, TransitionKind::Completed, None, 0);
    newer.error_class = None;
    repo.write_batch(&[newer]).await.unwrap();
    let mut older = obs("d", 4, TransitionKind::RetryRelease, Some("s1"), 1);
    older.error_class = Some(ErrorClass::Transient);
    repo.write_batch(&[older.clone()]).await.unwrap();
    let s = repo.snapshot("d").await.unwrap().unwrap();
    assert_eq!((s.revision, s.status, s.last_kind), (9, WorkflowStatus::Completed, TransitionKind::Completed));
    assert!(s.steps.is_empty(), "an older observation changes nothing, not even the step map");
    // Attempt rows too.
    repo.write_batch(&[obs("d", 11, TransitionKind::CompleteStep, Some("s2"), 1)]).await.unwrap();
    repo.write_batch(&[obs("d", 10, TransitionKind::MarkRunning, Some("s2"), 1)]).await.unwrap();
    let rows = all_rows(repo, "d").await;
    let s2 = rows.iter().find(|r| r.step_name == "s2").unwrap();
    assert_eq!((s2.revision, s2.outcome), (11, AttemptOutcome::Completed));
    // Equal revisions are accepted (a fused write emits several observations).
    repo.write_batch(&[obs("d", 11, TransitionKind::MarkRunning, Some("s3"), 1)]).await.unwrap();
    assert_eq!(repo.snapshot("d").await.unwrap().unwrap().step_name.as_deref(), Some("s3"));
}

/// Property: whatever order and batching observations of several keys arrive in, each
/// snapshot ends at its highest revision, with that observation's fields. `rounds`
/// random histories from `seed`.
pub async fn out_of_order_revisions_keep_the_newest(repo: &DynRepository, seed: u64, rounds: usize) {
    let mut rng = SmallRng::seed_from_u64(seed);
    for round in 0..rounds {
        let keys: Vec<String> = (0..3).map(|k| format!("p{seed}-{round}-{k}")).collect();
        let mut all = Vec::new();
        for key in &keys {
            let n = rng.gen_range(1..8u64);
            for r in 1..=n {
                let kinds = [TransitionKind::MarkRunning, TransitionKind::CompleteStep, TransitionKind::RetryRelease];
                let kind = *kinds.choose(&mut rng).unwrap();
                let step = ["s1", "s2"].choose(&mut rng).unwrap();
                all.push(obs(key, r * 2, kind, Some(step), rng.gen_range(1..3)));
            }
        }
        all.shuffle(&mut rng);
        let mut i = 0;
        while i < all.len() {
            let take = rng.gen_range(1..=4).min(all.len() - i);
            repo.write_batch(&all[i..i + take]).await.unwrap();
            i += take;
        }
        for key in &keys {
            let newest = all.iter().filter(|o| o.biz_key == *key).max_by_key(|o| o.revision).unwrap();
            let s = repo.snapshot(key).await.unwrap().unwrap();
            assert_eq!(s.revision, newest.revision, "seed {seed} round {round} key {key}");
            assert_eq!(s.last_kind, newest.kind, "seed {seed} round {round} key {key}");
            assert_eq!(s.step_name, newest.step_name, "seed {seed} round {round} key {key}");
        }
    }
}

/// A poison record is refused as [`Error::InvalidRecord`], alone or inside a batch.
pub async fn poison_record_is_an_invalid_record(repo: &DynRepository) {
    assert!(matches!(repo.write_batch(&[poison("e", 1)]).await, Err(Error::InvalidRecord(_))));
    let batch = vec![obs("e", 2, TransitionKind::Create, None, 0), poison("e", 3)];
    assert!(matches!(repo.write_batch(&batch).await, Err(Error::InvalidRecord(_))));
    // Valid records alone are fine.
    repo.write_batch(&batch[..1]).await.unwrap();
}

/// `put_snapshot` (repair) replaces only an older or equal snapshot.
pub async fn put_snapshot_accepts_only_revisions_at_least_its_own(repo: &DynRepository) {
    repo.write_batch(&[obs("f", 5, TransitionKind::MarkRunning, Some("s1"), 1)]).await.unwrap();
    let mut s: Snapshot = Snapshot::from_observation(&obs("f", 4, TransitionKind::Completed, None, 0));
    assert!(!repo.put_snapshot(&s).await.unwrap());
    s.revision = 5;
    assert!(repo.put_snapshot(&s).await.unwrap());
    s.revision = 7;
    assert!(repo.put_snapshot(&s).await.unwrap());
    assert_eq!(repo.snapshot("f").await.unwrap().unwrap(), s);
    assert!(repo
        .put_snapshot(&Snapshot::from_observation(&obs("g", 1, TransitionKind::Create, None, 0)))
        .await
        .unwrap());
}

/// Ops queries filter by type, step, status and window, newest first, limited.
pub async fn queries_filter_by_type_step_status_and_window(repo: &DynRepository) {
    let mut other = obs("h3", 30, TransitionKind::MarkRunning, Some("fetch"), 1);
    other.workflow_type = "other".into();
    let batch = vec![
        obs("h1", 10, TransitionKind::MarkRunning, Some("compose"), 1),
        obs("h2", 20, TransitionKind::Completed, None, 0),
        other,
        obs("h4", 40, TransitionKind::RetryRelease, Some("compose"), 1),
    ];
    repo.write_batch(&batch).await.unwrap();
    let keys = |v: Vec<Snapshot>| v.into_iter().map(|s| s.biz_key).collect::<Vec<_>>();
    let q = |f: fn(&mut SnapshotQuery)| {
        let mut q = SnapshotQuery::default();
        f(&mut q);
        q
    };
    assert_eq!(
        keys(repo.find_snapshots(&q(|q| q.workflow_type = Some("summary".into()))).await.unwrap()),
        ["h4", "h2", "h1"]
    );
    assert_eq!(keys(repo.find_snapshots(&q(|q| q.step_name = Some("compose".into()))).await.unwrap()), ["h4", "h1"]);
    assert_eq!(keys(repo.find_snapshots(&q(|q| q.status = Some(WorkflowStatus::Completed))).await.unwrap()), ["h2"]);
    let window = q(|q| {
        q.updated_from = Some(after(20_000));
        q.updated_to = Some(after(40_000));
    });
    assert_eq!(keys(repo.find_snapshots(&window).await.unwrap()), ["h3", "h2"]);
    assert_eq!(keys(repo.find_snapshots(&q(|q| q.limit = 2)).await.unwrap()), ["h4", "h3"]);
    let retrying = repo
        .find_attempts(&AttemptQuery {
            step_name: Some("compose".into()),
            outcome: Some(AttemptOutcome::Retrying),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(retrying.iter().map(|r| r.biz_key.as_str()).collect::<Vec<_>>(), ["h4"]);
    let typed =
        repo.find_attempts(&AttemptQuery { workflow_type: Some("other".into()), ..Default::default() }).await.unwrap();
    assert_eq!(typed.len(), 1);
}

async fn all_audit(repo: &DynRepository) -> Vec<AuditEntry> {
    repo.find_audit(&AuditQuery::default()).await.expect("find_audit")
}

fn ids(entries: &[AuditEntry]) -> Vec<&str> {
    entries.iter().map(|e| e.id.as_str()).collect()
}

/// Appending the same id twice keeps one entry, the first; a refused entry is an
/// [`Error::InvalidRecord`] and writes nothing.
pub async fn audit_append_is_idempotent_on_id(repo: &DynRepository) {
    let first = AuditEntry {
        role: "admin".into(),
        result: AuditResult::Refused,
        reason: Some("already completed".into()),
        ..audit_entry("op-1", 1_000, "alice", "workflow.cancel", "wf-1")
    };
    repo.append_audit(&first).await.expect("append");
    let second = AuditEntry { actor: "mallory".into(), result: AuditResult::Ok, ..first.clone() };
    repo.append_audit(&second).await.expect("an existing id is not an error");
    repo.append_audit(&first).await.expect("again");
    assert_eq!(all_audit(repo).await, vec![first.clone()], "one entry, the first, read back whole");

    let refused: Vec<(&str, AuditEntry)> = vec![
        ("empty id", AuditEntry { id: String::new(), ..audit_entry("x", 0, "a", "b", "c") }),
        ("empty actor", audit_entry("op-2", 0, "", "b", "c")),
        ("control character", audit_entry("op-3", 0, "a\nb", "b", "c")),
        ("long action", audit_entry("op-4", 0, "a", &"x".repeat(65), "c")),
        ("long target", audit_entry("op-5", 0, "a", "b", &"t".repeat(257))),
        (
            "large detail",
            AuditEntry {
                detail: serde_json::json!({"blob": "x".repeat(AUDIT_DETAIL_BYTES_MAX)}),
                ..audit_entry("op-6", 0, "a", "b", "c")
            },
        ),
        (
            "NUL in detail",
            AuditEntry { detail: serde_json::json!({"k": "a\u{0}b"}), ..audit_entry("op-7", 0, "a", "b", "c") },
        ),
        ("long reason", AuditEntry { reason: Some("r".repeat(1_025)), ..audit_entry("op-8", 0, "a", "b", "c") }),
        ("NUL in reason", AuditEntry { reason: Some("r\u{0}".into()), ..audit_entry("op-9", 0, "a", "b", "c") }),
    ];
    for (what, entry) in refused {
        let r = repo.append_audit(&entry).await;
        assert!(matches!(r, Err(Error::InvalidRecord(_))), "{what}: {r:?}");
    }
    assert_eq!(all_audit(repo).await.len(), 1, "nothing of a refused entry is written");
}

/// Newest `at` first, ties by id; following the cursor page by page returns every entry
/// exactly once, whatever the page size.
pub async fn audit_pages_cover_every_entry_once(repo: &DynRepository) {
    // Written out of order; three share one time, two another.
    let times = [("e5", 5_000), ("e1", 1_000), ("e3b", 3_000), ("e4", 4_000), ("e3a", 3_000), ("e3c", 3_000)];
    let mut times = times.to_vec();
    times.push(("e2", 1_000));
    for (id, ms) in &times {
        repo.append_audit(&audit_entry(id, *ms, "alice", "step.retry", "wf-1")).await.unwrap();
    }
    let expected = ["e5", "e4", "e3a", "e3b", "e3c", "e1", "e2"];
    assert_eq!(ids(&all_audit(repo).await), expected);
    for page in [1usize, 2, 3, 7, 8] {
        let mut seen = Vec::new();
        let mut before = None;
        for _ in 0..10 {
            let q = AuditQuery { before: before.clone(), limit: page, ..Default::default() };
            let got = repo.find_audit(&q).await.unwrap();
            assert!(got.len() <= page, "page {page}: {} entries", got.len());
            let Some(last) = got.last() else { break };
            before = Some((last.at, last.id.clone()));
            seen.extend(got.iter().map(|e| e.id.clone()));
        }
        assert_eq!(seen, expected, "page size {page}");
    }
    // A cursor between two entries of one time.
    let q = AuditQuery { before: Some((after(3_000), "e3a".into())), limit: 2, ..Default::default() };
    assert_eq!(ids(&repo.find_audit(&q).await.unwrap()), ["e3b", "e3c"]);
}

/// Filters by actor, action and target, alone and together, with the cursor; a malformed
/// filter is [`Error::InvalidInput`].
pub async fn audit_filters_by_actor_action_and_target(repo: &DynRepository) {
    let entries = [
        audit_entry("a1", 1_000, "alice", "workflow.cancel", "wf-1"),
        audit_entry("a2", 2_000, "bob", "workflow.cancel", "wf-2"),
        audit_entry("a3", 3_000, "alice", "step.retry", "wf-2"),
        audit_entry("a4", 4_000, "alice", "workflow.cancel", "wf-2"),
        audit_entry("a5", 5_000, "carol", "step.retry", "wf-1"),
    ];
    for e in &entries {
        repo.append_audit(e).await.unwrap();
    }
    let find = |q: AuditQuery| async move { repo.find_audit(&q).await.unwrap() };
    let some = |s: &str| Some(s.to_string());
    assert_eq!(ids(&find(AuditQuery { actor: some("alice"), ..Default::default() }).await), ["a4", "a3", "a1"]);
    assert_eq!(ids(&find(AuditQuery { action: some("step.retry"), ..Default::default() }).await), ["a5", "a3"]);
    assert_eq!(ids(&find(AuditQuery { target: some("wf-2"), ..Default::default() }).await), ["a4", "a3", "a2"]);
    let both = AuditQuery {
        actor: some("alice"),
        action: some("workflow.cancel"),
        target: some("wf-2"),
        ..Default::default()
    };
    assert_eq!(ids(&find(both).await), ["a4"]);
    let paged = AuditQuery { actor: some("alice"), before: Some((after(4_000), "a4".into())), ..Default::default() };
    assert_eq!(ids(&find(paged).await), ["a3", "a1"]);
    assert!(find(AuditQuery { actor: some("nobody"), ..Default::default() }).await.is_empty());
    assert_eq!(ids(&find(AuditQuery { limit: 2, ..Default::default() }).await), ["a5", "a4"]);
    for bad in [
        AuditQuery { actor: some(""), ..Default::default() },
        AuditQuery { target: some("wf\u{0}"), ..Default::default() },
        AuditQuery { before: Some((after(0), String::new())), ..Default::default() },
    ] {
        let r = repo.find_audit(&bad).await;
        assert!(matches!(r, Err(Error::InvalidInput { .. })), "{bad:?}: {r:?}");
    }
}

/// Purge deletes at most `limit` entries strictly older than `before`, oldest first, and
/// refuses a limit outside `1..=AUDIT_PURGE_MAX`.
pub async fn audit_purge_is_bounded_and_oldest_first(repo: &DynRepository) {
    for (id, ms) in [("p1", 1_000), ("p2", 2_000), ("p3a", 3_000), ("p3b", 3_000), ("p4", 4_000)] {
        repo.append_audit(&audit_entry(id, ms, "alice", "task.decide", "task-1")).await.unwrap();
    }
    for bad in [0, AUDIT_PURGE_MAX + 1] {
        let r = repo.purge_audit(after(10_000), bad).await;
        assert!(matches!(r, Err(Error::InvalidInput { .. })), "limit {bad}: {r:?}");
    }
    assert_eq!(all_audit(repo).await.len(), 5, "a refused purge deletes nothing");
    assert_eq!(repo.purge_audit(after(4_000), 2).await.unwrap(), 2);
    assert_eq!(ids(&all_audit(repo).await), ["p4", "p3a", "p3b"]);
    assert_eq!(repo.purge_audit(after(4_000), 1).await.unwrap(), 1);
    assert_eq!(ids(&all_audit(repo).await), ["p4", "p3b"], "ties purged by id");
    assert_eq!(repo.purge_audit(after(4_000), 10).await.unwrap(), 1);
    assert_eq!(repo.purge_audit(after(4_000), 10).await.unwrap(), 0, "nothing older left");
    assert_eq!(ids(&all_audit(repo).await), ["p4"], "an entry at `before` is kept");
}

/// Retention of finished workflows: at most `limit` snapshots, terminal and last updated
/// strictly before `before`, oldest first, each with every attempt row of its biz key;
/// live workflows (however old) and recent finished ones keep theirs; a limit outside
/// `1..=FINISHED_PURGE_MAX` is refused and deletes nothing.
pub async fn finished_purge_is_bounded_and_keeps_live_workflows(repo: &DynRepository) {
    use TransitionKind::{Completed, Failed, MarkRunning};
    let batch = [
        obs("live", 1, MarkRunning, Some("s1"), 0),
        obs("f1", 1, MarkRunning, Some("s1"), 0),
        obs("f1", 4, Completed, Some("s1"), 0),
        obs("f2", 1, MarkRunning, Some("s1"), 0),
        obs("f2", 2, MarkRunning, Some("s1"), 1),
        obs("f2", 3, Failed, Some("s1"), 1),
        obs("f3", 1, MarkRunning, Some("s1"), 0),
        obs("f3", 6, Completed, Some("s1"), 0),
        waiting("asleep", 2, Some("approval")),
    ];
    repo.write_batch(&batch).await.unwrap();
    let rows_of = |key: &'static str| async move {
        let q = AttemptQuery { biz_key: Some(key.into()), ..Default::default() };
        repo.find_attempts(&q).await.unwrap().len()
    };
    let kept = |key: &'static str| async move { repo.snapshot(key).await.unwrap().is_some() };
    assert_eq!((rows_of("f1").await, rows_of("f2").await, rows_of("f3").await), (1, 2, 1));
    for bad in [0, FINISHED_PURGE_MAX + 1] {
        let r = repo.purge_finished(after(10_000), bad).await;
        assert!(matches!(r, Err(Error::InvalidInput { .. })), "limit {bad}: {r:?}");
    }
    assert!(kept("f2").await && rows_of("f2").await == 2, "a refused purge deletes nothing");
    // f2 (failed at T0+3s) is older than f1 (completed at T0+4s).
    assert_eq!(repo.purge_finished(after(4_500), 1).await.unwrap(), 1);
    assert!(!kept("f2").await, "the oldest finished snapshot goes first");
    assert_eq!(rows_of("f2").await, 0, "with every attempt row of its biz key");
    assert!(kept("f1").await && rows_of("f1").await == 1);
    assert_eq!(repo.purge_finished(after(4_500), 10).await.unwrap(), 1);
    assert!(!kept("f1").await && rows_of("f1").await == 0);
    assert_eq!(repo.purge_finished(after(4_500), 10).await.unwrap(), 0, "nothing finished before T0+4.5s left");
    assert!(kept("f3").await && rows_of("f3").await == 1, "finished at or after `before`: kept");
    assert!(kept("live").await && rows_of("live").await == 1, "a running workflow is kept however old");
    assert!(kept("asleep").await, "a waiting workflow is kept however old");
    assert_eq!(repo.purge_finished(after(6_000), 10).await.unwrap(), 0, "updated at `before`: kept");
    assert_eq!(repo.purge_finished(after(6_001), 10).await.unwrap(), 1, "f3 once old enough");
    assert!(kept("live").await && kept("asleep").await);
}

/// Snapshot pages: following the `(updated_at, biz_key)` cursor, with or without a filter,
/// returns every matching snapshot exactly once in the newest-first order.
pub async fn snapshot_pages_cover_every_snapshot_once(repo: &DynRepository) {
    let mut batch = Vec::new();
    // Revisions repeat across keys, so several snapshots share one `updated_at`.
    for (i, rev) in [3u64, 1, 3, 2, 3, 1, 4].iter().enumerate() {
        let mut o = obs(&format!("k{i}"), *rev, TransitionKind::MarkRunning, Some("s1"), 1);
        if i % 2 == 1 {
            o.workflow_type = "other".into();
        }
        batch.push(o);
    }
    repo.write_batch(&batch).await.unwrap();
    let keys = |v: &[Snapshot]| v.iter().map(|s| s.biz_key.clone()).collect::<Vec<_>>();
    let all = repo.find_snapshots(&SnapshotQuery::default()).await.unwrap();
    assert_eq!(keys(&all), ["k6", "k0", "k2", "k4", "k3", "k1", "k5"]);
    for typ in [None, Some("summary"), Some("other")] {
        let expected: Vec<String> =
            all.iter().filter(|s| typ.is_none_or(|t| s.workflow_type == t)).map(|s| s.biz_key.clone()).collect();
        for page in [1usize, 2, 3] {
            let mut seen = Vec::new();
            let mut before = None;
            for _ in 0..10 {
                let q = SnapshotQuery {
                    workflow_type: typ.map(str::to_string),
                    before: before.clone(),
                    limit: page,
                    ..Default::default()
                };
                let got = repo.find_snapshots(&q).await.unwrap();
                assert!(got.len() <= page);
                let Some(last) = got.last() else { break };
                before = Some((last.updated_at, last.biz_key.clone()));
                seen.extend(keys(&got));
            }
            assert_eq!(seen, expected, "type {typ:?}, page size {page}");
        }
    }
}

/// A biz-key prefix is literal: `%`, `_`, `*`, `.`, `[`, `\\` and the like match only
/// themselves, case matters, and a multi-byte or highest code point works; a malformed
/// prefix or cursor is [`Error::InvalidInput`].
pub async fn biz_key_prefix_is_literal(repo: &DynRepository) {
    let keys = [
        "a%b",
        "a%c",
        "axb",
        "a_b",
        "aXb",
        "a.b",
        "a.*",
        "a*b",
        "a[1]",
        "a\\b",
        "a?b",
        "a^b",
        "a$",
        "A%b",
        "a(b)",
        "é-1",
        "é",
        "ê",
        "z\u{10ffff}x",
        "z\u{10ffff}",
        "{",
    ];
    let batch: Vec<Observation> = keys.iter().map(|k| obs(k, 1, TransitionKind::Create, None, 0)).collect();
    repo.write_batch(&batch).await.unwrap();
    for prefix in
        ["a%", "a_", "a.", "a*", "a[", "a\\", "a?", "a^", "a$", "a(", "A", "a", "é", "z\u{10ffff}", "a%b", "ax", "q"]
    {
        let q = SnapshotQuery { biz_key_prefix: Some(prefix.into()), ..Default::default() };
        let mut got: Vec<String> = repo.find_snapshots(&q).await.unwrap().into_iter().map(|s| s.biz_key).collect();
        got.sort();
        let mut expected: Vec<String> = keys.iter().filter(|k| k.starts_with(prefix)).map(|k| k.to_string()).collect();
        expected.sort();
        assert_eq!(got, expected, "prefix {prefix:?}");
    }
    let both = SnapshotQuery { biz_key_prefix: Some("a".into()), limit: 3, ..Default::default() };
    assert_eq!(repo.find_snapshots(&both).await.unwrap().len(), 3);
    for bad in [
        SnapshotQuery { biz_key_prefix: Some(String::new()), ..Default::default() },
        SnapshotQuery { biz_key_prefix: Some("a\u{0}".into()), ..Default::default() },
        SnapshotQuery { waiting_on: Some("x".repeat(257)), ..Default::default() },
        SnapshotQuery { before: Some((T0, "\n".into())), ..Default::default() },
    ] {
        let r = repo.find_snapshots(&bad).await;
        assert!(matches!(r, Err(Error::InvalidInput { .. })), "{bad:?}: {r:?}");
    }
}

/// The snapshot keeps the signal type its workflow waits for, clears it when the wait
/// ends, and `waiting_on` selects by it.
pub async fn waiting_on_selects_signal_waits(repo: &DynRepository) {
    repo.write_batch(&[
        waiting("w1", 2, Some("approved")),
        waiting("w2", 3, Some("paid")),
        waiting("w3", 4, None),
        waiting("w4", 5, Some("approved")),
        obs("w5", 6, TransitionKind::MarkRunning, Some("s1"), 1),
    ])
    .await
    .unwrap();
    let on = |signal: &str| SnapshotQuery { waiting_on: Some(signal.into()), ..Default::default() };
    let keys = |v: Vec<Snapshot>| v.into_iter().map(|s| s.biz_key).collect::<Vec<_>>();
    assert_eq!(keys(repo.find_snapshots(&on("approved")).await.unwrap()), ["w4", "w1"]);
    assert_eq!(keys(repo.find_snapshots(&on("paid")).await.unwrap()), ["w2"]);
    assert!(repo.find_snapshots(&on("other")).await.unwrap().is_empty());
    assert_eq!(repo.snapshot("w1").await.unwrap().unwrap().wait_signal.as_deref(), Some("approved"));
    assert_eq!(repo.snapshot("w3").await.unwrap().unwrap().wait_signal, None, "a timer is no signal wait");
    // The signal arrives: the next observation carries no wait, and the snapshot drops it.
    repo.write_batch(&[obs("w1", 7, TransitionKind::MarkRunning, Some("s1"), 1)]).await.unwrap();
    assert_eq!(repo.snapshot("w1").await.unwrap().unwrap().wait_signal, None);
    assert_eq!(keys(repo.find_snapshots(&on("approved")).await.unwrap()), ["w4"]);
    // An older observation changes nothing, its wait included.
    repo.write_batch(&[waiting("w1", 6, Some("approved"))]).await.unwrap();
    assert_eq!(keys(repo.find_snapshots(&on("approved")).await.unwrap()), ["w4"]);
    // Combined with the other filters, and through a repaired snapshot.
    let q = SnapshotQuery {
        waiting_on: Some("approved".into()),
        status: Some(WorkflowStatus::Waiting),
        biz_key_prefix: Some("w".into()),
        ..Default::default()
    };
    assert_eq!(keys(repo.find_snapshots(&q).await.unwrap()), ["w4"]);
    let mut repaired = Snapshot::from_observation(&waiting("w5", 9, Some("paid")));
    repaired.steps.clear();
    assert!(repo.put_snapshot(&repaired).await.unwrap());
    assert_eq!(keys(repo.find_snapshots(&on("paid")).await.unwrap()), ["w5", "w2"]);
    assert_eq!(repo.snapshot("w5").await.unwrap().unwrap(), repaired);
}

/// The suite as named `#[tokio::test]`s. `$factory` is called with the case name and
/// returns `Option<impl RepositoryFixture>` (`None` = skipped, reason printed).
#[macro_export]
macro_rules! repository_conformance {
    ($factory:expr) => {
        $crate::repository_conformance!(@cases $factory;
            write_creates_attempt_rows_and_snapshot,
            rewriting_a_batch_is_idempotent,
            attempt_rows_key_on_run_step_and_attempt,
            attempt_row_keeps_the_earliest_start,
            older_revision_never_overwrites,
            poison_record_is_an_invalid_record,
            put_snapshot_accepts_only_revisions_at_least_its_own,
            queries_filter_by_type_step_status_and_window,
            audit_append_is_idempotent_on_id,
            audit_pages_cover_every_entry_once,
            audit_filters_by_actor_action_and_target,
            audit_purge_is_bounded_and_oldest_first,
            finished_purge_is_bounded_and_keeps_live_workflows,
            snapshot_pages_cover_every_snapshot_once,
            biz_key_prefix_is_literal,
            waiting_on_selects_signal_waits
        );
        #[::tokio::test]
        async fn out_of_order_revisions_keep_the_newest() {
            use $crate::conformance::RepositoryFixture as _;
            let factory = $factory;
            let Some(fixture) = factory("out_of_order_revisions_keep_the_newest").await else { return };
            $crate::conformance::out_of_order_revisions_keep_the_newest(fixture.repo(), 7, 4).await;
            fixture.teardown().await;
        }
    };
    (@cases $factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[::tokio::test]
            async fn $case() {
                use $crate::conformance::RepositoryFixture as _;
                let factory = $factory;
                let Some(fixture) = factory(stringify!($case)).await else { return };
                $crate::conformance::$case(fixture.repo()).await;
                fixture.teardown().await;
            }
        )*
    };
}
