//! The evaluation under injected faults (K-17.8): seeded invoices per fault class and all
//! classes together, run on the kernel and on an all-agent baseline under the same
//! schedule, counted by the fakes.

use crate::fakes::*;
use crate::pipeline::{self, Business};
use crate::world::{run_batch, ApproverPlan, BatchRun, StoreKind, Upload};
use kernel_core::compensation::CompensationOutcome;
use kernel_core::domain::{StepStatus, WorkflowInstance, WorkflowStatus};
use kernel_tasks::{Concluded, HumanResult};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use testkit::memory::PermitLimits;

/// The injected fault classes, then all of them together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultClass {
    /// The ledger applies a posting and the reply is lost.
    LostReply,
    /// The engine dies right after a step's side effect; a fresh one recovers.
    Restart,
    /// The upload and the approval callback arrive more than once.
    DuplicateCallback,
    /// The model answers in the old schema version.
    OldSchema,
    /// The period is closed after posting and the reversal fails (some recover on retry,
    /// some never).
    CompensationFailure,
    /// A permit ceiling on the ledger and a burst of invoices: a backlog.
    FullQueue,
    /// The approver answers late or not at all.
    SlowApprover,
    /// Every class at once, each invoice drawing its faults.
    All,
}

impl FaultClass {
    /// The seven classes.
    pub const SEVEN: [FaultClass; 7] = [
        FaultClass::LostReply,
        FaultClass::Restart,
        FaultClass::DuplicateCallback,
        FaultClass::OldSchema,
        FaultClass::CompensationFailure,
        FaultClass::FullQueue,
        FaultClass::SlowApprover,
    ];
    /// The seven classes and `All`.
    pub const EVERY: [FaultClass; 8] = [
        FaultClass::LostReply,
        FaultClass::Restart,
        FaultClass::DuplicateCallback,
        FaultClass::OldSchema,
        FaultClass::CompensationFailure,
        FaultClass::FullQueue,
        FaultClass::SlowApprover,
        FaultClass::All,
    ];
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            FaultClass::LostReply => "lost_reply",
            FaultClass::Restart => "restart",
            FaultClass::DuplicateCallback => "duplicate_callback",
            FaultClass::OldSchema => "old_schema",
            FaultClass::CompensationFailure => "compensation_failure",
            FaultClass::FullQueue => "full_queue",
            FaultClass::SlowApprover => "slow_approver",
            FaultClass::All => "all",
        }
    }
}

/// Known vendors.
pub fn vendors() -> Vec<String> {
    (1..=20).map(|i| format!("V{i:02}")).collect()
}

/// The period the ledger has closed.
pub const CLOSED_PERIOD: &str = "2026-09";
/// The open period.
pub const OPEN_PERIOD: &str = "2026-11";

/// One seeded invoice and the faults scripted for it.
#[derive(Debug, Clone)]
pub struct Case {
    /// The document.
    pub doc: Document,
    /// The uploaded file.
    pub file: String,
    /// Its hash.
    pub hash: String,
    /// The approver's plan.
    pub approver: ApproverPlan,
    /// Callbacks (upload, approval) delivered again.
    pub duplicate: bool,
    /// The ledger loses the first posting's reply.
    pub lose_reply: bool,
    /// The engine dies after this step's side effect.
    pub restart_at: Option<&'static str>,
    /// Answers in the old schema before a current one.
    pub old_answers: u32,
    /// Reversals that fail before one succeeds.
    pub reversal_failures: u32,
}

impl Case {
    /// The upload the kernel receives.
    pub fn upload(&self) -> Upload {
        Upload { file: self.file.clone(), approver: self.approver, duplicate: self.duplicate }
    }
}

