//! The dispatch outbox on the user's business table (K-11, K-12).
//!
//! The adapter knows only what it is told about the business table ([`OutboxTable`]): its
//! name, the `TEXT` primary-key column (default `object_id`), the business status column
//! (default `business_status`), the JSON column holding the user's fields (default
//! `fields`), the JSON column holding the intent (default `workflow_dispatch`, in the
//! serde form of [`DispatchIntent`]), the path inside the fields a new round clears
//! (default `previous_error`) and the failed status (default `failed`). Every write is one
//! autocommit statement (`d` is the intent column):
//!
//! | call | condition (besides the id) | assignment |
//! |---|---|---|
//! | accept | — (`INSERT … ON CONFLICT DO NOTHING`) | the whole row |
//! | confirm_dispatched | `d ->> '$.fencing_token' = f AND d ->> '$.status' = 'pending'` | `d.status = dispatched` |
//! | defer_pending | same | `d.next_attempt_time` |
//! | try_lease | `(pending AND next_attempt_time <= now) OR (processing AND lease_until < now)` | `d.status = processing, lease_token, lease_until` |
//! | renew_lease | `f, processing, d ->> '$.lease_token' = l` | `d.lease_until` |
//! | confirm_leased | same | `d.status = dispatched`, lease removed |
//! | revert_leased | same | `d.status = pending, next_attempt_time`, lease removed |
//! | retry_failed | `status = failed AND d ->> '$.fencing_token' = prev` | `status = initial, d = next, json_remove(fields, error path)` |
//! | fenced_update | `d ->> '$.fencing_token' = f` | `fields` merged with the given paths[, status] |
//!
//! Field names are data (K-2.0 amendment): a dotted path is split by the one K-2.0 rule
//! ([`validate::field_path`]) and each segment reaches SQLite inside a bound JSON path in
//! which it is escaped ([`sqlite_json_path`]), so `note\u0041` is its own field, never `noteA`.
//!
//! The scan mutex lives in `<table>_locks`: one `INSERT … ON CONFLICT (name) DO UPDATE …
//! WHERE holder = $holder OR until <= $now RETURNING 1`.

use crate::error::Op;
use crate::protocol::{Param, Statement};
use crate::store::one;
use crate::{codec, run, SqliteDb};
use kernel_core::domain::Instant;
use kernel_core::ports::*;
use kernel_core::{validate, Error, FencingToken, LeaseToken, ObjectId, Result};
use serde_json::Value;
use sql_protocol::{sqlite_json_path, storable, text_of, Dialect};
use std::collections::BTreeMap;

const D: Dialect = Dialect::Sqlite;

/// Where the outbox lives in the user's business table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxTable {
    /// The business table.
    pub table: String,
    /// Its `TEXT` primary key.
    pub id_column: String,
    /// Its `TEXT` business status column.
    pub status_column: String,
    /// Its JSON column of the user's fields.
    pub fields_column: String,
    /// Its JSON column holding the intent.
    pub dispatch_column: String,
    /// Path (dotted) inside the fields that a new round clears.
    pub error_field: String,
    /// Business status that allows a new round.
    pub failed_status: String,
}

impl Default for OutboxTable {
    fn default() -> Self {
        OutboxTable {
            table: "business_objects".into(),
            id_column: "object_id".into(),
            status_column: "business_status".into(),
            fields_column: "fields".into(),
            dispatch_column: "workflow_dispatch".into(),
            error_field: "previous_error".into(),
            failed_status: "failed".into(),
        }
    }
}

/// A plain SQL identifier: 1–63 bytes of `[a-z0-9_]`, not starting with a digit (spliced
/// into statements, quoted, so it is checked instead of escaped).
fn plain(field: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(field, format_args!("{name:?} is not a plain identifier")))
    }
}

