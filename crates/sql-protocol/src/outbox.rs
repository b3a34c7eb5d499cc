//! The dispatch outbox on the user's business table (K-11, K-12): every statement of
//! [`DispatchOutbox`](kernel_core::ports::DispatchOutbox), for both dialects, with the
//! checks every SQL outbox runs before anything is sent. `d` is the intent column:
//!
//! | call | condition (besides the id) | assignment |
//! |---|---|---|
//! | accept | — (`INSERT … ON CONFLICT DO NOTHING`) | the whole row |
//! | confirm_dispatched | `d.fencing_token = f AND d.status = 'pending'` | `d.status = dispatched` |
//! | defer_pending | same | `d.next_attempt_time` |
//! | try_lease | `(pending AND next_attempt_time <= now) OR (processing AND lease_until < now)` | `d.status = processing, lease_token, lease_until` |
//! | renew_lease | `f, processing, d.lease_token = l` | `d.lease_until` |
//! | confirm_leased | same | `d.status = dispatched`, lease removed |
//! | revert_leased | same | `d.status = pending, next_attempt_time`, lease removed |
//! | retry_failed | `status = failed AND d.fencing_token = prev` | `status = initial, d = next, the error path removed from the fields` |
//! | fenced_update | `d.fencing_token = f` | `fields` merged with the given paths[, status] |
//!
//! Field names are data (K-2.0 amendment): a dotted path is split by the one K-2.0 rule
//! ([`validate::field_path`]) and each segment is bound, as a key (PostgreSQL) or inside a
//! JSON path in which it is escaped ([`sqlite_json_path`]).
//!
//! The scan mutex lives in `<table>_locks`: one `INSERT … ON CONFLICT (name) DO UPDATE …
//! WHERE holder = $holder OR until <= $now RETURNING 1`.

use crate::{sqlite_json_path, storable, text_of, Binds, Dialect, Limits, Param, Statement};
use kernel_core::domain::Instant;
use kernel_core::ports::{DispatchIntent, OutboxAccept};
use kernel_core::{validate, Error, FencingToken, LeaseToken, ObjectId, Result};
use serde_json::Value;
use std::collections::BTreeMap;

/// A plain SQL identifier: 1–63 bytes of `[a-z0-9_]`, not starting with a digit (spliced
/// into statements, quoted, so it is checked instead of escaped).
pub fn plain_identifier(field: &str, name: &str) -> Result<()> {
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

/// The business table's columns, as the store's configuration names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxColumns<'a> {
    /// The `text` primary key.
    pub id: &'a str,
    /// The business status column.
    pub status: &'a str,
    /// The JSON column of the user's fields.
    pub fields: &'a str,
    /// The JSON column holding the intent.
    pub dispatch: &'a str,
    /// Path (dotted) inside the fields that a new round clears.
    pub error_field: &'a str,
    /// Business status that allows a new round.
    pub failed_status: &'a str,
}

