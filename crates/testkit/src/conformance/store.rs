//! Conformance cases for the [`WorkflowStore`] port.
//!
//! Every case is a `pub async fn case(store: &DynStore)` that starts from an empty store and
//! panics on a violation. Guarded writes are checked against the reference semantics: for
//! each write the case reads the instance before, applies `(guard, transition)`, reads it
//! again and asserts
//!
//! - on a hit: `Applied { revision }` and the stored instance equals
//!   [`Transition::apply_to`] of the prior instance (so `revision` moved exactly as the
//!   transition says: +1, or 0 for claim and heartbeat);
//! - on a miss: `Missed` and the stored instance is unchanged;
//! - either way, [`Guard::matches`] on the prior instance agrees with the adapter.
//!
//! Each guarded write of K-6.4 and each no-token write has a hit and a miss.
//! [`store_conformance!`](crate::store_conformance) expands to one `#[tokio::test]` per case:
//!
//! ```ignore
//! testkit::store_conformance!(|| async { Some(testkit::memory::InMemoryStore::new()) });
//! ```
//!
//! The factory returns `Option<F>` where `F:` [`StoreFixture`]; `None` skips the test (an
//! adapter whose server is not configured). Adapters backed by a server use a fresh
//! namespace per fixture and drop it in [`StoreFixture::teardown`], which runs even when the
//! case panics.

use crate::memory::InMemoryStore;
use crate::time::TestTime;
use kernel_core::domain::*;
use kernel_core::operator_request::{OperatorRequest, RequestedAction};
use kernel_core::ports::*;
use kernel_core::record::*;
use kernel_core::transition::{Guard, Transition};
use kernel_core::Error;
use kernel_core::WorkflowId;
use serde_json::json;
use std::sync::Arc;

mod claims;
mod create_and_input;
mod endings;
mod records;
mod waits;

pub use self::claims::*;
pub use self::create_and_input::*;
pub use self::endings::*;
pub use self::records::*;
pub use self::waits::*;

/// A store under test plus whatever must be cleaned up after the case.
pub trait StoreFixture: Send + Sync + 'static {
    /// The port under test.
    fn store(&self) -> &DynStore;
    /// Drop the fixture's namespace; the default does nothing.
    fn teardown(self) -> futures::future::BoxFuture<'static, ()>
    where
        Self: Sized,
    {
        Box::pin(async {})
    }
}

impl StoreFixture for InMemoryStore {
    fn store(&self) -> &DynStore {
        self
    }
}

impl StoreFixture for Arc<DynStore> {
    fn store(&self) -> &DynStore {
        &**self
    }
}

/// A fixed clock reading used by every case (2023-11-14T22:13:20Z).
pub const T0: Instant = Instant::from_millis(1_700_000_000_000);

/// Lease used by the cases.
pub const LEASE_MS: DurationMs = DurationMs::from_millis(30_000);

/// The type every fixture instance has.
pub const TYPE: &str = "summary";

/// Step names of every fixture instance.
pub const STEPS: [&str; 3] = ["fetch", "compose", "publish"];

/// A fresh instance: three pending steps, claimable at [`T0`], priority P2, revision 5.
pub fn instance(workflow_id: &str) -> WorkflowInstance {
    WorkflowInstance {
        workflow_id: workflow_id.to_string().into(),
        workflow_type: TYPE.to_string(),
        biz_key: format!("biz:{workflow_id}"),
        status: WorkflowStatus::Running,
        steps: STEPS.iter().map(|s| Step::pending(*s)).collect(),
        input: json!({"fencing_token": "f1", "tenant": "t-1", "object": {"id": 42, "tags": ["a", "b"], "ratio": 0.5}}),
        output: Default::default(),
        claimable_time: Some(T0),
        claim_token: None,
        wait: None,
        resume: None,
        definition_fingerprint: "fp-1".to_string(),
        fingerprint_mismatch: None,
        business_priority: Priority::P2,
        retry_count: 0,
        prepare_failures: 0,
        refused_writes: 0,
        revision: 5,
        created_at: T0.minus(1_000),
        updated_at: T0.minus(1_000),
        finished_at: None,
        compensation: None,
        trace_parent: None,
        operator_request: None,
    }
}

