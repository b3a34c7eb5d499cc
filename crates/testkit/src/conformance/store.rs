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
use kernel_core::model::*;
use kernel_core::operator_request::{OperatorRequest, RequestedAction};
use kernel_core::ports::*;
use kernel_core::record::*;
use kernel_core::transition::{Guard, Patch, Transition};
use kernel_core::Error;
use kernel_core::WorkflowId;
use serde_json::json;
use std::sync::Arc;

#[doc(hidden)]
pub use futures as __futures;

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

/// `r` is [`Error::InvalidInput`] naming `field` (the shared K-2.0 rule names the same field
/// on every adapter).
pub fn assert_invalid_field<T: std::fmt::Debug>(r: kernel_core::Result<T>, field: &str) {
    match r {
        Err(Error::InvalidInput { field: f, .. }) => assert_eq!(f, field, "refused field"),
        other => panic!("expected InvalidInput on `{field}`, got {other:?}"),
    }
}

/// A JSON value one byte over the stores' shared payload limit once serialized.
pub fn oversize_payload() -> serde_json::Value {
    json!("x".repeat(kernel_core::validate::STORE_PAYLOAD_BYTES_MAX - 1))
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

/// A fresh instance `wf-bad` (biz key `biz:wf-bad`) to be refused by `create`.
fn bad_instance(edit: impl FnOnce(&mut WorkflowInstance)) -> WorkflowInstance {
    let mut i = waiting("wf-bad", Some(1), None);
    edit(&mut i);
    i
}

fn signal_wait(wait_key: &str) -> Wait {
    Wait::Signal {
        signal_type: "approved".into(),
        wait_key: wait_key.into(),
        generation: 2,
        step_index: 1,
        poll_time: None,
    }
}

// --- recorded facts, epochs, history (K-17.1, K-17.3) ------------------------------------

/// A record of a model call with every field a store must keep: unicode, nested values,
/// floats, big integers, usage, cache provenance, a migration.
pub fn sample_record(run: u32, epoch: u32) -> StepRecord {
    StepRecord {
        run,
        epoch,
        entries: vec![
            RecordEntry::Model(ModelCall {
                label: "extract".into(),
                input_hash: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".into(),
                prompt: VersionRef::new("invoice-extract", "3"),
                model: VersionRef::new("model-x", "2026-11-01"),
                params: json!({"temperature": 0.2, "top_p": 1.0, "seed": 9_007_199_254_740_993_i64}),
                schema: Some(VersionRef::new("invoice", "2")),
                samples: vec![
                    ModelSample {
                        raw: "not json — «ошибка»".into(),
                        parsed: None,
                        errors: vec!["expected value at line 1".into()],
                        usage: Usage { input_tokens: 120, output_tokens: 7, cost_micros: 31 },
                        recorded_at: T0.plus(1),
                    },
                    ModelSample {
                        raw: r#"{"total": 12.5, "lines": [{"sku": "a"}]}"#.into(),
                        parsed: Some(json!({"total": 12.5, "lines": [{"sku": "a"}]})),
                        errors: vec![],
                        usage: Usage { input_tokens: 120, output_tokens: 20, cost_micros: 44 },
                        recorded_at: T0.plus(2),
                    },
                ],
                output: Some(json!({"total": 12.5, "lines": [{"sku": "a"}], "currency": "EUR"})),
                cache: Some(CacheProvenance { key: "ab".repeat(32), stored_at: T0.minus(60_000) }),
                migrations: vec![SchemaMigration {
                    from: "1".into(),
                    to: "2".into(),
                    before: json!({"total": 12.5}),
                    at: T0.plus(3),
                }],
                exhausted: false,
            }),
            RecordEntry::Value(RecordedValue {
                label: "now".into(),
                value: json!(1_700_000_000_123_i64),
                recorded_at: T0.plus(4),
            }),
            RecordEntry::Operator(OperatorEntry {
                action: OperatorAction::Complete,
                actor: "ops@example".into(),
                output: Some(json!({"ok": true})),
                output_digest: Some(OutputDigest::of(&json!({"ok": true}))),
                at: T0.plus(5),
            }),
            RecordEntry::Operator(OperatorEntry::with_output(
                OperatorAction::CompleteRefused,
                "ops@example",
                &json!({"approved": true, "note": "x".repeat(OPERATOR_OUTPUT_BYTES_MAX)}),
                T0.plus(6),
            )),
        ],
    }
}

fn history_entry(epoch: u32) -> HistoryEntry {
    HistoryEntry {
        run: 0,
        epoch,
        reason: HistoryReason::Regenerate,
        output: Some(json!({"summary": "première"})),
        error: None,
        record: Some(sample_record(0, epoch)),
        at: T0.minus(10),
    }
}

/// RecordStep (K-17.3) under the running token: the record and the history read back
/// exactly; another token misses.
pub async fn record_step_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::record_step(1, sample_record(0, 0), Some(vec![history_entry(0)]), T0.plus(6));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    assert_eq!(after.steps[1].record, Some(sample_record(0, 0)));
    assert_eq!(after.steps[1].history, vec![history_entry(0)]);
    let again = Transition::record_step(1, StepRecord::new(0, 0), None, T0.plus(7));
    let after = check_write(store, "wf-1", &running("a"), &again, true).await;
    assert_eq!(after.steps[1].history, vec![history_entry(0)], "no history patch leaves it");
}

/// A record over the payload limit is refused, nothing written (K-2, K-17.3).
pub async fn k2_oversize_record_is_refused(store: &DynStore) {
    refused_writes_nothing(store, |store| {
        Box::pin(async move {
            let mut r = StepRecord::new(0, 0);
            for _ in 0..8 {
                r.entries.push(RecordEntry::Value(RecordedValue {
                    label: "blob".into(),
                    value: json!("x".repeat(kernel_core::validate::STORE_PAYLOAD_BYTES_MAX / 8)),
                    recorded_at: T0,
                }));
            }
            let t = Transition::record_step(1, r, None, T0.plus(6));
            assert_invalid(store.apply(&"wf-1".into(), &running("a"), &t).await, "oversize record");
        })
    })
    .await;
}

/// Regenerate (K-17.3) under `Guard::Operator`: the revision read must still be current,
/// the instance running, waiting or failing, and no claim may hold it (K-6.8: a live claim
/// gets an [`OperatorRequest`] instead). The reset steps start a new epoch with their
/// history and lose their outputs.
pub async fn regenerate_guard(store: &DynStore) {
    let mut inst = claimed("wf-1", "a");
    inst.claim_token = None;
    inst.steps[0].record = Some(sample_record(0, 0));
    inst.steps[0].retrying_since = Some(T0.minus(300));
    inst.steps[1].status = StepStatus::Completed;
    inst.output.insert(STEPS[1].to_string(), json!("done"));
    let inst = seed(store, inst).await;
    let mut done = claimed("wf-2", "a");
    done.status = WorkflowStatus::Completed;
    done.claim_token = None;
    seed(store, done).await;
    seed(store, claimed("wf-3", "a")).await;
    let mut failing = claimed("wf-4", "a");
    failing.status = WorkflowStatus::Failing;
    failing.claim_token = None;
    seed(store, failing).await;
    let t = Transition::regenerate(
        vec![(0, 1, vec![history_entry(0)]), (1, 1, vec![])],
        vec![STEPS[0].to_string(), STEPS[1].to_string()],
        true,
        T0.plus(9),
    );
    let operator = Guard::Operator { revision: inst.revision };
    check_write(store, "wf-1", &Guard::Operator { revision: inst.revision + 1 }, &t, false).await;
    check_write(store, "wf-2", &operator, &t, false).await;
    check_write(store, "wf-3", &operator, &t, false).await;
    let after = check_write(store, "wf-1", &operator, &t, true).await;
    assert_eq!(
        (after.steps[0].epoch, after.steps[0].status, after.steps[0].record.clone()),
        (1, StepStatus::Pending, None)
    );
    assert_eq!(after.steps[0].history, vec![history_entry(0)]);
    assert_eq!(after.steps[0].retrying_since, None);
    assert!(after.output.is_empty(), "outputs of the reset steps removed: {:?}", after.output);
    assert_eq!(after.claim_token, None);
    check_write(store, "wf-1", &operator, &t, false).await;
    let after = check_write(store, "wf-4", &operator, &t, true).await;
    assert_eq!(after.status, WorkflowStatus::Running, "a failing instance no claim holds is regenerated");
}

/// A regenerated step's name as a request stores it: quotes, backslashes (a trailing one),
/// text that reads as an escape, non-ASCII. The K-2.0 key rule admits it; every store keeps
/// it as data, byte for byte.
pub const AWKWARD_STEP: &str = "x\\u0041\"é'[0]\\";

fn request(id: &str, action: RequestedAction, holder: &str, at: Instant) -> OperatorRequest {
    OperatorRequest { id: id.into(), action, holder: holder.to_string().into(), requested_at: at }
}

