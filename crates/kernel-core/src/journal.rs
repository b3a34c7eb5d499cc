//! The step journal behind [`ActivityContext::model`](crate::ActivityContext::model) and
//! [`ActivityContext::record`](crate::ActivityContext::record): the n-th recorded call of an
//! invocation is matched to the n-th entry of the step's record for its logical attempt
//! (K-17.3). A recorded entry is returned as recorded; a new one is written with the step,
//! under the claim token, before the call returns (K-6.4) — so nothing the activity does
//! after it can happen unless the record is durable.

use crate::activity::{ActivityContext, ActivityError};
use crate::domain::Instant;
use crate::model_call::{Model, ModelRequest, OutputSchema};
use crate::ports::{CacheKey, CacheVersions, DynClock, DynResultCache};
use crate::record::*;
use serde_json::Value;
use std::sync::Arc;

/// Writes a step's record under the claim that runs it.
#[async_trait::async_trait]
pub(crate) trait RecordWriter: Send + Sync {
    /// One guarded write of the step's record (and history, when given). A miss or an
    /// uncertain outcome ends the claim: the activity gets a transient error and must stop.
    async fn write(&self, record: StepRecord, history: Option<Vec<HistoryEntry>>) -> Result<(), ActivityError>;
}

/// How a step's model calls behave (from its definition).
#[derive(Clone, Default)]
pub(crate) struct ModelSettings {
    pub(crate) schema: Option<OutputSchema>,
    pub(crate) resamples: Option<u32>,
    pub(crate) read_only: bool,
}

pub(crate) struct StepJournal {
    pub(crate) writer: Arc<dyn RecordWriter>,
    pub(crate) clock: Arc<DynClock>,
    pub(crate) cache: Option<Arc<DynResultCache>>,
    pub(crate) settings: ModelSettings,
    pub(crate) key: String,
    pub(crate) payload_bytes_max: usize,
    pub(crate) state: tokio::sync::Mutex<JournalState>,
    /// Set once a record write failed or was uncertain: the claim has ended or must, and
    /// nothing more is recorded (a later write could overwrite what the failed one did).
    pub(crate) poisoned: std::sync::atomic::AtomicBool,
}

pub(crate) struct JournalState {
    pub(crate) record: StepRecord,
    /// The step's history with a stale record (of an earlier run) appended, written with
    /// the first new entry.
    pub(crate) pending_history: Option<Vec<HistoryEntry>>,
    pub(crate) cursor: usize,
}

impl JournalState {
    /// The state for an invocation of `step` in run `run`: its record when it belongs to
    /// the current logical attempt, else a fresh one (a stale record goes to history).
    pub(crate) fn of(step: &crate::domain::Step, run: u32, limits: &HistoryLimits, now: Instant) -> JournalState {
        match &step.record {
            Some(r) if r.is_of(run, step.epoch) => JournalState { record: r.clone(), pending_history: None, cursor: 0 },
            Some(stale) => {
                let entry = HistoryEntry {
                    run: stale.run,
                    epoch: stale.epoch,
                    reason: HistoryReason::Replay,
                    output: None,
                    error: None,
                    record: Some(stale.clone()),
                    at: now,
                };
                JournalState {
                    record: StepRecord::new(run, step.epoch),
                    pending_history: Some(limits.push(step.history.clone(), entry)),
                    cursor: 0,
                }
            }
            None => JournalState { record: StepRecord::new(run, step.epoch), pending_history: None, cursor: 0 },
        }
    }
}

fn permanent(msg: impl Into<String>) -> ActivityError {
    ActivityError::permanent(msg)
}

impl StepJournal {
    async fn commit(&self, st: &mut JournalState) -> Result<(), ActivityError> {
        if let Err(e) = st.record.validate("record", self.payload_bytes_max) {
            return Err(permanent(format!("the step's record would exceed its limits: {e}")));
        }
        let history = st.pending_history.clone();
        if let Err(e) = self.writer.write(st.record.clone(), history).await {
            self.poisoned.store(true, std::sync::atomic::Ordering::SeqCst);
            return Err(e);
        }
        st.pending_history = None;
        Ok(())
    }

