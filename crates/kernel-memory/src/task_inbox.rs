use kernel_core::domain::Instant;
use kernel_core::ports::*;
use kernel_core::{validate, Result};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// In-memory [`TaskInbox`]; clones share state. Every call takes one lock, so each is
/// linearizable like the conditional single-record writes of the real adapters.
#[derive(Debug, Default, Clone)]
pub struct MemoryTaskInbox {
    records: Arc<Mutex<BTreeMap<String, TaskRecord>>>,
}

impl MemoryTaskInbox {
    /// An empty inbox.
    pub fn new() -> Self {
        Self::default()
    }
    /// Every record, whatever its status, ordered by id.
    pub fn all(&self) -> Vec<TaskRecord> {
        self.records.lock().expect("task-inbox lock").values().cloned().collect()
    }
}

#[async_trait::async_trait]
impl TaskInbox for MemoryTaskInbox {
    async fn open(&self, task: &TaskRecord) -> Result<Option<TaskRecord>> {
        // The shared K-2.0 rule, so this fake refuses exactly what a real store refuses.
        task.validate_new()?;
        let mut r = self.records.lock().expect("task-inbox lock");
        if let Some(stored) = r.get(&task.id) {
            return Ok(Some(stored.clone()));
        }
        r.insert(task.id.clone(), task.clone());
        Ok(None)
    }

    async fn get(&self, id: &str) -> Result<Option<TaskRecord>> {
        validate::identifier("id", id)?;
        Ok(self.records.lock().expect("task-inbox lock").get(id).cloned())
    }

    async fn list_open(&self, actor: &Actor, after: Option<&str>, limit: usize) -> Result<Vec<TaskRecord>> {
        validate_task_list(actor, after, limit)?;
        let r = self.records.lock().expect("task-inbox lock");
        Ok(r.values()
            .filter(|t| t.status == TaskStatus::Open && after.is_none_or(|a| t.id.as_str() > a) && t.eligible(actor))
            .take(limit)
            .cloned()
            .collect())
    }

    async fn decide(&self, id: &str, token: &str, actor: &Actor, decision: &TaskDecision) -> Result<TaskDecideOutcome> {
        validate_task_decide(id, token, actor, decision)?;
        let mut r = self.records.lock().expect("task-inbox lock");
        if let Some(refused) = task_decision_refused(r.get(id), token, actor, decision)? {
            return Ok(refused);
        }
        // Not refused: the record exists, is open and the token is its own.
        let t = r.get_mut(id).expect("checked above under the same lock");
        t.status = TaskStatus::Decided;
        t.decision = Some(decision.clone());
        Ok(TaskDecideOutcome::Decided)
    }

    async fn close(&self, id: &str, now: Instant) -> Result<TaskCloseOutcome> {
        validate::identifier("id", id)?;
        let mut r = self.records.lock().expect("task-inbox lock");
        let Some(t) = r.get_mut(id) else { return Ok(TaskCloseOutcome::NotFound) };
        if t.status == TaskStatus::Closed {
            return Ok(TaskCloseOutcome::AlreadyClosed);
        }
        t.status = TaskStatus::Closed;
        t.closed_at = Some(now);
        Ok(TaskCloseOutcome::Closed(t.decision.clone()))
    }

    async fn purge_sensitive_reasons(&self, before: Instant, limit: usize) -> Result<u64> {
        validate_task_purge(limit)?;
        let mut r = self.records.lock().expect("task-inbox lock");
        let mut purged = 0u64;
        for t in r.values_mut() {
            if purged as usize == limit {
                break;
            }
            let Some(d) = t.decision.as_mut() else { continue };
            if d.decided_at >= before {
                continue;
            }
            if let Some(TaskReason { sensitive: true, text: text @ Some(_) }) = d.reason.as_mut() {
                *text = None;
                purged += 1;
            }
        }
        Ok(purged)
    }

    async fn purge_closed(&self, before: Instant, limit: usize) -> Result<u64> {
        validate_task_purge(limit)?;
        let mut r = self.records.lock().expect("task-inbox lock");
        let gone: Vec<String> = r
            .values()
            .filter(|t| t.status == TaskStatus::Closed && t.closed_at.is_some_and(|c| c < before))
            .take(limit)
            .map(|t| t.id.clone())
            .collect();
        for id in &gone {
            r.remove(id);
        }
        Ok(gone.len() as u64)
    }
}
