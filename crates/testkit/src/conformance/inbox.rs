//! Conformance cases for the [`SignalInbox`] port (K-9.3, K-9.4).
//!
//! Same shape as the [store suite](super::store): `pub async fn case(inbox: &DynInbox)` on
//! an empty inbox, and [`inbox_conformance!`](crate::inbox_conformance) expanding to one
//! `#[tokio::test]` per case from a factory `|| async { Option<impl InboxFixture> }`.
//! Every write is checked by reading the record back and comparing it with the expected
//! record in full. The case on an undecodable record takes the fixture, which plants it
//! ([`InboxFixture::plant_undecodable`]).

use crate::memory::InMemoryInbox;
use crate::time::TestTime;
use kernel_core::domain::Instant;
use kernel_core::ports::*;
use kernel_core::Error;
use kernel_core::WorkflowId;
use std::sync::Arc;

/// An inbox under test plus whatever must be cleaned up after the case.
pub trait InboxFixture: Send + Sync + 'static {
    /// The port under test.
    fn inbox(&self) -> &DynInbox;
    /// Store a pending record `signal_id`, created at `created_at`, that does not decode:
    /// its id, `status` and `created_at` readable, another field changed the way a version
    /// that wrote it differently or an edit outside the kernel would (the id passed as a
    /// bound parameter, never pasted into a query). Returns `false` when the fixture
    /// cannot (the default, e.g. a port behind `Arc<dyn SignalInbox>`): the case that
    /// needs it then checks nothing.
    fn plant_undecodable<'a>(
        &'a self,
        signal_id: &'a str,
        created_at: Instant,
    ) -> futures::future::BoxFuture<'a, bool> {
        let _ = (signal_id, created_at);
        Box::pin(async { false })
    }
    /// Drop the fixture's namespace; the default does nothing.
    fn teardown(self) -> futures::future::BoxFuture<'static, ()>
    where
        Self: Sized,
    {
        Box::pin(async {})
    }
}

impl InboxFixture for InMemoryInbox {
    fn inbox(&self) -> &DynInbox {
        self
    }
    fn plant_undecodable<'a>(
        &'a self,
        signal_id: &'a str,
        created_at: Instant,
    ) -> futures::future::BoxFuture<'a, bool> {
        InMemoryInbox::plant_undecodable(self, signal_id, created_at);
        Box::pin(async { true })
    }
}

impl InboxFixture for Arc<DynInbox> {
    fn inbox(&self) -> &DynInbox {
        &**self
    }
}

const T0: Instant = super::store::T0;

/// A pending record for `wf-1`, type `approved`, key `doc:42`, generation 1.
pub fn record(signal_id: &str, created_at: Instant) -> SignalRecord {
    SignalRecord {
        signal_id: signal_id.to_string(),
        workflow_id: WorkflowId::from("wf-1".to_string()),
        signal_type: "approved".to_string(),
        wait_key: "doc:42".to_string(),
        generation: 1,
        status: SignalStatus::Pending,
        created_at,
        match_time: None,
        orphan: false,
    }
}

/// The `signal_id`s of a page's decoded records; the page has no undecodable one.
fn ids(page: SignalPage) -> Vec<String> {
    assert_eq!(page.undecodable, vec![], "nothing undecodable");
    page.records.into_iter().map(|r| r.signal_id).collect()
}

async fn insert_new(inbox: &DynInbox, r: SignalRecord) -> SignalRecord {
    assert_eq!(inbox.insert(r.clone()).await.expect("insert"), InsertOutcome::Inserted);
    r
}

/// Insert, then read back exactly.
pub async fn insert_and_get(inbox: &DynInbox) {
    let r = insert_new(inbox, record("sig-1", T0)).await;
    assert_eq!(inbox.get("sig-1").await.unwrap(), Some(r));
    assert_eq!(inbox.get("sig-2").await.unwrap(), None);
}

