//! Real concurrency on one file: two independent handles (each with its own connection
//! pool, as two processes would have) race creators, claimers and stale writers; SQLite's
//! write lock and the busy timeout serialise them, and the figures are read back from the
//! file.

use crate::support::{config, TestDb};
use kernel_core::domain::*;
use kernel_core::ports::{ClaimSpec, CreateOutcome, WorkflowStore, WriteOutcome};
use kernel_core::transition::{Guard, Transition};
use std::collections::HashSet;
use std::sync::Arc;
use store_sqlite::{SqliteDb, SqliteWorkflowStore};

const T0: Instant = Instant::from_millis(1_700_000_000_000);

fn due(id: &str) -> WorkflowInstance {
    let mut w = testkit::conformance::store::claimed(id, "unused");
    w.claim_token = None;
    w.claimable_time = Some(T0);
    w.biz_key = format!("biz:{id}");
    w
}

/// K-3.2, K-6.7: 40 due instances, 32 claimers on two handles calling `claim_any` until
/// nothing is left: every instance claimed exactly once, no call failed; then 40 racing
/// creators of one biz_key: one creates, the others get the stored instance; stale tokens
/// never write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_handles_race_on_one_file() {
    let t = TestDb::new().await;
    let other = SqliteDb::open(t.db.path(), config()).await.expect("second handle");
    let stores = [Arc::new(t.store()), Arc::new(SqliteWorkflowStore::new(other))];
    for i in 0..40 {
        stores[i % 2].create(due(&format!("wf-{i:02}"))).await.unwrap();
    }
    let mut tasks = Vec::new();
    for c in 0..32usize {
        let store = stores[c % 2].clone();
        tasks.push(tokio::spawn(async move {
            let mut won = Vec::new();
            loop {
                let spec = ClaimSpec {
                    now: T0,
                    lease_ms: DurationMs::from_millis(600_000),
                    token: format!("tok-{c}").as_str().into(),
                    types: vec!["summary".into()],
                };
                match store.claim_any(&spec).await.expect("claim_any") {
                    Some(w) => won.push(w.workflow_id.to_string()),
                    None => return won,
                }
            }
        }));
    }
    let mut claimed = Vec::new();
    for t in tasks {
        claimed.extend(t.await.unwrap());
    }
    let distinct: HashSet<&String> = claimed.iter().collect();
    assert_eq!((claimed.len(), distinct.len()), (40, 40), "each instance claimed once");
    assert_eq!(t.scalar("SELECT count(*) FROM workflow_instances WHERE claim_token IS NOT NULL"), 40);

    let mut creators = Vec::new();
    for c in 0..40usize {
        let store = stores[c % 2].clone();
        creators.push(tokio::spawn(async move {
            let mut w = due(&format!("dup-{c:02}"));
            w.biz_key = "biz:one".into();
            store.create(w).await.expect("create")
        }));
    }
    let mut created = 0;
    for c in creators {
        if matches!(c.await.unwrap(), CreateOutcome::Created(_)) {
            created += 1;
        }
    }
    assert_eq!(created, 1);
    assert_eq!(t.scalar("SELECT count(*) FROM workflow_instances WHERE biz_key = 'biz:one'"), 1);

    // Stale writers: every claimer but the winner writes under its own token.
    let id: kernel_core::WorkflowId = claimed[0].as_str().into();
    let winner = stores[0].get(&id).await.unwrap().unwrap().claim_token.unwrap();
    let mut stale = Vec::new();
    for c in 0..32usize {
        let (store, id) = (stores[c % 2].clone(), id.clone());
        stale.push(tokio::spawn(async move {
            let guard = Guard::Running { token: format!("tok-{c}").as_str().into() };
            store.apply(&id, &guard, &Transition::mark_running(0, T0)).await.expect("apply")
        }));
    }
    let mut applied = 0;
    for s in stale {
        if matches!(s.await.unwrap(), WriteOutcome::Applied { .. }) {
            applied += 1;
        }
    }
    assert_eq!(applied, 1, "only the holder of {winner:?} writes");
    println!(
        "races: store=sqlite handles=2 claimers=32 claimed=40 creators=40 created=1 stale_writers=31 stale_accepted=0"
    );
}
