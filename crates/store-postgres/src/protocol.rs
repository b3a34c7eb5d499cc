//! The SQL of the store: [`Guard`] → `WHERE` condition, [`Transition`] → `SET` list.
//!
//! The guard and transition text is rendered by the `sql-protocol` crate in its PostgreSQL
//! dialect ([`sql_protocol::guard_sql`], [`sql_protocol::set_sql`]), the one rendering the
//! SQL stores share; this module composes it into this store's statements (tables in the
//! configured schema, `RETURNING` lists, the `claim_any` candidate function) and binds the
//! values with the driver ([`AsSql`], [`Statement::values`]). Pure functions, pinned by
//! snapshot tests so that a silent protocol change fails a test.
//! Every guarded write the adapter issues is **one** autocommit statement:
//!
//! ```text
//! UPDATE <schema>.workflow_instances
//!    SET <transition>                         -- revision = revision + 1 when bumped
//!  WHERE workflow_id = $1 AND <guard> [AND jsonb_array_length(steps) > <max step index>]
//! RETURNING revision
//! ```
//!
//! | guard | condition (besides `workflow_id`) |
//! |---|---|
//! | `Claimable { now, types }` | `status IN ('running', 'failing') AND claimable_time <= now AND workflow_type = ANY(types)` |
//! | `Running { token }` | `status = 'running' AND claim_token = token` |
//! | `Failing { token }` | `status = 'failing' AND claim_token = token` |
//! | `Token { token }` | `claim_token = token` |
//! | `Failed { unless_round }` | `status = 'failed'`, and with a round `AND input -> 'fencing_token' IS DISTINCT FROM to_jsonb(round)` |
//! | `DueWait { now, step_index }` | `status = 'waiting' AND claimable_time <= now AND wait -> 'step_index' = i` |
//! | `SignalWait(id)` | `status = 'waiting' AND wait @> {kind: signal, signal_type, wait_key, generation, step_index}` |
//! | `Active` | `status IN ('running', 'waiting', 'failing')` |
//! | `PriorityBelow(p)` | `status IN ('running', 'waiting', 'failing') AND business_priority > p` (a larger number is less urgent) |
//!
//! Statuses are SQL literals (fixed enum strings), so the planner matches the partial
//! indexes whose predicates name them; every caller-supplied value is a bound parameter
//! with an explicit type, never text spliced into the statement, so an id such as
//! `'; DROP TABLE …` or `{"$ne": null}` is just a string compared for equality.
//!
//! The one addition to the guard is structural: a write that patches `steps[i]` also
//! requires `jsonb_array_length(steps) > max i`, because `jsonb_set` would otherwise
//! *append* a step past the end. The store reports such a write as
//! [`Error::InvalidInput`](kernel_core::Error::InvalidInput) after a re-read.
//!
//! What is refused is decided by kernel-core first, the one K-2.0 rule every adapter
//! shares: [`Guard::validate`], [`Transition::validate`] and [`WorkflowInstance::validate`]
//! run before any translation. This module adds only what PostgreSQL itself cannot hold:
//! NUL (`\u0000`) in any string of a JSONB value (PostgreSQL refuses it), integers beyond the
//! 64-bit signed range, and statements whose bound values exceed
//! [`Limits::document_bytes_max`]. Guards, transitions and step patches are destructured
//! field by field in `sql-protocol`, so a field added to them is a compile error there,
//! never a dropped write; [`insert_statement`] does the same with [`WorkflowInstance`].

use kernel_core::domain::*;
use kernel_core::transition::{Guard, Transition};
use kernel_core::Result;
use serde_json::Value;
use tokio_postgres::types::ToSql;

pub use sql_protocol::{Limits, Param};

use crate::PG;

/// A [`Param`] as the driver binds it: `param.as_sql()` with this trait in scope.
pub trait AsSql {
    /// The value as the driver binds it.
    fn as_sql(&self) -> &(dyn ToSql + Sync);
}

impl AsSql for Param {
    fn as_sql(&self) -> &(dyn ToSql + Sync) {
        match self {
            Param::Text(v) => v,
            Param::Int8(v) => v,
            Param::Int4(v) => v,
            Param::Jsonb(v) => v,
            Param::TextArray(v) => v,
            Param::Bool(v) => v,
            Param::NullInt8 => &None::<i64>,
            Param::NullText => &None::<String>,
        }
    }
}

