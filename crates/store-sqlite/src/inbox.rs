use crate::error::Op;
use crate::protocol::{Param, Statement};
use crate::store::one;
use crate::{codec, run, SqliteDb, INBOX};
use kernel_core::domain::Instant;
use kernel_core::ports::*;
use kernel_core::{validate, Error, Result, WorkflowId};
use sql_protocol::{text_of, Dialect};

/// Inbox columns in the order every `SELECT` reads them.
pub const INBOX_COLUMNS: &str =
    "signal_id, workflow_id, signal_type, wait_key, generation, status, created_at, match_time, orphan";

/// [`SignalInbox`] on the `signal_inbox` table (K-9.3, K-9.4).
///
/// Row: `(signal_id PK, workflow_id, signal_type, wait_key, generation INTEGER,
/// status 'pending' | 'matched', created_at, match_time, orphan 0 | 1)`. Every write is one
/// autocommit statement. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SqliteSignalInbox {
    db: SqliteDb,
}

fn status_str(s: SignalStatus) -> &'static str {
    match s {
        SignalStatus::Pending => "pending",
        SignalStatus::Matched => "matched",
    }
}

fn count(rows: Vec<Result<i64>>) -> Result<u64> {
    let n = one(rows, "count")?.transpose()?.unwrap_or(0);
    u64::try_from(n).map_err(|_| codec::corrupt("count", n))
}

impl SqliteSignalInbox {
    /// The inbox in `db`'s file (opened and migrated by [`SqliteDb::open`]).
    pub fn new(db: SqliteDb) -> Self {
        SqliteSignalInbox { db }
    }

    async fn records(&self, what: &'static str, stmt: Statement) -> Result<Vec<SignalRecord>> {
        self.db.call(Op::Read, what, move |c| run(c, Op::Read, what, &stmt, codec::signal)?.into_iter().collect()).await
    }

    /// A scan page, decoded row by row: a row that does not decode is reported under its
    /// `signal_id` (a non-null text primary key, so every row read is a cursor), never an
    /// error of the page.
    async fn scan(&self, what: &'static str, stmt: Statement) -> Result<SignalPage> {
        let rows = self
            .db
            .call(Op::Read, what, move |c| {
                run(c, Op::Read, what, &stmt, |r| (r.get::<_, String>("signal_id"), codec::signal(r)))
            })
            .await?;
        let mut page = SignalPage::default();
        for (id, decoded) in rows {
            match (decoded, id) {
                (Ok(record), _) => page.push(record),
                (Err(e), Ok(id)) => page.push_undecodable(id, e.to_string(), true),
                (Err(e), Err(_)) => page.push_undecodable("unreadable".to_string(), e.to_string(), false),
            }
        }
        Ok(page)
    }

    async fn write(&self, what: &'static str, stmt: Statement) -> Result<usize> {
        self.db.call(Op::Write, what, move |c| Ok(run(c, Op::Write, what, &stmt, |_| ())?.len())).await
    }

    async fn count(&self, op: Op, what: &'static str, stmt: Statement) -> Result<u64> {
        self.db.call(op, what, move |c| count(run(c, op, what, &stmt, |r| codec::col::<i64>(r, "n"))?)).await
    }

    fn page(&self, limit: usize) -> Option<Param> {
        self.db.page(limit).map(Param::Int8)
    }
}

