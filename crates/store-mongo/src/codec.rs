//! Documents ⇄ domain types, written out by hand.
//!
//! Serde's BSON serializer is deliberately not used for anything a user supplies: it turns
//! maps that look like extended JSON (`{"$numberLong": "5"}`, `{"$date": …}`) into typed
//! BSON values, which would make user data change meaning. The converters below map JSON
//! to BSON one node at a time and keep every key verbatim.

use kernel_core::domain::*;
use kernel_core::operator_request::{OperatorRequest, RequestedAction};
use kernel_core::{Error, Result};
use mongodb::bson::{self, Bson, Document, RawDocumentBuf};
use serde_json::{Map, Number, Value};
use std::collections::BTreeMap;

/// JSON → BSON, keys verbatim; integers become Int64, other numbers Double.
pub(crate) fn json_to_bson(field: &str, v: &Value) -> Result<Bson> {
    Ok(match v {
        Value::Null => Bson::Null,
        Value::Bool(b) => Bson::Boolean(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Bson::Int64(i)
            } else if n.is_u64() {
                return Err(Error::invalid(
                    field,
                    format_args!("integer {n} does not fit a signed 64-bit BSON integer"),
                ));
            } else {
                Bson::Double(
                    n.as_f64().ok_or_else(|| Error::invalid(field, format_args!("number {n} is not representable")))?,
                )
            }
        }
        Value::String(s) => Bson::String(s.clone()),
        Value::Array(a) => Bson::Array(a.iter().map(|x| json_to_bson(field, x)).collect::<Result<_>>()?),
        Value::Object(m) => {
            let mut d = Document::new();
            for (k, x) in m {
                // BSON keys are C strings.
                if k.contains('\0') {
                    return Err(Error::invalid(field, "object key contains NUL"));
                }
                d.insert(k.clone(), json_to_bson(field, x)?);
            }
            Bson::Document(d)
        }
    })
}

/// BSON → JSON for values written by [`json_to_bson`] (any integer width is accepted).
pub(crate) fn bson_to_json(field: &str, b: &Bson) -> Result<Value> {
    Ok(match b {
        Bson::Null => Value::Null,
        Bson::Boolean(x) => Value::Bool(*x),
        Bson::Int32(i) => Value::from(*i),
        Bson::Int64(i) => Value::from(*i),
        Bson::Double(f) => Value::Number(Number::from_f64(*f).ok_or_else(|| corrupt(field, "non-finite number"))?),
        Bson::String(s) => Value::String(s.clone()),
        Bson::Array(a) => Value::Array(a.iter().map(|x| bson_to_json(field, x)).collect::<Result<_>>()?),
        Bson::Document(d) => {
            let mut m = Map::new();
            for (k, x) in d {
                m.insert(k.clone(), bson_to_json(field, x)?);
            }
            Value::Object(m)
        }
        other => return Err(corrupt(field, format_args!("unexpected BSON type {:?}", other.element_type()))),
    })
}

/// A stored document that does not decode. Nothing was written by the failing call.
pub(crate) fn corrupt(field: &str, reason: impl std::fmt::Display) -> Error {
    Error::corrupt(format!("stored document field `{field}`: {reason}"))
}

/// [`corrupt`] reported by a decoder: its error is kept as the cause (`source()`).
pub(crate) fn corrupt_by(field: &str, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::corrupt_with(format!("stored document field `{field}`: {e}"), e)
}

pub(crate) fn dt(t: Instant) -> Bson {
    Bson::DateTime(bson::DateTime::from_millis(t.as_millis()))
}

pub(crate) fn i32_of(field: &str, v: u32) -> Result<Bson> {
    i32::try_from(v)
        .map(Bson::Int32)
        .map_err(|_| Error::invalid(field, format_args!("{v} exceeds the 32-bit signed range")))
}

pub(crate) fn i64_of(field: &str, v: u64) -> Result<Bson> {
    i64::try_from(v)
        .map(Bson::Int64)
        .map_err(|_| Error::invalid(field, format_args!("{v} exceeds the 64-bit signed range")))
}

// --- raw documents -----------------------------------------------------------------------
//
// Documents cross the driver as raw BSON. Deserializing a reply into `Document` through
// serde would reinterpret user maps that look like extended JSON (`{"$numberLong": "5"}`
// reads back as the integer 5); the raw conversions below are structural.

pub(crate) fn raw(field: &str, d: &Document) -> Result<RawDocumentBuf> {
    RawDocumentBuf::from_document(d).map_err(|e| Error::invalid_with(field, e.to_string(), e))
}

