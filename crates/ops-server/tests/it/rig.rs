//! A console over an in-process `memory:` deployment: an engine driven round by round, an
//! observer projection flushed on demand, and the router called in-process with
//! `tower::ServiceExt::oneshot`.

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use kernel_core::domain::ResumeKind;
use kernel_core::engine::{Engine, RoundOutcome};
use kernel_core::*;
use kernel_tasks::{HumanTask, Level};
use observer::{Observer, ObserverConfig, ObserverWriter};
use ops::{Ops, OpsParts};
use serde_json::{json, Value};
use std::sync::Arc;
use tower::ServiceExt;

/// An operator eligible for the finance tasks.
pub const OPERATOR: &str = "operator-token-0123456789";
/// A viewer holding the finance role too.
pub const VIEWER: &str = "viewer-token-0123456789";
/// An operator without task roles.
pub const CLERK: &str = "clerk-token-0123456789";
/// The host every request names.
pub const HOST: &str = "console.test:8080";

pub fn config() -> ops_server::ServerConfig {
    ops_server::ServerConfig::from_json(&format!(
        r#"{{"tokens":[
            {{"token":"{OPERATOR}","name":"ana","role":"operator","task_roles":["finance"]}},
            {{"token":"{VIEWER}","name":"vic","role":"viewer","task_roles":["finance"]}},
            {{"token":"{CLERK}","name":"carl","role":"operator"}}],
          "proxy":{{"user":"x-forwarded-user","role":"x-forwarded-role","task_roles":"x-forwarded-groups"}}}}"#
    ))
    .expect("test configuration")
}

pub struct Rig {
    pub app: Router,
    pub engine: Engine,
    pub writer: ObserverWriter,
    pub ops: Arc<Ops>,
    pub store: Arc<ports::DynStore>,
    /// The SQLite file's directory, removed with the rig.
    _dir: Option<tempfile::TempDir>,
}

/// `invoice`: a human review (finance) then `post`. `broken`: fails for good. `letter`:
/// fails into a dead letter. `quick`: completes at once. `waiter`: `prep`, then a wait on
/// signal `go`.
pub fn definitions(inbox: Arc<ports::DynTaskInbox>) -> Vec<Definition> {
    let review =
        HumanTask::builder("Approve invoice").level(Level::roles(["finance"])).build(inbox).expect("valid human task");
    let post = StepDef::new("post", |_c: ActivityContext| async { Ok(StepOutcome::complete(json!("posted"))) })
        .depends_on(["review"]);
    let boom = || {
        StepDef::new("boom", |_c: ActivityContext| async {
            Err::<StepOutcome, _>(ActivityError::permanent("the ledger refused the entry"))
        })
    };
    vec![
        Definition::builder("invoice").step(StepDef::new("review", review).max_retry(3)).step(post).build().unwrap(),
        Definition::builder("broken").step(boom()).build().unwrap(),
        Definition::builder("letter").step(boom().on_failed(OnFailed::DeadLetter)).build().unwrap(),
        Definition::builder("quick")
            .step(StepDef::new("only", |_c: ActivityContext| async { Ok(StepOutcome::complete(json!({"n": 1}))) }))
            .build()
            .unwrap(),
        Definition::builder("waiter")
            .step(StepDef::new("prep", |_c: ActivityContext| async { Ok(StepOutcome::complete(json!("ready"))) }))
            .step(
                StepDef::new("sig", |c: ActivityContext| async move {
                    if c.resume().map(|r| r.kind) == Some(ResumeKind::Signal) {
                        return Ok(StepOutcome::complete(json!("signalled")));
                    }
                    Ok(StepOutcome::wait_for_signal("go", "key-1").into())
                })
                .depends_on(["prep"]),
            )
            .build()
            .unwrap(),
    ]
}

impl Rig {
    /// On `memory:`.
    pub async fn new() -> Rig {
        Rig::on("memory:", "memory:", None).await
    }

    /// On a fresh SQLite file with the `local` queue in it.
    pub async fn sqlite() -> Rig {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite:{}", dir.path().join("wf.db").display());
        Rig::on(&url, "local", Some(dir)).await
    }

