use crate::error::Op;
use crate::protocol::{Param, Statement};
use crate::store::one;
use crate::{codec, run, SqliteDb, TASK_INBOX};
use kernel_core::domain::Instant;
use kernel_core::ports::*;
use kernel_core::{validate, Error, Result};
use sql_protocol::{check_size, jsonb, task_params, Dialect};

pub use sql_protocol::TASK_COLUMNS;

/// [`TaskInbox`] on the `task_inbox` table (K-17.5, migration 5), in the same file and
/// connection pool as the other adapters of a [`SqliteDb`].
///
/// Row: `(id PK, workflow_id, workflow_type, step, level INTEGER, title, assignee,
/// roles TEXT (JSON array), evidence TEXT (JSON), token, created_at INTEGER,
/// due_at INTEGER, status 'open' | 'decided' | 'closed', decision TEXT (JSON),
/// closed_at INTEGER)`, plus `decided_at` and `sensitive_text`, generated from the
/// decision; `evidence` and `decision` hold the kernel types' serde form. `list_open`
/// filters in SQL (`status = 'open' AND (assignee = ?actor OR a role of json_each(roles)
/// among the actor's) AND id > ?after ORDER BY id LIMIT n`, through the index on
/// `(status, id)`). Every write is one autocommit statement: `open` an `INSERT … ON
/// CONFLICT (id) DO NOTHING` (then a read on a conflict), `decide` (after a read that
/// applies [`task_decision_refused`]) an `UPDATE … WHERE id = ?1 AND status = 'open' AND
/// token = ?2 AND due_at > ?decided_at` (then a read on a miss), `close` an `UPDATE … WHERE id = ?1 AND status <>
/// 'closed' RETURNING decision` (the close never changes the decision, and SQLite runs one
/// writer at a time), each purge one bounded statement through its partial index. Cheap
/// to clone.
#[derive(Debug, Clone)]
pub struct SqliteTaskInbox {
    db: SqliteDb,
}

impl SqliteTaskInbox {
    /// The human tasks in `db`'s file (opened and migrated by [`SqliteDb::open`]).
    pub fn new(db: SqliteDb) -> Self {
        SqliteTaskInbox { db }
    }

    async fn rows(&self, what: &'static str, stmt: Statement) -> Result<Vec<TaskRecord>> {
        self.db.call(Op::Read, what, move |c| run(c, Op::Read, what, &stmt, codec::task)?.into_iter().collect()).await
    }

    async fn read(&self, id: &str) -> Result<Option<TaskRecord>> {
        let stmt = Statement {
            sql: format!("SELECT {TASK_COLUMNS} FROM {TASK_INBOX} WHERE id = ?1"),
            params: vec![Param::Text(id.to_string())],
        };
        one(self.rows("read task", stmt).await?, "read task")
    }

    /// Run a write; how many rows it returned.
    async fn write(&self, what: &'static str, stmt: Statement) -> Result<usize> {
        self.db.call(Op::Write, what, move |c| Ok(run(c, Op::Write, what, &stmt, |_| ())?.len())).await
    }
}

#[async_trait::async_trait]
impl TaskInbox for SqliteTaskInbox {
    async fn open(&self, task: &TaskRecord) -> Result<Option<TaskRecord>> {
        task.validate_new()?;
        let params = task_params(Dialect::Sqlite, task)?;
        check_size("task", &params, &self.db.config().limits)?;
        let stmt = Statement {
            sql: format!(
                "INSERT INTO {TASK_INBOX} ({TASK_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, \
                 'open', NULL, NULL) ON CONFLICT (id) DO NOTHING RETURNING id"
            ),
            params,
        };
        // A conflict reads the record that has the id. Only a purge between the two can
        // leave nothing to read: the insert is tried once more.
        for _ in 0..2 {
            if self.write("open task", stmt.clone()).await? == 1 {
                return Ok(None);
            }
            if let Some(stored) = self.read(&task.id).await? {
                return Ok(Some(stored));
            }
        }
        Err(Error::Conflict(format!("task `{}` was purged twice while it was being opened; nothing written", task.id)))
    }

    async fn get(&self, id: &str) -> Result<Option<TaskRecord>> {
        validate::identifier("id", id)?;
        self.read(id).await
    }

    async fn list_open(&self, actor: &Actor, after: Option<&str>, limit: usize) -> Result<Vec<TaskRecord>> {
        validate_task_list(actor, after, limit)?;
        let mut params =
            vec![Param::Int8(limit as i64), Param::Text(actor.id.clone()), Param::TextArray(actor.roles.clone())];
        let mut cond = String::new();
        if let Some(a) = after {
            params.push(Param::Text(a.to_string()));
            cond = format!(" AND id > ?{}", params.len());
        }
        // Served by `task_inbox_status_id`: the open range in id order, filtered by
        // eligibility, stopped at the limit.
        let sql = format!(
            "SELECT {TASK_COLUMNS} FROM {TASK_INBOX} WHERE status = 'open' AND (assignee = ?2 OR EXISTS \
             (SELECT 1 FROM json_each({TASK_INBOX}.roles) r WHERE r.value IN (SELECT value FROM json_each(?3)))){cond} \
             ORDER BY id LIMIT ?1"
        );
        self.rows("list open tasks", Statement { sql, params }).await
    }

