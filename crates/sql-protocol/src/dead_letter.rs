//! Dead letters (K-17.2): every statement of
//! [`DeadLetters`](kernel_core::ports::DeadLetters) on the `dead_letters` table, for both
//! dialects; decoded by [`row::dead_letter`](crate::row::dead_letter). `record` an
//! `INSERT … ON CONFLICT (id) DO NOTHING`, `decide` an `UPDATE … WHERE id = $1 AND status =
//! 'open' RETURNING id` (then a read on a miss), `close` an `UPDATE … WHERE id = $1 AND
//! status = 'decided'`, `purge_closed` one bounded `DELETE` through the index on `closed_at`.

use crate::{check_size, dead_letter_params, jsonb, Binds, Dialect, Limits, Param, Statement, DEAD_LETTER_COLUMNS};
use kernel_core::domain::Instant;
use kernel_core::ports::{
    validate_dead_letter_list, validate_dead_letter_purge, DeadLetter, DeadLetterAction, DeadLetterDecision,
    DeadLetterStatus,
};
use kernel_core::{validate, Result};

/// `record`: `RETURNING id` when recorded (no row: the id exists).
pub fn record(d: Dialect, t: &str, dl: &DeadLetter, limits: &Limits) -> Result<Statement> {
    dl.validate_new()?;
    validate::payload("inputs", &dl.inputs, limits.payload_bytes_max)?;
    let params = dead_letter_params(d, dl)?;
    check_size("dead_letter", &params, limits)?;
    let mut b = Binds::new(d);
    let vals: Vec<String> = params.into_iter().map(|p| b.bind(p)).collect();
    let sql = format!(
        "INSERT INTO {t} ({DEAD_LETTER_COLUMNS}) VALUES ({}, 'open', NULL, NULL) ON CONFLICT (id) DO NOTHING \
         RETURNING id",
        vals.join(", ")
    );
    Ok(b.statement(sql))
}

/// `get`: one record by id.
pub fn get(d: Dialect, t: &str, id: &str) -> Result<Statement> {
    validate::identifier("id", id)?;
    let mut b = Binds::new(d);
    let id = b.bind(Param::Text(id.to_string()));
    Ok(b.statement(format!("SELECT {DEAD_LETTER_COLUMNS} FROM {t} WHERE id = {id}")))
}

/// `list`: by id, of one status or all, after `after` (served by the primary key, or by
/// `dead_letters_status_id` with a status).
pub fn list(
    d: Dialect,
    t: &str,
    status: Option<DeadLetterStatus>,
    after: Option<&str>,
    limit: usize,
) -> Result<Statement> {
    validate_dead_letter_list(after, limit)?;
    let mut b = Binds::new(d);
    let limit = b.bind(Param::Int8(limit as i64));
    let mut cond = Vec::new();
    if let Some(s) = status {
        cond.push(format!("status = {}", b.bind(Param::Text(s.as_str().to_string()))));
    }
    if let Some(a) = after {
        cond.push(format!("id > {}", b.bind(Param::Text(a.to_string()))));
    }
    let cond = if cond.is_empty() { String::new() } else { format!(" WHERE {}", cond.join(" AND ")) };
    Ok(b.statement(format!("SELECT {DEAD_LETTER_COLUMNS} FROM {t}{cond} ORDER BY id LIMIT {limit}")))
}

/// `decide`: `open → decided`, `RETURNING id` when this call decided it.
pub fn decide(d: Dialect, t: &str, id: &str, decision: &DeadLetterDecision, limits: &Limits) -> Result<Statement> {
    validate::identifier("id", id)?;
    decision.validate()?;
    if let DeadLetterAction::Complete { output } = &decision.action {
        validate::payload("decision.output", output, limits.payload_bytes_max)?;
    }
    let mut b = Binds::new(d);
    let id = b.bind(Param::Text(id.to_string()));
    let v = b.bind(jsonb(d, "decision", serde_json::to_value(decision))?);
    check_size("decision", b.params(), limits)?;
    let sql =
        format!("UPDATE {t} SET status = 'decided', decision = {v} WHERE id = {id} AND status = 'open' RETURNING id");
    Ok(b.statement(sql))
}

/// `close`: `decided → closed`, `RETURNING id` when this call closed it.
pub fn close(d: Dialect, t: &str, id: &str, now: Instant) -> Result<Statement> {
    validate::identifier("id", id)?;
    let mut b = Binds::new(d);
    let id = b.bind(Param::Text(id.to_string()));
    let now = b.bind(Param::Int8(now.as_millis()));
    let sql = format!(
        "UPDATE {t} SET status = 'closed', closed_at = {now} WHERE id = {id} AND status = 'decided' RETURNING id"
    );
    Ok(b.statement(sql))
}

/// `purge_closed`: at most `limit` records closed before `before`, counted
/// ([`affected`](crate::affected)); served by `dead_letters_closed_at`.
///
/// PostgreSQL selects the candidates once (a materialized CTE: an `IN (… LIMIT n)`
/// subquery may be re-run per row and delete more than `n`) and skips rows another purge
/// holds; SQLite runs the uncorrelated subquery once and one writer at a time. The delete
/// itself is conditional on the status again.
pub fn purge_closed(d: Dialect, t: &str, before: Instant, limit: usize) -> Result<Statement> {
    validate_dead_letter_purge(limit)?;
    let mut b = Binds::new(d);
    let before = b.bind(Param::Int8(before.as_millis()));
    let limit = b.bind(Param::Int8(limit as i64));
    let sql = match d {
        Dialect::Postgres => format!(
            "WITH c AS MATERIALIZED (SELECT id FROM {t} WHERE status = 'closed' AND closed_at < {before} \
             ORDER BY closed_at LIMIT {limit} FOR UPDATE SKIP LOCKED), \
             d AS (DELETE FROM {t} t USING c WHERE t.id = c.id AND t.status = 'closed' RETURNING 1) \
             SELECT count(*) AS n FROM d"
        ),
        Dialect::Sqlite => format!(
            "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE status = 'closed' \
             AND closed_at < {before} ORDER BY closed_at LIMIT {limit}) AND status = 'closed' RETURNING 1"
        ),
    };
    Ok(b.statement(sql))
}
