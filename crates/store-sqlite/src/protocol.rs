//! The statements of the store, built around [`sql_protocol`]'s SQLite dialect: every
//! guarded write is **one** autocommit statement,
//!
//! ```text
//! UPDATE workflow_instances
//!    SET <transition>                         -- revision = revision + 1 when bumped
//!  WHERE workflow_id = ?1 AND <guard> [AND json_array_length(steps) > <max step index>]
//! RETURNING revision
//! ```
//!
//! Pure functions, pinned by `tests/it/snapshots/protocol.txt`. Every caller-supplied
//! value is a bound parameter, never text spliced into the statement. Statuses are SQL
//! literals, so the planner matches the partial indexes whose predicates name them.

use kernel_core::domain::*;
use kernel_core::ports::DueCursor;
use kernel_core::transition::{Guard, Transition};
use kernel_core::{validate, Error, Result};
use rusqlite::types::Value as SqlValue;
use sql_protocol::{check_size, guard_sql, set_sql, steps_exist_sql, text_of};
pub use sql_protocol::{Binds, Dialect, Limits, Param, Statement, ACTIVE_SQL, CLAIMABLE_SQL};

const D: Dialect = Dialect::Sqlite;

pub use sql_protocol::INSTANCE_COLUMNS;

/// The value as SQLite binds it: JSON and text arrays as JSON text.
pub fn sql_value(p: &Param) -> SqlValue {
    match p {
        Param::Text(s) => SqlValue::Text(s.clone()),
        Param::Int8(v) => SqlValue::Integer(*v),
        Param::Int4(v) => SqlValue::Integer(i64::from(*v)),
        Param::Jsonb(v) => SqlValue::Text(v.to_string()),
        Param::TextArray(v) => SqlValue::Text(serde_json::Value::from(v.clone()).to_string()),
        Param::Bool(b) => SqlValue::Integer(i64::from(*b)),
        Param::NullInt8 | Param::NullText => SqlValue::Null,
    }
}

/// The values of a statement as SQLite binds them.
pub fn values(s: &Statement) -> Vec<SqlValue> {
    s.params.iter().map(sql_value).collect()
}

/// The one statement of [`WorkflowStore::apply`](kernel_core::ports::WorkflowStore::apply):
/// `UPDATE … SET <transition> WHERE workflow_id = ?1 AND <guard> [AND <steps exist>]
/// RETURNING revision`. Also returns the highest patched step index, if any.
pub fn apply_statement(
    workflow_id: &str,
    guard: &Guard,
    t: &Transition,
    limits: &Limits,
) -> Result<(Statement, Option<u32>)> {
    validate::identifier("workflow_id", workflow_id)?;
    let mut b = Binds::new(D);
    let id = b.bind(text_of(D, "workflow_id", workflow_id)?);
    let cond = guard_sql(&mut b, guard)?;
    let sets = set_sql(&mut b, t, limits)?;
    let step_max = t.steps.iter().map(|p| p.index).max();
    let mut sql = format!("UPDATE {} SET {sets} WHERE workflow_id = {id} AND {cond}", crate::INSTANCES);
    if let Some(i) = step_max {
        sql.push_str(" AND ");
        sql.push_str(&steps_exist_sql(&mut b, i));
    }
    sql.push_str(" RETURNING revision");
    check_size("transition", b.params(), limits)?;
    Ok((b.statement(sql), step_max))
}