/// Script `cases`' faults on fresh fakes.
pub fn business(timing: Timing, cases: &[Case]) -> Business {
    let b = Business::new(timing, vendors());
    b.ledger.close_period(CLOSED_PERIOD);
    for c in cases {
        if c.lose_reply {
            b.ledger.lose_reply_of(&c.hash);
        }
        if let Some(step) = c.restart_at {
            b.restarts.plan(&c.hash, step);
        }
        b.model.answer_old(&c.hash, c.old_answers);
        b.ledger.fail_reversals(&c.hash, c.reversal_failures);
    }
    b
}

/// A seeded document; `big` forces a total above the approval threshold.
fn document(rng: &mut SmallRng, tag: &str, i: usize, big: bool) -> Document {
    let n = rng.gen_range(1..=4);
    let mut lines: Vec<Line> = (0..n)
        .map(|k| Line { description: format!("item {k}"), amount_cents: rng.gen_range(100..3_000) * 100 })
        .collect();
    if big {
        lines.push(Line { description: "service".into(), amount_cents: 450_000 });
    }
    let net: i64 = lines.iter().map(|l| l.amount_cents).sum();
    let tax = net * pipeline::TAX_PERCENT / 100;
    Document {
        vendor: format!("V{:02}", rng.gen_range(1..=20)),
        number: format!("{tag}-{i:05}"),
        currency: "EUR".into(),
        period: OPEN_PERIOD.into(),
        lines,
        tax_cents: tax,
        total_cents: net + tax,
    }
}

