//! Tracing spans of a claim and of each step invocation, and the creating request's trace
//! context handed to every activity (K-6, K-7.3).
//!
//! A test binary of its own with the capturing layer as the process-wide subscriber: a
//! thread-local (`set_default`) subscriber in a binary whose other tests emit the same spans
//! concurrently without one lets `tracing` cache a callsite as never interesting, and spans
//! went missing at random. Captured spans are told apart by their workflow id.

use kernel_core::definition::RetryPolicy;
use kernel_core::trace::TraceParent;
use kernel_core::{ActivityContext, ActivityError, Definition, StartRequest, StepDef, StepOutcome, WorkflowStatus};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use testkit::harness::World;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;

const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// One span as opened: its name and every field recorded on it.
#[derive(Debug, Clone)]
struct Captured {
    name: String,
    fields: BTreeMap<String, String>,
}

/// Every span opened in the process, with whether it has closed.
#[derive(Default)]
struct Capture {
    spans: Mutex<Vec<(Captured, bool)>>,
    open: Mutex<HashMap<u64, usize>>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_string(), format!("{value:?}"));
    }
}

#[derive(Clone)]
struct Layered(&'static Capture);

impl<S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>> Layer<S> for Layered {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        // One lock at a time (the close takes them in the other order).
        let index = {
            let mut spans = self.0.spans.lock().unwrap();
            spans.push((Captured { name: attrs.metadata().name().to_string(), fields }, false));
            spans.len() - 1
        };
        self.0.open.lock().unwrap().insert(id.into_u64(), index);
    }
    fn on_record(&self, _id: &Id, _values: &Record<'_>, _ctx: Context<'_, S>) {}
    fn on_close(&self, id: Id, _ctx: Context<'_, S>) {
        let index = self.0.open.lock().unwrap().remove(&id.into_u64());
        if let Some(i) = index {
            self.0.spans.lock().unwrap()[i].1 = true;
        }
    }
}

/// The process-wide capture, installed once.
fn capture() -> &'static Capture {
    static CAPTURE: OnceLock<&'static Capture> = OnceLock::new();
    CAPTURE.get_or_init(|| {
        let c: &'static Capture = Box::leak(Box::default());
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Layered(c)))
            .expect("the only subscriber of this test binary");
        c
    })
}

impl Capture {
    /// The spans named `name` of workflow `wf`, and how many of them closed.
    fn named(&self, name: &str, wf: &str) -> (Vec<Captured>, usize) {
        let spans = self.spans.lock().unwrap();
        let mine: Vec<&(Captured, bool)> = spans
            .iter()
            .filter(|(c, _)| c.name == name && c.fields.get("workflow.id").map(String::as_str) == Some(wf))
            .collect();
        (mine.iter().map(|(c, _)| c.clone()).collect(), mine.iter().filter(|(_, closed)| *closed).count())
    }
}

/// What each activity saw: its step and its trace context.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// `t`: step `a` fails once retryably, then completes; step `b` completes. Every activity
/// reports the trace context it was handed.
fn definition(seen: Seen) -> Definition {
    let (sa, sb) = (seen.clone(), seen);
    Definition::builder("t")
        .step(
            StepDef::new("a", move |c: ActivityContext| {
                let seen = sa.clone();
                async move {
                    seen.lock().unwrap().push(("a".into(), c.trace_parent().map(str::to_string)));
                    if c.attempt() == 1 {
                        return Err(ActivityError::transient("503"));
                    }
                    Ok(StepOutcome::complete(json!(1)))
                }
            })
            .retry(RetryPolicy::Immediate)
            .max_retry(1),
        )
        .step(StepDef::new("b", move |c: ActivityContext| {
            let seen = sb.clone();
            async move {
                seen.lock().unwrap().push(("b".into(), c.trace_parent().map(str::to_string)));
                Ok(StepOutcome::complete(json!(2)))
            }
        }))
        .build()
        .unwrap()
}

