//! The invoice pipeline: receive → extract → validate → approve (above a threshold) → post
//! → reconcile → notify, with the posting's reversal as its compensation.

use crate::fakes::*;
use kernel_core::definition::QueryAnswer;
use kernel_core::domain::DurationMs;
use kernel_core::model_call::{ModelRequest, OutputSchema};
use kernel_core::ports::{DynIds, DynTaskInbox, Evidence};
use kernel_core::record::VersionRef;
use kernel_core::{ActivityContext, ActivityError, Definition, StepDef, StepOutcome};
use kernel_tasks::{HumanResult, HumanTask, Level, SlaOutcome};
use serde_json::{json, Value};
use std::sync::Arc;

/// The workflow type.
pub const WORKFLOW_TYPE: &str = "invoice";
/// Invoices above this total (cents) need a person's approval.
pub const APPROVAL_THRESHOLD_CENTS: i64 = 500_000;
/// Tax rate in percent.
pub const TAX_PERCENT: i64 = 20;
/// The SLA of the first approval level (finance), ms.
pub const SLA_FINANCE_MS: i64 = 4 * 3_600_000;
/// The SLA of the escalation level (the CFO), ms.
pub const SLA_CFO_MS: i64 = 8 * 3_600_000;
/// The reminder of each level, ms after its opening.
pub const REMINDER_MS: i64 = 3_600_000;
/// The resource the posting holds a permit of.
pub const LEDGER_RESOURCE: &str = "ledger";

/// The fakes one pipeline talks to. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Business {
    /// The extraction model.
    pub model: Arc<FakeModel>,
    /// The ledger.
    pub ledger: Arc<FakeLedger>,
    /// The mailer.
    pub mailer: Arc<FakeMailer>,
    /// Vendors and invoice numbers.
    pub registry: Arc<Registry>,
    /// Restarts injected after side effects.
    pub restarts: Arc<Restarts>,
}

impl Business {
    /// Fresh fakes whose calls take simulated time by `timing`, with these known vendors.
    pub fn new(timing: Timing, vendors: impl IntoIterator<Item = impl Into<String>>) -> Business {
        Business {
            model: Arc::new(FakeModel::new(timing.clone())),
            ledger: Arc::new(FakeLedger::new(timing.clone())),
            mailer: Arc::new(FakeMailer::new(timing)),
            registry: Arc::new(Registry::new(vendors)),
            restarts: Arc::new(Restarts::default()),
        }
    }
}

/// The workflow id of an upload: derived from the file hash, so the same upload twice is
/// one workflow.
pub fn workflow_id(hash: &str) -> String {
    format!("inv-{}", &hash[..hash.len().min(24)])
}

/// The start input of an upload: the file, its hash, and the hash as the business round
/// (a failed invoice uploaded again is not replayed).
pub fn start_input(file: &str) -> Value {
    let hash = file_hash(file);
    json!({"file": file, "hash": hash, "fencing_token": hash})
}

/// The extraction schema, `invoice@2`, with the migration from `invoice@1`.
///
/// # Errors
/// None in practice: the schema is fixed (kept typed for the builder).
pub fn schema() -> kernel_core::Result<OutputSchema> {
    Ok(OutputSchema::new(VersionRef::new("invoice", "2"), invoice_schema_v2())?.migration("1", migrate_v1))
}

fn hash_of(ctx: &ActivityContext) -> String {
    ctx.input()["hash"].as_str().unwrap_or_default().to_string()
}

/// Whether the validated invoice needs a person's approval.
pub fn needs_approval(validate: Option<&Value>) -> bool {
    validate.and_then(|v| v["needs_approval"].as_bool()).unwrap_or(false)
}

/// The business checks of an extraction: lines plus tax make the total, the tax is the
/// rate, the vendor is known, the invoice number is not another file's. The output says
/// whether a person must approve.
///
/// # Errors
/// Why the invoice is refused.
pub fn check(b: &Business, doc: &Document, hash: &str) -> Result<Value, String> {
    let net: i64 = doc.lines.iter().map(|l| l.amount_cents).sum();
    if net + doc.tax_cents != doc.total_cents {
        return Err(format!("lines ({net}) plus tax ({}) are not the total ({})", doc.tax_cents, doc.total_cents));
    }
    if doc.tax_cents != net * TAX_PERCENT / 100 {
        return Err(format!("tax {} is not {TAX_PERCENT}% of {net}", doc.tax_cents));
    }
    if !b.registry.known(&doc.vendor) {
        return Err(format!("unknown vendor {}", doc.vendor));
    }
    if !b.registry.claim(&doc.vendor, &doc.number, hash) {
        return Err(format!("duplicate invoice number {} of {}", doc.number, doc.vendor));
    }
    Ok(json!({
        "vendor": doc.vendor, "number": doc.number, "period": doc.period, "total_cents": doc.total_cents,
        "needs_approval": doc.total_cents > APPROVAL_THRESHOLD_CENTS,
    }))
}

