//! A browser-facing progress stream: an axum server whose `/events` endpoint is a
//! `text/event-stream` an `EventSource` consumes, fed by the streaming `compose` step of a
//! small live-summary workflow running on the engine. The adapters come from `compose`:
//! the store from `--store <url>`, else `WFK_STORE`, else `memory:`; lanes, wakeup, permits
//! and frames from the Redis named by `--queue <url>`, else `WFK_QUEUE`, else `REDIS_URL`,
//! else `redis://127.0.0.1:6379`, under a fresh key prefix deleted at the end (a `mongodb://`
//! store gets a fresh database, dropped at the end).
//!
//! Run: `cargo run -p sse-stream --example sse_server -- --port 8080` and open the page.
//! `--check` makes it a test driver: it exits after the page reports (or after 90 s),
//! prints `browser-sse: frames_before_reconnect=<n> reconnects=<m> final_matches=<bool>
//! unauthorized_refused=<bool>` and exits non-zero unless n ≥ 2, m ≥ 1, the final result
//! equals the stored one and a request without a read grant was refused.
//!
//! The page asks for `drop_after=3`: the server ends a first connection (one without
//! `Last-Event-ID`) after three text frames, so the browser's reconnect is exercised.
//!
//! Stream keys are keyed by the server's secret (`WFK_STREAM_SECRET`, hex, else a random one
//! for this run), and `/events` is authorised: `/start` hands the client a read grant for
//! its stream, and a request without a valid one gets `403`. `--check` also asks for a
//! stream without a grant and reports `unauthorized_refused=<bool>`.

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use compose::{url_from_args, Deployment, QueueOptions, QueueSide, Role, StoreSide};
use kernel_core::domain::DurationMs;
use kernel_core::engine::{Engine, EngineConfig};
use kernel_core::ports::{DynClock, DynStore, StreamKey, SystemClock};
use kernel_core::WorkflowId;
use kernel_core::{ActivityContext, ActivityError, Definition, StartRequest, StepDef, StepOutcome};
use serde::Deserialize;
use serde_json::{json, Value};
use sse_stream::codec::Record;
use sse_stream::event::{SseEvent, DEFAULTS};
use sse_stream::{ForwardConfig, ForwardEvent, Forwarder, ReadGrants, StreamAuthorizer, StreamKeys, StreamSecret};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

const TYPE: &str = "live_summary_stream";
const SUMMARY: &str = "The speaker explained durable workflows: every step is a persisted fact, \
workers can die at any boundary, and a client stream is only a view of the work.";
const CHUNK_DELAY_MS: u64 = 200;

/// The live-summary shape reduced to what the stream needs: `transcribe` records a
/// transcript, `compose` streams the summary in chunks and stores it as its output.
fn definition() -> Definition {
    let transcribe = |_ctx: ActivityContext| async move {
        Ok(StepOutcome::complete(json!({ "transcript": "durable workflows, persisted facts, replaceable workers" })))
    };
    let compose = |ctx: ActivityContext| async move {
        let stream = ctx.stream().ok_or_else(|| ActivityError::permanent("compose must be a streaming step"))?;
        let _ = stream.append(kernel_core::ports::Frame::Control(json!({ "phase": "compose" }))).await;
        let words: Vec<&str> = SUMMARY.split_inclusive(' ').collect();
        for chunk in words.chunks(2) {
            // A failed append never fails the step (K-16): the stream is best effort.
            let _ = stream.text(chunk.concat()).await;
            tokio::time::sleep(Duration::from_millis(CHUNK_DELAY_MS)).await;
        }
        Ok(StepOutcome::complete(json!({ "text": SUMMARY })))
    };
    Definition::builder(TYPE)
        .step(StepDef::new("transcribe", transcribe))
        .step(StepDef::new("compose", compose).timeout_ms(120_000).streaming())
        .build()
        .expect("valid definition")
}

#[derive(Clone)]
struct App {
    engine: Engine,
    store: Arc<DynStore>,
    conn: sse_stream::RedisConn,
    prefix: String,
    secret: StreamSecret,
    /// The `/events` authorisation hook: grants signed with the server's secret.
    grants: ReadGrants,
    started: Arc<AtomicU64>,
    reports: mpsc::Sender<Value>,
}

async fn page() -> Html<&'static str> {
    Html(include_str!("page.html"))
}