/// K-6.8: an operator's request to a live claim is written under the holder's token
/// (another token misses), replaces that token and leaves the lease (`claimable_time`)
/// alone. Afterwards the holder's guarded writes miss, the new token's match, and the
/// request reads back exactly (a regenerated step's awkward name included) by id, by biz
/// key and from a claim.
pub async fn operator_request_under_the_holders_token(store: &DynStore) {
    let inst = seed(store, claimed("wf-1", "a")).await;
    let req = request("req-1", RequestedAction::Regenerate { step: AWKWARD_STEP.into() }, "a", T0.plus(7));
    let t = Transition::operator_request(req.clone(), "b".into(), T0.plus(7));
    check_write(store, "wf-1", &Guard::Token { token: "z".into() }, &t, false).await;
    let after = check_write(store, "wf-1", &Guard::Token { token: "a".into() }, &t, true).await;
    assert_eq!(after.operator_request.as_ref(), Some(&req), "the request reads back exactly");
    assert_eq!(after.claim_token.as_ref().map(|t| t.as_str()), Some("b"), "the token is replaced");
    assert_eq!(after.claimable_time, inst.claimable_time, "the lease is left alone");
    match &after.operator_request.as_ref().unwrap().action {
        RequestedAction::Regenerate { step } => assert_eq!(step.as_bytes(), AWKWARD_STEP.as_bytes()),
        other => panic!("{other:?}"),
    }
    assert_eq!(store.get_by_biz_key("biz:wf-1").await.unwrap().as_ref(), Some(&after));
    let hb = Transition::heartbeat(T0.plus(8), LEASE_MS).unwrap();
    check_write(store, "wf-1", &running("a"), &hb, false).await;
    check_write(store, "wf-1", &Guard::Token { token: "a".into() }, &hb, false).await;
    check_write(store, "wf-1", &Guard::Operator { revision: after.revision }, &hb, false).await;
    check_write(store, "wf-1", &Guard::Token { token: "b".into() }, &hb, true).await;
    // A cancel request to a claim that has lapsed: the next claimer reads it.
    let mut lapsed = claimed("wf-2", "c");
    lapsed.claimable_time = Some(T0.minus(1));
    seed(store, lapsed).await;
    let cancel = request("req-2", RequestedAction::Cancel, "c", T0.plus(9));
    let t = Transition::operator_request(cancel.clone(), "d".into(), T0.plus(9));
    check_write(store, "wf-2", &Guard::Token { token: "c".into() }, &t, true).await;
    let claimed = store.claim(&"wf-2".into(), &spec("e", T0.plus(10))).await.unwrap().expect("a lapsed claim is taken");
    assert_eq!(claimed.operator_request, Some(cancel), "a claim returns the request");
}

/// K-6.8: applying a request (under the token the request set) clears the request and the
/// claim token, alone or fused with the action's own write; the holder's old token misses.
/// A request stored by `create` reads back exactly. Once applied, no claim holds the
/// instance, so an operator's write under `Guard::Operator` matches again.
pub async fn request_applied_clears_request_and_token(store: &DynStore) {
    let req = request("req-1", RequestedAction::Regenerate { step: AWKWARD_STEP.into() }, "a", T0.plus(7));
    let mut inst = claimed("wf-1", "b");
    inst.operator_request = Some(req.clone());
    let inst = seed(store, inst).await;
    assert_eq!(store.get(&"wf-1".into()).await.unwrap().and_then(|i| i.operator_request), Some(req));
    let t = Transition::request_applied(None, T0.plus(8));
    check_write(store, "wf-1", &Guard::Token { token: "a".into() }, &t, false).await;
    let after = check_write(store, "wf-1", &Guard::Token { token: "b".into() }, &t, true).await;
    assert_eq!((after.operator_request.as_ref(), after.claim_token.as_ref()), (None, None));
    assert_eq!(after.status, inst.status);
    let regen = Transition::regenerate(vec![(1, 1, vec![])], vec![], true, T0.plus(9));
    check_write(store, "wf-1", &Guard::Operator { revision: after.revision }, &regen, true).await;
    let mut cancel = claimed("wf-2", "d");
    cancel.operator_request = Some(request("req-2", RequestedAction::Cancel, "c", T0.plus(7)));
    seed(store, cancel).await;
    let t = Transition::request_applied(Some(Transition::supersede(T0.plus(8))), T0.plus(8));
    let after = check_write(store, "wf-2", &Guard::Token { token: "d".into() }, &t, true).await;
    assert_eq!(
        (after.status, after.operator_request.as_ref(), after.claim_token.as_ref()),
        (WorkflowStatus::Canceled, None, None)
    );
}

/// Dead letter (K-17.2): the step waits with its error, the workflow waits on the operator
/// signal; the operator's retry starts the next epoch under a new claim.
pub async fn dead_letter_and_step_epoch(store: &DynStore) {
    let mut inst = claimed("wf-1", "a");
    inst.steps[1].record = Some(sample_record(0, 0));
    inst.steps[1].retrying_since = Some(T0.minus(50));
    seed(store, inst).await;
    let wait = Wait::Signal {
        signal_type: "kernel.dead_letter".into(),
        wait_key: STEPS[1].into(),
        generation: 0,
        step_index: 1,
        poll_time: Some(T0.plus(3_600_000)),
    };
    let t =
        Transition::dead_letter(1, wait.clone(), err(ErrorClass::Permanent), DurationMs::from_millis(7), T0.plus(8));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    assert_eq!((after.status, after.wait.clone(), after.steps[1].attempt), (WorkflowStatus::Waiting, Some(wait), 1));
    let act = Transition::signal_activation(1, "sig-1", T0.plus(9));
    check_write(store, "wf-1", &Guard::SignalWait(after.wait.as_ref().unwrap().signal_identity().unwrap()), &act, true)
        .await;
    check_write(
        store,
        "wf-1",
        &Guard::Claimable { now: T0.plus(10), types: vec![TYPE.into()] },
        &Transition::claim(&"c".into(), T0.plus(10), LEASE_MS).unwrap(),
        true,
    )
    .await;
    let next = Transition::step_epoch(1, 1, vec![history_entry(0)], T0.plus(11));
    check_write(store, "wf-1", &running("a"), &next, false).await;
    let after = check_write(store, "wf-1", &running("c"), &next, true).await;
    let s = &after.steps[1];
    assert_eq!(
        (s.epoch, s.status, s.attempt, s.error.clone(), s.record.clone()),
        (1, StepStatus::Pending, 0, None, None)
    );
    assert_eq!((s.retrying_since, s.checkpoint.clone(), after.resume.clone()), (None, None, None));
}

/// A retry release remembers when the logical attempt first failed; replay keeps a failed
/// step's epoch, record and history (a new run never replays them) and clears the rest.
pub async fn retrying_since_and_replay_keep_the_audit(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::step_retry(1, err(ErrorClass::Transient), DurationMs::from_millis(3), T0.plus(5))
        .retrying_since(1, T0.plus(5))
        .release_until(T0.plus(500));
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    assert_eq!(after.steps[1].retrying_since, Some(T0.plus(5)));
    let mut f = failed_instance("wf-2");
    f.steps[1].epoch = 3;
    f.steps[1].record = Some(sample_record(1, 3));
    f.steps[1].history = vec![history_entry(2)];
    f.steps[1].retrying_since = Some(T0.minus(5));
    seed(store, f).await;
    let after = check_write(
        store,
        "wf-2",
        &Guard::Failed { unless_round: None },
        &Transition::replay(json!({"fencing_token": "f2"}), T0.plus(22)),
        true,
    )
    .await;
    let s = &after.steps[1];
    assert_eq!(
        (s.status, s.epoch, s.record.clone(), s.history.clone()),
        (StepStatus::Pending, 3, Some(sample_record(1, 3)), vec![history_entry(2)])
    );
    assert_eq!(s.retrying_since, None);
}

// --- loops and branches (K-4 amendment) --------------------------------------------------

/// The history entry one loop iteration leaves for step `index` of `inst` (K-4 amendment,
/// K-17.3): its epoch, output, error and record, the reason `Loop`.
fn loop_entry(inst: &WorkflowInstance, index: usize, at: Instant) -> HistoryEntry {
    let s = &inst.steps[index];
    HistoryEntry {
        run: inst.retry_count,
        epoch: s.epoch,
        reason: HistoryReason::Loop,
        output: inst.output.get(&s.name).cloned(),
        error: s.error.clone(),
        record: s.record.clone(),
        at,
    }
}

