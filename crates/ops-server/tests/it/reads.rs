//! The reads: the list's filters and pages, one workflow's detail with its timeline, lanes,
//! the audit log.

use crate::actions::urlencode;
use crate::rig::*;
use axum::http::StatusCode;
use serde_json::Value;

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> =
        v["items"].as_array().unwrap().iter().map(|s| s["biz_key"].as_str().unwrap().to_string()).collect();
    k.sort();
    k
}

#[tokio::test]
async fn the_list_filters_by_type_status_prefix_and_signal_and_pages_by_cursor() {
    let rig = Rig::new().await;
    for b in ["a-1", "a-2", "a-3", "b-1"] {
        rig.start("quick", b).await;
    }
    rig.start("waiter", "w-1").await;
    rig.settle().await;
    let (s, v) = rig.get(VIEWER, "/api/instances?biz_key_prefix=a-").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(keys(&v), ["a-1", "a-2", "a-3"]);
    let (_, v) = rig.get(VIEWER, "/api/instances?type=waiter").await;
    assert_eq!(keys(&v), ["w-1"]);
    let (_, v) = rig.get(VIEWER, "/api/instances?status=completed").await;
    assert_eq!(keys(&v).len(), 4);
    let (_, v) = rig.get(VIEWER, "/api/instances?waiting_on=go").await;
    assert_eq!(keys(&v), ["w-1"]);
    let (_, v) = rig.get(VIEWER, "/api/instances?status=&type=").await;
    assert_eq!(keys(&v).len(), 5, "empty filters are no filters");
    // Pages of two.
    let mut seen = vec![];
    let mut cursor: Option<String> = None;
    for _ in 0..5 {
        let path = match &cursor {
            Some(c) => format!("/api/instances?biz_key_prefix=a-&limit=2&cursor={}", urlencode(c)),
            None => "/api/instances?biz_key_prefix=a-&limit=2".to_string(),
        };
        let (s, v) = rig.get(VIEWER, &path).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        seen.extend(keys(&v));
        match v["next"].as_str() {
            Some(n) => cursor = Some(n.to_string()),
            None => break,
        }
    }
    seen.sort();
    assert_eq!(seen, ["a-1", "a-2", "a-3"], "every row once");
    for bad in ["status=sleeping", "limit=many", "cursor=zz", "limit=100000", "type=a%00b"] {
        let (s, v) = rig.get(VIEWER, &format!("/api/instances?{bad}")).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {v}");
    }
}