/// An instance claimed by `token`: step 0 completed with output, step 1 running (attempt 1).
pub fn claimed(workflow_id: &str, token: &str) -> WorkflowInstance {
    let mut i = instance(workflow_id);
    i.claim_token = Some(token.to_string().into());
    i.claimable_time = Some(T0.plus(LEASE_MS));
    i.steps[0].status = StepStatus::Completed;
    i.steps[0].attempt = 1;
    i.steps[0].elapsed_ms = DurationMs::from_millis(120);
    i.steps[0].started_at = Some(T0.minus(500));
    i.steps[0].finished_at = Some(T0.minus(380));
    i.output.insert(STEPS[0].to_string(), json!({"rows": 3}));
    i.steps[1].status = StepStatus::Running;
    i.steps[1].attempt = 1;
    i.steps[1].started_at = Some(T0.minus(100));
    i.steps[1].checkpoint = Some(json!({"cursor": 7}));
    i
}

/// Waiting on step 1: a timer due at `due`, or a signal wait (`signal = Some(generation)`)
/// with an optional poll time.
pub fn waiting(workflow_id: &str, signal: Option<u64>, poll_time: Option<Instant>) -> WorkflowInstance {
    let mut i = claimed(workflow_id, "tok-old");
    i.status = WorkflowStatus::Waiting;
    i.claim_token = None;
    i.steps[1].status = StepStatus::Waiting;
    i.steps[1].attempt = 0;
    i.claimable_time = poll_time;
    i.wait = Some(match signal {
        Some(generation) => Wait::Signal {
            signal_type: "approved".into(),
            wait_key: "doc:42".into(),
            generation,
            step_index: 1,
            poll_time,
        },
        None => Wait::Timer { step_index: 1, due: poll_time },
    });
    i
}

/// Insert `inst` and assert it was created.
pub async fn seed(store: &DynStore, inst: WorkflowInstance) -> WorkflowInstance {
    match store.create(inst.clone()).await.expect("create") {
        CreateOutcome::Created(c) => assert_eq!(c, inst, "create returns the instance as given"),
        CreateOutcome::Exists(e) => panic!("seed: {} already exists: {e:?}", inst.workflow_id),
    }
    inst
}

/// Apply one guarded write and check it against the reference semantics (see module docs).
/// Returns the stored instance afterwards.
pub async fn check_write(store: &DynStore, id: &str, guard: &Guard, t: &Transition, hit: bool) -> WorkflowInstance {
    let prior = store.get(&WorkflowId::from(id)).await.expect("get before").expect("instance exists");
    assert_eq!(guard.matches(&prior), hit, "reference guard {guard:?} on {id}: expected hit = {hit}");
    let outcome = store.apply(&WorkflowId::from(id), guard, t).await.expect("apply");
    let after = store.get(&WorkflowId::from(id)).await.expect("get after").expect("instance still exists");
    if hit {
        let mut expected = prior.clone();
        t.apply_to(&mut expected);
        assert_eq!(outcome, WriteOutcome::Applied { revision: expected.revision }, "{:?} under {guard:?}", t.kinds);
        assert_eq!(after, expected, "stored instance after {:?} differs from Transition::apply_to", t.kinds);
        let bump = u64::from(t.bump_revision);
        assert_eq!(after.revision, prior.revision + bump, "revision moves by {bump}");
    } else {
        assert_eq!(outcome, WriteOutcome::Missed, "{:?} under {guard:?} must miss", t.kinds);
        assert_eq!(after, prior, "a missed write changes nothing");
    }
    after
}

fn running(token: &str) -> Guard {
    Guard::Running { token: token.to_string().into() }
}

fn failing(token: &str) -> Guard {
    Guard::Failing { token: token.to_string().into() }
}

fn spec(token: &str, now: Instant) -> ClaimSpec {
    ClaimSpec { now, lease_ms: LEASE_MS, token: token.to_string().into(), types: vec![TYPE.to_string()] }
}

fn err(class: ErrorClass) -> StepError {
    StepError { class, message: "boom".to_string() }
}

fn assert_invalid<T: std::fmt::Debug>(r: kernel_core::Result<T>, what: &str) {
    assert!(matches!(r, Err(Error::InvalidInput { .. })), "{what}: expected InvalidInput, got {r:?}");
}

/// Seed `wf-1` claimed by `a` and `wf-2` claimable, run `refused` (which must refuse every
/// write it tries), then read both back: nothing was written, and no instance was created
/// under `biz:wf-bad`. A handful of store operations, so it stays cheap on a server.
async fn refused_writes_nothing<F>(store: &DynStore, refused: F)
where
    F: for<'a> FnOnce(&'a DynStore) -> futures::future::BoxFuture<'a, ()>,
{
    let a = seed(store, claimed("wf-1", "a")).await;
    let b = seed(store, instance("wf-2")).await;
    refused(store).await;
    assert_eq!(store.get(&"wf-1".into()).await.unwrap(), Some(a), "nothing written to wf-1");
    assert_eq!(store.get(&"wf-2".into()).await.unwrap(), Some(b), "nothing written to wf-2");
    assert_eq!(store.get_by_biz_key("biz:wf-bad").await.unwrap(), None, "nothing created");
}