pub(crate) fn unraw(r: &RawDocumentBuf) -> Result<Document> {
    r.to_document().map_err(|e| corrupt_by("document", e))
}

pub(crate) fn decode_instance(r: &RawDocumentBuf) -> Result<WorkflowInstance> {
    instance_of(&unraw(r)?)
}

pub(crate) fn decode_signal(r: &RawDocumentBuf) -> Result<kernel_core::ports::SignalRecord> {
    signal_of(&unraw(r)?)
}

// --- readers ---------------------------------------------------------------------------

fn get<'a>(d: &'a Document, k: &str) -> Option<&'a Bson> {
    match d.get(k) {
        None | Some(Bson::Null) => None,
        some => some,
    }
}

fn req<'a>(d: &'a Document, k: &str) -> Result<&'a Bson> {
    get(d, k).ok_or_else(|| corrupt(k, "missing"))
}

fn str_of(d: &Document, k: &str) -> Result<String> {
    match req(d, k)? {
        Bson::String(s) => Ok(s.clone()),
        _ => Err(corrupt(k, "not a string")),
    }
}

fn opt_str(d: &Document, k: &str) -> Result<Option<String>> {
    get(d, k).map(|_| str_of(d, k)).transpose()
}

fn int_of(k: &str, b: &Bson) -> Result<i64> {
    match b {
        Bson::Int32(i) => Ok(i64::from(*i)),
        Bson::Int64(i) => Ok(*i),
        Bson::Double(f) if f.fract() == 0.0 => Ok(*f as i64),
        _ => Err(corrupt(k, "not an integer")),
    }
}

fn int_or_zero(d: &Document, k: &str) -> Result<i64> {
    get(d, k).map_or(Ok(0), |b| int_of(k, b))
}

fn u32_of(d: &Document, k: &str) -> Result<u32> {
    u32::try_from(int_or_zero(d, k)?).map_err(|_| corrupt(k, "out of u32 range"))
}

fn time_of(k: &str, b: &Bson) -> Result<Instant> {
    match b {
        Bson::DateTime(t) => Ok(Instant::from_millis(t.timestamp_millis())),
        _ => Err(corrupt(k, "not a BSON DateTime")),
    }
}

fn opt_time(d: &Document, k: &str) -> Result<Option<Instant>> {
    get(d, k).map(|b| time_of(k, b)).transpose()
}

pub(crate) fn doc_of<'a>(d: &'a Document, k: &str) -> Result<Option<&'a Document>> {
    match get(d, k) {
        None => Ok(None),
        Some(Bson::Document(x)) => Ok(Some(x)),
        Some(_) => Err(corrupt(k, "not a document")),
    }
}

fn parse_enum<T: serde::de::DeserializeOwned>(k: &str, s: String) -> Result<T> {
    serde_json::from_value(Value::String(s)).map_err(|e| corrupt_by(k, e))
}

// --- steps, waits, resumes ---------------------------------------------------------------

pub(crate) fn step_error_doc(e: &StepError) -> Bson {
    Bson::Document(bson::doc! { "class": e.class.as_str(), "message": e.message.as_str() })
}

// The writers below destructure the domain types field by field: a field added to them is
// a compile error here, never a value silently left out of the stored document.

pub(crate) fn step_doc(i: usize, s: &Step) -> Result<Document> {
    let Step {
        name,
        status,
        attempt,
        error,
        elapsed_ms,
        traffic_wait_ms,
        traffic_waits,
        checkpoint,
        started_at,
        finished_at,
        epoch,
        record,
        history,
        retrying_since,
        iterations,
        completed_revision,
    } = s;
    let f = |n: &str| format!("steps[{i}].{n}");
    let mut d = bson::doc! {
        "name": name.as_str(),
        "status": status.as_str(),
        "attempt": i32_of(&f("attempt"), *attempt)?,
        "elapsed_ms": elapsed_ms.as_millis(),
        "traffic_wait_ms": traffic_wait_ms.as_millis(),
        "traffic_waits": i32_of(&f("traffic_waits"), *traffic_waits)?,
    };
    if let Some(e) = error {
        d.insert("error", step_error_doc(e));
    }
    if let Some(c) = checkpoint {
        d.insert("checkpoint", json_to_bson(&f("checkpoint"), c)?);
    }
    if let Some(t) = started_at {
        d.insert("started_at", dt(*t));
    }
    if let Some(t) = finished_at {
        d.insert("finished_at", dt(*t));
    }
    // Stored only above 0 (a document without it reads as 0), as the step serializes it.
    if *epoch > 0 {
        d.insert("epoch", epoch_bson(*epoch));
    }
    if let Some(r) = record {
        d.insert("record", record_bson(&f("record"), r)?);
    }
    if !history.is_empty() {
        d.insert("history", history_bson(&f("history"), history)?);
    }
    if let Some(t) = retrying_since {
        d.insert("retrying_since", dt(*t));
    }
    if *iterations > 0 {
        d.insert("iterations", epoch_bson(*iterations));
    }
    if let Some(r) = completed_revision {
        d.insert("completed_revision", i64_of(&f("completed_revision"), *r)?);
    }
    Ok(d)
}

