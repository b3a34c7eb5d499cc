//! # sql-protocol
//!
//! The kernel's write protocol (K-6.4) as SQL, for the SQL stores: a
//! [`Guard`] becomes the condition of a `WHERE` clause, a
//! [`Transition`] the assignment list of a `SET`
//! clause, every caller-supplied value a typed bound parameter ([`Param`]), never text
//! spliced into the statement. Two [`Dialect`]s: PostgreSQL (`jsonb`, placeholders
//! `$n::type`) and SQLite (JSON text with SQLite's JSON functions, placeholders `?n`).
//!
//! Pure functions: no driver, no I/O. A store builds its statements around them —
//! `UPDATE <instances> SET <transition> WHERE workflow_id = <id> AND <guard> [AND <steps
//! exist>] RETURNING revision` — and binds [`Param`]s with its own driver. The text of
//! every guard and transition is pinned by snapshot tests (`tests/snapshots/`), the
//! PostgreSQL one identical to what store-postgres sends.
//!
//! ```
//! use kernel_core::transition::{Guard, Transition};
//! use kernel_core::domain::Instant;
//! use sql_protocol::{Binds, Dialect, Limits, Param};
//!
//! let mut b = Binds::new(Dialect::Sqlite);
//! let id = b.bind(Param::Text("wf-1".into()));
//! let cond = sql_protocol::guard_sql(&mut b, &Guard::Running { token: "tok".into() }).unwrap();
//! let now = Instant::from_millis(1_700_000_000_000);
//! let sets = sql_protocol::set_sql(&mut b, &Transition::release(now), &Limits::default()).unwrap();
//! assert_eq!(cond, "status = 'running' AND claim_token = ?2");
//! assert_eq!(sets, "claimable_time = ?3, claim_token = NULL, updated_at = ?4, revision = revision + 1");
//! let sql = format!("UPDATE workflow_instances SET {sets} WHERE workflow_id = {id} AND {cond} RETURNING revision");
//! assert_eq!(b.params().len(), 4);
//! # let _ = sql;
//! ```
//!
//! Guards, transitions and step patches are destructured field by field, without `..`, so
//! a field added to them in kernel-core is a compile error here, never a dropped write.
//!
//! What is refused is decided by kernel-core first ([`Guard::validate`],
//! [`Transition::validate`]); this crate adds only what the database cannot hold (see
//! [`storable`], [`text_of`]): NUL in a text column, NUL in a JSON string (PostgreSQL),
//! integers beyond the 64-bit signed range. Every name K-2.0 admits (an output name, a
//! business field) is data in both dialects: PostgreSQL binds it as a key, SQLite binds a
//! JSON path in which it is escaped ([`sqlite_json_path`]).

use kernel_core::domain::*;
use kernel_core::transition::{AttemptChange, Guard, Patch, StepPatch, Transition};
use kernel_core::{validate, Error, Result};
use serde_json::Value;
use std::fmt::Write as _;

pub mod cache;
pub mod dead_letter;
pub mod inbox;
pub mod observation;
pub mod outbox;
pub mod row;
pub mod store;
pub mod task_inbox;

pub use row::SqlRow;

/// Which SQL the functions render.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// PostgreSQL ≥ 13: `jsonb` columns, placeholders `$n::type` with an explicit cast.
    Postgres,
    /// SQLite ≥ 3.44 (aggregate `ORDER BY`): JSON held as text, SQLite's JSON functions (`->`, `->>`,
    /// `json_set`, `json_remove`, `json_each`), placeholders `?n`.
    Sqlite,
}

