//! Who may call: bearer tokens, sessions, the fronting proxy; CSRF and origin checks; every
//! refusal written to the audit log.

use crate::rig::*;
use axum::http::{Method, StatusCode};
use kernel_core::WorkflowStatus;
use serde_json::json;

#[tokio::test]
async fn no_credentials_is_401_and_only_refused_actions_are_audited() {
    let rig = Rig::new().await;
    // Anonymous reads are refused and only logged: 300 of them write no audit row (anyone
    // who reaches the port could otherwise grow the audit log without bound).
    for _ in 0..300 {
        let (s, v) = rig.call(Method::GET, "/api/instances", &[], None).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
        assert_eq!(v["error"], "unauthenticated");
    }
    assert!(rig.audit("read").await.is_empty());
    // An anonymous action is audited.
    let wf = rig.start("waiter", "anon").await;
    rig.settle().await;
    let (s, _) = rig.call(Method::POST, &format!("/api/instances/{wf}/cancel"), &[], Some(json!({}))).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let refused = rig.audit("http-cancel").await;
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!((refused[0]["actor"].as_str(), refused[0]["result"].as_str()), (Some("anonymous"), Some("refused")));
    assert!(refused[0]["reason"].as_str().unwrap().starts_with("401"), "{refused:?}");
}

#[tokio::test]
async fn a_bad_bearer_token_is_401_does_nothing_and_is_audited() {
    let rig = Rig::new().await;
    let wf = rig.start("waiter", "bad-token").await;
    rig.settle().await;
    let (s, _) = rig.post("not-a-configured-token", &format!("/api/instances/{wf}/cancel"), json!({})).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _) = rig.call(Method::GET, "/api/instances", &[("authorization", "Basic YTpi")], None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "only Bearer is accepted");
    assert_eq!(rig.status(&wf).await, WorkflowStatus::Waiting);
    let refused = rig.audit("http-cancel").await;
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0]["target"], format!("instances/{wf}/cancel"));
}

