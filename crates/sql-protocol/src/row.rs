//! Rows → port records, written once for both stores over [`SqlRow`], the typed getters
//! each store implements for its driver's row. A row that does not decode is
//! [`Error::Corrupt`] naming the column; scans quarantine it instead.

use kernel_core::domain::*;
use kernel_core::ports::{CachedResult, DeadLetter, DispatchRecord, SignalRecord, TaskDecision, TaskRecord};
use kernel_core::{Error, Result, WorkflowId};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// `Error::Corrupt` naming `column`.
pub fn corrupt(column: &str, why: impl std::fmt::Display) -> Error {
    Error::corrupt(format!("column `{column}`: {why}"))
}

/// `Error::Corrupt` naming `column`, keeping the driver's or decoder's error as its cause.
pub fn corrupt_with(column: &str, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Corrupt { message: format!("column `{column}`: {e}"), workflow_id: None, cause: Some(e.into()) }
}

/// A result row read by name, as each driver reads it: the store's glue. Every getter
/// fails with [`Error::Corrupt`] naming the column (see [`corrupt_with`]).
///
/// JSON columns are `jsonb` in PostgreSQL and JSON text in SQLite; [`json`](Self::json)
/// decodes either straight into the kernel type. A text array is `text[]` in PostgreSQL
/// and a JSON array of strings in SQLite. A boolean is `bool` in PostgreSQL and 0/1 in
/// SQLite; an integer may be any integer width in PostgreSQL.
pub trait SqlRow {
    /// A non-null text column.
    fn text(&self, column: &str) -> Result<String>;
    /// A nullable text column.
    fn opt_text(&self, column: &str) -> Result<Option<String>>;
    /// A non-null integer column.
    fn int(&self, column: &str) -> Result<i64>;
    /// A nullable integer column.
    fn opt_int(&self, column: &str) -> Result<Option<i64>>;
    /// A non-null boolean column.
    fn boolean(&self, column: &str) -> Result<bool>;
    /// A nullable JSON column, decoded into `T`.
    fn opt_json<T: DeserializeOwned>(&self, column: &str) -> Result<Option<T>>;
    /// A text-array column.
    fn text_array(&self, column: &str) -> Result<Vec<String>>;

    /// A non-null JSON column, decoded into `T`.
    fn json<T: DeserializeOwned>(&self, column: &str) -> Result<T> {
        self.opt_json(column)?.ok_or_else(|| corrupt(column, "unexpected NULL"))
    }
}

fn u32_of(column: &str, v: i64) -> Result<u32> {
    u32::try_from(v).map_err(|_| corrupt(column, format_args!("{v} is not a u32")))
}

fn u64_of(column: &str, v: i64) -> Result<u64> {
    u64::try_from(v).map_err(|_| corrupt(column, format_args!("{v} < 0")))
}

fn time(row: &impl SqlRow, column: &str) -> Result<Instant> {
    Ok(Instant::from_millis(row.int(column)?))
}

fn opt_time(row: &impl SqlRow, column: &str) -> Result<Option<Instant>> {
    Ok(row.opt_int(column)?.map(Instant::from_millis))
}

/// A status column holding the serde name of `T`.
pub fn status_of<T: DeserializeOwned>(row: &impl SqlRow, column: &str) -> Result<T> {
    serde_json::from_value(Value::String(row.text(column)?)).map_err(|e| corrupt_with(column, e))
}

/// The `business_priority` column.
pub fn priority(row: &impl SqlRow) -> Result<Priority> {
    let p = row.int("business_priority")?;
    u8::try_from(p)
        .map_err(|_| corrupt("business_priority", format_args!("{p} is not 0..=3")))
        .and_then(|p| Priority::try_from(p).map_err(|e| corrupt("business_priority", e)))
}

/// The `workflow_id` of a row, or `unreadable`: the name a quarantined row is reported under.
pub fn row_id(row: &impl SqlRow) -> WorkflowId {
    row.text("workflow_id").map_or_else(|_| WorkflowId::from("unreadable"), WorkflowId::from)
}