/// The segments of a dotted field path, by the one K-2.0 rule of every store.
fn path_of(field: &str, p: &str) -> Result<Vec<String>> {
    Ok(validate::field_path(field, p)?.into_iter().map(str::to_string).collect())
}

impl OutboxTable {
    fn validate(&self) -> Result<()> {
        for (field, name) in [
            ("table", &self.table),
            ("id_column", &self.id_column),
            ("status_column", &self.status_column),
            ("fields_column", &self.fields_column),
            ("dispatch_column", &self.dispatch_column),
        ] {
            plain(field, name)?;
        }
        path_of("error_field", &self.error_field)?;
        validate::identifier("failed_status", &self.failed_status)
    }

    fn t(&self) -> String {
        format!("\"{}\"", self.table)
    }

    fn locks(&self) -> String {
        format!("\"{}_locks\"", self.table)
    }

    /// A user field name that would address the outbox's own columns.
    fn reserved(&self, head: &str) -> bool {
        [&self.id_column, &self.status_column, &self.dispatch_column, &self.fields_column].iter().any(|c| *c == head)
    }
}

/// [`DispatchOutbox`] on a business table in the SQLite file. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SqliteOutbox {
    db: SqliteDb,
    table: OutboxTable,
    cols: String,
}

impl SqliteOutbox {
    /// The outbox on `table` (checked) in `db`'s file. Nothing is executed;
    /// [`ensure_table`](Self::ensure_table) creates the table when the application does
    /// not own its DDL.
    pub fn new(db: SqliteDb, table: OutboxTable) -> Result<Self> {
        table.validate()?;
        let cols = format!(
            "\"{}\" AS object_id, \"{}\" AS business_status, \"{}\" AS fields, \"{}\" AS dispatch",
            table.id_column, table.status_column, table.fields_column, table.dispatch_column
        );
        Ok(SqliteOutbox { db, table, cols })
    }

