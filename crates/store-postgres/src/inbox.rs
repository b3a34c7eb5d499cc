use crate::error::Op;
use crate::protocol::{table, Param, Statement};
use crate::{codec, Db, Pool, PostgresConfig, INBOX};
use kernel_core::domain::Instant;
use kernel_core::ports::*;
use kernel_core::{validate, Error, Result, WorkflowId};

/// Inbox columns in the order every `SELECT` reads them.
pub const INBOX_COLUMNS: &str =
    "signal_id, workflow_id, signal_type, wait_key, generation, status, created_at, match_time, orphan";

/// [`SignalInbox`] on the `signal_inbox` table (K-9.3, K-9.4).
///
/// Row: `(signal_id PK, workflow_id, signal_type, wait_key, generation bigint,
/// status 'pending' | 'matched', created_at, match_time, orphan boolean)`. Every write is
/// one autocommit statement. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PostgresSignalInbox {
    db: Db,
}

fn status_str(s: SignalStatus) -> &'static str {
    match s {
        SignalStatus::Pending => "pending",
        SignalStatus::Matched => "matched",
    }
}

impl PostgresSignalInbox {
    /// The inbox on `pool`, in the schema of `config` (run [`migrate`](crate::migrate)
    /// first). No round trip is made.
    pub fn new(pool: Pool, config: PostgresConfig) -> Result<Self> {
        Ok(PostgresSignalInbox { db: Db::new(pool, config)? })
    }

    fn t(&self) -> String {
        table(self.db.schema(), INBOX)
    }

    async fn records(&self, what: &str, stmt: Statement) -> Result<Vec<SignalRecord>> {
        self.db.query(Op::Read, what, &stmt).await?.iter().map(codec::signal).collect()
    }

    /// A scan page, decoded row by row: a row that does not decode is reported under its
    /// `signal_id` (a non-null text primary key, so every row read is a cursor), never an
    /// error of the page.
    async fn scan(&self, what: &str, stmt: Statement) -> Result<SignalPage> {
        let mut page = SignalPage::default();
        for row in self.db.query(Op::Read, what, &stmt).await? {
            match (codec::signal(&row), row.try_get::<_, String>("signal_id")) {
                (Ok(record), _) => page.push(record),
                (Err(e), Ok(id)) => page.push_undecodable(id, e.to_string(), true),
                (Err(e), Err(_)) => page.push_undecodable("unreadable".to_string(), e.to_string(), false),
            }
        }
        Ok(page)
    }

    fn page(&self, limit: usize) -> Option<Param> {
        self.db.page(limit).map(Param::Int8)
    }
}

