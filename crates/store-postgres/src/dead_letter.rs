use crate::error::Op;
use crate::{Db, Pool, PostgresConfig, DEAD_LETTERS, PG};
use kernel_core::domain::Instant;
use kernel_core::ports::*;
use kernel_core::{Error, Result};
use sql_protocol::{dead_letter, row};

pub use sql_protocol::DEAD_LETTER_COLUMNS;

/// [`DeadLetters`] on the `dead_letters` table (K-17.2, migration 7), its statements
/// rendered by [`sql_protocol::dead_letter`].
///
/// Row: `(id PK, workflow_id, workflow_type, step, step_index, run, epoch bigint,
/// error jsonb, inputs jsonb, created_at bigint, status 'open' | 'decided' | 'closed',
/// decision jsonb, closed_at bigint)`;
/// `error` and `decision` hold the kernel types' serde form. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PostgresDeadLetters {
    db: Db,
    t: String,
}

impl PostgresDeadLetters {
    /// The dead letters on `pool`, in the schema of `config` (run
    /// [`migrate`](crate::migrate) first). No round trip is made.
    pub fn new(pool: Pool, config: PostgresConfig) -> Result<Self> {
        let db = Db::new(pool, config)?;
        Ok(PostgresDeadLetters { t: format!("{}{DEAD_LETTERS}", db.prefix()), db })
    }
}

#[async_trait::async_trait]
impl DeadLetters for PostgresDeadLetters {
    async fn record(&self, dl: &DeadLetter) -> Result<bool> {
        let stmt = dead_letter::record(PG, &self.t, dl, &self.db.config.limits)?;
        Ok(self.db.write("record dead letter", stmt).await?)
    }

    async fn get(&self, id: &str) -> Result<Option<DeadLetter>> {
        self.db.row(Op::Read, "read dead letter", dead_letter::get(PG, &self.t, id)?, |r| row::dead_letter(r)).await
    }

    async fn list(
        &self,
        status: Option<DeadLetterStatus>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>> {
        let stmt = dead_letter::list(PG, &self.t, status, after, limit)?;
        self.db.rows(Op::Read, "list dead letters", stmt, |r| row::dead_letter(r)).await
    }

    async fn decide(&self, id: &str, decision: &DeadLetterDecision) -> Result<DecideOutcome> {
        let stmt = dead_letter::decide(PG, &self.t, id, decision, &self.db.config.limits)?;
        // A miss reads what is there. A record is never reopened, so the read finds it
        // decided, closed or absent; only a record recorded between the two (after a
        // purge of the same id) can be open: the write is tried once more.
        for _ in 0..2 {
            if self.db.write("decide dead letter", stmt.clone()).await? {
                return Ok(DecideOutcome::Decided);
            }
            if let Some(outcome) = decide_missed(id, self.get(id).await?)? {
                return Ok(outcome);
            }
        }
        Err(Error::Conflict(format!("dead letter `{id}` changed twice while it was being decided; nothing written")))
    }

    async fn close(&self, id: &str, now: Instant) -> Result<bool> {
        self.db.write("close dead letter", dead_letter::close(PG, &self.t, id, now)?).await
    }

    async fn purge_closed(&self, before: Instant, limit: usize) -> Result<u64> {
        self.db.count(Op::Write, "purge dead letters", dead_letter::purge_closed(PG, &self.t, before, limit)?).await
    }
}
