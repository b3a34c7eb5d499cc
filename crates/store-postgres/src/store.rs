use crate::error::Op;
use crate::protocol::{self, ClaimSpecParts, Statement};
use crate::{codec, Db, Pool, PostgresConfig, PG};
use kernel_core::domain::*;
use kernel_core::ports::*;
use kernel_core::transition::{Guard, Transition};
use kernel_core::{validate, Error, Result, WorkflowId};
use sql_protocol::{row, store, SqlRow};

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
        self.db.rows(Op::Read, "list instances", store::list(PG, &self.db.prefix(), limit), |r| row::instance(r)).await
    }

    async fn find_one(&self, column: &str, value: &str) -> Result<Option<WorkflowInstance>> {
        let stmt = store::find(PG, &self.db.prefix(), column, value);
        self.db.row(Op::Read, "read instance", stmt, |r| row::instance(r)).await
    }

    async fn claim_with(&self, workflow_id: Option<&str>, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        spec.validate()?;
        let (guard, transition) = (spec.guard(), spec.transition()?);
        let parts = ClaimSpecParts { guard: &guard, transition: &transition };
        let stmt = protocol::claim_statement(self.db.schema(), workflow_id, &parts, &self.db.config.limits)?;
        let row = self.db.query_opt(Op::Write, "claim", &stmt).await?;
        // The lease is written: name the instance, so the caller can skip it (quarantine).
        let r = row.as_ref().map(codec::R);
        r.map(|r| row::instance(&r).map_err(|e| e.of_instance(row::row_id(&r)))).transpose()
    }
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
            return Ok(WriteOutcome::Applied { revision: row::revision(&codec::R(&row))? });
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
        let rows: Vec<_> = rows.iter().map(codec::R).collect();
        let mut page = row::scan_page(rows.iter().map(|r| row::scanned(r, row::due_wait)));
        page.last_time = rows.last().and_then(|r| r.int("claimable_time").ok()).map(Instant::from_millis);
        Ok(page)
    }

    async fn scan_claimable(&self, after: Option<&WorkflowId>, limit: usize) -> Result<ScanPage<Candidate>> {
        if let Some(a) = after {
            validate::identifier("after", a.as_str())?;
        }
        let Some(limit) = self.db.page(limit) else { return Ok(ScanPage::default()) };
        let stmt = claimable_statement(self.db.schema(), after.map(WorkflowId::as_str), limit);
        let rows = self.db.query(Op::Read, "scan claimable", &stmt).await?;
        Ok(row::scan_page(rows.iter().map(|r| row::scanned(&codec::R(r), row::candidate))))
    }
}

/// The due-wait scan ([`sql_protocol::store::due_waits`]).
pub fn due_waits_statement(schema: &str, now: Instant, after: Option<&DueCursor>, limit: i64) -> Statement {
    store::due_waits(PG, &protocol::prefix(schema), now, after, limit).into()
}

/// The rebuild scan ([`sql_protocol::store::claimable`]).
pub fn claimable_statement(schema: &str, after: Option<&str>, limit: i64) -> Statement {
    store::claimable(PG, &protocol::prefix(schema), after, limit).into()
}
