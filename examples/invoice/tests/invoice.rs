//! The invoice pipeline end to end: the story, one workflow per upload, a timeout that never
//! approves, and a small evaluation under every fault class (K-17.8) — counted by the fakes.

use invoice_pipeline::eval::{self, business, Case, FaultClass};
use invoice_pipeline::fakes::file_hash;
use invoice_pipeline::pipeline;
use invoice_pipeline::world::{run_batch, ApproverPlan, StoreKind, Upload};
use kernel_core::domain::{StepStatus, WorkflowStatus};
use kernel_tasks::{Concluded, HumanResult};
use std::collections::HashMap;

#[tokio::test(flavor = "current_thread")]
async fn the_story_runs_end_to_end() {
    let story = invoice_pipeline::story::run(1).await.expect("the story runs");
    println!("{story}");
    let last = story.lines().rfind(|l| l.starts_with("invoice-story:")).expect("the story's last line");
    assert!(last.contains("uploads=6 workflows=4"), "{last}");
    assert!(last.contains("posted_and_notified=3 compensated=1"), "{last}");
    assert!(last.contains("ledger_postings=4 ledger_reversals=1 mails=3 duplicate_side_effects=0"), "{last}");
    assert!(story.contains("the reply was lost; the ledger was asked and had it"), "{story}");
    assert!(story.contains("cfo decided Approve at level 1"), "{story}");
    assert!(story.contains("1 in the old schema re-sampled"), "{story}");
    assert!(story.contains("recorded as invoice@1 by the previous build"), "{story}");
    assert!(story.contains("compensation: post reversed after 1 attempt(s) → recovered"), "{story}");
}

fn big(approver: ApproverPlan, n: usize) -> Vec<Case> {
    let mut cases = eval::cases(FaultClass::SlowApprover, n, 11);
    for (k, c) in cases.iter_mut().enumerate() {
        c.approver = approver;
        c.doc.vendor = "V01".into();
        c.doc.number = format!("T-{k}");
        c.doc.period = eval::OPEN_PERIOD.into();
        c.reversal_failures = 0;
        c.file = c.doc.file();
        c.hash = file_hash(&c.file);
    }
    cases
}

#[tokio::test(flavor = "current_thread")]
async fn the_same_upload_twice_is_one_workflow() {
    let cases = big(ApproverPlan::Prompt, 1);
    let u = cases[0].upload();
    let uploads = vec![u.clone(), Upload { duplicate: true, ..u }];
    let run = run_batch(&StoreKind::Memory, 3, 0, HashMap::new(), &|t| business(t, &cases), &uploads, false)
        .await
        .expect("runs");
    assert_eq!(run.instances.len(), 1, "one workflow for one file");
    assert_eq!(run.instances[0].biz_key, cases[0].hash);
    assert_eq!(run.instances[0].status, WorkflowStatus::Completed);
    assert!(run.duplicate_uploads >= 2, "the upload was repeated: {}", run.duplicate_uploads);
    let (l, m) = (run.business.ledger.counts(), &run.business.mailer);
    assert_eq!((l.postings, l.duplicate_effects, m.total(), m.duplicates()), (1, 0, 1, 0));
    assert!(run.approver.duplicates > 0 && run.approver.duplicates_refused > 0, "{:?}", run.approver);
}

#[tokio::test(flavor = "current_thread")]
async fn a_timeout_never_approves() {
    let cases = big(ApproverPlan::Absent, 4);
    let uploads: Vec<Upload> = cases.iter().map(Case::upload).collect();
    let run = run_batch(&StoreKind::Memory, 5, 0, HashMap::new(), &|t| business(t, &cases), &uploads, false)
        .await
        .expect("runs");
    for c in &cases {
        let i = run.instances.iter().find(|i| i.biz_key == c.hash).expect("instance");
        assert_eq!(i.status, WorkflowStatus::Completed, "{}", i.workflow_id);
        let h = HumanResult::from_output(&i.output["approve"]).expect("an approval result");
        assert!(!h.approved());
        assert!(matches!(h.concluded, Concluded::Sla { .. }), "{h:?}");
        assert_eq!(h.level, 1, "escalated to the last level first");
        let post = i.steps.iter().find(|s| s.name == "post").expect("post");
        assert!(post.status == StepStatus::Skipped && post.not_taken());
        assert_eq!((run.business.ledger.net(&c.hash), run.business.mailer.sent(&c.hash)), (0, 0));
    }
    assert_eq!(run.business.ledger.counts().postings, 0, "nothing was posted");
    assert!(run.approver.delayed >= 4, "{:?}", run.approver);
}