/// A row of every instance column ([`INSTANCE_COLUMNS`](crate::INSTANCE_COLUMNS)).
pub fn instance(row: &impl SqlRow) -> Result<WorkflowInstance> {
    Ok(WorkflowInstance {
        workflow_id: row.text("workflow_id")?.into(),
        workflow_type: row.text("workflow_type")?,
        biz_key: row.text("biz_key")?,
        status: status_of(row, "status")?,
        steps: row.json("steps")?,
        input: row.json("input")?,
        output: row.json("output")?,
        claimable_time: opt_time(row, "claimable_time")?,
        claim_token: row.opt_text("claim_token")?.map(Into::into),
        wait: row.opt_json("wait")?,
        resume: row.opt_json("resume")?,
        definition_fingerprint: row.text("definition_fingerprint")?,
        fingerprint_mismatch: row.opt_json("fingerprint_mismatch")?,
        business_priority: priority(row)?,
        retry_count: u32_of("retry_count", row.int("retry_count")?)?,
        prepare_failures: u32_of("prepare_failures", row.int("prepare_failures")?)?,
        refused_writes: u32_of("refused_writes", row.int("refused_writes")?)?,
        revision: u64_of("revision", row.int("revision")?)?,
        created_at: time(row, "created_at")?,
        updated_at: time(row, "updated_at")?,
        finished_at: opt_time(row, "finished_at")?,
        compensation: row.opt_json("compensation")?,
        trace_parent: row.opt_text("trace_parent")?,
        operator_request: row.opt_json("operator_request")?,
    })
}

/// The `revision` an apply returns.
pub fn revision(row: &impl SqlRow) -> Result<u64> {
    u64_of("revision", row.int("revision")?)
}

/// A row of the due-wait scan ([`store::due_waits`](crate::store::due_waits)).
pub fn due_wait(row: &impl SqlRow) -> Result<kernel_core::ports::DueWait> {
    let w: Wait = row.opt_json("wait")?.ok_or_else(|| corrupt("wait", "missing"))?;
    Ok(kernel_core::ports::DueWait {
        workflow_id: row.text("workflow_id")?.into(),
        step_index: w.step_index(),
        resume: w.due_resume(),
        priority: priority(row)?,
    })
}

/// A row of the rebuild scan ([`store::claimable`](crate::store::claimable)).
pub fn candidate(row: &impl SqlRow) -> Result<kernel_core::ports::Candidate> {
    Ok(kernel_core::ports::Candidate {
        workflow_id: row.text("workflow_id")?.into(),
        priority: priority(row)?,
        claimable_time: time(row, "claimable_time")?,
    })
}

/// A row of every inbox column ([`INBOX_COLUMNS`](crate::inbox::INBOX_COLUMNS)).
pub fn signal(row: &impl SqlRow) -> Result<SignalRecord> {
    Ok(SignalRecord {
        signal_id: row.text("signal_id")?,
        workflow_id: row.text("workflow_id")?.into(),
        signal_type: row.text("signal_type")?,
        wait_key: row.text("wait_key")?,
        generation: u64_of("generation", row.int("generation")?)?,
        status: status_of(row, "status")?,
        created_at: time(row, "created_at")?,
        match_time: opt_time(row, "match_time")?,
        orphan: row.boolean("orphan")?,
    })
}

/// A row of every dead-letter column ([`DEAD_LETTER_COLUMNS`](crate::DEAD_LETTER_COLUMNS)).
pub fn dead_letter(row: &impl SqlRow) -> Result<DeadLetter> {
    let counter = |column: &str| -> Result<u32> { u32_of(column, row.int(column)?) };
    Ok(DeadLetter {
        id: row.text("id")?,
        workflow_id: row.text("workflow_id")?.into(),
        workflow_type: row.text("workflow_type")?,
        step: row.text("step")?,
        step_index: counter("step_index")?,
        run: counter("run")?,
        epoch: counter("epoch")?,
        error: row.json("error")?,
        inputs: row.json("inputs")?,
        created_at: time(row, "created_at")?,
        status: status_of(row, "status")?,
        decision: row.opt_json("decision")?,
        closed_at: opt_time(row, "closed_at")?,
    })
}

