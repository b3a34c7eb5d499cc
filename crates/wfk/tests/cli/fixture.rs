//! A deployment with one workflow in each state an operator meets, on a real store by URL:
//! the engine runs in this process on the wall clock; `wfk` runs in-process (with the
//! definitions) or as the stock binary (without), against the same URLs.

use compose::{Deployment, QueueOptions};
use kernel_core::dispatch::{AcceptRequest, Dispatch};
use kernel_core::engine::{Engine, RoundOutcome};
use kernel_core::ports::*;
use kernel_core::*;
use kernel_tasks::{HumanTask, Level};
use observer::{Observer, ObserverConfig, ObserverWriter};
use serde_json::json;
use std::sync::Arc;

pub struct Fixture {
    pub store_url: String,
    pub queue_url: String,
    pub deployment: Option<Deployment>,
    pub engine: Engine,
    pub dispatch: Dispatch,
    writer: ObserverWriter,
    _dir: Option<tempfile::TempDir>,
}

/// The definitions the fixture runs and an in-process `wfk` knows.
pub fn definitions() -> Vec<Definition> {
    let order = Definition::builder("order")
        .step(StepDef::new("reserve", |_c: ActivityContext| async { Ok(StepOutcome::complete(json!("reserved"))) }))
        .step(
            StepDef::new("charge", |c: ActivityContext| async move {
                if c.input()["fail"] == json!(true) {
                    Err(ActivityError::permanent("card declined"))
                } else {
                    Ok(StepOutcome::complete(json!("charged")))
                }
            })
            .depends_on(["reserve"]),
        )
        .build()
        .unwrap();
    let gate = Definition::builder("gate")
        .step(StepDef::new("hold", |c: ActivityContext| async move {
            if c.resume().is_some() {
                Ok(StepOutcome::complete(json!("released")))
            } else {
                Ok(StepOutcome::wait_for_signal("go", c.biz_key().to_string()).into())
            }
        }))
        .build()
        .unwrap();
    let ingest = Definition::builder("ingest")
        .step(
            StepDef::new("parse", |_c: ActivityContext| async {
                Err::<StepOutcome, _>(ActivityError::permanent("unparseable attachment"))
            })
            .on_failed(OnFailed::DeadLetter),
        )
        .build()
        .unwrap();
    let draft = Definition::builder("draft")
        .step(StepDef::new("write", |c: ActivityContext| async move {
            Ok(StepOutcome::complete(json!({ "text": "draft", "epoch": c.idempotency_key() })))
        }))
        .step(
            StepDef::new("publish", |c: ActivityContext| async move {
                if c.resume().is_some() {
                    Ok(StepOutcome::complete(json!("published")))
                } else {
                    Ok(StepOutcome::wait_for_signal("publish", c.biz_key().to_string()).into())
                }
            })
            .depends_on(["write"]),
        )
        .build()
        .unwrap();
    vec![order, gate, ingest, draft]
}

fn review(inbox: Arc<DynTaskInbox>) -> Definition {
    let task = HumanTask::builder("Approve invoice")
        .level(Level::roles(["finance"]).sla(DurationMs::from_millis(3_600_000)))
        .build(inbox)
        .unwrap();
    Definition::builder("review")
        .step(StepDef::new("approve", task))
        .step(
            StepDef::new("post", |_c: ActivityContext| async { Ok(StepOutcome::complete(json!("posted"))) })
                .depends_on(["approve"]),
        )
        .build()
        .unwrap()
}

/// Every definition, the human-task one on `inbox`.
pub fn all_definitions(inbox: Arc<DynTaskInbox>) -> Vec<Definition> {
    let mut d = definitions();
    d.push(review(inbox));
    d
}