    /// Create the business table (if absent), its lock table and the index of the
    /// recovery scan (intents not yet dispatched, by id). Idempotent; a table the
    /// application created needs the four configured columns.
    pub async fn ensure_table(&self) -> Result<()> {
        let o = &self.table;
        let (id, st, f, d) = (&o.id_column, &o.status_column, &o.fields_column, &o.dispatch_column);
        let sql = format!(
            "BEGIN IMMEDIATE;
             CREATE TABLE IF NOT EXISTS {t} (\"{id}\" TEXT PRIMARY KEY NOT NULL, \"{st}\" TEXT, \
               \"{f}\" TEXT NOT NULL DEFAULT '{{}}', \"{d}\" TEXT) STRICT;
             CREATE INDEX IF NOT EXISTS \"{table}_dispatch_due\" ON {t} (\"{id}\") \
               WHERE \"{d}\" ->> '$.status' IN ('pending', 'processing');
             CREATE TABLE IF NOT EXISTS {locks} (name TEXT PRIMARY KEY NOT NULL, holder TEXT NOT NULL, \
               until INTEGER NOT NULL) STRICT;
             COMMIT;",
            table = o.table,
            t = o.t(),
            locks = o.locks(),
        );
        self.db
            .call(Op::Write, "outbox: create table", move |c| {
                c.execute_batch(&sql).map_err(|e| {
                    let _ = c.execute_batch("ROLLBACK");
                    crate::error::map(Op::Write, "outbox: create table", e)
                })
            })
            .await
    }

    fn d(&self) -> String {
        format!("\"{}\"", self.table.dispatch_column)
    }

    fn intent_json(&self, i: &DispatchIntent) -> Result<Param> {
        i.validate(self.db.config().limits.payload_bytes_max)?;
        let v = serde_json::to_value(i).map_err(|e| Error::invalid_with("workflow_dispatch", e.to_string(), e))?;
        storable(D, "workflow_dispatch", &v)?;
        Ok(Param::Jsonb(v))
    }

    /// One conditional update of one object; `true` when it matched.
    async fn update(&self, what: &'static str, set: &str, cond: &str, params: Vec<Param>) -> Result<bool> {
        let sql = format!(
            "UPDATE {} SET {set} WHERE \"{}\" = ?1 AND {cond} RETURNING 1",
            self.table.t(),
            self.table.id_column
        );
        let stmt = Statement { sql, params };
        self.db.call(Op::Write, what, move |c| Ok(!run(c, Op::Write, what, &stmt, |_| ())?.is_empty())).await
    }

    fn pending_cond(&self) -> String {
        let d = self.d();
        format!("{d} ->> '$.fencing_token' = ?2 AND {d} ->> '$.status' = 'pending'")
    }

    fn leased_cond(&self) -> String {
        let d = self.d();
        format!("{d} ->> '$.fencing_token' = ?2 AND {d} ->> '$.status' = 'processing' AND {d} ->> '$.lease_token' = ?3")
    }

    /// Due at `?n`: pending and due, or processing with an expired lease.
    fn due_cond(&self, n: usize) -> String {
        let d = self.d();
        format!(
            "{d} ->> '$.status' IN ('pending', 'processing') AND \
             (({d} ->> '$.status' = 'pending' AND {d} ->> '$.next_attempt_time' <= ?{n}) OR \
              ({d} ->> '$.status' = 'processing' AND {d} ->> '$.lease_until' < ?{n}))"
        )
    }

    fn leased_params(&self, object_id: &ObjectId, f: &FencingToken, lease: &LeaseToken) -> Result<Vec<Param>> {
        validate::identifier("object_id", object_id.as_str())?;
        validate::identifier("fencing_token", f.as_str())?;
        validate::identifier("lease_token", lease.as_str())?;
        Ok(vec![Param::Text(object_id.to_string()), Param::Text(f.to_string()), Param::Text(lease.to_string())])
    }
}

fn record_of(r: &rusqlite::Row<'_>) -> Result<DispatchRecord> {
    let dispatch: Option<String> = codec::col(r, "dispatch")?;
    let fields: Option<String> = codec::col(r, "fields")?;
    Ok(DispatchRecord {
        object_id: codec::col::<String>(r, "object_id")?.into(),
        business_status: codec::col(r, "business_status")?,
        dispatch: dispatch
            .map(|v| serde_json::from_str(&v).map_err(|e| codec::corrupt("workflow_dispatch", e)))
            .transpose()?,
        fields: match fields {
            Some(f) => serde_json::from_str(&f).map_err(|e| codec::corrupt("fields", e))?,
            None => Value::Object(Default::default()),
        },
    })
}

/// A trie of dotted field paths: a leaf is a bound value, a node merges into the object
/// already there (created when missing or not an object).
enum Node {
    Leaf(Value),
    Tree(BTreeMap<String, Node>),
}

fn insert_path(tree: &mut BTreeMap<String, Node>, path: &[String], v: Value, whole: &str) -> Result<()> {
    let conflict = || Error::invalid("fields", format_args!("`{whole}` conflicts with another path of the update"));
    match path {
        [] => Err(conflict()),
        [last] => match tree.insert(last.clone(), Node::Leaf(v)) {
            None => Ok(()),
            Some(_) => Err(conflict()),
        },
        [head, rest @ ..] => match tree.entry(head.clone()).or_insert_with(|| Node::Tree(BTreeMap::new())) {
            Node::Tree(sub) => insert_path(sub, rest, v, whole),
            Node::Leaf(_) => Err(conflict()),
        },
    }
}

/// `json_set(CASE WHEN <at> is an object THEN <at> ELSE '{}' END, '$."k"', child, …)` where
/// `at` is a path expression from the column (never a computed one), so the statement
/// grows linearly with the paths.
fn merge_sql(at: &str, tree: &BTreeMap<String, Node>, params: &mut Vec<Param>) -> String {
    let mut pairs = Vec::new();
    for (k, node) in tree {
        params.push(Param::Text(sqlite_json_path(&[k])));
        let key = format!("?{}", params.len());
        let child = match node {
            Node::Leaf(v) => {
                params.push(Param::Jsonb(v.clone()));
                format!("json(?{})", params.len())
            }
            Node::Tree(sub) => merge_sql(&format!("({at} -> {key})"), sub, params),
        };
        pairs.push(format!("{key}, {child}"));
    }
    format!("json_set(CASE WHEN json_type({at}) = 'object' THEN {at} ELSE '{{}}' END, {})", pairs.join(", "))
}

#[async_trait::async_trait]
impl DispatchOutbox for SqliteOutbox {
    async fn accept(
        &self,
        object_id: &ObjectId,
        fields: Value,
        initial_status: &str,
        intent: DispatchIntent,
    ) -> Result<AcceptOutcome> {
        OutboxAccept { object_id, fields: &fields, initial_status, intent: &intent }
            .validate(self.db.config().limits.payload_bytes_max)?;
        if let Value::Object(m) = &fields {
            if let Some(k) = m.keys().find(|k| self.table.reserved(k)) {
                return Err(Error::invalid("fields", format_args!("`{k}` is reserved for the outbox")));
            }
        }
        storable(D, "fields", &fields)?;
        let o = &self.table;
        let sql = format!(
            "INSERT INTO {} (\"{}\", \"{}\", \"{}\", \"{}\") VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT (\"{}\") DO NOTHING RETURNING 1",
            o.t(),
            o.id_column,
            o.status_column,
            o.fields_column,
            o.dispatch_column,
            o.id_column
        );
        let params = vec![
            text_of(D, "object_id", object_id.as_str())?,
            text_of(D, "initial_status", initial_status)?,
            Param::Jsonb(fields),
            self.intent_json(&intent)?,
        ];
        let stmt = Statement { sql, params };
        let inserted = self
            .db
            .call(Op::Write, "accept", move |c| Ok(!run(c, Op::Write, "accept", &stmt, |_| ())?.is_empty()))
            .await?;
        Ok(if inserted { AcceptOutcome::Accepted } else { AcceptOutcome::Exists })
    }

