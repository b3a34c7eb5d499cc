//! Conformance cases for the [`DeadLetters`] port (K-17.2).
//!
//! Same shape as the [store suite](super::store): `pub async fn case(dl: &DynDeadLetters)`
//! on an empty store, and [`dead_letter_conformance!`](crate::dead_letter_conformance)
//! expanding to one `#[tokio::test]` per case from a factory
//! `|| async { Option<impl DeadLetterFixture> }`. Every write is checked by reading the
//! record back and comparing it with the expected record in full.

use super::store::{assert_invalid_field, oversize_payload};
use crate::memory::MemoryDeadLetters;
use crate::time::TestTime;
use kernel_core::domain::{ErrorClass, Instant, StepError};
use kernel_core::ports::*;
use serde_json::json;
use std::sync::Arc;

/// A dead-letter store under test plus whatever must be cleaned up after the case.
pub trait DeadLetterFixture: Send + Sync + 'static {
    /// The port under test.
    fn dead_letters(&self) -> &DynDeadLetters;
    /// Drop the fixture's namespace; the default does nothing.
    fn teardown(self) -> futures::future::BoxFuture<'static, ()>
    where
        Self: Sized,
    {
        Box::pin(async {})
    }
}

impl DeadLetterFixture for MemoryDeadLetters {
    fn dead_letters(&self) -> &DynDeadLetters {
        self
    }
}

impl DeadLetterFixture for Arc<DynDeadLetters> {
    fn dead_letters(&self) -> &DynDeadLetters {
        &**self
    }
}

const T0: Instant = super::store::T0;

/// An open dead letter of step `charge` (index 2) of `wf-1`, with nested, unicode inputs.
pub fn letter(id: &str) -> DeadLetter {
    DeadLetter {
        id: id.to_string(),
        workflow_id: "wf-1".into(),
        workflow_type: "order".to_string(),
        step: "charge".to_string(),
        step_index: 2,
        run: 1,
        epoch: 3,
        error: StepError {
            class: ErrorClass::Permanent,
            message: "card declined: «insufficient funds» 💳".to_string(),
        },
        inputs: json!({"amount": 1250, "currency": "EUR", "items": [{"sku": "a-1", "qty": 2}]}),
        created_at: T0,
        status: DeadLetterStatus::Open,
        decision: None,
        closed_at: None,
    }
}

/// A decision by `actor`.
pub fn decision(actor: &str, action: DeadLetterAction, at: Instant) -> DeadLetterDecision {
    DeadLetterDecision { action, actor: actor.to_string(), reason: Some(format!("decided by {actor}")), decided_at: at }
}

async fn record_new(dl: &DynDeadLetters, d: DeadLetter) -> DeadLetter {
    assert!(dl.record(&d).await.expect("record"), "inserted: {}", d.id);
    d
}

fn ids(v: Vec<DeadLetter>) -> Vec<String> {
    v.into_iter().map(|d| d.id).collect()
}

/// Everything, for the "nothing written" checks.
async fn everything(dl: &DynDeadLetters) -> Vec<DeadLetter> {
    dl.list(None, None, DEAD_LETTER_LIST_MAX).await.expect("list")
}

/// Record, then read back every field exactly: unicode texts, nested inputs with
/// extreme integers, floats, operator-shaped and dotted keys, the largest counters.
pub async fn record_and_get_round_trip(dl: &DynDeadLetters) {
    let d = DeadLetter {
        id: "wf-ü:步骤:7".to_string(),
        workflow_id: "wf-ü".into(),
        workflow_type: "commande-été".to_string(),
        step: "débit_carte".to_string(),
        step_index: 17,
        run: 4,
        epoch: u32::MAX,
        error: StepError { class: ErrorClass::UnknownOutcome, message: "timeout «ü» \n line 2 ✓".to_string() },
        inputs: json!({
            "nested": {"deep": [[1, [2, {"x": null}]], {"$gt": "", "a.b": true}]},
            "ints": [i64::MAX, i64::MIN, 0, -1],
            "float": 1.5,
            "text": "naïve — 日本語 🚀",
            "empty": {}, "list": [],
        }),
        created_at: T0.plus(42),
        status: DeadLetterStatus::Open,
        decision: None,
        closed_at: None,
    };
    record_new(dl, d.clone()).await;
    assert_eq!(dl.get(&d.id).await.unwrap(), Some(d.clone()));
    let scalar = DeadLetter {
        inputs: json!("just a string"),
        error: StepError { message: String::new(), ..d.error.clone() },
        ..letter("dl-scalar")
    };
    record_new(dl, scalar.clone()).await;
    assert_eq!(dl.get("dl-scalar").await.unwrap(), Some(scalar), "scalar inputs, empty message");
    assert_eq!(dl.get("dl-unknown").await.unwrap(), None);
}

