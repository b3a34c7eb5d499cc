//! # ops
//!
//! The operator's surface of the durable workflow kernel: what the `wfk` command line and
//! the ops server's console both call. It works on every store because it goes through the
//! ports and the observer projection only — lists come from the projection (K-15), never
//! from a scan of `workflow_instances`; one instance is read by id for its detail.
//!
//! - Reads: [`Ops::list`] (filters, keyset pages), [`Ops::show`] (steps, recorded model
//!   calls, the current wait, the lease, the attempt timeline), dead letters, human tasks,
//!   lanes and permits, the audit log, [`Ops::check_deploy`].
//! - Actions: signal, cancel, replay (K-5; refused for an instance of a dispatch round,
//!   K-11.4), retry-failed (a new dispatch round), regenerate (K-17.3), dead-letter
//!   decisions (K-17.2), task decisions (K-17.5), permit limits, lane rebuild. Each takes
//!   the [`Actor`]: a viewer is refused, and every action — done or refused — is written to
//!   the operator audit log (who, what, when, the result) in the projection's repository.
//! - Every failure is an [`OpsError`] of four kinds, with the command line's exit code and
//!   the server's HTTP status.
//!
//! ```no_run
//! # async fn demo() -> ops::Result<()> {
//! let ops = ops::Ops::connect("sqlite:/var/lib/app/wf.db", "local", vec![]).await?;
//! let page = ops.list(&ops::ListFilter { status: Some(kernel_core::WorkflowStatus::Failed), ..Default::default() }).await?;
//! for s in &page.items {
//!     println!("{} {} {}", s.workflow_id, s.workflow_type, s.biz_key);
//! }
//! ops.close().await;
//! # Ok(())
//! # }
//! ```

mod deploy;
mod error;
mod timeline;

pub use deploy::{DeployManifest, DeployReport, ManifestEntry, TypeReport};
pub use error::{OpsError, Result};
pub use timeline::{sort_attempts, started, timeline, TimelineBar};

use kernel_core::dispatch::Dispatch;
use kernel_core::engine::{Engine, Ports};
use kernel_core::ports::*;
use kernel_core::{Definition, Instant, Publisher, Wait, WorkflowId, WorkflowInstance, WorkflowStatus};
use kernel_tasks::TaskDesk;
use observer::{
    AttemptQuery, AttemptRow, AuditQuery, DynRepository, Observer, ObserverConfig, ObserverWriter, Snapshot,
    SnapshotQuery,
};
pub use observer::{AuditEntry, AuditResult};
use serde::Serialize;
use serde_json::Value;
use std::sync::{Arc, Mutex};

/// What an actor may do with the operator surface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Reads only.
    Viewer,
    /// Reads and acts.
    Operator,
}

impl Role {
    /// `viewer` or `operator`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
        }
    }
}

/// Who acts: a name (a K-2.0 identifier), a role, and the roles a human-task inbox knows
/// them by (their eligibility for tasks, K-17.5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Actor {
    /// The person or process.
    pub name: String,
    /// What they may do here.
    pub role: Role,
    /// Their roles for human tasks.
    pub task_roles: Vec<String>,
}

impl Actor {
    /// An operator with no task roles.
    pub fn operator(name: impl Into<String>) -> Actor {
        Actor { name: name.into(), role: Role::Operator, task_roles: vec![] }
    }

    /// A viewer.
    pub fn viewer(name: impl Into<String>) -> Actor {
        Actor { name: name.into(), role: Role::Viewer, task_roles: vec![] }
    }

    /// With task roles.
    pub fn with_task_roles(mut self, roles: impl IntoIterator<Item = impl Into<String>>) -> Actor {
        self.task_roles = roles.into_iter().map(Into::into).collect();
        self
    }

    fn task_actor(&self) -> kernel_core::ports::Actor {
        kernel_core::ports::Actor::new(self.name.clone(), self.task_roles.clone())
    }
}

/// Most rows of one page of [`Ops::list`]: one less than the projection's query cap, so a
/// page can ask for one row more and know whether another page follows.
pub const LIST_LIMIT_MAX: usize = observer::projection::QUERY_LIMIT_MAX - 1;
/// Rows of a page when the filter names no limit.
pub const LIST_LIMIT_DEFAULT: usize = 50;
/// Attempt rows [`Ops::show`] reads for the timeline.
pub const SHOW_ATTEMPTS_MAX: usize = 200;

/// The filters of [`Ops::list`]; every one is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListFilter {
    /// Workflow type.
    pub workflow_type: Option<String>,
    /// Status.
    pub status: Option<WorkflowStatus>,
    /// Business keys starting with this.
    pub biz_key_prefix: Option<String>,
    /// Failed at or after this time (implies status failed).
    pub failed_since: Option<Instant>,
    /// Waiting on a signal of this type.
    pub waiting_on_signal: Option<String>,
    /// The `next` of the previous page.
    pub cursor: Option<String>,
    /// Rows (1..=[`LIST_LIMIT_MAX`]; 0 means [`LIST_LIMIT_DEFAULT`]).
    pub limit: usize,
}

/// One page of a list, newest first, and the cursor of the next page.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Page<T> {
    /// The rows.
    pub items: Vec<T>,
    /// Pass as `cursor` for the next page; `None` on the last one.
    pub next: Option<String>,
}

/// A step of [`InstanceView`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepView {
    /// Name.
    pub name: String,
    /// Status.
    pub status: kernel_core::StepStatus,
    /// Physical attempts of this logical attempt.
    pub attempt: u32,
    /// Logical attempt of this run (regenerate bumps it).
    pub epoch: u32,
    /// The last error, if any: class and message.
    pub error: Option<kernel_core::StepError>,
    /// Recorded model calls of the current logical attempt (K-17.3).
    pub model_calls: Vec<ModelCallView>,
    /// When it started and finished.
    pub started_at: Option<Instant>,
    /// Finish time.
    pub finished_at: Option<Instant>,
}

/// One recorded model call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelCallView {
    /// The call's label in the step.
    pub label: String,
    /// `model@version`.
    pub model: String,
    /// `prompt@version`.
    pub prompt: String,
    /// Samples drawn (re-samples included).
    pub samples: usize,
}