/// A step's epoch (and loop iterations): an Int64, so every `u32` is stored.
pub(crate) fn epoch_bson(epoch: u32) -> Bson {
    Bson::Int64(i64::from(epoch))
}

/// A step's record as BSON: its JSON form node by node ([`json_to_bson`]), times as the
/// epoch milliseconds the JSON form holds.
pub(crate) fn record_bson(field: &str, r: &kernel_core::record::StepRecord) -> Result<Bson> {
    let v = serde_json::to_value(r).map_err(|e| Error::invalid_with(field, e.to_string(), e))?;
    json_to_bson(field, &v)
}

/// A step's history as BSON, as [`record_bson`].
pub(crate) fn history_bson(field: &str, h: &[kernel_core::record::HistoryEntry]) -> Result<Bson> {
    let v = serde_json::to_value(h).map_err(|e| Error::invalid_with(field, e.to_string(), e))?;
    json_to_bson(field, &v)
}

fn decoded<T: serde::de::DeserializeOwned>(d: &Document, k: &str) -> Result<Option<T>> {
    get(d, k).map(|b| serde_json::from_value(bson_to_json(k, b)?).map_err(|e| corrupt_by(k, e))).transpose()
}

fn step_of(d: &Document) -> Result<Step> {
    let error = match doc_of(d, "error")? {
        None => None,
        Some(e) => {
            Some(StepError { class: parse_enum("error.class", str_of(e, "class")?)?, message: str_of(e, "message")? })
        }
    };
    Ok(Step {
        name: str_of(d, "name")?,
        status: parse_enum("steps.status", str_of(d, "status")?)?,
        attempt: u32_of(d, "attempt")?,
        error,
        elapsed_ms: DurationMs::from_millis(int_or_zero(d, "elapsed_ms")?),
        traffic_wait_ms: DurationMs::from_millis(int_or_zero(d, "traffic_wait_ms")?),
        traffic_waits: u32_of(d, "traffic_waits")?,
        checkpoint: get(d, "checkpoint").map(|b| bson_to_json("checkpoint", b)).transpose()?,
        started_at: opt_time(d, "started_at")?,
        finished_at: opt_time(d, "finished_at")?,
        epoch: u32_of(d, "epoch")?,
        record: decoded(d, "record")?,
        history: decoded(d, "history")?.unwrap_or_default(),
        retrying_since: opt_time(d, "retrying_since")?,
        iterations: u32_of(d, "iterations")?,
        completed_revision: get(d, "completed_revision")
            .map(|b| {
                u64::try_from(int_of("completed_revision", b)?).map_err(|_| corrupt("completed_revision", "negative"))
            })
            .transpose()?,
    })
}

pub(crate) fn wait_doc(w: &Wait) -> Result<Document> {
    // Field order is the stored shape (pinned by the protocol snapshots): kind, generation,
    // step_index, then signal_type, wait_key, poll_time when present. A timer stores
    // generation 0 and its due time as `poll_time`.
    let (kind, generation, step_index, identity, poll_time) = match w {
        Wait::Timer { step_index, due } => ("timer", 0, *step_index, None, *due),
        Wait::Signal { signal_type, wait_key, generation, step_index, poll_time } => {
            ("signal", *generation, *step_index, Some((signal_type, wait_key)), *poll_time)
        }
    };
    let mut d = bson::doc! {
        "kind": kind,
        "generation": i64_of("wait.generation", generation)?,
        "step_index": i32_of("wait.step_index", step_index)?,
    };
    if let Some((signal_type, wait_key)) = identity {
        d.insert("signal_type", signal_type.as_str());
        d.insert("wait_key", wait_key.as_str());
    }
    if let Some(t) = poll_time {
        d.insert("poll_time", dt(t));
    }
    Ok(d)
}

pub(crate) fn wait_of(d: &Document) -> Result<Wait> {
    Wait::from_parts(
        parse_enum("wait.kind", str_of(d, "kind")?)?,
        opt_str(d, "signal_type")?,
        opt_str(d, "wait_key")?,
        u64::try_from(int_or_zero(d, "generation")?).map_err(|_| corrupt("wait.generation", "negative"))?,
        u32_of(d, "step_index")?,
        opt_time(d, "poll_time")?,
    )
    .map_err(|e| corrupt("wait", e))
}

