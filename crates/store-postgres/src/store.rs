use crate::error::Op;
use crate::protocol::{self, table, ClaimSpecParts, Param, Statement, CLAIMABLE_SQL, INSTANCE_COLUMNS};
use crate::{codec, Db, Pool, PostgresConfig, INSTANCES};
use kernel_core::domain::*;
use kernel_core::ports::*;
use kernel_core::transition::{Guard, Transition};
use kernel_core::{validate, Error, Result, WorkflowId};
use tokio_postgres::Row;

/// [`WorkflowStore`] on the `workflow_instances` table.
///
/// Every write is one autocommit statement whose condition is `workflow_id = $1 AND
/// <guard>` (see [`protocol`](crate::protocol)). Cheap to clone (the pool is shared).
#[derive(Debug, Clone)]
pub struct PostgresWorkflowStore {
    db: Db,
}

impl PostgresWorkflowStore {
    /// The store on `pool`, in the schema of `config` (run [`migrate`](crate::migrate)
    /// first). No round trip is made.
    pub fn new(pool: Pool, config: PostgresConfig) -> Result<Self> {
        Ok(PostgresWorkflowStore { db: Db::new(pool, config)? })
    }

    /// The configuration in force.
    pub fn config(&self) -> &PostgresConfig {
        &self.db.config
    }

    /// Up to `limit` instances ordered by `workflow_id`, for inspection tools and tests.
    /// Not a port method: the engine never lists instances.
    pub async fn list(&self, limit: usize) -> Result<Vec<WorkflowInstance>> {
        let Some(limit) = self.db.page(limit) else { return Ok(vec![]) };
        let stmt = Statement {
            sql: format!(
                "SELECT {INSTANCE_COLUMNS} FROM {} ORDER BY workflow_id LIMIT $1::bigint",
                table(self.db.schema(), INSTANCES)
            ),
            params: vec![Param::Int8(limit)],
        };
        self.db.query(Op::Read, "list instances", &stmt).await?.iter().map(codec::instance).collect()
    }

    async fn find_one(&self, column: &str, value: &str) -> Result<Option<WorkflowInstance>> {
        let stmt = Statement {
            sql: format!(
                "SELECT {INSTANCE_COLUMNS} FROM {} WHERE {column} = $1::text",
                table(self.db.schema(), INSTANCES)
            ),
            params: vec![Param::Text(value.to_string())],
        };
        self.db.query_opt(Op::Read, "read instance", &stmt).await?.as_ref().map(codec::instance).transpose()
    }

    async fn claim_with(&self, workflow_id: Option<&str>, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        spec.validate()?;
        let (guard, transition) = (spec.guard(), spec.transition()?);
        let parts = ClaimSpecParts { guard: &guard, transition: &transition };
        let stmt = protocol::claim_statement(self.db.schema(), workflow_id, &parts, &self.db.config.limits)?;
        let row = self.db.query_opt(Op::Write, "claim", &stmt).await?;
        // The lease is written: name the instance, so the caller can skip it (quarantine).
        row.as_ref().map(|r| codec::instance(r).map_err(|e| e.of_instance(row_id(r)))).transpose()
    }
}

fn row_id(r: &Row) -> WorkflowId {
    r.try_get::<_, String>("workflow_id").map_or_else(|_| WorkflowId::from("unreadable"), WorkflowId::from)
}

#[async_trait::async_trait]
impl WorkflowStore for PostgresWorkflowStore {
    async fn create(&self, instance: WorkflowInstance) -> Result<CreateOutcome> {
        let stmt = protocol::insert_statement(self.db.schema(), &instance, &self.db.config.limits)?;
        if self.db.query_opt(Op::Write, "create", &stmt).await?.is_some() {
            return Ok(CreateOutcome::Created(instance));
        }
        // ON CONFLICT DO NOTHING waited for a concurrent inserter to commit, so the winner
        // is visible to this next statement (K-5).
        match self.find_one("biz_key", &instance.biz_key).await? {
            Some(existing) => Ok(CreateOutcome::Exists(existing)),
            None => {
                Err(Error::Conflict(format!("workflow_id `{}` exists under another biz_key", instance.workflow_id)))
            }
        }
    }

    async fn get(&self, workflow_id: &WorkflowId) -> Result<Option<WorkflowInstance>> {
        validate::identifier("workflow_id", workflow_id.as_str())?;
        self.find_one("workflow_id", workflow_id.as_str()).await
    }

    async fn get_by_biz_key(&self, biz_key: &str) -> Result<Option<WorkflowInstance>> {
        validate::identifier("biz_key", biz_key)?;
        self.find_one("biz_key", biz_key).await
    }

    async fn claim(&self, workflow_id: &WorkflowId, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        self.claim_with(Some(workflow_id.as_str()), spec).await
    }

    async fn claim_any(&self, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        self.claim_with(None, spec).await
    }

