//! `Ports::builder`: a deployment names only what it changes; a missing required port is a
//! typed error naming it.

use compose::{Deployment, QueueOptions};
use kernel_core::engine::{MissingPort, Ports};
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