fn request(id: &str, action: RequestedAction, holder: &str, at: Instant) -> OperatorRequest {
    OperatorRequest { id: id.into(), action, holder: holder.to_string().into(), requested_at: at }
}

fn failed_instance(id: &str) -> WorkflowInstance {
    let mut i = claimed(id, "a");
    i.status = WorkflowStatus::Failed;
    i.claim_token = None;
    i.claimable_time = None;
    i.finished_at = Some(T0.minus(10));
    i.steps[1].status = StepStatus::Failed;
    i.steps[1].attempt = 3;
    i.steps[1].elapsed_ms = DurationMs::from_millis(900);
    i.steps[1].traffic_wait_ms = DurationMs::from_millis(50);
    i.steps[1].traffic_waits = 1;
    i.steps[1].error = Some(err(ErrorClass::Permanent));
    i.steps[1].finished_at = Some(T0.minus(10));
    i.steps[2].status = StepStatus::Skipped;
    i.steps[2].error = Some(err(ErrorClass::Transient));
    i.retry_count = 1;
    i
}

// --- scans -------------------------------------------------------------------------------

/// `scan_due_waits`: only waiting instances due at `now`, bounded by `limit`, with the
/// resume kind of their wait.
pub async fn scan_due_waits_bounded(store: &DynStore) {
    seed(store, waiting("wf-a", None, Some(T0.minus(30)))).await;
    seed(store, waiting("wf-b", Some(4), Some(T0.minus(20)))).await;
    seed(store, waiting("wf-c", None, Some(T0.plus(10)))).await;
    seed(store, waiting("wf-d", Some(1), None)).await;
    seed(store, instance("wf-e")).await;
    let got = store.scan_due_waits(T0, None, 10).await.unwrap();
    let expect = vec![
        DueWait { workflow_id: "wf-a".into(), step_index: 1, resume: ResumeKind::Timer, priority: Priority::P2 },
        DueWait { workflow_id: "wf-b".into(), step_index: 1, resume: ResumeKind::Poll, priority: Priority::P2 },
    ];
    let page = ScanPage { last_time: Some(T0.minus(20)), ..ScanPage::of(expect, |d: &DueWait| &d.workflow_id) };
    assert_eq!(got, page, "longest due first, nothing quarantined, the last document named");
    assert!(!got.is_full(10));
    let one = store.scan_due_waits(T0, None, 1).await.unwrap();
    assert_eq!((one.rows.len(), one.read, one.is_full(1)), (1, 1, true), "bounded");
    assert_eq!(store.scan_due_waits(T0, None, 0).await.unwrap(), ScanPage::default(), "limit 0 is an empty page");
}

/// `scan_due_waits` paged with [`ScanPage::due_cursor`]: ordered by `(claimable_time,
/// workflow_id)`, each due wait visited once, ties on the due time broken by the id.
pub async fn scan_due_waits_pages(store: &DynStore) {
    seed(store, waiting("wf-b", None, Some(T0.minus(30)))).await;
    seed(store, waiting("wf-a", None, Some(T0.minus(30)))).await;
    seed(store, waiting("wf-0", None, Some(T0.minus(20)))).await;
    seed(store, waiting("wf-z", None, Some(T0.plus(1)))).await;
    let mut seen = Vec::new();
    let mut after = None;
    for _ in 0..5 {
        let page = store.scan_due_waits(T0, after.as_ref(), 1).await.unwrap();
        seen.extend(page.rows.iter().map(|d| d.workflow_id.to_string()));
        if !page.is_full(1) {
            break;
        }
        after = Some(page.due_cursor().expect("a full page names its last document"));
    }
    assert_eq!(seen, ["wf-a", "wf-b", "wf-0"], "by due time, then id; each once");
    let bad = DueCursor { claimable_time: T0, workflow_id: "".into() };
    assert!(store.scan_due_waits(T0, Some(&bad), 1).await.is_err(), "the cursor's id is an identifier");
}