impl Fixture {
    pub async fn sqlite() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let store_url = format!("sqlite:{}", dir.path().join("wf.db").display());
        let deployment = Deployment::connect(&store_url, "local", &QueueOptions::default()).await.unwrap();
        Self::with(store_url, "local".into(), deployment, Some(dir)).await
    }

    /// A fresh schema on the PostgreSQL server, or `None` (skipped) when none answers and
    /// this is not CI.
    pub async fn postgres() -> Option<Fixture> {
        let url =
            std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string());
        let store = match compose::StoreSide::connect_scratch(&url, "wfk_cli").await {
            Ok(s) => s,
            Err(e) => return testkit::ci::skip_or_fail("wfk cli on postgres", &e.to_string()),
        };
        let schema = store.postgres_config().unwrap().schema.clone();
        let sep = if url.contains('?') { '&' } else { '?' };
        let store_url = format!("{url}{sep}schema={schema}");
        drop(store);
        // The queue lives in a SQLite file of the test's own, which the binary opens too.
        let dir = tempfile::tempdir().unwrap();
        let queue_url = format!("sqlite:{}", dir.path().join("coord.db").display());
        let deployment = Deployment::connect(&store_url, &queue_url, &QueueOptions::default()).await.unwrap();
        Some(Self::with(store_url, queue_url, deployment, Some(dir)).await)
    }

    pub async fn mongo() -> Option<Fixture> {
        let Ok(url) = std::env::var("MONGODB_URI") else {
            return testkit::ci::skip_or_fail("wfk cli on mongodb", "MONGODB_URI is not set");
        };
        let store = compose::StoreSide::connect_scratch(&url, "wfk_cli").await.unwrap();
        let db = store.mongo_database().unwrap().name().to_string();
        let store_url = with_database(&url, &db);
        drop(store);
        let dir = tempfile::tempdir().unwrap();
        let queue_url = format!("sqlite:{}", dir.path().join("coord.db").display());
        let deployment = Deployment::connect(&store_url, &queue_url, &QueueOptions::default()).await.unwrap();
        Some(Self::with(store_url, queue_url, deployment, Some(dir)).await)
    }

    async fn with(
        store_url: String,
        queue_url: String,
        deployment: Deployment,
        dir: Option<tempfile::TempDir>,
    ) -> Fixture {
        let repo = deployment.store.observation_repository().await.unwrap();
        let (sink, writer) = Observer::start(repo, Arc::new(SystemClock), ObserverConfig::default()).unwrap();
        let ports = deployment.ports().observer(Arc::new(sink)).build().unwrap();
        let inbox = ports.task_inbox.clone().unwrap();
        let mut b = Engine::builder(ports.clone());
        for d in all_definitions(inbox) {
            b = b.register(d);
        }
        let engine = b.build().unwrap();
        let dispatch = Dispatch::builder()
            .outbox(deployment.store.dispatch_outbox().await.unwrap())
            .candidates(deployment.queue.dispatch_candidates().unwrap())
            .publisher(engine.publisher())
            .build()
            .unwrap();
        Fixture { store_url, queue_url, deployment: Some(deployment), engine, dispatch, writer, _dir: dir }
    }

    /// Start one workflow of each kind and run them until nothing is ready.
    pub async fn populate(&self) {
        let p = self.engine.publisher();
        let start = |t: &str, key: &str, input: serde_json::Value| {
            StartRequest::new(t, key, input).workflow_id(format!("wf-{key}"))
        };
        p.start_or_resume(start("order", "order-1", json!({ "fail": false }))).await.unwrap();
        p.start_or_resume(start("order", "order-2", json!({ "fail": true }))).await.unwrap();
        p.start_or_resume(start("gate", "gate-1", json!({}))).await.unwrap();
        p.start_or_resume(start("ingest", "ingest-1", json!({}))).await.unwrap();
        p.start_or_resume(start("draft", "draft-1", json!({}))).await.unwrap();
        p.start_or_resume(start("review", "review-1", json!({}))).await.unwrap();
        self.dispatch
            .accept(AcceptRequest {
                object_id: "obj-1".into(),
                fields: json!({ "customer": "c-1" }),
                workflow_type: "order".into(),
                biz_key: "round-1".into(),
                fencing_token: "f-1".into(),
                input: json!({ "fail": true, "object_id": "obj-1", "fencing_token": "f-1" }),
                priority: Priority::P2,
            })
            .await
            .unwrap();
        self.dispatch.dispatch_now(&"obj-1".into()).await.unwrap();
        self.settle().await;
        // What the round's failure finalizer writes in a real deployment: the business
        // object failed in round f-1 (K-11.4 retries only a failed round).
        assert!(self
            .dispatch
            .outbox()
            .fenced_update(&"obj-1".into(), &"f-1".into(), json!({}), Some("failed"))
            .await
            .unwrap());
    }

    /// Maintenance, then rounds until idle; then the projection is flushed.
    pub async fn settle(&self) {
        for _ in 0..3 {
            self.engine.maintain().await.unwrap();
            while let RoundOutcome::Ran { .. } = self.engine.tick().await.unwrap() {}
        }
        self.writer.flush().await.unwrap();
    }

    pub async fn instance(&self, id: &str) -> WorkflowInstance {
        self.engine.ports().store.get(&id.into()).await.unwrap().expect("stored instance")
    }

    /// The secret token of a task (what the CLI must never print).
    pub async fn task_token(&self, id: &str) -> String {
        self.engine.ports().task_inbox.clone().unwrap().get(id).await.unwrap().expect("task").token
    }

    /// `wfk` in this process, with the definitions; (exit code, stdout, stderr).
    pub async fn wfk(&self, args: &[&str]) -> (u8, String, String) {
        let mut argv = vec!["--store".to_string(), self.store_url.clone(), "--queue".into(), self.queue_url.clone()];
        argv.extend(args.iter().map(|s| s.to_string()));
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let inbox = self.engine.ports().task_inbox.clone().unwrap();
        let code = wfk::run(argv, all_definitions(inbox), &mut out, &mut err).await;
        (code, String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap())
    }

    /// The stock `wfk` binary with the deployment in its environment.
    pub fn bin(&self) -> assert_cmd::Command {
        let mut c = assert_cmd::Command::cargo_bin("wfk").unwrap();
        c.env("WFK_STORE", &self.store_url).env("WFK_QUEUE", &self.queue_url).env_remove("WFK_ACTOR");
        c
    }

    pub async fn destroy(mut self) {
        let _ = self.writer.flush().await;
        if let Some(d) = self.deployment.take() {
            d.destroy().await.unwrap();
        }
    }
}

