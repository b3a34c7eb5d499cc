//! The business world the pipeline talks to, in memory: a model that extracts invoices
//! (with a token cost, and answers in an old schema version when told to), a ledger that
//! dedupes postings by idempotency key and can lose a reply after applying, a mailer, a
//! vendor and invoice-number registry, and the restart switch activities pull.
//!
//! Every fake counts what it *did* — postings, reversals, mails — so duplicate side effects
//! are counted here, independently of the kernel's own bookkeeping.

use kernel_core::activity::{ActivityContext, ActivityError};
use kernel_core::model_call::{Model, ModelAnswer, ModelRequest};
use kernel_core::record::{Usage, VersionRef};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::Digest;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use testkit::faults::CrashSwitch;
use testkit::memory::ManualClock;

/// One invoice line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Line {
    /// What was bought.
    pub description: String,
    /// Net amount in cents.
    pub amount_cents: i64,
}

/// An uploaded invoice document (what the file holds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Document {
    /// Vendor id.
    pub vendor: String,
    /// The vendor's invoice number.
    pub number: String,
    /// ISO currency.
    pub currency: String,
    /// Accounting period, `YYYY-MM`.
    pub period: String,
    /// Lines.
    pub lines: Vec<Line>,
    /// Tax in cents.
    pub tax_cents: i64,
    /// Total in cents (lines plus tax).
    pub total_cents: i64,
}

impl Document {
    /// The file's bytes as uploaded (canonical JSON).
    pub fn file(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Hex SHA-256 of an uploaded file: the business key of its workflow.
pub fn file_hash(file: &str) -> String {
    hex::encode(sha2::Sha256::digest(file.as_bytes()))
}

/// Moves the manual clock by the simulated duration of a fake call (none without a clock).
#[derive(Debug, Clone, Default)]
pub struct Timing {
    clock: Option<Arc<ManualClock>>,
    percent: Option<i64>,
}

impl Timing {
    /// Calls take simulated time on `clock`.
    pub fn on(clock: Arc<ManualClock>) -> Timing {
        Timing { clock: Some(clock), percent: None }
    }
    /// Calls take `percent` % of their usual time (a burst of fast arrivals).
    pub fn scaled(mut self, percent: i64) -> Timing {
        self.percent = Some(percent.max(1));
        self
    }
    fn spend(&self, ms: i64) {
        if let Some(c) = &self.clock {
            c.advance(ms * self.percent.unwrap_or(100) / 100);
        }
    }
}

#[derive(Debug, Default)]
struct ModelState {
    calls: u64,
    tokens: u64,
    cost_micros: u64,
    old_answers: u64,
    old_plan: BTreeMap<String, u32>,
}

/// A scripted extraction model: it reads the document it is given and answers in the
/// current schema (`invoice@2`), or — as many times as scripted per file — in the old one
/// (`invoice@1`: other field names, no currency).
#[derive(Debug, Default)]
pub struct FakeModel {
    state: Mutex<ModelState>,
    timing: Timing,
}

/// What the model cost and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelCounts {
    /// Samples drawn.
    pub calls: u64,
    /// Tokens in and out.
    pub tokens: u64,
    /// Fake cost, micro-units.
    pub cost_micros: u64,
    /// Answers given in the old schema version (injected faults).
    pub old_answers: u64,
}

impl FakeModel {
    /// A model whose calls take simulated time by `timing`.
    pub fn new(timing: Timing) -> FakeModel {
        FakeModel { state: Mutex::default(), timing }
    }
    /// Answer the next `n` extractions of the file with hash `hash` in the old schema.
    pub fn answer_old(&self, hash: &str, n: u32) {
        if n > 0 {
            self.state.lock().expect("model lock").old_plan.insert(hash.to_string(), n);
        }
    }
    /// What it did so far.
    pub fn counts(&self) -> ModelCounts {
        let s = self.state.lock().expect("model lock");
        ModelCounts { calls: s.calls, tokens: s.tokens, cost_micros: s.cost_micros, old_answers: s.old_answers }
    }