/// The lease of a running instance: who holds it (from the projection) and until when.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeaseView {
    /// The worker of the latest transition, as the projection saw it.
    pub owner: Option<String>,
    /// The claim token's last six characters.
    pub claim: String,
    /// Lease end.
    pub expires_at: Instant,
}

/// An operator's request waiting for the holder of the instance's claim (K-6.8).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestView {
    /// The request's id (as the action's answer named it).
    pub id: String,
    /// `cancel` or `regenerate`.
    pub action: String,
    /// The regenerated step, for a regenerate.
    pub step: Option<String>,
    /// The requesting process's clock.
    pub requested_at: Instant,
    /// The last six characters of the claim token it was addressed to.
    pub holder: String,
}

impl RequestView {
    fn of(r: &kernel_core::operator_request::OperatorRequest) -> Self {
        let step = match &r.action {
            kernel_core::operator_request::RequestedAction::Regenerate { step } => Some(step.clone()),
            kernel_core::operator_request::RequestedAction::Cancel => None,
        };
        RequestView {
            id: r.id.clone(),
            action: r.action.as_str().to_string(),
            step,
            requested_at: r.requested_at,
            holder: r.holder.suffix().to_string(),
        }
    }
}

/// The detail of one workflow: what `wfk show` prints and the console's detail page shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceView {
    /// Id.
    pub workflow_id: WorkflowId,
    /// Type.
    pub workflow_type: String,
    /// Business key.
    pub biz_key: String,
    /// Status.
    pub status: WorkflowStatus,
    /// Run (replays).
    pub run: u32,
    /// Revision (K-2.2).
    pub revision: u64,
    /// Created.
    pub created_at: Instant,
    /// Last change.
    pub updated_at: Instant,
    /// Finished.
    pub finished_at: Option<Instant>,
    /// The steps.
    pub steps: Vec<StepView>,
    /// The current wait (a timer or a signal), if any.
    pub wait: Option<kernel_core::Wait>,
    /// The lease, while claimed.
    pub lease: Option<LeaseView>,
    /// Why it parks, when its definition changed under it (K-4.2).
    pub fingerprint_mismatch: Option<kernel_core::FingerprintMismatch>,
    /// An operator's request the claim holder has not applied yet (K-6.8).
    pub pending_request: Option<RequestView>,
    /// The compensation outcome of a failure (K-17.6).
    pub compensation: Option<kernel_core::compensation::CompensationReport>,
    /// Attempt rows from the projection, oldest first.
    pub attempts: Vec<AttemptRow>,
    /// The attempt timeline: queue wait, permit wait, external wait, execution.
    pub timeline: Vec<TimelineBar>,
    /// The attempt rows were the newest [`SHOW_ATTEMPTS_MAX`] of more.
    pub timeline_truncated: bool,
}

/// What an action did, for the table, the JSON and the audit log.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Done {
    /// The action (`cancel`, `replay`, …).
    pub action: String,
    /// What it acted on.
    pub target: String,
    /// One line for a person.
    pub summary: String,
    /// Details for a script.
    pub detail: Value,
    /// Set when the action was done but its audit entry could not be written (the
    /// command line then exits 4 and says so).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit_error: Option<String>,
}

/// What [`Ops::signal`] delivers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SignalArgs {
    /// Signal type.
    pub signal_type: String,
    /// The wait key (default: the current wait's).
    pub wait_key: Option<String>,
    /// The wait generation (default: the current wait's, else 0).
    pub generation: Option<u64>,
    /// The signal id (default: a fresh one).
    pub signal_id: Option<String>,
}

/// One lane of `wfk lanes`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LaneView {
    /// `p0` (realtime) … `p3` (background), K-13.
    pub lane: &'static str,
    /// Members, due or not.
    pub depth: u64,
    /// Due now.
    pub ready: u64,
    /// Not due yet.
    pub delayed: u64,
    /// Candidates popped from it since its backing store began counting.
    pub pops: u64,
    /// How long the oldest due member has waited, in ms.
    pub oldest_due_ms: i64,
}

/// The four lanes, most urgent first (K-13).
pub const LANES: [&str; 4] = kernel_core::Priority::LANE_NAMES;

/// The operator surface over one deployment. Cheap to share behind an `Arc`.
pub struct Ops {
    ports: Ports,
    engine: Engine,
    publisher: Publisher,
    repo: Arc<DynRepository>,
    desk: TaskDesk,
    dispatch: Option<Dispatch>,
    writer: Mutex<Option<ObserverWriter>>,
    schema: String,
    types: std::collections::BTreeSet<String>,
}

impl std::fmt::Debug for Ops {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ops").finish_non_exhaustive()
    }
}

/// What [`Ops::from_parts`] needs: the engine's ports, the projection's repository, the
/// definitions the deployment runs (regenerate and retry-failed need them; the rest does
/// not), and the dispatch outbox and candidates when the deployment dispatches (K-11).
pub struct OpsParts {
    /// Ports (store, inbox, queue, wakeup, permits, dead letters, task inbox, clock, ids).
    pub ports: Ports,
    /// The observer projection.
    pub repo: Arc<DynRepository>,
    /// Definitions.
    pub definitions: Vec<Definition>,
    /// Dispatch outbox and candidates.
    pub dispatch: Option<(Arc<DynOutbox>, Arc<DynCandidates>)>,
    /// What `wfk migrate` reports: the store's kind and schema version.
    pub schema: String,
}

impl Ops {
    /// Connect to a deployment by its store and queue URLs (the worker's), with the
    /// definitions it runs (may be empty). Actions are observed into the deployment's
    /// projection through an observer of this process: call [`close`](Self::close) before
    /// exiting so it is flushed.
    pub async fn connect(store_url: &str, queue_url: &str, definitions: Vec<Definition>) -> Result<Ops> {
        let deployment = compose::Deployment::connect(store_url, queue_url, &compose::QueueOptions::default()).await?;
        let repo = deployment.store.observation_repository().await?;
        let dispatch = match (deployment.store.dispatch_outbox().await, deployment.queue.dispatch_candidates()) {
            (Ok(o), Ok(c)) => Some((o, c)),
            _ => None,
        };
        let ports = deployment.ports().build().map_err(|e| OpsError::BadInput(e.to_string()))?;
        let schema = deployment.store.schema_description();
        Ops::from_parts(OpsParts { ports, repo, definitions, dispatch, schema })
    }