/// Recording an existing id again returns `false` and changes nothing, also after the
/// record was decided (a re-record after a crash never reopens it).
pub async fn re_record_same_id_changes_nothing(dl: &DynDeadLetters) {
    let d = record_new(dl, letter("dl-1")).await;
    let other = DeadLetter {
        workflow_id: "wf-2".into(),
        epoch: 9,
        error: StepError { class: ErrorClass::Transient, message: "other".to_string() },
        inputs: json!({"other": true}),
        created_at: T0.plus(100),
        ..letter("dl-1")
    };
    assert!(!dl.record(&other).await.unwrap(), "existing id");
    assert_eq!(dl.get("dl-1").await.unwrap(), Some(d.clone()), "unchanged");
    let dec = decision("ops", DeadLetterAction::Retry, T0.plus(5));
    assert_eq!(dl.decide("dl-1", &dec).await.unwrap(), DecideOutcome::Decided);
    assert!(!dl.record(&letter("dl-1")).await.unwrap(), "existing decided id");
    let decided = DeadLetter { status: DeadLetterStatus::Decided, decision: Some(dec), ..d };
    assert_eq!(dl.get("dl-1").await.unwrap(), Some(decided), "still decided");
    assert_eq!(everything(dl).await.len(), 1);
}

/// `list`: ordered by id in byte order, strictly after the cursor, bounded, filtered by
/// status.
pub async fn list_pages_by_id_with_status_filter(dl: &DynDeadLetters) {
    // Byte order: "Z…" < "a…" < "dl-z" < "dl-é" (a locale collation would differ).
    for id in ["dl-é", "dl-2", "a-1", "dl-z", "Z-1", "dl-1"] {
        record_new(dl, letter(id)).await;
    }
    assert_eq!(dl.decide("dl-2", &decision("ops", DeadLetterAction::Fail, T0)).await.unwrap(), DecideOutcome::Decided);
    assert_eq!(dl.decide("dl-z", &decision("ops", DeadLetterAction::Retry, T0)).await.unwrap(), DecideOutcome::Decided);
    assert!(dl.close("dl-z", T0.plus(1)).await.unwrap());
    assert_eq!(ids(dl.list(None, None, 2).await.unwrap()), ["Z-1", "a-1"]);
    assert_eq!(ids(dl.list(None, Some("a-1"), 2).await.unwrap()), ["dl-1", "dl-2"]);
    assert_eq!(ids(dl.list(None, Some("dl-2"), 2).await.unwrap()), ["dl-z", "dl-é"]);
    assert_eq!(ids(dl.list(None, Some("dl-é"), 2).await.unwrap()), Vec::<String>::new());
    assert_eq!(ids(dl.list(None, Some("b"), 1).await.unwrap()), ["dl-1"], "a cursor need not be a stored id");
    let open = Some(DeadLetterStatus::Open);
    assert_eq!(ids(dl.list(open, None, 10).await.unwrap()), ["Z-1", "a-1", "dl-1", "dl-é"]);
    assert_eq!(ids(dl.list(open, Some("a-1"), 1).await.unwrap()), ["dl-1"]);
    assert_eq!(ids(dl.list(open, Some("dl-1"), 10).await.unwrap()), ["dl-é"], "skips the decided and the closed");
    assert_eq!(ids(dl.list(Some(DeadLetterStatus::Decided), None, 10).await.unwrap()), ["dl-2"]);
    assert_eq!(ids(dl.list(Some(DeadLetterStatus::Closed), None, 10).await.unwrap()), ["dl-z"]);
    let page = dl.list(Some(DeadLetterStatus::Open), None, 1).await.unwrap();
    assert_eq!(page, vec![letter("Z-1")], "whole records");
}

