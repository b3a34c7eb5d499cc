use crate::error::{self, map, Op};
use crate::protocol::{self, guard_filter, transition_update};
use crate::{codec, MongoConfig, INSTANCES};
use futures::TryStreamExt;
use kernel_core::domain::*;
use kernel_core::ports::*;
use kernel_core::transition::{Guard, Transition};
use kernel_core::{validate, Error, Result, WorkflowId};
use mongodb::bson::{doc, Bson, Document, RawDocumentBuf};
use mongodb::options::{CollectionOptions, IndexOptions, ReturnDocument};
use mongodb::{Collection, Database, IndexModel};

/// [`WorkflowStore`] on the `workflow_instances` collection.
///
/// Every write is one `findAndModify` whose query is `workflow_id = id AND <guard>` (see
/// [`protocol`](crate::protocol)); reads and writes go to the primary with the configured
/// write concern. Cheap to clone.
#[derive(Debug, Clone)]
pub struct MongoWorkflowStore {
    coll: Collection<RawDocumentBuf>,
    config: MongoConfig,
}

impl MongoWorkflowStore {
    /// Open the store on `db` and create its indexes (idempotent).
    pub async fn open(db: &Database, config: MongoConfig) -> Result<Self> {
        let s = Self::without_indexes(db, config);
        s.ensure_indexes().await?;
        Ok(s)
    }

    /// Open without touching indexes (when a migration step owns them).
    pub fn without_indexes(db: &Database, config: MongoConfig) -> Self {
        let opts = CollectionOptions::builder()
            .write_concern(config.write_concern.clone())
            .selection_criteria(config.selection_criteria())
            .build();
        MongoWorkflowStore { coll: db.collection_with_options(INSTANCES, opts), config }
    }

    /// The indexes of `workflow_instances`:
    ///
    /// - `biz_key_unique` — K-3.2, picks the winner of concurrent creates;
    /// - `workflow_id_unique` — every guarded write and read addresses one id;
    /// - `status_claimable_time` — `claim_any` (`status ∈ {running, failing}`, due first)
    ///   and `scan_due_waits` (`status = waiting`, `claimable_time ≤ now`);
    /// - `status_workflow_id` — `scan_claimable`, paged by `workflow_id`.
    pub async fn ensure_indexes(&self) -> Result<()> {
        let unique = |name: &str| IndexOptions::builder().unique(true).name(name.to_string()).build();
        let named = |name: &str| IndexOptions::builder().name(name.to_string()).build();
        let models = vec![
            IndexModel::builder().keys(doc! { "biz_key": 1 }).options(unique("biz_key_unique")).build(),
            IndexModel::builder().keys(doc! { "workflow_id": 1 }).options(unique("workflow_id_unique")).build(),
            IndexModel::builder()
                .keys(doc! { "status": 1, "claimable_time": 1 })
                .options(named("status_claimable_time"))
                .build(),
            IndexModel::builder()
                .keys(doc! { "status": 1, "workflow_id": 1 })
                .options(named("status_workflow_id"))
                .build(),
        ];
        self.coll.create_indexes(models).await.map_err(|e| map(Op::Write, "create indexes", e))?;
        Ok(())
    }

    /// The configuration in force.
    pub fn config(&self) -> &MongoConfig {
        &self.config
    }

    /// Up to `limit` instances ordered by `workflow_id`, for inspection tools and tests.
    /// Not a port method: the engine never lists instances.
    pub async fn list(&self, limit: usize) -> Result<Vec<WorkflowInstance>> {
        let Some(limit) = self.page(limit) else { return Ok(vec![]) };
        let cursor = self
            .coll
            .find(doc! {})
            .sort(doc! { "workflow_id": 1 })
            .limit(limit)
            .await
            .map_err(|e| map(Op::Read, "list instances", e))?;
        let docs: Vec<RawDocumentBuf> = cursor.try_collect().await.map_err(|e| map(Op::Read, "list instances", e))?;
        docs.iter().map(codec::decode_instance).collect()
    }

    async fn find_one(&self, filter: Document) -> Result<Option<WorkflowInstance>> {
        let d = self.coll.find_one(filter).await.map_err(|e| map(Op::Read, "find instance", e))?;
        d.as_ref().map(codec::decode_instance).transpose()
    }