pub(crate) fn resume_doc(r: &Resume) -> Result<Document> {
    let Resume { kind, step_index, signal_id } = r;
    let kind = match kind {
        ResumeKind::Timer => "timer",
        ResumeKind::Signal => "signal",
        ResumeKind::Poll => "poll",
    };
    let mut d = bson::doc! { "kind": kind, "step_index": i32_of("resume.step_index", *step_index)? };
    if let Some(s) = signal_id {
        d.insert("signal_id", s.as_str());
    }
    Ok(d)
}

fn resume_of(d: &Document) -> Result<Resume> {
    Ok(Resume {
        kind: parse_enum("resume.kind", str_of(d, "kind")?)?,
        step_index: u32_of(d, "step_index")?,
        signal_id: opt_str(d, "signal_id")?,
    })
}

pub(crate) fn mismatch_doc(m: &FingerprintMismatch) -> Document {
    let FingerprintMismatch { persisted, worker } = m;
    bson::doc! { "persisted": persisted.as_str(), "worker": worker.as_str() }
}

pub(crate) fn priority_of(d: &Document) -> Result<Priority> {
    u8::try_from(int_of("business_priority", req(d, "business_priority")?)?)
        .ok()
        .and_then(|p| Priority::try_from(p).ok())
        .ok_or_else(|| corrupt("business_priority", "not 0..=3"))
}

pub(crate) fn str_field(d: &Document, k: &str) -> Result<String> {
    str_of(d, k)
}

pub(crate) fn time_field(d: &Document, k: &str) -> Result<Instant> {
    time_of(k, req(d, k)?)
}

pub(crate) fn priority_bson(p: Priority) -> Bson {
    Bson::Int32(i32::from(u8::from(p)))
}

// --- instances ---------------------------------------------------------------------------

/// The stored shape of a [`WorkflowInstance`] (see the crate docs). `_id` is left to the
/// driver: `workflow_id` is the business-facing id, not the primary key.
pub(crate) fn instance_doc(w: &WorkflowInstance) -> Result<Document> {
    let WorkflowInstance {
        workflow_id,
        workflow_type,
        biz_key,
        status,
        steps,
        input,
        output,
        claimable_time,
        claim_token,
        wait,
        resume,
        definition_fingerprint,
        fingerprint_mismatch,
        business_priority,
        retry_count,
        prepare_failures,
        refused_writes,
        revision,
        created_at,
        updated_at,
        finished_at,
        compensation,
        trace_parent,
        operator_request,
    } = w;
    let steps =
        steps.iter().enumerate().map(|(i, s)| step_doc(i, s).map(Bson::Document)).collect::<Result<Vec<_>>>()?;
    let mut out = Document::new();
    for (k, v) in output {
        out.insert(k.clone(), json_to_bson(&format!("output.{k}"), v)?);
    }
    let mut d = bson::doc! {
        "workflow_id": workflow_id.as_str(),
        "type": workflow_type.as_str(),
        "biz_key": biz_key.as_str(),
        "status": status.as_str(),
        "steps": steps,
        "input": json_to_bson("input", input)?,
        "output": out,
        "definition_fingerprint": definition_fingerprint.as_str(),
        "business_priority": priority_bson(*business_priority),
        "retry_count": i32_of("retry_count", *retry_count)?,
        "revision": i64_of("revision", *revision)?,
        "created_at": dt(*created_at),
        "updated_at": dt(*updated_at),
    };
    if let Some(t) = claimable_time {
        d.insert("claimable_time", dt(*t));
    }
    if let Some(t) = claim_token {
        d.insert("claim_token", t.as_str());
    }
    if let Some(x) = wait {
        d.insert("wait", wait_doc(x)?);
    }
    if let Some(x) = resume {
        d.insert("resume", resume_doc(x)?);
    }
    if let Some(m) = fingerprint_mismatch {
        d.insert("fingerprint_mismatch", mismatch_doc(m));
    }
    if let Some(t) = finished_at {
        d.insert("finished_at", dt(*t));
    }
    // Absent means 0 (documents written before the field existed read the same).
    if *prepare_failures > 0 {
        d.insert("prepare_failures", i32_of("prepare_failures", *prepare_failures)?);
    }
    if *refused_writes > 0 {
        d.insert("refused_writes", i32_of("refused_writes", *refused_writes)?);
    }
    if let Some(c) = compensation {
        d.insert("compensation", compensation_bson(c)?);
    }
    // Absent when the request carried none (documents written before the field existed
    // read the same).
    if let Some(t) = trace_parent {
        d.insert("trace_parent", t.as_str());
    }
    // Absent when no request is pending (documents written before the field existed read
    // the same).
    if let Some(r) = operator_request {
        d.insert("operator_request", operator_request_bson(r)?);
    }
    Ok(d)
}