impl Dialect {
    fn name(self) -> &'static str {
        match self {
            Dialect::Postgres => "PostgreSQL",
            Dialect::Sqlite => "SQLite",
        }
    }

    /// The member `key` (a fixed name, never caller data) of the JSON column `col` as
    /// text: `col ->> 'key'` (PostgreSQL), `col ->> '$.key'` (SQLite).
    pub fn get_text(self, col: &str, key: &str) -> String {
        match self {
            Dialect::Postgres => format!("{col} ->> '{key}'"),
            Dialect::Sqlite => format!("{col} ->> '$.{key}'"),
        }
    }

    /// The member `key` of the JSON column `col` as an integer: `(col ->> 'key')::bigint`
    /// (PostgreSQL), `col ->> '$.key'` (SQLite, where `->>` yields a JSON integer as one).
    pub fn get_int(self, col: &str, key: &str) -> String {
        match self {
            Dialect::Postgres => format!("({col} ->> '{key}')::bigint"),
            Dialect::Sqlite => format!("{col} ->> '$.{key}'"),
        }
    }

    /// `col` with the members `keys` (fixed names) removed.
    pub fn json_remove(self, col: &str, keys: &[&str]) -> String {
        match self {
            Dialect::Postgres => {
                let mut e = format!("({col}");
                for k in keys {
                    let _ = write!(e, " - '{k}'");
                }
                e.push(')');
                e
            }
            Dialect::Sqlite => {
                let paths: Vec<String> = keys.iter().map(|k| format!("'$.{k}'")).collect();
                format!("json_remove({col}, {})", paths.join(", "))
            }
        }
    }

    /// `col` with the members of `pairs` (fixed names, SQL values) set:
    /// `col || jsonb_build_object('k', v, …)` (PostgreSQL), `json_set(col, '$.k', v, …)` (SQLite).
    pub fn json_merge(self, col: &str, pairs: &[(&str, &str)]) -> String {
        match self {
            Dialect::Postgres => {
                let kv: Vec<String> = pairs.iter().map(|(k, v)| format!("'{k}', {v}")).collect();
                format!("{col} || jsonb_build_object({})", kv.join(", "))
            }
            Dialect::Sqlite => {
                let kv: Vec<String> = pairs.iter().map(|(k, v)| format!("'$.{k}', {v}")).collect();
                format!("json_set({col}, {})", kv.join(", "))
            }
        }
    }

    /// `col` with its integer member `key` set to the SQL value `v`.
    pub fn json_set_int(self, col: &str, key: &str, v: &str) -> String {
        match self {
            Dialect::Postgres => format!("jsonb_set({col}, '{{{key}}}', to_jsonb({v}))"),
            Dialect::Sqlite => format!("json_set({col}, '$.{key}', {v})"),
        }
    }

    /// `col` with its string member `key` set to the fixed string `lit`.
    pub fn json_set_str(self, col: &str, key: &str, lit: &str) -> String {
        match self {
            Dialect::Postgres => format!("jsonb_set({col}, '{{{key}}}', '\"{lit}\"')"),
            Dialect::Sqlite => format!("json_set({col}, '$.{key}', '{lit}')"),
        }
    }

    /// `expr` is one of the strings of the bound text array `arr`: `expr = ANY(arr)`
    /// (PostgreSQL), `expr IN (SELECT value FROM json_each(arr))` (SQLite).
    pub fn in_array(self, expr: &str, arr: &str) -> String {
        match self {
            Dialect::Postgres => format!("{expr} = ANY({arr})"),
            Dialect::Sqlite => format!("{expr} IN (SELECT value FROM json_each({arr}))"),
        }
    }

    /// A boolean column as a condition: `col` (PostgreSQL), `col = 1` (SQLite).
    pub fn is_true(self, col: &str) -> String {
        match self {
            Dialect::Postgres => col.to_string(),
            Dialect::Sqlite => format!("{col} = 1"),
        }
    }

    /// The literal `false`: `false` (PostgreSQL), `0` (SQLite).
    pub fn false_lit(self) -> &'static str {
        match self {
            Dialect::Postgres => "false",
            Dialect::Sqlite => "0",
        }
    }

    /// A write that reports how many rows it changed. `dml` ends in `RETURNING 1`.
    /// PostgreSQL counts in the statement (`WITH d AS (<dml>) SELECT count(*) AS n FROM d`,
    /// one row); SQLite cannot put a write in a `WITH`, so the rows are counted as read.
    /// [`affected`] reads the count either way.
    pub fn counted(self, dml: String) -> String {
        match self {
            Dialect::Postgres => format!("WITH d AS ({dml}) SELECT count(*) AS n FROM d"),
            Dialect::Sqlite => dml,
        }
    }
}

/// How many rows a [`Dialect::counted`] statement changed, from the rows it returned.
pub fn affected<R: SqlRow>(dialect: Dialect, rows: &[R]) -> Result<u64> {
    match dialect {
        Dialect::Postgres => row::count(rows.first()),
        Dialect::Sqlite => Ok(rows.len() as u64),
    }
}

/// Size limits checked before a statement reaches the database.
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

/// A bound value of a statement. In PostgreSQL every placeholder carries an explicit cast
/// (`$3::bigint`), so the parameter types the server infers are exactly these; SQLite
/// binds `Jsonb` and `TextArray` as JSON text, `Int4`/`Int8` as integers, `Bool` as 0/1.
#[derive(Debug, Clone, PartialEq)]
pub enum Param {
    /// `text`
    Text(String),
    /// `bigint`
    Int8(i64),
    /// `int4`
    Int4(i32),
    /// `jsonb` (SQLite: its JSON text)
    Jsonb(Value),
    /// `text[]` (SQLite: a JSON array of strings, read with `json_each`)
    TextArray(Vec<String>),
    /// `bool`
    Bool(bool),
    /// A `bigint` NULL.
    NullInt8,
    /// A `text` NULL.
    NullText,
}

impl Param {
    /// The PostgreSQL type of the placeholder's cast.
    pub fn cast(&self) -> &'static str {
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

    /// The bytes the value takes, as counted against [`Limits::document_bytes_max`].
    pub fn bytes(&self) -> usize {
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
    /// The SQL text, placeholders `$1…$n` (PostgreSQL) or `?1…?n` (SQLite).
    pub sql: String,
    /// The values of the placeholders, in order.
    pub params: Vec<Param>,
}

/// Collects bound values; [`bind`](Self::bind) returns the placeholder of the dialect.
#[derive(Debug)]
pub struct Binds {
    dialect: Dialect,
    params: Vec<Param>,
}

impl Binds {
    /// No values yet: the next placeholder is number 1.
    pub fn new(dialect: Dialect) -> Self {
        Binds { dialect, params: Vec::new() }
    }

    /// The dialect the placeholders are written in.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// Add a value; returns its placeholder (`$n::type` or `?n`).
    pub fn bind(&mut self, p: Param) -> String {
        let cast = p.cast();
        self.params.push(p);
        match self.dialect {
            Dialect::Postgres => format!("${}::{cast}", self.params.len()),
            Dialect::Sqlite => format!("?{}", self.params.len()),
        }
    }

    /// The values bound so far, in placeholder order.
    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// The values, and the statement made of `sql` and them.
    pub fn statement(self, sql: String) -> Statement {
        Statement { sql, params: self.params }
    }

