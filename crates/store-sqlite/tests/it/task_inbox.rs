//! `SqliteTaskInbox` beyond the conformance suite: one lifecycle read back in full, the
//! columns derived from the decision, and concurrent decisions racing a close.

use crate::support::TestDb;
use kernel_core::domain::Instant;
use kernel_core::ports::*;
use std::sync::Arc;
use testkit::conformance::task_inbox_extra::{decision, lifecycle, races, task, T0};

#[tokio::test]
async fn a_task_lifecycle_reads_back_in_full() {
    let db = TestDb::new().await;
    let inbox = db.task_inbox();
    lifecycle(&inbox).await;
    // `t-c` keeps a reason that is not sensitive: its derived columns say so.
    assert_eq!(db.scalar("SELECT count(*) FROM task_inbox WHERE sensitive_text"), 0);
    assert_eq!(db.scalar("SELECT decided_at FROM task_inbox WHERE id = 't-c'"), T0.as_millis() + 30);
    drop(inbox);
    db.close();
}

#[tokio::test]
async fn a_sensitive_reason_is_derived_from_the_decision_until_purged() {
    let db = TestDb::new().await;
    let inbox = db.task_inbox();
    let t = task("t-s", Some("alice"), &[]);
    inbox.open(&t).await.unwrap();
    let alice = Actor::new("alice", Vec::<String>::new());
    let d = decision("alice", TaskOutcome::Reject, Some(true), T0.as_millis() + 5);
    assert_eq!(inbox.decide("t-s", &t.token, &alice, &d).await.unwrap(), TaskDecideOutcome::Decided);
    let flagged = "SELECT count(*) FROM task_inbox WHERE sensitive_text AND decided_at = 1700000000005";
    assert_eq!(db.scalar(flagged), 1);
    assert_eq!(inbox.purge_sensitive_reasons(Instant::from_millis(T0.as_millis() + 6), 1).await.unwrap(), 1);
    assert_eq!(db.scalar(flagged), 0);
    drop(inbox);
    db.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_decisions_and_a_close_store_one_decision() {
    let db = TestDb::new().await;
    let inbox: Arc<DynTaskInbox> = Arc::new(db.task_inbox());
    races(inbox).await;
    db.close();
}