    async fn apply(&self, workflow_id: &WorkflowId, guard: &Guard, transition: &Transition) -> Result<WriteOutcome> {
        let (stmt, step_max) = protocol::apply_statement(
            self.db.schema(),
            workflow_id.as_str(),
            guard,
            transition,
            &self.db.config.limits,
        )?;
        if let Some(row) = self.db.query_opt(Op::Write, "apply", &stmt).await? {
            let r: i64 = codec::col(&row, "revision")?;
            let revision = u64::try_from(r).map_err(|_| codec::corrupt("revision", format_args!("{r} < 0")))?;
            return Ok(WriteOutcome::Applied { revision });
        }
        if let Some(max) = step_max {
            // Tell a bad step index apart from a lost guard; nothing was written either way.
            if let Some(inst) = self.get(workflow_id).await? {
                if guard.matches(&inst) && max as usize >= inst.steps.len() {
                    return Err(Error::invalid("transition.steps", "step index out of range"));
                }
            }
        }
        Ok(WriteOutcome::Missed)
    }

    async fn scan_due_waits(&self, now: Instant, after: Option<&DueCursor>, limit: usize) -> Result<ScanPage<DueWait>> {
        if let Some(a) = after {
            validate::identifier("after", a.workflow_id.as_str())?;
        }
        let Some(limit) = self.db.page(limit) else { return Ok(ScanPage::default()) };
        let stmt = due_waits_statement(self.db.schema(), now, after, limit);
        let rows = self.db.query(Op::Read, "scan due waits", &stmt).await?;
        let mut page = page_of(&rows, |r| {
            let w = codec::wait(r)?;
            Ok(DueWait {
                workflow_id: codec::col::<String>(r, "workflow_id")?.into(),
                step_index: w.step_index(),
                resume: w.due_resume(),
                priority: codec::priority_of(r)?,
            })
        });
        page.last_time = rows.last().and_then(|r| r.try_get::<_, i64>("claimable_time").ok()).map(Instant::from_millis);
        Ok(page)
    }

    async fn scan_claimable(&self, after: Option<&WorkflowId>, limit: usize) -> Result<ScanPage<Candidate>> {
        if let Some(a) = after {
            validate::identifier("after", a.as_str())?;
        }
        let Some(limit) = self.db.page(limit) else { return Ok(ScanPage::default()) };
        let stmt = claimable_statement(self.db.schema(), after.map(WorkflowId::as_str), limit);
        let rows = self.db.query(Op::Read, "scan claimable", &stmt).await?;
        Ok(page_of(&rows, |r| {
            Ok(Candidate {
                workflow_id: codec::col::<String>(r, "workflow_id")?.into(),
                priority: codec::priority_of(r)?,
                claimable_time: Instant::from_millis(codec::col::<i64>(r, "claimable_time")?),
            })
        }))
    }
}

/// The due-wait scan: waiting instances due at `now`, strictly after the cursor in
/// `(claimable_time, workflow_id)` order (served by `workflow_instances_due_wait`).
pub fn due_waits_statement(schema: &str, now: Instant, after: Option<&DueCursor>, limit: i64) -> Statement {
    let mut params = vec![Param::Int8(now.as_millis())];
    let mut sql = format!(
        "SELECT workflow_id, claimable_time, wait, business_priority FROM {} \
         WHERE status = 'waiting' AND claimable_time <= $1::bigint AND wait IS NOT NULL",
        table(schema, INSTANCES)
    );
    if let Some(a) = after {
        params.push(Param::Int8(a.claimable_time.as_millis()));
        params.push(Param::Text(a.workflow_id.to_string()));
        sql.push_str(" AND (claimable_time, workflow_id) > ($2::bigint, $3::text)");
    }
    params.push(Param::Int8(limit));
    sql.push_str(&format!(" ORDER BY claimable_time, workflow_id LIMIT ${}::bigint", params.len()));
    Statement { sql, params }
}

/// The rebuild scan: claimable instances with a `claimable_time`, strictly after `after` by
/// `workflow_id` (served by `workflow_instances_rebuild`).
pub fn claimable_statement(schema: &str, after: Option<&str>, limit: i64) -> Statement {
    let mut params = Vec::new();
    let mut sql = format!(
        "SELECT workflow_id, business_priority, claimable_time FROM {} \
         WHERE {CLAIMABLE_SQL} AND claimable_time IS NOT NULL",
        table(schema, INSTANCES)
    );
    if let Some(a) = after {
        params.push(Param::Text(a.to_string()));
        sql.push_str(" AND workflow_id > $1::text");
    }
    params.push(Param::Int8(limit));
    sql.push_str(&format!(" ORDER BY workflow_id LIMIT ${}::bigint", params.len()));
    Statement { sql, params }
}

/// Decode a scan page row by row: a row that does not decode is quarantined (skipped and
/// reported), never an error of the page. `workflow_id` is a non-null text primary key,
/// so every row read is a cursor.
fn page_of<T>(rows: &[Row], row: impl Fn(&Row) -> Result<T>) -> ScanPage<T> {
    let mut page = ScanPage { read: rows.len(), ..ScanPage::default() };
    for r in rows {
        let id = row_id(r);
        match row(r) {
            Ok(v) => page.rows.push(v),
            Err(e) => page.quarantined.push(Quarantined { workflow_id: id.clone(), reason: e.to_string() }),
        }
        page.last = Some(id);
    }
    page
}