/// `decide` on an open record: `Decided`, and the record reads back decided with the
/// decision, nothing else changed.
pub async fn decide_open_record(dl: &DynDeadLetters) {
    let d = record_new(dl, letter("dl-1")).await;
    let output = json!({"receipt": "r-ü-1", "lines": [1, 2, {"$ne": null}], "big": i64::MAX});
    let dec = decision("ops:ålice", DeadLetterAction::Complete { output }, T0.plus(9));
    assert_eq!(dl.decide("dl-1", &dec).await.unwrap(), DecideOutcome::Decided);
    let expected = DeadLetter { status: DeadLetterStatus::Decided, decision: Some(dec), ..d };
    assert_eq!(dl.get("dl-1").await.unwrap(), Some(expected));
    let no_reason = DeadLetterDecision { reason: None, ..decision("ops", DeadLetterAction::Fail, T0) };
    record_new(dl, letter("dl-2")).await;
    assert_eq!(dl.decide("dl-2", &no_reason).await.unwrap(), DecideOutcome::Decided);
    assert_eq!(dl.get("dl-2").await.unwrap().unwrap().decision, Some(no_reason), "no reason round-trips");
}

/// K-17.2 amendment: an operator-supplied output is recorded whole on the decision — far
/// past the 4 096 bytes a step's operator entry copies, nested, unicode, extreme numbers —
/// and still reads back exactly, in `get` and `list`, once the record is closed.
pub async fn complete_output_is_kept_whole_through_close(dl: &DynDeadLetters) {
    let d = record_new(dl, letter("dl-1")).await;
    let lines: Vec<serde_json::Value> = (0..400)
        .map(|k| json!({"sku": format!("sku-{k:04}-ü"), "qty": k, "price": 0.1 + f64::from(k), "ok": k % 2 == 0}))
        .collect();
    let output = json!({"approved": true, "by": "ops:ålice", "lines": lines, "min": i64::MIN, "nested": {"z": [[[]]], "a": null}});
    assert!(serde_json::to_vec(&output).unwrap().len() > 4 * kernel_core::record::OPERATOR_OUTPUT_BYTES_MAX);
    let dec = decision("ops:ålice", DeadLetterAction::Complete { output: output.clone() }, T0.plus(1));
    assert_eq!(dl.decide("dl-1", &dec).await.unwrap(), DecideOutcome::Decided);
    assert!(dl.close("dl-1", T0.plus(2)).await.unwrap());
    let closed = DeadLetter { status: DeadLetterStatus::Closed, decision: Some(dec), closed_at: Some(T0.plus(2)), ..d };
    let stored = dl.get("dl-1").await.unwrap().expect("kept");
    assert_eq!(stored, closed);
    let Some(DeadLetterDecision { action: DeadLetterAction::Complete { output: kept }, .. }) = stored.decision else {
        panic!("the decision keeps the output: {stored:?}")
    };
    let digest = kernel_core::record::OutputDigest::of;
    assert_eq!(digest(&kept), digest(&output), "the same bytes, canonically");
    assert_eq!(dl.list(Some(DeadLetterStatus::Closed), None, 10).await.unwrap(), vec![closed], "listed whole");
}

/// A second decision is refused as `AlreadyDecided` with the first, which stays.
pub async fn second_decide_reports_the_first(dl: &DynDeadLetters) {
    record_new(dl, letter("dl-1")).await;
    let first = decision("ops-a", DeadLetterAction::Retry, T0.plus(1));
    let second = decision("ops-b", DeadLetterAction::Fail, T0.plus(2));
    assert_eq!(dl.decide("dl-1", &first).await.unwrap(), DecideOutcome::Decided);
    assert_eq!(dl.decide("dl-1", &second).await.unwrap(), DecideOutcome::AlreadyDecided(first.clone()));
    assert_eq!(
        dl.decide("dl-1", &first).await.unwrap(),
        DecideOutcome::AlreadyDecided(first.clone()),
        "not idempotent"
    );
    assert_eq!(dl.get("dl-1").await.unwrap().unwrap().decision, Some(first));
}

