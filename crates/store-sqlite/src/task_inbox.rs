use crate::error::Op;
use crate::{SqliteDb, D, TASK_INBOX};
use kernel_core::domain::Instant;
use kernel_core::ports::*;
use kernel_core::{Error, Result};
use sql_protocol::{row, task_inbox};

pub use sql_protocol::TASK_COLUMNS;

/// [`TaskInbox`] on the `task_inbox` table (K-17.5, migration 5), in the same file and
/// connection pool as the other adapters of a [`SqliteDb`], its statements rendered by
/// [`sql_protocol::task_inbox`].
///
/// Row: `(id PK, workflow_id, workflow_type, step, level INTEGER, title, assignee,
/// roles TEXT (JSON array), evidence TEXT (JSON), token, created_at INTEGER,
/// due_at INTEGER, status 'open' | 'decided' | 'closed', decision TEXT (JSON),
/// closed_at INTEGER)`, plus `decided_at` and `sensitive_text`, generated from the
/// decision. `open` reads the stored record on a conflict, `decide` applies
/// [`task_decision_refused`] before its write and after a miss; SQLite runs one writer at
/// a time. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SqliteTaskInbox {
    db: SqliteDb,
}

impl SqliteTaskInbox {
    /// The human tasks in `db`'s file (opened and migrated by [`SqliteDb::open`]).
    pub fn new(db: SqliteDb) -> Self {
        SqliteTaskInbox { db }
    }
}

#[async_trait::async_trait]
impl TaskInbox for SqliteTaskInbox {
    async fn open(&self, task: &TaskRecord) -> Result<Option<TaskRecord>> {
        let stmt = task_inbox::open(D, TASK_INBOX, task, &self.db.config().limits)?;
        // A conflict reads the record that has the id. Only a purge between the two can
        // leave nothing to read: the insert is tried once more.
        for _ in 0..2 {
            if self.db.write("open task", stmt.clone()).await? == 1 {
                return Ok(None);
            }
            if let Some(stored) = self.get(&task.id).await? {
                return Ok(Some(stored));
            }
        }
        Err(Error::Conflict(format!("task `{}` was purged twice while it was being opened; nothing written", task.id)))
    }

    async fn get(&self, id: &str) -> Result<Option<TaskRecord>> {
        self.db.row(Op::Read, "read task", task_inbox::get(D, TASK_INBOX, id)?, |r| row::task(r)).await
    }

    async fn list_open(&self, actor: &Actor, after: Option<&str>, limit: usize) -> Result<Vec<TaskRecord>> {
        let stmt = task_inbox::list_open(D, TASK_INBOX, actor, after, limit)?;
        self.db.rows(Op::Read, "list open tasks", stmt, |r| row::task(r)).await
    }

    async fn decide(&self, id: &str, token: &str, actor: &Actor, decision: &TaskDecision) -> Result<TaskDecideOutcome> {
        let stmt = task_inbox::decide(D, TASK_INBOX, id, token, actor, decision, &self.db.config().limits)?;
        if let Some(refused) = task_decision_refused(self.get(id).await?.as_ref(), token, actor, decision)? {
            return Ok(refused);
        }
        // A miss reads what is there and reports it by the same rule. A record is never
        // reopened, so the read finds it decided, closed or absent; only a record opened
        // again between the two (after a purge of the same id) can be open: the rule
        // decides again and the write is tried once more.
        for _ in 0..2 {
            if self.db.write("decide task", stmt.clone()).await? == 1 {
                return Ok(TaskDecideOutcome::Decided);
            }
            if let Some(refused) = task_decision_refused(self.get(id).await?.as_ref(), token, actor, decision)? {
                return Ok(refused);
            }
        }
        Err(Error::Conflict(format!("task `{id}` changed twice while it was being decided; nothing written")))
    }

    async fn close(&self, id: &str, now: Instant) -> Result<TaskCloseOutcome> {
        // The close leaves `decision` as it is, so `RETURNING decision` is the decision the
        // record carried when this statement closed it (SQLite runs one writer at a time).
        let stmt = task_inbox::close(D, TASK_INBOX, id, now)?;
        if let Some(decision) = self.db.row(Op::Write, "close task", stmt, |r| row::task_decision(r)).await? {
            return Ok(TaskCloseOutcome::Closed(decision));
        }
        // A miss: absent, or closed already (a record is never reopened).
        Ok(match self.get(id).await? {
            None => TaskCloseOutcome::NotFound,
            Some(_) => TaskCloseOutcome::AlreadyClosed,
        })
    }

    async fn purge_sensitive_reasons(&self, before: Instant, limit: usize) -> Result<u64> {
        let stmt = task_inbox::purge_sensitive_reasons(D, TASK_INBOX, before, limit)?;
        self.db.affected("purge sensitive task reasons", stmt).await
    }

    async fn purge_closed(&self, before: Instant, limit: usize) -> Result<u64> {
        self.db.affected("purge closed tasks", task_inbox::purge_closed(D, TASK_INBOX, before, limit)?).await
    }
}
