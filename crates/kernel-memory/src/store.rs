use kernel_core::domain::*;
use kernel_core::ports::*;
use kernel_core::transition::{Guard, Transition};
use kernel_core::WorkflowId;
use kernel_core::{validate, Error, Result};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

#[derive(Debug, Default, Clone)]
struct State {
    by_id: BTreeMap<WorkflowId, WorkflowInstance>,
    by_biz_key: BTreeMap<String, WorkflowId>,
}

/// In-memory [`WorkflowStore`]: one lock per call, reference semantics from
/// [`Guard::matches`] and [`Transition::apply_to`]. It refuses exactly what every store
/// refuses, with the shared checks of kernel-core ([`WorkflowInstance::validate`],
/// [`Guard::validate`], [`Transition::validate`], [`ClaimSpec::validate`]), the payload
/// limit [`validate::STORE_PAYLOAD_BYTES_MAX`] and the document limit
/// [`validate::DOCUMENT_BYTES_MAX`] (a create or write that would make the stored instance
/// larger is refused, as MongoDB refuses a document over 16 MiB).
///
/// Clones share state; [`fork`](Self::fork) copies it (a crash = fork the durable state,
/// drop the engine, restart on the fork).
#[derive(Debug, Clone)]
pub struct InMemoryStore {
    state: Arc<Mutex<State>>,
    document_bytes_max: usize,
}

impl Default for InMemoryStore {
    fn default() -> Self {
        InMemoryStore { state: Arc::default(), document_bytes_max: validate::DOCUMENT_BYTES_MAX }
    }
}

impl InMemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
    /// The same store refusing documents over `bytes_max` serialized bytes instead of
    /// [`validate::DOCUMENT_BYTES_MAX`] (so a test can reach the limit with a few steps).
    pub fn with_document_bytes_max(mut self, bytes_max: usize) -> Self {
        self.document_bytes_max = bytes_max;
        self
    }
    /// An independent copy of the current state.
    pub fn fork(&self) -> Self {
        InMemoryStore {
            state: Arc::new(Mutex::new(self.state.lock().expect("store lock").clone())),
            document_bytes_max: self.document_bytes_max,
        }
    }
    /// Every instance, ordered by workflow id.
    pub fn all(&self) -> Vec<WorkflowInstance> {
        self.state.lock().expect("store lock").by_id.values().cloned().collect()
    }
    /// Read without going through the async port (for harness assertions).
    pub fn peek(&self, workflow_id: &str) -> Option<WorkflowInstance> {
        self.state.lock().expect("store lock").by_id.get(workflow_id).cloned()
    }
}

#[async_trait::async_trait]
impl WorkflowStore for InMemoryStore {
    async fn create(&self, instance: WorkflowInstance) -> Result<CreateOutcome> {
        instance.validate(validate::STORE_PAYLOAD_BYTES_MAX)?;
        validate::document("document", &instance, self.document_bytes_max)?;
        let mut st = self.state.lock().expect("store lock");
        if let Some(id) = st.by_biz_key.get(&instance.biz_key) {
            return Ok(CreateOutcome::Exists(st.by_id[id].clone()));
        }
        if st.by_id.contains_key(&instance.workflow_id) {
            return Err(Error::Conflict(format!(
                "workflow_id `{}` exists under another biz_key",
                instance.workflow_id
            )));
        }
        st.by_biz_key.insert(instance.biz_key.clone(), instance.workflow_id.clone());
        st.by_id.insert(instance.workflow_id.clone(), instance.clone());
        Ok(CreateOutcome::Created(instance))
    }

    async fn get(&self, workflow_id: &WorkflowId) -> Result<Option<WorkflowInstance>> {
        validate::identifier("workflow_id", workflow_id)?;
        Ok(self.state.lock().expect("store lock").by_id.get(workflow_id).cloned())
    }

    async fn get_by_biz_key(&self, biz_key: &str) -> Result<Option<WorkflowInstance>> {
        validate::identifier("biz_key", biz_key)?;
        let st = self.state.lock().expect("store lock");
        Ok(st.by_biz_key.get(biz_key).and_then(|id| st.by_id.get(id)).cloned())
    }

