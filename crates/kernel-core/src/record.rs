//! Recorded facts of a step (K-17.3, K-17.4, K-17.4a): what a step's current logical
//! attempt recorded — model calls with every sample, values that steer control (time,
//! randomness, external lookups), operator decisions — and the bounded history of earlier
//! logical attempts kept for audit.
//!
//! A record is written with the step, under the claim token (K-6.4), **before** the activity
//! continues: recovery, retries of the same logical attempt and re-runs after a crash read
//! it back and never call the model again. A record belongs to one logical attempt,
//! `(run, epoch)` (K-17.1): a record of another attempt is history, never replayed.

use crate::domain::{Instant, StepError};
use crate::error::{Error, Result};
use crate::validate;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Entries one logical attempt may record (model calls, values, operator decisions).
pub const RECORD_ENTRIES_MAX: usize = 256;
/// Samples one model call may record (the first answer plus re-samples).
pub const MODEL_SAMPLES_MAX: usize = 16;
/// Default number of earlier logical attempts a step keeps in its history.
pub const HISTORY_ENTRIES_DEFAULT: usize = 10;
/// Default serialized size of a step's history; the oldest entries go first.
pub const HISTORY_BYTES_DEFAULT: usize = 64 * 1024;
/// Longest label, version id, raw output or error text kept in a record, in bytes.
pub const RECORD_TEXT_BYTES_MAX: usize = 64 * 1024;

/// A named, versioned thing: a prompt template, a model, an output schema.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct VersionRef {
    /// Identifier, e.g. `invoice-extract` or `gpt-x`.
    pub id: String,
    /// Version, e.g. `3` or `2026-11-01`.
    pub version: String,
}

impl VersionRef {
    /// `id` at `version`.
    pub fn new(id: impl Into<String>, version: impl Into<String>) -> Self {
        VersionRef { id: id.into(), version: version.into() }
    }

    fn validate(&self, field: &str) -> Result<()> {
        validate::identifier(&format!("{field}.id"), &self.id)?;
        validate::identifier(&format!("{field}.version"), &self.version)
    }
}

impl std::fmt::Display for VersionRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.id, self.version)
    }
}

/// Tokens and cost of one sample, as the provider reported them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
    /// Cost in millionths of the account's currency unit.
    pub cost_micros: u64,
}

impl Usage {
    /// The sum of two usages (saturating).
    pub fn plus(self, o: Usage) -> Usage {
        Usage {
            input_tokens: self.input_tokens.saturating_add(o.input_tokens),
            output_tokens: self.output_tokens.saturating_add(o.output_tokens),
            cost_micros: self.cost_micros.saturating_add(o.cost_micros),
        }
    }
}

/// One answer of a model: raw text, what parsing made of it, what validation said.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelSample {
    /// The raw output text.
    pub raw: String,
    /// The parsed output, when the raw text was JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parsed: Option<Value>,
    /// Validation errors against the call's schema; empty means valid.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// Tokens and cost.
    #[serde(default)]
    pub usage: Usage,
    /// When it was recorded.
    pub recorded_at: Instant,
}

impl ModelSample {
    /// Parsed and valid.
    pub fn is_valid(&self) -> bool {
        self.parsed.is_some() && self.errors.is_empty()
    }
}

/// Where a cached answer came from (K-17.7).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheProvenance {
    /// The content-hash key (hex SHA-256).
    pub key: String,
    /// When the cache stored it.
    pub stored_at: Instant,
}

/// An output migrated from one schema version to another on resume (K-17.4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchemaMigration {
    /// The version the output was recorded under.
    pub from: String,
    /// The version it was migrated to.
    pub to: String,
    /// The output before migration.
    pub before: Value,
    /// When the migration was recorded.
    pub at: Instant,
}

/// One model call and everything it produced (K-17.3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCall {
    /// The call's label within the step (the activity names its calls).
    pub label: String,
    /// Hex SHA-256 of the request (prompt id/version, model id/version, parameters, input).
    pub input_hash: String,
    /// Prompt template.
    pub prompt: VersionRef,
    /// Model.
    pub model: VersionRef,
    /// Sampling parameters (temperature, …), as sent.
    #[serde(default)]
    pub params: Value,
    /// The output schema the answers were validated against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<VersionRef>,
    /// Every sample in order, the invalid ones included.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub samples: Vec<ModelSample>,
    /// The accepted output (valid, migrated to the step's current schema version when it
    /// was recorded under another).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// Set when the answer came from the result cache instead of the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheProvenance>,
    /// Schema migrations applied to the output, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub migrations: Vec<SchemaMigration>,
    /// Set when the re-sample budget ran out with no valid sample (a permanent error).
    #[serde(default)]
    pub exhausted: bool,
}

