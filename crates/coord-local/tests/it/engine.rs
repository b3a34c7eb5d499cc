//! The engine on the SQLite coordination: two engines, each on its own opening of one file
//! (two workers), share the lanes and a permit with a ceiling of 1, in simulated time.

use crate::fresh;
use coord_local::{LocalConfig, LocalCoord, LocalPermitsConfig};
use kernel_core::ports::{PermitLimits, ReadyQueue};
use kernel_core::{ActivityContext, Definition, Ports, StartRequest, StepDef, StepOutcome, WorkflowStatus};
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use testkit::harness::{test_config, World};

const WORKFLOWS: usize = 24;

fn ports_on(world: &World, coord: &LocalCoord) -> Ports {
    let permits = coord
        .permits(
            world.clock.clone(),
            LocalPermitsConfig::new(PermitLimits::default())
                .default_limits("api", PermitLimits { max_concurrency: 1, max_starts_per_second: 0 }),
        )
        .expect("permits");
    Ports {
        queue: Arc::new(coord.queue()),
        wakeup: Arc::new(coord.wakeup()),
        permits: Arc::new(permits),
        ..world.ports()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_engines_on_one_file_complete_every_workflow_within_the_permit_ceiling() {
    let world = World::new(11);
    let (a, _dir) = fresh(LocalConfig::default()).await;
    let b = LocalCoord::open(a.path().expect("file"), LocalConfig::default()).await.expect("second opening");
    let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (i2, m2) = (inside.clone(), most.clone());
    let def = Definition::builder("t")
        .step(
            StepDef::new("call", move |_ctx: ActivityContext| {
                let (inside, most) = (i2.clone(), m2.clone());
                async move {
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    Ok(StepOutcome::complete(json!("called")))
                }
            })
            .resource("api"),
        )
        .step(StepDef::new("store", |_ctx: ActivityContext| async { Ok(StepOutcome::complete(json!("stored"))) }))
        .build()
        .expect("definition");
    let e1 = world.engine_on(ports_on(&world, &a), test_config("w1"), vec![def.clone()]);
    let e2 = world.engine_on(ports_on(&world, &b), test_config("w2"), vec![def]);
    for i in 0..WORKFLOWS {
        let publisher = if i % 2 == 0 { e1.publisher() } else { e2.publisher() };
        publisher.start_or_resume(StartRequest::new("t", format!("biz-{i}"), json!({}))).await.expect("start");
    }
    let report = world.drive_all(&[&e1, &e2]).await.expect("drive");
    let instances = world.instances().await.expect("instances");
    assert_eq!(instances.len(), WORKFLOWS);
    for i in &instances {
        assert_eq!(i.status, WorkflowStatus::Completed, "{}", i.workflow_id);
    }
    assert!(most.load(Ordering::SeqCst) <= 1, "the permit ceiling of 1 was exceeded");
    assert_eq!(a.queue().stats(world.now()).await.unwrap().map(|s| s.depth), [0; 4], "lanes drained");
    // Which engine claims what is the scheduler's business (one engine may take them all):
    // half the workflows were enqueued through the second opening and every one completed
    // with the first opening's lanes empty, so the lanes are shared; every claim is one of
    // the two engines'.
    assert_eq!(report.claims_by("w1") + report.claims_by("w2"), report.claims(), "claims by the two engines only");
    assert!(report.claims() >= WORKFLOWS, "at least one claim per workflow: {}", report.claims());
}
