//! The live-summary story (see `examples/live_summary.rs`) with its durable state in
//! MongoDB: instances and the signal inbox live in a fresh database, dropped at the end.
//!
//! Run: `MONGODB_URI=mongodb://127.0.0.1:27017 cargo run -p store-mongo --example live_summary_mongo`

use kernel_examples::story;
use std::sync::Arc;
use store_mongo::{MongoConfig, MongoSignalInbox, MongoWorkflowStore};
use testkit::harness::{Lister, World};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let uri =
        std::env::var("MONGODB_URI").map_err(|_| "set MONGODB_URI (e.g. eval \"$(scripts/mongo-wire.sh start)\")")?;
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos();
    let db = store_mongo::connect(&uri, &format!("live_summary_{stamp:x}")).await?;
    let store = MongoWorkflowStore::open(&db, MongoConfig::default()).await?;
    let inbox = MongoSignalInbox::open(&db, MongoConfig::default()).await?;
    let listed = store.clone();
    let lister: Lister = Arc::new(move || {
        let s = listed.clone();
        Box::pin(async move { s.list(1_000).await })
    });
    println!("== durable store: MongoDB database {}", db.name());
    let world = World::with_durable(42, story::limits(), Arc::new(store), Arc::new(inbox), lister);
    let result = story::run(world).await;
    db.drop().await?;
    result
}