impl ModelCall {
    /// Tokens and cost of every sample.
    pub fn usage(&self) -> Usage {
        self.samples.iter().fold(Usage::default(), |u, s| u.plus(s.usage))
    }
}

/// A value that steers control, recorded once (K-17.4a): the time, a random draw, an
/// external lookup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedValue {
    /// The value's label within the step.
    pub label: String,
    /// The value.
    pub value: Value,
    /// When it was recorded.
    pub recorded_at: Instant,
}

/// Largest operator-supplied output an [`OperatorEntry`] keeps a copy of, in bytes of its
/// JSON form. A larger output is kept as its [`OutputDigest`] only: the output itself is the
/// step's output and stays whole in the dead-letter record's decision, and a record that
/// copied it in full could outgrow the payload limit together with the output.
pub const OPERATOR_OUTPUT_BYTES_MAX: usize = 4_096;

/// What an operator's decision on a dead-lettered step did (K-17.2). Stored as the
/// snake_case strings `retry`, `complete`, `fail` — the ones records held before this type
/// existed, so they still decode — and `complete_refused`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperatorAction {
    /// The step ran again in its next epoch.
    Retry,
    /// The step completed with the operator's output.
    Complete,
    /// The step failed.
    Fail,
    /// A `Complete` of a step whose outcome only its own activity may supply (a human
    /// task, [`OutcomeAuthority::ActivityOnly`](crate::OutcomeAuthority::ActivityOnly)),
    /// decided where the step's definition was unknown: the output was not applied and
    /// the step ran again in its next epoch, as a retry does.
    CompleteRefused,
}

impl OperatorAction {
    /// The snake_case name used in documents.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Retry => "retry",
            Self::Complete => "complete",
            Self::Fail => "fail",
            Self::CompleteRefused => "complete_refused",
        }
    }
}

impl std::fmt::Display for OperatorAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Compares with the stored name, as the `String` this field was before did.
impl PartialEq<&str> for OperatorAction {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// The SHA-256 and size of a JSON value, for the audit of an operator-supplied output:
/// both over its canonical form (object keys sorted at every level, no whitespace), so the
/// digest is the same whichever store or client re-ordered its keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OutputDigest {
    /// Lowercase hex SHA-256 of the canonical JSON.
    pub sha256: String,
    /// Length of the canonical JSON in bytes.
    pub bytes: u64,
}

impl OutputDigest {
    /// The digest of `v`.
    ///
    /// ```
    /// use kernel_core::record::OutputDigest;
    /// let a = OutputDigest::of(&serde_json::json!({"b": 1, "a": [true]}));
    /// assert_eq!(a.bytes, r#"{"a":[true],"b":1}"#.len() as u64);
    /// assert_eq!(a.sha256.len(), 64);
    /// ```
    pub fn of(v: &Value) -> OutputDigest {
        use sha2::Digest;
        let canonical = crate::model_call::canonical_json(v);
        OutputDigest {
            sha256: crate::model_call::hex(&sha2::Sha256::digest(canonical.as_bytes())),
            bytes: canonical.len() as u64,
        }
    }
}

/// A decision an operator made about the step (dead-letter actions).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperatorEntry {
    /// What the decision did.
    pub action: OperatorAction,
    /// Who decided.
    pub actor: String,
    /// A copy of the supplied output of a `complete` (or a refused one), when its JSON form
    /// is at most [`OPERATOR_OUTPUT_BYTES_MAX`] bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// The digest of the supplied output, whatever its size (absent on entries recorded
    /// before it existed, and for retry and fail).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_digest: Option<OutputDigest>,
    /// When the engine applied it.
    pub at: Instant,
}

impl OperatorEntry {
    /// The entry of an operator-supplied `output`: its digest always, a copy when it is at
    /// most [`OPERATOR_OUTPUT_BYTES_MAX`] bytes.
    pub fn with_output(action: OperatorAction, actor: &str, output: &Value, at: Instant) -> OperatorEntry {
        let digest = OutputDigest::of(output);
        OperatorEntry {
            action,
            actor: actor.to_string(),
            output: (digest.bytes <= OPERATOR_OUTPUT_BYTES_MAX as u64).then(|| output.clone()),
            output_digest: Some(digest),
            at,
        }
    }
}

