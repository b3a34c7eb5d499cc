use crate::error::Op;
use crate::protocol::{table, Param, Statement};
use crate::{codec, Db, Pool, PostgresConfig, TASK_INBOX};
use kernel_core::domain::Instant;
use kernel_core::ports::*;
use kernel_core::{validate, Error, Result};
use sql_protocol::{check_size, jsonb, task_params, Dialect};

pub use sql_protocol::TASK_COLUMNS;

/// [`TaskInbox`] on the `task_inbox` table (K-17.5, migration 8).
///
/// Row: `(id PK, workflow_id, workflow_type, step, level bigint, title, assignee,
/// roles text[], evidence jsonb, token, created_at bigint, due_at bigint,
/// status 'open' | 'decided' | 'closed', decision jsonb, closed_at bigint)`, plus
/// `decided_at` and `sensitive_text`, generated from the decision; `evidence` and
/// `decision` hold the kernel types' serde form. `list_open` filters in SQL (`status =
/// 'open' AND (assignee = $actor OR roles && $roles) AND id > $after ORDER BY id LIMIT n`,
/// through the index on `(status, id)`). Every write is one autocommit statement: `open`
/// an `INSERT … ON CONFLICT (id) DO NOTHING` (then a read on a conflict), `decide` (after
/// a read that applies [`task_decision_refused`]) an `UPDATE … WHERE id = $1 AND status =
/// 'open' AND token = $2 AND due_at > $decided_at` (then a read on a miss), `close` an `UPDATE … WHERE id = $1 AND
/// status <> 'closed' RETURNING decision` (the decision is never changed by the close, so
/// the returned one is the one the record carried when it was closed), each purge one
/// bounded statement through its partial index. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PostgresTaskInbox {
    db: Db,
}

impl PostgresTaskInbox {
    /// The human tasks on `pool`, in the schema of `config` (run [`migrate`](crate::migrate)
    /// first). No round trip is made.
    pub fn new(pool: Pool, config: PostgresConfig) -> Result<Self> {
        Ok(PostgresTaskInbox { db: Db::new(pool, config)? })
    }

    fn t(&self) -> String {
        table(self.db.schema(), TASK_INBOX)
    }

    async fn read(&self, id: &str) -> Result<Option<TaskRecord>> {
        let stmt = Statement {
            sql: format!("SELECT {TASK_COLUMNS} FROM {} WHERE id = $1::text", self.t()),
            params: vec![Param::Text(id.to_string())],
        };
        self.db.query_opt(Op::Read, "read task", &stmt).await?.as_ref().map(codec::task).transpose()
    }

    /// A bounded `UPDATE` or `DELETE` of the candidates `select` picks (`$1` before, `$2`
    /// the limit), counted.
    async fn purge(&self, what: &str, select: &str, write: &str, before: Instant, limit: usize) -> Result<u64> {
        // The candidates are selected once (a materialized CTE: an `IN (… LIMIT n)`
        // subquery may be re-run per row and change more than `n`); rows another purge
        // holds are skipped, and the write itself checks its condition again.
        let stmt = Statement {
            sql: format!(
                "WITH c AS MATERIALIZED ({select} LIMIT $2::bigint FOR UPDATE SKIP LOCKED), \
                 w AS ({write} RETURNING 1) SELECT count(*) AS n FROM w"
            ),
            params: vec![Param::Int8(before.as_millis()), Param::Int8(limit as i64)],
        };
        let row = self.db.query_opt(Op::Write, what, &stmt).await?;
        let n: i64 = row.as_ref().map_or(Ok(0), |r| codec::col(r, "n"))?;
        u64::try_from(n).map_err(|_| codec::corrupt("count", n))
    }
}