/// LoopBack (K-4 amendment, K-6.4) under the running token: every step of the loop's body
/// starts its next epoch with the iteration in its history (reason `Loop`) and loses its
/// output; the sender's iteration counter is set (2), an enclosed loop's counter goes back
/// to 0 (the stored field removed), the target's is left; the resume of a reset step is
/// cleared. The stored instance equals [`Transition::apply_to`]; another token misses.
pub async fn loop_back_guard(store: &DynStore) {
    let mut inst = claimed("wf-1", "a");
    inst.steps[1].status = StepStatus::Completed;
    inst.steps[1].finished_at = Some(T0.minus(50));
    inst.steps[1].iterations = 3;
    inst.output.insert(STEPS[1].to_string(), json!("draft"));
    inst.steps[2].status = StepStatus::Completed;
    inst.steps[2].attempt = 1;
    inst.steps[2].epoch = 1;
    inst.steps[2].iterations = 1;
    inst.steps[2].record = Some(sample_record(0, 1));
    inst.steps[2].finished_at = Some(T0.minus(10));
    inst.steps[2].history = vec![loop_entry(&inst, 2, T0.minus(20))];
    inst.output.insert(STEPS[2].to_string(), json!({"again": true}));
    inst.resume = Some(Resume { kind: ResumeKind::Signal, step_index: 1, signal_id: Some("sig-1".into()) });
    let inst = seed(store, inst).await;
    assert_eq!(store.get(&"wf-1".into()).await.unwrap(), Some(inst.clone()), "iterations read back as created");
    let at = T0.plus(12);
    let mut sender_history = inst.steps[2].history.clone();
    sender_history.push(loop_entry(&inst, 2, at));
    let t = Transition::loop_back(
        2,
        vec![
            (0, 1, vec![loop_entry(&inst, 0, at)], None),
            (1, 1, vec![loop_entry(&inst, 1, at)], Some(0)),
            (2, 2, sender_history.clone(), Some(2)),
        ],
        STEPS.iter().map(|s| s.to_string()).collect(),
        true,
        at,
    );
    check_write(store, "wf-1", &running("b"), &t, false).await;
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    let shape = |s: &Step| (s.status, s.epoch, s.iterations, s.record.is_none(), s.finished_at);
    assert_eq!(shape(&after.steps[0]), (StepStatus::Pending, 1, 0, true, None), "target");
    assert_eq!(shape(&after.steps[1]), (StepStatus::Pending, 1, 0, true, None), "enclosed loop reset to 0");
    assert_eq!(shape(&after.steps[2]), (StepStatus::Pending, 2, 2, true, None), "sender counts the iteration");
    assert_eq!(after.steps[2].history, sender_history);
    assert_eq!(after.steps[2].history[1].reason, HistoryReason::Loop);
    assert_eq!(after.steps[2].history[1].output, Some(json!({"again": true})), "the output kept in the history");
    assert_eq!(after.steps[1].history, vec![loop_entry(&inst, 1, at)]);
    assert!(after.output.is_empty(), "outputs of the body removed: {:?}", after.output);
    assert_eq!((after.resume.clone(), after.claim_token.clone()), (None, Some("a".to_string().into())));
}

/// BranchSkip (K-4 amendment, K-6.4) under the running token: a step not taken is skipped
/// without an error (an earlier attempt's error removed), its finish time set; another
/// token misses.
pub async fn branch_skip_guard(store: &DynStore) {
    let mut inst = claimed("wf-1", "a");
    inst.steps[2].error = Some(err(ErrorClass::Transient));
    seed(store, inst).await;
    let t = Transition::branch_skip(&[2], T0.plus(13));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    let s = &after.steps[2];
    assert_eq!((s.status, s.error.clone(), s.finished_at), (StepStatus::Skipped, None, Some(T0.plus(13))));
    assert!(s.not_taken());
    assert_eq!(after.steps[1].status, StepStatus::Running, "other steps untouched");
}

/// Replay (K-5, K-4 amendment) clears the loop iteration counter of a failed step with the
/// rest of its attempt, and keeps it on completed and skipped steps.
pub async fn replay_clears_the_iterations_of_failed_steps(store: &DynStore) {
    let mut f = failed_instance("wf-1");
    f.steps[0].iterations = 2;
    f.steps[1].iterations = 3;
    f.steps[1].epoch = 4;
    f.steps[2].iterations = 1;
    seed(store, f).await;
    let t = Transition::replay(json!({"fencing_token": "f2"}), T0.plus(22));
    let after = check_write(store, "wf-1", &Guard::Failed { unless_round: None }, &t, true).await;
    assert_eq!(after.steps[1], Step { epoch: 4, ..Step::pending(STEPS[1]) }, "failed step reset, iterations cleared");
    assert_eq!(
        after.steps.iter().map(|s| s.iterations).collect::<Vec<_>>(),
        [2, 0, 1],
        "completed and skipped steps keep their iterations"
    );
}

/// K-17.6: the `failed` write carries the compensation report (under `Failing` only: a
/// wrong token misses), it reads back whole, and a replay clears it.
pub async fn compensation_report_guard(store: &DynStore) {
    use kernel_core::compensation::{CompensationOutcome, CompensationReport, InverseResult, InverseRun};
    let mut f = claimed("wf-1", "a");
    f.status = WorkflowStatus::Failing;
    seed(store, f).await;
    let report = CompensationReport {
        outcome: CompensationOutcome::Escalated,
        steps: vec![
            InverseRun {
                step: STEPS[1].into(),
                result: InverseResult::Compensated,
                attempts: 1,
                error: None,
                task: None,
            },
            InverseRun {
                step: STEPS[0].into(),
                result: InverseResult::Escalated,
                attempts: 3,
                error: Some("ledger: 503 ünavailable".into()),
                task: Some("5:wf-1|1:a|0|c|h0".into()),
            },
        ],
        at: T0.plus(30),
    };
    let t = Transition::failed_compensated(T0.plus(30), report.clone(), &[0]);
    check_write(store, "wf-1", &failing("b"), &t, false).await;
    let after = check_write(store, "wf-1", &failing("a"), &t, true).await;
    assert_eq!((after.status, after.compensation.as_ref()), (WorkflowStatus::Failed, Some(&report)));
    assert_eq!(after.steps[0].status, StepStatus::Failed, "an undone step is failed, so a replay runs it again");
    let replay = Transition::replay(json!({"fencing_token": "f2"}), T0.plus(40));
    let after = check_write(store, "wf-1", &Guard::Failed { unless_round: None }, &replay, true).await;
    assert_eq!(after.compensation, None, "a replay clears the report");
    assert_eq!(after.steps[0].status, StepStatus::Pending, "the undone step runs again");
    // A report that disagrees with its steps is bad input, nothing written.
    let mut g = claimed("wf-2", "a");
    g.status = WorkflowStatus::Failing;
    seed(store, g).await;
    let mut bad = report;
    bad.outcome = CompensationOutcome::Recovered;
    let e = store
        .apply(&"wf-2".into(), &failing("a"), &Transition::failed_compensated(T0.plus(50), bad, &[]))
        .await
        .expect_err("refused");
    assert!(matches!(e, Error::InvalidInput { .. }), "{e:?}");
    assert_eq!(store.get(&"wf-2".into()).await.unwrap().unwrap().status, WorkflowStatus::Failing);
}

