//! The dispatch outbox on the user's business table (K-11, K-12).
//!
//! The adapter knows only what it is told about the business table ([`OutboxTable`]): its
//! schema and name, the `text` primary-key column (default `object_id`), the business
//! status column (default `business_status`), the `jsonb` column holding the user's fields
//! (default `fields`), the `jsonb` column holding the intent (default `workflow_dispatch`,
//! in the serde form of [`DispatchIntent`]), the path inside the fields a new round
//! clears (default `previous_error`) and the failed status (default `failed`). Every write
//! is one autocommit statement (`d` is the intent column):
//!
//! | call | condition (besides the id) | assignment |
//! |---|---|---|
//! | accept | — (`INSERT … ON CONFLICT DO NOTHING`) | the whole row |
//! | confirm_dispatched | `d->>'fencing_token' = f AND d->>'status' = 'pending'` | `d.status = dispatched` |
//! | defer_pending | same | `d.next_attempt_time` |
//! | try_lease | `(pending AND next_attempt_time <= now) OR (processing AND lease_until < now)` | `d.status = processing, lease_token, lease_until` |
//! | renew_lease | `f, processing, d->>'lease_token' = l` | `d.lease_until` |
//! | confirm_leased | same | `d.status = dispatched`, lease removed |
//! | revert_leased | same | `d.status = pending, next_attempt_time`, lease removed |
//! | retry_failed | `status = failed AND d->>'fencing_token' = prev` | `status = initial, d = next, fields #- previous_error` |
//! | fenced_update | `d->>'fencing_token' = f` | `fields` merged with the given paths[, status] |
//!
//! The scan mutex lives in `<table>_locks`: one `INSERT … ON CONFLICT (name) DO UPDATE …
//! WHERE holder = $holder OR until <= $now RETURNING name`.

use crate::error::Op;
use crate::protocol::{storable_in_postgres, Param, Statement};
use crate::{codec, Db, Pool, PostgresConfig};
use kernel_core::domain::Instant;
use kernel_core::ports::*;
use kernel_core::{validate, Error, FencingToken, LeaseToken, ObjectId, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use tokio_postgres::Row;

/// Where the outbox lives in the user's business table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxTable {
    /// Schema of the business table.
    pub schema: String,
    /// The business table.
    pub table: String,
    /// Its `text` primary key.
    pub id_column: String,
    /// Its `text` business status column.
    pub status_column: String,
    /// Its `jsonb` column of the user's fields.
    pub fields_column: String,
    /// Its `jsonb` column holding the intent.
    pub dispatch_column: String,
    /// Path (dotted) inside the fields that a new round clears.
    pub error_field: String,
    /// Business status that allows a new round.
    pub failed_status: String,
}

