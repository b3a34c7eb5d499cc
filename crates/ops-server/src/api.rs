//! The JSON API: one route per `Ops` method, reads as GET and actions as POST.

use crate::auth::{Principal, Refusal, Via, SESSION_COOKIE};
use crate::{ApiError, AppState};
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use kernel_core::ports::{DeadLetterAction, DeadLetterStatus, TaskOutcome};
use kernel_core::WorkflowStatus;
use ops::{Done, ListFilter, OpsError, Role};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

type St = State<Arc<AppState>>;
type ApiResult<T> = Result<T, ApiError>;

/// Rows of a dead-letter or task page when the request names no limit.
pub const PAGE_LIMIT_DEFAULT: usize = 50;

pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/api/login", post(login))
        .route("/api/logout", post(logout))
        .route("/api/session", get(session))
        .route("/api/instances", get(list))
        .route("/api/instances/{id}", get(show))
        .route("/api/instances/{id}/signal", post(signal))
        .route("/api/instances/{id}/cancel", post(cancel))
        .route("/api/instances/{id}/replay", post(replay))
        .route("/api/instances/{id}/regenerate", post(regenerate))
        .route("/api/objects/{object_id}/retry-failed", post(retry_failed))
        .route("/api/dead-letters", get(dead_letters))
        .route("/api/dead-letters/{id}", get(dead_letter))
        .route("/api/dead-letters/{id}/decide", post(decide_dead_letter))
        .route("/api/tasks", get(tasks))
        .route("/api/tasks/{id}", get(task))
        .route("/api/tasks/{id}/decide", post(decide_task))
        .route("/api/lanes", get(lanes))
        .route("/api/lanes/rebuild", post(rebuild))
        .route("/api/permits", get(permits))
        .route("/api/permits/{resource}/limits", post(set_permit_limits))
        .route("/api/audit", get(audit))
        .fallback(not_found)
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

/// Every API handler but login takes the authenticated caller: the extractor refuses with
/// 401 or 403 (and records the refusal) before the handler runs.
impl FromRequestParts<Arc<AppState>> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, Self::Rejection> {
        match state.auth.authenticate(&parts.method, &parts.headers) {
            Ok(p) => Ok(p),
            Err(r) => {
                // Who it was, when the credentials were good and the CSRF token or the
                // origin was not.
                let who = state.auth.identify(&parts.headers).ok();
                record_refusal(state, who.as_ref(), &parts.method, parts.uri.path(), &r).await;
                Err(r.into())
            }
        }
    }
}

/// Write a refused request to the operator audit log: who it was (when the credentials were
/// good), the action (a POST's last path segment, `read` for a GET), the path as the target,
/// and why (`401: ...`, `403: ...`).
async fn record_refusal(state: &AppState, who: Option<&Principal>, method: &Method, path: &str, why: &Refusal) {
    let (status, message) = match why {
        Refusal::Unauthenticated(m) => (401, m),
        Refusal::Forbidden(m) => (403, m),
    };
    let action = if method == Method::GET || method == Method::HEAD {
        "read".to_string()
    } else {
        format!("http-{}", path.rsplit('/').next().unwrap_or("post"))
    };
    let target = path.strip_prefix("/api/").unwrap_or(path);
    let (name, role) = match who {
        Some(p) => (p.actor.name.as_str(), p.actor.role.as_str()),
        None => ("anonymous", "none"),
    };
    tracing::warn!(actor = name, %method, path, status, message = %message, "refused");
    // A read refused to nobody in particular (no or bad credentials) is only logged: anyone
    // who reaches the port could otherwise turn requests into audit rows without bound. Every
    // refused action, and every refusal of someone whose credentials were good, is audited.
    let anonymous_read = who.is_none() && (method == Method::GET || method == Method::HEAD);
    if !anonymous_read {
        state.ops.audit_refusal(name, role, &action, target, &format!("{status}: {message}")).await;
    }
}

