use crate::error::Op;
use crate::protocol::{Param, Statement};
use crate::store::one;
use crate::{codec, run, SqliteDb, DEAD_LETTERS};
use kernel_core::domain::Instant;
use kernel_core::ports::*;
use kernel_core::{validate, Error, Result};
use sql_protocol::{check_size, dead_letter_params, jsonb, Dialect};

pub use sql_protocol::DEAD_LETTER_COLUMNS;

/// [`DeadLetters`] on the `dead_letters` table (K-17.2, migration 4), in the same file and
/// connection pool as the other adapters of a [`SqliteDb`].
///
/// Row: `(id PK, workflow_id, workflow_type, step, step_index, run, epoch INTEGER,
/// error TEXT (JSON), inputs TEXT (JSON), created_at INTEGER,
/// status 'open' | 'decided' | 'closed', decision TEXT (JSON), closed_at INTEGER)`;
/// `error` and `decision` hold the kernel types' serde form. Every write is one autocommit
/// statement: `record` an `INSERT … ON CONFLICT (id) DO NOTHING`, `decide` an
/// `UPDATE … WHERE id = ?1 AND status = 'open' RETURNING id` (then a read on a miss),
/// `close` an `UPDATE … WHERE id = ?1 AND status = 'decided'`, `purge_closed` one bounded
/// `DELETE`. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SqliteDeadLetters {
    db: SqliteDb,
}

impl SqliteDeadLetters {
    /// The dead letters in `db`'s file (opened and migrated by [`SqliteDb::open`]).
    pub fn new(db: SqliteDb) -> Self {
        SqliteDeadLetters { db }
    }

    fn payload(&self, field: &str, v: &serde_json::Value) -> Result<()> {
        validate::payload(field, v, self.db.config().limits.payload_bytes_max)
    }

    async fn rows(&self, what: &'static str, stmt: Statement) -> Result<Vec<DeadLetter>> {
        self.db
            .call(Op::Read, what, move |c| run(c, Op::Read, what, &stmt, codec::dead_letter)?.into_iter().collect())
            .await
    }

    /// Run a write; how many rows it returned.
    async fn write(&self, what: &'static str, stmt: Statement) -> Result<usize> {
        self.db.call(Op::Write, what, move |c| Ok(run(c, Op::Write, what, &stmt, |_| ())?.len())).await
    }
}

#[async_trait::async_trait]
impl DeadLetters for SqliteDeadLetters {
    async fn record(&self, dl: &DeadLetter) -> Result<bool> {
        dl.validate_new()?;
        self.payload("inputs", &dl.inputs)?;
        let params = dead_letter_params(Dialect::Sqlite, dl)?;
        check_size("dead_letter", &params, &self.db.config().limits)?;
        let stmt = Statement {
            sql: format!(
                "INSERT INTO {DEAD_LETTERS} ({DEAD_LETTER_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, \
                 'open', NULL, NULL) ON CONFLICT (id) DO NOTHING RETURNING id"
            ),
            params,
        };
        Ok(self.write("record dead letter", stmt).await? == 1)
    }

    async fn get(&self, id: &str) -> Result<Option<DeadLetter>> {
        validate::identifier("id", id)?;
        let stmt = Statement {
            sql: format!("SELECT {DEAD_LETTER_COLUMNS} FROM {DEAD_LETTERS} WHERE id = ?1"),
            params: vec![Param::Text(id.to_string())],
        };
        one(self.rows("read dead letter", stmt).await?, "read dead letter")
    }

    async fn list(
        &self,
        status: Option<DeadLetterStatus>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>> {
        validate_dead_letter_list(after, limit)?;
        let mut params = vec![Param::Int8(limit as i64)];
        let mut cond = Vec::new();
        if let Some(s) = status {
            params.push(Param::Text(s.as_str().to_string()));
            cond.push(format!("status = ?{}", params.len()));
        }
        if let Some(a) = after {
            params.push(Param::Text(a.to_string()));
            cond.push(format!("id > ?{}", params.len()));
        }
        let cond = if cond.is_empty() { String::new() } else { format!(" WHERE {}", cond.join(" AND ")) };
        // Served by the primary key, or by `dead_letters_status_id` with a status.
        let sql = format!("SELECT {DEAD_LETTER_COLUMNS} FROM {DEAD_LETTERS}{cond} ORDER BY id LIMIT ?1");
        self.rows("list dead letters", Statement { sql, params }).await
    }

    async fn decide(&self, id: &str, decision: &DeadLetterDecision) -> Result<DecideOutcome> {
        validate::identifier("id", id)?;
        decision.validate()?;
        if let DeadLetterAction::Complete { output } = &decision.action {
            self.payload("decision.output", output)?;
        }
        let params =
            vec![Param::Text(id.to_string()), jsonb(Dialect::Sqlite, "decision", serde_json::to_value(decision))?];
        check_size("decision", &params, &self.db.config().limits)?;
        let stmt = Statement {
            sql: format!(
                "UPDATE {DEAD_LETTERS} SET status = 'decided', decision = ?2 WHERE id = ?1 AND status = 'open' \
                 RETURNING id"
            ),
            params,
        };
        // A miss reads what is there. A record is never reopened, so the read finds it
        // decided, closed or absent; only a record recorded between the two (after a
        // purge of the same id) can be open: the write is tried once more.
        for _ in 0..2 {
            if self.write("decide dead letter", stmt.clone()).await? == 1 {
                return Ok(DecideOutcome::Decided);
            }
            if let Some(outcome) = decide_missed(id, self.get(id).await?)? {
                return Ok(outcome);
            }
        }
        Err(Error::Conflict(format!("dead letter `{id}` changed twice while it was being decided; nothing written")))
    }

    async fn close(&self, id: &str, now: Instant) -> Result<bool> {
        validate::identifier("id", id)?;
        let stmt = Statement {
            sql: format!(
                "UPDATE {DEAD_LETTERS} SET status = 'closed', closed_at = ?2 WHERE id = ?1 AND status = 'decided' \
                 RETURNING id"
            ),
            params: vec![Param::Text(id.to_string()), Param::Int8(now.as_millis())],
        };
        Ok(self.write("close dead letter", stmt).await? == 1)
    }

    async fn purge_closed(&self, before: Instant, limit: usize) -> Result<u64> {
        validate_dead_letter_purge(limit)?;
        // The uncorrelated subquery runs once; served by `dead_letters_closed_at`.
        let stmt = Statement {
            sql: format!(
                "DELETE FROM {DEAD_LETTERS} WHERE id IN (SELECT id FROM {DEAD_LETTERS} WHERE status = 'closed' \
                 AND closed_at < ?1 ORDER BY closed_at LIMIT ?2) AND status = 'closed' RETURNING 1"
            ),
            params: vec![Param::Int8(before.as_millis()), Param::Int8(limit as i64)],
        };
        Ok(self.write("purge dead letters", stmt).await? as u64)
    }
}
