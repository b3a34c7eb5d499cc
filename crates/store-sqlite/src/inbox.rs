use crate::error::Op;
use crate::{codec, one, run, SqliteDb, D, INBOX};
use kernel_core::domain::Instant;
use kernel_core::ports::*;
use kernel_core::{Error, Result, WorkflowId};
use sql_protocol::{inbox, row, Statement};

/// [`SignalInbox`] on the `signal_inbox` table (K-9.3, K-9.4), its statements rendered by
/// [`sql_protocol::inbox`].
///
/// Row: `(signal_id PK, workflow_id, signal_type, wait_key, generation INTEGER,
/// status 'pending' | 'matched', created_at, match_time, orphan 0 | 1)`. Every write is one
/// autocommit statement. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SqliteSignalInbox {
    db: SqliteDb,
}

impl SqliteSignalInbox {
    /// The inbox in `db`'s file (opened and migrated by [`SqliteDb::open`]).
    pub fn new(db: SqliteDb) -> Self {
        SqliteSignalInbox { db }
    }

    /// A scan page, decoded row by row ([`row::signal_page`]).
    async fn scan(&self, what: &'static str, stmt: Option<Statement>) -> Result<SignalPage> {
        let Some(stmt) = stmt else { return Ok(SignalPage::default()) };
        Ok(row::signal_page(self.db.rows(Op::Read, what, stmt, |r| row::scanned_signal(r)).await?))
    }
}

#[async_trait::async_trait]
impl SignalInbox for SqliteSignalInbox {
    async fn insert(&self, record: SignalRecord) -> Result<InsertOutcome> {
        let stmt = inbox::insert(D, INBOX, &record)?;
        let read = inbox::get(D, INBOX, &record.signal_id)?;
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
                    let stored = run(&tx, Op::Read, "read signal", &read, |r| row::signal(&codec::R(r)))?;
                    match one(stored, "read signal")? {
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
        self.db.row(Op::Read, "read signal", inbox::get(D, INBOX, signal_id)?, |r| row::signal(r)).await
    }

    async fn find_pending(
        &self,
        workflow_id: &WorkflowId,
        signal_type: &str,
        wait_key: &str,
        generation: u64,
    ) -> Result<Option<SignalRecord>> {
        let Some(stmt) = inbox::find_pending(D, INBOX, workflow_id, signal_type, wait_key, generation)? else {
            return Ok(None);
        };
        self.db.row(Op::Read, "find pending signal", stmt, |r| row::signal(r)).await
    }

    async fn mark_matched(&self, signal_id: &str, now: Instant) -> Result<bool> {
        Ok(self.db.write("mark signal matched", inbox::mark_matched(D, INBOX, signal_id, now)?).await? > 0)
    }

    async fn scan_pending(&self, after: Option<&str>, limit: usize) -> Result<SignalPage> {
        self.scan("scan pending signals", inbox::scan_pending(D, INBOX, after, self.db.page(limit))?).await
    }

    async fn scan_created_before(&self, before: Instant, after: Option<&str>, limit: usize) -> Result<SignalPage> {
        let stmt = inbox::scan_created_before(D, INBOX, before, after, self.db.page(limit))?;
        self.scan("scan old signals", stmt).await
    }

    async fn scan_workflow(
        &self,
        workflow_id: &WorkflowId,
        status: SignalStatus,
        limit: usize,
    ) -> Result<Vec<SignalRecord>> {
        let Some(stmt) = inbox::scan_workflow(D, INBOX, workflow_id, status, self.db.page(limit))? else {
            return Ok(Vec::new());
        };
        self.db.rows(Op::Read, "scan workflow signals", stmt, |r| row::signal(r)).await
    }

    async fn delete_if(&self, signal_ids: &[String], status: SignalStatus) -> Result<u64> {
        let Some(stmt) = inbox::delete_if(D, INBOX, signal_ids, status)? else { return Ok(0) };
        self.db.affected("delete signals", stmt).await
    }

    async fn count_pending_orphans(&self, workflow_id: Option<&WorkflowId>, limit: u64) -> Result<u64> {
        let Some(stmt) = inbox::count_pending_orphans(D, INBOX, workflow_id, limit)? else { return Ok(0) };
        self.db.count(Op::Read, "count orphan signals", stmt).await
    }

    async fn clear_orphans(&self, workflow_id: &WorkflowId) -> Result<u64> {
        self.db.affected("clear orphan signals", inbox::clear_orphans(D, INBOX, workflow_id)?).await
    }
}
