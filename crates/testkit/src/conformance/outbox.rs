//! Conformance cases for [`DispatchOutbox`] and [`DispatchCandidates`] (K-11): one hit and
//! one miss for every conditional write.

use crate::memory::{InMemoryCandidates, InMemoryOutbox};
use crate::time::TestTime;
use kernel_core::domain::{Instant, Priority};
use kernel_core::ports::*;
use kernel_core::{FencingToken, ObjectId};
use serde_json::json;
use std::sync::Arc;

/// What an outbox case needs.
pub trait OutboxFixture: Send + Sync + 'static {
    /// The port under test.
    fn outbox(&self) -> &DynOutbox;
    /// Drop the fixture's namespace; the default does nothing.
    fn teardown(self) -> futures::future::BoxFuture<'static, ()>
    where
        Self: Sized,
    {
        Box::pin(async {})
    }
}

impl OutboxFixture for InMemoryOutbox {
    fn outbox(&self) -> &DynOutbox {
        self
    }
}

impl OutboxFixture for Arc<DynOutbox> {
    fn outbox(&self) -> &DynOutbox {
        &**self
    }
}

/// What a candidates case needs.
pub trait CandidatesFixture: Send + Sync + 'static {
    /// The port under test.
    fn candidates(&self) -> &DynCandidates;
    /// Drop the fixture's namespace; the default does nothing.
    fn teardown(self) -> futures::future::BoxFuture<'static, ()>
    where
        Self: Sized,
    {
        Box::pin(async {})
    }
}

impl CandidatesFixture for InMemoryCandidates {
    fn candidates(&self) -> &DynCandidates {
        self
    }
}

impl CandidatesFixture for Arc<DynCandidates> {
    fn candidates(&self) -> &DynCandidates {
        &**self
    }
}

const T0: Instant = Instant::from_millis(1_700_000_000_000);

/// A pending intent of round `f` due at `due`.
pub fn intent(f: &str, due: Instant) -> DispatchIntent {
    DispatchIntent::pending(
        "order",
        "order:obj-1",
        &FencingToken::from(f),
        json!({ "object_id": "obj-1", "fencing_token": f, "caps": { "stream": true } }),
        Priority::P1,
        due,
    )
}

async fn accepted(o: &DynOutbox) -> DispatchRecord {
    let out = o.accept(&"obj-1".into(), json!({ "title": "note", "n": 3 }), "initial", intent("f1", T0)).await.unwrap();
    assert_eq!(out, AcceptOutcome::Accepted);
    o.get(&"obj-1".into()).await.unwrap().expect("stored")
}

fn dispatch(r: &Option<DispatchRecord>) -> DispatchIntent {
    r.as_ref().and_then(|r| r.dispatch.clone()).expect("intent")
}

/// Accept stores fields, status and the exact intent in one write; a second accept of the
/// same id writes nothing.
pub async fn accept_once(o: &DynOutbox) {
    let rec = accepted(o).await;
    assert_eq!(rec.business_status.as_deref(), Some("initial"));
    assert_eq!(rec.fields["title"], json!("note"));
    assert_eq!(rec.dispatch, Some(intent("f1", T0)));
    let again = o.accept(&"obj-1".into(), json!({ "title": "other" }), "initial", intent("f9", T0)).await.unwrap();
    assert_eq!(again, AcceptOutcome::Exists);
    assert_eq!(o.get(&"obj-1".into()).await.unwrap().unwrap(), rec);
    assert!(o.get(&"obj-missing".into()).await.unwrap().is_none());
}

