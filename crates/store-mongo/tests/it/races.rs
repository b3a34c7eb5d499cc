//! Issue acceptance 2: races decided by the server, not by the client.

use crate::support::StoreDb;
use kernel_core::domain::DurationMs;
use kernel_core::ports::{ClaimSpec, WorkflowStore, WriteOutcome};
use kernel_core::transition::{Guard, Transition};
use kernel_core::WorkflowId;
use testkit::conformance::store::{self as cases, instance, seed, LEASE_MS, T0, TYPE};
use testkit::time::TestTime;

fn spec(token: String, now: kernel_core::domain::Instant) -> ClaimSpec {
    ClaimSpec { now, lease_ms: LEASE_MS, token: token.into(), types: vec![TYPE.to_string()] }
}

/// 50 tasks create the same biz_key: exactly one instance exists (K-3.2).
#[tokio::test]
async fn fifty_creates_of_one_biz_key_make_one_instance() {
    let Some(StoreDb(db, store)) = StoreDb::new().await else { return };
    cases::create_race(&store, 50).await;
    assert_eq!(db.count(store_mongo::INSTANCES).await, 1);
    db.drop_db().await;
}

/// 50 workers claim one due instance: exactly one claim (K-6.2).
#[tokio::test]
async fn fifty_workers_claiming_one_instance_make_one_claim() {
    let Some(StoreDb(db, store)) = StoreDb::new().await else { return };
    seed(&store, instance("wf-1")).await;
    let specs: Vec<ClaimSpec> = (0..50).map(|k| spec(format!("tok-{k:02}"), T0)).collect();
    let id = WorkflowId::from("wf-1");
    let claims = futures::future::join_all(specs.iter().map(|s| store.claim(&id, s))).await;
    let winners: Vec<_> = claims.into_iter().filter_map(|c| c.expect("claim")).collect();
    assert_eq!(winners.len(), 1, "exactly one claim");
    let stored = store.get(&"wf-1".into()).await.unwrap().unwrap();
    assert_eq!(stored.claim_token, winners[0].claim_token);
    assert_eq!(stored.revision, instance("wf-1").revision, "claim does not bump revision");
    db.drop_db().await;
}

/// After a re-claim, every write of the stale holder misses — the engine reports a miss
/// under a token guard as claim lost (K-3.4, K-6.4) — while the new holder's write lands.
#[tokio::test]
async fn stale_claim_token_after_reclaim_is_missed() {
    let Some(StoreDb(db, store)) = StoreDb::new().await else { return };
    cases::stale_token_after_reclaim_is_missed(&store).await;
    // A burst of stale writes racing one write of the current holder.
    let now = T0.plus(LEASE_MS).plus(2);
    let stale = Guard::Running { token: "old".into() };
    let current = Guard::Running { token: "new".into() };
    let t =
        Transition::complete_step(0, "fetch", serde_json::json!({"rows": 1}), DurationMs::from_millis(5), now, false);
    let id = WorkflowId::from("wf-1");
    let (stale_outcomes, current_outcome) = futures::join!(
        futures::future::join_all((0..10).map(|_| store.apply(&id, &stale, &t))),
        store.apply(&id, &current, &t),
    );
    assert!(stale.is_token_guard());
    assert!(stale_outcomes.into_iter().all(|o| o.expect("apply") == WriteOutcome::Missed));
    assert!(current_outcome.expect("apply").applied());
    db.drop_db().await;
}

/// Concurrent timer activation and signal activation of one wait: one wins (K-9.5).
#[tokio::test]
async fn signal_and_poll_race_on_one_wait_has_one_winner() {
    let Some(StoreDb(db, store)) = StoreDb::new().await else { return };
    seed(&store, cases::waiting("wf-1", Some(2), Some(T0))).await;
    let id = kernel_core::domain::WaitIdentity {
        signal_type: "approved".into(),
        wait_key: "doc:42".into(),
        generation: 2,
        step_index: 1,
    };
    let (due, poll) = (
        Guard::DueWait { now: T0, step_index: 1 },
        Transition::timer_activation(1, kernel_core::domain::ResumeKind::Poll, T0),
    );
    let (sig, activation) = (Guard::SignalWait(id), Transition::signal_activation(1, "sig-1", T0));
    let id = WorkflowId::from("wf-1");
    let (a, b) = futures::join!(store.apply(&id, &due, &poll), store.apply(&id, &sig, &activation));
    assert_eq!(u8::from(a.unwrap().applied()) + u8::from(b.unwrap().applied()), 1);
    db.drop_db().await;
}