    async fn get(&self, object_id: &ObjectId) -> Result<Option<DispatchRecord>> {
        validate::identifier("object_id", object_id.as_str())?;
        let sql = format!("SELECT {} FROM {} WHERE \"{}\" = ?1", self.cols, self.table.t(), self.table.id_column);
        let stmt = Statement { sql, params: vec![Param::Text(object_id.to_string())] };
        let rows =
            self.db.call(Op::Read, "get object", move |c| run(c, Op::Read, "get object", &stmt, record_of)).await?;
        one(rows, "get object")?.transpose()
    }

    async fn confirm_dispatched(&self, object_id: &ObjectId, f: &FencingToken) -> Result<bool> {
        validate::identifier("object_id", object_id.as_str())?;
        validate::identifier("fencing_token", f.as_str())?;
        let set = format!("{d} = json_set({d}, '$.status', 'dispatched')", d = self.d());
        let params = vec![Param::Text(object_id.to_string()), Param::Text(f.to_string())];
        self.update("confirm dispatched", &set, &self.pending_cond(), params).await
    }

    async fn defer_pending(&self, object_id: &ObjectId, f: &FencingToken, at: Instant) -> Result<bool> {
        validate::identifier("object_id", object_id.as_str())?;
        validate::identifier("fencing_token", f.as_str())?;
        let set = format!("{d} = json_set({d}, '$.next_attempt_time', ?3)", d = self.d());
        let params = vec![Param::Text(object_id.to_string()), Param::Text(f.to_string()), Param::Int8(at.as_millis())];
        self.update("defer intent", &set, &self.pending_cond(), params).await
    }