#[tokio::test]
async fn the_detail_has_steps_errors_and_a_timeline() {
    let rig = Rig::new().await;
    let wf = rig.start("broken", "detail").await;
    rig.settle().await;
    let (s, v) = rig.get(VIEWER, &format!("/api/instances/{wf}")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["status"], "failed");
    assert_eq!(v["steps"][0]["error"]["message"], "the ledger refused the entry");
    let bars = v["timeline"].as_array().unwrap();
    assert!(!bars.is_empty(), "{v}");
    for f in ["queue_ms", "permit_ms", "execution_ms", "external_ms"] {
        assert!(bars[0][f].as_i64().unwrap() >= 0, "{f}");
    }
    // By business key too.
    let (s, v) = rig.get(VIEWER, "/api/instances/detail").await;
    assert_eq!((s, v["workflow_id"].as_str()), (StatusCode::OK, Some(wf.as_str())));
    let (s, _) = rig.get(VIEWER, "/api/instances/wf-nobody").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn lanes_and_the_audit_log_read() {
    let rig = Rig::new().await;
    rig.start("quick", "lane").await;
    let (s, v) = rig.get(VIEWER, "/api/lanes").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let lanes = v.as_array().unwrap();
    assert_eq!(lanes.len(), 4);
    assert_eq!(lanes.iter().map(|l| l["depth"].as_u64().unwrap()).sum::<u64>(), 1, "{v}");
    rig.settle().await;
    let (s, _) = rig.post(OPERATOR, "/api/lanes/rebuild", serde_json::json!({})).await;
    assert_eq!(s, StatusCode::OK);
    let (s, v) = rig.get(VIEWER, "/api/audit?actor=ana").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let items = v["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{v}");
    assert_eq!((items[0]["action"].as_str(), items[0]["result"].as_str()), (Some("rebuild"), Some("ok")));
    let (s, _) = rig.get(VIEWER, "/api/audit?limit=0").await;
    assert_eq!(s, StatusCode::OK, "0 is the default page");
}

#[tokio::test]
async fn metrics_are_served_in_the_prometheus_format_with_bounded_labels() {
    // A worker's metered ports and the lane gauges behind `GET /metrics`; no workflow id
    // is ever a label (the names and labels are pinned in kernel-metrics' snapshot).
    use tower::ServiceExt;
    let rig = Rig::new().await;
    let metrics = std::sync::Arc::new(kernel_metrics::Metrics::new());
    let ports = kernel_metrics::metered(rig.engine.ports().clone(), &metrics);
    let mut b = kernel_core::engine::Engine::builder(ports.clone());
    for d in crate::rig::definitions(rig.engine.ports().task_inbox.clone().unwrap()) {
        b = b.register(d);
    }
    let engine = b.build().unwrap();
    for key in ["m-1", "m-2"] {
        engine
            .publisher()
            .start_or_resume(kernel_core::StartRequest::new("quick", key, serde_json::json!({})))
            .await
            .unwrap();
    }
    engine
        .publisher()
        .start_or_resume(kernel_core::StartRequest::new("waiter", "m-3", serde_json::json!({})))
        .await
        .unwrap();
    while let kernel_core::engine::RoundOutcome::Ran { .. } = engine.tick().await.unwrap() {}
    let (sink, writer) = observer::Observer::start(
        std::sync::Arc::new(observer::InMemoryObservationRepository::new()),
        ports.clock.clone(),
        observer::ObserverConfig::default(),
    )
    .unwrap();
    let app = ops_server::metrics_router(metrics, ports.queue.clone(), ports.clock.clone(), Some(sink));
    let res = app.oneshot(axum::http::Request::get("/metrics").body(axum::body::Body::empty()).unwrap()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["content-type"], kernel_metrics::CONTENT_TYPE);
    let body = axum::body::to_bytes(res.into_body(), 1 << 20).await.unwrap();
    let text = String::from_utf8(body.to_vec()).unwrap();
    assert!(text.contains(r#"wfk_claims_total{result="won"} 3"#), "{text}");
    assert!(text.contains(r#"wfk_lane_depth{lane="p0"}"#), "{text}");
    assert!(text.contains("wfk_store_call_seconds_bucket"), "{text}");
    assert!(text.contains("wfk_observation_queue_depth 0"), "{text}");
    writer.close().await;
    let ids = rig.ops.list(&ops::ListFilter::default()).await.unwrap();
    for s in ids.items {
        assert!(!text.contains(s.workflow_id.as_str()) && !text.contains(&s.biz_key), "{}", s.workflow_id);
    }
}

#[tokio::test]
async fn the_task_inbox_pages_past_tasks_it_does_not_show() {
    // K-17.5: a page thinned by a stale task (its workflow ended) still has a next page.
    let rig = Rig::new().await;
    let t1 = rig.start("invoice", "t1").await;
    let t2 = rig.start("invoice", "t2").await;
    rig.settle().await;
    rig.ops.cancel(&ops::Actor::operator("olga"), &format!("id:{t1}")).await.unwrap();
    let (s, v) = rig.get(OPERATOR, "/api/tasks?limit=1").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(v["items"].as_array().unwrap().is_empty(), "t1's task is stale: {v}");
    let next = v["next"].as_str().expect("a next page after a thinned one").to_string();
    let (_, v) = rig.get(OPERATOR, &format!("/api/tasks?limit=1&after={}", urlencode(&next))).await;
    assert_eq!(v["items"][0]["workflow_id"], t2.as_str(), "{v}");
}

#[tokio::test]
async fn a_business_key_equal_to_another_workflow_s_id_neither_hides_nor_redirects_it() {
    // The pages address workflows as `id:<id>`; a bare reference that is both is refused.
    let rig = Rig::new().await;
    let victim = rig.start("waiter", "victim").await;
    rig.engine
        .publisher()
        .start_or_resume(
            kernel_core::StartRequest::new("quick", victim.clone(), serde_json::json!({})).workflow_id("other-1"),
        )
        .await
        .unwrap();
    rig.settle().await;
    let (s, _) = rig.get(VIEWER, &format!("/api/instances/{victim}")).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "ambiguous bare reference");
    let (s, v) = rig.get(VIEWER, &format!("/api/instances/{}", urlencode(&format!("id:{victim}")))).await;
    assert_eq!((s, v["workflow_id"].as_str()), (StatusCode::OK, Some(victim.as_str())), "{v}");
    let (s, _) = rig
        .post(OPERATOR, &format!("/api/instances/{}/cancel", urlencode(&format!("id:{victim}"))), serde_json::json!({}))
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(rig.status(&victim).await, kernel_core::WorkflowStatus::Canceled);
    // The page's own links and actions use the prefix.
    let js = include_str!("../../assets/app.js");
    assert!(js.contains(r#"enc("id:" + id)"#) && js.contains(r#"enc("id:" + view.workflow_id)"#));
}