#[tokio::test]
async fn a_login_sets_a_strict_http_only_cookie_and_a_bad_login_is_401() {
    let rig = Rig::new().await;
    let (s, _) = rig
        .call(Method::POST, "/api/login", &[("origin", &format!("http://{HOST}"))], Some(json!({"token": "wrong"})))
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(rig.audit("http-login").await.len(), 1);
    let session = rig.login(OPERATOR).await;
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(session.set_cookie.contains(attr), "{}", session.set_cookie);
    }
    assert!(!session.set_cookie.contains(OPERATOR), "the cookie is a session id, not the token");
    let (s, v) = session.get(&rig, "/api/session").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        (v["name"].as_str(), v["role"].as_str(), v["via"].as_str()),
        (Some("ana"), Some("operator"), Some("session"))
    );
    assert_eq!(v["csrf_token"], session.csrf.as_str());
    // A login from another site is refused before the token is looked at.
    let (s, _) = rig
        .call(Method::POST, "/api/login", &[("origin", "http://evil.example")], Some(json!({"token": OPERATOR})))
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn a_session_post_without_the_csrf_token_is_403_and_does_nothing() {
    let rig = Rig::new().await;
    let wf = rig.start("waiter", "csrf").await;
    rig.settle().await;
    let session = rig.login(OPERATOR).await;
    let origin = format!("http://{HOST}");
    let path = format!("/api/instances/{wf}/cancel");
    let (s, v) =
        rig.call(Method::POST, &path, &[("cookie", &session.cookie), ("origin", &origin)], Some(json!({}))).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert!(v["message"].as_str().unwrap().contains("X-CSRF-Token"), "{v}");
    let wrong = "0".repeat(64);
    let (s, _) = rig
        .call(
            Method::POST,
            &path,
            &[("cookie", &session.cookie), ("origin", &origin), ("x-csrf-token", &wrong)],
            Some(json!({})),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // Another session's token does not fit this session.
    let other = rig.login(OPERATOR).await;
    let (s, _) = rig
        .call(
            Method::POST,
            &path,
            &[("cookie", &session.cookie), ("origin", &origin), ("x-csrf-token", &other.csrf)],
            Some(json!({})),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(rig.status(&wf).await, WorkflowStatus::Waiting);
    let refused = rig.audit("http-cancel").await;
    assert_eq!(refused.len(), 3, "{refused:?}");
    assert!(
        refused.iter().all(|e| e["actor"] == "ana" && e["reason"].as_str().unwrap().starts_with("403")),
        "{refused:?}"
    );
    // With the token it goes through.
    let (s, v) = session.post(&rig, &path, json!({})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(rig.status(&wf).await, WorkflowStatus::Canceled);
}

#[tokio::test]
async fn a_cross_site_post_is_403_even_with_the_csrf_token() {
    let rig = Rig::new().await;
    let wf = rig.start("waiter", "cross").await;
    rig.settle().await;
    let session = rig.login(OPERATOR).await;
    let path = format!("/api/instances/{wf}/cancel");
    for headers in [
        vec![("origin", "http://evil.example")],
        vec![("referer", "http://evil.example/page")],
        vec![("sec-fetch-site", "cross-site")],
    ] {
        let mut h = vec![("cookie", session.cookie.as_str()), ("x-csrf-token", session.csrf.as_str())];
        h.extend(headers.iter().copied());
        let (s, _) = rig.call(Method::POST, &path, &h, Some(json!({}))).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{headers:?}");
    }
    assert_eq!(rig.status(&wf).await, WorkflowStatus::Waiting);
}

#[tokio::test]
async fn a_viewer_acting_is_403_and_the_surface_records_the_refusal() {
    let rig = Rig::new().await;
    let wf = rig.start("waiter", "viewer").await;
    rig.settle().await;
    let (s, v) = rig.get(VIEWER, "/api/instances").await;
    assert_eq!(s, StatusCode::OK, "a viewer reads: {v}");
    let (s, v) = rig.post(VIEWER, &format!("/api/instances/{wf}/cancel"), json!({})).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert_eq!(v["error"], "forbidden");
    assert_eq!(rig.status(&wf).await, WorkflowStatus::Waiting);
    let cancels = rig.audit("cancel").await;
    assert_eq!(cancels.len(), 1, "{cancels:?}");
    assert_eq!((cancels[0]["actor"].as_str(), cancels[0]["role"].as_str()), (Some("vic"), Some("viewer")));
    assert_eq!(cancels[0]["result"], "refused");
}

#[tokio::test]
async fn proxy_headers_authenticate_and_their_posts_need_the_csrf_token() {
    let rig = Rig::new().await;
    let wf = rig.start("waiter", "proxy").await;
    rig.settle().await;
    let who = [("x-forwarded-user", "pia"), ("x-forwarded-role", "operator"), ("x-forwarded-groups", "finance")];
    let (s, v) = rig.call(Method::GET, "/api/session", &who, None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!((v["name"].as_str(), v["via"].as_str()), (Some("pia"), Some("proxy")));
    assert_eq!(v["task_roles"], json!(["finance"]));
    let csrf = v["csrf_token"].as_str().unwrap().to_string();
    let path = format!("/api/instances/{wf}/cancel");
    let (s, _) = rig.call(Method::POST, &path, &who, Some(json!({}))).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "ambient credentials need the CSRF token");
    let mut with = who.to_vec();
    with.push(("x-csrf-token", &csrf));
    let (s, v) = rig.call(Method::POST, &path, &with, Some(json!({}))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, _) =
        rig.call(Method::GET, "/api/session", &[("x-forwarded-user", "pia"), ("x-forwarded-role", "root")], None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    // Without a proxy section the same headers are nobody.
    let mut config = config();
    config.proxy = None;
    let app = ops_server::router(rig.ops.clone(), &config).unwrap();
    let req = axum::http::Request::get("/api/session")
        .header("host", HOST)
        .header("x-forwarded-user", "pia")
        .body(axum::body::Body::empty())
        .unwrap();
    let res = tower::ServiceExt::oneshot(app, req).await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn logout_ends_the_session() {
    let rig = Rig::new().await;
    let session = rig.login(CLERK).await;
    let (s, v) = session.post(&rig, "/api/logout", json!({})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, _) = session.get(&rig, "/api/session").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn pages_and_assets_are_served_with_a_strict_content_policy() {
    let rig = Rig::new().await;
    for (path, needle) in [
        ("/", "/assets/app.js"),
        ("/login", "/assets/login.js"),
        ("/assets/app.js", "X-CSRF-Token"),
        ("/assets/app.css", "gantt"),
    ] {
        let req = axum::http::Request::get(path).header("host", HOST).body(axum::body::Body::empty()).unwrap();
        let res = tower::ServiceExt::oneshot(rig.app.clone(), req).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{path}");
        let csp = res.headers()["content-security-policy"].to_str().unwrap().to_string();
        assert!(csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"), "{csp}");
        assert_eq!(res.headers()["x-frame-options"], "DENY");
        let body = axum::body::to_bytes(res.into_body(), 1 << 20).await.unwrap();
        assert!(String::from_utf8_lossy(&body).contains(needle), "{path} has {needle}");
    }
    let (s, _) = rig.get(OPERATOR, "/api/no-such-thing").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

/// Every action route, with a body it would accept.
fn every_action(wf: &str) -> Vec<(String, serde_json::Value)> {
    vec![
        (format!("/api/instances/{wf}/signal"), json!({"signal_type": "go"})),
        (format!("/api/instances/{wf}/cancel"), json!({})),
        (format!("/api/instances/{wf}/replay"), json!({})),
        (format!("/api/instances/{wf}/regenerate"), json!({"step": "prep"})),
        ("/api/objects/obj-1/retry-failed".to_string(), json!({})),
        ("/api/dead-letters/dl-1/decide".to_string(), json!({"action": "retry"})),
        ("/api/tasks/task-1/decide".to_string(), json!({"outcome": "approve"})),
        ("/api/permits/ledger/limits".to_string(), json!({"max_concurrency": 1, "max_starts_per_second": 0})),
        ("/api/lanes/rebuild".to_string(), json!({})),
    ]
}

#[tokio::test]
async fn every_action_refuses_no_token_a_bad_token_a_missing_csrf_token_and_a_viewer() {
    let rig = Rig::new().await;
    let wf = rig.start("waiter", "matrix").await;
    rig.settle().await;
    let session = rig.login(OPERATOR).await;
    let viewer = rig.login(VIEWER).await;
    let origin = format!("http://{HOST}");
    for (path, body) in every_action(&wf) {
        let (s, _) = rig.call(Method::POST, &path, &[], Some(body.clone())).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "no token: {path}");
        let (s, _) = rig.post("a-token-nobody-configured", &path, body.clone()).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "bad token: {path}");
        let (s, _) = rig
            .call(Method::POST, &path, &[("cookie", &session.cookie), ("origin", &origin)], Some(body.clone()))
            .await;
        assert_eq!(s, StatusCode::FORBIDDEN, "no CSRF token: {path}");
        let (s, _) = rig.post(VIEWER, &path, body.clone()).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "viewer by token: {path}");
        let (s, _) = viewer.post(&rig, &path, body.clone()).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "viewer by session: {path}");
        let (s, _) = rig.call(Method::GET, &path, &[("authorization", &format!("Bearer {OPERATOR}"))], None).await;
        assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED, "an action is a POST: {path}");
    }
    assert_eq!(rig.status(&wf).await, WorkflowStatus::Waiting, "nothing happened");
    // Each refusal is in the audit log: 3 before the surface (401, 401, 403) and 2 by it.
    let (_, v) = rig.get(OPERATOR, "/api/audit?limit=500").await;
    let entries = v["items"].as_array().unwrap();
    assert_eq!(entries.len(), every_action(&wf).len() * 5, "{v}");
    assert!(entries.iter().all(|e| e["result"] == "refused"), "{v}");
}

#[tokio::test]
async fn refusals_made_before_a_handler_are_json_too() {
    // A path segment that is not UTF-8, a repeated query key, a wrong method, a body over
    // the limit: each answers the API's {"error", "message"} with its own status.
    let rig = Rig::new().await;
    let auth = format!("Bearer {OPERATOR}");
    let h: &[(&str, &str)] = &[("authorization", &auth)];
    let (s, v) = rig.call(Method::GET, "/api/instances/%FF%FE", h, None).await;
    assert_eq!((s, v["error"].as_str()), (StatusCode::BAD_REQUEST, Some("bad_input")), "{v}");
    let (s, v) = rig.call(Method::GET, "/api/instances?limit=1&limit=2", h, None).await;
    assert_eq!((s, v["error"].as_str()), (StatusCode::BAD_REQUEST, Some("bad_input")), "{v}");
    let (s, v) = rig.call(Method::GET, "/api/instances/wf-x/cancel", h, None).await;
    assert_eq!((s, v["error"].as_str()), (StatusCode::METHOD_NOT_ALLOWED, Some("method_not_allowed")), "{v}");
    let big = json!({"signal_type": "x".repeat(ops_server::BODY_BYTES_MAX + 10)});
    let (s, v) = rig.post(OPERATOR, "/api/instances/wf-x/signal", big).await;
    assert_eq!((s, v["error"].as_str()), (StatusCode::PAYLOAD_TOO_LARGE, Some("too_large")), "{v}");
}