/// The creating request's W3C trace context: stored by the create, read back by every
/// read and claim, kept by every transition (a replay included); absent stays absent. A
/// value not of the `traceparent` form is bad input, nothing written.
pub async fn trace_parent_round_trip(store: &DynStore) {
    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut with = instance("wf-1");
    with.trace_parent = Some(TP.into());
    let stored = seed(store, with).await;
    assert_eq!(stored.trace_parent.as_deref(), Some(TP));
    assert_eq!(store.get(&"wf-1".into()).await.unwrap().unwrap().trace_parent.as_deref(), Some(TP));
    assert_eq!(store.get_by_biz_key("biz:wf-1").await.unwrap().unwrap().trace_parent.as_deref(), Some(TP));
    let without = seed(store, instance("wf-2")).await;
    assert_eq!(without.trace_parent, None);
    let spec = ClaimSpec { now: T0, lease_ms: LEASE_MS, token: "a".into(), types: vec![TYPE.into()] };
    let claimed = store.claim(&"wf-1".into(), &spec).await.unwrap().expect("claimed");
    assert_eq!(claimed.trace_parent.as_deref(), Some(TP), "a claim returns it");
    let t = Transition::mark_running(0, T0.plus(1));
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    assert_eq!(after.trace_parent.as_deref(), Some(TP), "a transition keeps it");
    let mut failed = failed_instance("wf-3");
    failed.trace_parent = Some(TP.into());
    seed(store, failed).await;
    let replay = Transition::replay(json!({"fencing_token": "f2"}), T0.plus(2));
    let after = check_write(store, "wf-3", &Guard::Failed { unless_round: None }, &replay, true).await;
    assert_eq!(after.trace_parent.as_deref(), Some(TP), "a replay keeps it");
    let any = store.claim_any(&ClaimSpec { token: "b".into(), now: T0.plus(3), ..spec }).await.unwrap();
    let any = any.expect("one of wf-2, wf-3 is due");
    assert_eq!(any.trace_parent.is_some(), any.workflow_id == "wf-3", "{any:?}");
    for bad in
        ["", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", &TP.to_uppercase(), &TP.replace("00-4b", "ff-4b")]
    {
        let mut i = instance("wf-9");
        i.trace_parent = Some(bad.to_string());
        let e = store.create(i).await.expect_err("refused");
        assert!(matches!(&e, Error::InvalidInput { field, .. } if field == "trace_parent"), "{bad:?}: {e:?}");
    }
    assert_eq!(store.get(&"wf-9".into()).await.unwrap(), None, "nothing written");
}

// --- create (no token; unique biz_key) ---------------------------------------------------

/// Create, then read back by id and by biz key.
pub async fn create_and_read_back(store: &DynStore) {
    let inst = seed(store, instance("wf-1")).await;
    assert_eq!(store.get(&"wf-1".into()).await.unwrap(), Some(inst.clone()));
    assert_eq!(store.get_by_biz_key("biz:wf-1").await.unwrap(), Some(inst));
    assert_eq!(store.get(&"wf-2".into()).await.unwrap(), None);
    assert_eq!(store.get_by_biz_key("biz:wf-2").await.unwrap(), None);
}

/// A second create with the same biz key returns the stored instance untouched (K-5).
pub async fn create_existing_biz_key_returns_stored(store: &DynStore) {
    let inst = seed(store, instance("wf-1")).await;
    let mut other = instance("wf-2");
    other.biz_key = inst.biz_key.clone();
    match store.create(other).await.unwrap() {
        CreateOutcome::Exists(e) => assert_eq!(e, inst),
        c => panic!("expected Exists, got {c:?}"),
    }
    assert_eq!(store.get(&"wf-2".into()).await.unwrap(), None, "the loser wrote nothing");
}

/// Concurrent creates of one biz key: exactly one `Created`, the rest `Exists` (K-3.2).
pub async fn create_race_one_winner(store: &DynStore) {
    create_race(store, 8).await;
}

/// `n` concurrent creates of one biz key with distinct workflow ids; asserts one winner.
pub async fn create_race(store: &DynStore, n: usize) {
    let attempts = (0..n).map(|k| {
        let mut i = instance(&format!("wf-{k:02}"));
        i.biz_key = "biz:race".to_string();
        store.create(i)
    });
    let results = futures::future::join_all(attempts).await;
    let mut winner = None;
    for r in &results {
        if let CreateOutcome::Created(c) = r.as_ref().expect("create") {
            assert!(winner.replace(c.workflow_id.clone()).is_none(), "two winners");
        }
    }
    let winner = winner.expect("one winner");
    for r in results {
        if let CreateOutcome::Exists(e) = r.unwrap() {
            assert_eq!(e.workflow_id, winner, "every loser sees the winner");
        }
    }
    assert_eq!(store.get_by_biz_key("biz:race").await.unwrap().map(|i| i.workflow_id), Some(winner));
}

/// A workflow id taken under another biz key is a conflict, not an `Exists`.
pub async fn create_duplicate_workflow_id_is_conflict(store: &DynStore) {
    seed(store, instance("wf-1")).await;
    let mut other = instance("wf-1");
    other.biz_key = "biz:other".to_string();
    let r = store.create(other).await;
    assert!(matches!(r, Err(Error::Conflict(_))), "got {r:?}");
    assert_eq!(store.get_by_biz_key("biz:other").await.unwrap(), None);
}

/// Identifier rule (K-2.0): bad ids and step names are `InvalidInput` and write nothing.
pub async fn create_rejects_invalid_identifiers(store: &DynStore) {
    let long = "x".repeat(257);
    let cases: Vec<(&str, WorkflowInstance)> = vec![
        ("step name with $", {
            let mut i = instance("wf-1");
            i.steps[1].name = "$where".into();
            i
        }),
        ("step name with .", {
            let mut i = instance("wf-1");
            i.steps[1].name = "a.b".into();
            i
        }),
        ("id over 256 bytes", instance(&long)),
        ("biz key with NUL", {
            let mut i = instance("wf-1");
            i.biz_key = "biz\0x".into();
            i
        }),
        ("empty id", instance("")),
    ];
    for (what, inst) in cases {
        let biz = inst.biz_key.clone();
        assert_invalid(store.create(inst).await, what);
        if kernel_core::validate::identifier("biz_key", &biz).is_ok() {
            assert_eq!(store.get_by_biz_key(&biz).await.unwrap(), None, "{what}: nothing written");
        }
    }
    assert_eq!(store.get(&"wf-1".into()).await.unwrap(), None, "nothing written");
    assert_eq!(store.scan_claimable(None, 10).await.unwrap(), ScanPage::default());
}

/// Values shaped like operators are data: an id `{"$ne": null}` matches only itself, and
/// operator-shaped keys inside input and output are stored verbatim (K-2.0).
pub async fn operator_shaped_values_are_data(store: &DynStore) {
    let evil = r#"{"$ne": null}"#;
    let mut i = instance(evil);
    i.input = json!({"$ne": null, "$where": "sleep(1000)", "a.b": {"$gt": ""}, "$numberLong": "5"});
    seed(store, i.clone()).await;
    seed(store, instance("wf-plain")).await;
    assert_eq!(store.get(&WorkflowId::from(evil)).await.unwrap(), Some(i.clone()));
    assert_eq!(store.get(&WorkflowId::from(r#"{"$ne": 1}"#)).await.unwrap(), None);
    let mut t = Transition::claim(&"tok".into(), T0, LEASE_MS).unwrap();
    t.outputs.push(("fetch".into(), json!({"$set": {"status": "completed"}, "x.y": 1})));
    t.input = Some(json!({"$in": []}));
    t.bump_revision = true;
    check_write(store, evil, &Guard::Active, &t, true).await;
    assert_eq!(store.get(&"wf-plain".into()).await.unwrap(), Some(instance("wf-plain")), "other instances untouched");
}

// --- claim (K-6.2) -----------------------------------------------------------------------

/// `Claimable`: misses when not due, type unregistered or status not claimable; the hit
/// sets lease and token without a revision bump; a second claim within the lease misses.
pub async fn claim_guard(store: &DynStore) {
    seed(store, instance("wf-1")).await;
    seed(store, waiting("wf-w", None, Some(T0.minus(10)))).await;
    assert_eq!(store.claim(&"wf-1".into(), &spec("a", T0.minus(1))).await.unwrap(), None, "not due");
    let mut other_type = spec("a", T0);
    other_type.types = vec!["other".into()];
    assert_eq!(store.claim(&"wf-1".into(), &other_type).await.unwrap(), None, "unregistered type");
    assert_eq!(store.claim(&"wf-w".into(), &spec("a", T0)).await.unwrap(), None, "waiting is not claimable");
    assert_eq!(store.claim(&"wf-missing".into(), &spec("a", T0)).await.unwrap(), None, "missing");
    let prior = store.get(&"wf-1".into()).await.unwrap().unwrap();
    let got = store.claim(&"wf-1".into(), &spec("a", T0)).await.unwrap().expect("due instance is claimed");
    let mut expected = prior.clone();
    Transition::claim(&"a".into(), T0, LEASE_MS).unwrap().apply_to(&mut expected);
    assert_eq!(got, expected, "claim returns the document after the update");
    assert_eq!(got.revision, prior.revision, "claim does not bump revision (K-2.2)");
    assert_eq!(store.get(&"wf-1".into()).await.unwrap(), Some(expected.clone()));
    assert_eq!(store.claim(&"wf-1".into(), &spec("b", T0.plus(1))).await.unwrap(), None, "leased");
    assert_eq!(store.get(&"wf-1".into()).await.unwrap(), Some(expected));
}

/// A failing instance is claimable (the failure finalizer must still run, K-8).
pub async fn claim_failing_instance(store: &DynStore) {
    let mut i = instance("wf-1");
    i.status = WorkflowStatus::Failing;
    seed(store, i).await;
    let got = store.claim(&"wf-1".into(), &spec("a", T0)).await.unwrap().expect("claimed");
    assert_eq!((got.status, got.claim_token.as_deref()), (WorkflowStatus::Failing, Some("a")));
}

/// `claim_any` claims some due instance, never a leased or waiting one.
pub async fn claim_any_takes_a_due_instance(store: &DynStore) {
    assert_eq!(store.claim_any(&spec("a", T0)).await.unwrap(), None, "empty store");
    seed(store, claimed("wf-leased", "x")).await;
    seed(store, waiting("wf-waiting", None, Some(T0.minus(1)))).await;
    assert_eq!(store.claim_any(&spec("a", T0)).await.unwrap(), None, "nothing claimable");
    seed(store, instance("wf-due")).await;
    let got = store.claim_any(&spec("a", T0)).await.unwrap().expect("claimed");
    assert_eq!((got.workflow_id.as_str(), got.claim_token.as_deref()), ("wf-due", Some("a")));
    assert_eq!(store.claim_any(&spec("b", T0)).await.unwrap(), None, "now leased");
}

/// After a re-claim by another worker, a write with the stale token misses (claim lost).
pub async fn stale_token_after_reclaim_is_missed(store: &DynStore) {
    seed(store, instance("wf-1")).await;
    store.claim(&"wf-1".into(), &spec("old", T0)).await.unwrap().expect("first claim");
    // The old worker stalls past its lease; another worker claims.
    store.claim(&"wf-1".into(), &spec("new", T0.plus(LEASE_MS))).await.unwrap().expect("re-claim after expiry");
    check_write(store, "wf-1", &running("old"), &Transition::mark_running(0, T0.plus(LEASE_MS).plus(1)), false).await;
    check_write(
        store,
        "wf-1",
        &Guard::Token { token: "old".into() },
        &Transition::heartbeat(T0.plus(LEASE_MS).plus(1), LEASE_MS).unwrap(),
        false,
    )
    .await;
    check_write(store, "wf-1", &running("new"), &Transition::mark_running(0, T0.plus(LEASE_MS).plus(1)), true).await;
}

// --- token-guarded writes (K-6.4) --------------------------------------------------------

/// Heartbeat under `Token`: wrong token misses; hits on running and failing; no bump.
pub async fn heartbeat_token_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let mut f = claimed("wf-2", "b");
    f.status = WorkflowStatus::Failing;
    seed(store, f).await;
    let hb = Transition::heartbeat(T0.plus(10_000), LEASE_MS).unwrap();
    check_write(store, "wf-1", &Guard::Token { token: "b".into() }, &hb, false).await;
    check_write(store, "wf-1", &Guard::Token { token: "a".into() }, &hb, true).await;
    check_write(store, "wf-2", &Guard::Token { token: "b".into() }, &hb, true).await;
}

/// Mark running under `Running`: wrong token and right token on a failing instance miss.
pub async fn mark_running_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let mut f = claimed("wf-2", "a");
    f.status = WorkflowStatus::Failing;
    seed(store, f).await;
    let t = Transition::mark_running(2, T0.plus(1));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    check_write(store, "wf-2", &running("a"), &t, false).await;
    check_write(store, "wf-1", &running("a"), &t, true).await;
}

/// CompleteStep: status and output in one write; clears resume.
pub async fn complete_step_guard(store: &DynStore) {
    let mut i = claimed("wf-1", "a");
    i.resume = Some(Resume { kind: ResumeKind::Signal, step_index: 1, signal_id: Some("sig-1".into()) });
    seed(store, i).await;
    let t = Transition::complete_step(
        1,
        STEPS[1],
        json!({"summary": "ok", "n": [1, 2.5]}),
        DurationMs::from_millis(250),
        T0.plus(2),
        true,
    );
    check_write(store, "wf-1", &running("b"), &t, false).await;
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    assert_eq!(after.output.len(), 2, "output.<name>, never the whole map");
}

/// SuspendClaim on a timer: waiting, attempt rolled back, claimable at the due time.
pub async fn suspend_timer_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let wait = Wait::Timer { step_index: 1, due: Some(T0.plus(60_000)) };
    let t = Transition::suspend(1, wait, Some(json!({"cursor": 8})), DurationMs::from_millis(40), T0.plus(3));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    assert_eq!(
        (after.status, after.claimable_time, after.steps[1].attempt),
        (WorkflowStatus::Waiting, Some(T0.plus(60_000)), 0)
    );
}

/// SuspendClaim on a signal without poll time: `claimable_time` is unset.
pub async fn suspend_signal_guard(store: &DynStore) {
    let mut i = claimed("wf-1", "a");
    i.resume = Some(Resume { kind: ResumeKind::Timer, step_index: 1, signal_id: None });
    seed(store, i).await;
    let wait = Wait::Signal {
        signal_type: "approved".into(),
        wait_key: "doc:42".into(),
        generation: 3,
        step_index: 1,
        poll_time: None,
    };
    let t = Transition::suspend(1, wait, None, DurationMs::from_millis(0), T0.plus(3));
    let mut f = claimed("wf-2", "a");
    f.status = WorkflowStatus::Failing;
    seed(store, f).await;
    check_write(store, "wf-2", &running("a"), &t, false).await;
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    assert_eq!((after.claimable_time, after.resume.clone(), after.steps[1].checkpoint.clone()), (None, None, None));
}

/// Yield: pending with checkpoint, attempt rolled back, claimable now, claim cleared.
pub async fn yield_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::yield_step(1, Some(json!({"page": 2})), DurationMs::from_millis(10), T0.plus(4));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    check_write(store, "wf-1", &running("a"), &t, true).await;
}