/// A span per claim (`workflow.claim`) and per step invocation (`workflow.step`), with
/// OpenTelemetry's `otel.name`/`otel.kind` and the `workflow.*` fields; the claim token
/// appears only as its last six characters.
#[tokio::test]
async fn claims_and_steps_open_spans_with_their_fields() {
    let capture = capture();
    let world = World::new(21);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let engine = world.engine("A", vec![definition(seen)]);
    let req = StartRequest::new("t", "biz-1", json!({}))
        .workflow_id("wf-spans")
        .trace_parent(TraceParent::parse(TP).unwrap());
    engine.publisher().start_or_resume(req).await.unwrap();
    let report = world.drive(&engine).await.unwrap();
    assert_eq!(world.instance("wf-spans").await.unwrap().status, WorkflowStatus::Completed);

    let (claims, claims_closed) = capture.named("workflow.claim", "wf-spans");
    assert_eq!(claims.len(), report.claims(), "one span per claim: {claims:?}");
    for c in &claims {
        let f = &c.fields;
        assert_eq!(f.get("otel.name").map(String::as_str), Some("claim t"), "{f:?}");
        assert_eq!(f.get("otel.kind").map(String::as_str), Some("consumer"));
        assert_eq!(f.get("workflow.type").map(String::as_str), Some("t"));
        assert_eq!(f.get("workflow.trace_parent").map(String::as_str), Some(TP));
        let claim = f.get("workflow.claim").expect("claim suffix");
        assert!(!claim.is_empty() && claim.chars().count() <= 6, "{claim}");
    }
    let (steps, steps_closed) = capture.named("workflow.step", "wf-spans");
    // a (fails), a (retry succeeds), b.
    let names: Vec<(&str, &str)> =
        steps.iter().map(|s| (s.fields["workflow.step"].as_str(), s.fields["workflow.attempt"].as_str())).collect();
    assert_eq!(names, [("a", "1"), ("a", "2"), ("b", "1")]);
    for s in &steps {
        let f = &s.fields;
        assert_eq!(f.get("otel.name"), Some(&format!("step {}", f["workflow.step"])));
        assert_eq!(f.get("otel.kind").map(String::as_str), Some("internal"));
        assert_eq!(f.get("workflow.type").map(String::as_str), Some("t"));
        assert!(f.get("workflow.claim").is_some_and(|c| c.chars().count() <= 6), "{f:?}");
    }
    // Every span is closed once its claim ended (an exporter sends a span at its close):
    // the heartbeat driver, which outlives the first claim, is not inside it.
    assert_eq!(claims_closed, claims.len());
    assert_eq!(steps_closed, steps.len());
    // The step spans of one claim carry that claim's suffix.
    let claim_suffixes: Vec<&String> = claims.iter().map(|c| &c.fields["workflow.claim"]).collect();
    assert!(steps.iter().all(|s| claim_suffixes.contains(&&s.fields["workflow.claim"])));
}

/// The trace context is written by the create only: every activity of the run sees it, a
/// later request with another context changes nothing, and a replay keeps it.
#[tokio::test]
async fn the_trace_context_reaches_every_activity_and_is_written_only_by_the_create() {
    let world = World::new(22);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let engine = world.engine("A", vec![definition(seen.clone())]);
    let tp = TraceParent::parse(TP).unwrap();
    let req = StartRequest::new("t", "biz-1", json!({})).workflow_id("wf-1").trace_parent(tp.clone());
    engine.publisher().start_or_resume(req).await.unwrap();
    world.drive(&engine).await.unwrap();
    let got = seen.lock().unwrap().clone();
    assert_eq!(got.len(), 3);
    assert!(got.iter().all(|(_, t)| t.as_deref() == Some(TP)), "{got:?}");
    let other = TraceParent::parse("00-11111111111111111111111111111111-2222222222222222-00").unwrap();
    let again = StartRequest::new("t", "biz-1", json!({})).trace_parent(other);
    let out = engine.publisher().start_or_resume(again).await.unwrap();
    assert_eq!(out.instance.trace_parent.as_deref(), Some(TP), "an existing instance keeps its context");

    // A workflow without a context hands none to its activities.
    seen.lock().unwrap().clear();
    engine.publisher().start_or_resume(StartRequest::new("t", "biz-2", json!({})).workflow_id("wf-2")).await.unwrap();
    world.drive(&engine).await.unwrap();
    assert!(seen.lock().unwrap().iter().all(|(_, t)| t.is_none()));
    assert_eq!(world.instance("wf-2").await.unwrap().trace_parent, None);
}

/// A replayed failed workflow keeps the context of the request that created it.
#[tokio::test]
async fn a_replay_keeps_the_trace_context() {
    let world = World::new(23);
    let fail = Definition::builder("t")
        .step(StepDef::new("a", |c: ActivityContext| async move {
            if c.input()["ok"] == json!(true) {
                Ok(StepOutcome::complete(json!(c.trace_parent())))
            } else {
                Err(ActivityError::permanent("no"))
            }
        }))
        .build()
        .unwrap();
    let engine = world.engine("A", vec![fail]);
    let req = StartRequest::new("t", "biz-1", json!({"ok": false}))
        .workflow_id("wf-1")
        .trace_parent(TraceParent::parse(TP).unwrap());
    engine.publisher().start_or_resume(req).await.unwrap();
    world.drive(&engine).await.unwrap();
    assert_eq!(world.instance("wf-1").await.unwrap().status, WorkflowStatus::Failed);
    let replay = StartRequest::new("t", "biz-1", json!({"ok": true}));
    let out = engine.publisher().start_or_resume(replay).await.unwrap();
    assert!(out.execution_activated, "replayed");
    world.drive(&engine).await.unwrap();
    let inst = world.instance("wf-1").await.unwrap();
    assert_eq!((inst.status, inst.retry_count), (WorkflowStatus::Completed, 1));
    assert_eq!(inst.trace_parent.as_deref(), Some(TP));
    assert_eq!(inst.output["a"], json!(TP), "the replayed activity saw the creating request's context");
}
