//! The same operator surface on PostgreSQL (the core walk) and on the Mongo-wire server
//! (one smoke test: it is slow, and the store differs only underneath the ports).

use crate::fixture::Fixture;
use kernel_core::WorkflowStatus;

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_walk_on_postgres() {
    // K-15, K-5, K-8, K-9.3, K-11.4, K-17.2, K-17.5 on store-postgres
    let Some(f) = Fixture::postgres().await else { return };
    f.populate().await;
    let (code, out, err) = f.wfk(&["list", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["items"].as_array().unwrap().len(), 7);
    let (_, out, _) = f.wfk(&["list", "--biz-key-prefix", "order-", "--status", "failed", "--json"]).await;
    assert_eq!(json(&out)["items"][0]["workflow_id"], "wf-order-2");
    assert_eq!(f.wfk(&["show", "order-2"]).await.0, 0);
    assert_eq!(f.wfk(&["signal", "gate-1", "go"]).await.0, 0);
    assert_eq!(f.wfk(&["replay", "order-2"]).await.0, 0);
    assert_eq!(f.wfk(&["retry-failed", "obj-1"]).await.0, 0);
    assert_eq!(f.wfk(&["cancel", "order-1"]).await.0, 3, "completed: the guard refuses");
    let dl = json(&f.wfk(&["dlq", "list", "--json"]).await.1)[0]["id"].as_str().unwrap().to_string();
    assert_eq!(f.wfk(&["dlq", "fail", &dl]).await.0, 0);
    let task = json(&f.wfk(&["--roles", "finance", "tasks", "list", "--json"]).await.1)["items"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(f.wfk(&["--roles", "finance", "tasks", "reject", &task]).await.0, 0);
    assert_eq!(f.wfk(&["permits", "set", "llm", "--max-concurrency", "2"]).await.0, 0);
    assert!(f.wfk(&["migrate"]).await.1.contains("postgres schema"));
    f.settle().await;
    assert_eq!(f.instance("wf-gate-1").await.status, WorkflowStatus::Completed);
    assert_eq!(f.instance("wf-ingest-1").await.status, WorkflowStatus::Failed);
    assert_eq!(f.instance("wf-review-1").await.status, WorkflowStatus::Failed, "a rejection fails the step: no `post`");
    let audit = json(&f.wfk(&["audit", "--json"]).await.1);
    assert_eq!(audit.as_array().unwrap().len(), 7, "{audit}");
    // The stock binary through the environment.
    f.bin().args(["list"]).assert().success();
    f.bin().args(["show", "wf-none"]).assert().code(1);
    f.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_smoke_test_on_mongodb() {
    // K-15 on store-mongo: list from the projection, show, one guarded action and its audit entry.
    let Some(f) = Fixture::mongo().await else { return };
    f.populate().await;
    let (code, out, err) = f.wfk(&["list", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["items"].as_array().unwrap().len(), 7);
    assert_eq!(f.wfk(&["show", "gate-1"]).await.0, 0);
    assert_eq!(f.wfk(&["cancel", "gate-1"]).await.0, 0);
    assert_eq!(f.instance("wf-gate-1").await.status, WorkflowStatus::Canceled);
    assert_eq!(json(&f.wfk(&["audit", "--json"]).await.1).as_array().unwrap().len(), 1);
    f.destroy().await;
}