/// The statements of one outbox table. Built once per adapter ([`OutboxSql::new`]
/// checks the names); every method checks its arguments, then renders one statement.
#[derive(Debug, Clone)]
pub struct OutboxSql {
    d: Dialect,
    limits: Limits,
    t: String,
    locks: String,
    id: String,
    status: String,
    fields: String,
    dispatch: String,
    error_field: Vec<String>,
    failed_status: String,
    cols: String,
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

/// The merge of `tree` into the object at `at` (created when missing or not an object),
/// where `at` is a path expression from the column (never a computed one), so the
/// statement grows linearly with the paths. PostgreSQL: `(CASE WHEN jsonb_typeof(at) =
/// 'object' THEN at ELSE '{}' END || jsonb_build_object(k, child, …))`; SQLite:
/// `json_set(CASE WHEN json_type(at) = 'object' THEN at ELSE '{}' END, '$."k"', child, …)`.
fn merge_sql(b: &mut Binds, at: &str, tree: &BTreeMap<String, Node>) -> String {
    let sqlite = b.dialect() == Dialect::Sqlite;
    let mut pairs = Vec::new();
    for (k, node) in tree {
        let key = b.bind(Param::Text(if sqlite { sqlite_json_path(&[k]) } else { k.clone() }));
        let child = match node {
            Node::Leaf(v) => {
                let v = b.bind(Param::Jsonb(v.clone()));
                if sqlite {
                    format!("json({v})")
                } else {
                    v
                }
            }
            Node::Tree(sub) => merge_sql(b, &format!("({at} -> {key})"), sub),
        };
        pairs.push(format!("{key}, {child}"));
    }
    if sqlite {
        format!("json_set(CASE WHEN json_type({at}) = 'object' THEN {at} ELSE '{{}}' END, {})", pairs.join(", "))
    } else {
        format!(
            "(CASE WHEN jsonb_typeof({at}) = 'object' THEN {at} ELSE '{{}}'::jsonb END || jsonb_build_object({}))",
            pairs.join(", ")
        )
    }
}

impl OutboxSql {
    /// The statements of the outbox in `table` with its lock table `locks` (both already
    /// qualified and quoted by the store); the column names are checked to be plain
    /// identifiers, the error path and the failed status by the K-2.0 rule.
    pub fn new(dialect: Dialect, limits: Limits, table: String, locks: String, c: &OutboxColumns<'_>) -> Result<Self> {
        for (field, name) in [
            ("id_column", c.id),
            ("status_column", c.status),
            ("fields_column", c.fields),
            ("dispatch_column", c.dispatch),
        ] {
            plain_identifier(field, name)?;
        }
        let error_field = path_of("error_field", c.error_field)?;
        validate::identifier("failed_status", c.failed_status)?;
        let cols = format!(
            "\"{}\" AS object_id, \"{}\" AS business_status, \"{}\" AS fields, \"{}\" AS dispatch",
            c.id, c.status, c.fields, c.dispatch
        );
        Ok(OutboxSql {
            d: dialect,
            limits,
            t: table,
            locks,
            id: c.id.to_string(),
            status: c.status.to_string(),
            fields: c.fields.to_string(),
            dispatch: format!("\"{}\"", c.dispatch),
            error_field,
            failed_status: c.failed_status.to_string(),
            cols,
        })
    }

    /// A user field name that would address the outbox's own columns.
    fn reserved(&self, head: &str) -> bool {
        [&self.id, &self.status, &self.fields].iter().any(|c| *c == head)
            || self.dispatch[1..self.dispatch.len() - 1] == *head
    }

    fn intent_json(&self, i: &DispatchIntent) -> Result<Param> {
        i.validate(self.limits.payload_bytes_max)?;
        let v = serde_json::to_value(i).map_err(|e| Error::invalid_with("workflow_dispatch", e.to_string(), e))?;
        storable(self.d, "workflow_dispatch", &v)?;
        Ok(Param::Jsonb(v))
    }

    fn ids(&self, object_id: &ObjectId, f: &FencingToken) -> Result<Binds> {
        validate::identifier("object_id", object_id.as_str())?;
        validate::identifier("fencing_token", f.as_str())?;
        let mut b = Binds::new(self.d);
        b.bind(text_of(self.d, "object_id", object_id.as_str())?);
        b.bind(text_of(self.d, "fencing_token", f.as_str())?);
        Ok(b)
    }

    fn leased(&self, object_id: &ObjectId, f: &FencingToken, lease: &LeaseToken) -> Result<Binds> {
        validate::identifier("lease_token", lease.as_str())?;
        let mut b = self.ids(object_id, f)?;
        b.bind(text_of(self.d, "lease_token", lease.as_str())?);
        Ok(b)
    }

    /// One conditional update of one object (`$1` its id), `RETURNING 1`.
    fn update(&self, b: Binds, set: &str, cond: &str) -> Statement {
        let id = match self.d {
            Dialect::Postgres => "$1::text",
            Dialect::Sqlite => "?1",
        };
        let sql = format!("UPDATE {} SET {set} WHERE \"{}\" = {id} AND {cond} RETURNING 1", self.t, self.id);
        b.statement(sql)
    }

    fn ph(&self, n: usize, p: &Param) -> String {
        match self.d {
            Dialect::Postgres => format!("${n}::{}", p.cast()),
            Dialect::Sqlite => format!("?{n}"),
        }
    }

    fn pending_cond(&self) -> String {
        let d = &self.dispatch;
        let f = self.ph(2, &Param::NullText);
        format!("{} = {f} AND {} = 'pending'", self.d.get_text(d, "fencing_token"), self.d.get_text(d, "status"))
    }