    async fn try_lease(
        &self,
        object_id: &ObjectId,
        now: Instant,
        lease: &LeaseToken,
        until: Instant,
    ) -> Result<Option<DispatchRecord>> {
        validate::identifier("object_id", object_id.as_str())?;
        validate::identifier("lease_token", lease.as_str())?;
        let sql = format!(
            "UPDATE {t} SET {d} = json_set({d}, '$.status', 'processing', '$.lease_token', ?3, '$.lease_until', ?4) \
             WHERE \"{id}\" = ?1 AND {cond} RETURNING {cols}",
            t = self.table.t(),
            d = self.d(),
            id = self.table.id_column,
            cond = self.due_cond(2),
            cols = self.cols,
        );
        let params = vec![
            Param::Text(object_id.to_string()),
            Param::Int8(now.as_millis()),
            Param::Text(lease.to_string()),
            Param::Int8(until.as_millis()),
        ];
        let stmt = Statement { sql, params };
        let rows = self
            .db
            .call(Op::Write, "take dispatch lease", move |c| run(c, Op::Write, "take dispatch lease", &stmt, record_of))
            .await?;
        one(rows, "take dispatch lease")?.transpose()
    }

    async fn renew_lease(
        &self,
        object_id: &ObjectId,
        f: &FencingToken,
        lease: &LeaseToken,
        until: Instant,
    ) -> Result<bool> {
        let params = self.leased_params(object_id, f, lease)?;
        let set = format!("{d} = json_set({d}, '$.lease_until', ?4)", d = self.d());
        let params = [params, vec![Param::Int8(until.as_millis())]].concat();
        self.update("renew dispatch lease", &set, &self.leased_cond(), params).await
    }

    async fn confirm_leased(&self, object_id: &ObjectId, f: &FencingToken, lease: &LeaseToken) -> Result<bool> {
        let params = self.leased_params(object_id, f, lease)?;
        let set = format!(
            "{d} = json_set(json_remove({d}, '$.lease_token', '$.lease_until'), '$.status', 'dispatched')",
            d = self.d()
        );
        self.update("confirm leased intent", &set, &self.leased_cond(), params).await
    }

    async fn revert_leased(
        &self,
        object_id: &ObjectId,
        f: &FencingToken,
        lease: &LeaseToken,
        at: Instant,
    ) -> Result<bool> {
        let params = self.leased_params(object_id, f, lease)?;
        let set = format!(
            "{d} = json_set(json_remove({d}, '$.lease_token', '$.lease_until'), '$.status', 'pending', \
             '$.next_attempt_time', ?4)",
            d = self.d()
        );
        let params = [params, vec![Param::Int8(at.as_millis())]].concat();
        self.update("revert leased intent", &set, &self.leased_cond(), params).await
    }

    async fn scan_due(&self, now: Instant, after: Option<&ObjectId>, limit: usize) -> Result<Vec<(ObjectId, Instant)>> {
        if let Some(a) = after {
            validate::identifier("after", a.as_str())?;
        }
        let Some(limit) = self.db.page(limit) else { return Ok(vec![]) };
        let mut params = vec![Param::Int8(now.as_millis()), Param::Int8(limit)];
        let id = &self.table.id_column;
        let mut cond = self.due_cond(1);
        if let Some(a) = after {
            params.push(Param::Text(a.to_string()));
            cond.push_str(&format!(" AND \"{id}\" > ?3"));
        }
        let d = self.d();
        // Served by `<table>_dispatch_due`: only intents not yet dispatched are indexed.
        let sql = format!(
            "SELECT \"{id}\" AS object_id, CASE WHEN {d} ->> '$.status' = 'pending' \
             THEN {d} ->> '$.next_attempt_time' ELSE ?1 END AS due \
             FROM {} WHERE {cond} ORDER BY \"{id}\" LIMIT ?2",
            self.table.t()
        );
        let stmt = Statement { sql, params };
        let rows = self
            .db
            .call(Op::Read, "scan due intents", move |c| {
                run(c, Op::Read, "scan due intents", &stmt, |r| {
                    Ok((codec::col::<String>(r, "object_id")?.into(), Instant::from_millis(codec::col(r, "due")?)))
                })
            })
            .await?;
        rows.into_iter().collect()
    }