/// An operator's request (K-6.8) as BSON: `{ id, action: { kind, step? }, holder,
/// requested_at: Date }`, every name a string value, never a key.
pub(crate) fn operator_request_bson(r: &OperatorRequest) -> Result<Bson> {
    let OperatorRequest { id, action, holder, requested_at } = r;
    let action = match action {
        RequestedAction::Cancel => bson::doc! { "kind": "cancel" },
        RequestedAction::Regenerate { step } => bson::doc! { "kind": "regenerate", "step": step.as_str() },
    };
    Ok(Bson::Document(bson::doc! {
        "id": id.as_str(),
        "action": action,
        "holder": holder.as_str(),
        "requested_at": dt(*requested_at),
    }))
}

fn operator_request_of(d: &Document) -> Result<OperatorRequest> {
    let a = doc_of(d, "action")?.ok_or_else(|| corrupt("operator_request.action", "missing"))?;
    let action = match str_of(a, "kind")?.as_str() {
        "cancel" => RequestedAction::Cancel,
        "regenerate" => RequestedAction::Regenerate { step: str_of(a, "step")? },
        other => return Err(corrupt("operator_request.action.kind", format_args!("unknown kind {other:?}"))),
    };
    Ok(OperatorRequest {
        id: str_of(d, "id")?,
        action,
        holder: str_of(d, "holder")?.into(),
        requested_at: time_of("operator_request.requested_at", req(d, "requested_at")?)?,
    })
}

/// A compensation report (K-17.6) as BSON: its JSON form node by node ([`json_to_bson`]).
pub(crate) fn compensation_bson(c: &kernel_core::compensation::CompensationReport) -> Result<Bson> {
    let v = serde_json::to_value(c).map_err(|e| Error::invalid_with("compensation", e.to_string(), e))?;
    json_to_bson("compensation", &v)
}

/// Decode a stored instance document.
pub(crate) fn instance_of(d: &Document) -> Result<WorkflowInstance> {
    let steps = match req(d, "steps")? {
        Bson::Array(a) => a
            .iter()
            .map(|b| match b {
                Bson::Document(s) => step_of(s),
                _ => Err(corrupt("steps", "element is not a document")),
            })
            .collect::<Result<Vec<_>>>()?,
        _ => return Err(corrupt("steps", "not an array")),
    };
    let mut output = BTreeMap::new();
    if let Some(o) = doc_of(d, "output")? {
        for (k, v) in o {
            output.insert(k.clone(), bson_to_json("output", v)?);
        }
    }
    let priority = priority_of(d)?;
    let fingerprint_mismatch = match doc_of(d, "fingerprint_mismatch")? {
        None => None,
        Some(m) => Some(FingerprintMismatch { persisted: str_of(m, "persisted")?, worker: str_of(m, "worker")? }),
    };
    Ok(WorkflowInstance {
        workflow_id: str_of(d, "workflow_id")?.into(),
        workflow_type: str_of(d, "type")?,
        biz_key: str_of(d, "biz_key")?,
        status: parse_enum("status", str_of(d, "status")?)?,
        steps,
        input: bson_to_json("input", d.get("input").unwrap_or(&Bson::Null))?,
        output,
        claimable_time: opt_time(d, "claimable_time")?,
        claim_token: opt_str(d, "claim_token")?.map(Into::into),
        wait: doc_of(d, "wait")?.map(wait_of).transpose()?,
        resume: doc_of(d, "resume")?.map(resume_of).transpose()?,
        definition_fingerprint: str_of(d, "definition_fingerprint")?,
        fingerprint_mismatch,
        business_priority: priority,
        retry_count: u32_of(d, "retry_count")?,
        prepare_failures: u32_of(d, "prepare_failures")?,
        refused_writes: u32_of(d, "refused_writes")?,
        revision: u64::try_from(int_or_zero(d, "revision")?).map_err(|_| corrupt("revision", "negative"))?,
        created_at: time_of("created_at", req(d, "created_at")?)?,
        updated_at: time_of("updated_at", req(d, "updated_at")?)?,
        finished_at: opt_time(d, "finished_at")?,
        compensation: match d.get("compensation") {
            None | Some(Bson::Null) => None,
            Some(b) => Some(
                serde_json::from_value(bson_to_json("compensation", b)?)
                    .map_err(|e| corrupt("compensation", format_args!("{e}")))?,
            ),
        },
        trace_parent: opt_str(d, "trace_parent")?,
        operator_request: doc_of(d, "operator_request")?.map(operator_request_of).transpose()?,
    })
}