    fn leased_cond(&self) -> String {
        let d = &self.dispatch;
        let (f, l) = (self.ph(2, &Param::NullText), self.ph(3, &Param::NullText));
        format!(
            "{} = {f} AND {} = 'processing' AND {} = {l}",
            self.d.get_text(d, "fencing_token"),
            self.d.get_text(d, "status"),
            self.d.get_text(d, "lease_token")
        )
    }

    /// Due at `now`: pending and due, or processing with an expired lease.
    fn due_cond(&self, now: &str) -> String {
        let (d, x) = (&self.dispatch, self.d);
        let status = x.get_text(d, "status");
        format!(
            "{status} IN ('pending', 'processing') AND \
             (({status} = 'pending' AND {} <= {now}) OR ({status} = 'processing' AND {} < {now}))",
            x.get_int(d, "next_attempt_time"),
            x.get_int(d, "lease_until")
        )
    }

    /// `accept`: the whole row, `ON CONFLICT (id) DO NOTHING RETURNING 1` (no row: the
    /// object exists).
    pub fn accept(
        &self,
        object_id: &ObjectId,
        fields: Value,
        initial_status: &str,
        intent: &DispatchIntent,
    ) -> Result<Statement> {
        OutboxAccept { object_id, fields: &fields, initial_status, intent }.validate(self.limits.payload_bytes_max)?;
        if let Value::Object(m) = &fields {
            if let Some(k) = m.keys().find(|k| self.reserved(k)) {
                return Err(Error::invalid("fields", format_args!("`{k}` is reserved for the outbox")));
            }
        }
        storable(self.d, "fields", &fields)?;
        let mut b = Binds::new(self.d);
        let vals = [
            b.bind(text_of(self.d, "object_id", object_id.as_str())?),
            b.bind(text_of(self.d, "initial_status", initial_status)?),
            b.bind(Param::Jsonb(fields)),
            b.bind(self.intent_json(intent)?),
        ];
        let sql = format!(
            "INSERT INTO {} (\"{}\", \"{}\", \"{}\", {}) VALUES ({}) ON CONFLICT (\"{}\") DO NOTHING RETURNING 1",
            self.t,
            self.id,
            self.status,
            self.fields,
            self.dispatch,
            vals.join(", "),
            self.id
        );
        Ok(b.statement(sql))
    }

    /// `get`: the object's columns ([`row::dispatch_record`](crate::row::dispatch_record)).
    pub fn get(&self, object_id: &ObjectId) -> Result<Statement> {
        validate::identifier("object_id", object_id.as_str())?;
        let mut b = Binds::new(self.d);
        let id = b.bind(Param::Text(object_id.to_string()));
        let sql = format!("SELECT {} FROM {} WHERE \"{}\" = {id}", self.cols, self.t, self.id);
        Ok(b.statement(sql))
    }

    /// `confirm_dispatched`.
    pub fn confirm_dispatched(&self, object_id: &ObjectId, f: &FencingToken) -> Result<Statement> {
        let b = self.ids(object_id, f)?;
        let d = &self.dispatch;
        let set = format!("{d} = {}", self.d.json_set_str(d, "status", "dispatched"));
        Ok(self.update(b, &set, &self.pending_cond()))
    }

    /// `defer_pending`.
    pub fn defer_pending(&self, object_id: &ObjectId, f: &FencingToken, at: Instant) -> Result<Statement> {
        let mut b = self.ids(object_id, f)?;
        let at = b.bind(Param::Int8(at.as_millis()));
        let d = &self.dispatch;
        let set = format!("{d} = {}", self.d.json_set_int(d, "next_attempt_time", &at));
        Ok(self.update(b, &set, &self.pending_cond()))
    }

    /// `try_lease`: returns the object's columns when the lease is taken.
    pub fn try_lease(
        &self,
        object_id: &ObjectId,
        now: Instant,
        lease: &LeaseToken,
        until: Instant,
    ) -> Result<Statement> {
        validate::identifier("object_id", object_id.as_str())?;
        validate::identifier("lease_token", lease.as_str())?;
        let mut b = Binds::new(self.d);
        let id = b.bind(Param::Text(object_id.to_string()));
        let now = b.bind(Param::Int8(now.as_millis()));
        let l = b.bind(Param::Text(lease.to_string()));
        let until = b.bind(Param::Int8(until.as_millis()));
        let d = &self.dispatch;
        let set = self.d.json_merge(d, &[("status", "'processing'"), ("lease_token", &l), ("lease_until", &until)]);
        let sql = format!(
            "UPDATE {} SET {d} = {set} WHERE \"{}\" = {id} AND {} RETURNING {}",
            self.t,
            self.id,
            self.due_cond(&now),
            self.cols
        );
        Ok(b.statement(sql))
    }