    /// An operator surface on ports the caller built (tests, a server embedding it). When
    /// the ports carry no observer of their own, one is started on `repo` so actions reach
    /// the projection.
    pub fn from_parts(parts: OpsParts) -> Result<Ops> {
        let OpsParts { mut ports, repo, definitions, dispatch, schema } = parts;
        let mut writer = None;
        if !ports.observer.enabled() {
            let (sink, w) = Observer::start(repo.clone(), ports.clock.clone(), ObserverConfig::default())?;
            ports.observer = Arc::new(sink);
            writer = Some(w);
        }
        let types = definitions.iter().map(|d| d.workflow_type().to_string()).collect();
        let mut builder = Engine::builder(ports.clone());
        for d in definitions {
            builder = builder.register(d);
        }
        let engine = builder.build()?;
        let publisher = engine.publisher();
        let inbox = ports.task_inbox.clone().ok_or_else(|| {
            OpsError::BadInput("the ports carry no task inbox (compose sets one on every store)".into())
        })?;
        let desk = TaskDesk::new(inbox, engine.signal_sender(), ports.clock.clone()).with_store(ports.store.clone());
        let dispatch = match dispatch {
            Some((outbox, candidates)) => Some(
                Dispatch::builder()
                    .outbox(outbox)
                    .candidates(candidates)
                    .publisher(publisher.clone())
                    .clock(ports.clock.clone())
                    .ids(ports.ids.clone())
                    .build()?,
            ),
            None => None,
        };
        Ok(Ops { ports, engine, publisher, repo, desk, dispatch, writer: Mutex::new(writer), schema, types })
    }

    /// Flush the observations of this process's actions to the projection.
    pub async fn close(&self) {
        let writer = self.writer.lock().expect("writer lock").take();
        if let Some(w) = writer {
            let _ = w.close().await;
        }
    }

    /// The ports (for a server that also serves streams or metrics).
    pub fn ports(&self) -> &Ports {
        &self.ports
    }

    /// The projection's repository.
    pub fn repository(&self) -> &Arc<DynRepository> {
        &self.repo
    }

    // ---- reads -------------------------------------------------------------------------

    /// A page of workflows from the projection (K-15), newest change first.
    pub async fn list(&self, filter: &ListFilter) -> Result<Page<Snapshot>> {
        let limit = match filter.limit {
            0 => LIST_LIMIT_DEFAULT,
            n if n > LIST_LIMIT_MAX => {
                return Err(OpsError::BadInput(format!("limit {n} is above the maximum of {LIST_LIMIT_MAX}")))
            }
            n => n,
        };
        if let Some(t) = &filter.workflow_type {
            kernel_core::validate::identifier("type", t)?;
        }
        if let Some(p) = &filter.biz_key_prefix {
            if p.is_empty() || p.len() > kernel_core::validate::IDENTIFIER_BYTES_MAX || p.contains('\0') {
                return Err(OpsError::BadInput("biz-key prefix: 1 to 256 bytes, no NUL".into()));
            }
        }
        let mut status = filter.status;
        if filter.failed_since.is_some() {
            if status.is_some_and(|s| s != WorkflowStatus::Failed) {
                return Err(OpsError::BadInput("failed-since lists failed workflows: drop the other status".into()));
            }
            status = Some(WorkflowStatus::Failed);
        }
        if filter.waiting_on_signal.is_some() {
            if status.is_some_and(|s| s != WorkflowStatus::Waiting) {
                return Err(OpsError::BadInput("waiting-on lists waiting workflows: drop the other status".into()));
            }
            status = Some(WorkflowStatus::Waiting);
        }
        let before = filter.cursor.as_deref().map(decode_cursor).transpose()?;
        let query = SnapshotQuery {
            workflow_type: filter.workflow_type.clone(),
            status,
            step_name: None,
            updated_from: filter.failed_since,
            updated_to: None,
            limit: limit + 1,
            biz_key_prefix: filter.biz_key_prefix.clone(),
            waiting_on: filter.waiting_on_signal.clone(),
            before,
        };
        let mut items = self.repo.find_snapshots(&query).await?;
        let next = if items.len() > limit {
            items.truncate(limit);
            items.last().map(|s| encode_cursor(s.updated_at, &s.biz_key))
        } else {
            None
        };
        Ok(Page { items, next })
    }

    /// Resolve a workflow reference to the instance: `id:<workflow id>` or `key:<business
    /// key>` name one explicitly; a bare text is looked up both ways, and when it is one
    /// workflow's id and another's business key the answer is [`OpsError::BadInput`] (say
    /// which with a prefix) rather than a guess.
    async fn resolve(&self, reference: &str) -> Result<WorkflowInstance> {
        let bad = || {
            OpsError::BadInput("a workflow reference: `id:<id>`, `key:<business key>` or either, 1 to 256 bytes".into())
        };
        let (by_id, by_key, text) = match reference.split_once(':') {
            Some(("id", rest)) => (true, false, rest),
            Some(("key", rest)) => (false, true, rest),
            _ => (true, true, reference),
        };
        if text.is_empty() || text.len() > kernel_core::validate::IDENTIFIER_BYTES_MAX || text.contains('\0') {
            return Err(bad());
        }
        let as_id = if by_id && kernel_core::validate::identifier("workflow_id", text).is_ok() {
            self.ports.store.get(&WorkflowId::from(text)).await?
        } else {
            None
        };
        let as_key = if by_key && kernel_core::validate::identifier("biz_key", text).is_ok() {
            let via_projection = match self.repo.snapshot(text).await? {
                Some(s) => self.ports.store.get(&s.workflow_id).await?.filter(|i| i.biz_key == text),
                None => None,
            };
            match via_projection {
                Some(i) => Some(i),
                None => self.ports.store.get_by_biz_key(text).await?,
            }
        } else {
            None
        };
        match (as_id, as_key) {
            (Some(a), Some(b)) if a.workflow_id != b.workflow_id => Err(OpsError::BadInput(format!(
                "`{text}` is the id of {} and the business key of {}: say `id:{text}` or `key:{text}`",
                a.workflow_id, b.workflow_id
            ))),
            (Some(i), _) | (None, Some(i)) => Ok(i),
            (None, None) => Err(OpsError::NotFound(format!("no workflow with id or business key `{text}`"))),
        }
    }

