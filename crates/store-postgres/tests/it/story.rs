//! The live-summary story (the README's first demo, `testkit::scenarios::story`) with its
//! durable state on PostgreSQL: instances and the signal inbox in a fresh schema. The story
//! fails unless every workflow completes with every business result done.

use crate::support::TestSchema;
use std::sync::Arc;
use testkit::harness::{Lister, World};
use testkit::scenarios::story;

#[tokio::test]
async fn live_summary_story_on_postgres() {
    let Some(db) = TestSchema::new().await else { return };
    let store = db.store();
    let listed = store.clone();
    let lister: Lister = Arc::new(move || {
        let s = listed.clone();
        Box::pin(async move { s.list(1_000).await })
    });
    println!("== durable store: PostgreSQL schema {}", db.schema());
    let world = World::with_durable(42, story::limits(), Arc::new(store), Arc::new(db.inbox()), lister);
    let result = story::run(world).await;
    let rows = db.scalar("SELECT count(*) FROM {s}.workflow_instances WHERE status = 'completed'").await;
    db.drop_schema().await;
    result.expect("the story ends with every workflow completed");
    assert!(rows > 0, "the completed instances are rows of the table");
    println!("demo: live_summary on PostgreSQL ok (completed instances in the table: {rows})");
}