    /// `renew_lease`.
    pub fn renew_lease(
        &self,
        object_id: &ObjectId,
        f: &FencingToken,
        lease: &LeaseToken,
        until: Instant,
    ) -> Result<Statement> {
        let mut b = self.leased(object_id, f, lease)?;
        let until = b.bind(Param::Int8(until.as_millis()));
        let d = &self.dispatch;
        let set = format!("{d} = {}", self.d.json_set_int(d, "lease_until", &until));
        Ok(self.update(b, &set, &self.leased_cond()))
    }

    /// `confirm_leased`.
    pub fn confirm_leased(&self, object_id: &ObjectId, f: &FencingToken, lease: &LeaseToken) -> Result<Statement> {
        let b = self.leased(object_id, f, lease)?;
        let d = &self.dispatch;
        let unleased = self.d.json_remove(d, &["lease_token", "lease_until"]);
        let set = format!("{d} = {}", self.d.json_merge(&unleased, &[("status", "'dispatched'")]));
        Ok(self.update(b, &set, &self.leased_cond()))
    }

    /// `revert_leased`.
    pub fn revert_leased(
        &self,
        object_id: &ObjectId,
        f: &FencingToken,
        lease: &LeaseToken,
        at: Instant,
    ) -> Result<Statement> {
        let mut b = self.leased(object_id, f, lease)?;
        let at = b.bind(Param::Int8(at.as_millis()));
        let d = &self.dispatch;
        let unleased = self.d.json_remove(d, &["lease_token", "lease_until"]);
        let set =
            format!("{d} = {}", self.d.json_merge(&unleased, &[("status", "'pending'"), ("next_attempt_time", &at)]));
        Ok(self.update(b, &set, &self.leased_cond()))
    }

    /// `scan_due`: `object_id` and `due` ([`row::due_object`](crate::row::due_object)) of
    /// the due intents after `after`, by id; `limit` already capped, `None` for an empty
    /// page (no statement). Served by `<table>_dispatch_due`: only intents not yet
    /// dispatched are indexed.
    pub fn scan_due(&self, now: Instant, after: Option<&ObjectId>, limit: Option<i64>) -> Result<Option<Statement>> {
        if let Some(a) = after {
            validate::identifier("after", a.as_str())?;
        }
        let Some(limit) = limit else { return Ok(None) };
        let mut b = Binds::new(self.d);
        let now = b.bind(Param::Int8(now.as_millis()));
        let limit = b.bind(Param::Int8(limit));
        let id = &self.id;
        let mut cond = self.due_cond(&now);
        if let Some(a) = after {
            cond.push_str(&format!(" AND \"{id}\" > {}", b.bind(Param::Text(a.to_string()))));
        }
        let d = &self.dispatch;
        let sql = format!(
            "SELECT \"{id}\" AS object_id, CASE WHEN {} = 'pending' THEN {} ELSE {now} END AS due \
             FROM {} WHERE {cond} ORDER BY \"{id}\" LIMIT {limit}",
            self.d.get_text(d, "status"),
            self.d.get_int(d, "next_attempt_time"),
            self.t
        );
        Ok(Some(b.statement(sql)))
    }

    /// `retry_failed`: a new round on a failed object of the round `prev`.
    pub fn retry_failed(
        &self,
        object_id: &ObjectId,
        prev: &FencingToken,
        next: &DispatchIntent,
        initial_status: &str,
    ) -> Result<Statement> {
        let mut b = self.ids(object_id, prev)?;
        validate::identifier("initial_status", initial_status)?;
        let failed = b.bind(Param::Text(self.failed_status.clone()));
        let initial = b.bind(Param::Text(initial_status.to_string()));
        let intent = b.bind(self.intent_json(next)?);
        let (st, f, d) = (&self.status, &self.fields, &self.dispatch);
        let cleared = match self.d {
            Dialect::Postgres => format!("\"{f}\" #- {}", b.bind(Param::TextArray(self.error_field.clone()))),
            Dialect::Sqlite => {
                format!("json_remove(\"{f}\", {})", b.bind(Param::Text(sqlite_json_path(&self.error_field))))
            }
        };
        let set = format!("\"{st}\" = {initial}, {d} = {intent}, \"{f}\" = {cleared}");
        let cond = format!(
            "\"{st}\" = {failed} AND {} = {}",
            self.d.get_text(d, "fencing_token"),
            self.ph(2, &Param::NullText)
        );
        Ok(self.update(b, &set, &cond))
    }

