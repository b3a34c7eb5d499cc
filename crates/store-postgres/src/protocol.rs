//! The SQL of the store: [`Guard`] → `WHERE` condition, [`Transition`] → `SET` list.
//!
//! Pure functions, pinned by snapshot tests so that a silent protocol change fails a test.
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
//! [`Limits::document_bytes_max`]. Guards, transitions and patches are destructured field
//! by field, so a field added to them is a compile error here, never a dropped write.

use kernel_core::model::*;
use kernel_core::transition::{AttemptChange, Guard, Patch, StepPatch, Transition};
use kernel_core::{validate, Error, Result};
use serde_json::Value;
use std::fmt::Write as _;
use tokio_postgres::types::ToSql;

/// Size limits checked before a statement reaches the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest input, output or checkpoint, as serialized JSON bytes; default
    /// [`validate::STORE_PAYLOAD_BYTES_MAX`], the limit of the other adapters.
    pub payload_bytes_max: usize,
    /// Largest sum of the values one statement binds (an inserted instance, one
    /// transition), in bytes; default 4 MiB, the MongoDB adapter's update limit.
    pub document_bytes_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { payload_bytes_max: validate::STORE_PAYLOAD_BYTES_MAX, document_bytes_max: 4 * 1024 * 1024 }
    }
}

/// A bound value of a statement. Every placeholder is written with an explicit cast
/// (`$3::bigint`), so the parameter types the server infers are exactly these.
#[derive(Debug, Clone, PartialEq)]
pub enum Param {
    /// `text`
    Text(String),
    /// `bigint`
    Int8(i64),
    /// `int4`
    Int4(i32),
    /// `jsonb`
    Jsonb(Value),
    /// `text[]`
    TextArray(Vec<String>),
    /// `bool`
    Bool(bool),
    /// A `bigint` NULL.
    NullInt8,
    /// A `text` NULL.
    NullText,
}

impl Param {
    /// The value as the driver binds it.
    pub fn as_sql(&self) -> &(dyn ToSql + Sync) {
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

    fn cast(&self) -> &'static str {
        match self {
            Param::Text(_) => "text",
            Param::Int8(_) => "bigint",
            Param::Int4(_) => "int4",
            Param::Jsonb(_) => "jsonb",
            Param::TextArray(_) => "text[]",
            Param::Bool(_) => "bool",
            Param::NullInt8 => "bigint",
            Param::NullText => "text",
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Param::Text(s) => s.len(),
            Param::Int8(_) => 8,
            Param::Int4(_) => 4,
            Param::Jsonb(v) => serde_json::to_vec(v).map_or(0, |b| b.len()),
            Param::TextArray(v) => v.iter().map(String::len).sum(),
            Param::Bool(_) => 1,
            Param::NullInt8 | Param::NullText => 0,
        }
    }
}

/// A statement and its bound values.
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
        self.params.iter().map(Param::as_sql).collect()
    }
}

/// Collects bound values; `bind` returns the typed placeholder.
#[derive(Debug, Default)]
struct Binds {
    params: Vec<Param>,
}

impl Binds {
    fn bind(&mut self, p: Param) -> String {
        let cast = p.cast();
        self.params.push(p);
        format!("${}::{cast}", self.params.len())
    }
}

/// `"<schema>".<table>`; the schema name is checked by [`crate::schema_name`] before.
pub fn table(schema: &str, table: &str) -> String {
    format!("\"{schema}\".{table}")
}

/// Instance columns in the order every `SELECT`/`RETURNING` reads them.
pub const INSTANCE_COLUMNS: &str = "workflow_id, workflow_type, biz_key, status, steps, input, output, \
claimable_time, claim_token, wait, resume, definition_fingerprint, fingerprint_mismatch, business_priority, \
retry_count, prepare_failures, revision, created_at, updated_at, finished_at";

pub(crate) const CLAIMABLE_SQL: &str = "status IN ('running', 'failing')";
pub(crate) const ACTIVE_SQL: &str = "status IN ('running', 'waiting', 'failing')";

fn i64_of(field: &str, v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::invalid(field, format_args!("{v} exceeds the 64-bit signed range")))
}

fn status_lit(s: WorkflowStatus) -> String {
    format!("'{}'", s.as_str())
}