/// A row of every task column ([`TASK_COLUMNS`](crate::TASK_COLUMNS)).
pub fn task(row: &impl SqlRow) -> Result<TaskRecord> {
    Ok(TaskRecord {
        id: row.text("id")?,
        workflow_id: row.text("workflow_id")?.into(),
        workflow_type: row.text("workflow_type")?,
        step: row.text("step")?,
        level: u32_of("level", row.int("level")?)?,
        title: row.text("title")?,
        assignee: row.opt_text("assignee")?,
        roles: row.text_array("roles")?,
        evidence: row.json("evidence")?,
        token: row.text("token")?,
        created_at: time(row, "created_at")?,
        due_at: time(row, "due_at")?,
        status: status_of(row, "status")?,
        decision: task_decision(row)?,
        closed_at: opt_time(row, "closed_at")?,
    })
}

/// The `decision` column of a task row.
pub fn task_decision(row: &impl SqlRow) -> Result<Option<TaskDecision>> {
    row.opt_json("decision")
}

/// A row of the outbox's columns (`object_id`, `business_status`, `fields`, `dispatch`).
pub fn dispatch_record(row: &impl SqlRow) -> Result<DispatchRecord> {
    let dispatch: Option<Value> = row.opt_json("dispatch")?;
    Ok(DispatchRecord {
        object_id: row.text("object_id")?.into(),
        business_status: row.opt_text("business_status")?,
        dispatch: dispatch
            .map(|v| serde_json::from_value(v).map_err(|e| corrupt("workflow_dispatch", e)))
            .transpose()?,
        fields: row.opt_json("fields")?.unwrap_or_else(|| Value::Object(Default::default())),
    })
}

/// A row of the outbox's due scan: the object and when its intent is due.
pub fn due_object(row: &impl SqlRow) -> Result<(kernel_core::ObjectId, Instant)> {
    Ok((row.text("object_id")?.into(), time(row, "due")?))
}

/// A row of the result cache (`value`, `stored_at`, `expires_at`).
pub fn cached_result(row: &impl SqlRow) -> Result<CachedResult> {
    Ok(CachedResult {
        value: row.json("value")?,
        stored_at: time(row, "stored_at")?,
        expires_at: time(row, "expires_at")?,
    })
}

/// The count `n` of a counting statement (no row counts 0).
pub fn count(row: Option<&impl SqlRow>) -> Result<u64> {
    let n = row.map_or(Ok(0), |r| r.int("n"))?;
    u64::try_from(n).map_err(|_| corrupt("count", n))
}

/// A scan row decoded by `decode`, with the `workflow_id` it is reported under when it
/// does not decode ([`scan_page`]).
pub fn scanned<R: SqlRow, T>(row: &R, decode: impl Fn(&R) -> Result<T>) -> (WorkflowId, Result<T>) {
    (row_id(row), decode(row))
}

/// A scan page of decoded rows: a row that does not decode is quarantined (skipped and
/// reported), never an error of the page. `workflow_id` is a non-null text primary key,
/// so every row read is a cursor.
pub fn scan_page<T>(rows: impl ExactSizeIterator<Item = (WorkflowId, Result<T>)>) -> kernel_core::ports::ScanPage<T> {
    let mut page = kernel_core::ports::ScanPage { read: rows.len(), ..Default::default() };
    for (id, row) in rows {
        match row {
            Ok(v) => page.rows.push(v),
            Err(e) => page
                .quarantined
                .push(kernel_core::ports::Quarantined { workflow_id: id.clone(), reason: e.to_string() }),
        }
        page.last = Some(id);
    }
    page
}

/// A scanned inbox row: its `signal_id` (read on its own, so an undecodable row is still
/// named) and its record ([`signal`]).
pub fn scanned_signal(row: &impl SqlRow) -> Result<(Result<String>, Result<SignalRecord>)> {
    Ok((row.text("signal_id"), signal(row)))
}

/// A scan page of [`scanned_signal`] rows: a row that does not decode is reported under
/// its `signal_id` (a non-null text primary key, so every row read is a cursor), never an
/// error of the page.
pub fn signal_page(rows: Vec<(Result<String>, Result<SignalRecord>)>) -> kernel_core::ports::SignalPage {
    let mut page = kernel_core::ports::SignalPage::default();
    for (id, decoded) in rows {
        match (decoded, id) {
            (Ok(record), _) => page.push(record),
            (Err(e), Ok(id)) => page.push_undecodable(id, e.to_string(), true),
            (Err(e), Err(_)) => page.push_undecodable("unreadable".to_string(), e.to_string(), false),
        }
    }
    page
}