#[tokio::test(flavor = "current_thread")]
async fn a_small_evaluation_keeps_every_promise_and_replays() {
    let e = eval::evaluate(48, 7, &StoreKind::Memory).await.expect("evaluates");
    let line = e.line();
    println!("{line}");
    let t = e.total();
    for (class, r) in &e.classes {
        assert!(r.kernel.injected > 0, "{} injected nothing: {line}", class.name());
        assert_eq!(r.kernel.duplicate_side_effects, 0, "{}", class.name());
        assert_eq!(r.kernel.unknown_states, 0, "{}", class.name());
    }
    assert_eq!(
        e.faults_injected_min(),
        e.classes.iter().filter(|(c, _)| *c != FaultClass::All).map(|(_, r)| r.kernel.injected).min().unwrap()
    );
    assert_eq!(t.kernel.invoices, 48);
    assert_eq!(e.verdict(), Ok(()));
    assert!(t.kernel.compensated > 0 && t.kernel.escalated > 0, "{line}");
    assert!(t.kernel.success > 0 && t.kernel.sla_met_pct() < 100.0, "{line}");
    assert!(e.classes.iter().any(|(c, r)| *c == FaultClass::OldSchema && r.kernel.migrated > 0), "{line}");
    assert!(line.starts_with("invoice-eval: invoices=48 fault_classes=7 "), "{line}");
    assert!(line.contains(" duplicate_side_effects=0 unknown_states=0 "), "{line}");
    // The same seed replays exactly, and SQLite tells the same story as memory.
    let again = eval::evaluate(48, 7, &StoreKind::Memory).await.expect("evaluates");
    assert_eq!(again.line(), line);
    assert_eq!(again.classes, e.classes.iter().map(|(c, r)| (*c, r.clone())).collect::<Vec<_>>());
    let dir = std::env::temp_dir().join(format!("invoice-test-{}", std::process::id()));
    let sqlite = eval::evaluate(48, 7, &StoreKind::Sqlite(dir.clone())).await;
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(sqlite.expect("evaluates on sqlite").line(), line);
    // Another seed is another run.
    assert_ne!(eval::evaluate(48, 8, &StoreKind::Memory).await.expect("evaluates").classes, e.classes);
}

#[tokio::test(flavor = "current_thread")]
async fn the_report_and_chart_are_written() {
    let e = eval::evaluate(16, 2, &StoreKind::Memory).await.expect("evaluates");
    let dir = std::env::temp_dir().join(format!("invoice-report-{}", std::process::id()));
    let (md, png) = invoice_pipeline::report::write(&e, &dir, "invoice evaluate --invoices 16", None).expect("written");
    let text = std::fs::read_to_string(&md).expect("markdown");
    let bytes = std::fs::read(&png).expect("png");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(text.contains("invoice evaluate --invoices 16") && text.contains(&e.line()));
    assert!(text.contains("| **overall** |"));
    assert_eq!(&bytes[1..4], b"PNG");
    assert_eq!(pipeline::workflow_id(&"a".repeat(64)).len(), 28);
}

/// The pipeline on PostgreSQL (a fresh schema per batch, dropped afterwards) tells the same
/// seeded story as in memory: the store changes nothing the fakes count.
#[tokio::test(flavor = "current_thread")]
async fn postgres_tells_the_same_story_as_memory() {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let probe = store_postgres::connect(&url, &Default::default()).expect("a valid URL");
    if let Err(e) = probe.get().await {
        return testkit::ci::skip_or_fail("postgres_tells_the_same_story_as_memory", &format!("PostgreSQL: {e}"))
            .unwrap_or(());
    }
    let memory = eval::evaluate(16, 3, &StoreKind::Memory).await.expect("evaluates in memory");
    let pg = eval::evaluate(16, 3, &StoreKind::Postgres(url)).await;
    invoice_pipeline::world::drop_scratch().await;
    let pg = pg.expect("evaluates on postgres");
    assert_eq!(pg.line(), memory.line());
    assert_eq!(pg.classes, memory.classes);
}