// --- signals -----------------------------------------------------------------------------

/// The stored shape of a [`SignalRecord`](kernel_core::ports::SignalRecord).
pub(crate) fn signal_doc(r: &kernel_core::ports::SignalRecord) -> Result<Document> {
    use kernel_core::ports::{SignalRecord, SignalStatus};
    let SignalRecord {
        signal_id,
        workflow_id,
        signal_type,
        wait_key,
        generation,
        status,
        created_at,
        match_time,
        orphan,
    } = r;
    let mut d = bson::doc! {
        "signal_id": signal_id.as_str(),
        "workflow_id": workflow_id.as_str(),
        "signal_type": signal_type.as_str(),
        "wait_key": wait_key.as_str(),
        "generation": i64_of("generation", *generation)?,
        "status": match status { SignalStatus::Pending => "pending", SignalStatus::Matched => "matched" },
        "created_at": dt(*created_at),
    };
    if *orphan {
        d.insert("orphan", true);
    }
    if let Some(t) = match_time {
        d.insert("match_time", dt(*t));
    }
    Ok(d)
}

/// Decode a stored inbox record.
pub(crate) fn signal_of(d: &Document) -> Result<kernel_core::ports::SignalRecord> {
    Ok(kernel_core::ports::SignalRecord {
        signal_id: str_of(d, "signal_id")?,
        workflow_id: str_of(d, "workflow_id")?.into(),
        signal_type: str_of(d, "signal_type")?,
        wait_key: str_of(d, "wait_key")?,
        generation: u64::try_from(int_or_zero(d, "generation")?).map_err(|_| corrupt("generation", "negative"))?,
        status: parse_enum("status", str_of(d, "status")?)?,
        created_at: time_of("created_at", req(d, "created_at")?)?,
        match_time: opt_time(d, "match_time")?,
        orphan: match d.get("orphan") {
            None => false,
            Some(Bson::Boolean(b)) => *b,
            Some(_) => return Err(corrupt("orphan", "not a boolean")),
        },
    })
}

// --- dead letters ------------------------------------------------------------------------

/// The stored shape of a [`DeadLetterDecision`](kernel_core::ports::DeadLetterDecision):
/// `{ action: { kind: "retry" | "complete" | "fail", output? }, actor, reason?, decided_at: Date }`.
pub(crate) fn decision_doc(d: &kernel_core::ports::DeadLetterDecision) -> Result<Document> {
    use kernel_core::ports::{DeadLetterAction, DeadLetterDecision};
    let DeadLetterDecision { action, actor, reason, decided_at } = d;
    let action = match action {
        DeadLetterAction::Retry => bson::doc! { "kind": "retry" },
        DeadLetterAction::Complete { output } => {
            bson::doc! { "kind": "complete", "output": json_to_bson("decision.output", output)? }
        }
        DeadLetterAction::Fail => bson::doc! { "kind": "fail" },
    };
    let mut doc = bson::doc! { "action": action, "actor": actor.as_str(), "decided_at": dt(*decided_at) };
    if let Some(r) = reason {
        doc.insert("reason", r.as_str());
    }
    Ok(doc)
}

fn decision_of(d: &Document) -> Result<kernel_core::ports::DeadLetterDecision> {
    use kernel_core::ports::{DeadLetterAction, DeadLetterDecision};
    let action = doc_of(d, "action")?.ok_or_else(|| corrupt("decision.action", "missing"))?;
    let action = match str_of(action, "kind")?.as_str() {
        "retry" => DeadLetterAction::Retry,
        "complete" => DeadLetterAction::Complete {
            output: bson_to_json("decision.output", action.get("output").unwrap_or(&Bson::Null))?,
        },
        "fail" => DeadLetterAction::Fail,
        other => return Err(corrupt("decision.action.kind", format_args!("unknown action {other:?}"))),
    };
    Ok(DeadLetterDecision {
        action,
        actor: str_of(d, "actor")?,
        reason: opt_str(d, "reason")?,
        decided_at: time_of("decided_at", req(d, "decided_at")?)?,
    })
}