/// K-11.2: confirm hits `(f, pending)` only.
pub async fn confirm_dispatched_guard(o: &DynOutbox) {
    accepted(o).await;
    assert!(!o.confirm_dispatched(&"obj-1".into(), &"f0".into()).await.unwrap(), "wrong round");
    assert!(o.confirm_dispatched(&"obj-1".into(), &"f1".into()).await.unwrap());
    assert_eq!(dispatch(&o.get(&"obj-1".into()).await.unwrap()).status, DispatchStatus::Dispatched);
    assert!(!o.confirm_dispatched(&"obj-1".into(), &"f1".into()).await.unwrap(), "not pending any more");
    assert!(!o.confirm_dispatched(&"obj-missing".into(), &"f1".into()).await.unwrap());
}

/// Defer hits `(f, pending)` only and moves the attempt time.
pub async fn defer_pending_guard(o: &DynOutbox) {
    accepted(o).await;
    assert!(!o.defer_pending(&"obj-1".into(), &"f0".into(), T0.plus(5)).await.unwrap());
    assert!(o.defer_pending(&"obj-1".into(), &"f1".into(), T0.plus(5)).await.unwrap());
    assert_eq!(dispatch(&o.get(&"obj-1".into()).await.unwrap()).next_attempt_time, T0.plus(5));
}

/// K-11.3: the lease is taken on due pending or expired processing intents only.
pub async fn try_lease_guard(o: &DynOutbox) {
    accepted(o).await;
    assert!(
        o.try_lease(&"obj-1".into(), T0.minus(1), &"d1".into(), T0.plus(100)).await.unwrap().is_none(),
        "not due yet"
    );
    let rec = o.try_lease(&"obj-1".into(), T0, &"d1".into(), T0.plus(100)).await.unwrap();
    let d = dispatch(&rec);
    assert_eq!(
        (d.status, d.lease_token.as_deref(), d.lease_until),
        (DispatchStatus::Processing, Some("d1"), Some(T0.plus(100)))
    );
    assert!(
        o.try_lease(&"obj-1".into(), T0.plus(100), &"d2".into(), T0.plus(200)).await.unwrap().is_none(),
        "held until expiry"
    );
    let rec = o.try_lease(&"obj-1".into(), T0.plus(101), &"d2".into(), T0.plus(300)).await.unwrap();
    assert_eq!(dispatch(&rec).lease_token.as_deref(), Some("d2"), "expired lease taken over");
    assert!(o.try_lease(&"obj-missing".into(), T0, &"d3".into(), T0.plus(1)).await.unwrap().is_none());
}

/// Renew, confirm and revert hit `(f, processing, d)` only; a late holder changes nothing.
pub async fn lease_holder_writes_guard(o: &DynOutbox) {
    accepted(o).await;
    o.try_lease(&"obj-1".into(), T0, &"d1".into(), T0.plus(100)).await.unwrap().expect("leased");
    o.try_lease(&"obj-1".into(), T0.plus(101), &"d2".into(), T0.plus(300)).await.unwrap().expect("taken over");
    let before = o.get(&"obj-1".into()).await.unwrap();
    assert!(!o.renew_lease(&"obj-1".into(), &"f1".into(), &"d1".into(), T0.plus(999)).await.unwrap());
    assert!(!o.confirm_leased(&"obj-1".into(), &"f1".into(), &"d1".into()).await.unwrap());
    assert!(!o.revert_leased(&"obj-1".into(), &"f1".into(), &"d1".into(), T0.plus(999)).await.unwrap());
    assert!(!o.renew_lease(&"obj-1".into(), &"f0".into(), &"d2".into(), T0.plus(999)).await.unwrap(), "wrong round");
    assert_eq!(o.get(&"obj-1".into()).await.unwrap(), before, "nothing changed");
    assert!(o.renew_lease(&"obj-1".into(), &"f1".into(), &"d2".into(), T0.plus(400)).await.unwrap());
    assert_eq!(dispatch(&o.get(&"obj-1".into()).await.unwrap()).lease_until, Some(T0.plus(400)));
    assert!(o.revert_leased(&"obj-1".into(), &"f1".into(), &"d2".into(), T0.plus(500)).await.unwrap());
    let d = dispatch(&o.get(&"obj-1".into()).await.unwrap());
    assert_eq!(
        (d.status, d.lease_token, d.lease_until, d.next_attempt_time),
        (DispatchStatus::Pending, None, None, T0.plus(500))
    );
    o.try_lease(&"obj-1".into(), T0.plus(500), &"d3".into(), T0.plus(600)).await.unwrap().expect("leased again");
    assert!(o.confirm_leased(&"obj-1".into(), &"f1".into(), &"d3".into()).await.unwrap());
    let d = dispatch(&o.get(&"obj-1".into()).await.unwrap());
    assert_eq!((d.status, d.lease_token, d.lease_until), (DispatchStatus::Dispatched, None, None));
}

