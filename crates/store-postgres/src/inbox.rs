use crate::error::Op;
use crate::{Db, Pool, PostgresConfig, INBOX, PG};
use kernel_core::domain::Instant;
use kernel_core::ports::*;
use kernel_core::{Error, Result, WorkflowId};
use sql_protocol::{inbox, row, Statement};

/// [`SignalInbox`] on the `signal_inbox` table (K-9.3, K-9.4), its statements rendered by
/// [`sql_protocol::inbox`].
///
/// Row: `(signal_id PK, workflow_id, signal_type, wait_key, generation bigint,
/// status 'pending' | 'matched', created_at, match_time, orphan boolean)`. Every write is
/// one autocommit statement. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PostgresSignalInbox {
    db: Db,
    t: String,
}

impl PostgresSignalInbox {
    /// The inbox on `pool`, in the schema of `config` (run [`migrate`](crate::migrate)
    /// first). No round trip is made.
    pub fn new(pool: Pool, config: PostgresConfig) -> Result<Self> {
        let db = Db::new(pool, config)?;
        Ok(PostgresSignalInbox { t: format!("{}{INBOX}", db.prefix()), db })
    }

    /// A scan page, decoded row by row ([`row::signal_page`]).
    async fn scan(&self, what: &'static str, stmt: Option<Statement>) -> Result<SignalPage> {
        let Some(stmt) = stmt else { return Ok(SignalPage::default()) };
        Ok(row::signal_page(self.db.rows(Op::Read, what, stmt, |r| row::scanned_signal(r)).await?))
    }
}

#[async_trait::async_trait]
impl SignalInbox for PostgresSignalInbox {
    async fn insert(&self, record: SignalRecord) -> Result<InsertOutcome> {
        let stmt = inbox::insert(PG, &self.t, &record)?;
        // A conflict whose record is gone by the read (retention deleted it in between)
        // wrote nothing (`DO NOTHING`): the insert is tried once more.
        for _ in 0..2 {
            if self.db.write("insert signal", stmt.clone()).await? {
                return Ok(InsertOutcome::Inserted);
            }
            if let Some(existing) = self.get(&record.signal_id).await? {
                return Ok(InsertOutcome::Duplicate(existing));
            }
        }
        Err(Error::unavailable(format!(
            "signal `{}` conflicted on insert twice but was deleted each time before it could be read; nothing written",
            record.signal_id
        )))
    }

    async fn get(&self, signal_id: &str) -> Result<Option<SignalRecord>> {
        self.db.row(Op::Read, "read signal", inbox::get(PG, &self.t, signal_id)?, |r| row::signal(r)).await
    }

    async fn find_pending(
        &self,
        workflow_id: &WorkflowId,
        signal_type: &str,
        wait_key: &str,
        generation: u64,
    ) -> Result<Option<SignalRecord>> {
        let Some(stmt) = inbox::find_pending(PG, &self.t, workflow_id, signal_type, wait_key, generation)? else {
            return Ok(None);
        };
        self.db.row(Op::Read, "find pending signal", stmt, |r| row::signal(r)).await
    }

    async fn mark_matched(&self, signal_id: &str, now: Instant) -> Result<bool> {
        self.db.write("mark signal matched", inbox::mark_matched(PG, &self.t, signal_id, now)?).await
    }

    async fn scan_pending(&self, after: Option<&str>, limit: usize) -> Result<SignalPage> {
        self.scan("scan pending signals", inbox::scan_pending(PG, &self.t, after, self.db.page(limit))?).await
    }

    async fn scan_created_before(&self, before: Instant, after: Option<&str>, limit: usize) -> Result<SignalPage> {
        let stmt = inbox::scan_created_before(PG, &self.t, before, after, self.db.page(limit))?;
        self.scan("scan old signals", stmt).await
    }

    async fn scan_workflow(
        &self,
        workflow_id: &WorkflowId,
        status: SignalStatus,
        limit: usize,
    ) -> Result<Vec<SignalRecord>> {
        let Some(stmt) = inbox::scan_workflow(PG, &self.t, workflow_id, status, self.db.page(limit))? else {
            return Ok(Vec::new());
        };
        self.db.rows(Op::Read, "scan workflow signals", stmt, |r| row::signal(r)).await
    }

    async fn delete_if(&self, signal_ids: &[String], status: SignalStatus) -> Result<u64> {
        let Some(stmt) = inbox::delete_if(PG, &self.t, signal_ids, status)? else { return Ok(0) };
        self.db.affected("delete signals", stmt).await
    }

    async fn count_pending_orphans(&self, workflow_id: Option<&WorkflowId>, limit: u64) -> Result<u64> {
        let Some(stmt) = inbox::count_pending_orphans(PG, &self.t, workflow_id, limit)? else { return Ok(0) };
        self.db.count(Op::Read, "count orphan signals", stmt).await
    }

    async fn clear_orphans(&self, workflow_id: &WorkflowId) -> Result<u64> {
        self.db.affected("clear orphan signals", inbox::clear_orphans(PG, &self.t, workflow_id)?).await
    }
}
