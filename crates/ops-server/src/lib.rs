//! # ops-server
//!
//! The web console of the durable workflow kernel: the operator surface ([`ops::Ops`]) over
//! HTTP. Pages are plain HTML, JavaScript and CSS embedded in the binary; the JSON API under
//! `/api/` mirrors the `Ops` methods, every read a GET and every action a POST.
//!
//! Access ([`auth`]): a configured bearer token, a session cookie obtained for a token on the
//! login page, or a configured fronting proxy's user header. Every POST is checked for its
//! origin and, with ambient credentials, for its CSRF token. Refusals: no or bad
//! credentials 401; a bad CSRF token or origin 403; a viewer acting 403 (the operator
//! surface still records the refused action in its audit log); a guard that no longer
//! matches (K-6.4) 409; no such thing 404; bad input 400; a store that does not answer 503.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let ops = ops::Ops::connect("sqlite:/var/lib/app/wf.db", "local", vec![]).await?;
//! let config = ops_server::ServerConfig::from_json(r#"{"tokens":[
//!     {"token":"a-long-random-token","name":"ana","role":"operator","task_roles":["finance"]}]}"#)?;
//! let app = ops_server::router(std::sync::Arc::new(ops), &config)?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await?;
//! # Ok(())
//! # }
//! ```

mod api;
mod assets;
pub mod auth;
pub mod config;

pub use auth::{Principal, Refusal, Via, CSRF_HEADER, SESSION_COOKIE};
pub use config::{ProxyHeaders, ServerConfig, TokenEntry};

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use std::sync::Arc;

/// Most bytes of a request body (a signal payload or a dead letter's output fits).
pub const BODY_BYTES_MAX: usize = 1 << 20;

/// What can go wrong building the server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is wrong.
    #[error("bad configuration: {0}")]
    Config(String),
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The shared state of the handlers.
pub(crate) struct AppState {
    pub ops: Arc<ops::Ops>,
    pub auth: auth::Auth,
}

/// The console's router: pages, assets and the JSON API over `ops`.
///
/// # Errors
/// [`Error::Config`] when `config` does not check.
pub fn router(ops: Arc<ops::Ops>, config: &ServerConfig) -> Result<Router> {
    let state = Arc::new(AppState { ops, auth: auth::Auth::new(config.check()?) });
    Ok(assets::routes()
        .merge(api::routes())
        .with_state(state)
        .layer(axum::extract::DefaultBodyLimit::max(BODY_BYTES_MAX))
        .layer(axum::middleware::map_response(json_errors))
        .layer(axum::middleware::map_response(security_headers)))
}

/// `GET /metrics` in the Prometheus (OpenMetrics) text format: `metrics` as it stands, with
/// the lane gauges (`wfk_lane_depth`, `wfk_lane_oldest_due_seconds`) read from `queue` and,
/// when the process runs one, the observer's queue depth and drops read from `observer` at
/// each scrape. Merge it into a worker's or this server's router; it reads nothing but
/// aggregates whose labels are bounded (never a workflow id), so it needs no session — put
/// it behind the network rules that guard the scrape port.
///
/// ```
/// # use std::sync::Arc;
/// # fn demo(queue: Arc<kernel_core::ports::DynQueue>) {
/// let metrics = Arc::new(kernel_metrics::Metrics::new());
/// // Wrap the worker's ports with `kernel_metrics::metered(ports, &metrics)`, then:
/// let app: axum::Router = ops_server::metrics_router(metrics, queue, Arc::new(kernel_core::ports::SystemClock), None);
/// # let _ = app;
/// # }
/// ```
pub fn metrics_router(
    metrics: Arc<kernel_metrics::Metrics>,
    queue: Arc<kernel_core::ports::DynQueue>,
    clock: Arc<kernel_core::ports::DynClock>,
    observer: Option<observer::Observer>,
) -> Router {
    let scrape = move || {
        let (metrics, queue, clock) = (metrics.clone(), queue.clone(), clock.clone());
        if let Some(o) = &observer {
            metrics.record_observer(&o.stats());
        }
        async move {
            if let Err(e) = kernel_metrics::poll_lanes(&metrics, &*queue, &*clock).await {
                // The other figures are still worth a scrape; the lane gauges keep their last values.
                tracing::debug!(error = %e, "lane gauges not refreshed");
            }
            ([(header::CONTENT_TYPE, kernel_metrics::CONTENT_TYPE)], metrics.render())
        }
    };
    Router::new().route("/metrics", axum::routing::get(scrape))
}

/// Most bytes of a framework refusal's text kept in its JSON error.
const REJECTION_TEXT_MAX: usize = 1_024;

/// Refusals made before a handler runs (a path segment that is not UTF-8, a repeated query
/// key, a wrong method) come from the framework as plain text: turned into the API's
/// `{"error", "message"}` like every other refusal.
async fn json_errors(res: Response) -> Response {
    let status = res.status();
    let is_json = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !status.is_client_error() || is_json {
        return res;
    }
    let kind = match status {
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        StatusCode::UNAUTHORIZED => "unauthenticated",
        StatusCode::FORBIDDEN => "forbidden",
        _ => "bad_input",
    };
    let (parts, body) = res.into_parts();
    let text = match axum::body::to_bytes(body, REJECTION_TEXT_MAX * 4).await {
        Ok(b) => String::from_utf8_lossy(&b).chars().take(REJECTION_TEXT_MAX).collect::<String>(),
        Err(_) => String::new(),
    };
    let message =
        if text.trim().is_empty() { status.canonical_reason().unwrap_or("refused").to_string() } else { text };
    let mut out = ApiError::new(status, kind, message).into_response();
    if let Some(allow) = parts.headers.get(header::ALLOW) {
        out.headers_mut().insert(header::ALLOW, allow.clone());
    }
    out
}

/// Headers on every answer: no framing, no sniffing, no referrer, a strict content policy,
/// and no caching of API answers.
async fn security_headers(mut res: Response) -> Response {
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    h.entry(header::CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
    res
}

/// An API refusal or failure: the status and `{"error": kind, "message": ...}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// `unauthenticated`, `forbidden`, `not_found`, `bad_input`, `refused`, `unavailable`.
    pub kind: &'static str,
    /// For a person.
    pub message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, kind, message: message.into() }
    }

    pub(crate) fn bad_input(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_input", message)
    }
}

impl From<ops::OpsError> for ApiError {
    fn from(e: ops::OpsError) -> Self {
        let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        ApiError::new(status, e.kind(), e.message())
    }
}

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::Unauthenticated(m) => ApiError::new(StatusCode::UNAUTHORIZED, "unauthenticated", m),
            Refusal::Forbidden(m) => ApiError::new(StatusCode::FORBIDDEN, "forbidden", m),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut res =
            (self.status, axum::Json(serde_json::json!({"error": self.kind, "message": self.message}))).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            res.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        res
    }
}