async fn start(State(app): State<App>) -> Result<Json<Value>, (StatusCode, String)> {
    let n = app.started.fetch_add(1, Ordering::SeqCst) + 1;
    let object_id = format!("talk-{}-{n}", std::process::id());
    let input = json!({ "object_id": object_id, "fencing_token": "f1" });
    let out = app
        .engine
        .publisher()
        .start_or_resume(StartRequest::new(TYPE, object_id.clone(), input))
        .await
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let key = StreamKey {
        object_id: object_id.as_str().into(),
        workflow_id: out.instance.workflow_id.clone(),
        fencing_token: "f1".into(),
    };
    let access = app.grants.grant(&key);
    Ok(Json(json!({
        "object_id": object_id,
        "workflow_id": out.instance.workflow_id,
        "fencing_token": "f1",
        "access": access,
    })))
}

#[derive(Deserialize)]
struct EventsQuery {
    object: String,
    workflow: String,
    token: String,
    /// The read grant `/start` handed out.
    access: Option<String>,
    drop_after: Option<u64>,
}

fn sse_of(e: &ForwardEvent) -> Event {
    let base = Event::default();
    match e {
        ForwardEvent::Replay { generation } => {
            base.event("replay").data(json!({ "generation": generation }).to_string())
        }
        ForwardEvent::Frame { generation, offset, record } => base
            .event("frame")
            .id(format!("{generation}-{offset}"))
            .data(SseEvent::from_record(record.clone()).to_json()),
        ForwardEvent::Terminal(v) => {
            base.event("terminal").data(SseEvent::from_record(Record::Terminal(v.clone())).to_json())
        }
        ForwardEvent::Final(v) => {
            base.event("final").data(SseEvent::from_record(Record::Terminal(v.clone())).to_json())
        }
    }
}

async fn events(State(app): State<App>, headers: HeaderMap, Query(q): Query<EventsQuery>) -> Response {
    let key = StreamKey { object_id: q.object.into(), workflow_id: q.workflow.into(), fencing_token: q.token.into() };
    // The authorisation hook: no stream is touched for a reader without a grant.
    if let Err(e) = app.grants.authorize(&key, q.access.as_deref()) {
        return (StatusCode::FORBIDDEN, e.to_string()).into_response();
    }
    let keys = StreamKeys::new(&app.prefix, &app.secret, &key);
    let forwarder = Forwarder::new(app.conn.clone(), keys, ForwardConfig::default());
    // Only a first connection is cut short; a reconnect carries Last-Event-ID.
    let drop_after = if headers.contains_key("last-event-id") { None } else { q.drop_after };
    let retry = Event::default().retry(Duration::from_millis(DEFAULTS.retry_ms)).comment("stream");
    let state = (forwarder, 0u64, false);
    let stream = futures::stream::unfold(state, move |(mut f, mut texts, done)| async move {
        if done || drop_after.is_some_and(|n| texts >= n) {
            return None;
        }
        match f.next().await {
            Ok(Some(e)) => {
                if matches!(e, ForwardEvent::Frame { record: Record::Text(_), .. }) {
                    texts += 1;
                }
                let last = matches!(e, ForwardEvent::Terminal(_) | ForwardEvent::Final(_));
                Some((Ok::<_, std::convert::Infallible>(sse_of(&e)), (f, texts, last)))
            }
            Ok(None) => None,
            Err(e) => {
                let err = SseEvent::from_record(Record::Error(json!({ "code": 503, "message": e.to_string() })));
                Some((Ok(Event::default().event("frame").data(err.to_json())), (f, texts, true)))
            }
        }
    });
    let stream = futures::StreamExt::chain(futures::stream::once(async move { Ok(retry) }), stream);
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

/// Ask `/events` on `addr` for a stream without a read grant, over plain HTTP/1.1; true when
/// the server answers `403`.
async fn refuses_without_grant(addr: std::net::SocketAddr) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut tcp) = tokio::net::TcpStream::connect(addr).await else { return false };
    let req = format!(
        "GET /events?object=talk-1&workflow=wf-guess&token=f1 HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    );
    if tcp.write_all(req.as_bytes()).await.is_err() {
        return false;
    }
    let mut head = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut head)).await.ok().and_then(Result::ok);
    n.is_some_and(|n| String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 403"))
}

/// The stored truth the page's final result is compared with (K-1.3).
async fn stored(app: &App, workflow_id: &str) -> Option<Value> {
    let inst = app.store.get(&WorkflowId::from(workflow_id)).await.ok()??;
    Some(json!({
        "status": inst.status.as_str(),
        "revision": inst.revision,
        "text": inst.output.get("compose").and_then(|o| o.get("text")).cloned().unwrap_or(Value::Null),
    }))
}

