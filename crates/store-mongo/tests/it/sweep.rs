//! The crash-window sweep of the kernel, on MongoDB (issue acceptance: a sample of at most
//! ~30 crash points, same zero counts as in memory). Every run gets a fresh database.

use kernel_examples::scenarios::*;
use mongodb::{Client, Database};
use rand::Rng;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use store_mongo::{MongoConfig, MongoSignalInbox, MongoWorkflowStore};
use testkit::harness::{sweep_on, BoxFuture, Lister, Scenario, SweepSample, World};

#[tokio::test]
async fn crash_sweep_on_mongo() {
    let Some(uri) = super::support::mongo_uri() else { return };
    let client = Client::with_uri_str(&uri).await.expect("valid MONGODB_URI");
    let dbs: Arc<Mutex<Vec<Database>>> = Arc::default();
    let factory = {
        let (client, dbs) = (client.clone(), dbs.clone());
        move |seed: u64| -> BoxFuture<'static, World> {
            let (client, dbs) = (client.clone(), dbs.clone());
            Box::pin(async move {
                let db = client.database(&format!("wfk_sweep_{:016x}", rand::thread_rng().gen::<u64>()));
                dbs.lock().unwrap().push(db.clone());
                let store = MongoWorkflowStore::open(&db, MongoConfig::default()).await.expect("store");
                let inbox = MongoSignalInbox::open(&db, MongoConfig::default()).await.expect("inbox");
                let listed = store.clone();
                let lister: Lister = Arc::new(move || {
                    let s = listed.clone();
                    Box::pin(async move { s.list(1_000).await })
                });
                World::with_durable(seed, HashMap::new(), Arc::new(store), Arc::new(inbox), lister)
            })
        }
    };
    let live = LiveSummaryScenario { subscribers: 1, page_size: 1 };
    let fan = FanoutScenario { waiters: 2, page_size: 1 };
    let scenarios: [&dyn Scenario; 4] = [&live, &FailingScenario, &fan, &DagScenario];
    let report = sweep_on(&scenarios, 7, SweepSample::AtMost(5), &factory).await;
    let made: Vec<Database> = dbs.lock().unwrap().drain(..).collect();
    for db in made {
        let _ = db.drop().await;
    }
    println!("{report} store=mongo");
    assert!(report.runs <= 30, "{report:?}");
    assert!(report.boundaries >= 20, "{report:?}");
    report.assert_clean();
}