/// The condition of `guard` (without `workflow_id`), its values bound into `b`. Validates
/// every identifier it embeds ([`Guard::validate`]).
fn guard_sql(b: &mut Binds, guard: &Guard) -> Result<String> {
    guard.validate()?;
    Ok(match guard {
        Guard::Claimable { now, types } => format!(
            "{CLAIMABLE_SQL} AND claimable_time <= {} AND workflow_type = ANY({})",
            b.bind(Param::Int8(now.as_millis())),
            b.bind(Param::TextArray(types.clone()))
        ),
        Guard::Running { token } => format!(
            "status = {} AND claim_token = {}",
            status_lit(WorkflowStatus::Running),
            b.bind(Param::Text(token.to_string()))
        ),
        Guard::Failing { token } => format!(
            "status = {} AND claim_token = {}",
            status_lit(WorkflowStatus::Failing),
            b.bind(Param::Text(token.to_string()))
        ),
        Guard::Token { token } => format!("claim_token = {}", b.bind(Param::Text(token.to_string()))),
        Guard::Failed { unless_round } => {
            let mut s = format!("status = {}", status_lit(WorkflowStatus::Failed));
            if let Some(round) = unless_round {
                // `IS DISTINCT FROM` also holds for a missing or non-string round, as
                // `Guard::matches` does.
                let _ = write!(
                    s,
                    " AND input -> 'fencing_token' IS DISTINCT FROM to_jsonb({})",
                    b.bind(Param::Text(round.to_string()))
                );
            }
            s
        }
        Guard::DueWait { now, step_index } => format!(
            "status = {} AND claimable_time <= {} AND wait -> 'step_index' = to_jsonb({})",
            status_lit(WorkflowStatus::Waiting),
            b.bind(Param::Int8(now.as_millis())),
            b.bind(Param::Int8(i64::from(*step_index)))
        ),
        Guard::SignalWait(WaitIdentity { signal_type, wait_key, generation, step_index }) => {
            let identity = serde_json::json!({
                "kind": "signal",
                "signal_type": signal_type,
                "wait_key": wait_key,
                "generation": i64_of("generation", *generation)?,
                "step_index": step_index,
            });
            format!("status = {} AND wait @> {}", status_lit(WorkflowStatus::Waiting), b.bind(Param::Jsonb(identity)))
        }
        Guard::Active => ACTIVE_SQL.to_string(),
        Guard::PriorityBelow(p) => {
            format!("{ACTIVE_SQL} AND business_priority > {}", b.bind(Param::Int8(i64::from(u8::from(*p)))))
        }
    })
}

/// `SELECT`-free check that the statement's values fit [`Limits::document_bytes_max`].
fn check_size(field: &str, params: &[Param], limits: &Limits) -> Result<()> {
    let bytes: usize = params.iter().map(Param::bytes).sum();
    if bytes > limits.document_bytes_max {
        return Err(Error::invalid(
            field,
            format_args!("{bytes} bytes of values exceed the statement limit of {}", limits.document_bytes_max),
        ));
    }
    Ok(())
}