    /// One sample for `document` (the uploaded file) with hash `hash`: the raw answer and
    /// its usage. Shared by the kernel's step and the baseline agent.
    pub fn sample(&self, hash: &str, document: &str) -> Result<ModelAnswer, String> {
        self.timing.spend(1_500);
        let doc: Document = serde_json::from_str(document).map_err(|e| format!("unreadable document: {e}"))?;
        let mut s = self.state.lock().expect("model lock");
        let old = match s.old_plan.get_mut(hash) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        };
        let raw = if old {
            s.old_answers += 1;
            json!({
                "vendor": doc.vendor,
                "invoice_no": doc.number,
                "period": doc.period,
                "lines": doc.lines.iter().map(|l| json!({"text": l.description, "amount": l.amount_cents})).collect::<Vec<_>>(),
                "vat": doc.tax_cents,
                "sum": doc.total_cents,
            })
        } else {
            serde_json::to_value(&doc).map_err(|e| e.to_string())?
        };
        let input_tokens = (document.len() / 4) as u64 + 200;
        let output_tokens = 60 + 12 * doc.lines.len() as u64;
        let cost = input_tokens * 3 + output_tokens * 15;
        s.calls += 1;
        s.tokens += input_tokens + output_tokens;
        s.cost_micros += cost;
        Ok(ModelAnswer { raw: raw.to_string(), usage: Usage { input_tokens, output_tokens, cost_micros: cost } })
    }
}

#[async_trait::async_trait]
impl Model for FakeModel {
    fn version(&self) -> VersionRef {
        VersionRef::new("fake-extractor", "7")
    }
    async fn generate(&self, req: &ModelRequest, _ctx: &ActivityContext) -> Result<ModelAnswer, ActivityError> {
        let hash = req.input["hash"].as_str().unwrap_or_default();
        let document = req.input["document"].as_str().unwrap_or_default();
        if req.schema.as_ref().is_some_and(|s| s.version().version == "1") {
            // The previous build asks for `invoice@1`: one more answer in it.
            *self.state.lock().expect("model lock").old_plan.entry(hash.to_string()).or_insert(0) += 1;
        }
        self.sample(hash, document).map_err(ActivityError::permanent)
    }
}

/// The schema of an extraction: version 2 (the current one).
pub fn invoice_schema_v2() -> Value {
    json!({
        "type": "object",
        "required": ["vendor", "number", "currency", "period", "lines", "tax_cents", "total_cents"],
        "properties": {
            "vendor": {"type": "string"},
            "number": {"type": "string"},
            "currency": {"type": "string", "minLength": 3, "maxLength": 3},
            "period": {"type": "string"},
            "lines": {"type": "array", "minItems": 1, "items": {
                "type": "object",
                "required": ["description", "amount_cents"],
                "properties": {"description": {"type": "string"}, "amount_cents": {"type": "integer"}}
            }},
            "tax_cents": {"type": "integer"},
            "total_cents": {"type": "integer"}
        }
    })
}

/// The schema of an extraction in version 1 (the previous build's).
pub fn invoice_schema_v1() -> Value {
    json!({
        "type": "object",
        "required": ["vendor", "invoice_no", "period", "lines", "vat", "sum"],
        "properties": {
            "lines": {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["text", "amount"]}},
            "vat": {"type": "integer"},
            "sum": {"type": "integer"}
        }
    })
}

/// How an extraction recorded under `invoice@1` becomes one of `invoice@2`.
pub fn migrate_v1(v: Value) -> Result<Value, String> {
    let lines = v["lines"]
        .as_array()
        .ok_or("no lines")?
        .iter()
        .map(|l| json!({"description": l["text"], "amount_cents": l["amount"]}))
        .collect::<Vec<_>>();
    Ok(json!({
        "vendor": v["vendor"], "number": v["invoice_no"], "currency": "EUR", "period": v["period"],
        "lines": lines, "tax_cents": v["vat"], "total_cents": v["sum"],
    }))
}

