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
//! [`Error::InvalidInput`] after a re-read.
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
use kernel_core::{validate, Error, Result};
use serde_json::Value;
use sql_protocol::{check_size, guard_sql, set_sql, steps_exist_sql, Binds, Dialect};
use std::fmt::Write as _;
use tokio_postgres::types::ToSql;

pub use sql_protocol::{Limits, Param};

/// The dialect every statement of this crate is rendered in.
const PG: Dialect = Dialect::Postgres;

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

pub(crate) use sql_protocol::CLAIMABLE_SQL;

/// PostgreSQL refuses NUL in `text` and in any string of a `jsonb` value (`\u0000`); a
/// value holding one is refused here, before anything is sent, naming `field`
/// ([`sql_protocol::storable`] in the PostgreSQL dialect).
pub fn storable_in_postgres(field: &str, value: &Value) -> Result<()> {
    sql_protocol::storable(PG, field, value)
}

/// The one statement of [`WorkflowStore::apply`](kernel_core::ports::WorkflowStore::apply):
/// `UPDATE … SET <transition> WHERE workflow_id = $1 AND <guard> [AND <steps exist>]
/// RETURNING revision`. Also returns the highest patched step index, if any.
pub fn apply_statement(
    schema: &str,
    workflow_id: &str,
    guard: &Guard,
    t: &Transition,
    limits: &Limits,
) -> Result<(Statement, Option<u32>)> {
    validate::identifier("workflow_id", workflow_id)?;
    let mut b = Binds::new(PG);
    let id = b.bind(Param::Text(workflow_id.to_string()));
    let cond = guard_sql(&mut b, guard)?;
    let sets = set_sql(&mut b, t, limits)?;
    let step_max = t.steps.iter().map(|p| p.index).max();
    let mut sql = format!("UPDATE {} SET {sets} WHERE workflow_id = {id} AND {cond}", table(schema, crate::INSTANCES));
    if let Some(i) = step_max {
        let _ = write!(sql, " AND {}", steps_exist_sql(&mut b, i));
    }
    sql.push_str(" RETURNING revision");
    check_size("transition", b.params(), limits)?;
    Ok((b.statement(sql).into(), step_max))
}

/// The one statement of a claim of `workflow_id`, or of any due instance when `None`
/// (`claim_any`: the longest-due instance a concurrent claimer has not locked, picked and
/// written in one statement). Returns every column of the claimed row.
pub fn claim_statement(
    schema: &str,
    workflow_id: Option<&str>,
    spec: &ClaimSpecParts<'_>,
    limits: &Limits,
) -> Result<Statement> {
    let mut b = Binds::new(PG);
    let t = table(schema, crate::INSTANCES);
    let sql = match workflow_id {
        Some(id) => {
            validate::identifier("workflow_id", id)?;
            let id = b.bind(Param::Text(id.to_string()));
            let cond = guard_sql(&mut b, spec.guard)?;
            let sets = set_sql(&mut b, spec.transition, limits)?;
            format!("UPDATE {t} SET {sets} WHERE workflow_id = {id} AND {cond} RETURNING {INSTANCE_COLUMNS}")
        }
        None => {
            // Only the candidate's pre-filter reads the guard here; the whole guard is
            // rendered by `guard_sql` and re-checked on the candidate row.
            let Guard::Claimable { now, types, .. } = spec.guard else {
                return Err(Error::invalid("guard", "claim_any takes the Claimable guard"));
            };
            let cond = guard_sql(&mut b, spec.guard)?;
            let sets = set_sql(&mut b, spec.transition, limits)?;
            let now = b.bind(Param::Int8(now.as_millis()));
            let types = b.bind(Param::TextArray(types.clone()));
            // `claim_candidate` (migration 4): per claimed type, its longest-due instance not
            // locked by another claimer (`workflow_instances_claim_by_type`, one index range
            // per type), locked; of those, the longest due. The guard is re-checked on the
            // locked row by the UPDATE; SKIP LOCKED sends concurrent claimers to different
            // instances instead of queueing them.
            format!(
                "UPDATE {t} SET {sets} WHERE workflow_id = (SELECT \"{schema}\".claim_candidate({now}, {types})) \
                 AND {cond} RETURNING {INSTANCE_COLUMNS}"
            )
        }
    };
    Ok(b.statement(sql).into())
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
    sql_protocol::insert_instance(PG, &table(schema, crate::INSTANCES), w, limits).map(Statement::from)
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
