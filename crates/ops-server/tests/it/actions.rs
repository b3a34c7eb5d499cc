//! Every action through the API: done, refused by its guard (K-6.4: the state no longer
//! allows it, 409), refused for a viewer (403), bad input (400), not found (404).

use crate::rig::*;
use axum::http::StatusCode;
use kernel_core::WorkflowStatus;
use serde_json::{json, Value};

async fn assert_viewer_refused(rig: &Rig, path: &str, body: Value) {
    let (s, v) = rig.post(VIEWER, path, body).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{path}: {v}");
}

#[tokio::test]
async fn cancel_a_waiting_workflow_then_a_second_cancel_and_a_completed_one_are_409() {
    let rig = Rig::new().await;
    let wf = rig.start("waiter", "c1").await;
    let done = rig.start("quick", "c2").await;
    rig.settle().await;
    assert_viewer_refused(&rig, &format!("/api/instances/{wf}/cancel"), json!({})).await;
    let (s, v) = rig.post(OPERATOR, &format!("/api/instances/{wf}/cancel"), json!({})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["action"], "cancel");
    assert_eq!(rig.status(&wf).await, WorkflowStatus::Canceled);
    let (s, v) = rig.post(OPERATOR, &format!("/api/instances/{wf}/cancel"), json!({})).await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    let (s, v) = rig.post(OPERATOR, &format!("/api/instances/{done}/cancel"), json!({})).await;
    assert_eq!((s, v["error"].as_str()), (StatusCode::CONFLICT, Some("refused")), "{v}");
    assert!(v["message"].as_str().unwrap().contains("completed"), "{v}");
    assert_eq!(rig.status(&done).await, WorkflowStatus::Completed);
    let (s, _) = rig.post(OPERATOR, "/api/instances/wf-nobody/cancel", json!({})).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // Entries of the same millisecond have no order among them: compare as a multiset.
    let mut results: Vec<_> =
        rig.audit("cancel").await.iter().map(|e| e["result"].as_str().unwrap().to_string()).collect();
    results.sort();
    assert_eq!(results, ["not_found", "ok", "refused", "refused", "refused"]);
}

#[tokio::test]
async fn replay_a_failed_workflow_and_a_completed_one_is_409() {
    let rig = Rig::new().await;
    let wf = rig.start("broken", "r1").await;
    let done = rig.start("quick", "r2").await;
    rig.settle().await;
    assert_eq!(rig.status(&wf).await, WorkflowStatus::Failed);
    assert_viewer_refused(&rig, &format!("/api/instances/{wf}/replay"), json!({})).await;
    let (s, v) = rig.post(OPERATOR, &format!("/api/instances/{wf}/replay"), json!({})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["detail"]["run"], 1);
    let (s, v) = rig.post(OPERATOR, &format!("/api/instances/{done}/replay"), json!({})).await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
}