    async fn claim_with(
        &self,
        filter: Document,
        spec: &ClaimSpec,
        sort: Option<Document>,
    ) -> Result<Option<WorkflowInstance>> {
        spec.validate()?;
        let u = transition_update(&spec.transition()?, &self.config.limits)?;
        let mut action = self.coll.find_one_and_update(filter, u.update).return_document(ReturnDocument::After);
        if let Some(s) = sort {
            action = action.sort(s);
        }
        let d = action.await.map_err(|e| map(Op::Write, "claim", e))?;
        // The lease is written: name the instance, so the caller can skip it (quarantine).
        d.as_ref()
            .map(|raw| {
                codec::decode_instance(raw).map_err(|e| {
                    let d = codec::unraw(raw).ok();
                    let id = match d.as_ref().and_then(|d| d.get("workflow_id")) {
                        Some(Bson::String(s)) => WorkflowId::from(s.clone()),
                        _ => fallback_id(d.as_ref()),
                    };
                    e.of_instance(id)
                })
            })
            .transpose()
    }

    fn page(&self, limit: usize) -> Option<i64> {
        // `limit(0)` means "no limit" to MongoDB: answer an empty page without a query.
        (limit > 0).then(|| limit.min(self.config.scan_page_max) as i64)
    }
}

#[async_trait::async_trait]
impl WorkflowStore for MongoWorkflowStore {
    async fn create(&self, instance: WorkflowInstance) -> Result<CreateOutcome> {
        let d = protocol::instance_document(&instance, &self.config.limits)?;
        match self.coll.insert_one(codec::raw("instance", &d)?).await {
            Ok(_) => Ok(CreateOutcome::Created(instance)),
            Err(e) if error::is_duplicate_key(&e) => {
                // K-5: the unique index picked another winner; re-read and reuse it.
                match self.find_one(doc! { "biz_key": instance.biz_key.as_str() }).await? {
                    Some(existing) => Ok(CreateOutcome::Exists(existing)),
                    None => Err(Error::Conflict(format!(
                        "workflow_id `{}` exists under another biz_key",
                        instance.workflow_id
                    ))),
                }
            }
            Err(e) => Err(map(Op::Write, "create", e)),
        }
    }

    async fn get(&self, workflow_id: &WorkflowId) -> Result<Option<WorkflowInstance>> {
        validate::identifier("workflow_id", workflow_id.as_str())?;
        self.find_one(doc! { "workflow_id": workflow_id.as_str() }).await
    }

    async fn get_by_biz_key(&self, biz_key: &str) -> Result<Option<WorkflowInstance>> {
        validate::identifier("biz_key", biz_key)?;
        self.find_one(doc! { "biz_key": biz_key }).await
    }

    async fn claim(&self, workflow_id: &WorkflowId, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        let filter = guard_filter(Some(workflow_id.as_str()), &spec.guard())?;
        self.claim_with(filter, spec, None).await
    }

    async fn claim_any(&self, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        let filter = guard_filter(None, &spec.guard())?;
        // Longest-due first; served by `status_claimable_time`.
        self.claim_with(filter, spec, Some(doc! { "claimable_time": 1 })).await
    }