    /// `fenced_update`: `None` when there is nothing to write (no field, no status).
    pub fn fenced_update(
        &self,
        object_id: &ObjectId,
        f: &FencingToken,
        fields: Value,
        status: Option<&str>,
    ) -> Result<Option<Statement>> {
        let mut b = self.ids(object_id, f)?;
        let Value::Object(m) = fields else { return Err(Error::invalid("fields", "must be a JSON object")) };
        let mut tree = BTreeMap::new();
        for (k, v) in m {
            let path = path_of("fields", &k)?;
            if self.reserved(&path[0]) {
                return Err(Error::invalid("fields", format_args!("`{k}` is not a business field")));
            }
            validate::payload("fields", &v, self.limits.payload_bytes_max)?;
            storable(self.d, "fields", &v)?;
            insert_path(&mut tree, &path, v, &k)?;
        }
        let mut sets = Vec::new();
        if !tree.is_empty() {
            let col = format!("\"{}\"", self.fields);
            sets.push(format!("{col} = {}", merge_sql(&mut b, &col, &tree)));
        }
        if let Some(s) = status {
            validate::identifier("business_status", s)?;
            sets.push(format!("\"{}\" = {}", self.status, b.bind(text_of(self.d, "business_status", s)?)));
        }
        if sets.is_empty() {
            return Ok(None);
        }
        let cond = format!("{} = {}", self.d.get_text(&self.dispatch, "fencing_token"), self.ph(2, &Param::NullText));
        Ok(Some(self.update(b, &sets.join(", "), &cond)))
    }

