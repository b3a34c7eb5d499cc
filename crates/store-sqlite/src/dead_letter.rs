use crate::error::Op;
use crate::{SqliteDb, D, DEAD_LETTERS};
use kernel_core::domain::Instant;
use kernel_core::ports::*;
use kernel_core::{Error, Result};
use sql_protocol::{dead_letter, row};

pub use sql_protocol::DEAD_LETTER_COLUMNS;

/// [`DeadLetters`] on the `dead_letters` table (K-17.2, migration 4), in the same file and
/// connection pool as the other adapters of a [`SqliteDb`], its statements rendered by
/// [`sql_protocol::dead_letter`].
///
/// Row: `(id PK, workflow_id, workflow_type, step, step_index, run, epoch INTEGER,
/// error TEXT (JSON), inputs TEXT (JSON), created_at INTEGER,
/// status 'open' | 'decided' | 'closed', decision TEXT (JSON), closed_at INTEGER)`;
/// `error` and `decision` hold the kernel types' serde form. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SqliteDeadLetters {
    db: SqliteDb,
}

impl SqliteDeadLetters {
    /// The dead letters in `db`'s file (opened and migrated by [`SqliteDb::open`]).
    pub fn new(db: SqliteDb) -> Self {
        SqliteDeadLetters { db }
    }
}

#[async_trait::async_trait]
impl DeadLetters for SqliteDeadLetters {
    async fn record(&self, dl: &DeadLetter) -> Result<bool> {
        let stmt = dead_letter::record(D, DEAD_LETTERS, dl, &self.db.config().limits)?;
        Ok(self.db.write("record dead letter", stmt).await? == 1)
    }

    async fn get(&self, id: &str) -> Result<Option<DeadLetter>> {
        self.db.row(Op::Read, "read dead letter", dead_letter::get(D, DEAD_LETTERS, id)?, |r| row::dead_letter(r)).await
    }

    async fn list(
        &self,
        status: Option<DeadLetterStatus>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>> {
        let stmt = dead_letter::list(D, DEAD_LETTERS, status, after, limit)?;
        self.db.rows(Op::Read, "list dead letters", stmt, |r| row::dead_letter(r)).await
    }

    async fn decide(&self, id: &str, decision: &DeadLetterDecision) -> Result<DecideOutcome> {
        let stmt = dead_letter::decide(D, DEAD_LETTERS, id, decision, &self.db.config().limits)?;
        // A miss reads what is there. A record is never reopened, so the read finds it
        // decided, closed or absent; only a record recorded between the two (after a
        // purge of the same id) can be open: the write is tried once more.
        for _ in 0..2 {
            if self.db.write("decide dead letter", stmt.clone()).await? == 1 {
                return Ok(DecideOutcome::Decided);
            }
            if let Some(outcome) = decide_missed(id, self.get(id).await?)? {
                return Ok(outcome);
            }
        }
        Err(Error::Conflict(format!("dead letter `{id}` changed twice while it was being decided; nothing written")))
    }

    async fn close(&self, id: &str, now: Instant) -> Result<bool> {
        Ok(self.db.write("close dead letter", dead_letter::close(D, DEAD_LETTERS, id, now)?).await? == 1)
    }

    async fn purge_closed(&self, before: Instant, limit: usize) -> Result<u64> {
        self.db.affected("purge dead letters", dead_letter::purge_closed(D, DEAD_LETTERS, before, limit)?).await
    }
}
