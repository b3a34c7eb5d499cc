//! The signal inbox (K-9.3, K-9.4): every statement of
//! [`SignalInbox`](kernel_core::ports::SignalInbox) on the `signal_inbox` table, for both
//! dialects. Row: `(signal_id PK, workflow_id, signal_type, wait_key, generation,
//! status 'pending' | 'matched', created_at, match_time, orphan)`; decoded by
//! [`row::signal`](crate::row::signal).

use crate::{i64_of, text_of, Binds, Dialect, Param, Statement};
use kernel_core::domain::Instant;
use kernel_core::ports::{validate_delete_ids, SignalRecord, SignalStatus};
use kernel_core::{validate, Result, WorkflowId};

/// Inbox columns in the order every `SELECT` reads them.
pub const INBOX_COLUMNS: &str =
    "signal_id, workflow_id, signal_type, wait_key, generation, status, created_at, match_time, orphan";

fn status_str(s: SignalStatus) -> &'static str {
    match s {
        SignalStatus::Pending => "pending",
        SignalStatus::Matched => "matched",
    }
}

fn after_ok(after: Option<&str>) -> Result<()> {
    if let Some(a) = after {
        validate::identifier("after", a)?;
    }
    Ok(())
}

/// `insert`: `ON CONFLICT (signal_id) DO NOTHING RETURNING signal_id` (no row: a
/// duplicate, which the store reads with [`get`]). The record is checked by
/// [`SignalRecord::validate`] first; a generation beyond the 64-bit signed range is refused.
pub fn insert(d: Dialect, t: &str, record: &SignalRecord) -> Result<Statement> {
    record.validate()?;
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
    } = record;
    let generation = i64_of("generation", *generation)?;
    let mut b = Binds::new(d);
    let vals = [
        b.bind(text_of(d, "signal_id", signal_id)?),
        b.bind(text_of(d, "workflow_id", workflow_id.as_str())?),
        b.bind(text_of(d, "signal_type", signal_type)?),
        b.bind(text_of(d, "wait_key", wait_key)?),
        b.bind(Param::Int8(generation)),
        b.bind(Param::Text(status_str(*status).to_string())),
        b.bind(Param::Int8(created_at.as_millis())),
        b.bind(match match_time {
            Some(t) => Param::Int8(t.as_millis()),
            None => Param::NullInt8,
        }),
        b.bind(Param::Bool(*orphan)),
    ];
    let sql = format!(
        "INSERT INTO {t} ({INBOX_COLUMNS}) VALUES ({}) ON CONFLICT (signal_id) DO NOTHING RETURNING signal_id",
        vals.join(", ")
    );
    Ok(b.statement(sql))
}

/// `get`: one record by id.
pub fn get(d: Dialect, t: &str, signal_id: &str) -> Result<Statement> {
    validate::identifier("signal_id", signal_id)?;
    let mut b = Binds::new(d);
    let id = b.bind(Param::Text(signal_id.to_string()));
    Ok(b.statement(format!("SELECT {INBOX_COLUMNS} FROM {t} WHERE signal_id = {id}")))
}

/// `find_pending`: the oldest pending record of the identity (served by
/// `signal_inbox_workflow`); `None` when no record can match (a generation beyond the
/// 64-bit signed range is never stored).
pub fn find_pending(
    d: Dialect,
    t: &str,
    workflow_id: &WorkflowId,
    signal_type: &str,
    wait_key: &str,
    generation: u64,
) -> Result<Option<Statement>> {
    validate::identifier("workflow_id", workflow_id.as_str())?;
    validate::identifier("signal_type", signal_type)?;
    validate::identifier("wait_key", wait_key)?;
    let Ok(generation) = i64::try_from(generation) else { return Ok(None) };
    let mut b = Binds::new(d);
    let w = b.bind(Param::Text(workflow_id.to_string()));
    let st = b.bind(Param::Text(signal_type.to_string()));
    let wk = b.bind(Param::Text(wait_key.to_string()));
    let g = b.bind(Param::Int8(generation));
    let sql = format!(
        "SELECT {INBOX_COLUMNS} FROM {t} WHERE workflow_id = {w} AND status = 'pending' \
         AND signal_type = {st} AND wait_key = {wk} AND generation = {g} ORDER BY created_at, signal_id LIMIT 1"
    );
    Ok(Some(b.statement(sql)))
}

/// `mark_matched`: `pending → matched`, `RETURNING signal_id` when this call changed it.
pub fn mark_matched(d: Dialect, t: &str, signal_id: &str, now: Instant) -> Result<Statement> {
    validate::identifier("signal_id", signal_id)?;
    let mut b = Binds::new(d);
    let id = b.bind(Param::Text(signal_id.to_string()));
    let now = b.bind(Param::Int8(now.as_millis()));
    let sql = format!(
        "UPDATE {t} SET status = 'matched', match_time = {now} WHERE signal_id = {id} AND status = 'pending' \
         RETURNING signal_id"
    );
    Ok(b.statement(sql))
}