fn with_database(url: &str, db: &str) -> String {
    // mongodb://host:port[/old][?query] → mongodb://host:port/<db>[?query]
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[scheme_end..].find('/').map_or(base.len(), |i| scheme_end + i);
    let mut out = format!("{}/{db}", &base[..host_end]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// Timestamps (13-digit milliseconds) and random tokens out of a text, for snapshots.
pub fn normalize(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i].is_ascii_digit() {
            let mut j = i;
            while j < chars.len() && chars[j].is_ascii_digit() {
                j += 1;
            }
            if j - i == 13 {
                out.push_str("<ms>");
            } else {
                out.extend(&chars[i..j]);
            }
            i = j;
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

/// Compare `got` with the snapshot `name` under tests/snapshots/; `WFK_BLESS=1` rewrites it.
pub fn snapshot(name: &str, got: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots").join(name);
    if std::env::var("WFK_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("no snapshot {}; run with WFK_BLESS=1", path.display()));
    if got != want {
        let first = got.lines().zip(want.lines()).position(|(a, b)| a != b).unwrap_or(0);
        panic!(
            "output differs from tests/snapshots/{name} at line {}:\n  got:  {:?}\n  want: {:?}\n--- whole output ---\n{got}",
            first + 1,
            got.lines().nth(first),
            want.lines().nth(first)
        );
    }
}