    /// `try_lock`: the scan mutex, one upsert that takes a free or expired lock or renews
    /// the holder's own, `RETURNING 1` when held.
    pub fn try_lock(&self, name: &str, holder: &str, now: Instant, until: Instant) -> Result<Statement> {
        validate::identifier("lock name", name)?;
        validate::identifier("lock holder", holder)?;
        let mut b = Binds::new(self.d);
        let (n, h) = (b.bind(Param::Text(name.to_string())), b.bind(Param::Text(holder.to_string())));
        let until = b.bind(Param::Int8(until.as_millis()));
        let now = b.bind(Param::Int8(now.as_millis()));
        let sql = format!(
            "INSERT INTO {} AS l (name, holder, until) VALUES ({n}, {h}, {until}) \
             ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, until = EXCLUDED.until \
             WHERE l.holder = EXCLUDED.holder OR l.until <= {now} RETURNING 1",
            self.locks
        );
        Ok(b.statement(sql))
    }
}

/// The [`DispatchOutbox`](kernel_core::ports::DispatchOutbox) of a SQL store, written once:
/// `sql_protocol::dispatch_outbox!(MyOutbox, Op::Read, Op::Write)` implements the port for
/// `MyOutbox`, which has a field `sql: OutboxSql`, a method `async fn update(&self, what:
/// &'static str, stmt: Statement) -> Result<bool>` (one conditional write; `true` when it
/// matched) and a field `db` with `row`, `rows` (by `$read`/`$write` operation, statement
/// and row decoder) and `page` (the scan page of a requested limit). Every method renders
/// its statement with [`OutboxSql`] and decodes with [`row`](crate::row).
#[macro_export]
macro_rules! dispatch_outbox {
    ($outbox:ty, $read:expr, $write:expr) => {
        #[async_trait::async_trait]
        impl kernel_core::ports::DispatchOutbox for $outbox {
            async fn accept(
                &self,
                object_id: &kernel_core::ObjectId,
                fields: serde_json::Value,
                initial_status: &str,
                intent: kernel_core::ports::DispatchIntent,
            ) -> kernel_core::Result<kernel_core::ports::AcceptOutcome> {
                use kernel_core::ports::AcceptOutcome;
                let stmt = self.sql.accept(object_id, fields, initial_status, &intent)?;
                Ok(if self.update("accept", stmt).await? { AcceptOutcome::Accepted } else { AcceptOutcome::Exists })
            }

            async fn get(
                &self,
                object_id: &kernel_core::ObjectId,
            ) -> kernel_core::Result<Option<kernel_core::ports::DispatchRecord>> {
                let stmt = self.sql.get(object_id)?;
                self.db.row($read, "get object", stmt, |r| $crate::row::dispatch_record(r)).await
            }

            async fn confirm_dispatched(
                &self,
                object_id: &kernel_core::ObjectId,
                f: &kernel_core::FencingToken,
            ) -> kernel_core::Result<bool> {
                self.update("confirm dispatched", self.sql.confirm_dispatched(object_id, f)?).await
            }

            async fn defer_pending(
                &self,
                object_id: &kernel_core::ObjectId,
                f: &kernel_core::FencingToken,
                at: kernel_core::domain::Instant,
            ) -> kernel_core::Result<bool> {
                self.update("defer intent", self.sql.defer_pending(object_id, f, at)?).await
            }

            async fn try_lease(
                &self,
                object_id: &kernel_core::ObjectId,
                now: kernel_core::domain::Instant,
                lease: &kernel_core::LeaseToken,
                until: kernel_core::domain::Instant,
            ) -> kernel_core::Result<Option<kernel_core::ports::DispatchRecord>> {
                let stmt = self.sql.try_lease(object_id, now, lease, until)?;
                self.db.row($write, "take dispatch lease", stmt, |r| $crate::row::dispatch_record(r)).await
            }

            async fn renew_lease(
                &self,
                object_id: &kernel_core::ObjectId,
                f: &kernel_core::FencingToken,
                lease: &kernel_core::LeaseToken,
                until: kernel_core::domain::Instant,
            ) -> kernel_core::Result<bool> {
                self.update("renew dispatch lease", self.sql.renew_lease(object_id, f, lease, until)?).await
            }

            async fn confirm_leased(
                &self,
                object_id: &kernel_core::ObjectId,
                f: &kernel_core::FencingToken,
                lease: &kernel_core::LeaseToken,
            ) -> kernel_core::Result<bool> {
                self.update("confirm leased intent", self.sql.confirm_leased(object_id, f, lease)?).await
            }

            async fn revert_leased(
                &self,
                object_id: &kernel_core::ObjectId,
                f: &kernel_core::FencingToken,
                lease: &kernel_core::LeaseToken,
                at: kernel_core::domain::Instant,
            ) -> kernel_core::Result<bool> {
                self.update("revert leased intent", self.sql.revert_leased(object_id, f, lease, at)?).await
            }

            async fn scan_due(
                &self,
                now: kernel_core::domain::Instant,
                after: Option<&kernel_core::ObjectId>,
                limit: usize,
            ) -> kernel_core::Result<Vec<(kernel_core::ObjectId, kernel_core::domain::Instant)>> {
                let Some(stmt) = self.sql.scan_due(now, after, self.db.page(limit))? else { return Ok(vec![]) };
                self.db.rows($read, "scan due intents", stmt, |r| $crate::row::due_object(r)).await
            }

            async fn retry_failed(
                &self,
                object_id: &kernel_core::ObjectId,
                prev: &kernel_core::FencingToken,
                next: kernel_core::ports::DispatchIntent,
                initial_status: &str,
            ) -> kernel_core::Result<bool> {
                self.update("install new round", self.sql.retry_failed(object_id, prev, &next, initial_status)?).await
            }

            async fn fenced_update(
                &self,
                object_id: &kernel_core::ObjectId,
                f: &kernel_core::FencingToken,
                fields: serde_json::Value,
                status: Option<&str>,
            ) -> kernel_core::Result<bool> {
                match self.sql.fenced_update(object_id, f, fields, status)? {
                    Some(stmt) => self.update("fenced business write", stmt).await,
                    None => Ok(false),
                }
            }

            async fn try_lock(
                &self,
                name: &str,
                holder: &str,
                now: kernel_core::domain::Instant,
                until: kernel_core::domain::Instant,
            ) -> kernel_core::Result<bool> {
                self.update("take scan lock", self.sql.try_lock(name, holder, now, until)?).await
            }
        }
    };
}
