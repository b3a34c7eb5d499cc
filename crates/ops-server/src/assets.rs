//! The pages, embedded in the binary: plain HTML, JavaScript and CSS, no build step.

use crate::AppState;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use std::sync::Arc;

const INDEX_HTML: &str = include_str!("../assets/index.html");
const LOGIN_HTML: &str = include_str!("../assets/login.html");
const APP_JS: &str = include_str!("../assets/app.js");
const LOGIN_JS: &str = include_str!("../assets/login.js");
const APP_CSS: &str = include_str!("../assets/app.css");

pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/", get(|| async { asset(INDEX_HTML, "text/html; charset=utf-8") }))
        .route("/login", get(|| async { asset(LOGIN_HTML, "text/html; charset=utf-8") }))
        .route("/assets/app.js", get(|| async { asset(APP_JS, "text/javascript; charset=utf-8") }))
        .route("/assets/login.js", get(|| async { asset(LOGIN_JS, "text/javascript; charset=utf-8") }))
        .route("/assets/app.css", get(|| async { asset(APP_CSS, "text/css; charset=utf-8") }))
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut res = body.into_response();
    res.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    res.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    res
}
