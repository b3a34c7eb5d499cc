//! Rows changed outside the kernel so that they no longer decode: the scans skip and
//! report them (quarantine) and page past them; a claim of any instance that takes one
//! names it as `Corrupt`, its lease written, and the next claim takes another instance.

use crate::support::TestDb;
use kernel_core::ports::*;
use kernel_core::Error;
use testkit::conformance::store::{instance, waiting, LEASE_MS, T0, TYPE};
use testkit::time::TestTime;

fn exec(t: &TestDb, sql: &str) {
    rusqlite::Connection::open(t.db.path()).unwrap().execute_batch(sql).unwrap();
}

#[tokio::test]
async fn undecodable_rows_are_quarantined_and_paged_past() {
    let db = TestDb::new().await;
    let store = db.store();
    for id in ["wf-a", "wf-b", "wf-c"] {
        store.create(waiting(id, None, Some(T0.minus(10)))).await.unwrap();
    }
    for id in ["wf-1", "wf-2"] {
        let mut i = instance(id);
        i.claimable_time = Some(T0.minus(if id == "wf-1" { 20 } else { 10 }));
        store.create(i).await.unwrap();
    }
    // wf-b waits on a kind no version knows; wf-1's steps are not a list of steps.
    exec(
        &db,
        "UPDATE workflow_instances SET wait = json_set(wait, '$.kind', 'hibernate') WHERE workflow_id = 'wf-b';
         UPDATE workflow_instances SET steps = '{\"not\": \"steps\"}' WHERE workflow_id = 'wf-1';",
    );

    let page = store.scan_due_waits(T0, None, 10).await.unwrap();
    let rows: Vec<&str> = page.rows.iter().map(|d| d.workflow_id.as_str()).collect();
    assert_eq!(rows, ["wf-a", "wf-c"], "the others are returned");
    assert_eq!(page.quarantined.len(), 1);
    assert_eq!(page.quarantined[0].workflow_id.as_str(), "wf-b");
    assert!(page.quarantined[0].reason.contains("wait"), "{:?}", page.quarantined);
    assert_eq!((page.read, page.last.as_ref().map(|l| l.as_str())), (3, Some("wf-c")));
    // Paged one by one, the quarantined row is read once and passed.
    let mut seen = Vec::new();
    let mut after = None;
    for _ in 0..5 {
        let p = store.scan_due_waits(T0, after.as_ref(), 1).await.unwrap();
        seen.extend(p.rows.iter().map(|d| d.workflow_id.to_string()));
        seen.extend(p.quarantined.iter().map(|q| format!("quarantined:{}", q.workflow_id)));
        if !p.is_full(1) {
            break;
        }
        after = p.due_cursor();
    }
    assert_eq!(seen, ["wf-a", "quarantined:wf-b", "wf-c"]);

    // The rebuild scan reads only real columns: wf-1 is still a candidate there.
    let page = store.scan_claimable(None, 10).await.unwrap();
    assert_eq!(page.rows.iter().map(|c| c.workflow_id.as_str()).collect::<Vec<_>>(), ["wf-1", "wf-2"]);

    // claim_any takes the longest-due instance, wf-1, which does not decode: Corrupt naming
    // it, its lease written, so the next claim takes wf-2.
    let spec = |t: &str| ClaimSpec { now: T0, lease_ms: LEASE_MS, token: t.into(), types: vec![TYPE.into()] };
    let e = store.claim_any(&spec("t1")).await.unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e:?}");
    assert_eq!(e.corrupt_workflow_id().map(|w| w.as_str()), Some("wf-1"));
    let leased = db.scalar("SELECT count(*) FROM workflow_instances WHERE workflow_id = 'wf-1' AND claim_token = 't1'");
    assert_eq!(leased, 1, "the lease of the corrupt instance is written");
    let next = store.claim_any(&spec("t2")).await.unwrap().expect("another instance");
    assert_eq!(next.workflow_id.as_str(), "wf-2");
    assert_eq!(next.claimable_time, Some(T0.plus(LEASE_MS)));
    let e = store.get(&"wf-1".into()).await.unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "a read of it is Corrupt too: {e:?}");
}

/// A step counter changed outside the kernel into text: the write that increments it is
/// `Corrupt` (not bad input, not retryable, not read as 0), and nothing is written.
#[tokio::test]
async fn a_counter_that_does_not_parse_is_corrupt_and_writes_nothing() {
    let db = TestDb::new().await;
    let store = db.store();
    store.create(testkit::conformance::store::claimed("wf-1", "a")).await.unwrap();
    exec(
        &db,
        "UPDATE workflow_instances SET steps = json_set(steps, '$[1].attempt', 'one') WHERE workflow_id = 'wf-1'",
    );
    let before = db.scalar("SELECT revision FROM workflow_instances WHERE workflow_id = 'wf-1'");
    let t = kernel_core::transition::Transition::mark_running(1, T0);
    let r = store.apply(&"wf-1".into(), &kernel_core::transition::Guard::Running { token: "a".into() }, &t).await;
    assert!(matches!(r, Err(Error::Corrupt { .. })), "{r:?}");
    assert_eq!(
        before,
        db.scalar("SELECT revision FROM workflow_instances WHERE workflow_id = 'wf-1'"),
        "nothing written"
    );
}

/// A guarded write over a corrupt `steps` (not an array, or not JSON at all) is `Corrupt`,
/// not `Unavailable` (which the engine would retry forever), and nothing is written.
#[tokio::test]
async fn a_write_over_corrupt_steps_is_corrupt() {
    for steps in ["{\"not\": \"steps\"}", "[{\"name\": "] {
        let db = TestDb::new().await;
        let store = db.store();
        store.create(testkit::conformance::store::claimed("wf-1", "a")).await.unwrap();
        exec(&db, &format!("UPDATE workflow_instances SET steps = '{steps}' WHERE workflow_id = 'wf-1'"));
        let before = db.scalar("SELECT revision FROM workflow_instances");
        let guard = kernel_core::transition::Guard::Running { token: "a".into() };
        let t = kernel_core::transition::Transition::mark_running(1, T0.plus(LEASE_MS));
        let r = store.apply(&"wf-1".into(), &guard, &t).await;
        assert!(matches!(r, Err(Error::Corrupt { .. })), "{steps}: {r:?}");
        assert_eq!(db.scalar("SELECT revision FROM workflow_instances"), before, "nothing written");
    }
}