    /// The journal's state for one recorded call: refused when another recorded call of
    /// this invocation is in progress (a nested or concurrent call could not be matched to
    /// its record on the next run), or after a failed record write.
    fn enter(&self, label: &str) -> Result<tokio::sync::MutexGuard<'_, JournalState>, ActivityError> {
        if self.poisoned.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ActivityError::transient(
                "a record write of this invocation failed; stop and let the step retry",
            ));
        }
        self.state.try_lock().map_err(|_| {
            permanent(format!(
                "recorded call `{label}` made while another recorded call of this invocation is in progress: \
                 make recorded calls one at a time, never from inside another (K-17.4a)"
            ))
        })
    }

    /// The live clock (not the invocation's start): what an agent's deadline is checked
    /// against before a new sub-step.
    pub(crate) fn now(&self) -> Instant {
        self.clock.now()
    }

    /// The serialized size of the step's record as it stands, and the most it may hold
    /// (the store payload limit).
    pub(crate) fn record_room(&self) -> Result<(usize, usize), ActivityError> {
        let st = self.enter("record_room")?;
        let bytes = serde_json::to_vec(&st.record).map(|b| b.len()).unwrap_or(usize::MAX);
        Ok((bytes, self.payload_bytes_max))
    }

    /// `f` of the entry the next recorded call of this invocation will be matched to
    /// (`None`: the call will be new), and of the entry the last one was matched to.
    /// Refused like a recorded call while another is in progress or after a failed write.
    pub(crate) fn around_cursor<R>(
        &self,
        f: impl FnOnce(Option<&RecordEntry>, Option<&RecordEntry>) -> R,
    ) -> Result<R, ActivityError> {
        let st = self.enter("cursor")?;
        let previous = st.cursor.checked_sub(1).and_then(|n| st.record.entries.get(n));
        Ok(f(st.record.entries.get(st.cursor), previous))
    }

    /// A recorded value (K-17.4a).
    pub(crate) async fn value<F>(&self, label: &str, f: F) -> Result<Value, ActivityError>
    where
        F: std::future::Future<Output = Result<Value, ActivityError>>,
    {
        crate::validate::identifier("label", label).map_err(|e| permanent(e.to_string()))?;
        let mut st = self.enter(label)?;
        let n = st.cursor;
        if let Some(e) = st.record.entries.get(n) {
            return match e {
                RecordEntry::Value(v) if v.label == label => {
                    let v = v.value.clone();
                    st.cursor += 1;
                    Ok(v)
                }
                other => Err(mismatch(n, label, other)),
            };
        }
        let value = f.await?;
        st.record.entries.push(RecordEntry::Value(RecordedValue {
            label: label.to_string(),
            value: value.clone(),
            recorded_at: self.clock.now(),
        }));
        if let Err(e) = self.commit(&mut st).await {
            st.record.entries.pop();
            return Err(e);
        }
        st.cursor += 1;
        Ok(value)
    }

    /// A model call (K-17.3, K-17.4, K-17.7).
    pub(crate) async fn model(
        &self,
        ctx: &ActivityContext,
        model: &dyn Model,
        mut req: ModelRequest,
    ) -> Result<Value, ActivityError> {
        crate::validate::identifier("label", &req.label).map_err(|e| permanent(e.to_string()))?;
        let version = model.version();
        let input_hash = req.input_hash();
        // A per-call schema (an agent's proposals) replaces the step's for this call only.
        let schema = req.schema.as_ref().or(self.settings.schema.as_ref());
        let resamples = req.resamples.or(self.settings.resamples).unwrap_or(crate::model_call::RESAMPLES_DEFAULT);
        let samples_max = (resamples as usize + 1).min(MODEL_SAMPLES_MAX);
        let mut st = self.enter(&req.label)?;
        let n = st.cursor;
        match st.record.entries.get(n) {
            Some(RecordEntry::Model(c)) if c.label == req.label => {
                if c.input_hash != input_hash {
                    return Err(permanent(format!(
                        "record mismatch at call {n} ({}): the request differs from the recorded one; \
                         values that steer a call must be recorded (K-17.4a)",
                        req.label
                    )));
                }
            }
            Some(other) => return Err(mismatch(n, &req.label, other)),
            None => {
                let mut call = ModelCall {
                    label: req.label.clone(),
                    input_hash: input_hash.clone(),
                    prompt: req.prompt.clone(),
                    model: version.clone(),
                    params: req.params.clone(),
                    schema: schema.map(|s| s.version().clone()),
                    samples: Vec::new(),
                    output: None,
                    cache: None,
                    migrations: Vec::new(),
                    exhausted: false,
                };
                if let Some(hit) =
                    self.cache_get(&req, &version).await.filter(|(v, _)| schema.is_none_or(|s| s.errors(v).is_empty()))
                {
                    call.output = Some(hit.0);
                    call.cache = Some(hit.1);
                    st.record.entries.push(RecordEntry::Model(call));
                    if let Err(e) = self.commit(&mut st).await {
                        st.record.entries.pop();
                        return Err(e);
                    }
                } else {
                    st.record.entries.push(RecordEntry::Model(call));
                }
            }
        }
        // An output recorded by an earlier invocation is read back, never generated again;
        // a streaming step shows it to its readers (K-16: the stream was reset before this
        // re-execution), so a reader reconnecting after a crash sees the recorded output.
        let replayed =
            matches!(&st.record.entries[n], RecordEntry::Model(c) if c.output.is_some() && c.cache.is_none());
        // The entry at `n` is this call's: continue from what it recorded.
        loop {
            let RecordEntry::Model(c) = &st.record.entries[n] else { unreachable!("checked above") };
            if let Some(out) = c.output.clone() {
                if replayed {
                    if let Some(stream) = ctx.stream() {
                        let text = c
                            .samples
                            .iter()
                            .rev()
                            .find(|s| s.is_valid())
                            .map_or_else(|| out.to_string(), |s| s.raw.clone());
                        if let Err(e) = stream.text(text).await {
                            tracing::warn!(error = %e, "recorded output not streamed");
                        }
                    }
                }
                let out = self.current_version(&mut st, n, out, schema).await?;
                st.cursor += 1;
                return Ok(out);
            }
            if c.exhausted || c.samples.len() >= samples_max {
                let last = c.samples.last().map(|s| s.errors.join("; ")).unwrap_or_default();
                if !c.exhausted {
                    set_call(&mut st, n, |c| c.exhausted = true);
                    self.commit(&mut st).await?;
                }
                return Err(permanent(format!(
                    "model call {} gave no valid output in {} samples: {last}",
                    req.label,
                    samples_len(&st, n)
                )));
            }
            req.sample_key = format!("{}|{}:{}|{}", self.key, req.label.len(), req.label, c.samples.len());
            if ctx.cancellation().is_cancelled() {
                return Err(ActivityError::transient("canceled before the next sample"));
            }
            let answer = model.generate(&req, ctx).await?;
            let (parsed, errors) = match serde_json::from_str::<Value>(&answer.raw) {
                Ok(v) => {
                    let errors = schema.map(|s| s.errors(&v)).unwrap_or_default();
                    (Some(v), errors)
                }
                Err(e) if schema.is_some() => (None, vec![format!("not JSON: {e}")]),
                // Without a schema the raw text is the output.
                Err(_) => (Some(Value::String(answer.raw.clone())), vec![]),
            };
            let sample = ModelSample {
                raw: answer.raw,
                parsed: parsed.clone(),
                errors: errors.clone(),
                usage: answer.usage,
                recorded_at: self.clock.now(),
            };
            let valid = parsed.is_some() && errors.is_empty();
            set_call(&mut st, n, |c| {
                c.samples.push(sample);
                if valid {
                    c.output = parsed.clone();
                }
            });
            if let Err(e) = self.commit(&mut st).await {
                set_call(&mut st, n, |c| {
                    c.samples.pop();
                    c.output = None;
                });
                if st
                    .record
                    .entries
                    .get(n)
                    .is_some_and(|e| matches!(e, RecordEntry::Model(c) if c.samples.is_empty() && c.cache.is_none()))
                {
                    st.record.entries.truncate(n);
                }
                return Err(e);
            }
            if valid {
                if let Some(out) = &parsed {
                    self.cache_put(&req, &version, out).await;
                }
            }
        }
    }

    /// The recorded output in the step's current schema version: migrated (and the
    /// migration recorded) when it was recorded under another, or a permanent error that
    /// parks the step when no migration is registered (K-17.4).
    async fn current_version(
        &self,
        st: &mut JournalState,
        n: usize,
        out: Value,
        schema: Option<&OutputSchema>,
    ) -> Result<Value, ActivityError> {
        let RecordEntry::Model(c) = &st.record.entries[n] else { unreachable!() };
        let (Some(schema), Some(recorded)) = (schema, c.schema.clone()) else { return Ok(out) };
        if recorded.version == schema.version().version && recorded.id == schema.version().id {
            return Ok(out);
        }
        let Some(migrate) = schema.migration_from(&recorded.version).filter(|_| recorded.id == schema.version().id)
        else {
            return Err(ActivityError::parked(format!(
                "recorded output of {} is schema {recorded}, the step expects {}, and no migration is registered",
                c.label,
                schema.version()
            )));
        };
        let migrated = migrate(out.clone()).map_err(|e| permanent(format!("migration from {recorded} failed: {e}")))?;
        let errors = schema.errors(&migrated);
        if !errors.is_empty() {
            return Err(permanent(format!("migration from {recorded} gave an invalid output: {}", errors.join("; "))));
        }
        let at = self.clock.now();
        let to = schema.version().clone();
        set_call(st, n, |c| {
            c.migrations.push(SchemaMigration {
                from: recorded.version.clone(),
                to: to.version.clone(),
                before: out,
                at,
            });
            c.schema = Some(to);
            c.output = Some(migrated.clone());
        });
        self.commit(st).await?;
        Ok(migrated)
    }

    async fn cache_get(&self, req: &ModelRequest, model: &VersionRef) -> Option<(Value, CacheProvenance)> {
        let (cache, key) = self.cache_key(req, model)?;
        match cache.get(&key, self.clock.now()).await {
            Ok(Some(hit)) => {
                Some((hit.value, CacheProvenance { key: key.as_str().to_string(), stored_at: hit.stored_at }))
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(error = %e, "result cache read failed; calling the model");
                None
            }
        }
    }

    async fn cache_put(&self, req: &ModelRequest, model: &VersionRef, out: &Value) {
        let (Some((cache, key)), Some(u)) = (self.cache_key(req, model), req.cache.as_ref()) else { return };
        if let Err(e) = cache.put(&key, out, self.clock.now(), u.ttl).await {
            tracing::warn!(error = %e, "result cache write failed");
        }
    }

    fn cache_key(&self, req: &ModelRequest, model: &VersionRef) -> Option<(&Arc<DynResultCache>, CacheKey)> {
        let u = req.cache.as_ref()?;
        if !self.settings.read_only {
            return None;
        }
        let cache = self.cache.as_ref()?;
        let versions = CacheVersions {
            prompt: format!("{}@{}", req.prompt.id, req.prompt.version),
            model: format!("{}@{}", model.id, model.version),
            tool: u.tool_version.clone(),
            data: u.data_version.clone(),
        };
        let schema = req.schema.as_ref().or(self.settings.schema.as_ref()).map(|s| s.version().to_string());
        let input = serde_json::json!({"input": req.input, "params": req.params, "schema": schema});
        match CacheKey::new(&req.label, &versions, &input) {
            Ok(k) => Some((cache, k)),
            Err(e) => {
                tracing::warn!(error = %e, "no cache key for this call");
                None
            }
        }
    }
}

