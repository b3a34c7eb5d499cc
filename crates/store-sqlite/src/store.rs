use crate::error::Op;
use crate::protocol::{self, Param, Statement, INSTANCE_COLUMNS};
use crate::{codec, run, SqliteDb, INSTANCES};
use kernel_core::domain::*;
use kernel_core::ports::*;
use kernel_core::transition::{Guard, Transition};
use kernel_core::{validate, Error, Result, WorkflowId};
use rusqlite::Row;

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
        let stmt = Statement {
            sql: format!("SELECT {INSTANCE_COLUMNS} FROM {INSTANCES} ORDER BY workflow_id LIMIT ?1"),
            params: vec![Param::Int8(limit)],
        };
        self.db
            .call(Op::Read, "list instances", move |c| {
                run(c, Op::Read, "list instances", &stmt, codec::instance)?.into_iter().collect()
            })
            .await
    }

    async fn find_one(&self, column: &'static str, value: &str) -> Result<Option<WorkflowInstance>> {
        let stmt = find_statement(column, value);
        self.db.call(Op::Read, "read instance", move |c| find(c, &stmt)).await
    }

    async fn claim_with(&self, workflow_id: Option<&str>, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        spec.validate()?;
        let (guard, transition) = (spec.guard(), spec.transition()?);
        let stmt = protocol::claim_statement(workflow_id, &guard, &transition, &self.db.config().limits)?;
        let rows = self
            .db
            .call(Op::Write, "claim", move |c| {
                run(c, Op::Write, "claim", &stmt, |r| {
                    // The lease is written: name the instance, so the caller can skip it (quarantine).
                    codec::instance(r).map_err(|e| e.of_instance(row_id(r)))
                })
            })
            .await?;
        one(rows, "claim")?.transpose()
    }
}

fn find_statement(column: &str, value: &str) -> Statement {
    Statement {
        sql: format!("SELECT {INSTANCE_COLUMNS} FROM {INSTANCES} WHERE {column} = ?1"),
        params: vec![Param::Text(value.to_string())],
    }
}

fn find(c: &mut rusqlite::Connection, stmt: &Statement) -> Result<Option<WorkflowInstance>> {
    one(run(c, Op::Read, "read instance", stmt, codec::instance)?, "read instance")?.transpose()
}

/// At most one row.
pub(crate) fn one<T>(mut rows: Vec<T>, what: &str) -> Result<Option<T>> {
    if rows.len() > 1 {
        return Err(Error::corrupt(format!("{what}: {} rows where at most one was expected", rows.len())));
    }
    Ok(rows.pop())
}

fn row_id(r: &Row<'_>) -> WorkflowId {
    r.get::<_, String>("workflow_id").map_or_else(|_| WorkflowId::from("unreadable"), WorkflowId::from)
}

#[async_trait::async_trait]
impl WorkflowStore for SqliteWorkflowStore {
    async fn create(&self, instance: WorkflowInstance) -> Result<CreateOutcome> {
        let stmt = protocol::insert_statement(&instance, &self.db.config().limits)?;
        let by_biz_key = find_statement("biz_key", &instance.biz_key);
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
        let rows = self
            .db
            .call(Op::Write, "apply", move |c| run(c, Op::Write, "apply", &stmt, |r| codec::col::<i64>(r, "revision")))
            .await?;
        if let Some(r) = one(rows, "apply")? {
            let r = r?;
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
        let stmt = protocol::due_waits_statement(now, after, limit);
        let rows = self
            .db
            .call(Op::Read, "scan due waits", move |c| {
                run(c, Op::Read, "scan due waits", &stmt, |r| {
                    let decoded = (|| {
                        let w = codec::wait(r)?;
                        Ok(DueWait {
                            workflow_id: codec::col::<String>(r, "workflow_id")?.into(),
                            step_index: w.step_index(),
                            resume: w.due_resume(),
                            priority: codec::priority_of(r)?,
                        })
                    })();
                    (row_id(r), r.get::<_, i64>("claimable_time").ok(), decoded)
                })
            })
            .await?;
        let last_time = rows.last().and_then(|(_, t, _)| *t).map(Instant::from_millis);
        let mut page = page_of(rows.into_iter().map(|(id, _, d)| (id, d)));
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
                run(c, Op::Read, "scan claimable", &stmt, |r| {
                    let decoded = (|| {
                        Ok(Candidate {
                            workflow_id: codec::col::<String>(r, "workflow_id")?.into(),
                            priority: codec::priority_of(r)?,
                            claimable_time: Instant::from_millis(codec::col::<i64>(r, "claimable_time")?),
                        })
                    })();
                    (row_id(r), decoded)
                })
            })
            .await?;
        Ok(page_of(rows.into_iter()))
    }
}

/// A scan page of decoded rows: a row that does not decode is quarantined (skipped and
/// reported), never an error of the page. `workflow_id` is a non-null text primary key,
/// so every row read is a cursor.
fn page_of<T>(rows: impl ExactSizeIterator<Item = (WorkflowId, Result<T>)>) -> ScanPage<T> {
    let mut page = ScanPage { read: rows.len(), ..ScanPage::default() };
    for (id, row) in rows {
        match row {
            Ok(v) => page.rows.push(v),
            Err(e) => page.quarantined.push(Quarantined { workflow_id: id.clone(), reason: e.to_string() }),
        }
        page.last = Some(id);
    }
    page
}
