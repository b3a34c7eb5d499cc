//! The story: a handful of invoices end to end in memory, told from the stored instances
//! and the fakes.

use crate::eval::{business, Case, CLOSED_PERIOD, OPEN_PERIOD};
use crate::fakes::{file_hash, Document, Line};
use crate::pipeline;
use crate::world::{run_batch, ApproverPlan, BatchRun, StoreKind, Upload};
use kernel_core::domain::{StepStatus, WorkflowInstance};
use kernel_core::record::RecordEntry;
use kernel_tasks::{Concluded, HumanResult};
use std::collections::HashMap;
use std::fmt::Write as _;

fn doc(vendor: &str, number: &str, period: &str, lines: &[i64]) -> Document {
    let lines: Vec<Line> =
        lines.iter().enumerate().map(|(i, a)| Line { description: format!("item {i}"), amount_cents: *a }).collect();
    let net: i64 = lines.iter().map(|l| l.amount_cents).sum();
    let tax = net * pipeline::TAX_PERCENT / 100;
    Document {
        vendor: vendor.into(),
        number: number.into(),
        currency: "EUR".into(),
        period: period.into(),
        lines,
        tax_cents: tax,
        total_cents: net + tax,
    }
}

/// The story's invoices: a small one whose posting reply is lost, a large one uploaded
/// twice and approved, a large one whose first extraction is in the old schema and whose
/// approver is absent (the CFO approves), and one in a closed period that is compensated.
pub fn cases() -> Vec<Case> {
    let mk = |d: Document, approver, duplicate, lose_reply, old_answers| {
        let file = d.file();
        Case {
            hash: file_hash(&file),
            file,
            doc: d,
            approver,
            duplicate,
            lose_reply,
            restart_at: None,
            old_answers,
            reversal_failures: 0,
        }
    };
    vec![
        mk(doc("V01", "A-1001", OPEN_PERIOD, &[12_000, 30_550]), ApproverPlan::Prompt, false, true, 0),
        mk(doc("V02", "B-2002", OPEN_PERIOD, &[450_000, 80_000]), ApproverPlan::Prompt, true, false, 0),
        mk(doc("V03", "C-3003", OPEN_PERIOD, &[600_000]), ApproverPlan::AbsentThenCfo, false, false, 1),
        mk(doc("V04", "D-4004", CLOSED_PERIOD, &[99_000]), ApproverPlan::Prompt, false, false, 0),
    ]
}

fn eur(cents: i64) -> String {
    format!("{}.{:02} EUR", cents / 100, (cents % 100).abs())
}

fn hours(ms: i64) -> String {
    if ms >= 3_600_000 {
        format!("{:.1} h", ms as f64 / 3_600_000.0)
    } else {
        format!("{} min", ms / 60_000)
    }
}

