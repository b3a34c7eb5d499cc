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
use kernel_core::Result;
use rusqlite::types::Value as SqlValue;
pub use sql_protocol::{Binds, Dialect, Limits, Param, Statement, ACTIVE_SQL, CLAIMABLE_SQL};

use crate::D;

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
/// RETURNING revision` ([`sql_protocol::store::apply`]). Also returns the highest patched
/// step index, if any.
pub fn apply_statement(
    workflow_id: &str,
    guard: &Guard,
    t: &Transition,
    limits: &Limits,
) -> Result<(Statement, Option<u32>)> {
    sql_protocol::store::apply(D, "", workflow_id, guard, t, limits)
}

/// The one statement of a claim of `workflow_id`, or of any due instance when `None`
/// ([`sql_protocol::store::claim`]: `claim_any` picks the longest-due claimable instance of
/// the claimed types and writes it in one statement; SQLite runs one write at a time, so
/// no other claimer can take it in between, and no `SKIP LOCKED` is needed). Returns every
/// column of the claimed row.
pub fn claim_statement(
    workflow_id: Option<&str>,
    guard: &Guard,
    transition: &Transition,
    limits: &Limits,
) -> Result<Statement> {
    sql_protocol::store::claim(D, "", workflow_id, guard, transition, limits)
}

/// The insert of a new instance: [`sql_protocol::insert_instance`] into `workflow_instances`.
pub fn insert_statement(w: &WorkflowInstance, limits: &Limits) -> Result<Statement> {
    sql_protocol::store::insert(D, "", w, limits)
}

/// The due-wait scan ([`sql_protocol::store::due_waits`]).
pub fn due_waits_statement(now: Instant, after: Option<&DueCursor>, limit: i64) -> Statement {
    sql_protocol::store::due_waits(D, "", now, after, limit)
}

/// The rebuild scan ([`sql_protocol::store::claimable`]).
pub fn claimable_statement(after: Option<&str>, limit: i64) -> Statement {
    sql_protocol::store::claimable(D, "", after, limit)
}
