use crate::definition::PlanRegistry;
use crate::error::{Error, Result};
use crate::model::*;
use crate::ports::*;
use crate::transition::{Guard, Transition};
use crate::validate;
use serde_json::Value;

/// A StartOrResume request (K-5).
#[derive(Debug, Clone, PartialEq)]
pub struct StartRequest {
    /// Registered type.
    pub workflow_type: String,
    /// Permanent idempotency key.
    pub biz_key: String,
    /// Business-facing id; generated when absent.
    pub workflow_id: Option<String>,
    /// Exact input snapshot (small).
    pub input: Value,
    /// Lane (promote-only).
    pub priority: Priority,
}

impl StartRequest {
    /// A request with priority P2 and a generated workflow id.
    pub fn new(workflow_type: impl Into<String>, biz_key: impl Into<String>, input: Value) -> Self {
        StartRequest {
            workflow_type: workflow_type.into(),
            biz_key: biz_key.into(),
            workflow_id: None,
            input,
            priority: Priority::P2,
        }
    }
    /// Set the workflow id.
    pub fn workflow_id(mut self, id: impl Into<String>) -> Self {
        self.workflow_id = Some(id.into());
        self
    }
    /// Set the priority.
    pub fn priority(mut self, p: Priority) -> Self {
        self.priority = p;
        self
    }
}

/// Result of StartOrResume.
#[derive(Debug, Clone, PartialEq)]
pub struct StartOutcome {
    /// The instance as read or written.
    pub instance: WorkflowInstance,
    /// True only for a create and for the replay winner (K-5).
    pub execution_activated: bool,
    /// True when this call inserted the instance.
    pub created: bool,
}

/// Registers instances from plans (API or cron processes need no activities, K-4.1).
#[derive(Clone)]
pub struct Publisher {
    ports: Ports,
    plans: PlanRegistry,
    payload_bytes_max: usize,
}

use super::Ports;

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher").field("plans", &self.plans).finish()
    }
}

impl Publisher {
    /// A publisher on `ports` knowing `plans`.
    pub fn new(ports: Ports, plans: PlanRegistry, payload_bytes_max: usize) -> Self {
        Publisher { ports, plans, payload_bytes_max }
    }