/// Eight concurrent decisions on one open record: exactly one `Decided`; every other
/// call reports the winner's decision, which is the one stored.
pub async fn concurrent_decides_one_winner(dl: &DynDeadLetters) {
    record_new(dl, letter("dl-1")).await;
    let decisions: Vec<DeadLetterDecision> = (0..8)
        .map(|k| {
            let action = if k % 2 == 0 { DeadLetterAction::Retry } else { DeadLetterAction::Fail };
            decision(&format!("ops-{k}"), action, T0.plus(k))
        })
        .collect();
    let results = futures::future::join_all(decisions.iter().map(|d| dl.decide("dl-1", d))).await;
    let results: Vec<DecideOutcome> = results.into_iter().map(|r| r.expect("decide")).collect();
    let winners: Vec<usize> = (0..8).filter(|&k| results[k] == DecideOutcome::Decided).collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    let winner = decisions[winners[0]].clone();
    for (k, r) in results.iter().enumerate() {
        if k != winners[0] {
            assert_eq!(r, &DecideOutcome::AlreadyDecided(winner.clone()), "loser {k}");
        }
    }
    let stored = dl.get("dl-1").await.unwrap().unwrap();
    assert_eq!((stored.status, stored.decision), (DeadLetterStatus::Decided, Some(winner)));
}

/// `decide` on an unknown id: `NotFound`, and nothing is created.
pub async fn decide_unknown_is_not_found(dl: &DynDeadLetters) {
    let dec = decision("ops", DeadLetterAction::Retry, T0);
    assert_eq!(dl.decide("dl-unknown", &dec).await.unwrap(), DecideOutcome::NotFound);
    assert_eq!(dl.get("dl-unknown").await.unwrap(), None, "no upsert");
    assert_eq!(everything(dl).await, vec![]);
}

/// `close`: only a decided record closes, once, with `closed_at`; an open, closed or
/// unknown one is `false` and unchanged.
pub async fn close_decided_once(dl: &DynDeadLetters) {
    let d = record_new(dl, letter("dl-1")).await;
    assert!(!dl.close("dl-1", T0.plus(1)).await.unwrap(), "open: not closed");
    assert_eq!(dl.get("dl-1").await.unwrap(), Some(d.clone()), "unchanged");
    let dec = decision("ops", DeadLetterAction::Retry, T0.plus(2));
    assert_eq!(dl.decide("dl-1", &dec).await.unwrap(), DecideOutcome::Decided);
    assert!(dl.close("dl-1", T0.plus(3)).await.unwrap());
    let closed = DeadLetter { status: DeadLetterStatus::Closed, decision: Some(dec), closed_at: Some(T0.plus(3)), ..d };
    assert_eq!(dl.get("dl-1").await.unwrap(), Some(closed.clone()));
    assert!(!dl.close("dl-1", T0.plus(4)).await.unwrap(), "closed already");
    assert_eq!(dl.get("dl-1").await.unwrap(), Some(closed), "closed_at kept");
    assert!(!dl.close("dl-unknown", T0).await.unwrap());
    assert_eq!(dl.get("dl-unknown").await.unwrap(), None, "no upsert");
}

/// `decide` on a closed record: `Closed`, nothing changed.
pub async fn decide_closed_reports_closed(dl: &DynDeadLetters) {
    record_new(dl, letter("dl-1")).await;
    assert_eq!(dl.decide("dl-1", &decision("a", DeadLetterAction::Retry, T0)).await.unwrap(), DecideOutcome::Decided);
    assert!(dl.close("dl-1", T0.plus(1)).await.unwrap());
    let closed = dl.get("dl-1").await.unwrap();
    assert_eq!(
        dl.decide("dl-1", &decision("b", DeadLetterAction::Fail, T0.plus(2))).await.unwrap(),
        DecideOutcome::Closed
    );
    assert_eq!(dl.get("dl-1").await.unwrap(), closed, "unchanged");
}