/// The seeded invoices of one class.
pub fn cases(class: FaultClass, n: usize, seed: u64) -> Vec<Case> {
    let mut rng = SmallRng::seed_from_u64(seed ^ (class as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let all = class == FaultClass::All;
    let mut out: Vec<Case> = Vec::with_capacity(n);
    for i in 0..n {
        let p = |rng: &mut SmallRng, q: f64| all && rng.gen_bool(q);
        let duplicate = class == FaultClass::DuplicateCallback || p(&mut rng, 0.3);
        let slow = class == FaultClass::SlowApprover || p(&mut rng, 0.3);
        let mut doc = document(&mut rng, class.name(), i, duplicate || slow);
        // Business refusals and period closes every class sees.
        let roll = rng.gen_range(0..100);
        if roll < 3 {
            doc.vendor = "V99".into();
        } else if roll < 6 && i % BATCH > 0 {
            // A number another invoice of the same batch (the same registry) already has.
            let prev = &out[rng.gen_range(i - i % BATCH..i)].doc;
            doc.vendor = prev.vendor.clone();
            doc.number = prev.number.clone();
        }
        let comp = class == FaultClass::CompensationFailure || p(&mut rng, 0.3);
        if comp || rng.gen_range(0..100) < 4 {
            doc.period = CLOSED_PERIOD.into();
        }
        let reversal_failures = if comp { [1, 1, 2, 2, 4][rng.gen_range(0..5)] } else { 0 };
        let approver = if slow {
            [
                ApproverPlan::Slow,
                ApproverPlan::Slow,
                ApproverPlan::AbsentThenCfo,
                ApproverPlan::AbsentThenCfo,
                ApproverPlan::Absent,
            ][rng.gen_range(0..5)]
        } else if rng.gen_range(0..10) == 0 {
            ApproverPlan::Reject
        } else {
            ApproverPlan::Prompt
        };
        let lose_reply = class == FaultClass::LostReply || p(&mut rng, 0.3);
        let restart_at = (class == FaultClass::Restart || p(&mut rng, 0.3))
            .then(|| ["extract", "post", "notify"][rng.gen_range(0..3)]);
        let old_answers =
            if class == FaultClass::OldSchema || p(&mut rng, 0.3) { [1, 1, 2, 2, 3][rng.gen_range(0..5)] } else { 0 };
        let file = doc.file();
        let hash = file_hash(&file);
        out.push(Case { doc, file, hash, approver, duplicate, lose_reply, restart_at, old_answers, reversal_failures });
    }
    out
}

/// The permit ceiling of the full-queue class: one posting at a time, one start a second.
pub fn limits(class: FaultClass) -> HashMap<String, PermitLimits> {
    let mut m = HashMap::new();
    if matches!(class, FaultClass::FullQueue | FaultClass::All) {
        m.insert(pipeline::LEDGER_RESOURCE.to_string(), PermitLimits { max_concurrency: 1, max_starts_per_second: 1 });
    }
    m
}

/// Figures of one architecture over a set of invoices.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Figures {
    /// Invoices run.
    pub invoices: u64,
    /// Faults of the class injected (counted by the fakes, the approver and the drivers).
    pub injected: u64,
    /// Posted, reconciled and notified.
    pub success: u64,
    /// Refused by the business checks (unknown vendor, duplicate number).
    pub refused: u64,
    /// Rejected by the approver.
    pub rejected: u64,
    /// No approval in time on any level (never posted).
    pub approval_timed_out: u64,
    /// Failed after posting and fully reversed.
    pub compensated: u64,
    /// Failed after posting; the reversal kept failing and a person has it.
    pub compensation_escalated: u64,
    /// Failed after posting; the reversal kept failing and nobody has it.
    pub compensation_failed: u64,
    /// Failed otherwise.
    pub failed: u64,
    /// Retries (kernel: the instances' retry counts; agent: calls repeated).
    pub retries: u64,
    /// Second postings, reversals and mails, counted by the ledger and the mailer.
    pub duplicate_side_effects: u64,
    /// Invoices whose end state is not known to be right: not terminal, or the ledger and
    /// mailer disagree with the outcome, or a posting nobody will reverse or keep.
    pub unknown_states: u64,
    /// Most postings waiting for a permit at once.
    pub backlog_peak: u64,
    /// Execution time of steps, ms (simulated).
    pub exec_ms: i64,
    /// End-to-end time minus execution, ms (simulated).
    pub wait_ms: i64,
    /// Fake model cost, micro-units.
    pub cost_micros: u64,
    /// Approval tasks concluded.
    pub approvals: u64,
    /// Of those, decided by finance within the SLA.
    pub sla_met: u64,
    /// Of those, escalated past the first level.
    pub escalated: u64,
    /// Engines killed by restart faults (agent: contexts lost).
    pub restarts: u64,
    /// Recorded outputs of an older schema version migrated on resume.
    pub migrated: u64,
    /// Where failed invoices stopped, by step.
    pub stops: BTreeMap<String, u64>,
}

impl Figures {
    /// Add `o` to these.
    pub fn add(&mut self, o: &Figures) {
        self.invoices += o.invoices;
        self.injected += o.injected;
        self.success += o.success;
        self.refused += o.refused;
        self.rejected += o.rejected;
        self.approval_timed_out += o.approval_timed_out;
        self.compensated += o.compensated;
        self.compensation_escalated += o.compensation_escalated;
        self.compensation_failed += o.compensation_failed;
        self.failed += o.failed;
        self.retries += o.retries;
        self.duplicate_side_effects += o.duplicate_side_effects;
        self.unknown_states += o.unknown_states;
        self.backlog_peak = self.backlog_peak.max(o.backlog_peak);
        self.exec_ms += o.exec_ms;
        self.wait_ms += o.wait_ms;
        self.cost_micros += o.cost_micros;
        self.approvals += o.approvals;
        self.sla_met += o.sla_met;
        self.escalated += o.escalated;
        self.restarts += o.restarts;
        self.migrated += o.migrated;
        for (k, v) in &o.stops {
            *self.stops.entry(k.clone()).or_insert(0) += v;
        }
    }
    /// Model cost per success (micro-units), 0 without a success.
    pub fn cost_per_success(&self) -> u64 {
        self.cost_micros.checked_div(self.success).unwrap_or(0)
    }
    /// Approvals decided within the SLA, percent (100 with no approval).
    pub fn sla_met_pct(&self) -> f64 {
        if self.approvals == 0 {
            100.0
        } else {
            self.sla_met as f64 * 100.0 / self.approvals as f64
        }
    }
    /// Successes, percent of invoices.
    pub fn success_pct(&self) -> f64 {
        if self.invoices == 0 {
            0.0
        } else {
            self.success as f64 * 100.0 / self.invoices as f64
        }
    }
}

fn injected(class: FaultClass, run: &BatchRun) -> u64 {
    let b = &run.business;
    let (l, m, a) = (b.ledger.counts(), b.model.counts(), run.approver);
    let by = |c: FaultClass| match c {
        FaultClass::LostReply => l.lost_replies,
        FaultClass::Restart => b.restarts.fired(),
        FaultClass::DuplicateCallback => a.duplicates + run.duplicate_uploads,
        FaultClass::OldSchema => m.old_answers,
        FaultClass::CompensationFailure => l.reversal_failures,
        FaultClass::FullQueue => run.permits.denied(),
        FaultClass::SlowApprover => a.delayed,
        FaultClass::All => 0,
    };
    match class {
        FaultClass::All => FaultClass::SEVEN.iter().map(|c| by(*c)).sum(),
        c => by(c),
    }
}

/// The figures of a kernel batch, read from the stored instances and the fakes.
pub fn kernel_figures(class: FaultClass, cases: &[Case], run: &BatchRun) -> Figures {
    let b = &run.business;
    let mut f = Figures {
        invoices: cases.len() as u64,
        injected: injected(class, run),
        backlog_peak: run.permits.peak(),
        cost_micros: b.model.counts().cost_micros,
        duplicate_side_effects: b.ledger.counts().duplicate_effects + b.mailer.duplicates(),
        restarts: run.restarts,
        ..Figures::default()
    };
    let by_id: BTreeMap<&str, &WorkflowInstance> = run.instances.iter().map(|i| (i.workflow_id.as_str(), i)).collect();
    for c in cases {
        let Some(i) = by_id.get(pipeline::workflow_id(&c.hash).as_str()).copied() else {
            f.unknown_states += 1;
            continue;
        };
        let (net, mails) = (b.ledger.net(&c.hash), b.mailer.sent(&c.hash));
        // Retries: physical attempts past the first, re-samples, inverse attempts past the first.
        f.retries += u64::from(i.retry_count);
        for s in &i.steps {
            f.retries += u64::from(s.attempt.saturating_sub(1));
            for e in s.record.iter().flat_map(|r| r.entries.iter()) {
                if let kernel_core::record::RecordEntry::Model(m) = e {
                    f.retries += m.samples.len().saturating_sub(1) as u64;
                    f.migrated += m.migrations.len() as u64;
                }
            }
        }
        for r in i.compensation.iter().flat_map(|c| c.steps.iter()) {
            f.retries += u64::from(r.attempts.saturating_sub(1));
        }
        let exec: i64 = i.steps.iter().map(|s| s.elapsed_ms.as_millis()).sum();
        if let Some(end) = i.finished_at {
            f.exec_ms += exec;
            f.wait_ms += ((end - i.created_at).as_millis() - exec).max(0);
        }
        if let Some(h) = i.output.get("approve").and_then(|o| HumanResult::from_output(o).ok()) {
            f.approvals += 1;
            f.sla_met += u64::from(h.level == 0 && matches!(h.concluded, Concluded::Person { .. }));
            f.escalated += u64::from(h.level > 0 || matches!(h.concluded, Concluded::Sla { .. }));
        }
        let failed_at = i.steps.iter().find(|s| s.status == StepStatus::Failed).map(|s| s.name.clone());
        let known = match i.status {
            WorkflowStatus::Completed if i.output.contains_key("notify") => {
                f.success += 1;
                net == 1 && mails >= 1
            }
            WorkflowStatus::Completed => {
                match i.output.get("approve").and_then(|o| HumanResult::from_output(o).ok()) {
                    Some(h) if h.approved() => f.failed += 1,
                    Some(h) if matches!(h.concluded, Concluded::Person { .. }) => f.rejected += 1,
                    _ => f.approval_timed_out += 1,
                }
                net == 0 && mails == 0
            }
            WorkflowStatus::Failed => {
                let at = failed_at.unwrap_or_else(|| "unknown".into());
                *f.stops.entry(at.clone()).or_insert(0) += 1;
                match i.compensation.as_ref().map(|r| r.outcome) {
                    _ if at == "validate" => {
                        f.refused += 1;
                        net == 0 && mails == 0
                    }
                    Some(CompensationOutcome::Recovered) if net == 0 && mails == 0 && i.output.contains_key("post") => {
                        f.compensated += 1;
                        true
                    }
                    Some(CompensationOutcome::Escalated) => {
                        f.compensation_escalated += 1;
                        mails == 0
                    }
                    Some(CompensationOutcome::CompensationFailed | CompensationOutcome::PartiallyRecovered) => {
                        f.compensation_failed += 1;
                        false
                    }
                    _ => {
                        f.failed += 1;
                        net == 0 && mails == 0
                    }
                }
            }
            _ => false,
        };
        f.unknown_states += u64::from(!known);
    }
    f
}

/// How the baseline agent ended one invoice, as it believes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AgentEnd {
    Posted,
    Refused,
    Rejected,
    TimedOut,
    Compensated,
    GaveUp,
    Failed(&'static str),
}

/// The all-agent baseline: one loop per upload that keeps its progress in its own context
/// (lost on a restart, after which it re-plans from the start), invents a fresh key per
/// attempt, and calls the same fakes under the same fault schedule.
fn agent(
    b: &Business,
    case: &Case,
    rng: &mut SmallRng,
    f: &mut Figures,
    restart: &mut Option<&'static str>,
) -> AgentEnd {
    let schema = pipeline::schema().expect("the fixed schema compiles");
    let key = |what: &str, rng: &mut SmallRng| format!("agent-{what}-{:016x}", rng.gen::<u64>());
    'plan: loop {
        let mut doc = None;
        for sample in 0..3 {
            if sample > 0 {
                f.retries += 1;
            }
            let Ok(a) = b.model.sample(&case.hash, &case.file) else { continue };
            let v: serde_json::Value = serde_json::from_str(&a.raw).unwrap_or_default();
            if schema.errors(&v).is_empty() {
                doc = serde_json::from_value::<Document>(v).ok();
                break;
            }
        }
        let Some(doc) = doc else { return AgentEnd::Failed("extract") };
        if *restart == Some("extract") {
            *restart = None;
            f.restarts += 1;
            continue 'plan;
        }
        let Ok(v) = pipeline::check(b, &doc, &case.hash) else { return AgentEnd::Refused };
        if v["needs_approval"].as_bool() == Some(true) {
            f.approvals += 1;
            match case.approver {
                ApproverPlan::Prompt | ApproverPlan::Slow => f.sla_met += 1,
                ApproverPlan::Reject => {
                    f.sla_met += 1;
                    return AgentEnd::Rejected;
                }
                ApproverPlan::AbsentThenCfo => f.escalated += 1,
                ApproverPlan::Absent => {
                    f.escalated += 1;
                    return AgentEnd::TimedOut;
                }
            }
        }
        let mut posted = false;
        for attempt in 0..5 {
            if attempt > 0 {
                f.retries += 1;
            }
            match b.ledger.post(&key("post", rng), &case.hash, doc.total_cents) {
                Ok(_) => {
                    posted = true;
                    break;
                }
                Err(_) => continue,
            }
        }
        if !posted {
            return AgentEnd::Failed("post");
        }
        if *restart == Some("post") {
            *restart = None;
            f.restarts += 1;
            continue 'plan;
        }
        if b.ledger.reconcile(&case.hash, &doc.period).is_err() {
            for attempt in 0..3 {
                if attempt > 0 {
                    f.retries += 1;
                }
                if b.ledger.reverse(&key("reverse", rng), &case.hash).is_ok() {
                    return AgentEnd::Compensated;
                }
            }
            return AgentEnd::GaveUp;
        }
        b.mailer.send(&key("mail", rng), &case.hash, &format!("ap@{}.example", doc.vendor));
        if *restart == Some("notify") {
            *restart = None;
            f.restarts += 1;
            continue 'plan;
        }
        return AgentEnd::Posted;
    }
}