/// The scan lists due pending and expired processing intents, paged by id.
pub async fn scan_due_pages(o: &DynOutbox) {
    for i in 0..5 {
        let mut it = intent("f1", T0.plus(i));
        it.biz_key = format!("order:obj-{i}");
        o.accept(&ObjectId::from(format!("obj-{i}")), json!({}), "initial", it).await.unwrap();
    }
    o.confirm_dispatched(&"obj-0".into(), &"f1".into()).await.unwrap();
    o.try_lease(&"obj-1".into(), T0.plus(1), &"d".into(), T0.plus(2)).await.unwrap().expect("leased");
    let due: Vec<ObjectId> = o.scan_due(T0.plus(2), None, 10).await.unwrap().into_iter().map(|(id, _)| id).collect();
    assert_eq!(due, vec!["obj-2"], "obj-1's lease has not expired, obj-3/4 not due");
    let due: Vec<ObjectId> = o.scan_due(T0.plus(10), None, 2).await.unwrap().into_iter().map(|(id, _)| id).collect();
    assert_eq!(due, vec!["obj-1", "obj-2"]);
    let due: Vec<ObjectId> =
        o.scan_due(T0.plus(10), Some(&"obj-2".into()), 2).await.unwrap().into_iter().map(|(id, _)| id).collect();
    assert_eq!(due, vec!["obj-3", "obj-4"]);
}

/// K-11.4: a new round is installed only over `failed + prev`, wholesale.
pub async fn retry_failed_guard(o: &DynOutbox) {
    accepted(o).await;
    let next = intent("f2", T0.plus(7));
    assert!(!o.retry_failed(&"obj-1".into(), &"f1".into(), next.clone(), "initial").await.unwrap(), "not failed");
    assert!(o
        .fenced_update(&"obj-1".into(), &"f1".into(), json!({ "previous_error": "declined" }), Some("failed"))
        .await
        .unwrap());
    assert!(
        !o.retry_failed(&"obj-1".into(), &"f0".into(), next.clone(), "initial").await.unwrap(),
        "wrong previous round"
    );
    assert!(o.retry_failed(&"obj-1".into(), &"f1".into(), next.clone(), "initial").await.unwrap());
    let rec = o.get(&"obj-1".into()).await.unwrap().unwrap();
    assert_eq!(rec.business_status.as_deref(), Some("initial"));
    assert_eq!(rec.dispatch, Some(next.clone()));
    assert!(rec.fields.get("previous_error").is_none(), "previous error cleared");
    assert!(
        !o.retry_failed(&"obj-1".into(), &"f1".into(), intent("f3", T0), "initial").await.unwrap(),
        "the loser installs nothing"
    );
    assert_eq!(o.get(&"obj-1".into()).await.unwrap().unwrap().dispatch, Some(next));
}

