//! `Ports::builder`: a deployment names only what it changes; a missing required port is a
//! typed error naming it; the store side's dead letters and result cache come with the
//! deployment's ports (the round trip helpers here are shared by every scheme's tests).

use compose::{Deployment, QueueOptions};
use kernel_core::domain::{DurationMs, ErrorClass, Instant, StepError};
use kernel_core::engine::{MissingPort, Ports};
use kernel_core::ports::{
    CacheKey, CacheVersions, CachedResult, DeadLetter, DeadLetterStatus, DynDeadLetters, DynResultCache,
};
use serde_json::json;
use std::sync::Arc;

async fn memory() -> Deployment {
    Deployment::connect("memory:", "memory:", &QueueOptions::default()).await.unwrap()
}

#[tokio::test]
async fn every_missing_required_port_is_named() {
    let d = memory().await;
    let full = || d.ports();
    assert!(full().build().is_ok());
    let (s, q) = (&d.store, &d.queue);
    let cases: Vec<(&str, kernel_core::engine::PortsBuilder)> = vec![
        (
            "store",
            Ports::builder()
                .inbox(s.inbox.clone())
                .queue(q.queue.clone())
                .wakeup(q.wakeup.clone())
                .permits(q.permits.clone()),
        ),
        (
            "inbox",
            Ports::builder()
                .store(s.store.clone())
                .queue(q.queue.clone())
                .wakeup(q.wakeup.clone())
                .permits(q.permits.clone()),
        ),
        (
            "queue",
            Ports::builder()
                .store(s.store.clone())
                .inbox(s.inbox.clone())
                .wakeup(q.wakeup.clone())
                .permits(q.permits.clone()),
        ),
        (
            "wakeup",
            Ports::builder()
                .store(s.store.clone())
                .inbox(s.inbox.clone())
                .queue(q.queue.clone())
                .permits(q.permits.clone()),
        ),
        (
            "permits",
            Ports::builder()
                .store(s.store.clone())
                .inbox(s.inbox.clone())
                .queue(q.queue.clone())
                .wakeup(q.wakeup.clone()),
        ),
    ];
    for (port, builder) in cases {
        let err = builder.build().unwrap_err();
        assert_eq!(err, MissingPort { port });
        assert_eq!(err.to_string(), format!("ports: the required `{port}` port was not given"));
    }
}

#[tokio::test]
async fn defaults_are_the_wall_clock_random_ids_and_no_op_sinks() {
    let d = memory().await;
    let ports = d.ports().build().unwrap();
    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    assert!((ports.clock.now().as_millis() - wall).abs() < 60_000, "the default clock is the wall clock");
    assert_ne!(ports.ids.new_token(), ports.ids.new_token());
    // The no-op stream sink accepts everything and reports frame 0.
    let key =
        kernel_core::ports::StreamKey { object_id: "o".into(), workflow_id: "w".into(), fencing_token: "f".into() };
    let owner = kernel_core::ports::StreamOwner { lease_until: ports.clock.now() };
    assert_eq!(ports.stream.reset(&key, owner).await.unwrap(), 0);
}

#[tokio::test]
async fn a_named_port_replaces_its_default() {
    let d = memory().await;
    let clock = Arc::new(testkit::memory::ManualClock::new(1_000));
    let ports = d.ports().clock(clock.clone()).build().unwrap();
    assert_eq!(ports.clock.now(), 1_000);
    clock.advance(5);
    assert_eq!(ports.clock.now(), 1_005);
}

/// A dead letter for `workflow_id`, as the engine would record it.
fn dead_letter(workflow_id: &str) -> DeadLetter {
    DeadLetter {
        id: format!("{workflow_id}:charge:0"),
        workflow_id: workflow_id.into(),
        workflow_type: "order".into(),
        step: "charge".into(),
        step_index: 2,
        run: 0,
        epoch: 0,
        error: StepError { class: ErrorClass::Permanent, message: "card declined".into() },
        inputs: json!({"amount": 12}),
        created_at: Instant::from_millis(1_700_000_000_000),
        status: DeadLetterStatus::Open,
        decision: None,
        closed_at: None,
    }
}