#[tokio::test]
async fn signal_a_waiting_workflow_and_it_completes() {
    let rig = Rig::new().await;
    let wf = rig.start("waiter", "s1").await;
    rig.settle().await;
    assert_viewer_refused(&rig, &format!("/api/instances/{wf}/signal"), json!({"signal_type": "go"})).await;
    let (s, v) = rig.post(OPERATOR, &format!("/api/instances/{wf}/signal"), json!({"signal_type": "nope"})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "not the signal it waits on, no wait key: {v}");
    let (s, v) = rig.post(OPERATOR, &format!("/api/instances/{wf}/signal"), json!({"payload": 1})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let (s, v) = rig.post(OPERATOR, &format!("/api/instances/{wf}/signal"), json!({"signal_type": "go"})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    rig.settle().await;
    assert_eq!(rig.status(&wf).await, WorkflowStatus::Completed);
}

#[tokio::test]
async fn regenerate_a_completed_step_of_a_waiting_workflow_and_of_a_completed_one_is_409() {
    let rig = Rig::new().await;
    let wf = rig.start("waiter", "g1").await;
    let done = rig.start("quick", "g2").await;
    rig.settle().await;
    let path = format!("/api/instances/{wf}/regenerate");
    assert_viewer_refused(&rig, &path, json!({"step": "prep"})).await;
    let (s, v) = rig.post(OPERATOR, &path, json!({"step": "prep"})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["detail"]["epoch"], 1, "{v}");
    let (s, v) = rig.post(OPERATOR, &path, json!({"step": "nope"})).await;
    assert!(s.is_client_error() && s != StatusCode::FORBIDDEN, "{s} {v}");
    let (s, _) = rig.post(OPERATOR, &path, json!({})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, v) = rig.post(OPERATOR, &format!("/api/instances/{done}/regenerate"), json!({"step": "only"})).await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
}

#[tokio::test]
async fn retry_failed_without_a_dispatch_outbox_is_bad_input() {
    let rig = Rig::new().await;
    assert_viewer_refused(&rig, "/api/objects/obj-1/retry-failed", json!({})).await;
    let (s, v) = rig.post(OPERATOR, "/api/objects/obj-1/retry-failed", json!({})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["message"].as_str().unwrap().contains("dispatch"), "{v}");
    assert_eq!(rig.audit("retry-failed").await.len(), 2);
}

#[tokio::test]
async fn decide_a_dead_letter_once_and_a_second_decision_is_409() {
    let rig = Rig::new().await;
    let wf = rig.start("letter", "d1").await;
    rig.settle().await;
    let (s, v) = rig.get(VIEWER, "/api/dead-letters?status=open").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let items = v["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{v}");
    assert_eq!(items[0]["workflow_id"], wf.as_str());
    let id = items[0]["id"].as_str().unwrap().to_string();
    let path = format!("/api/dead-letters/{}/decide", urlencode(&id));
    let (s, v) = rig.get(OPERATOR, &format!("/api/dead-letters/{}", urlencode(&id))).await;
    assert_eq!((s, v["step"].as_str()), (StatusCode::OK, Some("boom")), "{v}");
    assert_viewer_refused(&rig, &path, json!({"action": "retry"})).await;
    for bad in [json!({"action": "complete"}), json!({"action": "retry", "output": 1}), json!({"action": "drop"})] {
        let (s, v) = rig.post(OPERATOR, &path, bad.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {v}");
    }
    let (s, v) = rig
        .post(OPERATOR, &path, json!({"action": "complete", "output": {"fixed": true}, "reason": "entered by hand"}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = rig.post(OPERATOR, &path, json!({"action": "fail"})).await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    let (s, _) = rig.post(OPERATOR, "/api/dead-letters/dl-nobody/decide", json!({"action": "retry"})).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    rig.settle().await;
    assert_eq!(rig.status(&wf).await, WorkflowStatus::Completed);
}

#[tokio::test]
async fn approve_a_human_task_as_an_eligible_operator_and_others_are_refused() {
    approve_flow(Rig::new().await).await;
}

#[tokio::test]
async fn approve_a_human_task_on_a_sqlite_file() {
    approve_flow(Rig::sqlite().await).await;
}

async fn approve_flow(rig: Rig) {
    let wf = rig.start("invoice", "t1").await;
    rig.settle().await;
    assert_eq!(rig.status(&wf).await, WorkflowStatus::Waiting);
    let (s, v) = rig.get(CLERK, "/api/tasks").await;
    assert_eq!((s, v["items"].as_array().map(Vec::len)), (StatusCode::OK, Some(0)), "carl holds no task role: {v}");
    let (s, v) = rig.get(OPERATOR, "/api/tasks").await;
    assert_eq!(s, StatusCode::OK);
    let items = v["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{v}");
    assert_eq!(items[0]["token"], "(hidden)", "the task's token never leaves the server");
    let id = items[0]["id"].as_str().unwrap().to_string();
    let path = format!("/api/tasks/{}/decide", urlencode(&id));
    let (s, v) = rig.get(OPERATOR, &format!("/api/tasks/{}", urlencode(&id))).await;
    assert_eq!((s, v["workflow_id"].as_str()), (StatusCode::OK, Some(wf.as_str())), "{v}");
    assert_viewer_refused(&rig, &path, json!({"outcome": "approve"})).await;
    let (s, v) = rig.post(CLERK, &path, json!({"outcome": "approve"})).await;
    assert_eq!(s, StatusCode::CONFLICT, "not eligible: {v}");
    let (s, v) = rig.post(OPERATOR, &path, json!({"outcome": "maybe"})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let session = rig.login(OPERATOR).await;
    let (s, v) = session.post(&rig, &path, json!({"outcome": "approve", "reason": "checked"})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["action"], "task-approve");
    let (s, v) = rig.post(OPERATOR, &path, json!({"outcome": "reject"})).await;
    assert_eq!(s, StatusCode::CONFLICT, "decided already: {v}");
    rig.settle().await;
    assert_eq!(rig.status(&wf).await, WorkflowStatus::Completed);
}

#[tokio::test]
async fn set_permit_limits_and_rebuild_the_lanes() {
    let rig = Rig::new().await;
    let _ = rig.start("quick", "l1").await;
    assert_viewer_refused(
        &rig,
        "/api/permits/ledger/limits",
        json!({"max_concurrency": 2, "max_starts_per_second": 0}),
    )
    .await;
    let (s, v) = rig
        .post(OPERATOR, "/api/permits/ledger/limits", json!({"max_concurrency": 2, "max_starts_per_second": 0}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["detail"]["max_concurrency"], 2);
    let (s, _) = rig.post(OPERATOR, "/api/permits/ledger/limits", json!({"max_concurrency": -1})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, v) = rig.get(VIEWER, "/api/permits").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let ledger = v.as_array().unwrap().iter().find(|r| r["resource"] == "ledger").cloned().unwrap_or_default();
    assert_eq!((ledger["max_concurrency"].as_u64(), ledger["overridden"].as_bool()), (Some(2), Some(true)), "{v}");
    assert_viewer_refused(&rig, "/api/lanes/rebuild", json!({})).await;
    let (s, v) = rig.post(OPERATOR, "/api/lanes/rebuild", json!({})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["detail"]["offered"], 1, "the one claimable workflow: {v}");
}

pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
