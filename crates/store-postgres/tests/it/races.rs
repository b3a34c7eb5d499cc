//! Races over real concurrent connections (K-5, K-6.2, K-6.4, K-9.3): every figure printed
//! is read back from the database afterwards.

use crate::support::TestSchema;
use kernel_core::model::*;
use kernel_core::ports::*;
use kernel_core::transition::{Guard, Transition};
use std::sync::Arc;
use testkit::conformance::store::{claimed, instance, waiting, LEASE_MS, T0, TYPE};
use testkit::time::TestTime;
use tokio::sync::Barrier;

const N: usize = 50;

/// Run `n` copies of `f(i)` on the multi-threaded runtime, released together by a barrier.
async fn race<T, F, Fut>(n: usize, f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (b, fut) = (barrier.clone(), f(i));
            tokio::spawn(async move {
                b.wait().await;
                fut.await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.expect("task"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn races_over_concurrent_connections() {
    let Some(db) = TestSchema::with_pool_size(16).await else { return };
    let store = Arc::new(db.store());
    let inbox = Arc::new(db.inbox());
    // Open the pool's connections up front, so every race below runs over all of them.
    let warm: Vec<_> = futures::future::join_all((0..16).map(|_| db.pool.get())).await;
    drop(warm);

    // K-5: 50 creates of one biz_key under different workflow ids.
    let outcomes = race(N, |i| {
        let s = store.clone();
        async move {
            let mut inst = instance(&format!("wf-create-{i}"));
            inst.biz_key = "biz:race".into();
            s.create(inst).await.expect("create")
        }
    })
    .await;
    let created_calls = outcomes.iter().filter(|o| matches!(o, CreateOutcome::Created(_))).count();
    let created = db.scalar("SELECT count(*) FROM {s}.workflow_instances WHERE biz_key = 'biz:race'").await;
    assert_eq!((created_calls, created), (1, 1), "one Created, one row");
    let winner = outcomes.iter().find_map(|o| match o {
        CreateOutcome::Created(c) => Some(c.workflow_id.clone()),
        CreateOutcome::Exists(_) => None,
    });
    for o in &outcomes {
        if let CreateOutcome::Exists(e) = o {
            assert_eq!(Some(&e.workflow_id), winner.as_ref(), "every loser sees the stored winner");
        }
    }

    // K-6.2: 50 claims of one due instance, each with its own token.
    store.create(instance("wf-claim")).await.expect("seed");
    let claims = race(N, |i| {
        let s = store.clone();
        async move {
            let spec =
                ClaimSpec { now: T0, lease_ms: LEASE_MS, token: format!("tok-{i}").into(), types: vec![TYPE.into()] };
            s.claim(&"wf-claim".into(), &spec).await.expect("claim")
        }
    })
    .await;
    let won: Vec<_> = claims.iter().flatten().collect();
    let claimed_n = db
        .scalar(
            "SELECT count(*) FROM {s}.workflow_instances WHERE workflow_id = 'wf-claim' AND claim_token IS NOT NULL",
        )
        .await;
    let stored = store.get(&"wf-claim".into()).await.unwrap().unwrap();
    assert_eq!(won.len(), 1, "one claim wins");
    assert_eq!(stored.claim_token, won[0].claim_token, "the stored token is the winner's");
    assert_eq!(stored.revision, 5, "a claim does not bump the revision");

    // K-9.3: 50 deliveries of one signal id to a waiting instance. Each runs the delivery
    // protocol over the ports: inbox insert; then, if the record is still pending, the
    // activation under the signal-wait guard, and the record marked matched.
    store.create(waiting("wf-signal", Some(2), None)).await.expect("seed");
    let before = store.get(&"wf-signal".into()).await.unwrap().unwrap();
    let deliveries = race(N, |_| {
        let (s, ib) = (store.clone(), inbox.clone());
        async move {
            let record = SignalRecord {
                signal_id: "sig-race".into(),
                workflow_id: "wf-signal".into(),
                signal_type: "approved".into(),
                wait_key: "doc:42".into(),
                generation: 2,
                status: SignalStatus::Pending,
                created_at: T0,
                match_time: None,
                orphan: false,
            };
            let pending = match ib.insert(record).await.expect("insert") {
                InsertOutcome::Inserted => true,
                InsertOutcome::Duplicate(r) => r.status == SignalStatus::Pending,
            };
            if !pending {
                return false;
            }
            let id = WaitIdentity {
                signal_type: "approved".into(),
                wait_key: "doc:42".into(),
                generation: 2,
                step_index: 1,
            };
            let t = Transition::signal_activation(1, "sig-race", T0);
            let applied = s.apply(&"wf-signal".into(), &Guard::SignalWait(id), &t).await.expect("apply").applied();
            if applied {
                ib.mark_matched("sig-race", T0).await.expect("mark");
            }
            applied
        }
    })
    .await;
    let activations_calls = deliveries.iter().filter(|a| **a).count();
    let after = store.get(&"wf-signal".into()).await.unwrap().unwrap();
    let activations = after.revision - before.revision; // each activation bumps it once
    let records = db.scalar("SELECT count(*) FROM {s}.signal_inbox WHERE signal_id = 'sig-race'").await;
    let matched = db.scalar("SELECT count(*) FROM {s}.signal_inbox WHERE status = 'matched'").await;
    assert_eq!((activations_calls as u64, activations, records, matched), (1, 1, 1, 1));
    assert_eq!(after.status, WorkflowStatus::Running);
    assert_eq!(after.resume.and_then(|r| r.signal_id).as_deref(), Some("sig-race"));

    // K-6.4: after a re-claim, 25 writers with the stale token and 25 with the fresh one
    // mark step 1 running at once: only the fresh ones apply.
    let mut old = claimed("wf-stale", "tok-old");
    old.claimable_time = Some(T0.minus(1));
    store.create(old).await.expect("seed");
    let spec = ClaimSpec { now: T0, lease_ms: LEASE_MS, token: "tok-new".into(), types: vec![TYPE.into()] };
    store.claim(&"wf-stale".into(), &spec).await.expect("reclaim").expect("the expired lease is claimable");
    let before = store.get(&"wf-stale".into()).await.unwrap().unwrap();
    let writes = race(N, |i| {
        let s = store.clone();
        let token = if i % 2 == 0 { "tok-old" } else { "tok-new" };
        async move {
            let g = Guard::Running { token: token.into() };
            (token, s.apply(&"wf-stale".into(), &g, &Transition::mark_running(1, T0)).await.expect("apply"))
        }
    })
    .await;
    let fresh_applied = writes.iter().filter(|(t, o)| *t == "tok-new" && o.applied()).count() as u64;
    let stale_calls = writes.iter().filter(|(t, o)| *t == "tok-old" && o.applied()).count();
    let after = store.get(&"wf-stale".into()).await.unwrap().unwrap();
    let writes_stored = after.revision - before.revision;
    let stale_accepted = writes_stored - fresh_applied;
    assert_eq!(fresh_applied, (N / 2) as u64, "every fresh write applies");
    assert_eq!((stale_calls, stale_accepted), (0, 0), "no stale write applies");
    assert_eq!(u64::from(after.steps[1].attempt - before.steps[1].attempt), writes_stored);

    let connections = db
        .scalar(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND query LIKE '%{}%'",
            db.schema()
        ))
        .await;
    assert!(connections >= 8, "the races ran over {connections} connections");
    println!(
        "races: store=postgres creators={N} created={created} claimers={N} claimed={claimed_n} deliverers={N} \
         activations={activations} stale_accepted={stale_accepted} connections={connections}"
    );
    db.drop_schema().await;
}