/// The stored shape of a new [`DeadLetter`](kernel_core::ports::DeadLetter):
/// `{ _id: id, workflow_id, workflow_type, step, step_index: Int64, run: Int64,
/// epoch: Int64, error: { class, message }, inputs, created_at: Date, status: "open" }`;
/// `decide` adds `decision`, `close` sets `closed_at: Date`.
pub(crate) fn dead_letter_doc(d: &kernel_core::ports::DeadLetter) -> Result<Document> {
    use kernel_core::ports::DeadLetter;
    let DeadLetter {
        id,
        workflow_id,
        workflow_type,
        step,
        step_index,
        run,
        epoch,
        error,
        inputs,
        created_at,
        status,
        decision,
        closed_at,
    } = d;
    let mut doc = bson::doc! {
        "_id": id.as_str(),
        "workflow_id": workflow_id.as_str(),
        "workflow_type": workflow_type.as_str(),
        "step": step.as_str(),
        "step_index": i64::from(*step_index),
        "run": i64::from(*run),
        "epoch": i64::from(*epoch),
        "error": step_error_doc(error),
        "inputs": json_to_bson("inputs", inputs)?,
        "created_at": dt(*created_at),
        "status": status.as_str(),
    };
    if let Some(x) = decision {
        doc.insert("decision", decision_doc(x)?);
    }
    if let Some(t) = closed_at {
        doc.insert("closed_at", dt(*t));
    }
    Ok(doc)
}

/// Decode a stored dead letter.
pub(crate) fn decode_dead_letter(r: &RawDocumentBuf) -> Result<kernel_core::ports::DeadLetter> {
    let d = unraw(r)?;
    let error = doc_of(&d, "error")?.ok_or_else(|| corrupt("error", "missing"))?;
    Ok(kernel_core::ports::DeadLetter {
        id: str_of(&d, "_id")?,
        workflow_id: str_of(&d, "workflow_id")?.into(),
        workflow_type: str_of(&d, "workflow_type")?,
        step: str_of(&d, "step")?,
        step_index: u32_of(&d, "step_index")?,
        run: u32_of(&d, "run")?,
        epoch: u32_of(&d, "epoch")?,
        error: StepError {
            class: parse_enum("error.class", str_of(error, "class")?)?,
            message: str_of(error, "message")?,
        },
        inputs: bson_to_json("inputs", d.get("inputs").unwrap_or(&Bson::Null))?,
        created_at: time_of("created_at", req(&d, "created_at")?)?,
        status: parse_enum("status", str_of(&d, "status")?)?,
        decision: doc_of(&d, "decision")?.map(decision_of).transpose()?,
        closed_at: opt_time(&d, "closed_at")?,
    })
}

// --- human tasks -------------------------------------------------------------------------

/// The stored shape of a [`TaskDecision`](kernel_core::ports::TaskDecision):
/// `{ outcome: "approve" | "reject" | "escalate" | "cancel", actor,
/// reason?: { sensitive: Bool, text? }, decided_at: Date }`.
pub(crate) fn task_decision_doc(d: &kernel_core::ports::TaskDecision) -> Document {
    use kernel_core::ports::{TaskDecision, TaskReason};
    let TaskDecision { outcome, actor, reason, decided_at } = d;
    let mut doc = bson::doc! { "outcome": outcome.as_str(), "actor": actor.as_str(), "decided_at": dt(*decided_at) };
    if let Some(TaskReason { sensitive, text }) = reason {
        let mut r = bson::doc! { "sensitive": *sensitive };
        if let Some(t) = text {
            r.insert("text", t.as_str());
        }
        doc.insert("reason", r);
    }
    doc
}

fn task_decision_of(d: &Document) -> Result<kernel_core::ports::TaskDecision> {
    use kernel_core::ports::{TaskDecision, TaskReason};
    let reason = match doc_of(d, "reason")? {
        None => None,
        Some(r) => Some(TaskReason {
            sensitive: match req(r, "sensitive")? {
                Bson::Boolean(b) => *b,
                _ => return Err(corrupt("decision.reason.sensitive", "not a boolean")),
            },
            text: opt_str(r, "text")?,
        }),
    };
    Ok(TaskDecision {
        outcome: parse_enum("decision.outcome", str_of(d, "outcome")?)?,
        actor: str_of(d, "actor")?,
        reason,
        decided_at: time_of("decision.decided_at", req(d, "decided_at")?)?,
    })
}

/// The decision of a stored task document, if it has one (a projection of the task is
/// enough).
pub(crate) fn task_decision_in(r: &RawDocumentBuf) -> Result<Option<kernel_core::ports::TaskDecision>> {
    let d = unraw(r)?;
    doc_of(&d, "decision")?.map(task_decision_of).transpose()
}

