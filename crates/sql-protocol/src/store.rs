//! The workflow store: every statement of [`WorkflowStore`](kernel_core::ports::WorkflowStore)
//! on the `workflow_instances` table, for both dialects; `prefix` is the qualification
//! of the store's tables (`"<schema>".` in PostgreSQL, empty in SQLite). Every guarded
//! write is **one** autocommit statement:
//!
//! ```text
//! UPDATE <prefix>workflow_instances
//!    SET <transition>                         -- revision = revision + 1 when bumped
//!  WHERE workflow_id = $1 AND <guard> [AND <steps exist>]
//! RETURNING revision
//! ```
//!
//! Rows are decoded by [`row::instance`](crate::row::instance),
//! [`row::due_wait`](crate::row::due_wait) and [`row::candidate`](crate::row::candidate).

use crate::{
    check_size, guard_sql, set_sql, steps_exist_sql, text_of, Binds, Dialect, Limits, Param, Statement, CLAIMABLE_SQL,
    INSTANCE_COLUMNS,
};
use kernel_core::domain::*;
use kernel_core::ports::DueCursor;
use kernel_core::transition::{Guard, Transition};
use kernel_core::{validate, Error, Result};
use std::fmt::Write as _;

/// Name of the instance table.
pub const INSTANCES: &str = "workflow_instances";

/// The one statement of `apply`: `UPDATE … SET <transition> WHERE workflow_id = $1 AND
/// <guard> [AND <steps exist>] RETURNING revision`. Also returns the highest patched step
/// index, if any.
pub fn apply(
    d: Dialect,
    prefix: &str,
    workflow_id: &str,
    guard: &Guard,
    t: &Transition,
    limits: &Limits,
) -> Result<(Statement, Option<u32>)> {
    validate::identifier("workflow_id", workflow_id)?;
    let mut b = Binds::new(d);
    let id = b.bind(text_of(d, "workflow_id", workflow_id)?);
    let cond = guard_sql(&mut b, guard)?;
    let sets = set_sql(&mut b, t, limits)?;
    let step_max = t.steps.iter().map(|p| p.index).max();
    let mut sql = format!("UPDATE {prefix}{INSTANCES} SET {sets} WHERE workflow_id = {id} AND {cond}");
    if let Some(i) = step_max {
        let _ = write!(sql, " AND {}", steps_exist_sql(&mut b, i));
    }
    sql.push_str(" RETURNING revision");
    check_size("transition", b.params(), limits)?;
    Ok((b.statement(sql), step_max))
}

/// The one statement of a claim of `workflow_id`, or of any due instance when `None`
/// (`claim_any`: the longest-due instance, picked and written in one statement). Returns
/// every column of the claimed row.
///
/// The candidate of `claim_any`: per claimed type, its longest-due claimable instance
/// (one seek into `workflow_instances_claim_by_type` each); of those, the longest due. The
/// guard is re-checked on the row by the `UPDATE` itself. PostgreSQL takes it from the
/// function `claim_candidate(now, types)` (migration 4), which skips rows another claimer
/// has locked (`SKIP LOCKED`: concurrent claimers go to different instances instead of
/// queueing); SQLite runs one writer at a time, so nobody can take it in between.
pub fn claim(
    d: Dialect,
    prefix: &str,
    workflow_id: Option<&str>,
    guard: &Guard,
    transition: &Transition,
    limits: &Limits,
) -> Result<Statement> {
    let mut b = Binds::new(d);
    let t = format!("{prefix}{INSTANCES}");
    let sql = match workflow_id {
        Some(id) => {
            validate::identifier("workflow_id", id)?;
            let id = b.bind(text_of(d, "workflow_id", id)?);
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
            let candidate = match d {
                Dialect::Postgres => format!("SELECT {prefix}claim_candidate({now}, {types})"),
                Dialect::Sqlite => format!(
                    "SELECT c.workflow_id FROM {t} AS c WHERE c.workflow_id IN \
                     (SELECT (SELECT w.workflow_id FROM {t} AS w WHERE w.status IN ('running', 'failing') \
                     AND w.claimable_time <= {now} AND w.workflow_type = ty.value \
                     ORDER BY w.claimable_time, w.workflow_id LIMIT 1) FROM json_each({types}) AS ty) \
                     ORDER BY c.claimable_time, c.workflow_id LIMIT 1"
                ),
            };
            format!("UPDATE {t} SET {sets} WHERE workflow_id = ({candidate}) AND {cond} RETURNING {INSTANCE_COLUMNS}")
        }
    };
    Ok(b.statement(sql))
}

/// The insert of a new instance ([`insert_instance`](crate::insert_instance)).
pub fn insert(d: Dialect, prefix: &str, w: &WorkflowInstance, limits: &Limits) -> Result<Statement> {
    crate::insert_instance(d, &format!("{prefix}{INSTANCES}"), w, limits)
}

/// Every column of the instance whose `column` (`workflow_id` or `biz_key`) is `value`.
pub fn find(d: Dialect, prefix: &str, column: &str, value: &str) -> Statement {
    let mut b = Binds::new(d);
    let v = b.bind(Param::Text(value.to_string()));
    b.statement(format!("SELECT {INSTANCE_COLUMNS} FROM {prefix}{INSTANCES} WHERE {column} = {v}"))
}

/// Up to `limit` instances by `workflow_id` (inspection tools and tests).
pub fn list(d: Dialect, prefix: &str, limit: i64) -> Statement {
    let mut b = Binds::new(d);
    let limit = b.bind(Param::Int8(limit));
    b.statement(format!("SELECT {INSTANCE_COLUMNS} FROM {prefix}{INSTANCES} ORDER BY workflow_id LIMIT {limit}"))
}

/// The due-wait scan: waiting instances due at `now`, strictly after the cursor in
/// `(claimable_time, workflow_id)` order (served by `workflow_instances_due_wait`).
pub fn due_waits(d: Dialect, prefix: &str, now: Instant, after: Option<&DueCursor>, limit: i64) -> Statement {
    let mut b = Binds::new(d);
    let now = b.bind(Param::Int8(now.as_millis()));
    let mut sql = format!(
        "SELECT workflow_id, claimable_time, wait, business_priority FROM {prefix}{INSTANCES} \
         WHERE status = 'waiting' AND claimable_time <= {now} AND wait IS NOT NULL"
    );
    if let Some(a) = after {
        let time = b.bind(Param::Int8(a.claimable_time.as_millis()));
        let id = b.bind(Param::Text(a.workflow_id.to_string()));
        let _ = write!(sql, " AND (claimable_time, workflow_id) > ({time}, {id})");
    }
    let _ = write!(sql, " ORDER BY claimable_time, workflow_id LIMIT {}", b.bind(Param::Int8(limit)));
    b.statement(sql)
}

/// The rebuild scan: claimable instances with a `claimable_time`, strictly after `after` by
/// `workflow_id` (served by `workflow_instances_rebuild`).
pub fn claimable(d: Dialect, prefix: &str, after: Option<&str>, limit: i64) -> Statement {
    let mut b = Binds::new(d);
    let mut sql = format!(
        "SELECT workflow_id, business_priority, claimable_time FROM {prefix}{INSTANCES} \
         WHERE {CLAIMABLE_SQL} AND claimable_time IS NOT NULL"
    );
    if let Some(a) = after {
        let _ = write!(sql, " AND workflow_id > {}", b.bind(Param::Text(a.to_string())));
    }
    let _ = write!(sql, " ORDER BY workflow_id LIMIT {}", b.bind(Param::Int8(limit)));
    b.statement(sql)
}