/// K-11.5: business writes are fenced by the round and cannot touch the intent.
pub async fn fenced_update_guard(o: &DynOutbox) {
    accepted(o).await;
    assert!(o
        .fenced_update(&"obj-1".into(), &"f1".into(), json!({ "result": "r1", "meta.lang": "en" }), Some("done"))
        .await
        .unwrap());
    let rec = o.get(&"obj-1".into()).await.unwrap().unwrap();
    assert_eq!(rec.business_status.as_deref(), Some("done"));
    assert_eq!(rec.fields["result"], json!("r1"));
    assert_eq!(rec.fields["meta"], json!({ "lang": "en" }), "dotted paths nest");
    assert!(
        !o.fenced_update(&"obj-1".into(), &"f0".into(), json!({ "result": "late" }), None).await.unwrap(),
        "old round"
    );
    assert_eq!(o.get(&"obj-1".into()).await.unwrap().unwrap().fields["result"], json!("r1"));
    assert!(!o.fenced_update(&"obj-missing".into(), &"f1".into(), json!({ "result": "x" }), None).await.unwrap());
    for bad in [
        json!({ "workflow_dispatch": {} }),
        json!({ "workflow_dispatch.status": "dispatched" }),
        json!({ "$set": 1 }),
        json!({ "a..b": 1 }),
    ] {
        assert!(o.fenced_update(&"obj-1".into(), &"f1".into(), bad, None).await.is_err());
    }
    assert_eq!(o.get(&"obj-1".into()).await.unwrap().unwrap().dispatch, Some(intent("f1", T0)), "intent untouched");
}

/// User values are data: an operator-shaped value is stored as is.
pub async fn operator_shaped_values_are_data(o: &DynOutbox) {
    let mut it = intent("f1", T0);
    it.input = Some(json!({ "object_id": "obj-1", "fencing_token": "f1", "q": { "$ne": null } }));
    o.accept(&"obj-1".into(), json!({ "filter": { "$gt": 1 } }), "initial", it.clone()).await.unwrap();
    let rec = o.get(&"obj-1".into()).await.unwrap().unwrap();
    assert_eq!(rec.fields["filter"], json!({ "$gt": 1 }));
    assert_eq!(rec.dispatch, Some(it));
    assert!(!o.confirm_dispatched(&"obj-1".into(), &FencingToken::from("{\"$ne\":null}")).await.unwrap());
}

/// The scan mutex: free, held, re-entrant for its holder, taken after expiry.
pub async fn scan_lock(o: &DynOutbox) {
    assert!(o.try_lock("scan", "a", T0, T0.plus(10)).await.unwrap());
    assert!(!o.try_lock("scan", "b", T0.plus(5), T0.plus(15)).await.unwrap());
    assert!(o.try_lock("scan", "a", T0.plus(5), T0.plus(20)).await.unwrap(), "the holder renews");
    assert!(!o.try_lock("scan", "b", T0.plus(19), T0.plus(30)).await.unwrap());
    assert!(o.try_lock("scan", "b", T0.plus(20), T0.plus(30)).await.unwrap(), "expired");
    assert!(o.try_lock("other", "a", T0, T0.plus(1)).await.unwrap(), "independent names");
}

// --- the shared K-2.0 rule: one case per refused input ----------------------------------

/// Accept `obj-1` with `fields` and `intent`, which must be refused as
/// [`Error::InvalidInput`](kernel_core::Error::InvalidInput) naming `field`, beside an
/// accepted `obj-2`; then read back: `obj-1` does not exist and `obj-2` is untouched.
async fn refused_accept_writes_nothing(o: &DynOutbox, fields: serde_json::Value, intent: DispatchIntent, field: &str) {
    let good = json!({ "title": "kept" });
    assert_eq!(
        o.accept(&"obj-2".into(), good, "initial", self::intent("f1", T0)).await.unwrap(),
        AcceptOutcome::Accepted
    );
    let before = o.get(&"obj-2".into()).await.unwrap();
    crate::conformance::store::assert_invalid_field(o.accept(&"obj-1".into(), fields, "initial", intent).await, field);
    assert_eq!(o.get(&"obj-1".into()).await.unwrap(), None, "nothing written");
    assert_eq!(o.get(&"obj-2".into()).await.unwrap(), before, "other objects untouched");
}

