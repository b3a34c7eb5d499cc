//! Every bad input is a typed error and writes nothing.

use kernel_core::domain::DurationMs;
use kernel_core::engine::EngineConfig;
use kernel_core::ports::Signal;
use kernel_core::{ActivityContext, Definition, Error, RetryPolicy, StartRequest, StepDef, StepOutcome};
use serde_json::json;
use testkit::harness::World;

fn ok_step(name: &str) -> StepDef {
    StepDef::new(name, |_ctx: ActivityContext| async { Ok(StepOutcome::complete(json!(1))) })
}

fn invalid<T: std::fmt::Debug>(r: Result<T, Error>, field_part: &str) {
    match r {
        Err(Error::InvalidInput { field, .. }) => {
            assert!(field.contains(field_part), "field {field} should mention {field_part}")
        }
        other => panic!("expected InvalidInput about {field_part}, got {other:?}"),
    }
}

fn world_with_engine() -> (World, kernel_core::Engine) {
    let world = World::new(1);
    let engine = world.engine("w", vec![crate::linear("t", 2, false)]);
    (world, engine)
}

fn assert_nothing_written(world: &World) {
    assert_eq!(world.audit.counts().writes, 0, "no store write");
    assert!(world.store.all().is_empty());
    assert!(world.inbox.all().is_empty());
    assert!(world.queue.is_empty());
}

#[tokio::test]
async fn bad_identifiers_in_start() {
    let (world, engine) = world_with_engine();
    let p = engine.publisher();
    invalid(p.start_or_resume(StartRequest::new("t", "", json!({}))).await, "biz_key");
    invalid(p.start_or_resume(StartRequest::new("t", "x".repeat(257), json!({}))).await, "biz_key");
    invalid(p.start_or_resume(StartRequest::new("t", "a\0b", json!({}))).await, "biz_key");
    invalid(p.start_or_resume(StartRequest::new("t", "a\u{7}b", json!({}))).await, "biz_key");
    invalid(
        p.start_or_resume(StartRequest::new("t", "ok", json!({})).workflow_id("id\nwith newline")).await,
        "workflow_id",
    );
    invalid(p.start_or_resume(StartRequest::new("t", "ok", json!({})).workflow_id("")).await, "workflow_id");
    invalid(p.start_or_resume(StartRequest::new("", "ok", json!({}))).await, "workflow_type");
    assert_nothing_written(&world);
}

#[tokio::test]
async fn unregistered_type() {
    let (world, engine) = world_with_engine();
    let r = engine.publisher().start_or_resume(StartRequest::new("nope", "b", json!({}))).await;
    assert!(matches!(r, Err(Error::UnregisteredType(t)) if t == "nope"));
    assert_nothing_written(&world);
}

#[tokio::test]
async fn payload_over_the_limit() {
    let (world, engine) = world_with_engine();
    let big = json!({ "blob": "x".repeat(engine.config().payload_bytes_max) });
    invalid(engine.publisher().start_or_resume(StartRequest::new("t", "b", big)).await, "input");
    assert_nothing_written(&world);
}

#[tokio::test]
async fn bad_signal_identifiers() {
    let (world, engine) = world_with_engine();
    let sig = |id: &str, wf: &str, ty: &str, key: &str| Signal {
        signal_id: id.into(),
        workflow_id: wf.into(),
        signal_type: ty.into(),
        wait_key: key.into(),
        generation: 0,
    };
    invalid(engine.deliver_signal(sig("", "wf", "go", "k")).await, "signal_id");
    invalid(engine.deliver_signal(sig("s", "", "go", "k")).await, "workflow_id");
    invalid(engine.deliver_signal(sig("s", "wf", "g\0o", "k")).await, "signal_type");
    invalid(engine.deliver_signal(sig("s", "wf", "go", "k\0")).await, "wait_key");
    invalid(engine.deliver_signal(sig("s", "wf", "go", &"k".repeat(300))).await, "wait_key");
    invalid(engine.cancel(&"".into()).await, "workflow_id");
    assert_nothing_written(&world);
}

#[test]
fn bad_definitions() {
    invalid(Definition::builder("t").step(ok_step("a")).step(ok_step("a")).build(), "steps[1].name");
    invalid(Definition::builder("t").step(ok_step("$where")).build(), "steps[0].name");
    invalid(Definition::builder("t").step(ok_step("a.b")).build(), "steps[0].name");
    invalid(Definition::builder("t").step(ok_step("a").depends_on(["ghost"])).build(), "depends_on");
    invalid(
        Definition::builder("t").step(ok_step("a").depends_on(["b"])).step(ok_step("b").depends_on(["a"])).build(),
        "depends_on",
    );
    invalid(Definition::builder("t").step(ok_step("a").timeout_ms(0)).build(), "timeout_ms");
    invalid(Definition::builder("t").step(ok_step("a").timeout_ms(-5)).build(), "timeout_ms");
    invalid(
        Definition::builder("t")
            .step(ok_step("a").retry(RetryPolicy::Exponential {
                base_ms: DurationMs::from_millis(0),
                cap_ms: DurationMs::from_millis(10),
            }))
            .build(),
        "retry.base_ms",
    );
    invalid(Definition::builder("t").step(ok_step("a").resource("gpu.big")).build(), "resource");
    invalid(Definition::builder("t").step(ok_step("a").resource("$gpu")).build(), "resource");
    invalid(Definition::builder("t").build(), "steps");
}