impl Default for OutboxTable {
    fn default() -> Self {
        OutboxTable {
            schema: "public".into(),
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

/// The segments of a dotted field path, by the one K-2.0 rule of every store; they are
/// bound as a `text[]` path, never spliced.
fn path_of(field: &str, p: &str) -> Result<Vec<String>> {
    Ok(validate::field_path(field, p)?.into_iter().map(str::to_string).collect())
}

impl OutboxTable {
    fn validate(&self) -> Result<()> {
        for (field, name) in [
            ("schema", &self.schema),
            ("table", &self.table),
            ("id_column", &self.id_column),
            ("status_column", &self.status_column),
            ("fields_column", &self.fields_column),
            ("dispatch_column", &self.dispatch_column),
        ] {
            crate::schema_name(name)
                .map_err(|_| Error::invalid(field, format_args!("{name:?} is not a plain identifier")))?;
        }
        path_of("error_field", &self.error_field)?;
        validate::identifier("failed_status", &self.failed_status)
    }

    fn t(&self) -> String {
        format!("\"{}\".\"{}\"", self.schema, self.table)
    }

    fn locks(&self) -> String {
        format!("\"{}\".\"{}_locks\"", self.schema, self.table)
    }

    /// A user field name that would address the outbox's own columns.
    fn reserved(&self, head: &str) -> bool {
        [&self.id_column, &self.status_column, &self.dispatch_column, &self.fields_column].iter().any(|c| *c == head)
    }
}

/// [`DispatchOutbox`] on a PostgreSQL business table. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PostgresOutbox {
    db: Db,
    table: OutboxTable,
    cols: String,
}

impl PostgresOutbox {
    /// The outbox on `table` (checked), through `pool` with the deadlines and limits of
    /// `config`. No round trip is made; [`ensure_table`](Self::ensure_table) creates the
    /// table when the application does not own its DDL.
    pub fn new(pool: Pool, config: PostgresConfig, table: OutboxTable) -> Result<Self> {
        table.validate()?;
        let cols = format!(
            "\"{}\" AS object_id, \"{}\" AS business_status, \"{}\" AS fields, \"{}\" AS dispatch",
            table.id_column, table.status_column, table.fields_column, table.dispatch_column
        );
        Ok(PostgresOutbox { db: Db::new(pool, config)?, table, cols })
    }

    /// Create the business table (if absent), its lock table and the index of the
    /// recovery scan (due pending intents and expired leases, by id). Idempotent; a table
    /// the application created needs the four configured columns.
    pub async fn ensure_table(&self) -> Result<()> {
        let o = &self.table;
        let (id, st, f, d) = (&o.id_column, &o.status_column, &o.fields_column, &o.dispatch_column);
        let sql = format!(
            "CREATE SCHEMA IF NOT EXISTS \"{schema}\";
             CREATE TABLE IF NOT EXISTS {t} (\"{id}\" text COLLATE \"C\" PRIMARY KEY, \"{st}\" text, \
               \"{f}\" jsonb NOT NULL DEFAULT '{{}}', \"{d}\" jsonb);
             CREATE INDEX IF NOT EXISTS \"{table}_dispatch_due\" ON {t} (\"{id}\") \
               WHERE \"{d}\" ->> 'status' IN ('pending', 'processing');
             CREATE TABLE IF NOT EXISTS {locks} (name text COLLATE \"C\" PRIMARY KEY, holder text NOT NULL, \
               until bigint NOT NULL);",
            schema = o.schema,
            table = o.table,
            t = o.t(),
            locks = o.locks(),
        );
        let client = self.db.pool.get().await.map_err(|e| crate::error::before_send("outbox: connect", e))?;
        client.batch_execute(&sql).await.map_err(|e| crate::error::map(Op::Read, "outbox: create table", e))
    }

    fn d(&self) -> String {
        format!("\"{}\"", self.table.dispatch_column)
    }

    fn intent_json(&self, i: &DispatchIntent) -> Result<Param> {
        i.validate(self.db.config.limits.payload_bytes_max)?;
        let v = serde_json::to_value(i).map_err(|e| Error::invalid_with("workflow_dispatch", e.to_string(), e))?;
        storable_in_postgres("workflow_dispatch", &v)?;
        Ok(Param::Jsonb(v))
    }

    fn record_of(&self, r: &Row) -> Result<DispatchRecord> {
        let dispatch: Option<Value> = codec::col(r, "dispatch")?;
        Ok(DispatchRecord {
            object_id: codec::col::<String>(r, "object_id")?.into(),
            business_status: codec::col(r, "business_status")?,
            dispatch: dispatch
                .map(|v| serde_json::from_value(v).map_err(|e| codec::corrupt("workflow_dispatch", e)))
                .transpose()?,
            fields: codec::col::<Option<Value>>(r, "fields")?.unwrap_or_else(|| Value::Object(Default::default())),
        })
    }

    /// One conditional update of one object; `true` when it matched.
    async fn update(&self, what: &str, set: &str, cond: &str, params: Vec<Param>) -> Result<bool> {
        let sql = format!(
            "UPDATE {} SET {set} WHERE \"{}\" = $1::text AND {cond} RETURNING 1",
            self.table.t(),
            self.table.id_column
        );
        Ok(self.db.query_opt(Op::Write, what, &Statement { sql, params }).await?.is_some())
    }

    fn pending_cond(&self) -> String {
        let d = self.d();
        format!("{d} ->> 'fencing_token' = $2::text AND {d} ->> 'status' = 'pending'")
    }

    fn leased_cond(&self) -> String {
        let d = self.d();
        format!("{d} ->> 'fencing_token' = $2::text AND {d} ->> 'status' = 'processing' AND {d} ->> 'lease_token' = $3::text")
    }

    /// Due at `$n`: pending and due, or processing with an expired lease.
    fn due_cond(&self, n: usize) -> String {
        let d = self.d();
        format!(
            "{d} ->> 'status' IN ('pending', 'processing') AND \
             (({d} ->> 'status' = 'pending' AND ({d} ->> 'next_attempt_time')::bigint <= ${n}::bigint) OR \
              ({d} ->> 'status' = 'processing' AND ({d} ->> 'lease_until')::bigint < ${n}::bigint))"
        )
    }
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

/// `(CASE WHEN <at> is an object THEN <at> ELSE {} END) || jsonb_build_object(k, child, …)`
/// where `at` is a path expression from the column (never a computed one), so the
/// statement grows linearly with the paths.
fn merge_sql(at: &str, tree: &BTreeMap<String, Node>, params: &mut Vec<Param>) -> String {
    let mut pairs = Vec::new();
    for (k, node) in tree {
        params.push(Param::Text(k.clone()));
        let key = format!("${}::text", params.len());
        let child = match node {
            Node::Leaf(v) => {
                params.push(Param::Jsonb(v.clone()));
                format!("${}::jsonb", params.len())
            }
            Node::Tree(sub) => merge_sql(&format!("({at} -> {key})"), sub, params),
        };
        pairs.push(format!("{key}, {child}"));
    }
    format!(
        "(CASE WHEN jsonb_typeof({at}) = 'object' THEN {at} ELSE '{{}}'::jsonb END || jsonb_build_object({}))",
        pairs.join(", ")
    )
}

#[async_trait::async_trait]
impl DispatchOutbox for PostgresOutbox {
    async fn accept(
        &self,
        object_id: &ObjectId,
        fields: Value,
        initial_status: &str,
        intent: DispatchIntent,
    ) -> Result<AcceptOutcome> {
        OutboxAccept { object_id, fields: &fields, initial_status, intent: &intent }
            .validate(self.db.config.limits.payload_bytes_max)?;
        if let Value::Object(m) = &fields {
            if let Some(k) = m.keys().find(|k| self.table.reserved(k)) {
                return Err(Error::invalid("fields", format_args!("`{k}` is reserved for the outbox")));
            }
        }
        storable_in_postgres("fields", &fields)?;
        let o = &self.table;
        let sql = format!(
            "INSERT INTO {} (\"{}\", \"{}\", \"{}\", \"{}\") VALUES ($1::text, $2::text, $3::jsonb, $4::jsonb) \
             ON CONFLICT (\"{}\") DO NOTHING RETURNING 1",
            o.t(),
            o.id_column,
            o.status_column,
            o.fields_column,
            o.dispatch_column,
            o.id_column
        );
        let params = vec![
            Param::Text(object_id.to_string()),
            Param::Text(initial_status.to_string()),
            Param::Jsonb(fields),
            self.intent_json(&intent)?,
        ];
        match self.db.query_opt(Op::Write, "accept", &Statement { sql, params }).await? {
            Some(_) => Ok(AcceptOutcome::Accepted),
            None => Ok(AcceptOutcome::Exists),
        }
    }

    async fn get(&self, object_id: &ObjectId) -> Result<Option<DispatchRecord>> {
        validate::identifier("object_id", object_id.as_str())?;
        let sql = format!("SELECT {} FROM {} WHERE \"{}\" = $1::text", self.cols, self.table.t(), self.table.id_column);
        let stmt = Statement { sql, params: vec![Param::Text(object_id.to_string())] };
        self.db.query_opt(Op::Read, "get object", &stmt).await?.as_ref().map(|r| self.record_of(r)).transpose()
    }

    async fn confirm_dispatched(&self, object_id: &ObjectId, f: &FencingToken) -> Result<bool> {
        validate::identifier("object_id", object_id.as_str())?;
        validate::identifier("fencing_token", f.as_str())?;
        let set = format!("{d} = jsonb_set({d}, '{{status}}', '\"dispatched\"')", d = self.d());
        let params = vec![Param::Text(object_id.to_string()), Param::Text(f.to_string())];
        self.update("confirm dispatched", &set, &self.pending_cond(), params).await
    }

    async fn defer_pending(&self, object_id: &ObjectId, f: &FencingToken, at: Instant) -> Result<bool> {
        validate::identifier("object_id", object_id.as_str())?;
        validate::identifier("fencing_token", f.as_str())?;
        let set = format!("{d} = jsonb_set({d}, '{{next_attempt_time}}', to_jsonb($3::bigint))", d = self.d());
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
            "UPDATE {t} SET {d} = {d} || jsonb_build_object('status', 'processing', 'lease_token', $3::text, \
             'lease_until', $4::bigint) WHERE \"{id}\" = $1::text AND {cond} RETURNING {cols}",
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
        let row = self.db.query_opt(Op::Write, "take dispatch lease", &Statement { sql, params }).await?;
        row.as_ref().map(|r| self.record_of(r)).transpose()
    }

    async fn renew_lease(
        &self,
        object_id: &ObjectId,
        f: &FencingToken,
        lease: &LeaseToken,
        until: Instant,
    ) -> Result<bool> {
        let params = self.leased_params(object_id, f, lease)?;
        let set = format!("{d} = jsonb_set({d}, '{{lease_until}}', to_jsonb($4::bigint))", d = self.d());
        let params = [params, vec![Param::Int8(until.as_millis())]].concat();
        self.update("renew dispatch lease", &set, &self.leased_cond(), params).await
    }

    async fn confirm_leased(&self, object_id: &ObjectId, f: &FencingToken, lease: &LeaseToken) -> Result<bool> {
        let params = self.leased_params(object_id, f, lease)?;
        let set = format!(
            "{d} = ({d} - 'lease_token' - 'lease_until') || jsonb_build_object('status', 'dispatched')",
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
            "{d} = ({d} - 'lease_token' - 'lease_until') || \
             jsonb_build_object('status', 'pending', 'next_attempt_time', $4::bigint)",
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
            cond.push_str(&format!(" AND \"{id}\" > $3::text"));
        }
        let d = self.d();
        // Served by `<table>_dispatch_due`: only intents not yet dispatched are indexed.
        let sql = format!(
            "SELECT \"{id}\" AS object_id, CASE WHEN {d} ->> 'status' = 'pending' \
             THEN ({d} ->> 'next_attempt_time')::bigint ELSE $1::bigint END AS due \
             FROM {} WHERE {cond} ORDER BY \"{id}\" LIMIT $2::bigint",
            self.table.t()
        );
        let rows = self.db.query(Op::Read, "scan due intents", &Statement { sql, params }).await?;
        rows.iter()
            .map(|r| Ok((codec::col::<String>(r, "object_id")?.into(), Instant::from_millis(codec::col(r, "due")?))))
            .collect()
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
            "\"{st}\" = $4::text, {d} = $5::jsonb, \"{f}\" = \"{f}\" #- $6::text[]",
            st = o.status_column,
            d = self.d(),
            f = o.fields_column
        );
        let cond = format!("\"{}\" = $3::text AND {} ->> 'fencing_token' = $2::text", o.status_column, self.d());
        let params = vec![
            Param::Text(object_id.to_string()),
            Param::Text(prev.to_string()),
            Param::Text(o.failed_status.clone()),
            Param::Text(initial_status.to_string()),
            self.intent_json(&next)?,
            Param::TextArray(path_of("error_field", &o.error_field)?),
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
            validate::payload("fields", &v, self.db.config.limits.payload_bytes_max)?;
            storable_in_postgres("fields", &v)?;
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
            params.push(Param::Text(s.to_string()));
            sets.push(format!("\"{}\" = ${}::text", self.table.status_column, params.len()));
        }
        if sets.is_empty() {
            return Ok(false);
        }
        let cond = format!("{} ->> 'fencing_token' = $2::text", self.d());
        self.update("fenced business write", &sets.join(", "), &cond, params).await
    }

    async fn try_lock(&self, name: &str, holder: &str, now: Instant, until: Instant) -> Result<bool> {
        validate::identifier("lock name", name)?;
        validate::identifier("lock holder", holder)?;
        let l = self.table.locks();
        let sql = format!(
            "INSERT INTO {l} AS l (name, holder, until) VALUES ($1::text, $2::text, $3::bigint) \
             ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, until = EXCLUDED.until \
             WHERE l.holder = EXCLUDED.holder OR l.until <= $4::bigint RETURNING 1"
        );
        let params = vec![
            Param::Text(name.to_string()),
            Param::Text(holder.to_string()),
            Param::Int8(until.as_millis()),
            Param::Int8(now.as_millis()),
        ];
        Ok(self.db.query_opt(Op::Write, "take scan lock", &Statement { sql, params }).await?.is_some())
    }
}

impl PostgresOutbox {
    fn leased_params(&self, object_id: &ObjectId, f: &FencingToken, lease: &LeaseToken) -> Result<Vec<Param>> {
        validate::identifier("object_id", object_id.as_str())?;
        validate::identifier("fencing_token", f.as_str())?;
        validate::identifier("lease_token", lease.as_str())?;
        Ok(vec![Param::Text(object_id.to_string()), Param::Text(f.to_string()), Param::Text(lease.to_string())])
    }
}