/// The one statement of a claim of `workflow_id`, or of any due instance when `None`
/// (`claim_any`: the longest-due claimable instance of the claimed types, picked and
/// written in one statement; SQLite runs one write at a time, so no other claimer can take
/// it in between, and no `SKIP LOCKED` is needed). Returns every column of the claimed row.
pub fn claim_statement(
    workflow_id: Option<&str>,
    guard: &Guard,
    transition: &Transition,
    limits: &Limits,
) -> Result<Statement> {
    let mut b = Binds::new(D);
    let t = crate::INSTANCES;
    let sql = match workflow_id {
        Some(id) => {
            validate::identifier("workflow_id", id)?;
            let id = b.bind(text_of(D, "workflow_id", id)?);
            let cond = guard_sql(&mut b, guard)?;
            let sets = set_sql(&mut b, transition, limits)?;
            format!("UPDATE {t} SET {sets} WHERE workflow_id = {id} AND {cond} RETURNING {INSTANCE_COLUMNS}")
        }
        None => {
            let Guard::Claimable { now, types } = guard else {
                return Err(Error::invalid("guard", "claim_any takes the Claimable guard"));
            };
            let cond = guard_sql(&mut b, guard)?;
            let sets = set_sql(&mut b, transition, limits)?;
            let now = b.bind(Param::Int8(now.as_millis()));
            let types = b.bind(Param::TextArray(types.clone()));
            // The candidate: per claimed type, its longest-due claimable instance (one seek
            // into `workflow_instances_claim_by_type` each); of those, the longest due. The
            // guard is re-checked on the row by the UPDATE itself.
            format!(
                "UPDATE {t} SET {sets} WHERE workflow_id = (SELECT c.workflow_id FROM {t} AS c WHERE c.workflow_id IN \
                 (SELECT (SELECT w.workflow_id FROM {t} AS w WHERE w.status IN ('running', 'failing') \
                 AND w.claimable_time <= {now} AND w.workflow_type = ty.value \
                 ORDER BY w.claimable_time, w.workflow_id LIMIT 1) FROM json_each({types}) AS ty) \
                 ORDER BY c.claimable_time, c.workflow_id LIMIT 1) AND {cond} RETURNING {INSTANCE_COLUMNS}"
            )
        }
    };
    Ok(b.statement(sql))
}

/// The insert of a new instance: [`sql_protocol::insert_instance`] into `workflow_instances`.
pub fn insert_statement(w: &WorkflowInstance, limits: &Limits) -> Result<Statement> {
    sql_protocol::insert_instance(D, crate::INSTANCES, w, limits)
}

/// The due-wait scan: waiting instances due at `now`, strictly after the cursor in
/// `(claimable_time, workflow_id)` order (served by `workflow_instances_due_wait`).
pub fn due_waits_statement(now: Instant, after: Option<&DueCursor>, limit: i64) -> Statement {
    let mut params = vec![Param::Int8(now.as_millis())];
    let mut sql = format!(
        "SELECT workflow_id, claimable_time, wait, business_priority FROM {} \
         WHERE status = 'waiting' AND claimable_time <= ?1 AND wait IS NOT NULL",
        crate::INSTANCES
    );
    if let Some(a) = after {
        params.push(Param::Int8(a.claimable_time.as_millis()));
        params.push(Param::Text(a.workflow_id.to_string()));
        sql.push_str(" AND (claimable_time, workflow_id) > (?2, ?3)");
    }
    params.push(Param::Int8(limit));
    sql.push_str(&format!(" ORDER BY claimable_time, workflow_id LIMIT ?{}", params.len()));
    Statement { sql, params }
}

/// The rebuild scan: claimable instances with a `claimable_time`, strictly after `after` by
/// `workflow_id` (served by `workflow_instances_rebuild`).
pub fn claimable_statement(after: Option<&str>, limit: i64) -> Statement {
    let mut params = Vec::new();
    let mut sql = format!(
        "SELECT workflow_id, business_priority, claimable_time FROM {} \
         WHERE {CLAIMABLE_SQL} AND claimable_time IS NOT NULL",
        crate::INSTANCES
    );
    if let Some(a) = after {
        params.push(Param::Text(a.to_string()));
        sql.push_str(" AND workflow_id > ?1");
    }
    params.push(Param::Int8(limit));
    sql.push_str(&format!(" ORDER BY workflow_id LIMIT ?{}", params.len()));
    Statement { sql, params }
}
