//! Human tasks (K-17.5): every statement of [`TaskInbox`](kernel_core::ports::TaskInbox)
//! on the `task_inbox` table, for both dialects; decoded by [`row::task`](crate::row::task).
//! `list_open` filters in SQL (`status = 'open' AND (assignee = actor OR a role of the
//! task among the actor's) AND id > after ORDER BY id LIMIT n`, through the index on
//! `(status, id)`). `open` an `INSERT … ON CONFLICT (id) DO NOTHING`, `decide` an `UPDATE …
//! WHERE id = $1 AND status = 'open' AND token = $2 AND due_at > $decided_at`, `close` an
//! `UPDATE … WHERE id = $1 AND status <> 'closed' RETURNING decision` (the close never
//! changes the decision, so the returned one is the one the record carried when it was
//! closed), each purge one bounded statement through its partial index, counted
//! ([`affected`](crate::affected)).

use crate::{check_size, jsonb, task_params, Binds, Dialect, Limits, Param, Statement, TASK_COLUMNS};
use kernel_core::domain::Instant;
use kernel_core::ports::{
    validate_task_decide, validate_task_list, validate_task_purge, Actor, TaskDecision, TaskRecord,
};
use kernel_core::{validate, Result};

/// `open`: `RETURNING id` when opened (no row: the id exists, which the store reads).
pub fn open(d: Dialect, t: &str, task: &TaskRecord, limits: &Limits) -> Result<Statement> {
    let params = task_params(d, task)?;
    check_size("task", &params, limits)?;
    let mut b = Binds::new(d);
    let vals: Vec<String> = params.into_iter().map(|p| b.bind(p)).collect();
    let sql = format!(
        "INSERT INTO {t} ({TASK_COLUMNS}) VALUES ({}, 'open', NULL, NULL) ON CONFLICT (id) DO NOTHING RETURNING id",
        vals.join(", ")
    );
    Ok(b.statement(sql))
}

/// `get`: one record by id.
pub fn get(d: Dialect, t: &str, id: &str) -> Result<Statement> {
    validate::identifier("id", id)?;
    let mut b = Binds::new(d);
    let id = b.bind(Param::Text(id.to_string()));
    Ok(b.statement(format!("SELECT {TASK_COLUMNS} FROM {t} WHERE id = {id}")))
}

/// `list_open`: the open tasks `actor` may decide, by id (served by
/// `task_inbox_status_id`: the open range in id order, filtered by eligibility, stopped at
/// the limit).
pub fn list_open(d: Dialect, t: &str, actor: &Actor, after: Option<&str>, limit: usize) -> Result<Statement> {
    validate_task_list(actor, after, limit)?;
    let mut b = Binds::new(d);
    let limit = b.bind(Param::Int8(limit as i64));
    let who = b.bind(Param::Text(actor.id.clone()));
    let roles = b.bind(Param::TextArray(actor.roles.clone()));
    let mut cond = String::new();
    if let Some(a) = after {
        cond = format!(" AND id > {}", b.bind(Param::Text(a.to_string())));
    }
    let shares_role = match d {
        Dialect::Postgres => format!("roles && {roles}"),
        Dialect::Sqlite => {
            format!(
                "EXISTS (SELECT 1 FROM json_each({t}.roles) r WHERE r.value IN (SELECT value FROM json_each({roles})))"
            )
        }
    };
    Ok(b.statement(format!(
        "SELECT {TASK_COLUMNS} FROM {t} WHERE status = 'open' AND (assignee = {who} OR {shares_role}){cond} \
         ORDER BY id LIMIT {limit}"
    )))
}