    async fn on(store: &str, queue: &str, dir: Option<tempfile::TempDir>) -> Rig {
        let d =
            compose::Deployment::connect(store, queue, &compose::QueueOptions::default()).await.expect("deployment");
        let repo = d.store.observation_repository().await.expect("projection");
        let base = d.ports().build().expect("ports");
        let (sink, writer) =
            Observer::start(repo.clone(), base.clock.clone(), ObserverConfig::default()).expect("observer");
        let ports = d.ports().observer(Arc::new(sink)).build().expect("ports");
        let defs = definitions(d.store.task_inbox.clone());
        let mut b = Engine::builder(ports.clone());
        for def in defs.clone() {
            b = b.register(def);
        }
        let engine = b.build().expect("engine");
        let ops = Arc::new(
            Ops::from_parts(OpsParts { ports, repo, definitions: defs, dispatch: None, schema: "memory".into() })
                .expect("ops"),
        );
        let app = ops_server::router(ops.clone(), &config()).expect("router");
        Rig { app, engine, writer, ops, store: d.store.store.clone(), _dir: dir }
    }

    /// Start a workflow `wf-<biz>` of `workflow_type`.
    pub async fn start(&self, workflow_type: &str, biz: &str) -> String {
        let wf = format!("wf-{biz}");
        let req = StartRequest::new(workflow_type, biz, json!({"amount": 100})).workflow_id(wf.clone());
        self.engine.publisher().start_or_resume(req).await.expect("started");
        wf
    }

    /// Maintenance, rounds until idle, then the projection flushed.
    pub async fn settle(&self) {
        self.engine.maintain().await.expect("maintenance");
        for _ in 0..100 {
            match self.engine.tick().await.expect("tick") {
                RoundOutcome::Ran { .. } => continue,
                _ => break,
            }
        }
        self.writer.flush().await.expect("flush");
    }

    pub async fn status(&self, wf: &str) -> WorkflowStatus {
        self.store.get(&WorkflowId::from(wf)).await.expect("read").expect("stored").status
    }

    /// A request with the console's host and optional extra headers; the answer's status and JSON.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = Request::builder().method(method).uri(path).header(header::HOST, HOST);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = match body {
            Some(b) => req.header(header::CONTENT_TYPE, "application/json").body(Body::from(b.to_string())),
            None => req.body(Body::empty()),
        }
        .unwrap();
        let res = self.app.clone().oneshot(req).await.expect("answer");
        let status = res.status();
        let bytes = axum::body::to_bytes(res.into_body(), 1 << 22).await.expect("body");
        let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, json)
    }

    /// GET as a bearer.
    pub async fn get(&self, token: &str, path: &str) -> (StatusCode, Value) {
        let auth = format!("Bearer {token}");
        self.call(Method::GET, path, &[("authorization", &auth)], None).await
    }

    /// POST as a bearer (no CSRF token needed: the header is not ambient).
    pub async fn post(&self, token: &str, path: &str, body: Value) -> (StatusCode, Value) {
        let auth = format!("Bearer {token}");
        self.call(Method::POST, path, &[("authorization", &auth)], Some(body)).await
    }

    /// Log in with `token`: the session cookie and the CSRF token.
    pub async fn login(&self, token: &str) -> Session {
        let req = Request::builder()
            .method(Method::POST)
            .uri("/api/login")
            .header(header::HOST, HOST)
            .header(header::ORIGIN, format!("http://{HOST}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(json!({ "token": token }).to_string()))
            .unwrap();
        let res = self.app.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let set = res.headers().get(header::SET_COOKIE).expect("a session cookie").to_str().unwrap().to_string();
        let cookie = set.split(';').next().unwrap().to_string();
        let bytes = axum::body::to_bytes(res.into_body(), 1 << 20).await.unwrap();
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        Session { cookie, set_cookie: set, csrf: v["csrf_token"].as_str().expect("a CSRF token").to_string() }
    }

    /// The audit entries of `action`, newest first.
    pub async fn audit(&self, action: &str) -> Vec<Value> {
        let (s, v) = self.get(OPERATOR, &format!("/api/audit?action={action}&limit=100")).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        v["items"].as_array().cloned().unwrap_or_default()
    }
}

pub struct Session {
    /// `ops_session=<id>`.
    pub cookie: String,
    /// The whole Set-Cookie header of the login.
    pub set_cookie: String,
    pub csrf: String,
}

impl Session {
    /// A POST from the console's own page: cookie, origin, CSRF token.
    pub async fn post(&self, rig: &Rig, path: &str, body: Value) -> (StatusCode, Value) {
        let origin = format!("http://{HOST}");
        rig.call(
            Method::POST,
            path,
            &[("cookie", &self.cookie), ("origin", &origin), ("x-csrf-token", &self.csrf)],
            Some(body),
        )
        .await
    }

    pub async fn get(&self, rig: &Rig, path: &str) -> (StatusCode, Value) {
        rig.call(Method::GET, path, &[("cookie", &self.cookie)], None).await
    }
}