    /// The values bound so far, in placeholder order.
    pub fn into_params(self) -> Vec<Param> {
        self.params
    }
}

/// Statuses a claim may take (K-6.7).
pub const CLAIMABLE_SQL: &str = "status IN ('running', 'failing')";
/// Statuses of a workflow that has not ended.
pub const ACTIVE_SQL: &str = "status IN ('running', 'waiting', 'failing')";

/// `v` as a signed 64-bit integer, or refused naming `field`.
pub fn i64_of(field: &str, v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::invalid(field, format_args!("{v} exceeds the 64-bit signed range")))
}

fn status_lit(s: WorkflowStatus) -> String {
    format!("'{}'", s.as_str())
}

/// The condition of `guard` (without `workflow_id`), its values bound into `b`. Validates
/// every identifier it embeds ([`Guard::validate`]).
///
/// | guard | PostgreSQL | SQLite |
/// |---|---|---|
/// | `Claimable` | `… AND workflow_type = ANY($n::text[])` | `… AND workflow_type IN (SELECT value FROM json_each(?n))` |
/// | `Failed { unless_round }` | `input -> 'fencing_token' IS DISTINCT FROM to_jsonb(r)` | `(json_type(input, '$.fencing_token') IS NOT 'text' OR input ->> '$.fencing_token' IS NOT r)` |
/// | `DueWait` | `wait -> 'step_index' = to_jsonb(i)` | `wait ->> '$.step_index' = i` |
/// | `SignalWait` | `wait @> {identity}` | one `wait ->> '$.<field>' = v` per identity field |
///
/// The other guards are the same text in both; `Operator { revision }` is
/// `status IN ('running', 'waiting', 'failing') AND revision = r AND claim_token IS NULL`.
pub fn guard_sql(b: &mut Binds, guard: &Guard) -> Result<String> {
    guard.validate()?;
    let sqlite = b.dialect == Dialect::Sqlite;
    Ok(match guard {
        Guard::Claimable { now, types } => {
            let now = b.bind(Param::Int8(now.as_millis()));
            let types = b.bind(Param::TextArray(types.clone()));
            if sqlite {
                format!("{CLAIMABLE_SQL} AND claimable_time <= {now} AND workflow_type IN (SELECT value FROM json_each({types}))")
            } else {
                format!("{CLAIMABLE_SQL} AND claimable_time <= {now} AND workflow_type = ANY({types})")
            }
        }
        Guard::Running { token } => format!(
            "status = {} AND claim_token = {}",
            status_lit(WorkflowStatus::Running),
            b.bind(text_of(b.dialect, "token", token.as_str())?)
        ),
        Guard::Failing { token } => format!(
            "status = {} AND claim_token = {}",
            status_lit(WorkflowStatus::Failing),
            b.bind(text_of(b.dialect, "token", token.as_str())?)
        ),
        Guard::Token { token } => format!("claim_token = {}", b.bind(text_of(b.dialect, "token", token.as_str())?)),
        Guard::Failed { unless_round } => {
            let mut s = format!("status = {}", status_lit(WorkflowStatus::Failed));
            if let Some(round) = unless_round {
                // Distinct also when the round is missing or not a string, as
                // `Guard::matches` has it.
                let r = b.bind(text_of(b.dialect, "unless_round", round.as_str())?);
                if sqlite {
                    let _ = write!(
                        s,
                        " AND (json_type(input, '$.fencing_token') IS NOT 'text' OR input ->> '$.fencing_token' IS NOT {r})"
                    );
                } else {
                    let _ = write!(s, " AND input -> 'fencing_token' IS DISTINCT FROM to_jsonb({r})");
                }
            }
            s
        }
        Guard::DueWait { now, step_index } => {
            let now = b.bind(Param::Int8(now.as_millis()));
            let i = b.bind(Param::Int8(i64::from(*step_index)));
            if sqlite {
                format!(
                    "status = {} AND claimable_time <= {now} AND wait ->> '$.step_index' = {i}",
                    status_lit(WorkflowStatus::Waiting)
                )
            } else {
                format!(
                    "status = {} AND claimable_time <= {now} AND wait -> 'step_index' = to_jsonb({i})",
                    status_lit(WorkflowStatus::Waiting)
                )
            }
        }
        Guard::SignalWait(WaitIdentity { signal_type, wait_key, generation, step_index }) => {
            let generation = i64_of("generation", *generation)?;
            if sqlite {
                // Each field compared with its typed value: `->>` yields a JSON string as
                // text and a JSON integer as an integer, and SQLite never finds a text equal
                // to an integer, so this is the containment PostgreSQL's `@>` tests.
                let st = b.bind(text_of(b.dialect, "signal_type", signal_type)?);
                let wk = b.bind(text_of(b.dialect, "wait_key", wait_key)?);
                let g = b.bind(Param::Int8(generation));
                let i = b.bind(Param::Int8(i64::from(*step_index)));
                format!(
                    "status = {} AND wait ->> '$.kind' = 'signal' AND wait ->> '$.signal_type' = {st} \
                     AND wait ->> '$.wait_key' = {wk} AND wait ->> '$.generation' = {g} AND wait ->> '$.step_index' = {i}",
                    status_lit(WorkflowStatus::Waiting)
                )
            } else {
                let identity = serde_json::json!({
                    "kind": "signal",
                    "signal_type": signal_type,
                    "wait_key": wait_key,
                    "generation": generation,
                    "step_index": step_index,
                });
                format!(
                    "status = {} AND wait @> {}",
                    status_lit(WorkflowStatus::Waiting),
                    b.bind(Param::Jsonb(identity))
                )
            }
        }
        Guard::Active => ACTIVE_SQL.to_string(),
        // Optimistic: the operator's write holds only on the revision it read, and only
        // while no claim holds the instance (K-6.8: a live claim gets a request instead).
        Guard::Operator { revision } => format!(
            "{ACTIVE_SQL} AND revision = {} AND claim_token IS NULL",
            b.bind(Param::Int8(i64_of("revision", *revision)?))
        ),
        Guard::PriorityBelow(p) => {
            format!("{ACTIVE_SQL} AND business_priority > {}", b.bind(Param::Int8(i64::from(u8::from(*p)))))
        }
    })
}