#[async_trait::async_trait]
impl SignalInbox for SqliteSignalInbox {
    async fn insert(&self, record: SignalRecord) -> Result<InsertOutcome> {
        record.validate()?;
        let SignalRecord {
            signal_id,
            workflow_id,
            signal_type,
            wait_key,
            generation,
            status,
            created_at,
            match_time,
            orphan,
        } = &record;
        let generation = i64::try_from(*generation)
            .map_err(|_| Error::invalid("generation", format_args!("{generation} exceeds the 64-bit signed range")))?;
        let d = Dialect::Sqlite;
        let stmt = Statement {
            sql: format!(
                "INSERT INTO {INBOX} ({INBOX_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
                 ON CONFLICT (signal_id) DO NOTHING RETURNING signal_id"
            ),
            params: vec![
                text_of(d, "signal_id", signal_id)?,
                text_of(d, "workflow_id", workflow_id.as_str())?,
                text_of(d, "signal_type", signal_type)?,
                text_of(d, "wait_key", wait_key)?,
                Param::Int8(generation),
                Param::Text(status_str(*status).to_string()),
                Param::Int8(created_at.as_millis()),
                match match_time {
                    Some(t) => Param::Int8(t.as_millis()),
                    None => Param::NullInt8,
                },
                Param::Bool(*orphan),
            ],
        };
        let read = Statement {
            sql: format!("SELECT {INBOX_COLUMNS} FROM {INBOX} WHERE signal_id = ?1"),
            params: vec![Param::Text(signal_id.clone())],
        };
        // The insert and, on a conflict, the read of the stored record in one transaction:
        // retention cannot delete it in between.
        self.db
            .call(Op::Write, "insert signal", move |c| {
                let tx = c
                    .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                    .map_err(|e| crate::error::map(Op::Read, "insert signal: begin", e))?;
                let inserted = !run(&tx, Op::Write, "insert signal", &stmt, |_| ())?.is_empty();
                let outcome = if inserted {
                    InsertOutcome::Inserted
                } else {
                    match one(run(&tx, Op::Read, "read signal", &read, codec::signal)?, "read signal")? {
                        Some(existing) => InsertOutcome::Duplicate(existing?),
                        None => return Err(Error::corrupt("insert signal: a conflict without a stored record")),
                    }
                };
                tx.commit().map_err(|e| crate::error::map(Op::Write, "insert signal: commit", e))?;
                Ok(outcome)
            })
            .await
    }

    async fn get(&self, signal_id: &str) -> Result<Option<SignalRecord>> {
        validate::identifier("signal_id", signal_id)?;
        let stmt = Statement {
            sql: format!("SELECT {INBOX_COLUMNS} FROM {INBOX} WHERE signal_id = ?1"),
            params: vec![Param::Text(signal_id.to_string())],
        };
        one(self.records("read signal", stmt).await?, "read signal")
    }

    async fn find_pending(
        &self,
        workflow_id: &WorkflowId,
        signal_type: &str,
        wait_key: &str,
        generation: u64,
    ) -> Result<Option<SignalRecord>> {
        validate::identifier("workflow_id", workflow_id.as_str())?;
        validate::identifier("signal_type", signal_type)?;
        validate::identifier("wait_key", wait_key)?;
        let Ok(generation) = i64::try_from(generation) else { return Ok(None) };
        // Served by `signal_inbox_workflow`.
        let stmt = Statement {
            sql: format!(
                "SELECT {INBOX_COLUMNS} FROM {INBOX} WHERE workflow_id = ?1 AND status = 'pending' \
                 AND signal_type = ?2 AND wait_key = ?3 AND generation = ?4 ORDER BY created_at, signal_id LIMIT 1"
            ),
            params: vec![
                Param::Text(workflow_id.to_string()),
                Param::Text(signal_type.to_string()),
                Param::Text(wait_key.to_string()),
                Param::Int8(generation),
            ],
        };
        one(self.records("find pending signal", stmt).await?, "find pending signal")
    }

    async fn mark_matched(&self, signal_id: &str, now: Instant) -> Result<bool> {
        validate::identifier("signal_id", signal_id)?;
        let stmt = Statement {
            sql: format!(
                "UPDATE {INBOX} SET status = 'matched', match_time = ?2 \
                 WHERE signal_id = ?1 AND status = 'pending' RETURNING signal_id"
            ),
            params: vec![Param::Text(signal_id.to_string()), Param::Int8(now.as_millis())],
        };
        Ok(self.write("mark signal matched", stmt).await? > 0)
    }

