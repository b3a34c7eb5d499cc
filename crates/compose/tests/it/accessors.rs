//! The typed accessors a demo or a binary uses for what the five ports do not cover (a
//! business outbox, dispatch candidates, a stream sink, the concrete MongoDB handles), the
//! single-role URL reading with fallbacks, and scratch namespaces. `memory:` asked for a
//! driver handle is a typed [`ComposeError::NotOffered`].

use compose::{url_from_args, ComposeError, QueueOptions, QueueSide, Role, StoreSide, Urls};
use kernel_core::ports::{DynClock, SystemClock};
use kernel_core::{Instant, ObjectId, WorkflowId};
use std::collections::HashMap;
use std::sync::Arc;

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

fn not_offered(e: ComposeError, role: Role, what: &str) {
    match &e {
        ComposeError::NotOffered { role: r, scheme: "memory", what: w } if *r == role && *w == what => {}
        other => panic!("expected NotOffered {{ {role}, memory, {what} }}, got {other:?}"),
    }
    assert_eq!(e.to_string(), format!("a `memory` {role} offers no {what}"));
}

#[tokio::test]
async fn a_memory_store_offers_no_mongo_handles_but_an_outbox() {
    let side = StoreSide::connect("memory:").await.unwrap();
    not_offered(side.mongo_database().unwrap_err(), Role::Store, "MongoDB database");
    not_offered(side.mongo_store().unwrap_err(), Role::Store, "MongoDB store");
    not_offered(side.postgres_pool().unwrap_err(), Role::Store, "PostgreSQL pool");
    not_offered(side.postgres_config().unwrap_err(), Role::Store, "PostgreSQL configuration");
    not_offered(side.postgres_store().unwrap_err(), Role::Store, "PostgreSQL store");
    let outbox = side.dispatch_outbox().await.unwrap();
    assert!(outbox.get(&ObjectId::from("nothing-here")).await.unwrap().is_none());
}

#[tokio::test]
async fn a_memory_queue_offers_no_redis_handles_but_candidates() {
    let side = QueueSide::connect("memory:", &QueueOptions::default()).await.unwrap();
    not_offered(side.redis_connection().unwrap_err(), Role::Queue, "Redis connection");
    let clock: Arc<DynClock> = Arc::new(SystemClock);
    let secret = sse_stream::StreamSecret::new([7u8; 32]).unwrap();
    not_offered(side.stream_sink(clock, secret).unwrap_err(), Role::Queue, "stream sink");
    assert_eq!(side.key_prefix(), None);
    // K-12: an indexed candidate comes back once it is due.
    let candidates = side.dispatch_candidates().unwrap();
    candidates.add(&ObjectId::from("obj-1"), Instant::from_millis(10)).await.unwrap();
    assert!(candidates.pop_due(Instant::from_millis(5), 10).await.unwrap().is_empty());
    assert_eq!(candidates.pop_due(Instant::from_millis(10), 10).await.unwrap(), [ObjectId::from("obj-1")]);
}

#[test]
fn one_role_url_from_flag_then_variable_then_fallbacks() {
    let env: HashMap<&str, &str> =
        [("WFK_QUEUE", ""), ("REDIS_URL", "redis://fallback"), ("MONGODB_URI", "mongodb://m")].into_iter().collect();
    let get = |k: &str| env.get(k).map(|v| v.to_string());
    // The flag wins; the other role's flag is left for the caller.
    let (url, rest) =
        url_from_args(Role::Queue, args(&["--queue=memory:", "--store", "x"]), get, &["REDIS_URL"]).unwrap();
    assert_eq!((url.as_deref(), rest.as_slice()), (Some("memory:"), &args(&["--store", "x"])[..]));
    // An empty WFK_QUEUE does not count; the first fallback that is set does.
    let (url, _) = url_from_args(Role::Queue, args(&[]), get, &["UNSET", "REDIS_URL"]).unwrap();
    assert_eq!(url.as_deref(), Some("redis://fallback"));
    // Nothing names one: `None`, not an error.
    let (url, _) = url_from_args(Role::Store, args(&["--seed", "7"]), get, &[]).unwrap();
    assert_eq!(url, None);
    // A flag without its value is an error.
    let e = url_from_args(Role::Store, args(&["--store"]), get, &["MONGODB_URI"]).unwrap_err();
    assert!(matches!(e, ComposeError::MissingUrl { role: Role::Store, env: "WFK_STORE" }), "{e:?}");

    let (urls, rest) = Urls::from_args_or(args(&["--port", "0"]), get, &["MONGODB_URI"], &["REDIS_URL"]).unwrap();
    assert_eq!((urls.store.as_str(), urls.queue.as_str()), ("mongodb://m", "redis://fallback"));
    assert_eq!(rest, ["--port", "0"]);
    let e = Urls::from_args_or(args(&[]), get, &[], &["REDIS_URL"]).unwrap_err();
    assert!(matches!(e, ComposeError::MissingUrl { role: Role::Store, .. }), "{e:?}");
}

#[tokio::test]
async fn a_scratch_tag_must_be_an_identifier() {
    let e = StoreSide::connect_scratch("memory:", "bad tag").await.unwrap_err();
    assert!(
        matches!(e, ComposeError::Malformed { role: Role::Store, ref reason, .. } if reason.contains("scratch tag")),
        "{e:?}"
    );
    let e = QueueSide::connect_scratch("memory:", &QueueOptions::default(), "").await.unwrap_err();
    assert!(matches!(e, ComposeError::Malformed { role: Role::Queue, .. }), "{e:?}");
    // `memory:` is fresh anyway.
    let side = StoreSide::connect_scratch("memory:", "demo").await.unwrap();
    assert!(side.store.get(&WorkflowId::from("none")).await.unwrap().is_none());
}
