//! Rows → port records. A row that does not decode is [`Error::Corrupt`] naming the column;
//! scans quarantine it instead (see `store.rs`).

use kernel_core::domain::*;
use kernel_core::ports::{SignalRecord, SignalStatus};
use kernel_core::{Error, Result};
use rusqlite::types::FromSql;
use rusqlite::Row;
use serde::de::DeserializeOwned;

pub(crate) fn corrupt(column: &str, why: impl std::fmt::Display) -> Error {
    Error::corrupt(format!("column `{column}`: {why}"))
}

pub(crate) fn col<T: FromSql>(row: &Row<'_>, column: &str) -> Result<T> {
    row.get::<_, T>(column).map_err(|e| Error::Corrupt {
        message: format!("column `{column}`: {e}"),
        workflow_id: None,
        cause: Some(e.into()),
    })
}

fn json<T: DeserializeOwned>(column: &str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| Error::Corrupt {
        message: format!("column `{column}`: {e}"),
        workflow_id: None,
        cause: Some(e.into()),
    })
}

pub(crate) fn json_col<T: DeserializeOwned>(row: &Row<'_>, column: &str) -> Result<T> {
    json(column, &col::<String>(row, column)?)
}

fn opt_json<T: DeserializeOwned>(row: &Row<'_>, column: &str) -> Result<Option<T>> {
    col::<Option<String>>(row, column)?.map(|v| json(column, &v)).transpose()
}

fn u32_of(column: &str, v: i64) -> Result<u32> {
    u32::try_from(v).map_err(|_| corrupt(column, format_args!("{v} is not a u32")))
}

pub(crate) fn priority_of(row: &Row<'_>) -> Result<Priority> {
    let p: i64 = col(row, "business_priority")?;
    u8::try_from(p)
        .map_err(|_| corrupt("business_priority", format_args!("{p} is not 0..=3")))
        .and_then(|p| Priority::try_from(p).map_err(|e| corrupt("business_priority", e)))
}

pub(crate) fn status_of<T: DeserializeOwned>(row: &Row<'_>, column: &str) -> Result<T> {
    serde_json::from_value(serde_json::Value::String(col::<String>(row, column)?)).map_err(|e| corrupt(column, e))
}

fn time(row: &Row<'_>, column: &str) -> Result<Instant> {
    Ok(Instant::from_millis(col::<i64>(row, column)?))
}

fn opt_time(row: &Row<'_>, column: &str) -> Result<Option<Instant>> {
    Ok(col::<Option<i64>>(row, column)?.map(Instant::from_millis))
}

/// A row of every instance column ([`INSTANCE_COLUMNS`](crate::protocol::INSTANCE_COLUMNS)).
pub(crate) fn instance(row: &Row<'_>) -> Result<WorkflowInstance> {
    let revision: i64 = col(row, "revision")?;
    Ok(WorkflowInstance {
        workflow_id: col::<String>(row, "workflow_id")?.into(),
        workflow_type: col(row, "workflow_type")?,
        biz_key: col(row, "biz_key")?,
        status: status_of(row, "status")?,
        steps: json_col(row, "steps")?,
        input: json_col(row, "input")?,
        output: json_col(row, "output")?,
        claimable_time: opt_time(row, "claimable_time")?,
        claim_token: col::<Option<String>>(row, "claim_token")?.map(Into::into),
        wait: opt_json(row, "wait")?,
        resume: opt_json(row, "resume")?,
        definition_fingerprint: col(row, "definition_fingerprint")?,
        fingerprint_mismatch: opt_json(row, "fingerprint_mismatch")?,
        business_priority: priority_of(row)?,
        retry_count: u32_of("retry_count", col(row, "retry_count")?)?,
        prepare_failures: u32_of("prepare_failures", col(row, "prepare_failures")?)?,
        refused_writes: u32_of("refused_writes", col(row, "refused_writes")?)?,
        revision: u64::try_from(revision).map_err(|_| corrupt("revision", format_args!("{revision} < 0")))?,
        created_at: time(row, "created_at")?,
        updated_at: time(row, "updated_at")?,
        finished_at: opt_time(row, "finished_at")?,
        compensation: opt_json(row, "compensation")?,
        trace_parent: col(row, "trace_parent")?,
        operator_request: opt_json(row, "operator_request")?,
    })
}

/// The wait of a due-wait scan row.
pub(crate) fn wait(row: &Row<'_>) -> Result<Wait> {
    opt_json::<Wait>(row, "wait")?.ok_or_else(|| corrupt("wait", "missing"))
}

/// A row of every inbox column ([`INBOX_COLUMNS`](crate::inbox::INBOX_COLUMNS)).
pub(crate) fn signal(row: &Row<'_>) -> Result<SignalRecord> {
    let generation: i64 = col(row, "generation")?;
    Ok(SignalRecord {
        signal_id: col(row, "signal_id")?,
        workflow_id: col::<String>(row, "workflow_id")?.into(),
        signal_type: col(row, "signal_type")?,
        wait_key: col(row, "wait_key")?,
        generation: u64::try_from(generation).map_err(|_| corrupt("generation", format_args!("{generation} < 0")))?,
        status: status_of::<SignalStatus>(row, "status")?,
        created_at: time(row, "created_at")?,
        match_time: opt_time(row, "match_time")?,
        orphan: col::<i64>(row, "orphan")? != 0,
    })
}

/// A row of every dead-letter column ([`DEAD_LETTER_COLUMNS`](crate::dead_letter::DEAD_LETTER_COLUMNS)).
pub(crate) fn dead_letter(row: &Row<'_>) -> Result<kernel_core::ports::DeadLetter> {
    let counter = |column: &str| -> Result<u32> { u32_of(column, col::<i64>(row, column)?) };
    Ok(kernel_core::ports::DeadLetter {
        id: col(row, "id")?,
        workflow_id: col::<String>(row, "workflow_id")?.into(),
        workflow_type: col(row, "workflow_type")?,
        step: col(row, "step")?,
        step_index: counter("step_index")?,
        run: counter("run")?,
        epoch: counter("epoch")?,
        error: json_col(row, "error")?,
        inputs: json_col(row, "inputs")?,
        created_at: time(row, "created_at")?,
        status: status_of(row, "status")?,
        decision: opt_json(row, "decision")?,
        closed_at: opt_time(row, "closed_at")?,
    })
}

/// A row of every task column ([`TASK_COLUMNS`](crate::task_inbox::TASK_COLUMNS)).
pub(crate) fn task(row: &Row<'_>) -> Result<kernel_core::ports::TaskRecord> {
    Ok(kernel_core::ports::TaskRecord {
        id: col(row, "id")?,
        workflow_id: col::<String>(row, "workflow_id")?.into(),
        workflow_type: col(row, "workflow_type")?,
        step: col(row, "step")?,
        level: u32_of("level", col(row, "level")?)?,
        title: col(row, "title")?,
        assignee: col(row, "assignee")?,
        roles: json_col(row, "roles")?,
        evidence: json_col(row, "evidence")?,
        token: col(row, "token")?,
        created_at: time(row, "created_at")?,
        due_at: time(row, "due_at")?,
        status: status_of(row, "status")?,
        decision: task_decision(row)?,
        closed_at: opt_time(row, "closed_at")?,
    })
}

/// The `decision` column of a task row.
pub(crate) fn task_decision(row: &Row<'_>) -> Result<Option<kernel_core::ports::TaskDecision>> {
    opt_json(row, "decision")
}
