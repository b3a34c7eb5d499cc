//! The wire protocol of the store: [`Guard`] → filter, [`Transition`] → update document.
//!
//! Pure functions, pinned by snapshot tests so that a silent protocol change fails a test.
//! Every write the adapter issues is
//!
//! ```text
//! findAndModify(workflow_instances,
//!     query  = { workflow_id: <id>, <guard filter>, [steps.<max i>: {$exists: true}] },
//!     update = { $set: {...}, $unset: {...}, $inc: {...} },
//!     arrayFilters = [{ "f.status": "failed" }]   // replay only
//!     new = true, fields = { revision: 1 })
//! ```
//!
//! | guard | filter (besides `workflow_id`) |
//! |---|---|
//! | `Claimable { now, types }` | `status ∈ [running, failing]`, `claimable_time ≤ now`, `type ∈ types` |
//! | `Running { token }` | `status = running`, `claim_token = token` |
//! | `Failing { token }` | `status = failing`, `claim_token = token` |
//! | `Token { token }` | `claim_token = token` |
//! | `Failed` | `status = failed` |
//! | `DueWait { now, step_index }` | `status = waiting`, `claimable_time ≤ now`, `wait.step_index = i` |
//! | `SignalWait(id)` | `status = waiting`, `wait.kind = signal`, `wait.signal_type`, `wait.wait_key`, `wait.generation`, `wait.step_index` equal |
//! | `Active` | `status ∈ [running, waiting, failing]` |
//! | `PriorityBelow(p)` | `status ∈ [running, waiting, failing]`, `business_priority > p` (a larger number is less urgent) |
//! | `Operator { revision }` | `status ∈ [running, waiting, failing]`, `revision = r` (optimistic: the revision an operator read, K-17.3), `claim_token: {$exists: false}` (no claim holds it, K-6.8) |
//!
//! The one addition to the guard is structural: a write that patches `steps.<i>` also
//! requires `steps.<max i>` to exist, because MongoDB would otherwise *pad the array with
//! nulls* up to that index and corrupt the instance. The store reports such a write as
//! [`Error::InvalidInput`] after a re-read.
//!
//! Every user value is a BSON value under a fixed key: ids, tokens and names are strings
//! compared for equality, never documents, so `{"$ne": null}` as an id is just a string.
//!
//! What is refused is decided by kernel-core, the one K-2.0 rule every adapter shares:
//! [`Guard::validate`], [`Transition::validate`] and [`WorkflowInstance::validate`] run
//! before any translation. This module adds only what BSON itself cannot hold (integers
//! beyond the signed range, NUL in object keys, documents over
//! [`Limits::document_bytes_max`]). Guards, transitions and patches are destructured field
//! by field, so a field added to them is a compile error here, never a dropped write.

use crate::codec::{self, dt, i32_of, i64_of, json_to_bson};
use kernel_core::domain::*;
use kernel_core::transition::{AttemptChange, Guard, Patch, StepPatch, Transition};
use kernel_core::{validate, Error, Result};
use mongodb::bson::{doc, Bson, Document};

/// Identifier of the replay array filter (`steps.$[f]`).
pub const FAILED_STEP_FILTER: &str = "f";

/// Size limits checked before a document reaches the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest input, output or checkpoint, as serialized JSON bytes; default
    /// [`validate::STORE_PAYLOAD_BYTES_MAX`], the limit of the in-memory adapters.
    pub payload_bytes_max: usize,
    /// Largest inserted document or update document, in BSON bytes (MongoDB refuses
    /// documents over 16 MiB; stay well below so the stored document can still grow).
    pub document_bytes_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { payload_bytes_max: validate::STORE_PAYLOAD_BYTES_MAX, document_bytes_max: 4 * 1024 * 1024 }
    }
}

fn statuses(s: &[WorkflowStatus]) -> Bson {
    Bson::Array(s.iter().map(|x| Bson::String(x.as_str().into())).collect())
}

const ACTIVE: [WorkflowStatus; 3] = [WorkflowStatus::Running, WorkflowStatus::Waiting, WorkflowStatus::Failing];
const CLAIMABLE: [WorkflowStatus; 2] = [WorkflowStatus::Running, WorkflowStatus::Failing];