    async fn apply(&self, workflow_id: &WorkflowId, guard: &Guard, transition: &Transition) -> Result<WriteOutcome> {
        let u = transition_update(transition, &self.config.limits)?;
        let filter = u.filter(workflow_id.as_str(), guard)?;
        let mut action = self
            .coll
            .find_one_and_update(filter, u.update)
            .return_document(ReturnDocument::After)
            .projection(doc! { "_id": 0, "revision": 1 });
        if let Some(af) = u.array_filters {
            action = action.array_filters(af);
        }
        let d = action.await.map_err(|e| map(Op::Write, "apply", e))?;
        if let Some(d) = d {
            let d = codec::unraw(&d)?;
            let revision = match d.get("revision") {
                Some(Bson::Int64(r)) => u64::try_from(*r).ok(),
                Some(Bson::Int32(r)) => u64::try_from(*r).ok(),
                _ => None,
            }
            .ok_or_else(|| codec::corrupt("revision", "missing after update"))?;
            return Ok(WriteOutcome::Applied { revision });
        }
        if let Some(max) = u.step_index_max {
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
        let Some(limit) = self.page(limit) else { return Ok(ScanPage::default()) };
        let mut filter = doc! {
            "status": WorkflowStatus::Waiting.as_str(),
            "claimable_time": { "$lte": codec::dt(now) },
            "wait": { "$exists": true },
            // Only ids a cursor can page past.
            "workflow_id": { "$type": "string" },
        };
        if let Some(a) = after {
            validate::identifier("after", &a.workflow_id)?;
            let (t, id) = (codec::dt(a.claimable_time), a.workflow_id.as_str());
            filter.insert(
                "$or",
                vec![
                    doc! { "claimable_time": { "$gt": t.clone() } },
                    doc! { "claimable_time": t, "workflow_id": { "$gt": id } },
                ],
            );
        }
        let docs: Vec<RawDocumentBuf> = self
            .coll
            .find(filter)
            .sort(doc! { "claimable_time": 1, "workflow_id": 1 })
            .limit(limit)
            .projection(doc! { "_id": 1, "workflow_id": 1, "wait": 1, "business_priority": 1, "claimable_time": 1 })
            .await
            .map_err(|e| map(Op::Read, "scan due waits", e))?
            .try_collect()
            .await
            .map_err(|e| map(Op::Read, "scan due waits", e))?;
        let mut page = page_of(&docs, |d| {
            let w = codec::wait_of(codec::doc_of(d, "wait")?.ok_or_else(|| codec::corrupt("wait", "missing"))?)?;
            Ok(DueWait {
                workflow_id: codec::str_field(d, "workflow_id")?.into(),
                step_index: w.step_index(),
                resume: w.due_resume(),
                priority: codec::priority_of(d)?,
            })
        });
        // The cursor of the next page: the last document read, decoded or not.
        page.last_time = match docs.last().map(codec::unraw) {
            Some(Ok(d)) => codec::time_field(&d, "claimable_time").ok(),
            _ => None,
        };
        Ok(page)
    }

    async fn scan_claimable(&self, after: Option<&WorkflowId>, limit: usize) -> Result<ScanPage<Candidate>> {
        let after = after.map(WorkflowId::as_str);
        let Some(limit) = self.page(limit) else { return Ok(ScanPage::default()) };
        // Only ids a cursor can page past: `$gt` on a string matches strings only, so a
        // non-string id would otherwise be read on every first page.
        let mut id = doc! { "$type": "string" };
        if let Some(a) = after {
            validate::identifier("after", a)?;
            id.insert("$gt", a);
        }
        let filter = doc! {
            "status": { "$in": [WorkflowStatus::Running.as_str(), WorkflowStatus::Failing.as_str()] },
            "claimable_time": { "$exists": true },
            "workflow_id": id,
        };
        let docs: Vec<RawDocumentBuf> = self
            .coll
            .find(filter)
            .sort(doc! { "workflow_id": 1 })
            .limit(limit)
            .projection(doc! { "_id": 1, "workflow_id": 1, "business_priority": 1, "claimable_time": 1 })
            .await
            .map_err(|e| map(Op::Read, "scan claimable", e))?
            .try_collect()
            .await
            .map_err(|e| map(Op::Read, "scan claimable", e))?;
        Ok(page_of(&docs, candidate_of))
    }
}

/// Decode a scan page row by row: a document that does not decode is quarantined (skipped
/// and reported), never an error of the page, so one bad document cannot stop maintenance
/// for every other instance.
fn page_of<T>(docs: &[RawDocumentBuf], row: impl Fn(&Document) -> Result<T>) -> ScanPage<T> {
    let mut page = ScanPage { read: docs.len(), ..ScanPage::default() };
    for r in docs {
        let d = codec::unraw(r);
        let id = d.as_ref().ok().and_then(|d| match d.get("workflow_id") {
            Some(Bson::String(s)) => Some(WorkflowId::from(s.clone())),
            _ => None,
        });
        match d.as_ref().map_err(Clone::clone).and_then(&row) {
            Ok(v) => page.rows.push(v),
            Err(e) => page.quarantined.push(Quarantined {
                workflow_id: id.clone().unwrap_or_else(|| fallback_id(d.as_ref().ok())),
                reason: e.to_string(),
            }),
        }
        // Only a real id is a cursor: the `_id:` fallback would sort among the ids and skip
        // the ones below it.
        page.last = id;
    }
    page
}

/// The name a document without a string `workflow_id` is reported under (never a cursor).
fn fallback_id(d: Option<&Document>) -> WorkflowId {
    match d.and_then(|d| d.get("_id")) {
        Some(i) => WorkflowId::from(format!("_id:{i}")),
        None => WorkflowId::from("_id:unreadable".to_string()),
    }
}

fn candidate_of(d: &Document) -> Result<Candidate> {
    Ok(Candidate {
        workflow_id: codec::str_field(d, "workflow_id")?.into(),
        priority: codec::priority_of(d)?,
        claimable_time: codec::time_field(d, "claimable_time")?,
    })
}