    /// StartOrResume (K-5): idempotent on `biz_key`.
    ///
    /// - not found → create (duplicate-key loser re-reads and reuses);
    /// - running / waiting → existing (priority raised, never lowered);
    /// - completed / canceled → existing, not activated;
    /// - failed → replay by one CAS on `status = failed` (loser re-reads);
    /// - failing → existing, `execution_activated = false`.
    ///
    /// Afterwards best-effort enqueue + wakeup, and a stream reset only when activated.
    /// Every bad input is a typed error and writes nothing.
    pub async fn start_or_resume(&self, req: StartRequest) -> Result<StartOutcome> {
        validate::identifier("workflow_type", &req.workflow_type)?;
        validate::identifier("biz_key", &req.biz_key)?;
        if let Some(id) = &req.workflow_id {
            validate::identifier("workflow_id", id)?;
        }
        validate::payload("input", &req.input, self.payload_bytes_max)?;
        let plan = self.plans.get(&req.workflow_type)?;
        let store = &self.ports.store;
        let now = self.ports.clock.now();

        let existing = store.get_by_biz_key(&req.biz_key).await?;
        let (mut inst, mut activated, created) = match existing {
            Some(inst) => (inst, false, false),
            None => {
                let doc = WorkflowInstance {
                    workflow_id: req
                        .workflow_id
                        .clone()
                        .unwrap_or_else(|| format!("wf-{}", self.ports.ids.new_token())),
                    workflow_type: req.workflow_type.clone(),
                    biz_key: req.biz_key.clone(),
                    status: WorkflowStatus::Running,
                    steps: plan.initial_steps(),
                    input: req.input.clone(),
                    output: Default::default(),
                    claimable_time: Some(now),
                    claim_token: None,
                    wait: None,
                    resume: None,
                    definition_fingerprint: plan.fingerprint().to_string(),
                    fingerprint_mismatch: None,
                    business_priority: req.priority,
                    retry_count: 0,
                    revision: 0,
                    created_at: now,
                    updated_at: now,
                    finished_at: None,
                };
                match store.create(doc).await? {
                    CreateOutcome::Created(i) => {
                        self.observe(&i, Transition::new(crate::transition::TransitionKind::Create, now));
                        (i, true, true)
                    }
                    CreateOutcome::Exists(i) => (i, false, false),
                }
            }
        };
        if inst.workflow_type != req.workflow_type {
            return Err(Error::Conflict(format!(
                "biz_key `{}` belongs to a `{}` workflow, not `{}`",
                req.biz_key, inst.workflow_type, req.workflow_type
            )));
        }
        if !created {
            match inst.status {
                WorkflowStatus::Failed => {
                    let t = Transition::replay(req.input.clone(), now);
                    match store.apply(&inst.workflow_id, &Guard::Failed, &t).await? {
                        WriteOutcome::Applied { .. } => activated = true,
                        WriteOutcome::Missed => {}
                    }
                    inst =
                        store.get(&inst.workflow_id).await?.ok_or_else(|| Error::NotFound(inst.workflow_id.clone()))?;
                }
                WorkflowStatus::Running | WorkflowStatus::Waiting | WorkflowStatus::Failing => {}
                WorkflowStatus::Completed | WorkflowStatus::Canceled => {}
            }
            if !inst.status.is_terminal() && req.priority.is_higher_than(inst.business_priority) {
                let t = Transition::priority_raise(req.priority, now);
                if store.apply(&inst.workflow_id, &Guard::PriorityBelow(req.priority), &t).await?.applied() {
                    inst.business_priority = req.priority;
                }
            }
        }
        if matches!(inst.status, WorkflowStatus::Running) {
            if let Err(e) = self
                .ports
                .queue
                .enqueue(&inst.workflow_id, inst.business_priority, inst.claimable_time.unwrap_or(now))
                .await
            {
                tracing::debug!(workflow_id = %inst.workflow_id, error = %e, "enqueue after start failed");
            } else {
                let _ = self.ports.wakeup.notify().await;
            }
        }
        if activated {
            if let Some(key) = stream_key(&inst) {
                if let Err(e) = self.ports.stream.reset(&key).await {
                    tracing::debug!(workflow_id = %inst.workflow_id, error = %e, "stream reset failed");
                }
            }
        }
        Ok(StartOutcome { instance: inst, execution_activated: activated, created })
    }
}

impl Publisher {
    /// One observation of a publisher write (create, replay) for the ops projection (K-15).
    fn observe(&self, inst: &WorkflowInstance, t: Transition) {
        self.ports.observer.emit(Observation {
            workflow_id: inst.workflow_id.clone(),
            biz_key: inst.biz_key.clone(),
            workflow_type: inst.workflow_type.clone(),
            workflow_run: inst.retry_count,
            revision: inst.revision,
            kind: t.kind(),
            status: inst.status,
            step_name: None,
            attempt: 0,
            elapsed_ms: 0,
            traffic_wait_ms: 0,
            error_class: None,
            at: t.now,
            worker_id: None,
            claim_token: None,
        });
    }
}

/// The stream key of an instance: `input.object_id` (or the biz key), workflow id and
/// `input.fencing_token` (or the run number) (K-16).
pub(crate) fn stream_key(inst: &WorkflowInstance) -> Option<StreamKey> {
    let object_id = inst.input.get("object_id").and_then(Value::as_str).unwrap_or(&inst.biz_key).to_string();
    let fencing_token = inst.fencing_token().map(str::to_string).unwrap_or_else(|| format!("run-{}", inst.retry_count));
    Some(StreamKey { object_id, workflow_id: inst.workflow_id.clone(), fencing_token })
}