/// The filter of `guard`, preceded by `workflow_id = id` when an id is given (`claim_any`
/// has none). Validates every identifier it embeds ([`Guard::validate`]).
pub fn guard_filter(workflow_id: Option<&str>, guard: &Guard) -> Result<Document> {
    let mut f = Document::new();
    if let Some(id) = workflow_id {
        validate::identifier("workflow_id", id)?;
        f.insert("workflow_id", id);
    }
    guard.validate()?;
    match guard {
        Guard::Claimable { now, types } => {
            f.insert("status", doc! { "$in": statuses(&CLAIMABLE) });
            f.insert("claimable_time", doc! { "$lte": dt(*now) });
            f.insert("type", doc! { "$in": types.iter().map(|t| Bson::String(t.clone())).collect::<Vec<_>>() });
        }
        Guard::Running { token } => {
            f.insert("status", WorkflowStatus::Running.as_str());
            f.insert("claim_token", token.as_str());
        }
        Guard::Failing { token } => {
            f.insert("status", WorkflowStatus::Failing.as_str());
            f.insert("claim_token", token.as_str());
        }
        Guard::Token { token } => {
            f.insert("claim_token", token.as_str());
        }
        Guard::Failed { unless_round } => {
            f.insert("status", WorkflowStatus::Failed.as_str());
            if let Some(round) = unless_round {
                // `$ne` also matches a missing or non-string round, as `Guard::matches` does.
                f.insert("input.fencing_token", doc! { "$ne": round.as_str() });
            }
        }
        Guard::DueWait { now, step_index } => {
            f.insert("status", WorkflowStatus::Waiting.as_str());
            f.insert("claimable_time", doc! { "$lte": dt(*now) });
            f.insert("wait.step_index", i32_of("step_index", *step_index)?);
        }
        Guard::SignalWait(WaitIdentity { signal_type, wait_key, generation, step_index }) => {
            f.insert("status", WorkflowStatus::Waiting.as_str());
            f.insert("wait.kind", "signal");
            f.insert("wait.signal_type", signal_type.as_str());
            f.insert("wait.wait_key", wait_key.as_str());
            f.insert("wait.generation", i64_of("generation", *generation)?);
            f.insert("wait.step_index", i32_of("step_index", *step_index)?);
        }
        Guard::Active => {
            f.insert("status", doc! { "$in": statuses(&ACTIVE) });
        }
        Guard::PriorityBelow(p) => {
            f.insert("status", doc! { "$in": statuses(&ACTIVE) });
            f.insert("business_priority", doc! { "$gt": codec::priority_bson(*p) });
        }
        Guard::Operator { revision } => {
            f.insert("status", doc! { "$in": statuses(&ACTIVE) });
            f.insert("revision", i64_of("revision", *revision)?);
            // No claim holds the instance (K-6.8). The token is never stored as null: it is
            // written only as a string and cleared with `$unset`, so absent means none.
            f.insert("claim_token", doc! { "$exists": false });
        }
    }
    Ok(f)
}

/// The update document of a transition, plus its array filters.
#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    /// `{ $set, $unset, $inc }` (empty operators omitted).
    pub update: Document,
    /// `arrayFilters` (replay's `reset_failed_steps`).
    pub array_filters: Option<Vec<Document>>,
    /// Highest step index patched, if any: the write also requires `steps.<i>` to exist.
    pub step_index_max: Option<u32>,
}

impl Update {
    /// `guard_filter` plus the structural step condition.
    pub fn filter(&self, workflow_id: &str, guard: &Guard) -> Result<Document> {
        let mut f = guard_filter(Some(workflow_id), guard)?;
        if let Some(i) = self.step_index_max {
            f.insert(format!("steps.{i}"), doc! { "$exists": true });
        }
        Ok(f)
    }
}

#[derive(Default)]
struct Ops {
    set: Document,
    unset: Document,
    inc: Document,
}

impl Ops {
    fn patch<T>(&mut self, key: String, p: &Patch<T>, enc: impl FnOnce(&T) -> Result<Bson>) -> Result<()> {
        match p {
            Patch::Set(v) => {
                self.set.insert(key, enc(v)?);
            }
            Patch::Unset => {
                self.unset.insert(key, "");
            }
        }
        Ok(())
    }
}