/// K-2.0: an intent's biz key (the workflow's wait identity on the business side) with NUL
/// is refused; nothing is written.
pub async fn k2_0_bad_biz_key_is_refused(o: &DynOutbox) {
    let bad = DispatchIntent { biz_key: "order:\0".into(), ..intent("f1", T0) };
    refused_accept_writes_nothing(o, json!({ "title": "x" }), bad, "biz_key").await;
}

/// K-2.0: fields or an input snapshot over the shared payload limit are refused; nothing is
/// written.
pub async fn k2_0_oversize_payload_is_refused(o: &DynOutbox) {
    let big = crate::conformance::store::oversize_payload();
    refused_accept_writes_nothing(o, json!({ "blob": big.clone() }), intent("f1", T0), "fields").await;
    let bad = DispatchIntent { input: Some(big), ..intent("f1", T0) };
    crate::conformance::store::assert_invalid_field(
        o.accept(&"obj-3".into(), json!({}), "initial", bad).await,
        "workflow_dispatch.input",
    );
    assert_eq!(o.get(&"obj-3".into()).await.unwrap(), None, "nothing written");
}

/// K-2.0: a fencing token with a control character is refused by `accept`, and a bad
/// round or lease token by the conditional writes; nothing is written.
pub async fn k2_0_bad_fencing_token_is_refused(o: &DynOutbox) {
    refused_accept_writes_nothing(o, json!({ "title": "x" }), intent("f\u{1b}1", T0), "fencing_token").await;
    let before = o.get(&"obj-2".into()).await.unwrap();
    let invalid = crate::conformance::store::assert_invalid_field::<bool>;
    invalid(o.confirm_dispatched(&"obj-2".into(), &"f\0".into()).await, "fencing_token");
    invalid(o.defer_pending(&"obj-2".into(), &"".into(), T0).await, "fencing_token");
    invalid(o.revert_leased(&"obj-2".into(), &"f1".into(), &"l\0".into(), T0).await, "lease_token");
    invalid(o.fenced_update(&"obj-2".into(), &"f\n".into(), json!({ "title": "y" }), None).await, "fencing_token");
    assert_eq!(o.get(&"obj-2".into()).await.unwrap(), before, "nothing written");
}

/// K-2.0: field names are document keys: a `$` prefix, a `.` or a control character is
/// refused by `accept`, and in any segment of a fenced write's dotted path, identically on
/// every outbox (naming `fields`); nothing is written.
pub async fn k2_0_bad_field_key_is_refused(o: &DynOutbox) {
    refused_accept_writes_nothing(o, json!({ "$set": { "x": 1 } }), intent("f1", T0), "fields").await;
    let invalid = crate::conformance::store::assert_invalid_field::<AcceptOutcome>;
    invalid(o.accept(&"obj-3".into(), json!({ "a.b": 1 }), "initial", intent("f1", T0)).await, "fields");
    for name in crate::conformance::store::CONTROL_CHARACTER_NAMES {
        invalid(o.accept(&"obj-3".into(), json!({ name: 1 }), "initial", intent("f1", T0)).await, "fields");
    }
    assert_eq!(o.get(&"obj-3".into()).await.unwrap(), None, "nothing written");
    let before = o.get(&"obj-2".into()).await.unwrap();
    for path in ["$set", "a..b", "meta.$x", "a.", "meta.tab\tx", "line\nfeed.x", "nul\0"] {
        let refused = o.fenced_update(&"obj-2".into(), &"f1".into(), json!({ path: 1 }), None).await;
        crate::conformance::store::assert_invalid_field(refused, "fields");
    }
    assert_eq!(o.get(&"obj-2".into()).await.unwrap(), before, "nothing written");
}