fn body<T: DeserializeOwned>(b: Result<Json<T>, JsonRejection>) -> ApiResult<T> {
    b.map(|Json(v)| v).map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", e.body_text()),
        _ => ApiError::bad_input(e.body_text()),
    })
}

/// An action's answer: a viewer's refusal (the surface refuses and records it) is 403;
/// every other failure keeps its own status (409 for a guard that no longer matches).
fn acted(p: &Principal, r: Result<Done, OpsError>) -> ApiResult<Json<Done>> {
    match r {
        Ok(d) => Ok(Json(d)),
        Err(e) if p.actor.role == Role::Viewer => Err(ApiError::new(StatusCode::FORBIDDEN, "forbidden", e.message())),
        Err(e) => Err(e.into()),
    }
}

fn opt(s: &Option<String>) -> Option<String> {
    s.as_ref().map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

fn limit_of(s: &Option<String>) -> ApiResult<usize> {
    match opt(s) {
        None => Ok(0),
        Some(v) => v.parse().map_err(|_| ApiError::bad_input(format!("limit `{v}` is not a number"))),
    }
}

fn enum_of<T: DeserializeOwned>(what: &str, s: &str) -> ApiResult<T> {
    serde_json::from_value(Value::String(s.to_string()))
        .map_err(|_| ApiError::bad_input(format!("{what} `{s}` is unknown")))
}

// ---- session ---------------------------------------------------------------------------

#[derive(Deserialize)]
struct LoginBody {
    token: String,
}

async fn login(State(st): St, headers: HeaderMap, b: Result<Json<LoginBody>, JsonRejection>) -> ApiResult<Response> {
    if let Err(r) = st.auth.check_origin(&headers) {
        record_refusal(&st, None, &Method::POST, "/api/login", &r).await;
        return Err(r.into());
    }
    let b = body(b)?;
    let Some(actor) = st.auth.token_actor(b.token.trim()) else {
        let r = Refusal::Unauthenticated("unknown token".into());
        record_refusal(&st, None, &Method::POST, "/api/login", &r).await;
        return Err(r.into());
    };
    let id = st
        .auth
        .open_session(actor.clone())
        .map_err(|m| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", m))?;
    let p = Principal { actor, via: Via::Session(id.clone()) };
    let cookie = format!(
        "{SESSION_COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{}",
        st.auth.session_ttl_s(),
        if st.auth.secure_cookie() { "; Secure" } else { "" }
    );
    let mut res = Json(session_json(&st, &p)).into_response();
    res.headers_mut().insert(header::SET_COOKIE, HeaderValue::from_str(&cookie).expect("cookie is ASCII"));
    Ok(res)
}

async fn logout(State(st): St, p: Principal) -> Response {
    if let Via::Session(id) = &p.via {
        st.auth.close_session(id);
    }
    let cookie = format!("{SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    let mut res = Json(json!({"logged_out": true})).into_response();
    res.headers_mut().insert(header::SET_COOKIE, HeaderValue::from_str(&cookie).expect("cookie is ASCII"));
    res
}

fn session_json(st: &AppState, p: &Principal) -> Value {
    json!({
        "name": p.actor.name,
        "role": p.actor.role,
        "task_roles": p.actor.task_roles,
        "via": p.via.as_str(),
        "csrf_token": st.auth.csrf_token(p),
    })
}

async fn session(State(st): St, p: Principal) -> Json<Value> {
    Json(session_json(&st, &p))
}

// ---- instances ---------------------------------------------------------------------------

#[derive(Deserialize)]
struct ListParams {
    #[serde(rename = "type")]
    workflow_type: Option<String>,
    status: Option<String>,
    biz_key_prefix: Option<String>,
    waiting_on: Option<String>,
    cursor: Option<String>,
    limit: Option<String>,
}

async fn list(
    State(st): St,
    _p: Principal,
    Query(q): Query<ListParams>,
) -> ApiResult<Json<ops::Page<observer::Snapshot>>> {
    let status = match opt(&q.status) {
        Some(s) => Some(enum_of::<WorkflowStatus>("status", &s)?),
        None => None,
    };
    let filter = ListFilter {
        workflow_type: opt(&q.workflow_type),
        status,
        biz_key_prefix: opt(&q.biz_key_prefix),
        failed_since: None,
        waiting_on_signal: opt(&q.waiting_on),
        cursor: opt(&q.cursor),
        limit: limit_of(&q.limit)?,
    };
    Ok(Json(st.ops.list(&filter).await?))
}

async fn show(State(st): St, _p: Principal, Path(id): Path<String>) -> ApiResult<Json<ops::InstanceView>> {
    Ok(Json(st.ops.show(&id).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SignalBody {
    signal_type: String,
    /// Default: the current wait's.
    #[serde(default)]
    wait_key: Option<String>,
    /// Default: the current wait's, else 0.
    #[serde(default)]
    generation: Option<u64>,
    /// Default: a fresh one.
    #[serde(default)]
    signal_id: Option<String>,
}

async fn signal(
    State(st): St,
    p: Principal,
    Path(id): Path<String>,
    b: Result<Json<SignalBody>, JsonRejection>,
) -> ApiResult<Json<Done>> {
    let b = body(b)?;
    let args = ops::SignalArgs {
        signal_type: b.signal_type,
        wait_key: b.wait_key,
        generation: b.generation,
        signal_id: b.signal_id,
    };
    acted(&p, st.ops.signal(&p.actor, &id, &args).await)
}

async fn cancel(State(st): St, p: Principal, Path(id): Path<String>) -> ApiResult<Json<Done>> {
    acted(&p, st.ops.cancel(&p.actor, &id).await)
}

async fn replay(State(st): St, p: Principal, Path(id): Path<String>) -> ApiResult<Json<Done>> {
    acted(&p, st.ops.replay(&p.actor, &id).await)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegenerateBody {
    step: String,
}

async fn regenerate(
    State(st): St,
    p: Principal,
    Path(id): Path<String>,
    b: Result<Json<RegenerateBody>, JsonRejection>,
) -> ApiResult<Json<Done>> {
    let b = body(b)?;
    acted(&p, st.ops.regenerate(&p.actor, &id, &b.step).await)
}

async fn retry_failed(State(st): St, p: Principal, Path(object_id): Path<String>) -> ApiResult<Json<Done>> {
    acted(&p, st.ops.retry_failed(&p.actor, &object_id).await)
}

// ---- dead letters ------------------------------------------------------------------------

#[derive(Deserialize)]
struct PageParams {
    status: Option<String>,
    after: Option<String>,
    limit: Option<String>,
}

fn page_limit(q: &PageParams) -> ApiResult<usize> {
    Ok(match limit_of(&q.limit)? {
        0 => PAGE_LIMIT_DEFAULT,
        n => n,
    })
}

/// A page of rows ordered by id and the `after` of the next page (`None` on a short page).
fn id_page<T: serde::Serialize>(items: Vec<T>, limit: usize, id: impl Fn(&T) -> String) -> Value {
    let next = if items.len() == limit { items.last().map(&id) } else { None };
    json!({"items": items, "next": next})
}

async fn dead_letters(State(st): St, _p: Principal, Query(q): Query<PageParams>) -> ApiResult<Json<Value>> {
    let status = match opt(&q.status) {
        Some(s) => Some(enum_of::<DeadLetterStatus>("status", &s)?),
        None => None,
    };
    let limit = page_limit(&q)?;
    let items = st.ops.dead_letters(status, opt(&q.after).as_deref(), limit).await?;
    Ok(Json(id_page(items, limit, |d| d.id.clone())))
}

async fn dead_letter(
    State(st): St,
    _p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<kernel_core::ports::DeadLetter>> {
    Ok(Json(st.ops.dead_letter(&id).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeadLetterBody {
    /// `retry`, `complete` (with `output`) or `fail`.
    action: String,
    #[serde(default)]
    output: Option<Value>,
    #[serde(default)]
    reason: Option<String>,
}

async fn decide_dead_letter(
    State(st): St,
    p: Principal,
    Path(id): Path<String>,
    b: Result<Json<DeadLetterBody>, JsonRejection>,
) -> ApiResult<Json<Done>> {
    let b = body(b)?;
    let action = match (b.action.as_str(), b.output) {
        ("retry", None) => DeadLetterAction::Retry,
        ("fail", None) => DeadLetterAction::Fail,
        ("complete", Some(output)) => DeadLetterAction::Complete { output },
        ("complete", None) => return Err(ApiError::bad_input("complete needs an `output`")),
        ("retry" | "fail", Some(_)) => return Err(ApiError::bad_input("only complete takes an `output`")),
        (other, _) => return Err(ApiError::bad_input(format!("action `{other}`: retry, complete or fail"))),
    };
    acted(&p, st.ops.decide_dead_letter(&p.actor, &id, action, b.reason.as_deref()).await)
}

// ---- human tasks -------------------------------------------------------------------------

async fn tasks(State(st): St, p: Principal, Query(q): Query<PageParams>) -> ApiResult<Json<Value>> {
    let limit = page_limit(&q)?;
    // The desk's own cursor: a page thinned by closed or ruled-out tasks still has a next.
    let page = st.ops.tasks(&p.actor, opt(&q.after).as_deref(), limit).await?;
    Ok(Json(json!({"items": page.items, "next": page.next})))
}

async fn task(State(st): St, p: Principal, Path(id): Path<String>) -> ApiResult<Json<kernel_core::ports::TaskRecord>> {
    Ok(Json(st.ops.task(&p.actor, &id).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskBody {
    /// `approve`, `reject`, `escalate` or `cancel`.
    outcome: String,
    #[serde(default)]
    reason: Option<String>,
}

async fn decide_task(
    State(st): St,
    p: Principal,
    Path(id): Path<String>,
    b: Result<Json<TaskBody>, JsonRejection>,
) -> ApiResult<Json<Done>> {
    let b = body(b)?;
    let outcome: TaskOutcome = enum_of("outcome", &b.outcome)?;
    acted(&p, st.ops.decide_task(&p.actor, &id, outcome, b.reason.as_deref()).await)
}

// ---- lanes and permits -------------------------------------------------------------------

async fn lanes(State(st): St, _p: Principal) -> ApiResult<Json<Vec<ops::LaneView>>> {
    Ok(Json(st.ops.lanes().await?))
}

async fn rebuild(State(st): St, p: Principal) -> ApiResult<Json<Done>> {
    acted(&p, st.ops.rebuild(&p.actor, &|_| {}).await)
}

async fn permits(State(st): St, _p: Principal) -> ApiResult<Json<Vec<ops::PermitView>>> {
    Ok(Json(st.ops.permits().await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsBody {
    /// Holders at once (0 = unlimited).
    max_concurrency: u32,
    /// Starts per second (0 = unlimited).
    max_starts_per_second: u32,
}

async fn set_permit_limits(
    State(st): St,
    p: Principal,
    Path(resource): Path<String>,
    b: Result<Json<LimitsBody>, JsonRejection>,
) -> ApiResult<Json<Done>> {
    let b = body(b)?;
    let limits = kernel_core::ports::PermitLimits {
        max_concurrency: b.max_concurrency,
        max_starts_per_second: b.max_starts_per_second,
    };
    acted(&p, st.ops.set_permit_limits(&p.actor, &resource, limits).await)
}

// ---- audit -------------------------------------------------------------------------------

#[derive(Deserialize)]
struct AuditParams {
    actor: Option<String>,
    action: Option<String>,
    limit: Option<String>,
}

async fn audit(State(st): St, _p: Principal, Query(q): Query<AuditParams>) -> ApiResult<Json<Value>> {
    let limit = match limit_of(&q.limit)? {
        0 => PAGE_LIMIT_DEFAULT,
        n => n,
    };
    let items = st.ops.audit(opt(&q.actor).as_deref(), opt(&q.action).as_deref(), limit).await?;
    Ok(Json(json!({ "items": items })))
}