fn step_patch(ops: &mut Ops, p: &StepPatch) -> Result<()> {
    let StepPatch {
        index,
        status,
        attempt,
        error,
        checkpoint,
        elapsed_ms_inc,
        traffic_wait_ms_inc,
        traffic_waits_inc,
        started_at,
        finished_at,
        epoch,
        record,
        history,
        retrying_since,
        iterations,
        completed_revision,
    } = p;
    let k = |f: &str| format!("steps.{index}.{f}");
    if let Some(s) = status {
        ops.set.insert(k("status"), s.as_str());
    }
    match attempt {
        Some(AttemptChange::Inc(d)) => {
            ops.inc.insert(k("attempt"), Bson::Int32(*d));
        }
        Some(AttemptChange::Reset) => {
            ops.set.insert(k("attempt"), Bson::Int32(0));
        }
        None => {}
    }
    if let Some(e) = error {
        ops.patch(k("error"), e, |e| Ok(codec::step_error_doc(e)))?;
    }
    if let Some(c) = checkpoint {
        let field = k("checkpoint");
        ops.patch(field.clone(), c, |v| json_to_bson(&field, v))?;
    }
    if *elapsed_ms_inc != 0 {
        ops.inc.insert(k("elapsed_ms"), Bson::Int64(elapsed_ms_inc.as_millis()));
    }
    if *traffic_wait_ms_inc != 0 {
        ops.inc.insert(k("traffic_wait_ms"), Bson::Int64(traffic_wait_ms_inc.as_millis()));
    }
    if *traffic_waits_inc != 0 {
        ops.inc.insert(k("traffic_waits"), i32_of("traffic_waits", *traffic_waits_inc)?);
    }
    if let Some(t) = started_at {
        ops.set.insert(k("started_at"), dt(*t));
    }
    if let Some(f) = finished_at {
        ops.patch(k("finished_at"), f, |t| Ok(dt(*t)))?;
    }
    // Epoch 0 and an empty history are not stored (as the step serializes them): unset.
    match epoch {
        Some(0) => {
            ops.unset.insert(k("epoch"), "");
        }
        Some(e) => {
            ops.set.insert(k("epoch"), codec::epoch_bson(*e));
        }
        None => {}
    }
    if let Some(r) = record {
        let field = k("record");
        ops.patch(field.clone(), r, |r| codec::record_bson(&field, r))?;
    }
    match history {
        Some(Patch::Set(h)) if !h.is_empty() => {
            let field = k("history");
            ops.set.insert(field.clone(), codec::history_bson(&field, h)?);
        }
        Some(_) => {
            ops.unset.insert(k("history"), "");
        }
        None => {}
    }
    if let Some(t) = retrying_since {
        ops.patch(k("retrying_since"), t, |t| Ok(dt(*t)))?;
    }
    // Loop iterations: stored only above 0, as the step serializes them.
    match iterations {
        Some(0) => {
            ops.unset.insert(k("iterations"), "");
        }
        Some(n) => {
            ops.set.insert(k("iterations"), codec::epoch_bson(*n));
        }
        None => {}
    }
    if let Some(r) = completed_revision {
        let field = k("completed_revision");
        ops.patch(field.clone(), r, |r| codec::i64_of(&field, *r))?;
    }
    Ok(())
}

