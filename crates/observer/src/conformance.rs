//! The repository conformance suite: plain `pub async fn` cases over `&DynRepository`,
//! plus [`repository_conformance!`](crate::repository_conformance) which expands to one
//! named `#[tokio::test]` per case. The in-memory and the Mongo repository both run it.

use crate::model::{AttemptOutcome, AttemptQuery, Snapshot, SnapshotQuery};
use crate::repo::DynRepository;
use crate::Error;
use kernel_core::model::{DurationMs, ErrorClass, Instant, WorkflowStatus};
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

/// The suite as named `#[tokio::test]`s. `$factory` is called with the case name and
/// returns `Option<impl RepositoryFixture>` (`None` = skipped, reason printed).
#[macro_export]
macro_rules! repository_conformance {
    ($factory:expr) => {
        $crate::repository_conformance!(@cases $factory;
            write_creates_attempt_rows_and_snapshot,
            rewriting_a_batch_is_idempotent,
            attempt_rows_key_on_run_step_and_attempt,
            older_revision_never_overwrites,
            poison_record_is_an_invalid_record,
            put_snapshot_accepts_only_revisions_at_least_its_own,
            queries_filter_by_type_step_status_and_window
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