/// `decide`: `open → decided` with the task's token before its due time, `RETURNING id`
/// when this call decided it (the store applies `task_decision_refused` around it).
pub fn decide(
    d: Dialect,
    t: &str,
    id: &str,
    token: &str,
    actor: &Actor,
    decision: &TaskDecision,
    limits: &Limits,
) -> Result<Statement> {
    validate_task_decide(id, token, actor, decision)?;
    let mut b = Binds::new(d);
    let id = b.bind(Param::Text(id.to_string()));
    let token = b.bind(Param::Text(token.to_string()));
    let v = b.bind(jsonb(d, "decision", serde_json::to_value(decision))?);
    let at = b.bind(Param::Int8(decision.decided_at.as_millis()));
    check_size("decision", b.params(), limits)?;
    Ok(b.statement(format!(
        "UPDATE {t} SET status = 'decided', decision = {v} WHERE id = {id} AND status = 'open' \
         AND token = {token} AND due_at > {at} RETURNING id"
    )))
}

/// `close`: `RETURNING decision` when this call closed it.
pub fn close(d: Dialect, t: &str, id: &str, now: Instant) -> Result<Statement> {
    validate::identifier("id", id)?;
    let mut b = Binds::new(d);
    let id = b.bind(Param::Text(id.to_string()));
    let now = b.bind(Param::Int8(now.as_millis()));
    Ok(b.statement(format!(
        "UPDATE {t} SET status = 'closed', closed_at = {now} WHERE id = {id} AND status <> 'closed' RETURNING decision"
    )))
}

/// A bounded write of the candidates `select` picks (`before` and `limit` bound first).
/// PostgreSQL selects them once (a materialized CTE: an `IN (… LIMIT n)` subquery may be
/// re-run per row and change more than `n`) and skips rows another purge holds; SQLite
/// runs the uncorrelated subquery once. The write itself checks its condition again.
struct Purge<'a> {
    cond: &'a str,
    order: &'a str,
    pg_write: String,
    sqlite_write: String,
    recheck: &'a str,
}

fn purge(d: Dialect, t: &str, p: Purge<'_>, before: Instant, limit: usize) -> Statement {
    let Purge { cond, order, pg_write, sqlite_write, recheck } = p;
    let mut b = Binds::new(d);
    let before = b.bind(Param::Int8(before.as_millis()));
    let limit = b.bind(Param::Int8(limit as i64));
    let select = format!("SELECT id FROM {t} WHERE {cond} < {before} ORDER BY {order} LIMIT {limit}");
    let sql = match d {
        Dialect::Postgres => format!(
            "WITH c AS MATERIALIZED ({select} FOR UPDATE SKIP LOCKED), w AS ({pg_write} RETURNING 1) \
             SELECT count(*) AS n FROM w"
        ),
        Dialect::Sqlite => format!("{sqlite_write} WHERE id IN ({select}) AND {recheck} RETURNING 1"),
    };
    b.statement(sql)
}

/// `purge_sensitive_reasons`: removes the text of sensitive reasons decided before
/// `before` (served by `task_inbox_sensitive`; `sensitive_text` turns false with the text).
pub fn purge_sensitive_reasons(d: Dialect, t: &str, before: Instant, limit: usize) -> Result<Statement> {
    validate_task_purge(limit)?;
    let p = Purge {
        cond: "sensitive_text AND decided_at",
        order: "decided_at",
        pg_write: format!(
            "UPDATE {t} t SET decision = t.decision #- '{{reason,text}}' FROM c WHERE t.id = c.id AND t.sensitive_text"
        ),
        sqlite_write: format!("UPDATE {t} SET decision = json_remove(decision, '$.reason.text')"),
        recheck: "sensitive_text",
    };
    Ok(purge(d, t, p, before, limit))
}

/// `purge_closed`: deletes the records closed before `before` (served by
/// `task_inbox_closed_at`).
pub fn purge_closed(d: Dialect, t: &str, before: Instant, limit: usize) -> Result<Statement> {
    validate_task_purge(limit)?;
    let p = Purge {
        cond: "status = 'closed' AND closed_at",
        order: "closed_at",
        pg_write: format!("DELETE FROM {t} t USING c WHERE t.id = c.id AND t.status = 'closed'"),
        sqlite_write: format!("DELETE FROM {t}"),
        recheck: "status = 'closed'",
    };
    Ok(purge(d, t, p, before, limit))
}