/// Refused unless the statement's values fit [`Limits::document_bytes_max`] (nothing sent).
pub fn check_size(field: &str, params: &[Param], limits: &Limits) -> Result<()> {
    let bytes: usize = params.iter().map(Param::bytes).sum();
    if bytes > limits.document_bytes_max {
        return Err(Error::invalid(
            field,
            format_args!("{bytes} bytes of values exceed the statement limit of {}", limits.document_bytes_max),
        ));
    }
    Ok(())
}

/// What the database cannot store in a JSON value, refused naming `field` before anything
/// is sent (checked without recursion):
///
/// - PostgreSQL: NUL (`\u0000`) in any string or object key (`jsonb` refuses it).
/// - SQLite: nothing; JSON is kept as text, a NUL escaped as `\u0000`, and SQLite's JSON
///   functions read such strings back whole.
pub fn storable(dialect: Dialect, field: &str, value: &Value) -> Result<()> {
    if dialect == Dialect::Sqlite {
        return Ok(());
    }
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) if s.contains('\0') => {
                return Err(Error::invalid(
                    field,
                    format_args!("a string contains NUL, which {} cannot store", dialect.name()),
                ));
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

/// The SQLite JSON path of the member `keys[0]`, then of its member `keys[1]`, …: `$."a"."b"`,
/// each key written as a JSON string literal, so every key is data (K-2.0 amendment).
///
/// SQLite decodes the escapes of a quoted path label (`\"`, `\\`, `\uXXXX`) and compares the
/// decoded label with the decoded stored keys. A key pasted between the quotes unescaped is
/// read through those escapes: `x\u0041` would address the member `xA`, and `tail\` would
/// leave the label unterminated ("bad JSON path"). Escaped, the label decodes to exactly the
/// key, whatever it holds. Bind the path as a parameter; only [`validate::key_name`]
/// decides which keys are admitted, as on every store.
///
/// ```
/// assert_eq!(sql_protocol::sqlite_json_path(&["compose"]), r#"$."compose""#);
/// assert_eq!(sql_protocol::sqlite_json_path(&["meta", "x\\u0041"]), r#"$."meta"."x\\u0041""#);
/// assert_eq!(sql_protocol::sqlite_json_path(&["tail\\", "say \"hi\""]), r#"$."tail\\"."say \"hi\"""#);
/// ```
pub fn sqlite_json_path<S: AsRef<str>>(keys: &[S]) -> String {
    let mut p = String::from("$");
    for k in keys {
        p.push('.');
        p.push_str(&Value::String(k.as_ref().to_string()).to_string());
    }
    p
}

/// A string for a text column, refused when it holds NUL (PostgreSQL refuses it in
/// `text`; SQLite's text functions and comparisons of bound text stop at it). Ids and
/// tokens never hold one (K-2.0 refuses control characters); this is the last line.
pub fn text_of(dialect: Dialect, field: &str, s: &str) -> Result<Param> {
    if s.contains('\0') {
        return Err(Error::invalid(field, format_args!("contains NUL, which {} cannot store", dialect.name())));
    }
    Ok(Param::Text(s.to_string()))
}

/// A JSON value, checked by [`storable`].
pub fn json_of(dialect: Dialect, field: &str, v: Value) -> Result<Param> {
    storable(dialect, field, &v)?;
    Ok(Param::Jsonb(v))
}

/// A kernel type's serde form, checked by [`storable`]: `jsonb(d, "wait", serde_json::to_value(w))`.
pub fn jsonb(dialect: Dialect, field: &str, v: serde_json::Result<Value>) -> Result<Param> {
    let v = v.map_err(|e| Error::invalid_with(field, e.to_string(), e))?;
    json_of(dialect, field, v)
}

/// A wait as JSON; a signal wait's generation must fit the signed 64-bit range, as in
/// every other store (and as the inbox's `generation` column does).
pub fn wait_of(dialect: Dialect, field: &str, w: &Wait) -> Result<Param> {
    if let Some(id) = w.signal_identity() {
        i64_of(&format!("{field}.generation"), id.generation)?;
    }
    jsonb(dialect, field, serde_json::to_value(w))
}

/// The expression of one patched step and its location: PostgreSQL `ARRAY[i::text],
/// (steps -> i) || {sets} - {unsets}` (the arguments of `jsonb_set` after `steps`),
/// SQLite `'$[i]', json(json_remove(json_set(steps -> '$[i]', sets…), unsets…))`.
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
        epoch,
        record,
        history,
        retrying_since,
        iterations,
        completed_revision,
    } = p;
    let d = b.dialect;
    let sqlite = d == Dialect::Sqlite;
    let idx = i32::try_from(*index).map_err(|_| Error::invalid("transition.steps", "step index out of range"))?;
    let i = if sqlite { b.bind(Param::Text(format!("$[{idx}]"))) } else { b.bind(Param::Int4(idx)) };
    let cur = format!("(steps -> {i})");
    let num = |key: &str| {
        if sqlite {
            // A missing or null counter counts as 0, an integer as itself; anything else (a
            // counter changed outside the kernel) fails the statement, as PostgreSQL's
            // `::bigint` cast does: `json('x' || <value>)` is never valid JSON, so SQLite
            // raises "malformed JSON" (the store's `Corrupt`) and nothing is written, rather
            // than reading the text as 0.
            let ty = format!("json_type({cur}, '$.{key}')");
            format!(
                "(CASE WHEN {ty} IS NULL OR {ty} = 'null' THEN 0 WHEN {ty} = 'integer' THEN {cur} ->> '$.{key}' \
                 ELSE json('x' || ({cur} ->> '$.{key}')) END)"
            )
        } else {
            format!("COALESCE(({cur} ->> '{key}')::bigint, 0)")
        }
    };
    // SQLite: keys are paths, JSON values pass through json() so they are inserted as JSON.
    let key = |k: &str| if sqlite { format!("'$.{k}'") } else { format!("'{k}'") };
    let json_val = |ph: String| if sqlite { format!("json({ph})") } else { ph };
    let mut sets: Vec<String> = Vec::new();
    let mut unsets: Vec<&str> = Vec::new();
    if let Some(s) = status {
        sets.push(format!("{}, {}", key("status"), b.bind(Param::Text(s.as_str().to_string()))));
    }
    let greatest = if sqlite { "max" } else { "GREATEST" };
    match attempt {
        // The reference semantics never lets the counter go below zero.
        Some(AttemptChange::Inc(delta)) => sets.push(format!(
            "{}, {greatest}(0, {} + {})",
            key("attempt"),
            num("attempt"),
            b.bind(Param::Int8(i64::from(*delta)))
        )),
        Some(AttemptChange::Reset) => sets.push(format!("{}, 0", key("attempt"))),
        None => {}
    }
    let field = |f: &str| format!("steps.{index}.{f}");
    match error {
        Some(Patch::Set(e)) => {
            let v = b.bind(jsonb(d, &field("error"), serde_json::to_value(e))?);
            sets.push(format!("{}, {}", key("error"), json_val(v)));
        }
        Some(Patch::Unset) => unsets.push("error"),
        None => {}
    }
    match checkpoint {
        Some(Patch::Set(c)) => {
            let v = b.bind(json_of(d, &field("checkpoint"), c.clone())?);
            sets.push(format!("{}, {}", key("checkpoint"), json_val(v)));
        }
        Some(Patch::Unset) => unsets.push("checkpoint"),
        None => {}
    }
    for (k, inc) in [("elapsed_ms", elapsed_ms_inc.as_millis()), ("traffic_wait_ms", traffic_wait_ms_inc.as_millis())] {
        if inc != 0 {
            sets.push(format!("{}, {} + {}", key(k), num(k), b.bind(Param::Int8(inc))));
        }
    }
    if *traffic_waits_inc != 0 {
        sets.push(format!(
            "{}, {} + {}",
            key("traffic_waits"),
            num("traffic_waits"),
            b.bind(Param::Int8(i64::from(*traffic_waits_inc)))
        ));
    }
    if let Some(t) = started_at {
        sets.push(format!("{}, {}", key("started_at"), b.bind(Param::Int8(t.as_millis()))));
    }
    match finished_at {
        Some(Patch::Set(t)) => sets.push(format!("{}, {}", key("finished_at"), b.bind(Param::Int8(t.as_millis())))),
        Some(Patch::Unset) => unsets.push("finished_at"),
        None => {}
    }
    // Stored only above 0, as the step serializes it: epoch 0 removes the key.
    match epoch {
        Some(0) => unsets.push("epoch"),
        Some(e) => sets.push(format!("{}, {}", key("epoch"), b.bind(Param::Int8(i64::from(*e))))),
        None => {}
    }
    match record {
        Some(Patch::Set(r)) => {
            let v = b.bind(jsonb(d, &field("record"), serde_json::to_value(r))?);
            sets.push(format!("{}, {}", key("record"), json_val(v)));
        }
        Some(Patch::Unset) => unsets.push("record"),
        None => {}
    }
    // Stored only when non-empty, as the step serializes it.
    match history {
        Some(Patch::Set(h)) if !h.is_empty() => {
            let v = b.bind(jsonb(d, &field("history"), serde_json::to_value(h))?);
            sets.push(format!("{}, {}", key("history"), json_val(v)));
        }
        Some(_) => unsets.push("history"),
        None => {}
    }
    match retrying_since {
        Some(Patch::Set(t)) => sets.push(format!("{}, {}", key("retrying_since"), b.bind(Param::Int8(t.as_millis())))),
        Some(Patch::Unset) => unsets.push("retrying_since"),
        None => {}
    }
    // Stored only when above 0, as the step serializes it.
    match iterations {
        Some(0) => unsets.push("iterations"),
        Some(n) => sets.push(format!("{}, {}", key("iterations"), b.bind(Param::Int8(i64::from(*n))))),
        None => {}
    }
    match completed_revision {
        Some(Patch::Set(r)) => {
            let r = i64::try_from(*r).map_err(|_| Error::invalid(field("completed_revision"), "out of range"))?;
            sets.push(format!("{}, {}", key("completed_revision"), b.bind(Param::Int8(r))));
        }
        Some(Patch::Unset) => unsets.push("completed_revision"),
        None => {}
    }
    if sqlite {
        let mut e = cur.clone();
        if !sets.is_empty() {
            e = format!("json_set({e}, {})", sets.join(", "));
        }
        if !unsets.is_empty() {
            let keys: Vec<String> = unsets.iter().map(|k| key(k)).collect();
            e = format!("json_remove({e}, {})", keys.join(", "));
        }
        return Ok(format!("{i}, json({e})"));
    }
    let mut e = cur.clone();
    if !sets.is_empty() {
        // jsonb_build_object takes at most 100 arguments; a step has 16 fields.
        let _ = write!(e, " || jsonb_build_object({})", sets.join(", "));
    }
    if !unsets.is_empty() {
        let keys: Vec<String> = unsets.iter().map(|k| format!("'{k}'")).collect();
        e = format!("({e}) - ARRAY[{}]::text[]", keys.join(", "));
    }
    Ok(format!("ARRAY[{i}::text], {e}"))
}