#[test]
fn bad_engine_config() {
    let world = World::new(1);
    let build = |c: EngineConfig| kernel_core::Engine::builder(world.ports()).config(c).build();
    invalid(
        build(EngineConfig {
            heartbeat_ms: DurationMs::from_millis(30_000),
            lease_ms: DurationMs::from_millis(30_000),
            ..EngineConfig::default()
        }),
        "heartbeat_ms",
    );
    invalid(
        build(EngineConfig {
            heartbeat_ms: DurationMs::from_millis(40_000),
            lease_ms: DurationMs::from_millis(30_000),
            ..EngineConfig::default()
        }),
        "heartbeat_ms",
    );
    invalid(build(EngineConfig { lease_ms: DurationMs::from_millis(0), ..EngineConfig::default() }), "lease_ms");
    invalid(
        build(EngineConfig { poll_interval_ms: DurationMs::from_millis(-1), ..EngineConfig::default() }),
        "poll_interval_ms",
    );
    invalid(build(EngineConfig { worker_slots: 0, ..EngineConfig::default() }), "worker_slots");
    invalid(build(EngineConfig { worker_id: "".into(), ..EngineConfig::default() }), "worker_id");
    // A duplicate registration is refused too.
    let r = kernel_core::Engine::builder(world.ports())
        .register(crate::linear("t", 1, false))
        .register(crate::linear("t", 1, false))
        .build();
    invalid(r, "workflow_type");
}

#[tokio::test]
async fn oversize_output_fails_the_step_without_storing_it() {
    let world = World::new(1);
    let def = Definition::builder("big")
        .step(StepDef::new("a", |_ctx: ActivityContext| async { Ok(StepOutcome::complete(json!("x".repeat(70_000)))) }))
        .build()
        .unwrap();
    let engine = world.engine("w", vec![def]);
    engine.publisher().start_or_resume(StartRequest::new("big", "b", json!({}))).await.unwrap();
    world.drive(&engine).await.unwrap();
    let inst = world.store.all().pop().unwrap();
    assert_eq!(inst.status, kernel_core::WorkflowStatus::Failed);
    assert!(inst.output.is_empty(), "the oversize output is never written");
    let err = inst.steps[0].error.clone().unwrap();
    assert_eq!(err.class, kernel_core::ErrorClass::Permanent);
    assert!(err.message.contains("payload limit"), "{}", err.message);
}

#[tokio::test]
async fn a_sleep_past_the_range_of_time_fails_the_step_permanently() {
    // K-7: `now + delay_ms` is checked; an overflowing sleep is a bad request, classified as
    // a permanent error (no retry although retries remain), and no wait is stored.
    let world = World::new(1);
    let def = Definition::builder("sleepy")
        .step(
            StepDef::new("a", |_ctx: ActivityContext| async { Ok(StepOutcome::sleep(i64::MAX, json!({"n": 1}))) })
                .max_retry(3),
        )
        .build()
        .unwrap();
    let engine = world.engine("w", vec![def]);
    engine.publisher().start_or_resume(StartRequest::new("sleepy", "b", json!({}))).await.unwrap();
    world.drive(&engine).await.unwrap();
    let inst = world.store.all().pop().unwrap();
    assert_eq!(inst.status, kernel_core::WorkflowStatus::Failed);
    assert_eq!(inst.wait, None, "no wait with a wrapped due time");
    assert_eq!(inst.steps[0].attempt, 1, "a bad request is not retried");
    let err = inst.steps[0].error.clone().unwrap();
    assert_eq!(err.class, kernel_core::ErrorClass::Permanent);
    assert!(err.message.contains("sleep.delay_ms") && err.message.contains("overflows"), "{}", err.message);
}

#[test]
fn a_configured_span_that_could_overflow_is_refused() {
    // `now + lease_ms` must stay representable for any clock reading.
    let world = World::new(1);
    let build = |c: EngineConfig| kernel_core::Engine::builder(world.ports()).config(c).build();
    invalid(build(EngineConfig { lease_ms: DurationMs::MAX, ..EngineConfig::default() }), "lease_ms");
    invalid(
        build(EngineConfig { rebuild_interval_ms: DurationMs::MAX, ..EngineConfig::default() }),
        "rebuild_interval_ms",
    );
}