/// The baseline's figures over `cases` (one batch: run one after another on fresh fakes).
pub fn baseline_figures(class: FaultClass, cases: &[Case], seed: u64) -> Figures {
    let b = business(Timing::default(), cases);
    let mut rng = SmallRng::seed_from_u64(seed ^ 0xa9e7);
    let mut f = Figures { invoices: cases.len() as u64, ..Figures::default() };
    let mut dup_uploads = 0;
    for c in cases {
        let mut restart = c.restart_at;
        let mut end = agent(&b, c, &mut rng, &mut f, &mut restart);
        if c.duplicate {
            // The same upload again: a new loop with a new context. (A repeated approval
            // callback reaches a context that already moved on, and is ignored.)
            dup_uploads += 1;
            let again = agent(&b, c, &mut rng, &mut f, &mut restart);
            if end != AgentEnd::Posted {
                end = again;
            }
        }
        let (net, mails) = (b.ledger.net(&c.hash), b.mailer.sent(&c.hash));
        let known = match end {
            AgentEnd::Posted => {
                f.success += 1;
                net >= 1 && mails >= 1
            }
            AgentEnd::Refused => {
                f.refused += 1;
                *f.stops.entry("validate".into()).or_insert(0) += 1;
                net == 0 && mails == 0
            }
            AgentEnd::Rejected => {
                f.rejected += 1;
                net == 0
            }
            AgentEnd::TimedOut => {
                f.approval_timed_out += 1;
                net == 0
            }
            AgentEnd::Compensated => {
                f.compensated += 1;
                *f.stops.entry("reconcile".into()).or_insert(0) += 1;
                net == 0 && mails == 0
            }
            AgentEnd::GaveUp => {
                f.compensation_failed += 1;
                *f.stops.entry("reconcile".into()).or_insert(0) += 1;
                false
            }
            AgentEnd::Failed(at) => {
                f.failed += 1;
                *f.stops.entry(at.into()).or_insert(0) += 1;
                net == 0 && mails == 0
            }
        };
        f.unknown_states += u64::from(!known);
    }
    let (l, m) = (b.ledger.counts(), b.model.counts());
    f.cost_micros = m.cost_micros;
    f.duplicate_side_effects = l.duplicate_effects + b.mailer.duplicates();
    f.injected = match class {
        FaultClass::LostReply => l.lost_replies,
        FaultClass::Restart => f.restarts,
        FaultClass::DuplicateCallback => dup_uploads,
        FaultClass::OldSchema => m.old_answers,
        FaultClass::CompensationFailure => l.reversal_failures,
        FaultClass::FullQueue => 0,
        FaultClass::SlowApprover => cases.iter().filter(|c| c.approver.is_fault()).count() as u64,
        FaultClass::All => l.lost_replies + f.restarts + dup_uploads + m.old_answers + l.reversal_failures,
    };
    f
}