/// A page by `signal_id` of the records matching `cond` (its values bound after the
/// limit), strictly after `after`.
fn page(mut b: Binds, t: &str, cond: &str, limit: &str, after: Option<&str>) -> Statement {
    let mut cond = cond.to_string();
    if let Some(a) = after {
        cond.push_str(&format!(" AND signal_id > {}", b.bind(Param::Text(a.to_string()))));
    }
    b.statement(format!("SELECT {INBOX_COLUMNS} FROM {t} WHERE {cond} ORDER BY signal_id LIMIT {limit}"))
}

/// `scan_pending`: `limit` is the page size already capped (`None`: an empty page, no
/// statement). Served by `signal_inbox_pending`.
pub fn scan_pending(d: Dialect, t: &str, after: Option<&str>, limit: Option<i64>) -> Result<Option<Statement>> {
    after_ok(after)?;
    let Some(limit) = limit else { return Ok(None) };
    let mut b = Binds::new(d);
    let limit = b.bind(Param::Int8(limit));
    Ok(Some(page(b, t, "status = 'pending'", &limit, after)))
}

/// `scan_created_before`: as [`scan_pending`], of the records created before `before`.
pub fn scan_created_before(
    d: Dialect,
    t: &str,
    before: Instant,
    after: Option<&str>,
    limit: Option<i64>,
) -> Result<Option<Statement>> {
    after_ok(after)?;
    let Some(limit) = limit else { return Ok(None) };
    let mut b = Binds::new(d);
    let limit = b.bind(Param::Int8(limit));
    let cond = format!("created_at < {}", b.bind(Param::Int8(before.as_millis())));
    Ok(Some(page(b, t, &cond, &limit, after)))
}

/// `scan_workflow`: the workflow's records of `status`, newest first (served by
/// `signal_inbox_workflow`, read backwards).
pub fn scan_workflow(
    d: Dialect,
    t: &str,
    workflow_id: &WorkflowId,
    status: SignalStatus,
    limit: Option<i64>,
) -> Result<Option<Statement>> {
    validate::identifier("workflow_id", workflow_id.as_str())?;
    let Some(limit) = limit else { return Ok(None) };
    let mut b = Binds::new(d);
    let limit = b.bind(Param::Int8(limit));
    let w = b.bind(Param::Text(workflow_id.to_string()));
    let s = b.bind(Param::Text(status_str(status).to_string()));
    let sql = format!(
        "SELECT {INBOX_COLUMNS} FROM {t} WHERE workflow_id = {w} AND status = {s} \
         ORDER BY created_at DESC, signal_id DESC LIMIT {limit}"
    );
    Ok(Some(b.statement(sql)))
}

/// `delete_if`: the listed records still of `status`, counted ([`Dialect::counted`]);
/// `None` for an empty list.
pub fn delete_if(d: Dialect, t: &str, signal_ids: &[String], status: SignalStatus) -> Result<Option<Statement>> {
    validate_delete_ids(signal_ids)?;
    if signal_ids.is_empty() {
        return Ok(None);
    }
    let mut b = Binds::new(d);
    let ids = b.bind(Param::TextArray(signal_ids.to_vec()));
    let s = b.bind(Param::Text(status_str(status).to_string()));
    let dml = format!("DELETE FROM {t} WHERE {} AND status = {s} RETURNING 1", d.in_array("signal_id", &ids));
    Ok(Some(b.statement(d.counted(dml))))
}

/// `count_pending_orphans`: a count `n` bounded by `limit` (served by
/// `signal_inbox_orphan`); `None` for a limit of 0.
pub fn count_pending_orphans(
    d: Dialect,
    t: &str,
    workflow_id: Option<&WorkflowId>,
    limit: u64,
) -> Result<Option<Statement>> {
    if let Some(w) = workflow_id {
        validate::identifier("workflow_id", w.as_str())?;
    }
    if limit == 0 {
        return Ok(None);
    }
    let mut b = Binds::new(d);
    let limit = b.bind(Param::Int8(i64::try_from(limit).unwrap_or(i64::MAX)));
    let mut cond = String::new();
    if let Some(w) = workflow_id {
        cond = format!(" AND workflow_id = {}", b.bind(Param::Text(w.to_string())));
    }
    let sql = format!(
        "SELECT count(*) AS n FROM (SELECT 1 FROM {t} WHERE {} AND status = 'pending'{cond} LIMIT {limit}) x",
        d.is_true("orphan")
    );
    Ok(Some(b.statement(sql)))
}

/// `clear_orphans`: counted ([`Dialect::counted`]).
pub fn clear_orphans(d: Dialect, t: &str, workflow_id: &WorkflowId) -> Result<Statement> {
    validate::identifier("workflow_id", workflow_id.as_str())?;
    let mut b = Binds::new(d);
    let w = b.bind(Param::Text(workflow_id.to_string()));
    let dml = format!(
        "UPDATE {t} SET orphan = {} WHERE {} AND workflow_id = {w} RETURNING 1",
        d.false_lit(),
        d.is_true("orphan")
    );
    Ok(b.statement(d.counted(dml)))
}