/// A duplicate `signal_id` is ignored and returns the stored record (K-9.3).
pub async fn duplicate_insert_returns_stored(inbox: &DynInbox) {
    let r = insert_new(inbox, record("sig-1", T0)).await;
    let mut again = record("sig-1", T0.plus(5));
    again.generation = 9;
    assert_eq!(inbox.insert(again).await.unwrap(), InsertOutcome::Duplicate(r.clone()));
    assert_eq!(inbox.get("sig-1").await.unwrap(), Some(r));
}

/// Concurrent inserts of one `signal_id`: exactly one `Inserted`.
pub async fn concurrent_duplicate_inserts_one_winner(inbox: &DynInbox) {
    let results = futures::future::join_all((0..6).map(|k| inbox.insert(record("sig-1", T0.plus(k))))).await;
    let inserted = results.iter().filter(|r| matches!(r, Ok(InsertOutcome::Inserted))).count();
    assert_eq!(inserted, 1);
    let stored = inbox.get("sig-1").await.unwrap().expect("stored");
    for r in results {
        if let InsertOutcome::Duplicate(d) = r.unwrap() {
            assert_eq!(d, stored);
        }
    }
}

/// `find_pending` matches the wait identity exactly and returns the oldest pending record.
pub async fn find_pending_matches_exact_identity(inbox: &DynInbox) {
    assert_eq!(inbox.find_pending(&"wf-1".into(), "approved", "doc:42", 1).await.unwrap(), None, "empty");
    let older = insert_new(inbox, record("sig-b", T0)).await;
    insert_new(inbox, record("sig-a", T0.plus(10))).await;
    let mut other_wf = record("sig-c", T0.minus(10));
    other_wf.workflow_id = "wf-2".into();
    insert_new(inbox, other_wf).await;
    assert_eq!(inbox.find_pending(&"wf-1".into(), "approved", "doc:42", 1).await.unwrap(), Some(older));
    assert_eq!(inbox.find_pending(&"wf-1".into(), "approved", "doc:42", 2).await.unwrap(), None, "stale generation");
    assert_eq!(inbox.find_pending(&"wf-1".into(), "approved", "doc:43", 1).await.unwrap(), None, "other key");
    assert_eq!(inbox.find_pending(&"wf-1".into(), "rejected", "doc:42", 1).await.unwrap(), None, "other type");
    assert_eq!(inbox.find_pending(&"wf-3".into(), "approved", "doc:42", 1).await.unwrap(), None, "other workflow");
}

/// `mark_matched`: pending → matched once with `match_time`; then a no-op; matched records
/// are never found as pending again.
pub async fn mark_matched_once(inbox: &DynInbox) {
    let r = insert_new(inbox, record("sig-1", T0)).await;
    assert!(inbox.mark_matched("sig-1", T0.plus(7)).await.unwrap(), "hit");
    let expected = SignalRecord { status: SignalStatus::Matched, match_time: Some(T0.plus(7)), ..r };
    assert_eq!(inbox.get("sig-1").await.unwrap(), Some(expected.clone()));
    assert!(!inbox.mark_matched("sig-1", T0.plus(8)).await.unwrap(), "miss: already matched");
    assert_eq!(inbox.get("sig-1").await.unwrap(), Some(expected), "match_time kept");
    assert_eq!(inbox.find_pending(&"wf-1".into(), "approved", "doc:42", 1).await.unwrap(), None);
    assert!(!inbox.mark_matched("sig-unknown", T0).await.unwrap(), "miss: unknown id");
    assert_eq!(inbox.get("sig-unknown").await.unwrap(), None, "no upsert");
}