fn validate(b: &Business, ctx: &ActivityContext) -> Result<Value, ActivityError> {
    let x = ctx.output("extract").ok_or_else(|| ActivityError::permanent("no extraction"))?;
    let doc: Document =
        serde_json::from_value(x.clone()).map_err(|e| ActivityError::permanent(format!("extraction: {e}")))?;
    check(b, &doc, &hash_of(ctx)).map_err(ActivityError::permanent)
}

/// The approval step's human task: finance first (4 h SLA, a reminder after 1 h), then the
/// CFO (8 h); nobody in time ends `escalate`, which never approves. The pipeline routes the
/// outcome itself (`routes_outcomes`): every conclusion completes the step, and `post` runs
/// only on an approval (its branch condition reads it), so a rejected or timed-out invoice
/// ends `completed` without a ledger entry, as the evaluation counts it.
///
/// # Errors
/// The builder's (none for these fixed levels).
pub fn approval(inbox: Arc<DynTaskInbox>, ids: Arc<DynIds>) -> kernel_core::Result<HumanTask> {
    HumanTask::builder("Approve invoice")
        .title_from(|ctx| {
            format!(
                "Approve invoice {} ({} cents)",
                ctx.output("validate").map_or(Value::Null, |v| v["number"].clone()),
                ctx.output("validate").map_or(Value::Null, |v| v["total_cents"].clone())
            )
        })
        .level(Level::roles(["finance"]).sla(DurationMs::from_millis(SLA_FINANCE_MS)))
        .level(Level::assignee("cfo").sla(DurationMs::from_millis(SLA_CFO_MS)))
        .reminders([DurationMs::from_millis(REMINDER_MS)])
        .on_sla(SlaOutcome::Escalate)
        .routes_outcomes()
        .evidence(|ctx| vec![Evidence { label: "scan".into(), reference: format!("upload:{}", &hash_of(ctx)[..16]) }])
        .ids(ids)
        .build(inbox)
}

/// Which build of the pipeline: the previous one extracted in `invoice@1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    /// Extraction schema `invoice@2`, with the migration from `@1`.
    Current,
    /// Extraction schema `invoice@1` (same steps, same fingerprint: schemas are not part of
    /// it, K-17.4).
    Previous,
}

/// The previous build's extraction schema, `invoice@1`.
///
/// # Errors
/// None in practice: the schema is fixed.
pub fn schema_v1() -> kernel_core::Result<OutputSchema> {
    OutputSchema::new(VersionRef::new("invoice", "1"), invoice_schema_v1())
}

/// The pipeline's definition over `b`'s fakes; `inbox` holds the human tasks, `ids` makes
/// their tokens.
///
/// # Errors
/// A definition the kernel refuses (it does not).
pub fn definition(b: &Business, inbox: Arc<DynTaskInbox>, ids: Arc<DynIds>) -> kernel_core::Result<Definition> {
    definition_of(Build::Current, b, inbox, ids)
}