    async fn scan_pending(&self, after: Option<&str>, limit: usize) -> Result<SignalPage> {
        if let Some(a) = after {
            validate::identifier("after", a)?;
        }
        let Some(limit) = self.page(limit) else { return Ok(SignalPage::default()) };
        let mut params = vec![limit];
        let mut cond = String::new();
        if let Some(a) = after {
            params.push(Param::Text(a.to_string()));
            cond.push_str(" AND signal_id > ?2");
        }
        // Served by `signal_inbox_pending`.
        let sql =
            format!("SELECT {INBOX_COLUMNS} FROM {INBOX} WHERE status = 'pending'{cond} ORDER BY signal_id LIMIT ?1");
        self.scan("scan pending signals", Statement { sql, params }).await
    }

    async fn scan_created_before(&self, before: Instant, after: Option<&str>, limit: usize) -> Result<SignalPage> {
        if let Some(a) = after {
            validate::identifier("after", a)?;
        }
        let Some(limit) = self.page(limit) else { return Ok(SignalPage::default()) };
        let mut params = vec![limit, Param::Int8(before.as_millis())];
        let mut cond = String::new();
        if let Some(a) = after {
            params.push(Param::Text(a.to_string()));
            cond.push_str(" AND signal_id > ?3");
        }
        let sql =
            format!("SELECT {INBOX_COLUMNS} FROM {INBOX} WHERE created_at < ?2{cond} ORDER BY signal_id LIMIT ?1");
        self.scan("scan old signals", Statement { sql, params }).await
    }

    async fn scan_workflow(
        &self,
        workflow_id: &WorkflowId,
        status: SignalStatus,
        limit: usize,
    ) -> Result<Vec<SignalRecord>> {
        validate::identifier("workflow_id", workflow_id.as_str())?;
        let Some(limit) = self.page(limit) else { return Ok(Vec::new()) };
        // Served by `signal_inbox_workflow`, read backwards.
        let sql = format!(
            "SELECT {INBOX_COLUMNS} FROM {INBOX} WHERE workflow_id = ?2 AND status = ?3 \
             ORDER BY created_at DESC, signal_id DESC LIMIT ?1"
        );
        let params = vec![limit, Param::Text(workflow_id.to_string()), Param::Text(status_str(status).to_string())];
        self.records("scan workflow signals", Statement { sql, params }).await
    }

    async fn delete_if(&self, signal_ids: &[String], status: SignalStatus) -> Result<u64> {
        validate_delete_ids(signal_ids)?;
        if signal_ids.is_empty() {
            return Ok(0);
        }
        let stmt = Statement {
            sql: format!(
                "DELETE FROM {INBOX} WHERE signal_id IN (SELECT value FROM json_each(?1)) AND status = ?2 \
                 RETURNING 1"
            ),
            params: vec![Param::TextArray(signal_ids.to_vec()), Param::Text(status_str(status).to_string())],
        };
        Ok(self.write("delete signals", stmt).await? as u64)
    }

    async fn count_pending_orphans(&self, workflow_id: Option<&WorkflowId>, limit: u64) -> Result<u64> {
        if let Some(w) = workflow_id {
            validate::identifier("workflow_id", w.as_str())?;
        }
        if limit == 0 {
            return Ok(0);
        }
        let mut params = vec![Param::Int8(i64::try_from(limit).unwrap_or(i64::MAX))];
        let mut cond = String::new();
        if let Some(w) = workflow_id {
            params.push(Param::Text(w.to_string()));
            cond.push_str(" AND workflow_id = ?2");
        }
        // Served by `signal_inbox_orphan`; the cost is bounded by `limit`.
        let stmt = Statement {
            sql: format!(
                "SELECT count(*) AS n FROM (SELECT 1 FROM {INBOX} WHERE orphan = 1 AND status = 'pending'{cond} \
                 LIMIT ?1)"
            ),
            params,
        };
        self.count(Op::Read, "count orphan signals", stmt).await
    }

    async fn clear_orphans(&self, workflow_id: &WorkflowId) -> Result<u64> {
        validate::identifier("workflow_id", workflow_id.as_str())?;
        let stmt = Statement {
            sql: format!("UPDATE {INBOX} SET orphan = 0 WHERE orphan = 1 AND workflow_id = ?1 RETURNING 1"),
            params: vec![Param::Text(workflow_id.to_string())],
        };
        Ok(self.write("clear orphan signals", stmt).await? as u64)
    }
}