    async fn retry_failed(
        &self,
        object_id: &ObjectId,
        prev: &FencingToken,
        next: DispatchIntent,
        initial_status: &str,
    ) -> Result<bool> {
        validate::identifier("object_id", object_id.as_str())?;
        validate::identifier("fencing_token", prev.as_str())?;
        validate::identifier("initial_status", initial_status)?;
        let o = &self.table;
        let set = format!(
            "\"{st}\" = ?4, {d} = ?5, \"{f}\" = json_remove(\"{f}\", ?6)",
            st = o.status_column,
            d = self.d(),
            f = o.fields_column
        );
        let cond = format!("\"{}\" = ?3 AND {} ->> '$.fencing_token' = ?2", o.status_column, self.d());
        let params = vec![
            Param::Text(object_id.to_string()),
            Param::Text(prev.to_string()),
            Param::Text(o.failed_status.clone()),
            Param::Text(initial_status.to_string()),
            self.intent_json(&next)?,
            Param::Text(sqlite_json_path(&path_of("error_field", &o.error_field)?)),
        ];
        self.update("install new round", &set, &cond, params).await
    }

    async fn fenced_update(
        &self,
        object_id: &ObjectId,
        f: &FencingToken,
        fields: Value,
        status: Option<&str>,
    ) -> Result<bool> {
        validate::identifier("object_id", object_id.as_str())?;
        validate::identifier("fencing_token", f.as_str())?;
        let Value::Object(m) = fields else { return Err(Error::invalid("fields", "must be a JSON object")) };
        let mut tree = BTreeMap::new();
        for (k, v) in m {
            let path = path_of("fields", &k)?;
            if self.table.reserved(&path[0]) {
                return Err(Error::invalid("fields", format_args!("`{k}` is not a business field")));
            }
            validate::payload("fields", &v, self.db.config().limits.payload_bytes_max)?;
            storable(D, "fields", &v)?;
            insert_path(&mut tree, &path, v, &k)?;
        }
        let mut params = vec![Param::Text(object_id.to_string()), Param::Text(f.to_string())];
        let mut sets = Vec::new();
        if !tree.is_empty() {
            let col = format!("\"{}\"", self.table.fields_column);
            sets.push(format!("{col} = {}", merge_sql(&col, &tree, &mut params)));
        }
        if let Some(s) = status {
            validate::identifier("business_status", s)?;
            params.push(text_of(D, "business_status", s)?);
            sets.push(format!("\"{}\" = ?{}", self.table.status_column, params.len()));
        }
        if sets.is_empty() {
            return Ok(false);
        }
        let cond = format!("{} ->> '$.fencing_token' = ?2", self.d());
        self.update("fenced business write", &sets.join(", "), &cond, params).await
    }

    async fn try_lock(&self, name: &str, holder: &str, now: Instant, until: Instant) -> Result<bool> {
        validate::identifier("lock name", name)?;
        validate::identifier("lock holder", holder)?;
        let l = self.table.locks();
        let sql = format!(
            "INSERT INTO {l} (name, holder, until) VALUES (?1, ?2, ?3) \
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, until = excluded.until \
             WHERE {l}.holder = excluded.holder OR {l}.until <= ?4 RETURNING 1"
        );
        let params = vec![
            Param::Text(name.to_string()),
            Param::Text(holder.to_string()),
            Param::Int8(until.as_millis()),
            Param::Int8(now.as_millis()),
        ];
        let stmt = Statement { sql, params };
        self.db
            .call(Op::Write, "take scan lock", move |c| {
                Ok(!run(c, Op::Write, "take scan lock", &stmt, |_| ())?.is_empty())
            })
            .await
    }
}