/// One recorded fact.
// Model calls are most of the entries, so boxing them would not save memory.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RecordEntry {
    /// A model call.
    Model(ModelCall),
    /// A recorded value.
    Value(RecordedValue),
    /// An operator decision.
    Operator(OperatorEntry),
}

impl RecordEntry {
    /// The entry's label (`operator` for operator decisions).
    pub fn label(&self) -> &str {
        match self {
            RecordEntry::Model(c) => &c.label,
            RecordEntry::Value(v) => &v.label,
            RecordEntry::Operator(_) => "operator",
        }
    }
}

/// What the current logical attempt `(run, epoch)` of a step recorded, in call order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// `workflow_run` of the attempt (K-17.1).
    pub run: u32,
    /// Per-step epoch of the attempt (K-17.1).
    pub epoch: u32,
    /// Entries in the order the activity made its calls.
    #[serde(default)]
    pub entries: Vec<RecordEntry>,
}

impl StepRecord {
    /// An empty record of the attempt `(run, epoch)`.
    pub fn new(run: u32, epoch: u32) -> Self {
        StepRecord { run, epoch, entries: Vec::new() }
    }

    /// Whether it belongs to the logical attempt `(run, epoch)`.
    pub fn is_of(&self, run: u32, epoch: u32) -> bool {
        self.run == run && self.epoch == epoch
    }

    /// Every model call.
    pub fn model_calls(&self) -> impl Iterator<Item = &ModelCall> {
        self.entries.iter().filter_map(|e| match e {
            RecordEntry::Model(c) => Some(c),
            _ => None,
        })
    }

    /// The K-2 check of a record about to be stored: at most [`RECORD_ENTRIES_MAX`]
    /// entries and [`MODEL_SAMPLES_MAX`] samples per call, labels and versions follow the
    /// identifier rule, texts at most [`RECORD_TEXT_BYTES_MAX`], every value storable, and
    /// the whole record at most `payload_bytes_max` serialized bytes.
    pub fn validate(&self, field: &str, payload_bytes_max: usize) -> Result<()> {
        if self.entries.len() > RECORD_ENTRIES_MAX {
            return Err(Error::invalid(
                field,
                format_args!("{} entries, at most {RECORD_ENTRIES_MAX}", self.entries.len()),
            ));
        }
        for (i, e) in self.entries.iter().enumerate() {
            let f = format!("{field}.entries[{i}]");
            validate::identifier(&format!("{f}.label"), e.label())?;
            match e {
                RecordEntry::Model(c) => {
                    c.prompt.validate(&format!("{f}.prompt"))?;
                    c.model.validate(&format!("{f}.model"))?;
                    if let Some(s) = &c.schema {
                        s.validate(&format!("{f}.schema"))?;
                    }
                    if c.samples.len() > MODEL_SAMPLES_MAX {
                        return Err(Error::invalid(
                            format!("{f}.samples"),
                            format_args!("{} samples, at most {MODEL_SAMPLES_MAX}", c.samples.len()),
                        ));
                    }
                    for s in &c.samples {
                        text(&format!("{f}.samples.raw"), &s.raw)?;
                        for e in &s.errors {
                            text(&format!("{f}.samples.errors"), e)?;
                        }
                    }
                }
                RecordEntry::Value(_) => {}
                RecordEntry::Operator(o) => validate::identifier(&format!("{f}.actor"), &o.actor)?,
            }
        }
        let v = serde_json::to_value(self).map_err(|e| Error::invalid(field, e))?;
        validate::payload(field, &v, payload_bytes_max)
    }
}

fn text(field: &str, s: &str) -> Result<()> {
    if s.len() > RECORD_TEXT_BYTES_MAX {
        return Err(Error::invalid(field, format_args!("{} bytes, at most {RECORD_TEXT_BYTES_MAX}", s.len())));
    }
    if s.contains('\0') {
        return Err(Error::invalid(field, "contains NUL"));
    }
    Ok(())
}

/// Why a logical attempt ended up in the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HistoryReason {
    /// An operator's regenerate.
    Regenerate,
    /// An operator's retry of a dead-lettered step.
    DeadLetterRetry,
    /// The workflow was replayed (a new run).
    Replay,
    /// A step that depends on a regenerated step ran again.
    Upstream,
    /// A loop sent the workflow back: one iteration of the loop's body (K-4 amendment).
    Loop,
}

