//! The live-summary story (see `examples/live_summary.rs`) with its durable state in
//! MongoDB: instances and the signal inbox live in a fresh database, dropped at the end.
//! The store comes from `compose`, read like every binary's: `--store <url>`, else
//! `WFK_STORE`, else `MONGODB_URI`; only the server is taken from it, the database is new.
//!
//! Run: `MONGODB_URI=mongodb://127.0.0.1:27017 cargo run -p store-mongo --example live_summary_mongo`

use compose::{url_from_args, Role, StoreSide};
use std::sync::Arc;
use testkit::harness::{Lister, World};
use testkit::scenarios::story;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _) = url_from_args(Role::Store, std::env::args().skip(1), |k| std::env::var(k).ok(), &["MONGODB_URI"])?;
    let url =
        url.ok_or("pass --store <url> or set WFK_STORE or MONGODB_URI (e.g. eval \"$(scripts/mongo-wire.sh start)\")")?;
    let side = StoreSide::connect_scratch(&url, "live_summary").await?;
    let listed = side.mongo_store()?.clone();
    let lister: Lister = Arc::new(move || {
        let s = listed.clone();
        Box::pin(async move { s.list(1_000).await })
    });
    println!("== durable store: MongoDB database {}", side.mongo_database()?.name());
    let world = World::with_durable(42, story::limits(), side.store.clone(), side.inbox.clone(), lister);
    let result = story::run(world).await;
    side.destroy().await?;
    result
}
