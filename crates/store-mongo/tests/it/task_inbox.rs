//! The task inbox's documents on the server: BSON types, the indexes, a purged reason, a
//! stored record that does not decode, and collection names it refuses.

use crate::support::TestDb;
use kernel_core::domain::Instant;
use kernel_core::ports::*;
use kernel_core::Error;
use mongodb::bson::{doc, Bson, Document};
use store_mongo::{MongoConfig, MongoTaskInbox};

fn task(id: &str) -> TaskRecord {
    TaskRecord {
        id: id.into(),
        workflow_id: "inv-7".into(),
        workflow_type: "invoice".into(),
        step: "approve".into(),
        level: 2,
        title: "Approve invoice 7 (12 400 €) — {\"$gt\": \"\"}".into(),
        assignee: Some("alice".into()),
        roles: vec!["finance".into()],
        evidence: vec![Evidence { label: "the invoice".into(), reference: "s3:invoices/7.pdf".into() }],
        token: "b1e3f0c2a9d84e57aa".into(),
        created_at: Instant::from_millis(1_000),
        due_at: Instant::from_millis(3_601_000),
        status: TaskStatus::Open,
        decision: None,
        closed_at: None,
    }
}

#[tokio::test]
async fn documents_indexes_and_purged_reasons_on_the_server() {
    let Some(t) = TestDb::new().await else { return };
    for bad in ["system.tasks", "tasks$x", ""] {
        let r = MongoTaskInbox::without_indexes(&t.db, bad, MongoConfig::default());
        assert!(matches!(r, Err(Error::InvalidInput { .. })), "collection {bad:?}: {r:?}");
    }
    let inbox = MongoTaskInbox::open_in(&t.db, "ops_tasks", MongoConfig::default()).await.expect("open");
    let coll = t.db.collection::<Document>("ops_tasks");
    let mut names = coll.list_index_names().await.expect("indexes");
    names.sort();
    assert_eq!(names, ["_id_", "sensitive_decided_at", "status_assignee_id", "status_closed_at", "status_roles_id"]);

    assert_eq!(inbox.open(&task("t-1")).await.unwrap(), None);
    let alice = Actor::new("alice", ["finance"]);
    let reason = TaskReason { sensitive: true, text: Some("salary of a named person".into()) };
    let decision = TaskDecision {
        outcome: TaskOutcome::Reject,
        actor: "alice".into(),
        reason: Some(reason),
        decided_at: Instant::from_millis(5_000),
    };
    assert_eq!(inbox.decide("t-1", "b1e3f0c2a9d84e57aa", &alice, &decision).await.unwrap(), TaskDecideOutcome::Decided);

    let d = coll.find_one(doc! { "_id": "t-1" }).await.unwrap().expect("stored");
    assert_eq!(d.get("created_at"), Some(&Bson::DateTime(mongodb::bson::DateTime::from_millis(1_000))));
    assert_eq!(d.get("due_at"), Some(&Bson::DateTime(mongodb::bson::DateTime::from_millis(3_601_000))));
    assert_eq!(d.get("level"), Some(&Bson::Int64(2)));
    assert_eq!(d.get_str("title").unwrap(), task("t-1").title, "operator-shaped text is data");
    let stored = d.get_document("decision").unwrap();
    assert_eq!(stored.get("decided_at"), Some(&Bson::DateTime(mongodb::bson::DateTime::from_millis(5_000))));
    assert_eq!(stored.get_document("reason").unwrap(), &doc! { "sensitive": true, "text": "salary of a named person" });

    assert_eq!(inbox.purge_sensitive_reasons(Instant::from_millis(5_001), 10).await.unwrap(), 1);
    let d = coll.find_one(doc! { "_id": "t-1" }).await.unwrap().expect("stored");
    let stored = d.get_document("decision").unwrap();
    assert_eq!(stored.get_document("reason").unwrap(), &doc! { "sensitive": true }, "only the text goes");
    assert_eq!(stored.get_str("outcome").unwrap(), "reject");

    // Decided without a decision cannot be decided on, nor taken as open.
    coll.update_one(doc! { "_id": "t-1" }, doc! { "$unset": { "decision": "" } }).await.unwrap();
    let r = inbox.decide("t-1", "b1e3f0c2a9d84e57aa", &alice, &decision).await;
    assert!(matches!(r, Err(Error::Corrupt { .. })), "{r:?}");
    t.drop_db().await;
}