/// `purge_closed`: deletes closed records with `closed_at` strictly before the cutoff, at
/// most `limit` per call; never an open or decided record, however old.
pub async fn purge_respects_before_and_limit(dl: &DynDeadLetters) {
    for (id, closed_at) in [("c-1", 1), ("c-2", 2), ("c-3", 3), ("c-4", 10)] {
        record_new(dl, DeadLetter { created_at: T0.minus(1_000), ..letter(id) }).await;
        let dec = decision("ops", DeadLetterAction::Fail, T0);
        assert_eq!(dl.decide(id, &dec).await.unwrap(), DecideOutcome::Decided);
        assert!(dl.close(id, T0.plus(closed_at)).await.unwrap());
    }
    let open = record_new(dl, DeadLetter { created_at: T0.minus(1_000_000), ..letter("o-1") }).await;
    record_new(dl, DeadLetter { created_at: T0.minus(1_000_000), ..letter("d-1") }).await;
    assert_eq!(dl.decide("d-1", &decision("ops", DeadLetterAction::Retry, T0)).await.unwrap(), DecideOutcome::Decided);
    let decided = dl.get("d-1").await.unwrap();

    assert_eq!(dl.purge_closed(T0.plus(5), 2).await.unwrap(), 2, "bounded by the limit");
    assert_eq!(dl.purge_closed(T0.plus(5), 10).await.unwrap(), 1, "the third eligible one");
    assert_eq!(dl.purge_closed(T0.plus(5), 10).await.unwrap(), 0, "none left before the cutoff");
    assert_eq!(ids(everything(dl).await), ["c-4", "d-1", "o-1"]);
    assert_eq!(dl.purge_closed(T0.plus(10), 10).await.unwrap(), 0, "strictly before");
    assert_eq!(dl.purge_closed(T0.plus(86_400_000), DEAD_LETTER_PURGE_MAX).await.unwrap(), 1);
    assert_eq!(dl.get("c-4").await.unwrap(), None);
    assert_eq!(dl.get("o-1").await.unwrap(), Some(open), "open records are never purged");
    assert_eq!(dl.get("d-1").await.unwrap(), decided, "decided records are never purged");
}

/// K-2.0 on `record`: a bad id, workflow id, type or step name, oversized or unstorable
/// inputs, an oversized message and a record that is not new are each refused naming the
/// field, and nothing is written; values at the limits are accepted.
pub async fn k2_0_bad_record_is_refused(dl: &DynDeadLetters) {
    let good = record_new(dl, letter("dl-good")).await;
    let over = DEAD_LETTER_MESSAGE_BYTES_MAX + 1;
    let with_message =
        |m: String| DeadLetter { error: StepError { class: ErrorClass::Transient, message: m }, ..letter("dl-x") };
    let cases: Vec<(DeadLetter, &str)> = vec![
        (letter(""), "id"),
        (letter("dl\n1"), "id"),
        (letter(&"d".repeat(257)), "id"),
        (DeadLetter { workflow_id: "wf\0".into(), ..letter("dl-x") }, "workflow_id"),
        (DeadLetter { workflow_type: String::new(), ..letter("dl-x") }, "workflow_type"),
        (DeadLetter { step: "$where".into(), ..letter("dl-x") }, "step"),
        (DeadLetter { step: "a.b".into(), ..letter("dl-x") }, "step"),
        (DeadLetter { inputs: oversize_payload(), ..letter("dl-x") }, "inputs"),
        (DeadLetter { inputs: json!({"n": u64::MAX}), ..letter("dl-x") }, "inputs"),
        (DeadLetter { inputs: json!({"s": "a\u{0}b"}), ..letter("dl-x") }, "inputs"),
        (DeadLetter { inputs: json!({"$ref": "x"}), ..letter("dl-x") }, "inputs"),
        (with_message("m".repeat(over)), "error.message"),
        (with_message("a\0b".to_string()), "error.message"),
        (DeadLetter { status: DeadLetterStatus::Decided, ..letter("dl-x") }, "status"),
        (DeadLetter { status: DeadLetterStatus::Closed, closed_at: Some(T0), ..letter("dl-x") }, "status"),
        (DeadLetter { decision: Some(decision("ops", DeadLetterAction::Retry, T0)), ..letter("dl-x") }, "decision"),
        (DeadLetter { closed_at: Some(T0), ..letter("dl-x") }, "closed_at"),
        (DeadLetter { decision: Some(decision("", DeadLetterAction::Retry, T0)), ..letter("dl-x") }, "decision.actor"),
    ];
    for (bad, field) in cases {
        assert_invalid_field(dl.record(&bad).await, field);
    }
    assert_eq!(everything(dl).await, vec![good.clone()], "only the good record is stored");
    // At the limits: accepted.
    let at_limit = with_message("é".repeat(DEAD_LETTER_MESSAGE_BYTES_MAX / 2));
    record_new(dl, at_limit.clone()).await;
    assert_eq!(dl.get("dl-x").await.unwrap(), Some(at_limit));
    let long_id = "i".repeat(kernel_core::validate::IDENTIFIER_BYTES_MAX);
    record_new(dl, letter(&long_id)).await;
    assert_eq!(dl.get(&long_id).await.unwrap(), Some(letter(&long_id)));
}