/// Replay (`reset_failed_steps`) in PostgreSQL: every failed step starts afresh as
/// `Step::pending(name)` and keeps its epoch, record and history (K-17.3): the fields of
/// the attempt are removed (`retrying_since` and the loop's `iterations` among them), the
/// counters and status reset.
const RESET_FAILED_STEPS_PG: &str = "steps = (SELECT COALESCE(jsonb_agg(CASE WHEN e ->> 'status' = 'failed' \
THEN (e - ARRAY['error', 'checkpoint', 'started_at', 'finished_at', 'retrying_since', 'iterations', \
'completed_revision']::text[]) || \
jsonb_build_object('name', e -> 'name', 'status', 'pending', 'attempt', 0, 'elapsed_ms', 0, \
'traffic_wait_ms', 0, 'traffic_waits', 0) ELSE e END ORDER BY n), '[]'::jsonb) \
FROM jsonb_array_elements(steps) WITH ORDINALITY AS x(e, n))";

/// The same in SQLite (aggregate `ORDER BY`: SQLite ≥ 3.44).
const RESET_FAILED_STEPS_SQLITE: &str = "steps = (SELECT json_group_array(CASE WHEN e.value ->> '$.status' = 'failed' \
THEN json_set(json_remove(e.value, '$.error', '$.checkpoint', '$.started_at', '$.finished_at', '$.retrying_since', \
'$.iterations', '$.completed_revision'), \
'$.status', 'pending', '$.attempt', 0, '$.elapsed_ms', 0, '$.traffic_wait_ms', 0, '$.traffic_waits', 0) \
ELSE json(e.value) END ORDER BY e.key) FROM json_each(steps) AS e)";