/// PostgreSQL refuses NUL in `text` and in any string of a `jsonb` value (`\u0000`); a
/// value holding one is refused here, before anything is sent, naming `field`. Checked
/// without recursion.
pub fn storable_in_postgres(field: &str, value: &Value) -> Result<()> {
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) if s.contains('\0') => {
                return Err(Error::invalid(field, "a string contains NUL, which PostgreSQL cannot store"));
            }
            Value::Array(items) => stack.extend(items.iter()),
            Value::Object(map) => {
                for (k, x) in map {
                    if k.contains('\0') {
                        return Err(Error::invalid(field, format_args!("object key {k:?} contains NUL")));
                    }
                    stack.push(x);
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn text_of(field: &str, s: &str) -> Result<Param> {
    if s.contains('\0') {
        return Err(Error::invalid(field, "contains NUL, which PostgreSQL cannot store"));
    }
    Ok(Param::Text(s.to_string()))
}

/// A typed value as `jsonb`, checked by [`storable_in_postgres`].
fn jsonb_of(field: &str, v: &impl serde::Serialize) -> Result<Param> {
    let v = serde_json::to_value(v).map_err(|e| Error::invalid_with(field, e.to_string(), e))?;
    storable_in_postgres(field, &v)?;
    Ok(Param::Jsonb(v))
}

/// A wait as `jsonb`; a signal wait's generation must fit the signed 64-bit range, as
/// in every other store (and as the inbox's `generation` column does).
fn wait_of(field: &str, w: &Wait) -> Result<Param> {
    if let Some(id) = w.signal_identity() {
        i64_of(&format!("{field}.generation"), id.generation)?;
    }
    jsonb_of(field, w)
}

/// The expression of one patched step: `(steps -> i) || {sets} - {unsets}`.
fn step_patch_sql(b: &mut Binds, p: &StepPatch) -> Result<String> {
    let StepPatch {
        index,
        status,
        attempt,
        error,
        checkpoint,
        elapsed_ms_inc,
        traffic_wait_ms_inc,
        traffic_waits_inc,
        started_at,
        finished_at,
    } = p;
    let i = b.bind(Param::Int4(
        i32::try_from(*index).map_err(|_| Error::invalid("transition.steps", "step index out of range"))?,
    ));
    let cur = format!("(steps -> {i})");
    let num = |key: &str| format!("COALESCE(({cur} ->> '{key}')::bigint, 0)");
    let mut sets: Vec<String> = Vec::new();
    let mut unsets: Vec<&str> = Vec::new();
    if let Some(s) = status {
        sets.push(format!("'status', {}", b.bind(Param::Text(s.as_str().to_string()))));
    }
    match attempt {
        // The reference semantics never lets the counter go below zero.
        Some(AttemptChange::Inc(d)) => {
            sets.push(format!("'attempt', GREATEST(0, {} + {})", num("attempt"), b.bind(Param::Int8(i64::from(*d)))))
        }
        Some(AttemptChange::Reset) => sets.push("'attempt', 0".to_string()),
        None => {}
    }
    let field = |f: &str| format!("steps.{index}.{f}");
    match error {
        Some(Patch::Set(e)) => sets.push(format!("'error', {}", b.bind(jsonb_of(&field("error"), e)?))),
        Some(Patch::Unset) => unsets.push("error"),
        None => {}
    }
    match checkpoint {
        Some(Patch::Set(c)) => {
            let f = field("checkpoint");
            storable_in_postgres(&f, c)?;
            sets.push(format!("'checkpoint', {}", b.bind(Param::Jsonb(c.clone()))));
        }
        Some(Patch::Unset) => unsets.push("checkpoint"),
        None => {}
    }
    for (key, inc) in [("elapsed_ms", elapsed_ms_inc.as_millis()), ("traffic_wait_ms", traffic_wait_ms_inc.as_millis())]
    {
        if inc != 0 {
            sets.push(format!("'{key}', {} + {}", num(key), b.bind(Param::Int8(inc))));
        }
    }
    if *traffic_waits_inc != 0 {
        sets.push(format!(
            "'traffic_waits', {} + {}",
            num("traffic_waits"),
            b.bind(Param::Int8(i64::from(*traffic_waits_inc)))
        ));
    }
    if let Some(t) = started_at {
        sets.push(format!("'started_at', {}", b.bind(Param::Int8(t.as_millis()))));
    }
    match finished_at {
        Some(Patch::Set(t)) => sets.push(format!("'finished_at', {}", b.bind(Param::Int8(t.as_millis())))),
        Some(Patch::Unset) => unsets.push("finished_at"),
        None => {}
    }
    let mut e = cur.clone();
    if !sets.is_empty() {
        // jsonb_build_object takes at most 100 arguments; a step has 10 fields.
        let _ = write!(e, " || jsonb_build_object({})", sets.join(", "));
    }
    if !unsets.is_empty() {
        let keys: Vec<String> = unsets.iter().map(|k| format!("'{k}'")).collect();
        e = format!("({e}) - ARRAY[{}]::text[]", keys.join(", "));
    }
    Ok(format!("ARRAY[{i}::text], {e}"))
}

/// Replay (`reset_failed_steps`): every failed step becomes `Step::pending(name)`.
const RESET_FAILED_STEPS: &str = "steps = (SELECT COALESCE(jsonb_agg(CASE WHEN e ->> 'status' = 'failed' \
THEN jsonb_build_object('name', e -> 'name', 'status', 'pending', 'attempt', 0, 'elapsed_ms', 0, \
'traffic_wait_ms', 0, 'traffic_waits', 0) ELSE e END ORDER BY n), '[]'::jsonb) \
FROM jsonb_array_elements(steps) WITH ORDINALITY AS x(e, n))";

/// The `SET` list of a transition, its values bound into `b`.
fn set_sql(b: &mut Binds, t: &Transition, limits: &Limits) -> Result<String> {
    t.validate(limits.payload_bytes_max)?;
    let Transition {
        kinds: _,
        now,
        status,
        steps,
        outputs,
        input,
        claimable_time,
        claim_token,
        wait,
        resume,
        fingerprint_mismatch,
        priority,
        reset_failed_steps,
        retry_count_inc,
        prepare_failures,
        finished_at,
        bump_revision,
    } = t;
    let mut sets: Vec<String> = Vec::new();
    if let Some(s) = status {
        sets.push(format!("status = {}", b.bind(Param::Text(s.as_str().to_string()))));
    }
    if *reset_failed_steps {
        sets.push(RESET_FAILED_STEPS.to_string());
    }
    if !steps.is_empty() {
        // Nested `jsonb_set`s, one per patched index; each reads the row's old `steps`,
        // which is right because the indices are distinct (Transition::validate).
        let mut e = "steps".to_string();
        for p in steps {
            e = format!("jsonb_set({e}, {})", step_patch_sql(b, p)?);
        }
        sets.push(format!("steps = {e}"));
    }
    if !outputs.is_empty() {
        let mut e = "output".to_string();
        for (name, v) in outputs {
            let field = format!("output.{name}");
            storable_in_postgres(&field, v)?;
            let k = b.bind(Param::Text(name.clone()));
            let v = b.bind(Param::Jsonb(v.clone()));
            let _ = write!(e, " || jsonb_build_object({k}, {v})");
        }
        sets.push(format!("output = {e}"));
    }
    if let Some(i) = input {
        storable_in_postgres("input", i)?;
        sets.push(format!("input = {}", b.bind(Param::Jsonb(i.clone()))));
    }
    let mut patch = |b: &mut Binds, col: &str, p: Option<Result<Option<Param>>>| -> Result<()> {
        match p.transpose()? {
            Some(Some(v)) => sets.push(format!("{col} = {}", b.bind(v))),
            Some(None) => sets.push(format!("{col} = NULL")),
            None => {}
        }
        Ok(())
    };
    fn of<T>(p: &Option<Patch<T>>, f: impl FnOnce(&T) -> Result<Param>) -> Option<Result<Option<Param>>> {
        p.as_ref().map(|p| match p {
            Patch::Set(v) => f(v).map(Some),
            Patch::Unset => Ok(None),
        })
    }
    patch(b, "claimable_time", of(claimable_time, |x| Ok(Param::Int8(x.as_millis()))))?;
    patch(b, "claim_token", of(claim_token, |x| text_of("claim_token", x.as_str())))?;
    patch(b, "wait", of(wait, |w| wait_of("wait", w)))?;
    patch(b, "resume", of(resume, |r| jsonb_of("resume", r)))?;
    patch(
        b,
        "fingerprint_mismatch",
        fingerprint_mismatch.as_ref().map(|m| jsonb_of("fingerprint_mismatch", m).map(Some)),
    )?;
    patch(b, "business_priority", priority.map(|p| Ok(Some(Param::Int8(i64::from(u8::from(p)))))))?;
    patch(b, "finished_at", of(finished_at, |x| Ok(Param::Int8(x.as_millis()))))?;
    patch(b, "prepare_failures", prepare_failures.map(|n| Ok(Some(Param::Int8(i64::from(n))))))?;
    patch(b, "updated_at", Some(Ok(Some(Param::Int8(now.as_millis())))))?;
    if *retry_count_inc {
        sets.push("retry_count = retry_count + 1".to_string());
    }
    if *bump_revision {
        sets.push("revision = revision + 1".to_string());
    }
    Ok(sets.join(", "))
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
    let mut b = Binds::default();
    let id = b.bind(Param::Text(workflow_id.to_string()));
    let cond = guard_sql(&mut b, guard)?;
    let sets = set_sql(&mut b, t, limits)?;
    let step_max = t.steps.iter().map(|p| p.index).max();
    let mut sql = format!("UPDATE {} SET {sets} WHERE workflow_id = {id} AND {cond}", table(schema, crate::INSTANCES));
    if let Some(i) = step_max {
        let _ = write!(sql, " AND jsonb_array_length(steps) > {}", b.bind(Param::Int8(i64::from(i))));
    }
    sql.push_str(" RETURNING revision");
    check_size("transition", &b.params, limits)?;
    Ok((Statement { sql, params: b.params }, step_max))
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
    let mut b = Binds::default();
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
            let Guard::Claimable { now, types } = spec.guard else {
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
    Ok(Statement { sql, params: b.params })
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

/// The insert of a new instance: `INSERT … ON CONFLICT DO NOTHING RETURNING workflow_id`
/// (a conflict on `biz_key` or `workflow_id` inserts nothing; the store then reads which).
/// The instance is checked by [`WorkflowInstance::validate`] first.
pub fn insert_statement(schema: &str, w: &WorkflowInstance, limits: &Limits) -> Result<Statement> {
    w.validate(limits.payload_bytes_max)?;
    let WorkflowInstance {
        workflow_id,
        workflow_type,
        biz_key,
        status,
        steps,
        input,
        output,
        claimable_time,
        claim_token,
        wait,
        resume,
        definition_fingerprint,
        fingerprint_mismatch,
        business_priority,
        retry_count,
        prepare_failures,
        revision,
        created_at,
        updated_at,
        finished_at,
    } = w;
    for (i, s) in steps.iter().enumerate() {
        if let Some(c) = &s.checkpoint {
            storable_in_postgres(&format!("steps[{i}].checkpoint"), c)?;
        }
    }
    for (name, v) in output {
        storable_in_postgres(&format!("output.{name}"), v)?;
    }
    storable_in_postgres("input", input)?;
    let mut b = Binds::default();
    let mut vals = vec![
        b.bind(Param::Text(workflow_id.to_string())),
        b.bind(Param::Text(workflow_type.clone())),
        b.bind(Param::Text(biz_key.clone())),
        b.bind(Param::Text(status.as_str().to_string())),
        b.bind(jsonb_of("steps", steps)?),
        b.bind(Param::Jsonb(input.clone())),
        b.bind(jsonb_of("output", output)?),
    ];
    let mut nullable = |b: &mut Binds, p: Option<Param>| match p {
        Some(p) => vals.push(b.bind(p)),
        None => vals.push("NULL".to_string()),
    };
    nullable(&mut b, claimable_time.map(|t| Param::Int8(t.as_millis())));
    nullable(&mut b, claim_token.as_ref().map(|t| Param::Text(t.to_string())));
    nullable(&mut b, wait.as_ref().map(|w| wait_of("wait", w)).transpose()?);
    nullable(&mut b, resume.as_ref().map(|r| jsonb_of("resume", r)).transpose()?);
    nullable(&mut b, Some(text_of("definition_fingerprint", definition_fingerprint)?));
    nullable(&mut b, fingerprint_mismatch.as_ref().map(|m| jsonb_of("fingerprint_mismatch", m)).transpose()?);
    nullable(&mut b, Some(Param::Int8(i64::from(u8::from(*business_priority)))));
    nullable(&mut b, Some(Param::Int8(i64::from(*retry_count))));
    nullable(&mut b, Some(Param::Int8(i64::from(*prepare_failures))));
    nullable(&mut b, Some(Param::Int8(i64_of("revision", *revision)?)));
    nullable(&mut b, Some(Param::Int8(created_at.as_millis())));
    nullable(&mut b, Some(Param::Int8(updated_at.as_millis())));
    nullable(&mut b, finished_at.map(|t| Param::Int8(t.as_millis())));
    let sql = format!(
        "INSERT INTO {} ({INSTANCE_COLUMNS}) VALUES ({}) ON CONFLICT DO NOTHING RETURNING workflow_id",
        table(schema, crate::INSTANCES),
        vals.join(", ")
    );
    check_size("instance", &b.params, limits)?;
    Ok(Statement { sql, params: b.params })
}

pub use crate::store::{claimable_statement, due_waits_statement};

/// The condition of `guard` alone, its values numbered from `$1` (for snapshots and
/// documentation; [`apply_statement`] embeds the same text after `workflow_id = $1`).
pub fn guard_condition(guard: &Guard) -> Result<Statement> {
    let mut b = Binds::default();
    let sql = guard_sql(&mut b, guard)?;
    Ok(Statement { sql, params: b.params })
}

/// The `SET` list of `t` alone, its values numbered from `$1` (for snapshots and
/// documentation; [`apply_statement`] embeds the same text).
pub fn transition_assignments(t: &Transition, limits: &Limits) -> Result<Statement> {
    let mut b = Binds::default();
    let sql = set_sql(&mut b, t, limits)?;
    Ok(Statement { sql, params: b.params })
}
