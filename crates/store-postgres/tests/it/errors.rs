//! The three typed outcomes of the store port's error contract on a real server:
//! `Unavailable` (certainly no effect), `Uncertain` (a write may have applied) and the
//! recovery of the pool after its connections are killed.

use crate::support::TestSchema;
use kernel_core::ports::*;
use kernel_core::transition::{Guard, Transition};
use kernel_core::Error;
use std::time::Duration;
use store_postgres::{PostgresConfig, PostgresWorkflowStore};
use testkit::conformance::store::{claimed, T0};

fn running() -> Guard {
    Guard::Running { token: "a".into() }
}

/// Hold the row lock of `wf-1` in a separate transaction until the returned sender fires.
async fn lock_row(db: &TestSchema) -> tokio::sync::oneshot::Sender<()> {
    let (locked_tx, locked_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let mut client = db.client().await;
    let sql = format!("SELECT 1 FROM \"{}\".workflow_instances WHERE workflow_id = 'wf-1' FOR UPDATE", db.schema());
    tokio::spawn(async move {
        let tx = client.transaction().await.expect("begin");
        tx.execute(sql.as_str(), &[]).await.expect("lock");
        let _ = locked_tx.send(());
        let _ = release_rx.await;
        tx.commit().await.expect("commit");
    });
    locked_rx.await.expect("locked");
    release_tx
}

/// A write cancelled by the server's `statement_timeout` (it waited on a row lock) was
/// rolled back: `Unavailable`, nothing written.
#[tokio::test]
async fn statement_timeout_is_unavailable_and_writes_nothing() {
    let Some(db) = TestSchema::new().await else { return };
    let url = store_postgres::database_url();
    let config = PostgresConfig { statement_timeout_ms: 100, ..db.config.clone() };
    let store = PostgresWorkflowStore::new(store_postgres::connect(&url, &config).unwrap(), config).unwrap();
    let seeded = claimed("wf-1", "a");
    store.create(seeded.clone()).await.unwrap();
    let release = lock_row(&db).await;
    let r = store.apply(&"wf-1".into(), &running(), &Transition::failing(T0)).await;
    assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
    assert!(r.unwrap_err().is_retryable());
    release.send(()).unwrap();
    assert_eq!(store.get(&"wf-1".into()).await.unwrap(), Some(seeded), "nothing written");
    db.drop_schema().await;
}

/// A write still waiting when the client-side call deadline passes is `Uncertain`: the
/// server goes on with it, and here it does apply once the lock is released — which is
/// exactly why the caller must not retry it blindly. (The configuration requires the
/// server's statement timeout to be shorter; the connection here has it switched off, as
/// a stalled server or network would never deliver the cancellation.)
#[tokio::test]
async fn call_deadline_on_a_write_is_uncertain() {
    let Some(db) = TestSchema::new().await else { return };
    let url = store_postgres::database_url();
    let config =
        PostgresConfig { call_timeout_ms: 150, statement_timeout_ms: 100, pool_size_max: 1, ..db.config.clone() };
    let pool = store_postgres::connect(&url, &config).unwrap();
    pool.get().await.unwrap().batch_execute("SET statement_timeout = 0").await.unwrap();
    let store = PostgresWorkflowStore::new(pool, config).unwrap();
    let seeded = claimed("wf-1", "a");
    store.create(seeded.clone()).await.unwrap();
    let release = lock_row(&db).await;
    let r = store.apply(&"wf-1".into(), &running(), &Transition::failing(T0)).await;
    assert!(matches!(r, Err(Error::Uncertain { .. })), "{r:?}");
    release.send(()).unwrap();
    let mut applied = None;
    for _ in 0..100 {
        let now = db.store().get(&"wf-1".into()).await.unwrap().unwrap();
        if now.revision != seeded.revision {
            applied = Some(now);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let applied = applied.expect("the write the client gave up on applied on the server");
    assert_eq!(applied.revision, seeded.revision + 1, "exactly once");
    db.drop_schema().await;
}

/// A write waiting on a row lock whose backend is terminated (`pg_terminate_backend`, a
/// `FATAL` answer): the client cannot tell a commit just before the end from none, so the
/// call is `Uncertain`; here the server had not applied it, and nothing applies once the
/// lock is released.
#[tokio::test]
async fn a_terminated_write_is_uncertain_and_nothing_applies() {
    let Some(db) = TestSchema::new().await else { return };
    let store = db.store();
    let seeded = claimed("wf-1", "a");
    store.create(seeded.clone()).await.unwrap();
    let release = lock_row(&db).await;
    let (admin, conn) = tokio_postgres::connect(&store_postgres::database_url(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    let write = tokio::spawn(async move { store.apply(&"wf-1".into(), &running(), &Transition::failing(T0)).await });
    let sql = format!(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE pid <> pg_backend_pid() AND wait_event_type = 'Lock' AND query LIKE '%\"{}\".workflow_instances SET%'",
        db.schema()
    );
    let mut killed = 0;
    for _ in 0..500 {
        killed = admin.query_one(sql.as_str(), &[]).await.unwrap().get::<_, i64>(0);
        if killed > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(killed, 1, "the waiting write's backend was terminated");
    let r = write.await.unwrap();
    release.send(()).unwrap();
    assert!(matches!(r, Err(Error::Uncertain { .. })), "{r:?}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(db.store().get(&"wf-1".into()).await.unwrap(), Some(seeded), "nothing applied");
    db.drop_schema().await;
}

/// The server's statement timeout must be shorter than the client's call deadline.
#[test]
fn statement_timeout_must_be_shorter_than_the_call_deadline() {
    let ok = PostgresConfig { statement_timeout_ms: 999, call_timeout_ms: 1_000, ..PostgresConfig::default() };
    ok.validate().unwrap();
    for statement_timeout_ms in [1_000, 5_000] {
        let c = PostgresConfig { statement_timeout_ms, ..ok.clone() };
        let r = c.validate();
        assert!(matches!(&r, Err(Error::InvalidInput { field, .. }) if field == "call_timeout_ms"), "{r:?}");
        let r = store_postgres::connect(&store_postgres::database_url(), &c);
        assert!(matches!(&r, Err(Error::InvalidInput { field, .. }) if field == "call_timeout_ms"));
    }
}

/// Every pooled connection held past the checkout deadline: `Unavailable`, nothing sent.
#[tokio::test]
async fn checkout_deadline_is_unavailable() {
    let Some(db) = TestSchema::new().await else { return };
    let config =
        PostgresConfig { pool_size_max: 1, statement_timeout_ms: 100, call_timeout_ms: 200, ..db.config.clone() };
    let pool = store_postgres::connect(&store_postgres::database_url(), &config).unwrap();
    let store = PostgresWorkflowStore::new(pool.clone(), config).unwrap();
    let seeded = claimed("wf-1", "a");
    store.create(seeded.clone()).await.unwrap();
    let held = pool.get().await.unwrap();
    let r = store.apply(&"wf-1".into(), &running(), &Transition::failing(T0)).await;
    assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
    drop(held);
    assert_eq!(store.get(&"wf-1".into()).await.unwrap(), Some(seeded), "nothing written");
    db.drop_schema().await;
}

/// A write that waited for a connection still gets more than the server's statement
/// timeout once it has one: waiting on a row lock, it is cancelled by the server
/// (`Unavailable`, nothing written), not abandoned by the client (`Uncertain`).
#[tokio::test]
async fn a_slow_checkout_leaves_the_statement_its_whole_timeout() {
    let Some(db) = TestSchema::new().await else { return };
    let config =
        PostgresConfig { pool_size_max: 1, statement_timeout_ms: 400, call_timeout_ms: 800, ..db.config.clone() };
    let pool = store_postgres::connect(&store_postgres::database_url(), &config).unwrap();
    let store = PostgresWorkflowStore::new(pool.clone(), config).unwrap();
    let seeded = claimed("wf-1", "a");
    store.create(seeded.clone()).await.unwrap();
    let release = lock_row(&db).await;
    let held = pool.get().await.unwrap();
    let write = tokio::spawn(async move { store.apply(&"wf-1".into(), &running(), &Transition::failing(T0)).await });
    tokio::time::sleep(Duration::from_millis(600)).await;
    drop(held);
    let r = write.await.unwrap();
    release.send(()).unwrap();
    assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(db.store().get(&"wf-1".into()).await.unwrap(), Some(seeded), "nothing written");
    db.drop_schema().await;
}

/// No server at the address: every call is `Unavailable` (retryable), nothing is sent.
#[tokio::test]
async fn no_server_is_unavailable() {
    let config = PostgresConfig { call_timeout_ms: 2_000, statement_timeout_ms: 1_000, ..PostgresConfig::default() };
    let pool = store_postgres::connect("postgres://postgres@127.0.0.1:1/test", &config).unwrap();
    let store = PostgresWorkflowStore::new(pool, config).unwrap();
    let r = store.get(&"wf-1".into()).await;
    assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
    let r = store.apply(&"wf-1".into(), &running(), &Transition::failing(T0)).await;
    assert!(matches!(r, Err(Error::Unavailable { .. })), "a write that was never sent: {r:?}");
    let r = store_postgres::connect("not a url", &PostgresConfig::default());
    assert!(matches!(r, Err(Error::InvalidInput { .. })));
}

/// Every connection of the pool is killed by the server (`pg_terminate_backend`): the
/// pool recovers, and across the failure no write is applied twice — the revision moved
/// exactly as many times as the store reported a write applied.
#[tokio::test]
async fn killed_connections_recover_and_no_write_applies_twice() {
    let Some(db) = TestSchema::with_pool_size(4).await else { return };
    let store = db.store();
    let seeded = claimed("wf-1", "a");
    store.create(seeded.clone()).await.unwrap();
    let t = Transition::heartbeat(T0, kernel_core::domain::DurationMs::from_millis(1)).unwrap();
    let mut bumping = Transition::failing(T0);
    bumping.status = None; // a revision bump that can repeat under the same guard
    let mut applied = 0u64;
    let (mut uncertain, mut unavailable) = (0, 0);
    // A connection of its own, outside the pool, kills the pool's.
    let (admin, conn) = tokio_postgres::connect(&store_postgres::database_url(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    for round in 0..5 {
        assert!(store.apply(&"wf-1".into(), &Guard::Token { token: "a".into() }, &t).await.unwrap().applied());
        let sql = format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE pid <> pg_backend_pid() AND query LIKE '%{}%workflow_instances%'",
            db.schema()
        );
        let killed: i64 = admin.query_one(sql.as_str(), &[]).await.unwrap().get(0);
        assert!(killed >= 1, "round {round}: the pool's connections were killed");
        let mut uncertain_now = false;
        match store.apply(&"wf-1".into(), &running(), &bumping).await {
            Ok(o) => applied += u64::from(o.applied()),
            Err(Error::Uncertain { .. }) => {
                uncertain += 1;
                uncertain_now = true;
            }
            Err(e @ Error::Unavailable { .. }) => {
                eprintln!("round {round}: {e} {:?}", e.cause());
                unavailable += 1
            }
            Err(e) => panic!("round {round}: {e:?}"),
        }
        // Whatever that call saw, the pool serves the next one.
        let now = store.get(&"wf-1".into()).await.expect("the pool recovered").unwrap();
        let moved = now.revision - seeded.revision;
        // One extra move only where this round's call was uncertain.
        assert!(moved == applied || (moved == applied + 1 && uncertain_now), "round {round}: {moved} vs {applied}");
        applied = moved;
    }
    let end = store.get(&"wf-1".into()).await.unwrap().unwrap();
    assert!(end.revision - seeded.revision <= 5, "at most one apply per call");
    println!("pool recovery: calls=5 applied={applied} uncertain={uncertain} unavailable={unavailable}");
    db.drop_schema().await;
}