#[async_trait::async_trait]
impl TaskInbox for PostgresTaskInbox {
    async fn open(&self, task: &TaskRecord) -> Result<Option<TaskRecord>> {
        task.validate_new()?;
        let params = task_params(Dialect::Postgres, task)?;
        check_size("task", &params, &self.db.config.limits)?;
        let stmt = Statement {
            sql: format!(
                "INSERT INTO {} ({TASK_COLUMNS}) VALUES ($1::text, $2::text, $3::text, $4::text, $5::bigint, \
                 $6::text, $7::text, $8::text[], $9::jsonb, $10::text, $11::bigint, $12::bigint, 'open', NULL, NULL) \
                 ON CONFLICT (id) DO NOTHING RETURNING id",
                self.t()
            ),
            params,
        };
        // A conflict reads the record that has the id. Only a purge between the two can
        // leave nothing to read: the insert is tried once more.
        for _ in 0..2 {
            if self.db.query_opt(Op::Write, "open task", &stmt).await?.is_some() {
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
            cond = format!(" AND id > ${}::text", params.len());
        }
        // Served by `task_inbox_status_id`: the open range in id order, filtered by
        // eligibility, stopped at the limit.
        let stmt = Statement {
            sql: format!(
                "SELECT {TASK_COLUMNS} FROM {} WHERE status = 'open' AND (assignee = $2::text OR roles && \
                 $3::text[]){cond} ORDER BY id LIMIT $1::bigint",
                self.t()
            ),
            params,
        };
        self.db.query(Op::Read, "list open tasks", &stmt).await?.iter().map(codec::task).collect()
    }

    async fn decide(&self, id: &str, token: &str, actor: &Actor, decision: &TaskDecision) -> Result<TaskDecideOutcome> {
        validate_task_decide(id, token, actor, decision)?;
        let params = vec![
            Param::Text(id.to_string()),
            Param::Text(token.to_string()),
            jsonb(Dialect::Postgres, "decision", serde_json::to_value(decision))?,
            Param::Int8(decision.decided_at.as_millis()),
        ];
        check_size("decision", &params, &self.db.config.limits)?;
        if let Some(refused) = task_decision_refused(self.read(id).await?.as_ref(), token, actor, decision)? {
            return Ok(refused);
        }
        let stmt = Statement {
            sql: format!(
                "UPDATE {} SET status = 'decided', decision = $3::jsonb WHERE id = $1::text AND status = 'open' \
                 AND token = $2::text AND due_at > $4::bigint RETURNING id",
                self.t()
            ),
            params,
        };
        // A miss reads what is there and reports it by the same rule. A record is never
        // reopened, so the read finds it decided, closed or absent; only a record opened
        // again between the two (after a purge of the same id) can be open: the rule
        // decides again and the write is tried once more.
        for _ in 0..2 {
            if self.db.query_opt(Op::Write, "decide task", &stmt).await?.is_some() {
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
        // record carried when this statement closed it: a decide that committed first is
        // waited for and re-checked (the row is re-read under its lock), one that comes
        // after finds the task closed.
        let stmt = Statement {
            sql: format!(
                "UPDATE {} SET status = 'closed', closed_at = $2::bigint WHERE id = $1::text AND status <> 'closed' \
                 RETURNING decision",
                self.t()
            ),
            params: vec![Param::Text(id.to_string()), Param::Int8(now.as_millis())],
        };
        if let Some(row) = self.db.query_opt(Op::Write, "close task", &stmt).await? {
            return Ok(TaskCloseOutcome::Closed(codec::task_decision(&row)?));
        }
        // A miss: absent, or closed already (a record is never reopened).
        Ok(match self.read(id).await? {
            None => TaskCloseOutcome::NotFound,
            Some(_) => TaskCloseOutcome::AlreadyClosed,
        })
    }

    async fn purge_sensitive_reasons(&self, before: Instant, limit: usize) -> Result<u64> {
        validate_task_purge(limit)?;
        let t = self.t();
        // Served by `task_inbox_sensitive`; `sensitive_text` turns false with the text.
        self.purge(
            "purge sensitive task reasons",
            &format!("SELECT id FROM {t} WHERE sensitive_text AND decided_at < $1::bigint ORDER BY decided_at"),
            &format!(
                "UPDATE {t} t SET decision = t.decision #- '{{reason,text}}' FROM c WHERE t.id = c.id \
                 AND t.sensitive_text"
            ),
            before,
            limit,
        )
        .await
    }

    async fn purge_closed(&self, before: Instant, limit: usize) -> Result<u64> {
        validate_task_purge(limit)?;
        let t = self.t();
        // Served by `task_inbox_closed_at`.
        self.purge(
            "purge closed tasks",
            &format!("SELECT id FROM {t} WHERE status = 'closed' AND closed_at < $1::bigint ORDER BY closed_at"),
            &format!("DELETE FROM {t} t USING c WHERE t.id = c.id AND t.status = 'closed'"),
            before,
            limit,
        )
        .await
    }
}
