//! One workflow in memory, traced with OpenTelemetry to standard output and logged as JSON.
//!
//! The start request carries the caller's W3C `traceparent`; the kernel stores it with the
//! instance and hands it to every activity (`ActivityContext::trace_parent`), whose own
//! span joins the caller's trace through the W3C propagator. The kernel's `workflow.claim`
//! and `workflow.step` spans are exported too, with their `otel.name`/`otel.kind`.
//!
//! ```text
//! cargo run -p kernel-metrics --example otel_stdout
//! ```
//!
//! No collector is needed: `opentelemetry-stdout` prints each finished span, and
//! `tracing-subscriber`'s JSON formatter prints each log line with its spans.

use kernel_core::trace::TraceParent;
use kernel_core::{ActivityContext, Definition, StartRequest, StepDef, StepOutcome, WorkflowStatus};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::prelude::*;

/// The caller's trace context, as an HTTP front door would receive it.
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// The activity: its span's parent is the request's trace context; it reports the trace
/// id it ran under.
fn charge(seen: Arc<Mutex<Option<String>>>) -> StepDef {
    StepDef::new("charge", move |ctx: ActivityContext| {
        let seen = seen.clone();
        async move {
            let span = tracing::info_span!("payment.charge", otel.kind = "client", step = ctx.step_name());
            if let Some(tp) = ctx.trace_parent() {
                let carrier = HashMap::from([("traceparent".to_string(), tp.to_string())]);
                let parent = TraceContextPropagator::new().extract(&carrier);
                // Refused only for a span already started, which this one is not.
                let _ = span.set_parent(parent);
            }
            let trace_id = span.context().span().span_context().trace_id().to_string();
            async move {
                tracing::info!(amount_cents = 1250, "charging");
                *seen.lock().expect("lock") = Some(trace_id);
                Ok(StepOutcome::complete(json!({ "charged": 1250 })))
            }
            .instrument(span)
            .await
        }
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let provider =
        SdkTracerProvider::builder().with_simple_exporter(opentelemetry_stdout::SpanExporter::default()).build();
    let tracer = provider.tracer("durable-workflow-kernel");
    tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(tracer))
        .with(tracing_subscriber::fmt::layer().json().with_current_span(true).with_span_list(false))
        .init();

    let seen = Arc::new(Mutex::new(None));
    let def = Definition::builder("payment").step(charge(seen.clone())).build()?;
    let world = testkit::harness::World::new(1);
    let engine = world.engine("worker-1", vec![def]);
    let req = StartRequest::new("payment", "order-1", json!({ "order": 1 }))
        .workflow_id("wf-order-1")
        .trace_parent(TraceParent::parse(TRACEPARENT)?);
    engine.publisher().start_or_resume(req).await?;
    world.drive(&engine).await?;

    let inst = world.instance("wf-order-1").await.ok_or("instance missing")?;
    let expected = TraceParent::parse(TRACEPARENT)?;
    let got = seen.lock().expect("lock").clone().ok_or("the activity did not run")?;
    tracing::info!(status = inst.status.as_str(), trace_id = %got, "workflow finished");
    provider.shutdown()?;
    if inst.status != WorkflowStatus::Completed || got != expected.trace_id() {
        return Err(format!(
            "expected a completed workflow in trace {}, got {:?} in {got}",
            expected.trace_id(),
            inst.status
        )
        .into());
    }
    Ok(())
}