fn tell(out: &mut String, c: &Case, i: &WorkflowInstance, run: &BatchRun) {
    let b = &run.business;
    let _ = writeln!(
        out,
        "\ninvoice {} of {} ({}), file sha256:{}… → workflow {} ({})",
        c.doc.number,
        c.doc.vendor,
        eur(c.doc.total_cents),
        &c.hash[..12],
        i.workflow_id,
        i.status.as_str()
    );
    for s in &i.steps {
        let value = |k: &str| i.output.get(&s.name).map(|o| o[k].clone()).unwrap_or_default();
        let out_of = |k: &str| {
            let v = value(k);
            v.as_str().map_or_else(|| v.to_string(), str::to_string)
        };
        let what = match (s.name.as_str(), s.status) {
            (_, StepStatus::Skipped) if s.not_taken() => "not taken".to_string(),
            ("receive", _) => format!("upload of {} bytes, hash is the business key", out_of("bytes")),
            ("extract", _) => {
                let (mut samples, mut invalid, mut cost, mut migrated) = (0, 0, 0, String::new());
                for e in s.record.iter().flat_map(|r| r.entries.iter()) {
                    if let RecordEntry::Model(m) = e {
                        samples += m.samples.len();
                        invalid += m.samples.iter().filter(|x| !x.errors.is_empty()).count();
                        cost += m.samples.iter().map(|x| x.usage.cost_micros).sum::<u64>();
                        for g in &m.migrations {
                            let _ = write!(
                                migrated,
                                "; recorded as invoice@{} by the previous build, the engine restarted on the current build and migrated it to invoice@{} without asking the model again",
                                g.from, g.to
                            );
                        }
                    }
                }
                format!(
                    "model fake-extractor@7, schema invoice@2: {samples} sample(s), {invalid} in the old schema re-sampled, cost {cost} µ{migrated}"
                )
            }
            ("validate", StepStatus::Completed) => format!(
                "lines + tax = total, vendor known, number new; approval {}",
                if value("needs_approval") == true { "needed" } else { "not needed" }
            ),
            ("approve", StepStatus::Completed) => match i.output.get("approve").map(HumanResult::from_output) {
                Some(Ok(h)) => match &h.concluded {
                    Concluded::Person { outcome, actor, decided_at, .. } => format!(
                        "{actor} decided {outcome:?} at level {} ({} after the start){}",
                        h.level,
                        hours((*decided_at - i.created_at).as_millis()),
                        if h.level > 0 { ", after finance missed its 4 h SLA" } else { "" }
                    ),
                    Concluded::Sla { outcome, .. } => format!("nobody decided in time: {outcome:?} (never approves)"),
                },
                _ => "?".into(),
            },
            ("post", StepStatus::Completed) => format!(
                "ledger entry {} under key {}{}",
                out_of("entry"),
                out_of("key"),
                if value("queried") == true { " (the reply was lost; the ledger was asked and had it)" } else { "" }
            ),
            ("reconcile", StepStatus::Completed) => format!("period {}", out_of("reconciled")),
            ("notify", StepStatus::Completed) => format!("mail {} sent (irreversible, last)", out_of("mail")),
            (_, StepStatus::Failed) => {
                format!("failed: {}", s.error.as_ref().map(|e| e.message.clone()).unwrap_or_default())
            }
            (_, StepStatus::Pending) if i.status.is_terminal() => {
                "never ran (the workflow failed before it)".to_string()
            }
            (_, st) => st.as_str().to_string(),
        };
        let _ = writeln!(out, "  {:<9} {what}", s.name);
    }
    if let Some(r) = &i.compensation {
        for inv in &r.steps {
            let _ = writeln!(
                out,
                "  compensation: {} {} after {} attempt(s) → {}",
                inv.step,
                match inv.result {
                    kernel_core::compensation::InverseResult::Compensated => "reversed",
                    kernel_core::compensation::InverseResult::Failed => "failed",
                    kernel_core::compensation::InverseResult::Escalated => "escalated to a person",
                    kernel_core::compensation::InverseResult::Retrying => "to be tried again",
                },
                inv.attempts,
                r.outcome.as_str()
            );
        }
    }
    let entries: Vec<String> = b
        .ledger
        .entries()
        .into_iter()
        .filter(|e| e.invoice == c.hash)
        .map(|e| format!("{} {:+}", e.id, e.amount_cents))
        .collect();
    let _ = writeln!(
        out,
        "  ledger: [{}], mails: {}{}",
        entries.join(", "),
        b.mailer.sent(&c.hash),
        if c.duplicate { ", uploaded twice: one workflow" } else { "" }
    );
}

/// Run the story in memory (the first engine runs the previous build, whose extraction
/// schema is `invoice@1`, and dies after the first extraction); returns its text, ending with an `invoice-story:` line.
///
/// # Errors
/// A port's error.
pub async fn run(seed: u64) -> kernel_core::Result<String> {
    let cases = cases();
    let uploads: Vec<Upload> = cases.iter().map(Case::upload).collect();
    let run = run_batch(&StoreKind::Memory, seed, 0, HashMap::new(), &|t| business(t, &cases), &uploads, true).await?;
    let mut out = String::from("The invoice pipeline, in memory with a manual clock: receive → extract → validate → approve (above 5000.00 EUR) → post → reconcile → notify.\n");
    let mut posted = 0;
    let mut compensated = 0;
    for c in &cases {
        let id = pipeline::workflow_id(&c.hash);
        if let Some(i) = run.instances.iter().find(|i| i.workflow_id.as_str() == id) {
            tell(&mut out, c, i, &run);
            posted += u64::from(i.output.contains_key("notify"));
            compensated += u64::from(i.compensation.as_ref().is_some_and(|r| {
                r.outcome == kernel_core::compensation::CompensationOutcome::Recovered && !r.steps.is_empty()
            }));
        }
    }
    let b = &run.business;
    let _ = writeln!(
        out,
        "\ninvoice-story: uploads={} workflows={} posted_and_notified={} compensated={} ledger_postings={} ledger_reversals={} mails={} duplicate_side_effects={}",
        cases.len() + cases.iter().filter(|c| c.duplicate).count() * 2,
        run.instances.len(),
        posted,
        compensated,
        b.ledger.counts().postings,
        b.ledger.counts().reversals,
        b.mailer.total(),
        b.ledger.counts().duplicate_effects + b.mailer.duplicates()
    );
    Ok(out)
}