/// A JSON `null` checkpoint is no checkpoint: a durable store cannot tell a `null` field
/// from an absent one, so every store reads both back as `None` (the transition
/// constructors clear the checkpoint for either).
pub async fn null_checkpoint_reads_back_as_none(store: &DynStore) {
    let mut inst = claimed("wf-1", "a");
    inst.steps[1].checkpoint = Some(json!({"page": 2}));
    seed(store, inst).await;
    let t = Transition::park_sibling(1, Some(json!(null)), DurationMs::from_millis(10), T0.plus(5));
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    assert_eq!(after.steps[1].checkpoint, None, "a null checkpoint clears the step's checkpoint");
}

/// A parked sibling (K-4.5): pending with checkpoint, attempt rolled back, claim kept.
pub async fn park_sibling_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::park_sibling(1, None, DurationMs::from_millis(10), T0.plus(4));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    check_write(store, "wf-1", &running("a"), &t, true).await;
}

/// Retry release: step pending with its error, checkpoint cleared, claim released later.
pub async fn retry_release_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::step_retry(1, err(ErrorClass::Transient), DurationMs::from_millis(33), T0.plus(5))
        .release_until(T0.plus(2_000));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    check_write(store, "wf-1", &running("a"), &t, true).await;
}

/// Permit deferral: traffic statistics grow, attempt unchanged, claim released later.
pub async fn permit_deferral_guard(store: &DynStore) {
    let mut i = claimed("wf-1", "a");
    i.steps[1].traffic_wait_ms = DurationMs::from_millis(100);
    i.steps[1].traffic_waits = 2;
    seed(store, i).await;
    let t = Transition::permit_deferral(1, DurationMs::from_millis(500), T0.plus(6)).release_until(T0.plus(500));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    assert_eq!(
        (after.steps[1].traffic_wait_ms, after.steps[1].traffic_waits, after.steps[1].attempt),
        (DurationMs::from_millis(600), 3, 1)
    );
}

/// `on_failed = skip`.
pub async fn skip_step_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::skip_step(1, err(ErrorClass::Permanent), DurationMs::from_millis(7), T0.plus(7));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    check_write(store, "wf-1", &running("a"), &t, true).await;
}

/// Step failed for good: the workflow goes failing in the same write.
pub async fn step_failed_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::step_failed(1, err(ErrorClass::Permanent), DurationMs::from_millis(7), T0.plus(8));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    assert_eq!((after.status, after.claim_token.as_deref()), (WorkflowStatus::Failing, Some("a")));
}

/// `running → failing` under `Running`.
pub async fn failing_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::failing(T0.plus(9));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    check_write(store, "wf-1", &running("a"), &t, true).await;
}

/// `failing → failed` under `Failing`: a running instance with the right token misses.
pub async fn failed_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let mut f = claimed("wf-2", "a");
    f.status = WorkflowStatus::Failing;
    seed(store, f).await;
    let t = Transition::failed(T0.plus(10));
    check_write(store, "wf-1", &failing("a"), &t, false).await;
    check_write(store, "wf-2", &failing("b"), &t, false).await;
    let after = check_write(store, "wf-2", &failing("a"), &t, true).await;
    assert_eq!(
        (after.status, after.claim_token.clone(), after.finished_at),
        (WorkflowStatus::Failed, None, Some(T0.plus(10)))
    );
}

/// `running → completed` under `Running`.
pub async fn completed_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::completed(T0.plus(11));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    check_write(store, "wf-1", &running("a"), &t, true).await;
}

/// The activity reported cancellation: step skipped, workflow canceled, claim cleared.
pub async fn activity_canceled_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::activity_canceled(1, err(ErrorClass::Canceled), DurationMs::from_millis(3), T0.plus(12));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    check_write(store, "wf-1", &running("a"), &t, true).await;
}

/// A failure finalizer error releases the failing claim with a delay.
pub async fn finalizer_release_guard(store: &DynStore) {
    let mut f = claimed("wf-1", "a");
    f.status = WorkflowStatus::Failing;
    seed(store, f).await;
    let t = Transition::finalizer_release(T0.plus(13), DurationMs::from_millis(5_000)).unwrap();
    check_write(store, "wf-1", &failing("b"), &t, false).await;
    check_write(store, "wf-1", &failing("a"), &t, true).await;
}

/// A failed PrepareContext (K-2.3) under `Running`: the failure count is stored, read back
/// after every further write, carried by a `failing` write, and reset by replay.
pub async fn prepare_failures_round_trip(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::prepare_release(2, T0.plus(13), DurationMs::from_millis(5_000)).unwrap();
    check_write(store, "wf-1", &running("b"), &t, false).await;
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    assert_eq!(after.prepare_failures, 2);
    let claim = ClaimSpec {
        now: T0.plus(5_013),
        lease_ms: LEASE_MS,
        token: "c".to_string().into(),
        types: vec![TYPE.to_string()],
    };
    let claimed_again = store.claim(&"wf-1".into(), &claim).await.unwrap().expect("claimable after the delay");
    assert_eq!(claimed_again.prepare_failures, 2, "the count survives claims");
    let mut t = Transition::failing(T0.plus(5_014));
    t.prepare_failures = Some(3);
    let after = check_write(store, "wf-1", &running("c"), &t, true).await;
    assert_eq!((after.status, after.prepare_failures), (WorkflowStatus::Failing, 3));
    let t = Transition::failed(T0.plus(5_015));
    check_write(store, "wf-1", &failing("c"), &t, true).await;
    let t = Transition::replay(json!({"fencing_token": "f2"}), T0.plus(5_016));
    let after = check_write(store, "wf-1", &Guard::replay(&json!({"fencing_token": "f2"})), &t, true).await;
    assert_eq!(after.prepare_failures, 0, "replay resets the count");
}