/// A statement and its bound values. The same fields as [`sql_protocol::Statement`], plus
/// [`values`](Self::values), the values as the driver takes them.
#[derive(Debug, Clone, PartialEq)]
pub struct Statement {
    /// The SQL text, placeholders `$1…$n`.
    pub sql: String,
    /// The values of `$1…$n`, in order.
    pub params: Vec<Param>,
}

impl Statement {
    /// The values as the driver takes them.
    pub fn values(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.params.iter().map(AsSql::as_sql).collect()
    }
}

impl From<sql_protocol::Statement> for Statement {
    fn from(s: sql_protocol::Statement) -> Self {
        Statement { sql: s.sql, params: s.params }
    }
}

/// `"<schema>".<table>`; the schema name is checked by [`crate::schema_name`] before.
pub fn table(schema: &str, table: &str) -> String {
    format!("\"{schema}\".{table}")
}

pub use sql_protocol::INSTANCE_COLUMNS;

/// PostgreSQL refuses NUL in `text` and in any string of a `jsonb` value (`\u0000`); a
/// value holding one is refused here, before anything is sent, naming `field`
/// ([`sql_protocol::storable`] in the PostgreSQL dialect).
pub fn storable_in_postgres(field: &str, value: &Value) -> Result<()> {
    sql_protocol::storable(PG, field, value)
}

/// The one statement of [`WorkflowStore::apply`](kernel_core::ports::WorkflowStore::apply):
/// `UPDATE … SET <transition> WHERE workflow_id = $1 AND <guard> [AND <steps exist>]
/// RETURNING revision` ([`sql_protocol::store::apply`]). Also returns the highest patched
/// step index, if any.
pub fn apply_statement(
    schema: &str,
    workflow_id: &str,
    guard: &Guard,
    t: &Transition,
    limits: &Limits,
) -> Result<(Statement, Option<u32>)> {
    let (stmt, step_max) = sql_protocol::store::apply(PG, &prefix(schema), workflow_id, guard, t, limits)?;
    Ok((stmt.into(), step_max))
}

/// The one statement of a claim of `workflow_id`, or of any due instance when `None`
/// ([`sql_protocol::store::claim`]: `claim_any` takes its candidate from the function
/// `claim_candidate` of migration 4, the longest-due instance a concurrent claimer has not
/// locked, and writes it in one statement). Returns every column of the claimed row.
pub fn claim_statement(
    schema: &str,
    workflow_id: Option<&str>,
    spec: &ClaimSpecParts<'_>,
    limits: &Limits,
) -> Result<Statement> {
    sql_protocol::store::claim(PG, &prefix(schema), workflow_id, spec.guard, spec.transition, limits)
        .map(Statement::from)
}

/// `"<schema>".`, the qualification of the store's tables.
pub(crate) fn prefix(schema: &str) -> String {
    format!("\"{schema}\".")
}

/// The guard and transition of a claim ([`ClaimSpec::guard`](kernel_core::ports::ClaimSpec::guard),
/// [`ClaimSpec::transition`](kernel_core::ports::ClaimSpec::transition)).
#[derive(Debug, Clone, Copy)]
pub struct ClaimSpecParts<'a> {
    /// `Guard::Claimable`.
    pub guard: &'a Guard,
    /// `Transition::claim`.
    pub transition: &'a Transition,
}

/// The insert of a new instance: [`sql_protocol::insert_instance`] into
/// `<schema>.workflow_instances`.
pub fn insert_statement(schema: &str, w: &WorkflowInstance, limits: &Limits) -> Result<Statement> {
    sql_protocol::store::insert(PG, &prefix(schema), w, limits).map(Statement::from)
}

pub use crate::store::{claimable_statement, due_waits_statement};

/// The condition of `guard` alone, its values numbered from `$1` (for snapshots and
/// documentation; [`apply_statement`] embeds the same text after `workflow_id = $1`).
pub fn guard_condition(guard: &Guard) -> Result<Statement> {
    sql_protocol::guard_condition(PG, guard).map(Statement::from)
}

/// The `SET` list of `t` alone, its values numbered from `$1` (for snapshots and
/// documentation; [`apply_statement`] embeds the same text).
pub fn transition_assignments(t: &Transition, limits: &Limits) -> Result<Statement> {
    sql_protocol::transition_assignments(PG, t, limits).map(Statement::from)
}
