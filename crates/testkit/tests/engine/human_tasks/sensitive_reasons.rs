//! A sensitive reason stays on the task record (K-17.5): not in the instance, the observations,
//! the stream or the log, and purged after retention; a plain reason is in the step output.

use super::*;
use kernel_core::ports::*;
use kernel_core::*;
use kernel_tasks::{Concluded, Level};
use std::io::Write;
use std::sync::{Arc, Mutex};

/// A log buffer for a subscriber of this test's thread.
#[derive(Clone, Default)]
struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl Write for LogBuf {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogBuf {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

const SECRET: &str = "medical leave";

/// A workflow whose review a person rejects with a sensitive reason while the doorbell is
/// down (the desk logs the failed ring; the step takes the decision at its poll), run to
/// its end with every log line captured.
struct Sensitive {
    r: Rig,
    wf: String,
    task: TaskRecord,
    logs: LogBuf,
    decided_at: Instant,
    reason: TaskReason,
    _guard: tracing::subscriber::DefaultGuard,
}

async fn sensitive_run(seed: u64) -> Sensitive {
    let logs = LogBuf::default();
    let w = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || w.clone())
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    let r = Rig::with_post(seed, |_, b| b.level(Level::roles(["finance"]).sla(mins(60))), true);
    let wf = r.start("inv-10").await;
    r.settle().await;
    let task = r.at_level(&wf, 0);
    let (deaf, _) = deaf_desk(&r);
    r.world.clock.advance(mins(3));
    let decided_at = r.now();
    let reason = TaskReason { sensitive: true, text: Some(SECRET.into()) };
    let out = deaf.decide(&task.id, &task.token, &finance("alice"), TaskOutcome::Reject, Some(reason.clone())).await;
    assert_eq!(out.unwrap(), TaskDecideOutcome::Decided);
    r.world.clock.set(task.due_at);
    r.settle().await;
    assert_eq!(r.instance(&wf).await.status, WorkflowStatus::Completed);
    Sensitive { r, wf, task, logs, decided_at, reason, _guard: guard }
}

/// K-17.5, place 1: the instance (the step's output) says a sensitive reason was given,
/// never its text.
#[tokio::test]
async fn a_sensitive_reason_is_not_in_the_instance() {
    let s = sensitive_run(10).await;
    let res = s.r.result(&s.wf).await;
    assert_eq!(
        res.concluded,
        Concluded::Person {
            outcome: TaskOutcome::Reject,
            actor: "alice".into(),
            decided_at: s.decided_at,
            reason: Some(TaskReason { sensitive: true, text: None }),
        }
    );
    let inst = serde_json::to_string(&s.r.instance(&s.wf).await).unwrap();
    assert!(inst.contains("\"sensitive\":true"), "the instance says a sensitive reason was given");
    assert!(!inst.contains(SECRET), "not in the instance: {inst}");
}

/// K-17.5, place 2: the observer's rows and snapshots never carry the text.
#[tokio::test]
async fn a_sensitive_reason_is_not_in_the_observations() {
    let s = sensitive_run(12).await;
    let events = s.r.world.observations.events();
    assert!(!events.is_empty());
    assert!(!format!("{events:?}").contains(SECRET), "not in the observations");
}

/// K-17.5, place 3: the progress stream carries the review's output without the text.
#[tokio::test]
async fn a_sensitive_reason_is_not_in_the_stream() {
    let s = sensitive_run(13).await;
    let keys = s.r.world.streams.keys();
    assert_eq!(keys.len(), 1, "post streamed");
    let streamed = format!("{:?}", keys.iter().map(|k| s.r.world.streams.get(k)).collect::<Vec<_>>());
    assert!(streamed.contains("sensitive"), "the stream carried the review's output: {streamed}");
    assert!(!streamed.contains(SECRET), "not in the stream: {streamed}");
}

/// K-17.5, place 4: no log line carries a reason (the failed ring is logged by task id).
#[tokio::test]
async fn a_sensitive_reason_is_never_logged() {
    let s = sensitive_run(14).await;
    let logged = s.logs.text();
    assert!(logged.contains("did not ring") && logged.contains(&s.task.id), "the failed ring is logged: {logged}");
    assert!(!logged.contains(SECRET), "not in the logs: {logged}");
}

/// K-17.5, place 5: the task record keeps the text until the retention purge removes it;
/// the decision (outcome, actor, time, the sensitive flag) stays.
#[tokio::test]
async fn a_sensitive_reason_is_purged_from_the_task_record_after_retention() {
    let s = sensitive_run(15).await;
    let (r, task) = (&s.r, &s.task);
    let rec = r.record(&task.id).await;
    assert_eq!(
        rec.decision.as_ref().and_then(|d| d.reason.clone()),
        Some(s.reason.clone()),
        "the record keeps the text"
    );
    let retention = DurationMs::from_millis(30 * 24 * 60 * MIN);
    assert_eq!(r.desk.purge_sensitive_reasons(retention, 100).await.unwrap(), 0, "too recent");
    assert_eq!(r.record(&task.id).await, rec);
    r.world.clock.advance(retention);
    r.world.clock.advance(1);
    assert_eq!(r.desk.purge_sensitive_reasons(retention, 100).await.unwrap(), 1);
    let purged = r.record(&task.id).await;
    let d = purged.decision.as_ref().expect("the decision stays");
    assert_eq!((d.outcome, d.actor.as_str(), d.decided_at), (TaskOutcome::Reject, "alice", s.decided_at));
    assert_eq!(d.reason, Some(TaskReason { sensitive: true, text: None }), "the text is gone");
    assert_eq!(TaskRecord { decision: rec.decision.as_ref().map(TaskDecision::redacted), ..rec }, purged);
    assert_eq!(r.desk.purge_sensitive_reasons(retention, 100).await.unwrap(), 0, "idempotent");
}

/// K-17.5: a reason that is not sensitive is recorded in the step's output.
#[tokio::test]
async fn a_plain_reason_is_in_the_step_output() {
    let r = Rig::new(11, |_, b| b.level(Level::roles(["finance"]).sla(mins(60))));
    let wf = r.start("inv-11").await;
    r.settle().await;
    let task = r.at_level(&wf, 0);
    let reason = TaskReason { sensitive: false, text: Some("duplicate of invoice 6".into()) };
    let out = r.desk.decide(&task.id, &task.token, &finance("alice"), TaskOutcome::Reject, Some(reason.clone())).await;
    assert_eq!(out.unwrap(), TaskDecideOutcome::Decided);
    r.settle().await;
    assert!(matches!(r.result(&wf).await.concluded, Concluded::Person { reason: Some(ref x), .. } if *x == reason));
    // The purge leaves it alone.
    r.world.clock.advance(mins(60 * 24 * 400));
    assert_eq!(r.desk.purge_sensitive_reasons(mins(1), 100).await.unwrap(), 0);
    assert_eq!(r.record(&task.id).await.decision.and_then(|d| d.reason), Some(reason));
}