/// Why a ledger call did not give an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerError {
    /// The ledger applied the call, but its reply was lost on the way back.
    ReplyLost,
    /// The ledger is unavailable; nothing was applied.
    Unavailable,
    /// The ledger refuses (a closed period).
    Refused(String),
}

/// One entry in the fake ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEntry {
    /// Entry id.
    pub id: String,
    /// The invoice (file hash).
    pub invoice: String,
    /// Signed amount in cents (a reversal is negative).
    pub amount_cents: i64,
    /// The idempotency key it was posted under.
    pub key: String,
}

#[derive(Debug, Default)]
struct LedgerState {
    entries: Vec<LedgerEntry>,
    by_key: BTreeMap<String, usize>,
    postings: BTreeMap<String, u64>,
    reversals: BTreeMap<String, u64>,
    lose_reply: BTreeSet<String>,
    reversal_failures: BTreeMap<String, u32>,
    closed_periods: BTreeSet<String>,
    lost_replies: u64,
    dedup_hits: u64,
    reversal_failures_injected: u64,
    period_refusals: u64,
}

/// What the ledger did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LedgerCounts {
    /// Postings applied.
    pub postings: u64,
    /// Reversals applied.
    pub reversals: u64,
    /// Calls answered from an earlier entry with the same key (no new effect).
    pub dedup_hits: u64,
    /// Replies lost after applying (injected).
    pub lost_replies: u64,
    /// Reversal calls refused as unavailable (injected).
    pub reversal_failures: u64,
    /// Reconciliations refused for a closed period.
    pub period_refusals: u64,
    /// Effects beyond the first of their kind per invoice: a second posting, a second
    /// reversal.
    pub duplicate_effects: u64,
}

/// A ledger that dedupes by idempotency key: a call under a key it has seen returns the
/// earlier entry and changes nothing. It can lose the reply of a call it applied, fail
/// reversals and refuse reconciliation of a closed period, as scripted.
#[derive(Debug, Default)]
pub struct FakeLedger {
    state: Mutex<LedgerState>,
    timing: Timing,
}

impl FakeLedger {
    /// A ledger whose calls take simulated time by `timing`.
    pub fn new(timing: Timing) -> FakeLedger {
        FakeLedger { state: Mutex::default(), timing }
    }
    /// Lose the reply of the first posting of `invoice` (after applying it).
    pub fn lose_reply_of(&self, invoice: &str) {
        self.state.lock().expect("ledger lock").lose_reply.insert(invoice.to_string());
    }
    /// Refuse the next `n` reversals of `invoice` as unavailable.
    pub fn fail_reversals(&self, invoice: &str, n: u32) {
        if n > 0 {
            self.state.lock().expect("ledger lock").reversal_failures.insert(invoice.to_string(), n);
        }
    }
    /// Close an accounting period: reconciliations in it are refused.
    pub fn close_period(&self, period: &str) {
        self.state.lock().expect("ledger lock").closed_periods.insert(period.to_string());
    }

    fn apply(s: &mut LedgerState, key: &str, invoice: &str, amount: i64) -> String {
        if let Some(&i) = s.by_key.get(key) {
            s.dedup_hits += 1;
            return s.entries[i].id.clone();
        }
        let id = format!("E{}", s.entries.len() + 1);
        s.entries.push(LedgerEntry {
            id: id.clone(),
            invoice: invoice.to_string(),
            amount_cents: amount,
            key: key.into(),
        });
        s.by_key.insert(key.to_string(), s.entries.len() - 1);
        *(if amount >= 0 { &mut s.postings } else { &mut s.reversals }).entry(invoice.to_string()).or_insert(0) += 1;
        id
    }