#[async_trait::async_trait]
impl SignalInbox for PostgresSignalInbox {
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
        let stmt = Statement {
            sql: format!(
                "INSERT INTO {} ({INBOX_COLUMNS}) VALUES ($1::text, $2::text, $3::text, $4::text, $5::bigint, \
                 $6::text, $7::bigint, $8::bigint, $9::bool) ON CONFLICT (signal_id) DO NOTHING RETURNING signal_id",
                self.t()
            ),
            params: vec![
                Param::Text(signal_id.clone()),
                Param::Text(workflow_id.to_string()),
                Param::Text(signal_type.clone()),
                Param::Text(wait_key.clone()),
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
        // A conflict whose record is gone by the read (retention deleted it in between)
        // wrote nothing (`DO NOTHING`): the insert is tried once more.
        for _ in 0..2 {
            if self.db.query_opt(Op::Write, "insert signal", &stmt).await?.is_some() {
                return Ok(InsertOutcome::Inserted);
            }
            if let Some(existing) = self.get(signal_id).await? {
                return Ok(InsertOutcome::Duplicate(existing));
            }
        }
        Err(Error::unavailable(format!(
            "signal `{signal_id}` conflicted on insert twice but was deleted each time before it could be read; nothing written"
        )))
    }

    async fn get(&self, signal_id: &str) -> Result<Option<SignalRecord>> {
        validate::identifier("signal_id", signal_id)?;
        let stmt = Statement {
            sql: format!("SELECT {INBOX_COLUMNS} FROM {} WHERE signal_id = $1::text", self.t()),
            params: vec![Param::Text(signal_id.to_string())],
        };
        self.db.query_opt(Op::Read, "read signal", &stmt).await?.as_ref().map(codec::signal).transpose()
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
                "SELECT {INBOX_COLUMNS} FROM {} WHERE workflow_id = $1::text AND status = 'pending' \
                 AND signal_type = $2::text AND wait_key = $3::text AND generation = $4::bigint \
                 ORDER BY created_at, signal_id LIMIT 1",
                self.t()
            ),
            params: vec![
                Param::Text(workflow_id.to_string()),
                Param::Text(signal_type.to_string()),
                Param::Text(wait_key.to_string()),
                Param::Int8(generation),
            ],
        };
        self.db.query_opt(Op::Read, "find pending signal", &stmt).await?.as_ref().map(codec::signal).transpose()
    }

    async fn mark_matched(&self, signal_id: &str, now: Instant) -> Result<bool> {
        validate::identifier("signal_id", signal_id)?;
        let stmt = Statement {
            sql: format!(
                "UPDATE {} SET status = 'matched', match_time = $2::bigint \
                 WHERE signal_id = $1::text AND status = 'pending' RETURNING signal_id",
                self.t()
            ),
            params: vec![Param::Text(signal_id.to_string()), Param::Int8(now.as_millis())],
        };
        Ok(self.db.query_opt(Op::Write, "mark signal matched", &stmt).await?.is_some())
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
            cond.push_str(" AND signal_id > $2::text");
        }
        // Served by `signal_inbox_pending`.
        let sql = format!(
            "SELECT {INBOX_COLUMNS} FROM {} WHERE status = 'pending'{cond} ORDER BY signal_id LIMIT $1::bigint",
            self.t()
        );
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
            cond.push_str(" AND signal_id > $3::text");
        }
        let sql = format!(
            "SELECT {INBOX_COLUMNS} FROM {} WHERE created_at < $2::bigint{cond} ORDER BY signal_id LIMIT $1::bigint",
            self.t()
        );
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
            "SELECT {INBOX_COLUMNS} FROM {} WHERE workflow_id = $2::text AND status = $3::text \
             ORDER BY created_at DESC, signal_id DESC LIMIT $1::bigint",
            self.t()
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
                "WITH d AS (DELETE FROM {} WHERE signal_id = ANY($1::text[]) AND status = $2::text RETURNING 1) \
                 SELECT count(*) AS n FROM d",
                self.t()
            ),
            params: vec![Param::TextArray(signal_ids.to_vec()), Param::Text(status_str(status).to_string())],
        };
        count(self.db.query_opt(Op::Write, "delete signals", &stmt).await?)
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
            cond.push_str(" AND workflow_id = $2::text");
        }
        // Served by `signal_inbox_orphan`; the cost is bounded by `limit`.
        let stmt = Statement {
            sql: format!(
                "SELECT count(*) AS n FROM (SELECT 1 FROM {} WHERE orphan AND status = 'pending'{cond} \
                 LIMIT $1::bigint) x",
                self.t()
            ),
            params,
        };
        count(self.db.query_opt(Op::Read, "count orphan signals", &stmt).await?)
    }

    async fn clear_orphans(&self, workflow_id: &WorkflowId) -> Result<u64> {
        validate::identifier("workflow_id", workflow_id.as_str())?;
        let stmt = Statement {
            sql: format!(
                "WITH c AS (UPDATE {} SET orphan = false WHERE orphan AND workflow_id = $1::text RETURNING 1) \
                 SELECT count(*) AS n FROM c",
                self.t()
            ),
            params: vec![Param::Text(workflow_id.to_string())],
        };
        count(self.db.query_opt(Op::Write, "clear orphan signals", &stmt).await?)
    }
}

fn count(row: Option<tokio_postgres::Row>) -> Result<u64> {
    let n: i64 = row.as_ref().map_or(Ok(0), |r| codec::col(r, "n"))?;
    u64::try_from(n).map_err(|_| codec::corrupt("count", n))
}