/// The cache key of a read-only call whose input names `workflow_id`.
fn cache_key(workflow_id: &str) -> CacheKey {
    let versions = CacheVersions { prompt: "p1".into(), model: "m1".into(), tool: "t1".into(), data: "d1".into() };
    CacheKey::new("summarize", &versions, &json!({ "workflow": workflow_id })).unwrap()
}

const CACHE_TTL: DurationMs = DurationMs::from_millis(60_000);

/// The built ports of `d` carry the store side's dead letters and result cache (the very
/// same adapters), and a record/get and a put/get round trip through them work; `workflow_id`
/// keeps the records of one test apart. The cache entry is stored at the ports' clock
/// reading (the wall clock: a server may expire entries by its own clock as a backstop),
/// which is returned; [`reads_back`] reads everything back.
pub(crate) async fn round_trip_through_the_ports(d: &Deployment, workflow_id: &str) -> Instant {
    let ports = d.ports().build().unwrap();
    let dead_letters = ports.dead_letters.expect("the deployment's ports have dead letters");
    let cache = ports.result_cache.expect("the deployment's ports have a result cache");
    assert!(Arc::ptr_eq(&dead_letters, &d.store.dead_letters), "the store side's dead letters");
    assert!(Arc::ptr_eq(&cache, &d.store.result_cache), "the store side's result cache");

    let dl = dead_letter(workflow_id);
    assert_eq!(dead_letters.get(&dl.id).await.unwrap(), None, "a fresh namespace has no record");
    assert!(dead_letters.record(&dl).await.unwrap(), "recorded");
    let mut again = dl.clone();
    again.error.message = "another message".into();
    assert!(!dead_letters.record(&again).await.unwrap(), "a second record of the id changes nothing");

    let key = cache_key(workflow_id);
    let cached_at = ports.clock.now();
    assert_eq!(cache.get(&key, cached_at).await.unwrap(), None, "a fresh namespace has no entry");
    cache.put(&key, &json!({"summary": workflow_id}), cached_at, CACHE_TTL).await.unwrap();
    reads_back(&*dead_letters, &*cache, workflow_id, cached_at).await;
    cached_at
}

/// What [`round_trip_through_the_ports`] wrote for `workflow_id` is what `dead_letters` and
/// `cache` read: the first record unchanged, the entry stored at `cached_at` live until it
/// expires.
pub(crate) async fn reads_back(
    dead_letters: &DynDeadLetters,
    cache: &DynResultCache,
    workflow_id: &str,
    cached_at: Instant,
) {
    let dl = dead_letter(workflow_id);
    assert_eq!(dead_letters.get(&dl.id).await.unwrap(), Some(dl.clone()));
    let open = dead_letters.list(Some(DeadLetterStatus::Open), None, 10).await.unwrap();
    assert_eq!(open, [dl]);

    let key = cache_key(workflow_id);
    let hit = cache.get(&key, cached_at.try_add(DurationMs::from_millis(1), "now").unwrap()).await.unwrap();
    let expires_at = cached_at.try_add(CACHE_TTL, "ttl").unwrap();
    assert_eq!(
        hit,
        Some(CachedResult { value: json!({"summary": workflow_id}), stored_at: cached_at, expires_at }),
        "the entry is live before it expires"
    );
    assert_eq!(cache.get(&key, expires_at).await.unwrap(), None, "an expired entry is a miss");
    assert_eq!(cache.get(&cache_key("other"), cached_at).await.unwrap(), None, "another key misses");
}

/// `memory:` gives in-process adapters: the round trip works, and another deployment (as
/// another process would) sees nothing of it.
#[tokio::test]
async fn memory_ports_carry_dead_letters_and_a_result_cache() {
    let d = memory().await;
    let cached_at = round_trip_through_the_ports(&d, "wf-memory").await;
    let other = memory().await;
    let dl = dead_letter("wf-memory");
    assert_eq!(other.store.dead_letters.get(&dl.id).await.unwrap(), None);
    assert_eq!(other.store.result_cache.get(&cache_key("wf-memory"), cached_at).await.unwrap(), None);
}