/// A refused plain write's hand-back (K-6.4) under `Running`: the run's count is stored,
/// survives claims and further writes, and replay resets it.
pub async fn refused_writes_round_trip(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::refused_release(2, T0.plus(13), DurationMs::from_millis(5_000)).unwrap();
    check_write(store, "wf-1", &running("b"), &t, false).await;
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    assert_eq!((after.refused_writes, after.claimable_time), (2, Some(T0.plus(5_013))));
    let claim = ClaimSpec {
        now: T0.plus(5_013),
        lease_ms: LEASE_MS,
        token: "c".to_string().into(),
        types: vec![TYPE.to_string()],
    };
    let claimed_again = store.claim(&"wf-1".into(), &claim).await.unwrap().expect("claimable after the delay");
    assert_eq!(claimed_again.refused_writes, 2, "the count survives claims");
    let after = check_write(store, "wf-1", &running("c"), &Transition::failing(T0.plus(5_014)), true).await;
    assert_eq!(after.refused_writes, 2, "a write that does not set it leaves it");
    check_write(store, "wf-1", &failing("c"), &Transition::failed(T0.plus(5_015)), true).await;
    let t = Transition::replay(json!({"fencing_token": "f2"}), T0.plus(5_016));
    let after = check_write(store, "wf-1", &Guard::replay(&json!({"fencing_token": "f2"})), &t, true).await;
    assert_eq!(after.refused_writes, 0, "replay resets the count");
}

/// Release without progress (shutdown between waves).
pub async fn release_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::release(T0.plus(14));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    check_write(store, "wf-1", &running("a"), &t, true).await;
}

/// Fingerprint push-back under `Token` (K-4.3): no step touched, both fingerprints kept.
pub async fn fingerprint_push_back_guard(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::fingerprint_push_back("fp-1", "fp-2", T0.plus(15), DurationMs::from_millis(3_600_000)).unwrap();
    check_write(store, "wf-1", &Guard::Token { token: "b".into() }, &t, false).await;
    let after = check_write(store, "wf-1", &Guard::Token { token: "a".into() }, &t, true).await;
    assert_eq!(after.steps, claimed("wf-1", "a").steps);
}

/// A fused write (K-7.1): complete step 1 + mark step 2 running, revision bumped once.
pub async fn fused_write_bumps_revision_once(store: &DynStore) {
    seed(store, claimed("wf-1", "a")).await;
    let t = Transition::complete_step(1, STEPS[1], json!("done"), DurationMs::from_millis(20), T0.plus(16), false)
        .fuse(Transition::mark_running(2, T0.plus(16)));
    check_write(store, "wf-1", &running("b"), &t, false).await;
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    assert_eq!(after.revision, claimed("wf-1", "a").revision + 1);
}

/// The completion order (K-17.6 amendment): a step's `completed_revision` round-trips
/// through create and read (a value past 2^53, so no adapter goes through a float), the
/// write that completes steps stores the stamp it carries on each of them (fused: both
/// with the one revision), a patch can clear it, and replay clears it from the failed
/// steps it resets while a completed step keeps its own.
pub async fn completed_revision_round_trip(store: &DynStore) {
    let mut inst = claimed("wf-1", "a");
    inst.steps[0].status = StepStatus::Completed;
    inst.steps[0].completed_revision = Some((1 << 53) + 1);
    let inst = seed(store, inst).await;
    let read = store.get(&"wf-1".into()).await.expect("get").expect("exists");
    assert_eq!(read.steps[0].completed_revision, Some((1 << 53) + 1));
    let mut t = Transition::complete_step(1, STEPS[1], json!("done"), DurationMs::from_millis(20), T0.plus(16), false)
        .fuse(Transition::complete_step(2, STEPS[2], json!("too"), DurationMs::ZERO, T0.plus(16), false));
    t.stamp_completions(inst.revision + 1);
    check_write(store, "wf-1", &running("b"), &t, false).await;
    let after = check_write(store, "wf-1", &running("a"), &t, true).await;
    let stamps: Vec<Option<u64>> = after.steps.iter().map(|s| s.completed_revision).collect();
    assert_eq!(stamps, vec![Some((1 << 53) + 1), Some(after.revision), Some(after.revision)]);
    let mut clear = Transition::release_after(T0.plus(17), DurationMs::ZERO).expect("release");
    clear.step_mut(2).completed_revision = Some(Patch::Unset);
    let after = check_write(store, "wf-1", &running("a"), &clear, true).await;
    assert_eq!(after.steps[2].completed_revision, None);

    let mut f = failed_instance("wf-2");
    f.steps[0].status = StepStatus::Completed;
    f.steps[0].completed_revision = Some(2);
    f.steps[1].completed_revision = Some(3);
    seed(store, f).await;
    let replay = Transition::replay(json!({"fencing_token": "f2"}), T0.plus(22));
    let after = check_write(store, "wf-2", &Guard::Failed { unless_round: None }, &replay, true).await;
    assert_eq!((after.steps[0].completed_revision, after.steps[1].completed_revision), (Some(2), None));
}

// --- no-token writes ---------------------------------------------------------------------

/// Timer activation under `DueWait`: not due and wrong step miss; the hit keeps
/// `claimable_time` and sets `resume.kind = timer`.
pub async fn timer_activation_guard(store: &DynStore) {
    seed(store, waiting("wf-1", None, Some(T0.plus(1_000)))).await;
    let t = Transition::timer_activation(1, ResumeKind::Timer, T0.plus(1_000));
    check_write(store, "wf-1", &Guard::DueWait { now: T0.plus(999), step_index: 1 }, &t, false).await;
    check_write(store, "wf-1", &Guard::DueWait { now: T0.plus(1_000), step_index: 2 }, &t, false).await;
    let after = check_write(store, "wf-1", &Guard::DueWait { now: T0.plus(1_000), step_index: 1 }, &t, true).await;
    assert_eq!((after.status, after.claimable_time), (WorkflowStatus::Running, Some(T0.plus(1_000))));
    check_write(store, "wf-1", &Guard::DueWait { now: T0.plus(1_000), step_index: 1 }, &t, false).await;
}

/// A signal wait's poll fallback (K-9.5) activates with `resume.kind = poll`.
pub async fn poll_activation_guard(store: &DynStore) {
    seed(store, waiting("wf-1", Some(1), Some(T0.plus(500)))).await;
    let t = Transition::timer_activation(1, ResumeKind::Poll, T0.plus(600));
    check_write(store, "wf-1", &Guard::DueWait { now: T0.plus(499), step_index: 1 }, &t, false).await;
    check_write(store, "wf-1", &Guard::DueWait { now: T0.plus(600), step_index: 1 }, &t, true).await;
}

/// Signal activation under `SignalWait`: stale generation, other key, other type and a
/// timer wait miss (K-9.6); the hit is claimable now with `resume = signal`.
pub async fn signal_activation_guard(store: &DynStore) {
    seed(store, waiting("wf-1", Some(2), None)).await;
    seed(store, waiting("wf-t", None, Some(T0))).await;
    let id = WaitIdentity { signal_type: "approved".into(), wait_key: "doc:42".into(), generation: 2, step_index: 1 };
    let t = Transition::signal_activation(1, "sig-1", T0.plus(20));
    let with = |f: &dyn Fn(&mut WaitIdentity)| {
        let mut x = id.clone();
        f(&mut x);
        Guard::SignalWait(x)
    };
    check_write(store, "wf-1", &with(&|x| x.generation = 1), &t, false).await;
    check_write(store, "wf-1", &with(&|x| x.wait_key = "doc:43".into()), &t, false).await;
    check_write(store, "wf-1", &with(&|x| x.signal_type = "rejected".into()), &t, false).await;
    check_write(store, "wf-1", &with(&|x| x.step_index = 0), &t, false).await;
    check_write(
        store,
        "wf-t",
        &Guard::SignalWait(WaitIdentity {
            signal_type: "approved".into(),
            wait_key: "doc:42".into(),
            generation: 0,
            step_index: 1,
        }),
        &t,
        false,
    )
    .await;
    let after = check_write(store, "wf-1", &Guard::SignalWait(id.clone()), &t, true).await;
    assert_eq!(
        (after.status, after.claimable_time, after.wait.clone()),
        (WorkflowStatus::Running, Some(T0.plus(20)), None)
    );
    check_write(store, "wf-1", &Guard::SignalWait(id), &t, false).await;
}