/// Translate a transition into one update document (K-6.4). The transition is checked by
/// [`Transition::validate`] first (output names, tokens, wait identities, payload sizes,
/// one patch per step, no step patch beside replay's array filter).
pub fn transition_update(t: &Transition, limits: &Limits) -> Result<Update> {
    t.validate(limits.payload_bytes_max)?;
    let Transition {
        kinds: _,
        now,
        status,
        steps,
        outputs,
        outputs_unset,
        input,
        claimable_time,
        claim_token,
        wait,
        resume,
        fingerprint_mismatch,
        priority,
        reset_failed_steps,
        retry_count_inc,
        prepare_failures,
        refused_writes,
        finished_at,
        compensation,
        operator_request,
        bump_revision,
    } = t;
    let mut ops = Ops::default();
    if let Some(s) = status {
        ops.set.insert("status", s.as_str());
    }
    if *reset_failed_steps {
        let f = |n: &str| format!("steps.$[{FAILED_STEP_FILTER}].{n}");
        ops.set.insert(f("status"), StepStatus::Pending.as_str());
        ops.set.insert(f("attempt"), Bson::Int32(0));
        ops.set.insert(f("elapsed_ms"), Bson::Int64(0));
        ops.set.insert(f("traffic_wait_ms"), Bson::Int64(0));
        ops.set.insert(f("traffic_waits"), Bson::Int32(0));
        // A new run: epoch, record and history stay (K-17.3), the attempt's fields and the
        // loop's iterations go.
        for n in
            ["error", "checkpoint", "started_at", "finished_at", "retrying_since", "iterations", "completed_revision"]
        {
            ops.unset.insert(f(n), "");
        }
    }
    for p in steps {
        step_patch(&mut ops, p)?;
    }
    for (name, v) in outputs {
        let field = format!("output.{name}");
        ops.set.insert(field.clone(), json_to_bson(&field, v)?);
    }
    for name in outputs_unset {
        ops.unset.insert(format!("output.{name}"), "");
    }
    if let Some(i) = input {
        ops.set.insert("input", json_to_bson("input", i)?);
    }
    if let Some(p) = claimable_time {
        ops.patch("claimable_time".into(), p, |x| Ok(dt(*x)))?;
    }
    if let Some(p) = claim_token {
        ops.patch("claim_token".into(), p, |x| Ok(Bson::String(x.to_string())))?;
    }
    if let Some(p) = wait {
        ops.patch("wait".into(), p, |w| Ok(Bson::Document(codec::wait_doc(w)?)))?;
    }
    if let Some(p) = resume {
        ops.patch("resume".into(), p, |r| Ok(Bson::Document(codec::resume_doc(r)?)))?;
    }
    if let Some(m) = fingerprint_mismatch {
        ops.set.insert("fingerprint_mismatch", codec::mismatch_doc(m));
    }
    if let Some(p) = priority {
        ops.set.insert("business_priority", codec::priority_bson(*p));
    }
    if let Some(p) = finished_at {
        ops.patch("finished_at".into(), p, |x| Ok(dt(*x)))?;
    }
    if let Some(n) = prepare_failures {
        ops.set.insert("prepare_failures", codec::i32_of("prepare_failures", *n)?);
    }
    if let Some(n) = refused_writes {
        ops.set.insert("refused_writes", codec::i32_of("refused_writes", *n)?);
    }
    if let Some(p) = compensation {
        ops.patch("compensation".into(), p, codec::compensation_bson)?;
    }
    if let Some(p) = operator_request {
        ops.patch("operator_request".into(), p, codec::operator_request_bson)?;
    }
    ops.set.insert("updated_at", dt(*now));
    if *retry_count_inc {
        ops.inc.insert("retry_count", Bson::Int32(1));
    }
    if *bump_revision {
        ops.inc.insert("revision", Bson::Int64(1));
    }

    let mut update = Document::new();
    for (op, d) in [("$set", ops.set), ("$unset", ops.unset), ("$inc", ops.inc)] {
        if !d.is_empty() {
            update.insert(op, d);
        }
    }
    check_size("transition", &update, limits)?;
    Ok(Update {
        update,
        array_filters: reset_failed_steps
            .then(|| vec![doc! { format!("{FAILED_STEP_FILTER}.status"): StepStatus::Failed.as_str() }]),
        step_index_max: steps.iter().map(|p| p.index).max(),
    })
}

/// BSON size of `d` against [`Limits::document_bytes_max`].
pub(crate) fn check_size(field: &str, d: &Document, limits: &Limits) -> Result<()> {
    let mut buf = Vec::new();
    d.to_writer(&mut buf).map_err(|e| Error::invalid_with(field, e.to_string(), e))?;
    if buf.len() > limits.document_bytes_max {
        return Err(Error::invalid(
            field,
            format_args!("{} BSON bytes exceeds the document limit of {}", buf.len(), limits.document_bytes_max),
        ));
    }
    Ok(())
}

/// Validate an instance before insert ([`WorkflowInstance::validate`], then the BSON size
/// limit) and return its document.
pub fn instance_document(w: &WorkflowInstance, limits: &Limits) -> Result<Document> {
    w.validate(limits.payload_bytes_max)?;
    let d = codec::instance_doc(w)?;
    check_size("instance", &d, limits)?;
    Ok(d)
}