/// K-2.0 on `decide`: a bad id, a bad actor, an oversized reason or output, an
/// unstorable output are refused naming the field; the record stays open.
pub async fn k2_0_bad_decision_is_refused(dl: &DynDeadLetters) {
    let good = record_new(dl, letter("dl-1")).await;
    let ok = decision("ops", DeadLetterAction::Retry, T0);
    assert_invalid_field(dl.decide("", &ok).await, "id");
    assert_invalid_field(dl.decide("dl\u{7}", &ok).await, "id");
    let complete = |output| DeadLetterAction::Complete { output };
    let cases: Vec<(DeadLetterDecision, &str)> = vec![
        (decision("", DeadLetterAction::Retry, T0), "decision.actor"),
        (decision("ops\n", DeadLetterAction::Retry, T0), "decision.actor"),
        (
            DeadLetterDecision { reason: Some("r".repeat(DEAD_LETTER_REASON_BYTES_MAX + 1)), ..ok.clone() },
            "decision.reason",
        ),
        (DeadLetterDecision { reason: Some("r\0".into()), ..ok.clone() }, "decision.reason"),
        (decision("ops", complete(oversize_payload()), T0), "decision.output"),
        (decision("ops", complete(json!([u64::MAX])), T0), "decision.output"),
        (decision("ops", complete(json!({"$id": 1})), T0), "decision.output"),
    ];
    for (bad, field) in cases {
        assert_invalid_field(dl.decide("dl-1", &bad).await, field);
    }
    assert_eq!(everything(dl).await, vec![good.clone()], "still open, no decision");
    let at_limit = DeadLetterDecision { reason: Some("r".repeat(DEAD_LETTER_REASON_BYTES_MAX)), ..ok };
    assert_eq!(dl.decide("dl-1", &at_limit).await.unwrap(), DecideOutcome::Decided);
    assert_eq!(dl.get("dl-1").await.unwrap().unwrap().decision, Some(at_limit));
}

/// Bounds and ids of the other calls: `list` limit outside `1..=1000`, a bad cursor,
/// `purge_closed` limit outside `1..=10000`, bad ids to `get` and `close` are refused;
/// nothing is deleted or changed.
pub async fn k2_0_bad_limits_and_ids_are_refused(dl: &DynDeadLetters) {
    record_new(dl, letter("dl-1")).await;
    assert_eq!(dl.decide("dl-1", &decision("ops", DeadLetterAction::Fail, T0)).await.unwrap(), DecideOutcome::Decided);
    assert!(dl.close("dl-1", T0).await.unwrap());
    let before = everything(dl).await;
    assert_invalid_field(dl.list(None, None, 0).await, "limit");
    assert_invalid_field(dl.list(None, None, DEAD_LETTER_LIST_MAX + 1).await, "limit");
    assert_invalid_field(dl.list(Some(DeadLetterStatus::Open), Some(""), 10).await, "after");
    assert_invalid_field(dl.list(None, Some("a\0"), 10).await, "after");
    assert_invalid_field(dl.purge_closed(Instant::MAX, 0).await, "limit");
    assert_invalid_field(dl.purge_closed(Instant::MAX, DEAD_LETTER_PURGE_MAX + 1).await, "limit");
    assert_invalid_field(dl.get("").await, "id");
    assert_invalid_field(dl.close("dl\n1", T0).await, "id");
    assert_eq!(everything(dl).await, before, "nothing purged or changed");
    assert_eq!(dl.list(None, None, DEAD_LETTER_LIST_MAX).await.unwrap().len(), 1, "the largest page is allowed");
}

/// Expands to one `#[tokio::test]` per dead-letter conformance case (see
/// [`store_conformance!`](crate::store_conformance)).
#[macro_export]
macro_rules! dead_letter_conformance {
    ($factory:expr) => {
        $crate::__conformance_cases!(dead_letter, DeadLetterFixture, dead_letters, $factory;
            record_and_get_round_trip,
            re_record_same_id_changes_nothing,
            list_pages_by_id_with_status_filter,
            decide_open_record,
            complete_output_is_kept_whole_through_close,
            second_decide_reports_the_first,
            concurrent_decides_one_winner,
            decide_unknown_is_not_found,
            close_decided_once,
            decide_closed_reports_closed,
            purge_respects_before_and_limit,
            k2_0_bad_record_is_refused,
            k2_0_bad_decision_is_refused,
            k2_0_bad_limits_and_ids_are_refused,
        );
    };
}