/// `scan_claimable`: running and failing instances with a `claimable_time`, ordered by
/// workflow id, paged strictly after the cursor.
pub async fn scan_claimable_pages(store: &DynStore) {
    let mut f = instance("wf-3");
    f.status = WorkflowStatus::Failing;
    f.business_priority = Priority::P0;
    seed(store, f).await;
    seed(store, instance("wf-1")).await;
    seed(store, claimed("wf-5", "a")).await;
    seed(store, waiting("wf-2", None, Some(T0))).await;
    let mut done = instance("wf-4");
    done.status = WorkflowStatus::Completed;
    seed(store, done).await;
    let mut no_time = instance("wf-6");
    no_time.claimable_time = None;
    seed(store, no_time).await;
    let page1 = store.scan_claimable(None, 2).await.unwrap();
    fn key(c: &Candidate) -> &WorkflowId {
        &c.workflow_id
    }
    assert_eq!(
        page1,
        ScanPage::of(
            vec![
                Candidate { workflow_id: "wf-1".into(), priority: Priority::P2, claimable_time: T0 },
                Candidate { workflow_id: "wf-3".into(), priority: Priority::P0, claimable_time: T0 },
            ],
            key
        )
    );
    assert!(page1.is_full(2));
    assert_eq!(page1.last, Some("wf-3".into()), "the cursor of the next page");
    let page2 = store.scan_claimable(page1.last.as_ref(), 2).await.unwrap();
    assert_eq!(
        page2,
        ScanPage::of(
            vec![Candidate { workflow_id: "wf-5".into(), priority: Priority::P2, claimable_time: T0.plus(LEASE_MS) }],
            key
        )
    );
    assert!(!page2.is_full(2));
    assert_eq!(store.scan_claimable(Some(&"wf-5".into()), 2).await.unwrap(), ScanPage::default());
}

/// Expands to one `#[tokio::test]` per store conformance case. The argument is a factory
/// `|| async { Option<impl StoreFixture> }`; `None` skips (the test passes after printing
/// its own reason). Requires `tokio` (with `macros` and `rt`) in the calling crate.
#[macro_export]
macro_rules! store_conformance {
    ($factory:expr) => {
        $crate::__conformance_cases!(store, StoreFixture, store, $factory;
            create_and_read_back,
            create_existing_biz_key_returns_stored,
            create_race_one_winner,
            create_duplicate_workflow_id_is_conflict,
            create_rejects_invalid_identifiers,
            operator_shaped_values_are_data,
            claim_guard,
            claim_failing_instance,
            claim_any_takes_a_due_instance,
            stale_token_after_reclaim_is_missed,
            heartbeat_token_guard,
            mark_running_guard,
            complete_step_guard,
            completed_revision_round_trip,
            suspend_timer_guard,
            suspend_signal_guard,
            yield_guard,
            null_checkpoint_reads_back_as_none,
            park_sibling_guard,
            retry_release_guard,
            permit_deferral_guard,
            skip_step_guard,
            step_failed_guard,
            failing_guard,
            failed_guard,
            completed_guard,
            activity_canceled_guard,
            finalizer_release_guard,
            prepare_failures_round_trip,
            refused_writes_round_trip,
            release_guard,
            fingerprint_push_back_guard,
            fused_write_bumps_revision_once,
            timer_activation_guard,
            poll_activation_guard,
            signal_activation_guard,
            supersede_guard,
            replay_guard,
            replay_guard_spares_the_failed_round,
            replay_race_one_winner,
            priority_raise_guard,
            apply_to_missing_instance_is_missed,
            apply_rejects_bad_names_and_indices,
            k2_0_bad_wait_key_is_refused,
            k2_0_oversize_payload_is_refused,
            k2_0_bad_token_is_refused,
            k2_0_bad_output_key_is_refused,
            k2_0_unrepresentable_values_are_refused,
            k2_0_escape_lookalike_names_stay_distinct,
            k2_0_names_with_backslashes_are_data,
            k2_0_names_with_quotes_are_data,
            k2_0_control_characters_in_names_are_refused,
            scan_due_waits_bounded,
            scan_due_waits_pages,
            scan_claimable_pages,
            record_step_guard,
            k2_oversize_record_is_refused,
            regenerate_guard,
            operator_request_under_the_holders_token,
            request_applied_clears_request_and_token,
            dead_letter_and_step_epoch,
            retrying_since_and_replay_keep_the_audit,
            loop_back_guard,
            branch_skip_guard,
            replay_clears_the_iterations_of_failed_steps,
            compensation_report_guard,
            trace_parent_round_trip,
        );
    };
}