    /// One workflow in detail: the instance read by id, its attempt rows and timeline from
    /// the projection.
    pub async fn show(&self, id_or_key: &str) -> Result<InstanceView> {
        let inst = self.resolve(id_or_key).await?;
        let snapshot = self.repo.snapshot(&inst.biz_key).await?;
        let mut attempts = self
            .repo
            .find_attempts(&AttemptQuery {
                biz_key: Some(inst.biz_key.clone()),
                limit: SHOW_ATTEMPTS_MAX,
                ..Default::default()
            })
            .await?;
        attempts.retain(|a| a.workflow_id == inst.workflow_id);
        timeline::sort_attempts(&inst, &mut attempts);
        let steps = inst
            .steps
            .iter()
            .map(|s| StepView {
                name: s.name.clone(),
                status: s.status,
                attempt: s.attempt,
                epoch: s.epoch,
                error: s.error.clone(),
                model_calls: s
                    .record_of(inst.retry_count)
                    .map(|r| {
                        r.model_calls()
                            .map(|c| ModelCallView {
                                label: c.label.clone(),
                                model: c.model.to_string(),
                                prompt: c.prompt.to_string(),
                                samples: c.samples.len(),
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                started_at: s.started_at,
                finished_at: s.finished_at,
            })
            .collect();
        let lease = match (&inst.claim_token, inst.claimable_time) {
            (Some(token), Some(until))
                if inst.status == WorkflowStatus::Running || inst.status == WorkflowStatus::Failing =>
            {
                Some(LeaseView {
                    owner: snapshot.as_ref().and_then(|s| s.worker_id.clone()),
                    claim: token.suffix().to_string(),
                    expires_at: until,
                })
            }
            _ => None,
        };
        let timeline_truncated = attempts.len() >= SHOW_ATTEMPTS_MAX;
        let timeline = timeline(&inst, &attempts, timeline_truncated);
        Ok(InstanceView {
            workflow_id: inst.workflow_id.clone(),
            workflow_type: inst.workflow_type.clone(),
            biz_key: inst.biz_key.clone(),
            status: inst.status,
            run: inst.retry_count,
            revision: inst.revision,
            created_at: inst.created_at,
            updated_at: inst.updated_at,
            finished_at: inst.finished_at,
            steps,
            wait: inst.wait.clone(),
            lease,
            fingerprint_mismatch: inst.fingerprint_mismatch.clone(),
            pending_request: inst.operator_request.as_ref().map(RequestView::of),
            compensation: inst.compensation.clone(),
            attempts,
            timeline,
            timeline_truncated,
        })
    }

    /// The four lanes: depth, due, delayed, the oldest due member's wait.
    pub async fn lanes(&self) -> Result<Vec<LaneView>> {
        let stats = self.ports.queue.stats(self.ports.clock.now()).await?;
        Ok(LANES
            .iter()
            .zip(stats.iter())
            .map(|(lane, s)| LaneView {
                lane,
                depth: s.depth,
                ready: s.ready,
                delayed: s.delayed,
                pops: s.pops,
                oldest_due_ms: s.oldest_wait_ms.as_millis(),
            })
            .collect())
    }

    /// Dead letters (K-17.2) from their records, ordered by id, after `after`.
    pub async fn dead_letters(
        &self,
        status: Option<DeadLetterStatus>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>> {
        Ok(self.engine.dead_letters(status, after, limit).await?)
    }

    /// One dead letter.
    pub async fn dead_letter(&self, id: &str) -> Result<DeadLetter> {
        kernel_core::validate::identifier("dead letter id", id)?;
        let dls = self.ports.dead_letters.as_ref().ok_or_else(|| OpsError::BadInput("no dead-letter store".into()))?;
        dls.get(id).await?.ok_or_else(|| OpsError::NotFound(format!("dead letter {id}")))
    }

    /// The open tasks `actor` may decide (K-17.5), ordered by id; the token is never shown.
    /// A page may hold fewer than `limit` tasks (stale ones are closed, the desk's rules
    /// apply) and still be followed by another: go on from `next` while it is set.
    pub async fn tasks(&self, actor: &Actor, after: Option<&str>, limit: usize) -> Result<Page<TaskRecord>> {
        let (tasks, next) = self.desk.open_tasks(&actor.task_actor(), after, limit).await?;
        Ok(Page { items: tasks.into_iter().map(redact_task).collect(), next })
    }

    /// One task, for an actor who may decide it (the token is never shown).
    pub async fn task(&self, actor: &Actor, id: &str) -> Result<TaskRecord> {
        self.desk
            .task(id, &actor.task_actor())
            .await?
            .map(redact_task)
            .ok_or_else(|| OpsError::NotFound(format!("no task `{id}` that {} may decide", actor.name)))
    }

    // ---- actions -----------------------------------------------------------------------

    /// Run `f` as `actor` doing `action` on `target`: refused for a viewer; the result,
    /// done or refused, is written to the audit log.
    async fn act<F, Fut>(&self, actor: &Actor, action: &str, target: &str, detail: Value, f: F) -> Result<Done>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<(String, Value)>>,
    {
        let result = if actor.role != Role::Operator {
            Err(OpsError::Refused(format!("{} is a viewer: `{action}` needs the operator role", actor.name)))
        } else if let Err(e) = kernel_core::validate::identifier("actor", &actor.name) {
            Err(e.into())
        } else {
            f().await
        };
        let mut done = result.map(|(summary, out)| Done {
            action: action.to_string(),
            target: target.to_string(),
            summary,
            detail: out,
            audit_error: None,
        });
        // The entry records what was asked and, when done, what was done (the workflow the
        // reference resolved to, a generated signal id, a new round's token).
        let recorded = match &done {
            Ok(d) => serde_json::json!({"request": detail, "done": d.detail}),
            Err(_) => serde_json::json!({"request": detail}),
        };
        let written =
            self.audit_record(actor, action, target, recorded, done.as_ref().map(|_| ()).map_err(Clone::clone)).await;
        if let (Ok(d), Err(e)) = (&mut done, written) {
            d.audit_error = Some(e);
        }
        done
    }

    /// Deliver a signal (K-9.3) to a workflow: a doorbell for a fact written elsewhere
    /// (a signal carries no data, K-2). The wait key and generation default to the ones of
    /// the workflow's current wait when it waits on `signal_type`; the signal id defaults to
    /// a fresh one (pass the same id to retry without a second delivery).
    pub async fn signal(&self, actor: &Actor, id_or_key: &str, signal: &SignalArgs) -> Result<Done> {
        let detail = serde_json::json!({
            "signal_type": signal.signal_type,
            "wait_key": signal.wait_key,
            "generation": signal.generation,
            "signal_id": signal.signal_id,
        });
        self.act(actor, "signal", id_or_key, detail, || async {
            let inst = self.resolve(id_or_key).await?;
            let (wait_key, generation) = match (&inst.wait, &signal.wait_key) {
                (Some(Wait::Signal { signal_type, wait_key, generation, .. }), None)
                    if *signal_type == signal.signal_type =>
                {
                    (wait_key.clone(), signal.generation.unwrap_or(*generation))
                }
                (Some(Wait::Signal { signal_type, wait_key, generation, .. }), Some(k))
                    if *signal_type == signal.signal_type && wait_key == k =>
                {
                    (k.clone(), signal.generation.unwrap_or(*generation))
                }
                (_, Some(k)) => (k.clone(), signal.generation.unwrap_or(0)),
                (_, None) => {
                    return Err(OpsError::BadInput(format!(
                        "{} does not wait on `{}`: name the wait key",
                        inst.workflow_id, signal.signal_type
                    )))
                }
            };
            let signal_id = signal.signal_id.clone().unwrap_or_else(|| format!("op-{}", self.ports.ids.new_token()));
            let s = Signal::builder(inst.workflow_id.clone(), signal.signal_type.clone())
                .wait_key(wait_key.clone())
                .generation(generation)
                .signal_id(signal_id.clone())
                .build()?;
            let out = self.engine.deliver_signal(s).await?;
            let what = match out {
                DeliverOutcome::Activated => "delivered: the wait resumes",
                DeliverOutcome::Pending => {
                    "stored: no wait matches it yet (one that starts with this key and generation takes it)"
                }
                DeliverOutcome::Duplicate => "a duplicate of a signal id delivered before: nothing changed",
            };
            Ok((
                format!("signal `{}` ({signal_id}) to {}: {what}", signal.signal_type, inst.workflow_id),
                serde_json::json!({
                    "workflow_id": inst.workflow_id,
                    "signal_id": signal_id,
                    "wait_key": wait_key,
                    "generation": generation,
                    "outcome": format!("{out:?}"),
                }),
            ))
        })
        .await
    }

    /// Cancel (K-8): `running|waiting|failing → canceled` by one guarded write, or, for an
    /// instance a claim holds, a request its holder applies when the claim ends (K-6.8):
    /// the detail's `outcome` is `canceled` or `requested` (with the `request_id`).
    pub async fn cancel(&self, actor: &Actor, id_or_key: &str) -> Result<Done> {
        self.act(actor, "cancel", id_or_key, Value::Null, || async {
            let inst = self.resolve(id_or_key).await?;
            match self.engine.cancel(&inst.workflow_id).await? {
                kernel_core::CancelOutcome::Canceled => Ok((
                    format!("{} canceled", inst.workflow_id),
                    serde_json::json!({"workflow_id": inst.workflow_id, "outcome": "canceled"}),
                )),
                kernel_core::CancelOutcome::Requested { request_id } => Ok((
                    format!(
                        "{} cancel requested ({request_id}): a worker holds its claim and applies it when the claim ends",
                        inst.workflow_id
                    ),
                    serde_json::json!({"workflow_id": inst.workflow_id, "outcome": "requested", "request_id": request_id}),
                )),
                kernel_core::CancelOutcome::NotActive => Err(OpsError::Refused(format!(
                    "{} is {}: only a running, waiting or failing workflow can be canceled",
                    inst.workflow_id,
                    self.status_now(&inst.workflow_id).await
                ))),
            }
        })
        .await
    }

    async fn status_now(&self, id: &WorkflowId) -> &'static str {
        match self.ports.store.get(id).await {
            Ok(Some(i)) => i.status.as_str(),
            _ => "gone",
        }
    }

    /// Replay a failed workflow as a new run (K-5); an instance of a dispatch round is
    /// refused with a pointer to [`retry_failed`](Self::retry_failed) (K-11.4).
    pub async fn replay(&self, actor: &Actor, id_or_key: &str) -> Result<Done> {
        self.act(actor, "replay", id_or_key, Value::Null, || async {
            let inst = self.resolve(id_or_key).await?;
            let after = self.publisher.replay(&inst.workflow_id).await?;
            Ok((
                format!("{} replayed: run {}", after.workflow_id, after.retry_count),
                serde_json::json!({"workflow_id": after.workflow_id, "run": after.retry_count}),
            ))
        })
        .await
    }

    /// Dispatch a new round of a business object whose round failed (K-11.4): the
    /// failed workflow's input with a new fencing token.
    pub async fn retry_failed(&self, actor: &Actor, object_id: &str) -> Result<Done> {
        self.act(actor, "retry-failed", object_id, Value::Null, || async {
            let dispatch = self
                .dispatch
                .as_ref()
                .ok_or_else(|| OpsError::BadInput("this deployment has no dispatch outbox".into()))?;
            kernel_core::validate::identifier("object_id", object_id)?;
            let oid = kernel_core::ObjectId::from(object_id);
            let rec = dispatch.outbox().get(&oid).await?.ok_or_else(|| OpsError::NotFound(format!("object {object_id}")))?;
            let intent = rec.dispatch.ok_or_else(|| OpsError::NotFound(format!("object {object_id} has no dispatch intent")))?;
            if !self.types.contains(&intent.workflow_type) {
                return Err(OpsError::BadInput(format!(
                    "this surface has no definition of `{}`, which a new round starts: run it where the \
                     definitions are (a wfk or ops server built with them); nothing was written",
                    intent.workflow_type
                )));
            }
            let prev = intent.fencing_token.clone();
            let next = kernel_core::FencingToken::from(format!("f-{}", self.ports.ids.new_token()));
            let mut input = intent.input.clone().unwrap_or(Value::Null);
            match input.as_object_mut() {
                Some(map) => {
                    map.insert(kernel_core::BusinessRound::FENCING_TOKEN_FIELD.into(), Value::String(next.to_string()));
                }
                None => return Err(OpsError::BadInput(format!("object {object_id}: the intent's input is not an object"))),
            }
            let dispatched = match dispatch.retry_failed(&oid, &prev, &next, input).await {
                Ok(out) => format!("{out:?}"),
                Err(e) => {
                    // The new round may be installed and only its immediate dispatch have
                    // failed: then it is done, and the recovery dispatcher starts it.
                    let installed = dispatch
                        .outbox()
                        .get(&oid)
                        .await
                        .ok()
                        .flatten()
                        .and_then(|r| r.dispatch)
                        .is_some_and(|d| d.fencing_token == next);
                    if !installed {
                        return Err(e.into());
                    }
                    format!("left to the recovery dispatcher ({e})")
                }
            };
            Ok((
                format!("object {object_id}: new round {next} installed; dispatch: {dispatched}"),
                serde_json::json!({"object_id": object_id, "previous_round": prev, "round": next, "dispatch": dispatched}),
            ))
        })
        .await
    }

    /// Regenerate a completed step (K-17.3): a new epoch of it and of its dependents that ran.
    pub async fn regenerate(&self, actor: &Actor, id_or_key: &str, step: &str) -> Result<Done> {
        self.act(actor, "regenerate", id_or_key, serde_json::json!({"step": step}), || async {
            let inst = self.resolve(id_or_key).await?;
            match self.engine.regenerate(&inst.workflow_id, step).await? {
                kernel_core::Acted::Applied(r) => Ok((
                    format!("{} step {step}: epoch {}; new attempts: {}", inst.workflow_id, r.epoch, r.steps.join(", ")),
                    serde_json::json!({
                        "workflow_id": inst.workflow_id, "outcome": "applied", "epoch": r.epoch, "steps": r.steps,
                        "woken": r.woken,
                    }),
                )),
                kernel_core::Acted::Requested { request_id } => Ok((
                    format!(
                        "{} step {step}: regenerate requested ({request_id}): a worker holds its claim and applies it \
                         when the claim ends",
                        inst.workflow_id
                    ),
                    serde_json::json!({"workflow_id": inst.workflow_id, "outcome": "requested", "request_id": request_id}),
                )),
            }
        })
        .await
    }

    /// Decide a dead letter (K-17.2): retry, complete with an output, or fail. The audit
    /// entry's request detail carries `reason` and, for a complete, the supplied output's
    /// `{"sha256", "bytes"}` ([`OutputDigest`](kernel_core::record::OutputDigest)), whether
    /// the decision was taken or refused (a human-task step, a stale dead letter).
    pub async fn decide_dead_letter(
        &self,
        actor: &Actor,
        id: &str,
        action: DeadLetterAction,
        reason: Option<&str>,
    ) -> Result<Done> {
        let name = match &action {
            DeadLetterAction::Retry => "dlq-retry",
            DeadLetterAction::Complete { .. } => "dlq-complete",
            DeadLetterAction::Fail => "dlq-fail",
        };
        // The audit keeps what the operator supplied, whatever the outcome: the output's
        // SHA-256 and size (the output itself is on the dead-letter record).
        let detail = match &action {
            DeadLetterAction::Complete { output } => {
                let digest = kernel_core::record::OutputDigest::of(output);
                serde_json::json!({"reason": reason, "output": {"sha256": digest.sha256, "bytes": digest.bytes}})
            }
            DeadLetterAction::Retry | DeadLetterAction::Fail => serde_json::json!({"reason": reason}),
        };
        self.act(actor, name, id, detail, || async {
            match self.engine.decide_dead_letter(id, action, &actor.name, reason).await? {
                DecideOutcome::Decided => {
                    Ok((format!("dead letter {id}: decided"), serde_json::json!({"id": id, "outcome": "decided"})))
                }
                DecideOutcome::AlreadyDecided(d) => Err(OpsError::Refused(format!(
                    "dead letter {id} was decided already by {} ({:?})",
                    d.actor, d.action
                ))),
                DecideOutcome::Closed => Err(OpsError::Refused(format!("dead letter {id} is closed"))),
                DecideOutcome::NotFound => Err(OpsError::NotFound(format!("dead letter {id}"))),
            }
        })
        .await
    }

    /// Decide a human task (K-17.5) as `actor`, who must be eligible for it; the desk
    /// uses the task's token, which never leaves this process.
    pub async fn decide_task(
        &self,
        actor: &Actor,
        id: &str,
        outcome: TaskOutcome,
        reason: Option<&str>,
    ) -> Result<Done> {
        let action = match outcome {
            TaskOutcome::Approve => "task-approve",
            TaskOutcome::Reject => "task-reject",
            TaskOutcome::Escalate => "task-escalate",
            TaskOutcome::Cancel => "task-cancel",
        };
        self.act(actor, action, id, Value::Null, || async {
            kernel_core::validate::identifier("task id", id)?;
            let who = actor.task_actor();
            let task = self
                .ports
                .task_inbox
                .as_ref()
                .ok_or_else(|| OpsError::BadInput("no task inbox".into()))?
                .get(id)
                .await?
                .ok_or_else(|| OpsError::NotFound(format!("task {id}")))?;
            let reason = reason.map(|r| TaskReason { sensitive: false, text: Some(r.to_string()) });
            match self.desk.decide(id, &task.token, &who, outcome, reason).await? {
                TaskDecideOutcome::Decided => Ok((
                    format!("task {id}: {} by {}", action.trim_start_matches("task-"), actor.name),
                    serde_json::json!({"id": id, "workflow_id": task.workflow_id, "outcome": action.trim_start_matches("task-")}),
                )),
                TaskDecideOutcome::NotFound => Err(OpsError::NotFound(format!("task {id}"))),
                TaskDecideOutcome::Closed => Err(OpsError::Refused(format!("task {id} is closed"))),
                TaskDecideOutcome::AlreadyDecided(d) => {
                    Err(OpsError::Refused(format!("task {id} was decided already by {}", d.actor)))
                }
                TaskDecideOutcome::NotEligible | TaskDecideOutcome::ActorMismatch | TaskDecideOutcome::WrongToken => {
                    Err(OpsError::Refused(format!("{} may not decide task {id}", actor.name)))
                }
                TaskDecideOutcome::PastDeadline { due_at } => Err(OpsError::Refused(format!(
                    "task {id} is past its deadline ({due_at} ms since the epoch): too late to decide, \
                     its SLA path concludes it"
                ))),
            }
        })
        .await
    }

    /// Rebuild the ready lanes from the store (K-13): every claimable instance is offered
    /// again (enqueue is promote-only, so nothing due moves later). `progress` is called
    /// after each page with the count so far.
    pub async fn rebuild(&self, actor: &Actor, progress: &(dyn Fn(u64) + Send + Sync)) -> Result<Done> {
        self.act(actor, "rebuild", "lanes", Value::Null, || async {
            let mut after: Option<WorkflowId> = None;
            let mut total = 0u64;
            loop {
                let page = self.ports.store.scan_claimable(after.as_ref(), REBUILD_PAGE).await?;
                let entries: Vec<LaneEntry> = page
                    .rows
                    .iter()
                    .map(|c| LaneEntry {
                        workflow_id: c.workflow_id.clone(),
                        priority: c.priority,
                        claimable_at: c.claimable_time,
                    })
                    .collect();
                if !entries.is_empty() {
                    self.ports.queue.enqueue_many(&entries).await?;
                    total += entries.len() as u64;
                    progress(total);
                }
                match page.last {
                    Some(last) if page.read >= REBUILD_PAGE => after = Some(last),
                    _ => break,
                }
            }
            if total > 0 {
                let _ = self.ports.wakeup.notify().await;
            }
            Ok((format!("lanes rebuilt: {total} candidates offered"), serde_json::json!({"offered": total})))
        })
        .await
    }

    /// Compare new definitions with the workflows in flight (from the projection) before a
    /// deploy: per type and fingerprint, how many would park and why (K-4.2).
    pub async fn check_deploy(
        &self,
        manifest: &DeployManifest,
        progress: &(dyn Fn(u64) + Send + Sync),
    ) -> Result<DeployReport> {
        deploy::check(&*self.repo, &*self.ports.store, manifest, progress).await
    }

    /// Every resource with a limit or a holder, with its limits and holders (K-14).
    pub async fn permits(&self) -> Result<Vec<PermitView>> {
        let names = self.ports.permits.resources().await?;
        let mut out = Vec::with_capacity(names.len());
        for resource in names {
            let u = self.ports.permits.usage(&resource).await?;
            out.push(PermitView {
                resource,
                max_concurrency: u.limits.max_concurrency,
                max_starts_per_second: u.limits.max_starts_per_second,
                overridden: u.overridden,
                holders: u
                    .holders
                    .iter()
                    .map(|h| HolderView {
                        workflow_id: h.owner.workflow_id.clone(),
                        step: h.owner.step.clone(),
                        claim: h.owner.claim_token.suffix().to_string(),
                        lease_until: h.lease_until,
                    })
                    .collect(),
                truncated: u.truncated,
                starts_this_second: u.starts_in_window,
            });
        }
        Ok(out)
    }

    /// Set a resource's limits (0 = unlimited) where every worker's next acquire reads
    /// them; lowering a limit evicts no holder (K-14).
    pub async fn set_permit_limits(&self, actor: &Actor, resource: &str, limits: PermitLimits) -> Result<Done> {
        let detail = serde_json::json!({
            "max_concurrency": limits.max_concurrency,
            "max_starts_per_second": limits.max_starts_per_second,
        });
        self.act(actor, "permits-set", resource, detail.clone(), || async {
            self.ports.permits.set_limits(resource, limits).await?;
            Ok((
                format!(
                    "{resource}: max_concurrency={} max_starts_per_second={}",
                    limits.max_concurrency, limits.max_starts_per_second
                ),
                detail.clone(),
            ))
        })
        .await
    }

    /// The operator audit log, newest first, optionally of one actor and one action.
    pub async fn audit(&self, actor: Option<&str>, action: Option<&str>, limit: usize) -> Result<Vec<AuditEntry>> {
        if limit == 0 || limit > LIST_LIMIT_MAX {
            return Err(OpsError::BadInput(format!("limit: 1 to {LIST_LIMIT_MAX}")));
        }
        Ok(self
            .repo
            .find_audit(&AuditQuery {
                actor: actor.map(str::to_string),
                action: action.map(str::to_string),
                limit,
                ..Default::default()
            })
            .await?)
    }

    /// Record an action refused before it reached this surface (a bad token, a missing
    /// CSRF token at the server): `actor` is whatever the request claimed, or `anonymous`.
    pub async fn audit_refusal(&self, actor: &str, role: &str, action: &str, target: &str, reason: &str) {
        let actor = if kernel_core::validate::identifier("actor", actor).is_ok() { actor } else { "anonymous" };
        let _ =
            self.append(actor, role, action, target, Value::Null, AuditResult::Refused, Some(reason.to_string())).await;
    }

    /// The store's schema version after connecting (connecting migrates a SQL store).
    pub async fn schema_version(&self) -> Result<String> {
        Ok(self.schema.clone())
    }

    async fn audit_record(
        &self,
        actor: &Actor,
        action: &str,
        target: &str,
        detail: Value,
        result: Result<()>,
    ) -> std::result::Result<(), String> {
        let (res, reason) = match result {
            Ok(()) => (AuditResult::Ok, None),
            Err(e) => (
                match e {
                    OpsError::NotFound(_) => AuditResult::NotFound,
                    OpsError::BadInput(_) => AuditResult::BadInput,
                    OpsError::Refused(_) => AuditResult::Refused,
                    OpsError::Unavailable(_) => AuditResult::Unavailable,
                },
                Some(e.message().to_string()),
            ),
        };
        let name = if kernel_core::validate::identifier("actor", &actor.name).is_ok() {
            actor.name.as_str()
        } else {
            "anonymous"
        };
        self.append(name, actor.role.as_str(), action, target, detail, res, reason).await
    }

    /// Append an entry; an audit write that fails is logged and returned, never turned into
    /// the action's result (the action happened, or was refused, either way).
    #[allow(clippy::too_many_arguments)]
    async fn append(
        &self,
        actor: &str,
        role: &str,
        action: &str,
        target: &str,
        detail: Value,
        result: AuditResult,
        reason: Option<String>,
    ) -> std::result::Result<(), String> {
        let target = if kernel_core::validate::identifier("target", target).is_ok() {
            target.to_string()
        } else {
            "(invalid)".to_string()
        };
        let mut reason = reason;
        if let Some(r) = reason.as_mut() {
            clip_in_place(r, observer::audit::AUDIT_REASON_BYTES_MAX);
        }
        let detail = if serde_json::to_vec(&detail).map_or(true, |b| b.len() > observer::audit::AUDIT_DETAIL_BYTES_MAX)
        {
            serde_json::json!({"note": "detail left out: too large"})
        } else {
            detail
        };
        let entry = AuditEntry {
            id: format!("op-{}", self.ports.ids.new_token()),
            at: self.ports.clock.now(),
            actor: actor.to_string(),
            role: role.to_string(),
            action: action.to_string(),
            target,
            detail,
            result,
            reason,
        };
        self.repo.append_audit(&entry).await.map_err(|e| {
            tracing::warn!(action, error = %e, "operator audit entry not written");
            e.to_string()
        })
    }
}

fn clip_in_place(s: &mut String, max: usize) {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
}

/// A resource of [`Ops::permits`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PermitView {
    /// Resource name.
    pub resource: String,
    /// Holders at once (0 = unlimited).
    pub max_concurrency: u32,
    /// Starts per second (0 = unlimited).
    pub max_starts_per_second: u32,
    /// Whether the limits are an operator's override rather than the configured default.
    pub overridden: bool,
    /// Current holders.
    pub holders: Vec<HolderView>,
    /// More holders than were listed.
    pub truncated: bool,
    /// Starts counted in the current second.
    pub starts_this_second: u64,
}

/// A permit holder.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HolderView {
    /// The workflow whose step holds it.
    pub workflow_id: WorkflowId,
    /// The step.
    pub step: String,
    /// The claim token's last six characters.
    pub claim: String,
    /// Lease end, where the backend knows it.
    pub lease_until: Option<Instant>,
}

/// Candidates one page of [`Ops::rebuild`] reads (and enqueues in one call).
pub const REBUILD_PAGE: usize = 500;

/// What an operator may see of a task: never the token, never a sensitive reason's text.
fn redact_task(mut t: TaskRecord) -> TaskRecord {
    t.token = "(hidden)".into();
    t.decision = t.decision.map(|d| d.redacted());
    t
}

fn encode_cursor(at: Instant, biz_key: &str) -> String {
    format!("{}.{}", at.as_millis(), hex_encode(biz_key.as_bytes()))
}

fn decode_cursor(c: &str) -> Result<(Instant, String)> {
    let bad = || OpsError::BadInput(format!("cursor `{c}` is not one this list returned"));
    let (ms, key) = c.split_once('.').ok_or_else(bad)?;
    let ms: i64 = ms.parse().map_err(|_| bad())?;
    let bytes = hex_decode(key).ok_or_else(bad)?;
    let key = String::from_utf8(bytes).map_err(|_| bad())?;
    Ok((Instant::from_millis(ms), key))
}

fn hex_encode(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.len() > 2 * kernel_core::validate::IDENTIFIER_BYTES_MAX {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_bad_ones_are_bad_input() {
        let c = encode_cursor(Instant::from_millis(42), "inv-7/ä");
        assert_eq!(decode_cursor(&c).unwrap(), (Instant::from_millis(42), "inv-7/ä".to_string()));
        for bad in ["", "x", "12", "12.zz", "12.0", "a.00", "12.ff"] {
            assert!(matches!(decode_cursor(bad), Err(OpsError::BadInput(_))), "{bad}");
        }
    }

    #[test]
    fn an_operator_never_sees_a_task_token_or_a_sensitive_reason() {
        // K-17.5: the token decides; a sensitive reason lives on the record only.
        let t: TaskRecord = serde_json::from_value(serde_json::json!({
            "id": "t-1", "workflow_id": "wf-1", "workflow_type": "review", "step": "approve", "level": 0,
            "title": "Approve", "assignee": null, "roles": ["finance"], "evidence": [],
            "token": "secret-token-0123456789", "created_at": 1, "due_at": 2, "status": "decided",
            "decision": {"outcome": "reject", "actor": "fin-1",
                         "reason": {"sensitive": true, "text": "employee on medical leave"}, "decided_at": 2},
            "closed_at": null
        }))
        .expect("a task record");
        let shown = serde_json::to_string(&redact_task(t)).unwrap();
        assert!(!shown.contains("secret-token") && !shown.contains("medical"), "{shown}");
        assert!(shown.contains("fin-1"), "the decision itself stays: {shown}");
    }

    #[test]
    fn each_error_kind_has_its_exit_code_and_status() {
        let all = [
            OpsError::NotFound("x".into()),
            OpsError::BadInput("x".into()),
            OpsError::Refused("x".into()),
            OpsError::Unavailable("x".into()),
        ];
        assert_eq!(all.iter().map(OpsError::exit_code).collect::<Vec<_>>(), [1, 2, 3, 4]);
        assert_eq!(all.iter().map(OpsError::http_status).collect::<Vec<_>>(), [404, 400, 409, 503]);
    }
}