/// An earlier logical attempt of a step, kept for audit (K-17.3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// `workflow_run` of the attempt.
    pub run: u32,
    /// Epoch of the attempt.
    pub epoch: u32,
    /// Why it was superseded.
    pub reason: HistoryReason,
    /// Its output, when it had completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// Its last error, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<StepError>,
    /// What it recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<StepRecord>,
    /// When it was superseded.
    pub at: Instant,
}

/// How much history a step keeps: by count and by serialized bytes, oldest dropped first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryLimits {
    /// Most entries kept.
    pub entries_max: usize,
    /// Most serialized bytes kept.
    pub bytes_max: usize,
}

impl Default for HistoryLimits {
    fn default() -> Self {
        HistoryLimits { entries_max: HISTORY_ENTRIES_DEFAULT, bytes_max: HISTORY_BYTES_DEFAULT }
    }
}

impl HistoryLimits {
    /// `history` with `entry` appended, then the oldest entries dropped until both limits
    /// hold. An entry too large on its own is kept without its record, then without its
    /// output, so the fact that the attempt existed is never lost.
    ///
    /// ```
    /// use kernel_core::record::{HistoryEntry, HistoryLimits, HistoryReason};
    /// use kernel_core::domain::Instant;
    /// let e = |epoch| HistoryEntry { run: 0, epoch, reason: HistoryReason::Regenerate, output: None, error: None, record: None, at: Instant::ZERO };
    /// let limits = HistoryLimits { entries_max: 2, bytes_max: 1 << 20 };
    /// let h = limits.push(limits.push(limits.push(vec![], e(0)), e(1)), e(2));
    /// assert_eq!(h.iter().map(|e| e.epoch).collect::<Vec<_>>(), vec![1, 2]);
    /// ```
    pub fn push(&self, mut history: Vec<HistoryEntry>, mut entry: HistoryEntry) -> Vec<HistoryEntry> {
        let size = |e: &HistoryEntry| serde_json::to_vec(e).map_or(usize::MAX, |v| v.len());
        if size(&entry) > self.bytes_max {
            entry.record = None;
        }
        if size(&entry) > self.bytes_max {
            entry.output = None;
        }
        history.push(entry);
        while history.len() > self.entries_max.max(1) {
            history.remove(0);
        }
        let total = |h: &Vec<HistoryEntry>| serde_json::to_vec(h).map_or(usize::MAX, |v| v.len());
        while history.len() > 1 && total(&history) > self.bytes_max {
            history.remove(0);
        }
        history
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call() -> ModelCall {
        ModelCall {
            label: "extract".into(),
            input_hash: "ab".into(),
            prompt: VersionRef::new("p", "1"),
            model: VersionRef::new("m", "2"),
            params: json!({"temperature": 0.2}),
            schema: Some(VersionRef::new("invoice", "1")),
            samples: vec![ModelSample {
                raw: "{}".into(),
                parsed: Some(json!({})),
                errors: vec![],
                usage: Usage { input_tokens: 3, output_tokens: 4, cost_micros: 5 },
                recorded_at: Instant::from_millis(7),
            }],
            output: Some(json!({})),
            cache: None,
            migrations: vec![],
            exhausted: false,
        }
    }

    #[test]
    fn a_record_round_trips_through_json() {
        let r = StepRecord {
            run: 1,
            epoch: 2,
            entries: vec![
                RecordEntry::Model(call()),
                RecordEntry::Value(RecordedValue { label: "now".into(), value: json!(5), recorded_at: Instant::ZERO }),
            ],
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["entries"][0]["kind"], "model");
        assert_eq!(v["entries"][1]["kind"], "value");
        assert_eq!(serde_json::from_value::<StepRecord>(v).unwrap(), r);
    }

    /// Operator entries stored before `OperatorEntry::action` was typed (a plain string,
    /// no digest) still decode, to the same strings when written again.
    #[test]
    fn operator_entries_stored_as_strings_still_decode() {
        for (stored, action) in
            [("retry", OperatorAction::Retry), ("complete", OperatorAction::Complete), ("fail", OperatorAction::Fail)]
        {
            let v = json!({"entries": [{"kind": "operator", "action": stored, "actor": "ops", "at": 7}], "run": 0, "epoch": 0});
            let r: StepRecord = serde_json::from_value(v.clone()).unwrap();
            let RecordEntry::Operator(o) = &r.entries[0] else { panic!("{r:?}") };
            assert_eq!((o.action, o.action.as_str(), o.output_digest.as_ref()), (action, stored, None));
            assert_eq!(serde_json::to_value(&r).unwrap(), v, "written back unchanged");
        }
        let legacy = json!({"kind": "operator", "action": "complete", "actor": "ops", "output": {"ok": true}, "at": 7});
        let RecordEntry::Operator(o) = serde_json::from_value(legacy).unwrap() else { panic!() };
        assert_eq!(o.output, Some(json!({"ok": true})));
        let unknown = json!({"kind": "operator", "action": "approve", "actor": "ops", "at": 7});
        assert!(serde_json::from_value::<RecordEntry>(unknown).is_err(), "an unknown action is not guessed");
    }

    /// An operator entry keeps the digest of every supplied output and a copy only up to
    /// the named limit; the digest does not depend on key order.
    #[test]
    fn operator_entries_keep_a_digest_and_a_bounded_copy() {
        let small = json!({"b": 1, "a": "x"});
        let e = OperatorEntry::with_output(OperatorAction::Complete, "ops", &small, Instant::ZERO);
        assert_eq!(e.output, Some(small.clone()));
        let d = e.output_digest.unwrap();
        assert_eq!(d.bytes, br#"{"a":"x","b":1}"#.len() as u64);
        assert_eq!(d, OutputDigest::of(&json!({"a": "x", "b": 1})), "key order is not part of the digest");
        let at_limit = json!("x".repeat(OPERATOR_OUTPUT_BYTES_MAX - 2));
        let e = OperatorEntry::with_output(OperatorAction::Complete, "ops", &at_limit, Instant::ZERO);
        assert_eq!((e.output.is_some(), e.output_digest.unwrap().bytes), (true, OPERATOR_OUTPUT_BYTES_MAX as u64));
        let big = json!("x".repeat(OPERATOR_OUTPUT_BYTES_MAX - 1));
        let e = OperatorEntry::with_output(OperatorAction::Complete, "ops", &big, Instant::ZERO);
        assert_eq!(e.output, None, "over the limit: no copy");
        assert_eq!(e.output_digest, Some(OutputDigest::of(&big)), "but its trace");
        assert_ne!(OutputDigest::of(&big), OutputDigest::of(&at_limit));
    }

    #[test]
    fn validation_bounds_entries_samples_and_bytes() {
        let mut r = StepRecord::new(0, 0);
        r.entries.push(RecordEntry::Model(call()));
        assert!(r.validate("record", 1 << 20).is_ok());
        assert!(r.validate("record", 10).is_err(), "over the payload limit");
        let mut many = call();
        many.samples = vec![many.samples[0].clone(); MODEL_SAMPLES_MAX + 1];
        assert!(StepRecord { run: 0, epoch: 0, entries: vec![RecordEntry::Model(many)] }
            .validate("r", 1 << 20)
            .is_err());
        let mut bad = call();
        bad.label = String::new();
        assert!(StepRecord { run: 0, epoch: 0, entries: vec![RecordEntry::Model(bad)] }
            .validate("r", 1 << 20)
            .is_err());
        let entries =
            vec![
                RecordEntry::Value(RecordedValue { label: "x".into(), value: json!(1), recorded_at: Instant::ZERO });
                RECORD_ENTRIES_MAX + 1
            ];
        assert!(StepRecord { run: 0, epoch: 0, entries }.validate("r", 1 << 20).is_err());
    }

    #[test]
    fn history_drops_the_oldest_by_bytes_and_keeps_the_fact_of_a_huge_entry() {
        let e = |epoch, out: Value| HistoryEntry {
            run: 0,
            epoch,
            reason: HistoryReason::Regenerate,
            output: Some(out),
            error: None,
            record: None,
            at: Instant::ZERO,
        };
        let limits = HistoryLimits { entries_max: 10, bytes_max: 300 };
        let mut h = vec![];
        for i in 0..5 {
            h = limits.push(h, e(i, json!("x".repeat(100))));
        }
        assert!(serde_json::to_vec(&h).unwrap().len() <= 300);
        assert_eq!(h.last().unwrap().epoch, 4);
        let h = limits.push(h, e(9, json!("y".repeat(1000))));
        assert!(serde_json::to_vec(&h).unwrap().len() <= 300, "the whole history, brackets included");
        let last = h.last().unwrap();
        assert_eq!((last.epoch, last.output.clone()), (9, None), "kept, without its output");
    }
}
