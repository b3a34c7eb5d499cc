//! `--store`/`--queue` and `WFK_STORE`/`WFK_QUEUE`; errors a caller sees before any server.

use compose::{ComposeError, Deployment, QueueOptions, Role, StoreSide, Urls};
use std::collections::HashMap;

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

#[test]
fn flags_win_over_the_environment_and_the_rest_is_returned() {
    let env: HashMap<&str, &str> = [("WFK_STORE", "mongodb://env/db"), ("WFK_QUEUE", "redis://env")].into();
    let get = |k: &str| env.get(k).map(|v| v.to_string());
    let (urls, rest) =
        Urls::from_args(args(&["--store", "memory:", "--worker-id", "w1", "--queue=memory:"]), get).unwrap();
    assert_eq!((urls.store.as_str(), urls.queue.as_str()), ("memory:", "memory:"));
    assert_eq!(rest, ["--worker-id", "w1"]);
    let (urls, rest) = Urls::from_args(args(&[]), get).unwrap();
    assert_eq!((urls.store.as_str(), urls.queue.as_str()), ("mongodb://env/db", "redis://env"));
    assert!(rest.is_empty());
}

#[test]
fn a_missing_url_names_the_flag_and_the_variable() {
    let none = |_: &str| None;
    let e = Urls::from_args(args(&["--store", "memory:"]), none).unwrap_err();
    assert!(matches!(e, ComposeError::MissingUrl { role: Role::Queue, env: "WFK_QUEUE" }), "{e:?}");
    assert_eq!(e.to_string(), "no queue url: pass --queue <url> or set WFK_QUEUE");
    let e = Urls::from_args(args(&["--queue"]), none).unwrap_err();
    assert!(matches!(e, ComposeError::MissingUrl { role: Role::Queue, .. }), "{e:?}");
}

#[test]
fn urls_debug_hides_passwords() {
    let urls = Urls { store: "mongodb://u:secret@h/db".into(), queue: "redis://:secret@h".into() };
    assert!(!format!("{urls:?}").contains("secret"));
}

#[tokio::test]
async fn connecting_refuses_bad_urls_before_any_server() {
    let e = StoreSide::connect("cassandra://h/x").await.unwrap_err();
    assert!(matches!(e, ComposeError::UnknownScheme { .. }), "{e:?}");
    let e = Deployment::connect("memory:", "mongodb://h/db", &QueueOptions::default()).await.unwrap_err();
    assert!(matches!(e, ComposeError::WrongRole { role: Role::Queue, .. }), "{e:?}");
    let e = Deployment::connect("mongodb://", "memory:", &QueueOptions::default()).await.unwrap_err();
    assert!(matches!(e, ComposeError::Malformed { role: Role::Store, .. }), "{e:?}");
}

#[tokio::test]
async fn an_unreachable_server_is_a_connect_error_with_its_cause() {
    // Port 1 refuses connections; the driver's words stay reachable through `source()`.
    let e = Deployment::connect("memory:", "redis://127.0.0.1:1", &QueueOptions::default()).await.unwrap_err();
    assert!(matches!(e, ComposeError::Connect { role: Role::Queue, what: "connect", .. }), "{e:?}");
    assert!(std::error::Error::source(&e).is_some());
    let e = StoreSide::connect("mongodb://127.0.0.1:1/db?serverSelectionTimeoutMS=200").await.unwrap_err();
    assert!(matches!(e, ComposeError::Connect { role: Role::Store, .. }), "{e:?}");
}