/// One class's figures side by side.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClassResult {
    /// The kernel's.
    pub kernel: Figures,
    /// The baseline's.
    pub baseline: Figures,
}

/// What an evaluation found.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    /// Invoices in all.
    pub invoices: usize,
    /// The seed.
    pub seed: u64,
    /// The store.
    pub store: String,
    /// Per class, in [`FaultClass::EVERY`] order.
    pub classes: Vec<(FaultClass, ClassResult)>,
    /// Wall time of the kernel runs, seconds.
    pub kernel_seconds: f64,
}

/// Invoices per batch (one world each).
pub const BATCH: usize = 25;

impl Evaluation {
    /// Totals over every class.
    pub fn total(&self) -> ClassResult {
        let mut t = ClassResult::default();
        for (_, r) in &self.classes {
            t.kernel.add(&r.kernel);
            t.baseline.add(&r.baseline);
        }
        t
    }
    /// The fewest injections of any of the seven classes (on the kernel).
    pub fn faults_injected_min(&self) -> u64 {
        self.classes.iter().filter(|(c, _)| *c != FaultClass::All).map(|(_, r)| r.kernel.injected).min().unwrap_or(0)
    }
    /// The acceptance of the kernel's figures: every class injected at least once, no
    /// duplicate side effect, no unknown state, something compensated and escalated.
    ///
    /// # Errors
    /// What was not met.
    pub fn verdict(&self) -> Result<(), String> {
        let t = self.total().kernel;
        let mut wrong = Vec::new();
        if self.faults_injected_min() == 0 {
            wrong.push("a fault class injected nothing");
        }
        if t.duplicate_side_effects > 0 {
            wrong.push("duplicate side effects");
        }
        if t.unknown_states > 0 {
            wrong.push("unknown states");
        }
        if t.compensated == 0 || t.escalated == 0 {
            wrong.push("nothing compensated or nothing escalated");
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(format!("invoice-eval failed: {}", wrong.join(", ")))
        }
    }