async fn result(State(app): State<App>, Query(q): Query<HashMap<String, String>>) -> impl IntoResponse {
    match stored(&app, q.get("workflow").map(String::as_str).unwrap_or_default()).await {
        Some(v) => Json(v).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn report(State(app): State<App>, Json(body): Json<Value>) -> StatusCode {
    let _ = app.reports.send(body).await;
    StatusCode::NO_CONTENT
}

/// Compare the page's report with the stored instance.
async fn verdict(app: &App, report: &Value) -> (u64, u64, bool) {
    let n = report["frames_before_reconnect"].as_u64().unwrap_or(0);
    let m = report["reconnects"].as_u64().unwrap_or(0);
    let wf = report["workflow_id"].as_str().unwrap_or_default();
    let matches = match stored(app, wf).await {
        Some(s) => {
            let summary_ok = report["final"]["status"] == s["status"] && report["final"]["revision"] == s["revision"];
            // A client that followed the generation to its terminal frame also holds the text.
            let text_ok = report["kind"] != "terminal" || report["text"] == s["text"];
            summary_ok && text_ok && s["status"] == "completed"
        }
        None => false,
    };
    (n, m, matches)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let port: u16 =
        args.iter().position(|a| a == "--port").and_then(|i| args.get(i + 1)).map_or(Ok(0), |p| p.parse())?;
    let check = args.iter().any(|a| a == "--check");

    let env = |k: &str| std::env::var(k).ok();
    let (store_url, rest) = url_from_args(Role::Store, args.iter().skip(1).cloned(), env, &[])?;
    let (queue_url, _) = url_from_args(Role::Queue, rest, env, &["REDIS_URL"])?;
    let store_url = store_url.unwrap_or_else(|| "memory:".into());
    let queue_url = queue_url.unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let deployment = Deployment {
        store: StoreSide::connect_scratch(&store_url, "sse_demo").await?,
        queue: QueueSide::connect_scratch(&queue_url, &QueueOptions::default(), "sse-demo").await?,
    };
    let clock: Arc<DynClock> = Arc::new(SystemClock);
    let secret = match std::env::var("WFK_STREAM_SECRET") {
        Ok(hex) => StreamSecret::from_hex(&hex)?,
        Err(_) => StreamSecret::new(rand::random::<[u8; 32]>())?,
    };
    let sink = deployment.queue.stream_sink(clock.clone(), secret.clone())?;
    let conn = deployment.queue.redis_connection()?.connection().clone();
    let prefix = deployment.queue.key_prefix().unwrap_or_default().to_string();
    let ports = deployment.ports().clock(clock).stream(Arc::new(sink.clone())).build()?;
    let config = EngineConfig {
        worker_id: "demo".into(),
        poll_interval_ms: DurationMs::from_millis(100),
        ..EngineConfig::default()
    };
    let engine = Engine::builder(ports).config(config).register(definition()).build()?;
    let running = engine.spawn();

    let (tx, mut rx) = mpsc::channel(4);
    let store = deployment.store.store.clone();
    let grants = ReadGrants::new(secret.clone());
    let app = App { engine, store, conn, prefix, secret, grants, started: Arc::new(AtomicU64::new(0)), reports: tx };
    let router = Router::new()
        .route("/", get(page))
        .route("/start", post(start))
        .route("/events", get(events))
        .route("/result", get(result))
        .route("/report", post(report))
        .with_state(app.clone());
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}/");
    let server = tokio::spawn(async move { axum::serve(listener, router).await });

    let code = if check {
        match tokio::time::timeout(Duration::from_secs(90), rx.recv()).await {
            Ok(Some(report)) => {
                for line in report["log"].as_array().into_iter().flatten() {
                    eprintln!("page: {}", line.as_str().unwrap_or_default());
                }
                let (n, m, ok) = verdict(&app, &report).await;
                let refused = refuses_without_grant(addr).await;
                println!(
                    "browser-sse: frames_before_reconnect={n} reconnects={m} final_matches={ok} unauthorized_refused={refused}"
                );
                i32::from(!(n >= 2 && m >= 1 && ok && refused))
            }
            _ => {
                println!("browser-sse: no report from the page within 90 s");
                1
            }
        }
    } else {
        tokio::signal::ctrl_c().await?;
        0
    };
    server.abort();
    running.shutdown().await;
    sink.flush_all().await.ok();
    deployment.destroy().await?;
    std::process::exit(code);
}
