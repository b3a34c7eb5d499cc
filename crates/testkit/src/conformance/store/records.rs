//! Store conformance cases of a step's record and the operator's writes: the record and its
//! history, regenerate, operator requests under the holder's token, dead letters, loops and
//! branches, the compensation report, the trace parent.

use super::*;
use crate::time::TestTime;
use kernel_core::operator_request::RequestedAction;
use kernel_core::transition::{Guard, Transition};
use kernel_core::Error;
use serde_json::json;

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