/// K-2.0 (amendment): business field names are data on every outbox. A fenced write of
/// `note\u0041` and `meta.x\u0041` (which read as `noteA` and `meta.xA` once the escape is
/// decoded) changes neither `noteA` nor `meta.xA`; names with a trailing backslash, quotes,
/// backslashes and non-ASCII are written under their own names, nested or not, like any
/// other. Five outbox operations.
pub async fn k2_0_field_names_are_data(o: &DynOutbox) {
    let fields = json!({ "noteA": "a", "tail": "t", "q": 0, "meta": { "xA": 1, "café": 2 } });
    o.accept(&"obj-1".into(), fields, "initial", intent("f1", T0)).await.unwrap();
    let escapes = json!({ "note\\u0041": "b", "meta.x\\u0041": 3, "meta.cafe\u{301}": 4 });
    assert!(o.fenced_update(&"obj-1".into(), &"f1".into(), escapes, None).await.unwrap());
    let rec = o.get(&"obj-1".into()).await.unwrap().expect("stored");
    assert_eq!(rec.fields["noteA"], json!("a"), "writing `note\\u0041` changed `noteA`");
    assert_eq!(rec.fields["meta"]["xA"], json!(1), "writing `meta.x\\u0041` changed `meta.xA`");
    assert_eq!(rec.fields["meta"]["café"], json!(2), "writing a decomposed `café` changed the composed one");
    let syntax = json!({
        "tail\\": "t2", "q\"": 5, "a\\\"b": 6, "\\": 7, "\\\\": 8, "it's": 9, "名前.x\\": 10, "meta.a[0]": 11,
    });
    assert!(o.fenced_update(&"obj-1".into(), &"f1".into(), syntax, None).await.unwrap());
    let rec = o.get(&"obj-1".into()).await.unwrap().expect("stored");
    assert_eq!(
        rec.fields,
        json!({
            "noteA": "a", "note\\u0041": "b", "tail": "t", "tail\\": "t2", "q": 0, "q\"": 5, "a\\\"b": 6,
            "\\": 7, "\\\\": 8, "it's": 9, "名前": { "x\\": 10 },
            "meta": { "xA": 1, "x\\u0041": 3, "café": 2, "cafe\u{301}": 4, "a[0]": 11 },
        }),
        "every name written under its own name"
    );
}

/// Candidates: due ones pop once, earliest first, bounded.
pub async fn candidates_pop_once(c: &DynCandidates) {
    for (id, due) in [("c", T0.plus(3)), ("a", T0.plus(1)), ("b", T0.plus(2)), ("later", T0.plus(100))] {
        c.add(&ObjectId::from(id), due).await.unwrap();
    }
    c.add(&"a".into(), T0).await.unwrap(); // moved, not duplicated
    assert_eq!(c.pop_due(T0.plus(3), 2).await.unwrap(), vec!["a", "b"]);
    assert_eq!(c.pop_due(T0.plus(3), 10).await.unwrap(), vec!["c"]);
    assert!(c.pop_due(T0.plus(3), 10).await.unwrap().is_empty());
    assert_eq!(c.pop_due(T0.plus(100), 10).await.unwrap(), vec!["later"]);
}

/// One named test per outbox case.
#[macro_export]
macro_rules! outbox_conformance {
    ($factory:expr) => {
        $crate::__conformance_cases!(outbox, OutboxFixture, outbox, $factory;
            accept_once,
            confirm_dispatched_guard,
            defer_pending_guard,
            try_lease_guard,
            lease_holder_writes_guard,
            scan_due_pages,
            retry_failed_guard,
            fenced_update_guard,
            operator_shaped_values_are_data,
            scan_lock,
            k2_0_bad_biz_key_is_refused,
            k2_0_oversize_payload_is_refused,
            k2_0_bad_fencing_token_is_refused,
            k2_0_bad_field_key_is_refused,
            k2_0_field_names_are_data,
        );
    };
}

/// One named test per candidates case.
#[macro_export]
macro_rules! candidates_conformance {
    ($factory:expr) => {
        $crate::__conformance_cases!(outbox, CandidatesFixture, candidates, $factory;
            candidates_pop_once,
        );
    };
}
