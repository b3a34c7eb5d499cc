use crate::error::Op;
use crate::protocol::{table, Param, Statement};
use crate::{codec, Db, Pool, PostgresConfig, DEAD_LETTERS};
use kernel_core::domain::Instant;
use kernel_core::ports::*;
use kernel_core::{validate, Error, Result};
use sql_protocol::{check_size, dead_letter_params, jsonb, Dialect};

pub use sql_protocol::DEAD_LETTER_COLUMNS;

/// [`DeadLetters`] on the `dead_letters` table (K-17.2, migration 7).
///
/// Row: `(id PK, workflow_id, workflow_type, step, step_index, run, epoch bigint,
/// error jsonb, inputs jsonb, created_at bigint, status 'open' | 'decided' | 'closed',
/// decision jsonb, closed_at bigint)`; `error` and `decision` hold the kernel types' serde
/// form. Every write is one autocommit statement: `record` an `INSERT … ON CONFLICT (id)
/// DO NOTHING`, `decide` an `UPDATE … WHERE id = $1 AND status = 'open' RETURNING id`
/// (then a read on a miss), `close` an `UPDATE … WHERE id = $1 AND status = 'decided'`,
/// `purge_closed` one bounded `DELETE` through the index on `closed_at`. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PostgresDeadLetters {
    db: Db,
}

impl PostgresDeadLetters {
    /// The dead letters on `pool`, in the schema of `config` (run
    /// [`migrate`](crate::migrate) first). No round trip is made.
    pub fn new(pool: Pool, config: PostgresConfig) -> Result<Self> {
        Ok(PostgresDeadLetters { db: Db::new(pool, config)? })
    }

    fn t(&self) -> String {
        table(self.db.schema(), DEAD_LETTERS)
    }

    fn payload(&self, field: &str, v: &serde_json::Value) -> Result<()> {
        validate::payload(field, v, self.db.config.limits.payload_bytes_max)
    }
}

#[async_trait::async_trait]
impl DeadLetters for PostgresDeadLetters {
    async fn record(&self, dl: &DeadLetter) -> Result<bool> {
        dl.validate_new()?;
        self.payload("inputs", &dl.inputs)?;
        let params = dead_letter_params(Dialect::Postgres, dl)?;
        check_size("dead_letter", &params, &self.db.config.limits)?;
        let stmt = Statement {
            sql: format!(
                "INSERT INTO {} ({DEAD_LETTER_COLUMNS}) VALUES ($1::text, $2::text, $3::text, $4::text, $5::bigint, \
                 $6::bigint, $7::bigint, $8::jsonb, $9::jsonb, $10::bigint, 'open', NULL, NULL) \
                 ON CONFLICT (id) DO NOTHING RETURNING id",
                self.t()
            ),
            params,
        };
        Ok(self.db.query_opt(Op::Write, "record dead letter", &stmt).await?.is_some())
    }

    async fn get(&self, id: &str) -> Result<Option<DeadLetter>> {
        validate::identifier("id", id)?;
        let stmt = Statement {
            sql: format!("SELECT {DEAD_LETTER_COLUMNS} FROM {} WHERE id = $1::text", self.t()),
            params: vec![Param::Text(id.to_string())],
        };
        self.db.query_opt(Op::Read, "read dead letter", &stmt).await?.as_ref().map(codec::dead_letter).transpose()
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
            cond.push(format!("status = ${}::text", params.len()));
        }
        if let Some(a) = after {
            params.push(Param::Text(a.to_string()));
            cond.push(format!("id > ${}::text", params.len()));
        }
        let cond = if cond.is_empty() { String::new() } else { format!(" WHERE {}", cond.join(" AND ")) };
        // Served by the primary key, or by `dead_letters_status_id` with a status.
        let stmt = Statement {
            sql: format!("SELECT {DEAD_LETTER_COLUMNS} FROM {}{cond} ORDER BY id LIMIT $1::bigint", self.t()),
            params,
        };
        self.db.query(Op::Read, "list dead letters", &stmt).await?.iter().map(codec::dead_letter).collect()
    }

    async fn decide(&self, id: &str, decision: &DeadLetterDecision) -> Result<DecideOutcome> {
        validate::identifier("id", id)?;
        decision.validate()?;
        if let DeadLetterAction::Complete { output } = &decision.action {
            self.payload("decision.output", output)?;
        }
        let params =
            vec![Param::Text(id.to_string()), jsonb(Dialect::Postgres, "decision", serde_json::to_value(decision))?];
        check_size("decision", &params, &self.db.config.limits)?;
        let stmt = Statement {
            sql: format!(
                "UPDATE {} SET status = 'decided', decision = $2::jsonb WHERE id = $1::text AND status = 'open' \
                 RETURNING id",
                self.t()
            ),
            params,
        };
        // A miss reads what is there. A record is never reopened, so the read finds it
        // decided, closed or absent; only a record recorded between the two (after a
        // purge of the same id) can be open: the write is tried once more.
        for _ in 0..2 {
            if self.db.query_opt(Op::Write, "decide dead letter", &stmt).await?.is_some() {
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
                "UPDATE {} SET status = 'closed', closed_at = $2::bigint WHERE id = $1::text AND status = 'decided' \
                 RETURNING id",
                self.t()
            ),
            params: vec![Param::Text(id.to_string()), Param::Int8(now.as_millis())],
        };
        Ok(self.db.query_opt(Op::Write, "close dead letter", &stmt).await?.is_some())
    }

    async fn purge_closed(&self, before: Instant, limit: usize) -> Result<u64> {
        validate_dead_letter_purge(limit)?;
        let t = self.t();
        // Served by `dead_letters_closed_at`. The candidates are selected once (a
        // materialized CTE: an `IN (… LIMIT n)` subquery may be re-run per row and delete
        // more than `n`); rows another purge holds are skipped, and the delete itself is
        // conditional on the status again.
        let stmt = Statement {
            sql: format!(
                "WITH c AS MATERIALIZED (SELECT id FROM {t} WHERE status = 'closed' AND closed_at < $1::bigint \
                 ORDER BY closed_at LIMIT $2::bigint FOR UPDATE SKIP LOCKED), \
                 d AS (DELETE FROM {t} t USING c WHERE t.id = c.id AND t.status = 'closed' RETURNING 1) \
                 SELECT count(*) AS n FROM d"
            ),
            params: vec![Param::Int8(before.as_millis()), Param::Int8(limit as i64)],
        };
        let row = self.db.query_opt(Op::Write, "purge dead letters", &stmt).await?;
        let n: i64 = row.as_ref().map_or(Ok(0), |r| codec::col(r, "n"))?;
        u64::try_from(n).map_err(|_| codec::corrupt("count", n))
    }
}
