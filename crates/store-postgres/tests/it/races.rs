//! Races over real concurrent connections (K-5, K-6.2, K-6.4, K-9.3): every figure printed
//! is read back from the database afterwards — `created` and `claimed` count the inserts
//! and claims the server applied (logged by triggers of the test schema), not rows.

use crate::support::TestSchema;
use kernel_core::domain::*;
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
    // Every applied insert and every applied claim (an update setting a token) is logged
    // by triggers of this test schema, so a double create or a double claim would show
    // even where the row itself keeps only the last one.
    let q = format!("\"{}\"", db.schema());
    db.client()
        .await
        .batch_execute(&format!(
            "CREATE TABLE {q}.applied (op text NOT NULL, workflow_id text NOT NULL, biz_key text NOT NULL);
             CREATE FUNCTION {q}.log_applied() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 INSERT INTO {q}.applied VALUES (lower(TG_OP), NEW.workflow_id, NEW.biz_key);
                 RETURN NULL;
             END $$;
             CREATE TRIGGER log_create AFTER INSERT ON {q}.workflow_instances
                 FOR EACH ROW EXECUTE FUNCTION {q}.log_applied();
             CREATE TRIGGER log_claim AFTER UPDATE OF claim_token ON {q}.workflow_instances
                 FOR EACH ROW WHEN (NEW.claim_token IS NOT NULL) EXECUTE FUNCTION {q}.log_applied();"
        ))
        .await
        .unwrap();
    // How many backends are running a statement of this schema at once, sampled on a
    // connection of its own for as long as the races last.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (client, conn) =
            tokio_postgres::connect(&store_postgres::database_url(), tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        let sql = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND state = 'active' AND query LIKE '%{}%'",
            db.schema()
        );
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut most = 0i64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                most = most.max(client.query_one(sql.as_str(), &[]).await.expect("sample").get(0));
            }
            most
        })
    };

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
    let created = db.scalar("SELECT count(*) FROM {s}.applied WHERE op = 'insert' AND biz_key = 'biz:race'").await;
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
    let claimed_n =
        db.scalar("SELECT count(*) FROM {s}.applied WHERE op = 'update' AND workflow_id = 'wf-claim'").await;
    let stored = store.get(&"wf-claim".into()).await.unwrap().unwrap();
    assert_eq!((won.len(), claimed_n), (1, 1), "one claim wins, one claim applied");
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

    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let connections = sampler.await.expect("sampler");
    let backends = db
        .scalar(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND query LIKE '%{}%'",
            db.schema()
        ))
        .await;
    assert!(backends >= 8, "the races ran over {backends} connections");
    println!(
        "races: store=postgres creators={N} created={created} claimers={N} claimed={claimed_n} deliverers={N} \
         activations={activations} stale_accepted={stale_accepted}"
    );
    // Backends that ran a statement of this schema, and the most seen running one at the
    // same instant by the sampler (a lower bound: one sample at a time, races are short).
    println!("races: store=postgres backends={backends} active_sampled_max={connections}");
    db.drop_schema().await;
}