fn set_call(st: &mut JournalState, n: usize, f: impl FnOnce(&mut ModelCall)) {
    if let Some(RecordEntry::Model(c)) = st.record.entries.get_mut(n) {
        f(c)
    }
}

fn samples_len(st: &JournalState, n: usize) -> usize {
    match st.record.entries.get(n) {
        Some(RecordEntry::Model(c)) => c.samples.len(),
        _ => 0,
    }
}

fn mismatch(n: usize, label: &str, found: &RecordEntry) -> ActivityError {
    permanent(format!(
        "record mismatch at call {n}: the activity asked for `{label}`, the record holds `{}`; \
         the step's calls must come in the same order on every run (K-17.4a)",
        found.label()
    ))
}

/// A read-only view of a step's record between recorded calls
/// ([`ActivityContext::record_cursor`](crate::activity::ActivityContext::record_cursor)).
#[derive(Clone, Copy)]
pub struct RecordCursor<'a>(pub(crate) &'a StepJournal);

impl std::fmt::Debug for RecordCursor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordCursor").field("key", &self.0.key).finish_non_exhaustive()
    }
}

impl RecordCursor<'_> {
    /// The live clock (not the invocation's start): what a deadline is checked against
    /// before a new call.
    pub fn now(&self) -> Instant {
        self.0.now()
    }

    /// The serialized size of the step's record as it stands, and the most it may hold
    /// (the store payload limit). Refused like a recorded call — a permanent error, as for
    /// any recorded call — while a recorded call of this invocation is in progress or after
    /// a failed write: read the cursor between recorded calls, never beside one.
    pub fn room(&self) -> Result<(usize, usize), ActivityError> {
        self.0.record_room()
    }

    /// `f` of the entry the next recorded call of this invocation will be matched to
    /// (`None`: the call will be new), and of the entry the last one was matched to.
    /// Refused like [`room`](Self::room).
    pub fn around<R>(
        &self,
        f: impl FnOnce(Option<&RecordEntry>, Option<&RecordEntry>) -> R,
    ) -> Result<R, ActivityError> {
        self.0.around_cursor(f)
    }

    /// The step's own output schema, when it declares one.
    pub fn output_schema(&self) -> Option<&crate::model_call::OutputSchema> {
        self.0.settings.schema.as_ref()
    }
}