    async fn decide(&self, id: &str, token: &str, actor: &Actor, decision: &TaskDecision) -> Result<TaskDecideOutcome> {
        validate_task_decide(id, token, actor, decision)?;
        let params = vec![
            Param::Text(id.to_string()),
            Param::Text(token.to_string()),
            jsonb(Dialect::Sqlite, "decision", serde_json::to_value(decision))?,
            Param::Int8(decision.decided_at.as_millis()),
        ];
        check_size("decision", &params, &self.db.config().limits)?;
        if let Some(refused) = task_decision_refused(self.read(id).await?.as_ref(), token, actor, decision)? {
            return Ok(refused);
        }
        let stmt = Statement {
            sql: format!(
                "UPDATE {TASK_INBOX} SET status = 'decided', decision = ?3 WHERE id = ?1 AND status = 'open' \
                 AND token = ?2 AND due_at > ?4 RETURNING id"
            ),
            params,
        };
        // A miss reads what is there and reports it by the same rule. A record is never
        // reopened, so the read finds it decided, closed or absent; only a record opened
        // again between the two (after a purge of the same id) can be open: the rule
        // decides again and the write is tried once more.
        for _ in 0..2 {
            if self.write("decide task", stmt.clone()).await? == 1 {
                return Ok(TaskDecideOutcome::Decided);
            }
            if let Some(refused) = task_decision_refused(self.read(id).await?.as_ref(), token, actor, decision)? {
                return Ok(refused);
            }
        }
        Err(Error::Conflict(format!("task `{id}` changed twice while it was being decided; nothing written")))
    }

    async fn close(&self, id: &str, now: Instant) -> Result<TaskCloseOutcome> {
        validate::identifier("id", id)?;
        // The close leaves `decision` as it is, so `RETURNING decision` is the decision the
        // record carried when this statement closed it (SQLite runs one writer at a time).
        let stmt = Statement {
            sql: format!(
                "UPDATE {TASK_INBOX} SET status = 'closed', closed_at = ?2 WHERE id = ?1 AND status <> 'closed' \
                 RETURNING decision"
            ),
            params: vec![Param::Text(id.to_string()), Param::Int8(now.as_millis())],
        };
        let what = "close task";
        let closed = self
            .db
            .call(Op::Write, what, move |c| run(c, Op::Write, what, &stmt, codec::task_decision)?.into_iter().collect())
            .await?;
        if let Some(decision) = one::<Option<TaskDecision>>(closed, what)? {
            return Ok(TaskCloseOutcome::Closed(decision));
        }
        // A miss: absent, or closed already (a record is never reopened).
        Ok(match self.read(id).await? {
            None => TaskCloseOutcome::NotFound,
            Some(_) => TaskCloseOutcome::AlreadyClosed,
        })
    }

    async fn purge_sensitive_reasons(&self, before: Instant, limit: usize) -> Result<u64> {
        validate_task_purge(limit)?;
        // The uncorrelated subquery runs once; served by `task_inbox_sensitive`, and
        // `sensitive_text` turns false with the text.
        let stmt = Statement {
            sql: format!(
                "UPDATE {TASK_INBOX} SET decision = json_remove(decision, '$.reason.text') WHERE id IN (SELECT id \
                 FROM {TASK_INBOX} WHERE sensitive_text AND decided_at < ?1 ORDER BY decided_at LIMIT ?2) \
                 AND sensitive_text RETURNING 1"
            ),
            params: vec![Param::Int8(before.as_millis()), Param::Int8(limit as i64)],
        };
        Ok(self.write("purge sensitive task reasons", stmt).await? as u64)
    }

    async fn purge_closed(&self, before: Instant, limit: usize) -> Result<u64> {
        validate_task_purge(limit)?;
        // The uncorrelated subquery runs once; served by `task_inbox_closed_at`.
        let stmt = Statement {
            sql: format!(
                "DELETE FROM {TASK_INBOX} WHERE id IN (SELECT id FROM {TASK_INBOX} WHERE status = 'closed' \
                 AND closed_at < ?1 ORDER BY closed_at LIMIT ?2) AND status = 'closed' RETURNING 1"
            ),
            params: vec![Param::Int8(before.as_millis()), Param::Int8(limit as i64)],
        };
        Ok(self.write("purge closed tasks", stmt).await? as u64)
    }
}