    /// Post `amount_cents` for `invoice` under `key`; returns the entry id.
    ///
    /// # Errors
    /// [`LedgerError::ReplyLost`] when scripted: the posting *was* applied.
    pub fn post(&self, key: &str, invoice: &str, amount_cents: i64) -> Result<String, LedgerError> {
        self.timing.spend(300);
        let mut s = self.state.lock().expect("ledger lock");
        let id = Self::apply(&mut s, key, invoice, amount_cents.abs());
        if s.lose_reply.remove(invoice) {
            s.lost_replies += 1;
            return Err(LedgerError::ReplyLost);
        }
        Ok(id)
    }
    /// The entry posted under `key`, if any (the query before a retry of an unknown outcome).
    pub fn find(&self, key: &str) -> Option<LedgerEntry> {
        let s = self.state.lock().expect("ledger lock");
        s.by_key.get(key).map(|&i| s.entries[i].clone())
    }
    /// Post the reversal of `invoice`'s posting under `key`.
    ///
    /// # Errors
    /// [`LedgerError::Unavailable`] when scripted (nothing applied).
    pub fn reverse(&self, key: &str, invoice: &str) -> Result<String, LedgerError> {
        self.timing.spend(300);
        let mut s = self.state.lock().expect("ledger lock");
        if let Some(n) = s.reversal_failures.get_mut(invoice).filter(|n| **n > 0) {
            *n -= 1;
            s.reversal_failures_injected += 1;
            return Err(LedgerError::Unavailable);
        }
        let amount =
            s.entries.iter().find(|e| e.invoice == invoice && e.amount_cents >= 0).map_or(0, |e| e.amount_cents);
        Ok(Self::apply(&mut s, key, invoice, -amount.max(1)))
    }
    /// Reconcile `invoice`'s posting in `period`.
    ///
    /// # Errors
    /// [`LedgerError::Refused`] for a closed period.
    pub fn reconcile(&self, invoice: &str, period: &str) -> Result<(), LedgerError> {
        self.timing.spend(100);
        let mut s = self.state.lock().expect("ledger lock");
        if s.closed_periods.contains(period) {
            s.period_refusals += 1;
            return Err(LedgerError::Refused(format!("period {period} is closed ({invoice})")));
        }
        Ok(())
    }
    /// Postings minus reversals applied for `invoice`.
    pub fn net(&self, invoice: &str) -> i64 {
        let s = self.state.lock().expect("ledger lock");
        s.postings.get(invoice).copied().unwrap_or(0) as i64 - s.reversals.get(invoice).copied().unwrap_or(0) as i64
    }
    /// Every entry, in order.
    pub fn entries(&self) -> Vec<LedgerEntry> {
        self.state.lock().expect("ledger lock").entries.clone()
    }
    /// What it did.
    pub fn counts(&self) -> LedgerCounts {
        let s = self.state.lock().expect("ledger lock");
        let extra = |m: &BTreeMap<String, u64>| m.values().map(|n| n.saturating_sub(1)).sum::<u64>();
        LedgerCounts {
            postings: s.postings.values().sum(),
            reversals: s.reversals.values().sum(),
            dedup_hits: s.dedup_hits,
            lost_replies: s.lost_replies,
            reversal_failures: s.reversal_failures_injected,
            period_refusals: s.period_refusals,
            duplicate_effects: extra(&s.postings) + extra(&s.reversals),
        }
    }
}

#[derive(Debug, Default)]
struct MailerState {
    by_key: BTreeMap<String, String>,
    sent: BTreeMap<String, u64>,
    log: Vec<(String, String)>,
}

/// A mailer (irreversible): a send under a key it has seen is not sent again; it counts the
/// mails actually sent per invoice.
#[derive(Debug, Default)]
pub struct FakeMailer {
    state: Mutex<MailerState>,
    timing: Timing,
}