    /// The `invoice-eval:` line.
    pub fn line(&self) -> String {
        let t = self.total();
        format!(
            "invoice-eval: invoices={} fault_classes=7 faults_injected_min={} success={} duplicate_side_effects={} unknown_states={} compensated={} escalated={} sla_met_pct={:.1} baseline_duplicate_side_effects={}",
            t.kernel.invoices,
            self.faults_injected_min(),
            t.kernel.success,
            t.kernel.duplicate_side_effects,
            t.kernel.unknown_states,
            t.kernel.compensated,
            t.kernel.escalated,
            t.kernel.sla_met_pct(),
            t.baseline.duplicate_side_effects
        )
    }
}

/// Run `invoices` seeded invoices, split evenly over the seven classes and all together,
/// on the kernel (`store`) and on the baseline.
///
/// # Errors
/// A port's error, or a batch whose drive stalled.
pub async fn evaluate(invoices: usize, seed: u64, store: &StoreKind) -> kernel_core::Result<Evaluation> {
    let started = std::time::Instant::now();
    let mut classes = Vec::new();
    let per = FaultClass::EVERY.len();
    let mut batch_no = 0;
    for (k, class) in FaultClass::EVERY.into_iter().enumerate() {
        let n = invoices / per + usize::from(k < invoices % per);
        let all = cases(class, n, seed);
        let mut r = ClassResult::default();
        for (c, chunk) in all.chunks(BATCH).enumerate() {
            let uploads: Vec<Upload> = chunk.iter().map(Case::upload).collect();
            // Every other batch of the old-schema class starts on the previous build, which
            // extracts in `invoice@1`; the current build resumes from that record.
            let upgrade = class == FaultClass::OldSchema && c % 2 == 0;
            let run = run_batch(
                store,
                seed,
                batch_no,
                limits(class),
                // The full queue is a burst: invoices arrive ten times as fast.
                &|timing| business(if class == FaultClass::FullQueue { timing.scaled(10) } else { timing }, chunk),
                &uploads,
                upgrade,
            )
            .await?;
            batch_no += 1;
            let fig = kernel_figures(class, chunk, &run);
            r.kernel.add(&fig);
            // The baseline on the same batch, with fresh fakes as the kernel had.
            r.baseline.add(&baseline_figures(class, chunk, seed ^ (c as u64) << 20));
        }
        classes.push((class, r));
    }
    Ok(Evaluation {
        invoices,
        seed,
        store: store.name().into(),
        classes,
        kernel_seconds: started.elapsed().as_secs_f64(),
    })
}