    async fn claim(&self, workflow_id: &WorkflowId, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        validate::identifier("workflow_id", workflow_id)?;
        spec.validate()?;
        let (guard, transition) = (spec.guard(), spec.transition()?);
        let mut st = self.state.lock().expect("store lock");
        let Some(inst) = st.by_id.get_mut(workflow_id) else { return Ok(None) };
        if !guard.matches(inst) {
            return Ok(None);
        }
        transition.apply_to(inst);
        Ok(Some(inst.clone()))
    }

    async fn claim_any(&self, spec: &ClaimSpec) -> Result<Option<WorkflowInstance>> {
        spec.validate()?;
        let (guard, transition) = (spec.guard(), spec.transition()?);
        let mut st = self.state.lock().expect("store lock");
        let Some(inst) = st.by_id.values_mut().find(|i| guard.matches(i)) else { return Ok(None) };
        transition.apply_to(inst);
        Ok(Some(inst.clone()))
    }

    async fn apply(&self, workflow_id: &WorkflowId, guard: &Guard, transition: &Transition) -> Result<WriteOutcome> {
        validate::identifier("workflow_id", workflow_id)?;
        guard.validate()?;
        transition.validate(validate::STORE_PAYLOAD_BYTES_MAX)?;
        let mut st = self.state.lock().expect("store lock");
        let Some(inst) = st.by_id.get_mut(workflow_id) else { return Ok(WriteOutcome::Missed) };
        if !guard.matches(inst) {
            return Ok(WriteOutcome::Missed);
        }
        if transition.steps.iter().any(|p| p.index as usize >= inst.steps.len()) {
            return Err(Error::invalid("transition.steps", "step index out of range"));
        }
        let mut after = inst.clone();
        transition.apply_to(&mut after);
        validate::document("document", &after, self.document_bytes_max)?;
        *inst = after;
        Ok(WriteOutcome::Applied { revision: inst.revision })
    }

    async fn scan_due_waits(&self, now: Instant, after: Option<&DueCursor>, limit: usize) -> Result<ScanPage<DueWait>> {
        if let Some(a) = after {
            validate::identifier("after", &a.workflow_id)?;
        }
        let st = self.state.lock().expect("store lock");
        // Longest due first, as every store orders it: by `(claimable_time, workflow_id)`.
        let mut due: Vec<(Instant, &WorkflowInstance)> = st
            .by_id
            .values()
            .filter(|i| i.status == WorkflowStatus::Waiting && i.wait.is_some())
            .filter_map(|i| i.claimable_time.filter(|c| *c <= now).map(|c| (c, i)))
            .filter(|(c, i)| {
                after.is_none_or(|a| (*c, i.workflow_id.as_str()) > (a.claimable_time, a.workflow_id.as_str()))
            })
            .collect();
        due.sort_by(|(a, x), (b, y)| (a, x.workflow_id.as_str()).cmp(&(b, y.workflow_id.as_str())));
        due.truncate(limit);
        let last_time = due.last().map(|(c, _)| *c);
        let rows = due
            .into_iter()
            .filter_map(|(_, i)| {
                let w = i.wait.as_ref()?;
                Some(DueWait {
                    workflow_id: i.workflow_id.clone(),
                    step_index: w.step_index(),
                    resume: w.due_resume(),
                    priority: i.business_priority,
                })
            })
            .collect();
        Ok(ScanPage { last_time, ..ScanPage::of(rows, |d: &DueWait| &d.workflow_id) })
    }

    async fn scan_claimable(&self, after: Option<&WorkflowId>, limit: usize) -> Result<ScanPage<Candidate>> {
        if let Some(a) = after {
            validate::identifier("after", a)?;
        }
        let st = self.state.lock().expect("store lock");
        let iter: Box<dyn Iterator<Item = &WorkflowInstance>> = match after {
            Some(a) => Box::new(
                st.by_id
                    .range::<str, _>((std::ops::Bound::Excluded(a.as_str()), std::ops::Bound::Unbounded))
                    .map(|(_, v)| v),
            ),
            None => Box::new(st.by_id.values()),
        };
        let rows = iter
            .filter(|i| matches!(i.status, WorkflowStatus::Running | WorkflowStatus::Failing))
            .filter_map(|i| {
                Some(Candidate {
                    workflow_id: i.workflow_id.clone(),
                    priority: i.business_priority,
                    claimable_time: i.claimable_time?,
                })
            })
            .take(limit)
            .collect();
        Ok(ScanPage::of(rows, |c: &Candidate| &c.workflow_id))
    }
}
