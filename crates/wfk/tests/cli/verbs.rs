//! Every verb of `wfk` on SQLite, with its exit code.

use crate::fixture::{normalize, snapshot, Fixture};
use kernel_core::{StepStatus, WorkflowStatus};
use predicates_lite::*;

mod predicates_lite {
    /// Whether `text` contains every needle.
    pub fn has(text: &str, needles: &[&str]) -> bool {
        needles.iter().all(|n| text.contains(n))
    }
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_list_show_lanes_and_their_filters() {
    // K-15 (lists from the projection), K-4.2, K-17.3 (model calls shown)
    let f = Fixture::sqlite().await;
    f.populate().await;

    let (code, out, err) = f.wfk(&["list"]).await;
    assert_eq!(code, 0, "{err}");
    // Seven workflows (six started, one dispatched).
    assert_eq!(out.lines().count(), 8, "{out}");
    let (code, out, _) = f.wfk(&["list", "--status", "failed"]).await;
    assert_eq!(code, 0);
    let mut failed: Vec<&str> = out.lines().skip(1).map(|l| l.split_whitespace().next().unwrap()).collect();
    failed.sort();
    assert_eq!(failed.len(), 2, "order-2 and the dispatched round: {out}");
    assert!(failed.contains(&"wf-order-2"));
    snapshot(
        "list_type_order_failed.txt",
        &normalize(&f.wfk(&["list", "--type", "order", "--biz-key-prefix", "order-"]).await.1),
    );

    let (_, out, _) = f.wfk(&["list", "--waiting-on", "go"]).await;
    assert!(has(&out, &["wf-gate-1"]) && !out.contains("wf-draft-1"), "{out}");
    let (_, out, _) = f.wfk(&["list", "--failed-since", "1h", "--json"]).await;
    assert_eq!(json(&out)["items"].as_array().unwrap().len(), 2);
    let (_, out, _) = f.wfk(&["list", "--failed-since", "0", "--type", "gate"]).await;
    assert_eq!(out.lines().count(), 1, "header only: {out}");

    // Paging: three pages of 3, 3 and 1 cover all seven exactly once.
    let mut seen = vec![];
    let mut cursor: Option<String> = None;
    for _ in 0..4 {
        let mut args = vec!["list", "--json", "--limit", "3"];
        if let Some(c) = cursor.as_deref() {
            args.extend(["--cursor", c]);
        }
        let (code, out, _) = f.wfk(&args).await;
        assert_eq!(code, 0);
        let page = json(&out);
        seen.extend(page["items"].as_array().unwrap().iter().map(|s| s["workflow_id"].as_str().unwrap().to_string()));
        match page["next"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!((seen.len(), unique.len()), (7, 7), "{seen:?}");

    // Show by id and by business key; the same workflow.
    let (code, by_id, _) = f.wfk(&["show", "wf-order-2"]).await;
    assert_eq!(code, 0);
    let (_, by_key, _) = f.wfk(&["show", "order-2"]).await;
    assert_eq!(by_id, by_key);
    // The timeline's spans are wall time: pinned up to it, checked by shape below.
    let (head, timeline) = by_id.split_at(by_id.find("TIMELINE").expect("a timeline"));
    snapshot("show_failed_order.txt", &normalize(head));
    let steps: Vec<&str> = timeline.lines().skip(1).map(|l| l.split_whitespace().next().unwrap()).collect();
    assert_eq!(steps, ["reserve", "charge"], "in the order they ran: {timeline}");
    let (_, out, _) = f.wfk(&["show", "gate-1", "--json"]).await;
    let v = json(&out);
    assert_eq!(v["status"], "waiting");
    assert_eq!(v["wait"]["signal_type"], "go");
    assert!(!v["timeline"].as_array().unwrap().is_empty(), "{v}");
    let (_, out, _) = f.wfk(&["lanes", "--json"]).await;
    let lanes = json(&out);
    assert_eq!(lanes.as_array().unwrap().len(), 4);
    assert!(lanes.as_array().unwrap().iter().map(|l| l["pops"].as_u64().unwrap()).sum::<u64>() >= 7, "{lanes}");

    // Not found (1) and bad input (2).
    let (code, _, err) = f.wfk(&["show", "wf-nope"]).await;
    assert_eq!(code, 1, "{err}");
    let (code, _, _) = f.wfk(&["list", "--cursor", "zzz"]).await;
    assert_eq!(code, 2);
    let (code, _, _) = f.wfk(&["list", "--status", "sleeping"]).await;
    assert_eq!(code, 2);
    let (code, _, _) = f.wfk(&["list", "--limit", "100000"]).await;
    assert_eq!(code, 2);
    let (code, _, _) = f.wfk(&["list", "--failed-since", "3 weeks"]).await;
    assert_eq!(code, 2);
    let (code, _, _) = f.wfk(&["list", "--failed-since", "5é"]).await;
    assert_eq!(code, 2, "a unit that is not ASCII is bad input, not a panic");
    f.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_signal_cancel_replay_retry_regenerate_and_the_audit_log() {
    // K-9.3 (signal), K-8 (cancel), K-5 (replay), K-11.4 (retry-failed), K-17.3
    // (regenerate), K-6.4 (a guard that no longer matches is a refusal: exit 3)
    let f = Fixture::sqlite().await;
    f.populate().await;

    // signal: the gate opens; the wait key and generation come from the wait.
    let (code, out, err) = f.wfk(&["signal", "gate-1", "go"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("delivered"), "{out}");
    f.settle().await;
    assert_eq!(f.instance("wf-gate-1").await.status, WorkflowStatus::Completed);
    // A signal type it does not wait on, without a key: bad input.
    let (code, _, _) = f.wfk(&["signal", "order-1", "go"]).await;
    assert_eq!(code, 2);

    // regenerate the draft's `write` while it waits in `publish`.
    let before = f.instance("wf-draft-1").await;
    let (code, out, err) = f.wfk(&["regenerate", "draft-1", "write"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("epoch 1"), "{out}");
    f.settle().await;
    let after = f.instance("wf-draft-1").await;
    assert_eq!((before.steps[0].epoch, after.steps[0].epoch), (0, 1));
    let (code, _, _) = f.wfk(&["regenerate", "draft-1", "nope"]).await;
    assert_eq!(code, 2);

    // replay: the failed order runs again (and fails again: its input says so).
    let (code, out, err) = f.wfk(&["replay", "order-2"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("run 1"), "{out}");
    f.settle().await;
    assert_eq!(f.instance("wf-order-2").await.retry_count, 1);
    // The dispatched round refuses a replay and points to retry-failed (exit 3).
    let round = f.dispatch.outbox().get(&"obj-1".into()).await.unwrap().unwrap();
    let first = round.dispatch.clone().unwrap();
    let round_wf = f.engine.ports().store.get_by_biz_key("round-1").await.unwrap().unwrap();
    assert_eq!(round_wf.status, WorkflowStatus::Failed);
    let (code, _, err) = f.wfk(&["replay", round_wf.workflow_id.as_str()]).await;
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("retry-failed"), "{err}");
    // retry-failed: a new round with a new token.
    let (code, out, err) = f.wfk(&["retry-failed", "obj-1", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert_eq!(v["detail"]["previous_round"], first.fencing_token.as_str());
    assert_ne!(v["detail"]["round"], first.fencing_token.as_str());
    f.settle().await;
    assert_eq!(f.engine.ports().store.get_by_biz_key("round-1").await.unwrap().unwrap().retry_count, 1);
    let (code, _, _) = f.wfk(&["retry-failed", "obj-none"]).await;
    assert_eq!(code, 1);

    // cancel: the waiting review; a completed one is refused (exit 3, K-6.4).
    let (code, _, err) = f.wfk(&["cancel", "order-1"]).await;
    assert_eq!(code, 3, "{err}");
    let (code, _, err) = f.wfk(&["cancel", "wf-review-1"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(f.instance("wf-review-1").await.status, WorkflowStatus::Canceled);

    // Every action is in the audit log, refused ones too, newest first.
    f.settle().await;
    let (code, out, _) = f.wfk(&["audit", "--json"]).await;
    assert_eq!(code, 0);
    let entries = json(&out);
    let rows: Vec<(String, String)> = entries
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["action"].as_str().unwrap().to_string(), e["result"].as_str().unwrap().to_string()))
        .collect();
    let want = [
        ("cancel", "ok"),
        ("cancel", "refused"),
        ("retry-failed", "not_found"),
        ("retry-failed", "ok"),
        ("replay", "refused"),
        ("replay", "ok"),
        ("regenerate", "bad_input"),
        ("regenerate", "ok"),
        ("signal", "bad_input"),
        ("signal", "ok"),
    ];
    assert_eq!(rows, want.iter().map(|(a, r)| (a.to_string(), r.to_string())).collect::<Vec<_>>());
    assert!(entries.as_array().unwrap().iter().all(|e| e["actor"] == "wfk" && e["role"] == "operator"));
    let (_, out, _) = f.wfk(&["audit", "--action", "cancel", "--json"]).await;
    assert_eq!(json(&out).as_array().unwrap().len(), 2);
    f.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_and_human_tasks() {
    // K-17.2 (dead-letter decisions), K-17.5 (tasks: eligibility by role, the token never shown)
    let f = Fixture::sqlite().await;
    f.populate().await;
    let (code, out, _) = f.wfk(&["dlq", "list", "--json"]).await;
    assert_eq!(code, 0);
    let dls = json(&out);
    assert_eq!(dls.as_array().unwrap().len(), 1, "{dls}");
    let id = dls[0]["id"].as_str().unwrap().to_string();
    assert_eq!(dls[0]["workflow_id"], "wf-ingest-1");
    let (code, out, err) =
        f.wfk(&["dlq", "complete", &id, "--output", r#"{"parsed": true}"#, "--reason", "fixed by hand"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("decided"));
    f.settle().await;
    let inst = f.instance("wf-ingest-1").await;
    assert_eq!((inst.status, inst.steps[0].status), (WorkflowStatus::Completed, StepStatus::Completed));
    // Decided already: refused; unknown: not found; bad JSON: bad input.
    for (verb, code_want) in [("retry", 3), ("fail", 3)] {
        let (code, _, _) = f.wfk(&["dlq", verb, &id]).await;
        assert_eq!(code, code_want, "{verb}");
    }
    let (code, _, _) = f.wfk(&["dlq", "retry", "dl-none"]).await;
    assert_eq!(code, 1);
    let (code, _, _) = f.wfk(&["dlq", "complete", &id, "--output", "{nope"]).await;
    assert_eq!(code, 2);
    let (_, out, _) = f.wfk(&["dlq", "list", "--status", "open"]).await;
    assert_eq!(out.lines().count(), 1, "header only: {out}");
    // Retry: the step runs again in its next epoch (and, failing again, is dead-lettered
    // again under a new id).
    f.engine
        .publisher()
        .start_or_resume(
            kernel_core::StartRequest::new("ingest", "ingest-2", serde_json::json!({})).workflow_id("wf-ingest-2"),
        )
        .await
        .unwrap();
    f.settle().await;
    let open = json(&f.wfk(&["dlq", "list", "--status", "open", "--json"]).await.1);
    let first = open[0]["id"].as_str().unwrap().to_string();
    let (code, _, err) = f.wfk(&["dlq", "retry", &first, "--reason", "parser fixed"]).await;
    assert_eq!(code, 0, "{err}");
    f.settle().await;
    assert_eq!(f.instance("wf-ingest-2").await.steps[0].epoch, 1, "a new logical attempt");
    let open = json(&f.wfk(&["dlq", "list", "--status", "open", "--json"]).await.1);
    assert_eq!(open.as_array().unwrap().len(), 1, "{open}");
    assert_ne!(open[0]["id"].as_str().unwrap(), first);

    // Tasks: only an actor with the role sees and decides them.
    let (code, out, _) = f.wfk(&["tasks", "list", "--json"]).await;
    assert_eq!((code, json(&out)["items"].as_array().unwrap().len()), (0, 0), "no roles, no tasks");
    let (code, out, _) = f.wfk(&["--roles", "finance", "tasks", "list", "--json"]).await;
    assert_eq!(code, 0);
    let tasks = json(&out)["items"].clone();
    assert_eq!(tasks.as_array().unwrap().len(), 1);
    assert_eq!(tasks[0]["token"], "(hidden)");
    let task = tasks[0]["id"].as_str().unwrap().to_string();
    let (code, out, _) = f.wfk(&["--roles", "finance", "tasks", "show", &task]).await;
    assert_eq!(code, 0);
    assert!(out.contains("Approve invoice") && !out.contains(&f.task_token(&task).await), "{out}");
    let (code, _, _) = f.wfk(&["tasks", "approve", &task]).await;
    assert_eq!(code, 3, "not eligible");
    let (code, _, err) =
        f.wfk(&["--roles", "finance", "--actor", "fin-1", "tasks", "approve", &task, "--reason", "ok"]).await;
    assert_eq!(code, 0, "{err}");
    f.settle().await;
    assert_eq!(f.instance("wf-review-1").await.status, WorkflowStatus::Completed);
    let (code, _, _) = f.wfk(&["--roles", "finance", "tasks", "reject", &task]).await;
    assert_eq!(code, 3, "decided already: refused");
    f.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_actions_show_what_they_would_touch_until_confirmed() {
    // K-8 (cancel), K-5 (replay); bulk actions are bounded and act only on the set printed
    let f = Fixture::sqlite().await;
    f.populate().await;
    let (code, out, _) = f.wfk(&["cancel", "--type", "gate", "--json"]).await;
    assert_eq!(code, 3, "not confirmed: nothing done");
    let plan = json(&out);
    assert_eq!(plan["would_touch"], serde_json::json!(["wf-gate-1"]));
    let gate_code = plan["confirm"].as_str().unwrap().trim_start_matches("--yes ").to_string();
    assert_eq!(f.instance("wf-gate-1").await.status, WorkflowStatus::Waiting);
    // A code for another set (here: another action's) refuses and does nothing.
    let (_, out, _) = f.wfk(&["replay", "--type", "gate", "--json"]).await;
    let other = json(&out)["confirm"].as_str().unwrap().trim_start_matches("--yes ").to_string();
    assert_ne!(other, gate_code);
    let (code, _, err) = f.wfk(&["cancel", "--type", "gate", "--yes", &other]).await;
    assert_eq!(code, 3, "{err}");
    assert_eq!(f.instance("wf-gate-1").await.status, WorkflowStatus::Waiting);
    // A set that grew since it was printed refuses too.
    f.engine
        .publisher()
        .start_or_resume(
            kernel_core::StartRequest::new("gate", "gate-2", serde_json::json!({})).workflow_id("wf-gate-2"),
        )
        .await
        .unwrap();
    f.settle().await;
    let (code, _, err) = f.wfk(&["cancel", "--type", "gate", "--yes", &gate_code]).await;
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("changed"), "{err}");
    assert_eq!(f.instance("wf-gate-2").await.status, WorkflowStatus::Waiting);
    let (_, out, _) = f.wfk(&["cancel", "--type", "gate", "--json"]).await;
    let both = json(&out)["confirm"].as_str().unwrap().trim_start_matches("--yes ").to_string();
    let (code, out, err) = f.wfk(&["cancel", "--type", "gate", "--yes", &both]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(f.instance("wf-gate-1").await.status, WorkflowStatus::Canceled);
    assert_eq!(f.instance("wf-gate-2").await.status, WorkflowStatus::Canceled);
    // Replay every failed `order`: one is a dispatch round (refused, exit 3), one replays.
    let (_, out, _) = f.wfk(&["replay", "--status", "failed", "--type", "order", "--json"]).await;
    let code_failed = json(&out)["confirm"].as_str().unwrap().trim_start_matches("--yes ").to_string();
    let (code, out, _) =
        f.wfk(&["replay", "--status", "failed", "--type", "order", "--yes", &code_failed, "--json"]).await;
    assert_eq!(code, 3, "one refused: {out}");
    let results = json(&out);
    let ok = results.as_array().unwrap().iter().filter(|r| r["result"] == "ok").count();
    assert_eq!(ok, 1, "{results}");
    assert_eq!(f.instance("wf-order-2").await.retry_count, 1);
    // An id and filters together, or neither, or --yes on one workflow: bad input.
    assert_eq!(f.wfk(&["cancel", "wf-order-1", "--type", "order"]).await.0, 2);
    assert_eq!(f.wfk(&["cancel"]).await.0, 2);
    assert_eq!(f.wfk(&["cancel", "wf-order-1", "--yes", "x"]).await.0, 2);
    f.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_that_is_one_workflow_s_id_and_another_s_key_is_refused_as_ambiguous() {
    // Ids are caller-chosen: `dup-1` is the id of one workflow and the business key of another.
    let f = Fixture::sqlite().await;
    let p = f.engine.publisher();
    let start =
        |key: &str, id: &str| kernel_core::StartRequest::new("gate", key, serde_json::json!({})).workflow_id(id);
    p.start_or_resume(start("a-key", "dup-1")).await.unwrap();
    p.start_or_resume(start("dup-1", "wf-b")).await.unwrap();
    f.settle().await;
    let (code, _, err) = f.wfk(&["cancel", "dup-1"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("id:dup-1") && err.contains("key:dup-1"), "{err}");
    assert_eq!(f.instance("dup-1").await.status, WorkflowStatus::Waiting);
    assert_eq!(f.instance("wf-b").await.status, WorkflowStatus::Waiting);
    let (code, _, err) = f.wfk(&["cancel", "key:dup-1"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(f.instance("wf-b").await.status, WorkflowStatus::Canceled);
    assert_eq!(f.instance("dup-1").await.status, WorkflowStatus::Waiting);
    // The audit entry names the workflow the reference resolved to.
    let audit = json(&f.wfk(&["audit", "--action", "cancel", "--json"]).await.1);
    assert_eq!(audit[0]["detail"]["done"]["workflow_id"], "wf-b", "{audit}");
    assert_eq!(f.wfk(&["show", "id:dup-1"]).await.0, 0);
    assert_eq!(f.wfk(&["show", "key:a-key"]).await.0, 0);
    assert_eq!(f.wfk(&["show", "id:a-key"]).await.0, 1);
    f.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_migrate_rebuild_and_check_deploy() {
    // K-14 (permit limits read on every acquire), K-13 (lanes rebuilt from the store), K-4.2
    let f = Fixture::sqlite().await;
    f.populate().await;
    let (code, out, err) = f.wfk(&["permits", "set", "asr", "--max-concurrency", "3"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("max_concurrency=3"));
    let u = f.engine.ports().permits.usage("asr").await.unwrap();
    assert_eq!(u.limits.max_concurrency, 3, "read back through the port");
    snapshot("permits.txt", &normalize(&f.wfk(&["permits"]).await.1));
    let (code, _, _) = f.wfk(&["permits", "set", "$bad", "--max-concurrency", "1"]).await;
    assert_eq!(code, 2);

    let (code, out, _) = f.wfk(&["migrate"]).await;
    assert_eq!(code, 0);
    assert!(out.contains("schema version"), "{out}");

    // A started workflow nobody ran yet, its candidate lost: rebuild offers it again.
    f.engine
        .publisher()
        .start_or_resume(
            kernel_core::StartRequest::new("order", "order-9", serde_json::json!({})).workflow_id("wf-order-9"),
        )
        .await
        .unwrap();
    let queue = f.engine.ports().queue.clone();
    let now = f.engine.ports().clock.now();
    let _ =
        queue.pop_due(now.saturating_add(kernel_core::DurationMs::from_millis(86_400_000_000)), 1_000).await.unwrap();
    let (code, out, err) = f.wfk(&["rebuild"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("rebuild: started"), "plain progress lines off a terminal: {err}");
    let offered: u64 = out.split_whitespace().find_map(|w| w.parse().ok()).unwrap();
    let depth: u64 = queue.stats(now).await.unwrap().iter().map(|s| s.depth).sum();
    assert_eq!(offered, depth, "{out}");
    assert_eq!(offered, 1, "the running workflow; waits come back by the timer scan: {out}");

    // check-deploy: the same definitions park nothing; a changed `gate` parks its waiter.
    let dir = tempfile::tempdir().unwrap();
    let inbox = f.engine.ports().task_inbox.clone().unwrap();
    let same = ops::DeployManifest::of(&crate::fixture::all_definitions(inbox.clone()));
    let path = dir.path().join("same.json");
    std::fs::write(&path, serde_json::to_string(&same).unwrap()).unwrap();
    let (code, out, err) = f.wfk(&["check-deploy", path.to_str().unwrap()]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("0 would park"), "{out}");
    let mut changed = same.clone();
    changed.definitions.retain(|d| d.workflow_type != "review");
    changed.definitions.iter_mut().filter(|d| d.workflow_type == "gate").for_each(|d| d.fingerprint = "0".repeat(64));
    std::fs::write(&path, serde_json::to_string(&changed).unwrap()).unwrap();
    let (code, out, _) = f.wfk(&["check-deploy", path.to_str().unwrap(), "--json"]).await;
    assert_eq!(code, 3, "would park: {out}");
    let report = json(&out);
    assert_eq!(report["would_park"], 2, "{report}");
    snapshot("check_deploy.txt", &normalize(&f.wfk(&["check-deploy", path.to_str().unwrap()]).await.1));
    std::fs::write(&path, "{").unwrap();
    assert_eq!(f.wfk(&["check-deploy", path.to_str().unwrap()]).await.0, 2);
    f.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stock_binary_reads_its_urls_from_the_environment_and_exits_with_meaning() {
    // The process surface: environment, exit codes, stdout/stderr, --help.
    let f = Fixture::sqlite().await;
    f.populate().await;
    let out = f.bin().args(["list", "--json"]).assert().success().get_output().stdout.clone();
    assert_eq!(json(&String::from_utf8(out).unwrap())["items"].as_array().unwrap().len(), 7);
    f.bin().args(["show", "wf-none"]).assert().code(1);
    f.bin().args(["frobnicate"]).assert().code(2);
    f.bin().args(["cancel", "order-1"]).assert().code(3);
    // Without its definitions, regenerate is bad input and names what is missing.
    let out = f.bin().args(["regenerate", "draft-1", "write"]).assert().code(2).get_output().stderr.clone();
    assert!(String::from_utf8(out).unwrap().contains("draft"));
    // retry-failed needs the definition of the type the new round starts: refused before
    // anything is written (the round stays the failed one).
    f.bin().args(["retry-failed", "obj-1"]).assert().code(2);
    let rec = f.dispatch.outbox().get(&"obj-1".into()).await.unwrap().unwrap();
    assert_eq!((rec.dispatch.unwrap().fencing_token.as_str(), rec.business_status.as_deref()), ("f-1", Some("failed")));
    f.bin().env("WFK_ACTOR", "ann").args(["cancel", "gate-1"]).assert().success();
    let out = f.bin().args(["audit", "--json", "--by", "ann"]).assert().success().get_output().stdout.clone();
    assert_eq!(json(&String::from_utf8(out).unwrap()).as_array().unwrap().len(), 1);
    // Unavailable (4): a store nobody serves.
    assert_cmd::Command::cargo_bin("wfk")
        .unwrap()
        .args(["--store", "postgres://postgres@127.0.0.1:1/none", "--queue", "local", "list"])
        .assert()
        .code(4);
    // A server store without a queue: bad input before connecting (a process-local queue
    // would take permits, rebuilds and wakeups into nothing).
    let out = assert_cmd::Command::cargo_bin("wfk")
        .unwrap()
        .env_remove("WFK_QUEUE")
        .args(["--store", "postgres://postgres@127.0.0.1:1/none", "lanes"])
        .assert()
        .code(2)
        .get_output()
        .stderr
        .clone();
    assert!(String::from_utf8(out).unwrap().contains("--queue"));
    // No store at all: bad input.
    assert_cmd::Command::cargo_bin("wfk").unwrap().env_remove("WFK_STORE").args(["list"]).assert().code(2);
    assert_cmd::Command::cargo_bin("wfk").unwrap().arg("--help").assert().success();
    f.destroy().await;
}