/// The `SET` list of a transition, its values bound into `b`. Validates the transition
/// first ([`Transition::validate`]).
pub fn set_sql(b: &mut Binds, t: &Transition, limits: &Limits) -> Result<String> {
    t.validate(limits.payload_bytes_max)?;
    let Transition {
        kinds: _,
        now,
        status,
        steps,
        outputs,
        outputs_unset,
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
        refused_writes,
        finished_at,
        compensation,
        operator_request,
        bump_revision,
    } = t;
    let d = b.dialect;
    let sqlite = d == Dialect::Sqlite;
    let mut sets: Vec<String> = Vec::new();
    if let Some(s) = status {
        sets.push(format!("status = {}", b.bind(Param::Text(s.as_str().to_string()))));
    }
    if *reset_failed_steps {
        sets.push(if sqlite { RESET_FAILED_STEPS_SQLITE } else { RESET_FAILED_STEPS_PG }.to_string());
    }
    if !steps.is_empty() {
        // Nested `jsonb_set`/`json_set`s, one per patched index; each reads the row's old
        // `steps`, which is right because the indices are distinct (Transition::validate).
        let f = if sqlite { "json_set" } else { "jsonb_set" };
        let mut e = "steps".to_string();
        for p in steps {
            e = format!("{f}({e}, {})", step_patch_sql(b, p)?);
        }
        sets.push(format!("steps = {e}"));
    }
    if !outputs.is_empty() || !outputs_unset.is_empty() {
        // A name is never both set and removed (Transition::validate), so the order of
        // the two does not matter.
        if sqlite {
            let mut e = "output".to_string();
            if !outputs.is_empty() {
                let mut pairs = Vec::new();
                for (name, v) in outputs {
                    let field = format!("output.{name}");
                    let k = b.bind(Param::Text(sqlite_json_path(&[name])));
                    let v = b.bind(json_of(d, &field, v.clone())?);
                    pairs.push(format!("{k}, json({v})"));
                }
                e = format!("json_set({e}, {})", pairs.join(", "));
            }
            if !outputs_unset.is_empty() {
                let mut keys = Vec::new();
                for name in outputs_unset {
                    keys.push(b.bind(Param::Text(sqlite_json_path(&[name]))));
                }
                e = format!("json_remove({e}, {})", keys.join(", "));
            }
            sets.push(format!("output = {e}"));
        } else {
            let mut e = "output".to_string();
            for (name, v) in outputs {
                let field = format!("output.{name}");
                storable(d, &field, v)?;
                let k = b.bind(Param::Text(name.clone()));
                let v = b.bind(Param::Jsonb(v.clone()));
                let _ = write!(e, " || jsonb_build_object({k}, {v})");
            }
            if !outputs_unset.is_empty() {
                let mut keys = Vec::new();
                for name in outputs_unset {
                    keys.push(b.bind(text_of(d, &format!("output.{name}"), name)?));
                }
                if !outputs.is_empty() {
                    e = format!("({e})");
                }
                for k in keys {
                    let _ = write!(e, " - {k}");
                }
            }
            sets.push(format!("output = {e}"));
        }
    }
    if let Some(i) = input {
        sets.push(format!("input = {}", b.bind(json_of(d, "input", i.clone())?)));
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
    patch(b, "claim_token", of(claim_token, |x| text_of(d, "claim_token", x.as_str())))?;
    patch(b, "wait", of(wait, |w| wait_of(d, "wait", w)))?;
    patch(b, "resume", of(resume, |r| jsonb(d, "resume", serde_json::to_value(r))))?;
    patch(
        b,
        "fingerprint_mismatch",
        fingerprint_mismatch.as_ref().map(|m| jsonb(d, "fingerprint_mismatch", serde_json::to_value(m)).map(Some)),
    )?;
    patch(b, "business_priority", priority.map(|p| Ok(Some(Param::Int8(i64::from(u8::from(p)))))))?;
    patch(b, "finished_at", of(finished_at, |x| Ok(Param::Int8(x.as_millis()))))?;
    patch(b, "prepare_failures", prepare_failures.map(|n| Ok(Some(Param::Int8(i64::from(n))))))?;
    patch(b, "refused_writes", refused_writes.map(|n| Ok(Some(Param::Int8(i64::from(n))))))?;
    patch(b, "compensation", of(compensation, |c| jsonb(d, "compensation", serde_json::to_value(c))))?;
    patch(b, "operator_request", of(operator_request, |r| jsonb(d, "operator_request", serde_json::to_value(r))))?;
    patch(b, "updated_at", Some(Ok(Some(Param::Int8(now.as_millis())))))?;
    if *retry_count_inc {
        sets.push("retry_count = retry_count + 1".to_string());
    }
    if *bump_revision {
        sets.push("revision = revision + 1".to_string());
    }
    Ok(sets.join(", "))
}

/// The structural addition to a guard of a write that patches `steps[max]`: the array
/// must be longer than `max` (PostgreSQL's `jsonb_set` would append past the end).
pub fn steps_exist_sql(b: &mut Binds, max: u32) -> String {
    let n = b.bind(Param::Int8(i64::from(max)));
    match b.dialect {
        Dialect::Postgres => format!("jsonb_array_length(steps) > {n}"),
        Dialect::Sqlite => format!("json_array_length(steps) > {n}"),
    }
}

/// The condition of `guard` alone, its values numbered from 1 (for snapshots and
/// documentation; a store embeds the same text after `workflow_id = <1>`).
pub fn guard_condition(dialect: Dialect, guard: &Guard) -> Result<Statement> {
    let mut b = Binds::new(dialect);
    let sql = guard_sql(&mut b, guard)?;
    Ok(b.statement(sql))
}

/// The `SET` list of `t` alone, its values numbered from 1 (for snapshots and
/// documentation).
pub fn transition_assignments(dialect: Dialect, t: &Transition, limits: &Limits) -> Result<Statement> {
    let mut b = Binds::new(dialect);
    let sql = set_sql(&mut b, t, limits)?;
    Ok(b.statement(sql))
}

/// Dead-letter columns in the order every `SELECT` reads them (K-17.2).
pub const DEAD_LETTER_COLUMNS: &str =
    "id, workflow_id, workflow_type, step, step_index, run, epoch, error, inputs, created_at, status, decision, \
     closed_at";

/// The values of a new dead letter, in the order of the first ten
/// [`DEAD_LETTER_COLUMNS`] (a new record is `open`, without decision or `closed_at`); the
/// record is checked by `DeadLetter::validate_new` first.
pub fn dead_letter_params(dialect: Dialect, dl: &kernel_core::ports::DeadLetter) -> Result<Vec<Param>> {
    dl.validate_new()?;
    let kernel_core::ports::DeadLetter {
        id,
        workflow_id,
        workflow_type,
        step,
        step_index,
        run,
        epoch,
        error,
        inputs,
        created_at,
        status: _,
        decision: _,
        closed_at: _,
    } = dl;
    Ok(vec![
        text_of(dialect, "id", id)?,
        text_of(dialect, "workflow_id", workflow_id.as_str())?,
        text_of(dialect, "workflow_type", workflow_type)?,
        text_of(dialect, "step", step)?,
        Param::Int8(i64::from(*step_index)),
        Param::Int8(i64::from(*run)),
        Param::Int8(i64::from(*epoch)),
        jsonb(dialect, "error", serde_json::to_value(error))?,
        jsonb(dialect, "inputs", Ok(inputs.clone()))?,
        Param::Int8(created_at.as_millis()),
    ])
}

/// Human-task columns in the order every `SELECT` reads them (K-17.5).
pub const TASK_COLUMNS: &str = "id, workflow_id, workflow_type, step, level, title, assignee, roles, evidence, token, \
     created_at, due_at, status, decision, closed_at";

/// The values of a new human task, in the order of the first twelve [`TASK_COLUMNS`] (a
/// new record is `open`, without decision or `closed_at`): the roles as a
/// [`Param::TextArray`], the evidence as JSON. The record is checked by
/// `TaskRecord::validate_new` first.
pub fn task_params(dialect: Dialect, task: &kernel_core::ports::TaskRecord) -> Result<Vec<Param>> {
    task.validate_new()?;
    let kernel_core::ports::TaskRecord {
        id,
        workflow_id,
        workflow_type,
        step,
        level,
        title,
        assignee,
        roles,
        evidence,
        token,
        created_at,
        due_at,
        status: _,
        decision: _,
        closed_at: _,
    } = task;
    Ok(vec![
        text_of(dialect, "id", id)?,
        text_of(dialect, "workflow_id", workflow_id.as_str())?,
        text_of(dialect, "workflow_type", workflow_type)?,
        text_of(dialect, "step", step)?,
        Param::Int8(i64::from(*level)),
        text_of(dialect, "title", title)?,
        match assignee {
            Some(a) => text_of(dialect, "assignee", a)?,
            None => Param::NullText,
        },
        Param::TextArray(roles.clone()),
        jsonb(dialect, "evidence", serde_json::to_value(evidence))?,
        text_of(dialect, "token", token)?,
        Param::Int8(created_at.as_millis()),
        Param::Int8(due_at.as_millis()),
    ])
}

/// Instance columns in the order every `SELECT`/`RETURNING` reads them.
pub const INSTANCE_COLUMNS: &str = "workflow_id, workflow_type, biz_key, status, steps, input, output, \
claimable_time, claim_token, wait, resume, definition_fingerprint, fingerprint_mismatch, business_priority, \
retry_count, prepare_failures, refused_writes, revision, created_at, updated_at, finished_at, compensation, trace_parent, \
operator_request";

/// The insert of a new instance into `table` (already qualified and quoted by the store):
/// `INSERT … (`[`INSTANCE_COLUMNS`]`) VALUES (…) ON CONFLICT DO NOTHING RETURNING workflow_id`
/// (a conflict on `biz_key` or `workflow_id` inserts nothing; the store then reads which).
/// The instance is checked by [`WorkflowInstance::validate`] first.
pub fn insert_instance(dialect: Dialect, table: &str, w: &WorkflowInstance, limits: &Limits) -> Result<Statement> {
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
        refused_writes,
        revision,
        created_at,
        updated_at,
        finished_at,
        compensation,
        trace_parent,
        operator_request,
    } = w;
    for (i, s) in steps.iter().enumerate() {
        if let Some(c) = &s.checkpoint {
            storable(dialect, &format!("steps[{i}].checkpoint"), c)?;
        }
        // What a transition's record or history may hold (K-2.0, as `Transition::validate`
        // checks it), so a created step holds nothing a later write could not.
        for (f, v) in [
            ("record", s.record.as_ref().map(serde_json::to_value)),
            ("history", (!s.history.is_empty()).then(|| serde_json::to_value(&s.history))),
        ] {
            if let Some(v) = v {
                let field = format!("steps[{i}].{f}");
                let v = v.map_err(|e| Error::invalid_with(&field, e.to_string(), e))?;
                validate::storable(&field, &v)?;
                storable(dialect, &field, &v)?;
            }
        }
    }
    for (name, v) in output {
        storable(dialect, &format!("output.{name}"), v)?;
    }
    let mut b = Binds::new(dialect);
    let mut vals = vec![
        b.bind(text_of(dialect, "workflow_id", workflow_id.as_str())?),
        b.bind(text_of(dialect, "workflow_type", workflow_type)?),
        b.bind(text_of(dialect, "biz_key", biz_key)?),
        b.bind(Param::Text(status.as_str().to_string())),
        b.bind(jsonb(dialect, "steps", serde_json::to_value(steps))?),
        b.bind(json_of(dialect, "input", input.clone())?),
        b.bind(jsonb(dialect, "output", serde_json::to_value(output))?),
    ];
    let mut nullable = |b: &mut Binds, p: Option<Param>| match p {
        Some(p) => vals.push(b.bind(p)),
        None => vals.push("NULL".to_string()),
    };
    nullable(&mut b, claimable_time.map(|t| Param::Int8(t.as_millis())));
    nullable(&mut b, claim_token.as_ref().map(|t| text_of(dialect, "claim_token", t.as_str())).transpose()?);
    nullable(&mut b, wait.as_ref().map(|w| wait_of(dialect, "wait", w)).transpose()?);
    nullable(&mut b, resume.as_ref().map(|r| jsonb(dialect, "resume", serde_json::to_value(r))).transpose()?);
    nullable(&mut b, Some(text_of(dialect, "definition_fingerprint", definition_fingerprint)?));
    nullable(
        &mut b,
        fingerprint_mismatch
            .as_ref()
            .map(|m| jsonb(dialect, "fingerprint_mismatch", serde_json::to_value(m)))
            .transpose()?,
    );
    nullable(&mut b, Some(Param::Int8(i64::from(u8::from(*business_priority)))));
    nullable(&mut b, Some(Param::Int8(i64::from(*retry_count))));
    nullable(&mut b, Some(Param::Int8(i64::from(*prepare_failures))));
    nullable(&mut b, Some(Param::Int8(i64::from(*refused_writes))));
    nullable(&mut b, Some(Param::Int8(i64_of("revision", *revision)?)));
    nullable(&mut b, Some(Param::Int8(created_at.as_millis())));
    nullable(&mut b, Some(Param::Int8(updated_at.as_millis())));
    nullable(&mut b, finished_at.map(|t| Param::Int8(t.as_millis())));
    nullable(
        &mut b,
        compensation.as_ref().map(|c| jsonb(dialect, "compensation", serde_json::to_value(c))).transpose()?,
    );
    nullable(&mut b, trace_parent.as_ref().map(|t| text_of(dialect, "trace_parent", t)).transpose()?);
    nullable(
        &mut b,
        operator_request.as_ref().map(|r| jsonb(dialect, "operator_request", serde_json::to_value(r))).transpose()?,
    );
    let sql = format!(
        "INSERT INTO {table} ({INSTANCE_COLUMNS}) VALUES ({}) ON CONFLICT DO NOTHING RETURNING workflow_id",
        vals.join(", ")
    );
    check_size("instance", b.params(), limits)?;
    Ok(b.statement(sql))
}
