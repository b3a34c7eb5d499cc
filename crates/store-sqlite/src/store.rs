use crate::error::Op;
use crate::protocol::{self, Statement};
use crate::{codec, one, run, SqliteDb, D};
use kernel_core::domain::*;
use kernel_core::ports::*;
use kernel_core::transition::{Guard, Transition};
use kernel_core::{validate, Error, Result, WorkflowId};
use sql_protocol::{row, store, SqlRow};

/// [`WorkflowStore`] on the `workflow_instances` table.
///
/// Every write is one autocommit statement whose condition is `workflow_id = ?1 AND
/// <guard>` (see [`protocol`](crate::protocol)). Cheap to clone (the pool is shared).
#[derive(Debug, Clone)]
pub struct SqliteWorkflowStore {
    db: SqliteDb,
}

impl SqliteWorkflowStore {
    /// The store in `db`'s file (opened and migrated by [`SqliteDb::open`]).
    pub fn new(db: SqliteDb) -> Self {
        SqliteWorkflowStore { db }
    }

    /// The database the store is in.
    pub fn db(&self) -> &SqliteDb {
        &self.db
    }

    /// Up to `limit` instances ordered by `workflow_id`, for inspection tools and tests.
    /// Not a port method: the engine never lists instances.
    pub async fn list(&self, limit: usize) -> Result<Vec<WorkflowInstance>> {
        let Some(limit) = self.db.page(limit) else { return Ok(vec![]) };
        self.db.rows(Op::Read, "list instances", store::list(D, "", limit), |r| row::instance(r)).await
    }

    async fn find_one(&self, column: &'static str, value: &str) -> Result<Option<WorkflowInstance>> {
        let stmt = store::find(D, "", column, value);
        self.db.call(Op::Read, "read instance", move |c| find(c, &stmt)).await
    }

    async fn claim_with(&self, workflow_id: Option<&str>, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        spec.validate()?;
        let (guard, transition) = (spec.guard(), spec.transition()?);
        let stmt = protocol::claim_statement(workflow_id, &guard, &transition, &self.db.config().limits)?;
        // The lease is written: name the instance, so the caller can skip it (quarantine).
        let claimed =
            self.db.row(Op::Write, "claim", stmt, |r| row::instance(r).map_err(|e| e.of_instance(row::row_id(r))));
        claimed.await
    }
}

fn find(c: &mut rusqlite::Connection, stmt: &Statement) -> Result<Option<WorkflowInstance>> {
    one(run(c, Op::Read, "read instance", stmt, |r| row::instance(&codec::R(r)))?, "read instance")?.transpose()
}

#[async_trait::async_trait]
impl WorkflowStore for SqliteWorkflowStore {
    async fn create(&self, instance: WorkflowInstance) -> Result<CreateOutcome> {
        let stmt = protocol::insert_statement(&instance, &self.db.config().limits)?;
        let by_biz_key = store::find(D, "", "biz_key", &instance.biz_key);
        // The insert and, on a conflict, the read of the winner on the same connection:
        // the insert's conflict saw a committed row, which the next read sees too (K-5).
        let existing = self
            .db
            .call(Op::Write, "create", move |c| {
                if !run(c, Op::Write, "create", &stmt, |_| ())?.is_empty() {
                    return Ok(None);
                }
                Ok(Some(find(c, &by_biz_key)?))
            })
            .await?;
        match existing {
            None => Ok(CreateOutcome::Created(instance)),
            Some(Some(existing)) => Ok(CreateOutcome::Exists(existing)),
            Some(None) => {
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
        let (stmt, step_max) =
            protocol::apply_statement(workflow_id.as_str(), guard, transition, &self.db.config().limits)?;
        if let Some(revision) = self.db.row(Op::Write, "apply", stmt, |r| row::revision(r)).await? {
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
        let stmt = protocol::due_waits_statement(now, after, limit);
        let rows = self
            .db
            .call(Op::Read, "scan due waits", move |c| {
                run(c, Op::Read, "scan due waits", &stmt, |r| {
                    let r = codec::R(r);
                    (row::scanned(&r, row::due_wait), r.int("claimable_time").ok())
                })
            })
            .await?;
        let last_time = rows.last().and_then(|(_, t)| *t).map(Instant::from_millis);
        let mut page = row::scan_page(rows.into_iter().map(|(scanned, _)| scanned));
        page.last_time = last_time;
        Ok(page)
    }

    async fn scan_claimable(&self, after: Option<&WorkflowId>, limit: usize) -> Result<ScanPage<Candidate>> {
        if let Some(a) = after {
            validate::identifier("after", a.as_str())?;
        }
        let Some(limit) = self.db.page(limit) else { return Ok(ScanPage::default()) };
        let stmt = protocol::claimable_statement(after.map(WorkflowId::as_str), limit);
        let rows = self
            .db
            .call(Op::Read, "scan claimable", move |c| {
                run(c, Op::Read, "scan claimable", &stmt, |r| row::scanned(&codec::R(r), row::candidate))
            })
            .await?;
        Ok(row::scan_page(rows.into_iter()))
    }
}
