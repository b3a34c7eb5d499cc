//! Issue acceptance 5: bad input is a typed error and writes nothing on the server; values
//! shaped like operators are data.

use crate::support::{InboxDb, StoreDb};
use kernel_core::domain::*;
use kernel_core::ports::{SignalInbox, WorkflowStore, WriteOutcome};
use kernel_core::transition::{Guard, Transition};
use kernel_core::Error;
use kernel_core::WorkflowId;
use serde_json::json;
use store_mongo::{INBOX, INSTANCES};
use testkit::conformance::inbox::record;
use testkit::conformance::store::{claimed, instance, seed, T0};

fn assert_invalid<T: std::fmt::Debug>(r: kernel_core::Result<T>, what: &str) {
    assert!(matches!(r, Err(Error::InvalidInput { .. })), "{what}: expected InvalidInput, got {r:?}");
}

/// Step names with `$` or `.`, a wait key with NUL, an id over 256 bytes, oversize input
/// and output, and integers BSON cannot hold: `InvalidInput`, and the server is untouched.
#[tokio::test]
async fn bad_input_is_typed_and_writes_nothing() {
    let Some(StoreDb(db, store)) = StoreDb::new().await else { return };
    let base = seed(&store, claimed("wf-1", "a")).await;
    let big = json!({"blob": "x".repeat(300 * 1024)});

    let mut creates = vec![];
    for name in ["$where", "a.b"] {
        let mut i = instance("wf-2");
        i.steps[1].name = name.into();
        creates.push((format!("step name {name}"), i));
    }
    creates.push(("id over 256 bytes".into(), instance(&"w".repeat(257))));
    creates.push(("oversize input".into(), WorkflowInstance { input: big.clone(), ..instance("wf-2") }));
    creates.push(("u64 beyond i64".into(), WorkflowInstance { input: json!({"n": u64::MAX}), ..instance("wf-2") }));
    let mut w = testkit::conformance::store::waiting("wf-2", Some(1), None);
    let Some(Wait::Signal { wait_key, .. }) = w.wait.as_mut() else { unreachable!("a signal wait") };
    *wait_key = "doc\0".into();
    creates.push(("wait key with NUL".into(), w));
    for (what, inst) in creates {
        assert_invalid(store.create(inst).await, &what);
    }

    let wait = Wait::Signal {
        signal_type: "approved".into(),
        wait_key: "k\0".into(),
        generation: 1,
        step_index: 1,
        poll_time: None,
    };
    let running = Guard::Running { token: "a".into() };
    let writes: Vec<(&str, Transition)> = vec![
        ("wait key with NUL", Transition::suspend(1, wait, None, DurationMs::from_millis(0), T0)),
        (
            "oversize output",
            Transition::complete_step(1, "compose", big.clone(), DurationMs::from_millis(0), T0, false),
        ),
        ("oversize checkpoint", Transition::yield_step(1, Some(big), DurationMs::from_millis(0), T0)),
        ("output name with $", Transition::complete_step(1, "$set", json!(1), DurationMs::from_millis(0), T0, false)),
        ("output name with .", Transition::complete_step(1, "a.b", json!(1), DurationMs::from_millis(0), T0, false)),
    ];
    for (what, t) in writes {
        assert_invalid(store.apply(&"wf-1".into(), &running, &t).await, what);
    }
    assert_invalid(
        store.apply(&WorkflowId::from(&"w".repeat(257)), &running, &Transition::failing(T0)).await,
        "id over 256 bytes",
    );
    assert_invalid(
        store.apply(&"wf-1".into(), &Guard::Running { token: "a\0".into() }, &Transition::failing(T0)).await,
        "token with NUL",
    );

    assert_eq!(db.count(INSTANCES).await, 1, "no instance created");
    assert_eq!(store.get(&"wf-1".into()).await.unwrap(), Some(base), "stored instance untouched");
    db.drop_db().await;
}

/// `{"$ne": null}` as an id or token is a string compared for equality, never a query.
#[tokio::test]
async fn operator_shaped_ids_and_tokens_are_data() {
    let Some(StoreDb(db, store)) = StoreDb::new().await else { return };
    let base = seed(&store, claimed("wf-1", "a")).await;
    let evil = r#"{"$ne": null}"#;
    assert_eq!(store.get(&WorkflowId::from(evil)).await.unwrap(), None, "matches no other document");
    assert_eq!(store.get_by_biz_key(evil).await.unwrap(), None);
    let r =
        store.apply(&"wf-1".into(), &Guard::Running { token: evil.into() }, &Transition::failing(T0)).await.unwrap();
    assert_eq!(r, WriteOutcome::Missed, "an operator-shaped token does not match the real one");
    let r = store.apply(&WorkflowId::from(evil), &Guard::Active, &Transition::supersede(T0)).await.unwrap();
    assert_eq!(r, WriteOutcome::Missed);
    assert_eq!(store.get(&"wf-1".into()).await.unwrap(), Some(base));
    db.drop_db().await;
}

/// Inbox: a wait key with NUL is rejected before the server; nothing is stored.
#[tokio::test]
async fn inbox_bad_input_writes_nothing() {
    let Some(InboxDb(db, inbox)) = InboxDb::new().await else { return };
    let mut r = record("sig-1", T0);
    r.wait_key = "doc\0".into();
    assert_invalid(inbox.insert(r).await, "wait key with NUL");
    assert_invalid(inbox.insert(record(&"s".repeat(257), T0)).await, "id over 256 bytes");
    assert_eq!(db.count(INBOX).await, 0);
    db.drop_db().await;
}