/// [`definition`] of a given build.
///
/// # Errors
/// A definition the kernel refuses (it does not).
pub fn definition_of(
    build: Build,
    b: &Business,
    inbox: Arc<DynTaskInbox>,
    ids: Arc<DynIds>,
) -> kernel_core::Result<Definition> {
    let step_schema = match build {
        Build::Current => schema()?,
        Build::Previous => schema_v1()?,
    };
    let call_schema = (build == Build::Previous).then(|| step_schema.clone());
    let (bx, bv, bp, bq, br, brc, bn) = (b.clone(), b.clone(), b.clone(), b.clone(), b.clone(), b.clone(), b.clone());
    Definition::builder(WORKFLOW_TYPE)
        .step(StepDef::new("receive", |ctx: ActivityContext| async move {
            let file = ctx.input()["file"].as_str().unwrap_or_default();
            let hash = file_hash(file);
            if hash != hash_of(&ctx) {
                return Err(ActivityError::permanent("the upload does not match its hash"));
            }
            Ok(StepOutcome::complete(json!({"hash": hash, "bytes": file.len()})))
        }))
        .step(
            StepDef::new("extract", move |ctx: ActivityContext| {
                let b = bx.clone();
                let call_schema = call_schema.clone();
                async move {
                    let mut req = ModelRequest::new(
                        "extract",
                        VersionRef::new("invoice-extract", "3"),
                        json!({"hash": hash_of(&ctx), "document": ctx.input()["file"]}),
                    );
                    if let Some(s) = call_schema {
                        req = req.output_schema(s);
                    }
                    let out = ctx.model(&*b.model, req).await?;
                    b.restarts.fire(&hash_of(&ctx), "extract");
                    Ok(StepOutcome::complete(out))
                }
            })
            .output_schema(step_schema)
            .resamples(2)
            .max_retry(2),
        )
        .step(StepDef::new("validate", move |ctx: ActivityContext| {
            let b = bv.clone();
            async move { validate(&b, &ctx).map(StepOutcome::complete) }
        }))
        .step(
            StepDef::new("approve", approval(inbox, ids)?)
                .max_retry(3)
                .when(["validate"], |o| needs_approval(o.output("validate"))),
        )
        .step(
            StepDef::new("post", move |ctx: ActivityContext| {
                let b = bp.clone();
                async move {
                    let hash = hash_of(&ctx);
                    let amount = ctx.output("validate").and_then(|v| v["total_cents"].as_i64()).unwrap_or(0);
                    let key = ctx.idempotency_key();
                    match b.ledger.post(&key, &hash, amount) {
                        Ok(entry) => {
                            b.restarts.fire(&hash, "post");
                            Ok(StepOutcome::complete(json!({"entry": entry, "key": key, "amount_cents": amount})))
                        }
                        Err(LedgerError::ReplyLost) => {
                            Err(ActivityError::unknown_outcome("the ledger's reply was lost"))
                        }
                        Err(e) => Err(ActivityError::transient(format!("ledger: {e:?}"))),
                    }
                }
            })
            .depends_on(["approve"])
            .when(["validate", "approve"], |o| match o.output("approve") {
                Some(a) => HumanResult::from_output(a).is_ok_and(|r| r.approved()),
                None => !needs_approval(o.output("validate")),
            })
            .resource(LEDGER_RESOURCE)
            .max_retry(4)
            .on_unknown_outcome(move |ctx: ActivityContext| {
                let b = bq.clone();
                async move {
                    Ok(match b.ledger.find(&ctx.idempotency_key()) {
                        Some(e) => QueryAnswer::Done(
                            json!({"entry": e.id, "key": e.key, "amount_cents": e.amount_cents, "queried": true}),
                        ),
                        None => QueryAnswer::NotDone,
                    })
                }
            })
            .compensate_with(move |ctx: ActivityContext| {
                let b = br.clone();
                async move {
                    match b.ledger.reverse(&ctx.idempotency_key(), &hash_of(&ctx)) {
                        Ok(entry) => Ok(StepOutcome::complete(json!({"reversal": entry}))),
                        Err(e) => Err(ActivityError::transient(format!("ledger reversal: {e:?}"))),
                    }
                }
            }),
        )
        .step(
            StepDef::new("reconcile", move |ctx: ActivityContext| {
                let b = brc.clone();
                async move {
                    let period = ctx.output("validate").and_then(|v| v["period"].as_str()).unwrap_or_default();
                    match b.ledger.reconcile(&hash_of(&ctx), period) {
                        Ok(()) => Ok(StepOutcome::complete(json!({"reconciled": period}))),
                        Err(LedgerError::Refused(why)) => Err(ActivityError::permanent(why)),
                        Err(e) => Err(ActivityError::transient(format!("ledger: {e:?}"))),
                    }
                }
            })
            .depends_on(["post"])
            .when(["post"], |o| o.output("post").is_some()),
        )
        .step(
            StepDef::new("notify", move |ctx: ActivityContext| {
                let b = bn.clone();
                async move {
                    let hash = hash_of(&ctx);
                    let vendor = ctx.output("validate").and_then(|v| v["vendor"].as_str()).unwrap_or("vendor");
                    let id = b.mailer.send(&ctx.idempotency_key(), &hash, &format!("ap@{vendor}.example"));
                    b.restarts.fire(&hash, "notify");
                    Ok(StepOutcome::complete(json!({"mail": id})))
                }
            })
            .depends_on(["reconcile"])
            .when(["reconcile"], |o| o.output("reconcile").is_some())
            .irreversible()
            .max_retry(2),
        )
        .build()
}