fn strings_of(d: &Document, k: &str) -> Result<Vec<String>> {
    match get(d, k) {
        None => Ok(Vec::new()),
        Some(Bson::Array(a)) => a
            .iter()
            .map(|x| match x {
                Bson::String(s) => Ok(s.clone()),
                _ => Err(corrupt(k, "an element is not a string")),
            })
            .collect(),
        Some(_) => Err(corrupt(k, "not an array")),
    }
}

/// The stored shape of a [`TaskRecord`](kernel_core::ports::TaskRecord):
/// `{ _id: id, workflow_id, workflow_type, step, level: Int64, title, assignee?, roles: [..],
/// evidence: [{ label, reference }], token, created_at: Date, due_at: Date,
/// status: "open" | "decided" | "closed", decision?, closed_at?: Date }`.
pub(crate) fn task_doc(t: &kernel_core::ports::TaskRecord) -> Document {
    use kernel_core::ports::{Evidence, TaskRecord};
    let TaskRecord {
        id,
        workflow_id,
        workflow_type,
        step,
        level,
        title,
        assignee,
        roles,
        evidence,
        token,
        created_at,
        due_at,
        status,
        decision,
        closed_at,
    } = t;
    let evidence: Vec<Bson> = evidence
        .iter()
        .map(|Evidence { label, reference }| {
            Bson::Document(bson::doc! { "label": label.as_str(), "reference": reference.as_str() })
        })
        .collect();
    let mut doc = bson::doc! {
        "_id": id.as_str(),
        "workflow_id": workflow_id.as_str(),
        "workflow_type": workflow_type.as_str(),
        "step": step.as_str(),
        "level": i64::from(*level),
        "title": title.as_str(),
    };
    if let Some(a) = assignee {
        doc.insert("assignee", a.as_str());
    }
    doc.insert("roles", roles.iter().map(|r| Bson::String(r.clone())).collect::<Vec<_>>());
    doc.insert("evidence", evidence);
    doc.insert("token", token.as_str());
    doc.insert("created_at", dt(*created_at));
    doc.insert("due_at", dt(*due_at));
    doc.insert("status", status.as_str());
    if let Some(x) = decision {
        doc.insert("decision", task_decision_doc(x));
    }
    if let Some(t) = closed_at {
        doc.insert("closed_at", dt(*t));
    }
    doc
}

/// Decode a stored task.
pub(crate) fn decode_task(r: &RawDocumentBuf) -> Result<kernel_core::ports::TaskRecord> {
    use kernel_core::ports::{Evidence, TaskRecord};
    let d = unraw(r)?;
    let evidence = match get(&d, "evidence") {
        None => Vec::new(),
        Some(Bson::Array(a)) => a
            .iter()
            .map(|x| match x {
                Bson::Document(e) => Ok(Evidence { label: str_of(e, "label")?, reference: str_of(e, "reference")? }),
                _ => Err(corrupt("evidence", "an element is not a document")),
            })
            .collect::<Result<_>>()?,
        Some(_) => return Err(corrupt("evidence", "not an array")),
    };
    Ok(TaskRecord {
        id: str_of(&d, "_id")?,
        workflow_id: str_of(&d, "workflow_id")?.into(),
        workflow_type: str_of(&d, "workflow_type")?,
        step: str_of(&d, "step")?,
        level: u32_of(&d, "level")?,
        title: str_of(&d, "title")?,
        assignee: opt_str(&d, "assignee")?,
        roles: strings_of(&d, "roles")?,
        evidence,
        token: str_of(&d, "token")?,
        created_at: time_of("created_at", req(&d, "created_at")?)?,
        due_at: time_of("due_at", req(&d, "due_at")?)?,
        status: parse_enum("status", str_of(&d, "status")?)?,
        decision: doc_of(&d, "decision")?.map(task_decision_of).transpose()?,
        closed_at: opt_time(&d, "closed_at")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_round_trip_keeps_operator_shaped_keys_as_data() {
        let v = json!({"$ne": null, "a.b": [1, -2, 1.5, "x", true, {"$numberLong": "5"}], "big": i64::MAX});
        let b = json_to_bson("input", &v).unwrap();
        let Bson::Document(d) = &b else { panic!("not a document") };
        assert_eq!(d.get_document("a.b").ok(), None, "dotted key kept verbatim, not split");
        assert!(matches!(d.get("a.b"), Some(Bson::Array(_))));
        assert_eq!(bson_to_json("input", &b).unwrap(), v);
    }

    #[test]
    fn json_rejects_what_bson_cannot_hold() {
        assert!(json_to_bson("input", &json!(u64::MAX)).is_err());
        assert!(json_to_bson("input", &json!({"a\u{0}b": 1})).is_err());
    }
}