/// `scan_pending`: pending only, ordered by `signal_id`, paged strictly after the cursor.
pub async fn scan_pending_pages(inbox: &DynInbox) {
    for id in ["sig-4", "sig-1", "sig-3", "sig-2"] {
        insert_new(inbox, record(id, T0)).await;
    }
    assert!(inbox.mark_matched("sig-2", T0).await.unwrap());
    let first = inbox.scan_pending(None, 2).await.unwrap();
    assert_eq!((first.read, first.last.as_deref(), first.is_full(2)), (2, Some("sig-3"), true));
    assert_eq!(ids(first), ["sig-1", "sig-3"]);
    assert_eq!(ids(inbox.scan_pending(Some("sig-3"), 2).await.unwrap()), ["sig-4"]);
    assert_eq!(ids(inbox.scan_pending(Some("sig-4"), 2).await.unwrap()), Vec::<String>::new());
    assert_eq!(inbox.scan_pending(None, 0).await.unwrap(), SignalPage::default(), "limit 0 is an empty page");
}

/// Identifier rule (K-2.0): bad ids are `InvalidInput` and nothing is stored; an id shaped
/// like an operator is data.
pub async fn insert_validates_identifiers(inbox: &DynInbox) {
    let long = "s".repeat(257);
    for (what, r) in [
        ("NUL in wait key", SignalRecord { wait_key: "doc\0".into(), ..record("sig-1", T0) }),
        ("empty signal type", SignalRecord { signal_type: String::new(), ..record("sig-2", T0) }),
        ("id over 256 bytes", record(&long, T0)),
    ] {
        let got = inbox.insert(r).await;
        assert!(matches!(got, Err(Error::InvalidInput { .. })), "{what}: got {got:?}");
    }
    assert_eq!(inbox.scan_pending(None, 10).await.unwrap(), SignalPage::default(), "nothing stored");
    let evil = insert_new(inbox, record(r#"{"$ne": null}"#, T0)).await;
    assert_eq!(inbox.get(r#"{"$ne": null}"#).await.unwrap(), Some(evil));
    assert_eq!(inbox.get(r#"{"$gt": ""}"#).await.unwrap(), None);
}

/// Insert `bad` (which must be refused as [`Error::InvalidInput`] naming `field`) beside a
/// good record, then read back: the good record alone is stored.
async fn refused_insert_writes_nothing(inbox: &DynInbox, bad: SignalRecord, field: &str) {
    let good = insert_new(inbox, record("sig-good", T0)).await;
    let id = bad.signal_id.clone();
    super::store::assert_invalid_field(inbox.insert(bad).await, field);
    if kernel_core::validate::identifier("signal_id", &id).is_ok() {
        assert_eq!(inbox.get(&id).await.unwrap(), None, "nothing stored under {id:?}");
    }
    assert_eq!(
        inbox.scan_pending(None, 10).await.unwrap(),
        SignalPage::of(vec![good]),
        "only the good record is stored"
    );
}

/// K-2.0: a wait key with NUL is refused; nothing is stored.
pub async fn k2_0_bad_wait_key_is_refused(inbox: &DynInbox) {
    refused_insert_writes_nothing(inbox, SignalRecord { wait_key: "doc\0".into(), ..record("sig-1", T0) }, "wait_key")
        .await;
    super::store::assert_invalid_field(inbox.find_pending(&"wf-1".into(), "approved", "doc\0", 1).await, "wait_key");
}

/// K-2.0: a signal carries no payload, so its oversize input is an identifier over 256
/// bytes (here the wait key); it is refused and nothing is stored.
pub async fn k2_0_oversize_identifier_is_refused(inbox: &DynInbox) {
    let r =
        SignalRecord { wait_key: "k".repeat(kernel_core::validate::IDENTIFIER_BYTES_MAX + 1), ..record("sig-1", T0) };
    refused_insert_writes_nothing(inbox, r, "wait_key").await;
}

/// K-2.0: the signal's own token, its `signal_id`, with a control character is refused;
/// nothing is stored.
pub async fn k2_0_bad_signal_id_is_refused(inbox: &DynInbox) {
    refused_insert_writes_nothing(inbox, record("sig\n1", T0), "signal_id").await;
}

/// K-2.0: an empty signal type or a workflow id with NUL is refused; nothing is stored.
pub async fn k2_0_bad_signal_type_or_workflow_id_is_refused(inbox: &DynInbox) {
    refused_insert_writes_nothing(
        inbox,
        SignalRecord { signal_type: String::new(), ..record("sig-1", T0) },
        "signal_type",
    )
    .await;
    let r = SignalRecord { workflow_id: "wf\0".into(), ..record("sig-2", T0) };
    super::store::assert_invalid_field(inbox.insert(r).await, "workflow_id");
    assert_eq!(inbox.get("sig-2").await.unwrap(), None, "nothing stored");
}

/// `scan_created_before`: records (pending or matched) created before the cutoff, ordered
/// by `signal_id`, paged strictly after the cursor, bounded.
pub async fn scan_created_before_pages(inbox: &DynInbox) {
    for (id, at) in [("s-3", T0), ("s-1", T0.plus(1)), ("s-2", T0.plus(2)), ("s-4", T0.plus(10))] {
        insert_new(inbox, record(id, at)).await;
    }
    assert!(inbox.mark_matched("s-2", T0.plus(5)).await.unwrap());
    assert_eq!(ids(inbox.scan_created_before(T0.plus(3), None, 2).await.unwrap()), ["s-1", "s-2"]);
    assert_eq!(ids(inbox.scan_created_before(T0.plus(3), Some("s-2"), 2).await.unwrap()), ["s-3"]);
    assert_eq!(ids(inbox.scan_created_before(T0.plus(3), Some("s-3"), 2).await.unwrap()), Vec::<String>::new());
    let empty = SignalPage::default();
    assert_eq!(inbox.scan_created_before(T0.plus(3), None, 0).await.unwrap(), empty, "limit 0 is an empty page");
    assert_eq!(ids(inbox.scan_created_before(T0, None, 10).await.unwrap()), Vec::<String>::new(), "strictly before");
}

/// K-9.4: a stored record that does not decode is no error of a scan page. `scan_pending`
/// and `scan_created_before` return the records around it, report it under its
/// `signal_id` with a reason, count it as read, and name it as the page's last record when
/// it ends the page, so the next page starts after it and returns the records behind it.
pub async fn undecodable_record_is_reported_and_paged_past<X: InboxFixture>(fixture: &X) {
    let inbox = fixture.inbox();
    for id in ["sig-1", "sig-3", "sig-4"] {
        insert_new(inbox, record(id, T0)).await;
    }
    if !fixture.plant_undecodable("sig-2", T0).await {
        eprintln!("the fixture cannot plant an undecodable record: nothing checked");
        return;
    }
    let bad = |page: &SignalPage| page.undecodable.iter().map(|u| u.signal_id.clone()).collect::<Vec<_>>();
    let good = |page: &SignalPage| page.records.iter().map(|r| r.signal_id.clone()).collect::<Vec<_>>();
    for scan in ["scan_pending", "scan_created_before"] {
        let page_of = |after: Option<String>, limit: usize| async move {
            match scan {
                "scan_pending" => inbox.scan_pending(after.as_deref(), limit).await,
                _ => inbox.scan_created_before(T0.plus(1), after.as_deref(), limit).await,
            }
        };
        let all = page_of(None, 10).await.unwrap();
        assert_eq!(good(&all), ["sig-1", "sig-3", "sig-4"], "{scan}: the others are returned");
        assert_eq!(bad(&all), ["sig-2"], "{scan}: the bad one is reported by its id");
        assert!(!all.undecodable[0].reason.is_empty(), "{scan}: with a reason");
        assert_eq!((all.read, all.last.as_deref()), (4, Some("sig-4")), "{scan}: read and last");
        // A page that ends on the bad record names it as its last: the next starts after it.
        let first = page_of(None, 2).await.unwrap();
        assert_eq!((good(&first), bad(&first)), (vec!["sig-1".to_string()], vec!["sig-2".to_string()]), "{scan}");
        assert_eq!((first.read, first.last.as_deref(), first.is_full(2)), (2, Some("sig-2"), true), "{scan}");
        let next = page_of(first.last.clone(), 2).await.unwrap();
        assert_eq!((good(&next), bad(&next)), (vec!["sig-3".to_string(), "sig-4".to_string()], vec![]), "{scan}");
        assert_eq!(next.last.as_deref(), Some("sig-4"), "{scan}");
        let end = page_of(next.last.clone(), 2).await.unwrap();
        assert_eq!(end, SignalPage::default(), "{scan}: the end");
    }
}

/// `scan_workflow`: one workflow's records in one status, newest first, bounded.
pub async fn scan_workflow_newest_first(inbox: &DynInbox) {
    for (id, at) in [("s-a", T0), ("s-b", T0.plus(2)), ("s-c", T0.plus(1)), ("s-d", T0.plus(2))] {
        insert_new(inbox, record(id, at)).await;
    }
    insert_new(inbox, SignalRecord { workflow_id: "wf-2".into(), ..record("s-e", T0.plus(9)) }).await;
    assert!(inbox.mark_matched("s-c", T0.plus(5)).await.unwrap());
    let ids = |v: Vec<SignalRecord>| v.into_iter().map(|r| r.signal_id).collect::<Vec<_>>();
    let wf1: WorkflowId = "wf-1".into();
    assert_eq!(ids(inbox.scan_workflow(&wf1, SignalStatus::Pending, 10).await.unwrap()), ["s-d", "s-b", "s-a"]);
    assert_eq!(ids(inbox.scan_workflow(&wf1, SignalStatus::Pending, 2).await.unwrap()), ["s-d", "s-b"], "bounded");
    assert_eq!(ids(inbox.scan_workflow(&wf1, SignalStatus::Matched, 10).await.unwrap()), ["s-c"]);
    assert_eq!(inbox.scan_workflow(&wf1, SignalStatus::Pending, 0).await.unwrap(), vec![], "limit 0");
    assert_eq!(inbox.scan_workflow(&"wf-3".into(), SignalStatus::Pending, 10).await.unwrap(), vec![]);
}

/// `delete_if`: deletes only the listed records still in the given status; a record
/// matched meanwhile survives a delete of pending ones; unknown ids are ignored; too many
/// ids are refused and nothing is deleted.
pub async fn delete_if_is_conditional_on_status(inbox: &DynInbox) {
    for id in ["s-1", "s-2", "s-3"] {
        insert_new(inbox, record(id, T0)).await;
    }
    assert!(inbox.mark_matched("s-2", T0.plus(1)).await.unwrap());
    let ids: Vec<String> = ["s-1", "s-2", "s-unknown"].iter().map(|s| s.to_string()).collect();
    assert_eq!(inbox.delete_if(&ids, SignalStatus::Pending).await.unwrap(), 1, "only the pending one");
    assert_eq!(inbox.get("s-1").await.unwrap(), None);
    assert!(inbox.get("s-2").await.unwrap().is_some(), "matched meanwhile: kept");
    assert_eq!(inbox.delete_if(&ids, SignalStatus::Matched).await.unwrap(), 1);
    assert_eq!(inbox.get("s-2").await.unwrap(), None);
    assert_eq!(inbox.delete_if(&[], SignalStatus::Pending).await.unwrap(), 0);
    let too_many: Vec<String> = (0..=INBOX_DELETE_IDS_MAX).map(|k| format!("s-{k}")).collect();
    super::store::assert_invalid_field(inbox.delete_if(&too_many, SignalStatus::Pending).await, "signal_ids");
    assert!(inbox.get("s-3").await.unwrap().is_some(), "a refused call deletes nothing");
}

/// `count_pending_orphans`: pending records marked `orphan`, of one workflow id or all,
/// counted up to the limit; matched orphans and other records do not count. The flag is
/// stored and read back.
pub async fn count_pending_orphans_bounded(inbox: &DynInbox) {
    let orphan = |id: &str, wf: &str| SignalRecord { orphan: true, workflow_id: wf.into(), ..record(id, T0) };
    for (id, wf) in [("o-1", "wf-x"), ("o-2", "wf-x"), ("o-3", "wf-x"), ("o-4", "wf-y")] {
        insert_new(inbox, orphan(id, wf)).await;
    }
    insert_new(inbox, record("s-1", T0)).await;
    assert_eq!(inbox.get("o-1").await.unwrap(), Some(orphan("o-1", "wf-x")), "the flag round-trips");
    assert!(inbox.mark_matched("o-3", T0.plus(1)).await.unwrap());
    let x: WorkflowId = "wf-x".into();
    assert_eq!(inbox.count_pending_orphans(Some(&x), 10).await.unwrap(), 2);
    assert_eq!(inbox.count_pending_orphans(Some(&x), 1).await.unwrap(), 1, "bounded by the limit");
    assert_eq!(inbox.count_pending_orphans(None, 10).await.unwrap(), 3);
    assert_eq!(inbox.count_pending_orphans(None, 0).await.unwrap(), 0);
    assert_eq!(inbox.count_pending_orphans(Some(&"wf-1".into()), 10).await.unwrap(), 0, "not an orphan");
}

/// `clear_orphans`: every record of the workflow id loses the flag and nothing else of it
/// changes; other ids keep theirs; a second call changes nothing; a bad id is refused.
pub async fn clear_orphans_of_one_workflow(inbox: &DynInbox) {
    let orphan = |id: &str, wf: &str| SignalRecord { orphan: true, workflow_id: wf.into(), ..record(id, T0) };
    for (id, wf) in [("o-1", "wf-x"), ("o-2", "wf-x"), ("o-3", "wf-y")] {
        insert_new(inbox, orphan(id, wf)).await;
    }
    let x: WorkflowId = "wf-x".into();
    assert_eq!(inbox.clear_orphans(&x).await.unwrap(), 2);
    let cleared = SignalRecord { workflow_id: x.clone(), ..record("o-1", T0) };
    assert_eq!(inbox.get("o-1").await.unwrap(), Some(cleared), "only the flag changed");
    assert_eq!(inbox.count_pending_orphans(Some(&x), 10).await.unwrap(), 0);
    assert_eq!(inbox.count_pending_orphans(None, 10).await.unwrap(), 1, "other ids keep theirs");
    assert_eq!(inbox.clear_orphans(&x).await.unwrap(), 0, "idempotent");
    super::store::assert_invalid_field(inbox.clear_orphans(&"".into()).await, "workflow_id");
}

/// Expands to one `#[tokio::test]` per inbox conformance case (see
/// [`store_conformance!`](crate::store_conformance)).
#[macro_export]
macro_rules! inbox_conformance {
    ($factory:expr) => {
        $crate::__conformance_cases!(inbox, InboxFixture, inbox, $factory;
            insert_and_get,
            duplicate_insert_returns_stored,
            concurrent_duplicate_inserts_one_winner,
            find_pending_matches_exact_identity,
            mark_matched_once,
            scan_pending_pages,
            insert_validates_identifiers,
            k2_0_bad_wait_key_is_refused,
            k2_0_oversize_identifier_is_refused,
            k2_0_bad_signal_id_is_refused,
            k2_0_bad_signal_type_or_workflow_id_is_refused,
            scan_created_before_pages,
            scan_workflow_newest_first,
            delete_if_is_conditional_on_status,
            count_pending_orphans_bounded,
            clear_orphans_of_one_workflow,
        );
        #[::tokio::test]
        async fn undecodable_record_is_reported_and_paged_past() {
            use $crate::conformance::__futures::FutureExt as _;
            let Some(fixture) = ($factory)().await else { return };
            let outcome = ::std::panic::AssertUnwindSafe(
                $crate::conformance::inbox::undecodable_record_is_reported_and_paged_past(&fixture),
            )
            .catch_unwind()
            .await;
            $crate::conformance::inbox::InboxFixture::teardown(fixture).await;
            if let Err(panic) = outcome {
                ::std::panic::resume_unwind(panic);
            }
        }
    };
}