/// Cancel / supersede under `Active`: hits waiting (and running), misses terminal.
pub async fn supersede_guard(store: &DynStore) {
    seed(store, waiting("wf-1", Some(1), Some(T0.plus(5)))).await;
    let mut done = instance("wf-2");
    done.status = WorkflowStatus::Completed;
    done.claimable_time = None;
    seed(store, done).await;
    let t = Transition::supersede(T0.plus(21));
    check_write(store, "wf-2", &Guard::Active, &t, false).await;
    check_write(store, "wf-1", &Guard::Active, &t, true).await;
    check_write(store, "wf-1", &Guard::Active, &t, false).await;
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

/// Replay under `Failed` (K-5): failed steps reset to pending, completed and skipped kept,
/// input replaced, `retry_count + 1`; a running instance misses.
pub async fn replay_guard(store: &DynStore) {
    seed(store, failed_instance("wf-1")).await;
    seed(store, claimed("wf-2", "a")).await;
    let t = Transition::replay(json!({"fencing_token": "f2"}), T0.plus(22));
    check_write(store, "wf-2", &Guard::Failed { unless_round: None }, &t, false).await;
    let after = check_write(store, "wf-1", &Guard::Failed { unless_round: None }, &t, true).await;
    assert_eq!(after.steps[1], Step::pending(STEPS[1]), "failed step reset");
    assert_eq!(after.steps[0], claimed("wf-1", "a").steps[0], "completed step kept");
    assert_eq!(after.steps[2].status, StepStatus::Skipped, "skipped step kept");
    assert_eq!((after.retry_count, after.status), (2, WorkflowStatus::Running));
    check_write(store, "wf-1", &Guard::Failed { unless_round: None }, &t, false).await;
}

/// Replay guard with a round (K-5): the failed instance of round f1 is never replayed by
/// a request of round f1; a request of another round replays it, and an instance without a
/// string round is replayed by any round.
pub async fn replay_guard_spares_the_failed_round(store: &DynStore) {
    seed(store, failed_instance("wf-1")).await;
    let mut no_round = failed_instance("wf-2");
    no_round.input = json!({"fencing_token": 7, "tenant": "t-1"});
    seed(store, no_round).await;
    let same = Guard::replay(&json!({"fencing_token": "f1"}));
    assert_eq!(same, Guard::Failed { unless_round: Some("f1".into()) });
    let t = Transition::replay(json!({"fencing_token": "f1", "again": true}), T0.plus(22));
    check_write(store, "wf-1", &same, &t, false).await;
    check_write(store, "wf-2", &same, &t, true).await;
    let next = Transition::replay(json!({"fencing_token": "f2"}), T0.plus(23));
    let after = check_write(store, "wf-1", &Guard::replay(&json!({"fencing_token": "f2"})), &next, true).await;
    assert_eq!((after.retry_count, after.input["fencing_token"].clone()), (2, json!("f2")));
}

/// Concurrent replays of one failed instance: exactly one applies.
pub async fn replay_race_one_winner(store: &DynStore) {
    seed(store, failed_instance("wf-1")).await;
    let t = Transition::replay(json!({"fencing_token": "f2"}), T0.plus(22));
    let id = WorkflowId::from("wf-1");
    let outcomes =
        futures::future::join_all((0..6).map(|_| store.apply(&id, &Guard::Failed { unless_round: None }, &t))).await;
    let applied = outcomes.into_iter().map(|o| o.expect("apply")).filter(WriteOutcome::applied).count();
    assert_eq!(applied, 1);
    assert_eq!(store.get(&"wf-1".into()).await.unwrap().unwrap().retry_count, 2);
}

/// Priority raise under `PriorityBelow` (promote-only): equal, lower and terminal miss.
pub async fn priority_raise_guard(store: &DynStore) {
    seed(store, instance("wf-1")).await;
    let mut done = instance("wf-2");
    done.status = WorkflowStatus::Canceled;
    seed(store, done).await;
    check_write(
        store,
        "wf-1",
        &Guard::PriorityBelow(Priority::P2),
        &Transition::priority_raise(Priority::P2, T0),
        false,
    )
    .await;
    check_write(
        store,
        "wf-1",
        &Guard::PriorityBelow(Priority::P3),
        &Transition::priority_raise(Priority::P3, T0),
        false,
    )
    .await;
    check_write(
        store,
        "wf-2",
        &Guard::PriorityBelow(Priority::P0),
        &Transition::priority_raise(Priority::P0, T0),
        false,
    )
    .await;
    let after = check_write(
        store,
        "wf-1",
        &Guard::PriorityBelow(Priority::P1),
        &Transition::priority_raise(Priority::P1, T0),
        true,
    )
    .await;
    assert_eq!(after.business_priority, Priority::P1);
}

// --- misses and bad input on apply -------------------------------------------------------

/// Any guard on a missing instance misses.
pub async fn apply_to_missing_instance_is_missed(store: &DynStore) {
    let r = store.apply(&"wf-none".into(), &Guard::Active, &Transition::supersede(T0)).await.unwrap();
    assert_eq!(r, WriteOutcome::Missed);
    assert_eq!(store.get(&"wf-none".into()).await.unwrap(), None, "no upsert");
}

/// Output names with `$` or `.` and a step index past the end are `InvalidInput`; nothing
/// is written.
pub async fn apply_rejects_bad_names_and_indices(store: &DynStore) {
    let inst = seed(store, claimed("wf-1", "a")).await;
    for name in ["$where", "a.b", ""] {
        let t = Transition::complete_step(1, name, json!(1), DurationMs::from_millis(0), T0, false);
        assert_invalid(store.apply(&"wf-1".into(), &running("a"), &t).await, name);
    }
    assert_invalid(store.apply(&"wf-1".into(), &running("a"), &Transition::mark_running(7, T0)).await, "step index 7");
    assert_eq!(store.get(&"wf-1".into()).await.unwrap(), Some(inst), "nothing written");
}

// --- the shared K-2.0 rule: one case per refused input ----------------------------------

/// K-2.0: a wait key with NUL is refused by `apply` (suspend), by a signal-wait guard and by
/// `create`, as [`Error::InvalidInput`] naming the field; nothing is written.
pub async fn k2_0_bad_wait_key_is_refused(store: &DynStore) {
    refused_writes_nothing(store, |store| {
        Box::pin(async move {
            let t = Transition::suspend(1, signal_wait("doc\0"), None, DurationMs::from_millis(0), T0);
            assert_invalid_field(store.apply(&"wf-1".into(), &running("a"), &t).await, "wait.wait_key");
            let id =
                WaitIdentity { signal_type: "approved".into(), wait_key: "doc\0".into(), generation: 1, step_index: 1 };
            let t = Transition::signal_activation(1, "sig-1", T0);
            assert_invalid_field(store.apply(&"wf-1".into(), &Guard::SignalWait(id), &t).await, "wait_key");
            let i = bad_instance(|i| i.wait = Some(signal_wait("doc\0")));
            assert_invalid_field(store.create(i).await, "wait.wait_key");
        })
    })
    .await;
}

/// K-2.0: an output, checkpoint or input over the shared payload limit
/// ([`STORE_PAYLOAD_BYTES_MAX`](kernel_core::validate::STORE_PAYLOAD_BYTES_MAX)) is refused
/// by `apply` and `create`; nothing is written.
pub async fn k2_0_oversize_payload_is_refused(store: &DynStore) {
    refused_writes_nothing(store, |store| {
        Box::pin(async move {
            let big = oversize_payload();
            let t = Transition::complete_step(1, "compose", big.clone(), DurationMs::from_millis(0), T0, false);
            assert_invalid_field(store.apply(&"wf-1".into(), &running("a"), &t).await, "output.compose");
            let t = Transition::yield_step(1, Some(big.clone()), DurationMs::from_millis(0), T0);
            assert_invalid_field(store.apply(&"wf-1".into(), &running("a"), &t).await, "steps.1.checkpoint");
            let mut t = Transition::failing(T0);
            t.input = Some(big.clone());
            assert_invalid_field(store.apply(&"wf-1".into(), &running("a"), &t).await, "input");
            assert_invalid_field(store.create(bad_instance(|i| i.input = big.clone())).await, "input");
            let i = bad_instance(|i| i.steps[1].checkpoint = Some(big));
            assert_invalid_field(store.create(i).await, "steps[1].checkpoint");
        })
    })
    .await;
}

/// K-2.0: a claim token with a control character is refused as a guard, as a written token,
/// in a claim and in `create`; nothing is written.
pub async fn k2_0_bad_token_is_refused(store: &DynStore) {
    refused_writes_nothing(store, |store| {
        Box::pin(async move {
            let t = Transition::failing(T0);
            assert_invalid_field(store.apply(&"wf-1".into(), &running("a\0"), &t).await, "claim_token");
            let mut t = Transition::heartbeat(T0, LEASE_MS).unwrap();
            t.claim_token = Some(kernel_core::transition::Patch::Set("b\n".into()));
            assert_invalid_field(
                store.apply(&"wf-1".into(), &Guard::Token { token: "a".into() }, &t).await,
                "claim_token",
            );
            assert_invalid_field(store.claim(&"wf-2".into(), &spec("t\0", T0)).await, "claim_token");
            assert_invalid_field(store.claim_any(&spec("", T0)).await, "claim_token");
            let i = bad_instance(|i| i.claim_token = Some("t\u{7}".into()));
            assert_invalid_field(store.create(i).await, "claim_token");
        })
    })
    .await;
}

/// K-2.0: output names are document keys: a `$` prefix or a `.` is refused by `apply` and
/// `create`; nothing is written.
pub async fn k2_0_bad_output_key_is_refused(store: &DynStore) {
    refused_writes_nothing(store, |store| {
        Box::pin(async move {
            for name in ["$set", "a.b"] {
                let t = Transition::complete_step(1, name, json!(1), DurationMs::from_millis(0), T0, false);
                assert_invalid_field(store.apply(&"wf-1".into(), &running("a"), &t).await, "output");
            }
            let i = bad_instance(|i| _ = i.output.insert("$where".into(), json!(1)));
            assert_invalid_field(store.create(i).await, "output");
        })
    })
    .await;
}

/// K-2.0: values no store can represent ([`validate::storable`](kernel_core::validate::storable):
/// an integer above `i64::MAX`, NUL in a nested object key or in a string, nesting deeper than
/// [`PAYLOAD_DEPTH_MAX`](kernel_core::validate::PAYLOAD_DEPTH_MAX)) are refused by `apply`
/// and `create` before the write, whatever the backend; nothing is written.
pub async fn k2_0_unrepresentable_values_are_refused(store: &DynStore) {
    refused_writes_nothing(store, |store| {
        Box::pin(async move {
            let deep = (0..=kernel_core::validate::PAYLOAD_DEPTH_MAX).fold(json!(1), |v, _| json!({ "n": v }));
            let values = [
                json!({ "amount": u64::MAX }),
                json!({ "a": [{ "b\u{0}c": 1 }] }),
                json!({ "a": [{ "b": "x\u{0}y" }] }),
                deep,
                json!({ "link": { "$ref": "x" } }),
            ];
            for v in values {
                let t = Transition::complete_step(1, "compose", v.clone(), DurationMs::from_millis(0), T0, false);
                assert_invalid_field(store.apply(&"wf-1".into(), &running("a"), &t).await, "output.compose");
                let t = Transition::yield_step(1, Some(v.clone()), DurationMs::from_millis(0), T0);
                assert_invalid_field(store.apply(&"wf-1".into(), &running("a"), &t).await, "steps.1.checkpoint");
                assert_invalid_field(store.create(bad_instance(|i| i.input = v.clone())).await, "input");
            }
        })
    })
    .await;
}

// --- names are data (K-2.0 amendment) -----------------------------------------------------

/// Pairs of names K-2.0 admits (1–256 bytes of UTF-8, no control character, no `$` prefix,
/// no `.`) where the second reads as the first once a JSON or path escape is decoded (or,
/// the last pair, once Unicode is normalized): a store that pastes a name into a path instead
/// of binding or escaping it addresses the first when asked for the second. Every store keeps
/// them apart (K-2.0 amendment).
pub const ESCAPE_LOOKALIKE_NAMES: [(&str, &str); 4] =
    [("xA", "x\\u0041"), ("é", "\\u00e9"), ("名前", "\\u540d\\u524d"), ("café", "cafe\u{301}")];

/// Pairs of names K-2.0 admits holding backslashes: a trailing one (it escapes the closing
/// quote of a quoted path label), one beside two, one inside. Each is data on every store.
pub const BACKSLASH_NAMES: [(&str, &str); 3] = [("tail", "tail\\"), ("\\", "\\\\"), ("a\\b", "a\\\\b")];

/// Pairs of names K-2.0 admits holding what a path or query language reads as syntax:
/// double quotes and their escapes, single quotes and SQL's escape of them, brackets. Each
/// is data on every store.
pub const QUOTE_NAMES: [(&str, &str); 5] =
    [("q", "q\""), ("a\"b", "a\\\"b"), ("\"", "\\u0022"), ("it's", "it''s"), ("a[0]", "a[0]*")];

/// Names with a control character (K-2.0 refuses them in every identifier and key): tab,
/// line feed, NUL, escape, DEL and a C1 control.
pub const CONTROL_CHARACTER_NAMES: [&str; 6] =
    ["tab\there", "line\nfeed", "nul\0byte", "esc\u{1b}[0m", "del\u{7f}", "c1\u{85}"];

/// Seed `wf-names` with one pending step per name of `pairs` and the outputs of the first
/// name of each pair; complete the steps of the second names in one write; then remove their
/// outputs (a loop's back-edge). After each write the stored instance equals the reference
/// semantics and every first name keeps its own output: writing or removing a name never
/// touches another. Six store operations.
async fn distinct_names_stay_distinct(store: &DynStore, pairs: &[(&str, &str)]) {
    let id = "wf-names";
    let mut inst = claimed(id, "a");
    inst.steps = pairs.iter().flat_map(|(a, b)| [*a, *b]).map(Step::pending).collect();
    inst.output = pairs.iter().map(|(a, _)| (a.to_string(), json!({ "of": a }))).collect();
    let inst = seed(store, inst).await;
    assert_eq!(store.get(&id.into()).await.unwrap().as_ref(), Some(&inst), "names read back as created");
    let second = |k: usize| 2 * k + 1;
    let mut t = Transition::complete_step(
        second(0),
        pairs[0].1,
        json!({ "of": pairs[0].1 }),
        DurationMs::from_millis(0),
        T0,
        false,
    );
    for (k, (_, b)) in pairs.iter().enumerate().skip(1) {
        t.outputs.push((b.to_string(), json!({ "of": b })));
        t.step_mut(second(k)).status = Some(StepStatus::Completed);
    }
    let outcome = store.apply(&id.into(), &running("a"), &t).await;
    assert!(matches!(outcome, Ok(WriteOutcome::Applied { .. })), "writing the second names: {outcome:?}");
    let after = store.get(&id.into()).await.unwrap().expect("instance");
    for (a, b) in pairs {
        assert_eq!(after.output.get(*a), Some(&json!({ "of": a })), "writing output `{b}` changed output `{a}`");
        assert_eq!(after.output.get(*b), Some(&json!({ "of": b })), "output `{b}` stored under its own name");
    }
    let mut expected = inst.clone();
    t.apply_to(&mut expected);
    assert_eq!(after, expected, "the stored instance equals Transition::apply_to");
    let resets = (0..pairs.len()).map(|k| (second(k), 1, Vec::new(), None)).collect();
    let unset = pairs.iter().map(|(_, b)| b.to_string()).collect();
    let t = Transition::loop_back(second(0), resets, unset, false, T0.plus(1));
    let outcome = store.apply(&id.into(), &running("a"), &t).await;
    assert!(matches!(outcome, Ok(WriteOutcome::Applied { .. })), "removing the second names: {outcome:?}");
    let removed = store.get(&id.into()).await.unwrap().expect("instance");
    for (a, b) in pairs {
        assert_eq!(removed.output.get(*a), Some(&json!({ "of": a })), "removing output `{b}` changed output `{a}`");
        assert_eq!(removed.output.get(*b), None, "output `{b}` removed");
    }
    t.apply_to(&mut expected);
    assert_eq!(removed, expected, "the stored instance equals Transition::apply_to");
}

/// K-2.0 (amendment): a name that reads as another once an escape is decoded (`x\u0041`
/// beside `xA`, `\u00e9` beside `é`, a decomposed `é` beside the composed one: no store
/// normalizes) is its own name on every store: created, written and removed without
/// touching the other.
pub async fn k2_0_escape_lookalike_names_stay_distinct(store: &DynStore) {
    distinct_names_stay_distinct(store, &ESCAPE_LOOKALIKE_NAMES).await;
}

/// K-2.0 (amendment): names with backslashes (a trailing one among them) are data on every
/// store: written and removed like any name, neither refused nor an outage, without touching
/// the names they resemble.
pub async fn k2_0_names_with_backslashes_are_data(store: &DynStore) {
    distinct_names_stay_distinct(store, &BACKSLASH_NAMES).await;
}

/// K-2.0 (amendment): names with double or single quotes or brackets are data on every
/// store: created, written and removed like any name, without touching the names they
/// resemble.
pub async fn k2_0_names_with_quotes_are_data(store: &DynStore) {
    distinct_names_stay_distinct(store, &QUOTE_NAMES).await;
}

/// K-2.0: a step or output name with a control character is refused identically on every
/// store, by the one validation of kernel-core, before anything is sent: as an output
/// written or removed by `apply`, as a step name or an output key in `create`; nothing is
/// written.
pub async fn k2_0_control_characters_in_names_are_refused(store: &DynStore) {
    refused_writes_nothing(store, |store| {
        Box::pin(async move {
            for name in CONTROL_CHARACTER_NAMES {
                let t = Transition::complete_step(1, name, json!(1), DurationMs::from_millis(0), T0, false);
                assert_invalid_field(store.apply(&"wf-1".into(), &running("a"), &t).await, "output");
                let t = Transition::loop_back(1, vec![(1, 1, Vec::new(), None)], vec![name.into()], false, T0);
                assert_invalid_field(store.apply(&"wf-1".into(), &running("a"), &t).await, "output");
                let i = bad_instance(|i| i.steps[1].name = name.into());
                assert_invalid_field(store.create(i).await, "steps[1].name");
                let i = bad_instance(|i| _ = i.output.insert(name.into(), json!(1)));
                assert_invalid_field(store.create(i).await, "output");
            }
        })
    })
    .await;
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

/// Shared expansion of the conformance macros: one test per case, teardown even on panic.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ($module:ident, $fixture:ident, $port:ident, $factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[::tokio::test]
            async fn $case() {
                use $crate::conformance::store::__futures::FutureExt as _;
                let Some(fixture) = ($factory)().await else { return };
                let port = $crate::conformance::$module::$fixture::$port(&fixture);
                let outcome = ::std::panic::AssertUnwindSafe($crate::conformance::$module::$case(port)).catch_unwind().await;
                $crate::conformance::$module::$fixture::teardown(fixture).await;
                if let Err(panic) = outcome {
                    ::std::panic::resume_unwind(panic);
                }
            }
        )*
    };
}