impl FakeMailer {
    /// A mailer whose sends take simulated time by `timing`.
    pub fn new(timing: Timing) -> FakeMailer {
        FakeMailer { state: Mutex::default(), timing }
    }
    /// Send the notice of `invoice` to `to` under `key`; returns the message id.
    pub fn send(&self, key: &str, invoice: &str, to: &str) -> String {
        self.timing.spend(200);
        let mut s = self.state.lock().expect("mailer lock");
        if let Some(id) = s.by_key.get(key) {
            return id.clone();
        }
        let id = format!("M{}", s.by_key.len() + 1);
        s.by_key.insert(key.to_string(), id.clone());
        *s.sent.entry(invoice.to_string()).or_insert(0) += 1;
        s.log.push((invoice.to_string(), to.to_string()));
        id
    }
    /// Mails sent for `invoice`.
    pub fn sent(&self, invoice: &str) -> u64 {
        self.state.lock().expect("mailer lock").sent.get(invoice).copied().unwrap_or(0)
    }
    /// Mails sent in all.
    pub fn total(&self) -> u64 {
        self.state.lock().expect("mailer lock").sent.values().sum()
    }
    /// Mails beyond the first per invoice.
    pub fn duplicates(&self) -> u64 {
        self.state.lock().expect("mailer lock").sent.values().map(|n| n.saturating_sub(1)).sum()
    }
}

/// Known vendors and the invoice numbers seen per vendor.
#[derive(Debug, Default)]
pub struct Registry {
    vendors: BTreeSet<String>,
    numbers: Mutex<BTreeMap<(String, String), String>>,
}

impl Registry {
    /// A registry of these vendors.
    pub fn new(vendors: impl IntoIterator<Item = impl Into<String>>) -> Registry {
        Registry { vendors: vendors.into_iter().map(Into::into).collect(), numbers: Mutex::default() }
    }
    /// Whether the vendor is known.
    pub fn known(&self, vendor: &str) -> bool {
        self.vendors.contains(vendor)
    }
    /// Claim the vendor's invoice number for the file `hash`: true when it is new or
    /// already this file's; false when another file holds it (a duplicate invoice).
    pub fn claim(&self, vendor: &str, number: &str, hash: &str) -> bool {
        let mut m = self.numbers.lock().expect("registry lock");
        m.entry((vendor.to_string(), number.to_string())).or_insert_with(|| hash.to_string()) == hash
    }
}

const ANY: &str = "*";

/// Restarts of the engine injected from inside an activity, after its side effect: the
/// process dies there (every later port call parks) and a fresh engine recovers.
#[derive(Debug, Default)]
pub struct Restarts {
    plan: Mutex<BTreeMap<String, String>>,
    fired: Mutex<BTreeSet<String>>,
    switch: Mutex<Option<Arc<CrashSwitch>>>,
}

impl Restarts {
    /// Kill the engine once, right after `step`'s side effect for `invoice`.
    pub fn plan(&self, invoice: &str, step: &str) {
        self.plan.lock().expect("restart lock").insert(invoice.to_string(), step.to_string());
    }
    /// The switch of the engine now running.
    pub fn arm(&self, switch: Arc<CrashSwitch>) {
        *self.switch.lock().expect("restart lock") = Some(switch);
    }
    /// Kill the engine once, right after `step`'s side effect for whichever invoice gets
    /// there first.
    pub fn plan_first(&self, step: &str) {
        self.plan.lock().expect("restart lock").insert(ANY.to_string(), step.to_string());
    }
    /// Whether a restart is planned here and not yet fired: then it fires (once).
    pub fn fire(&self, invoice: &str, step: &str) -> bool {
        let plan = self.plan.lock().expect("restart lock").clone();
        let key = [invoice, ANY].into_iter().find(|k| {
            plan.get(*k).is_some_and(|s| s == step) && !self.fired.lock().expect("restart lock").contains(*k)
        });
        let Some(key) = key else { return false };
        self.fired.lock().expect("restart lock").insert(key.to_string());
        if let Some(s) = &*self.switch.lock().expect("restart lock") {
            s.crash_now();
        }
        true
    }
    /// Restarts fired.
    pub fn fired(&self) -> u64 {
        self.fired.lock().expect("restart lock").len() as u64
    }
}
