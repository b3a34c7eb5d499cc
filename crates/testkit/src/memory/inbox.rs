use kernel_core::model::Instant;
use kernel_core::ports::*;
use kernel_core::WorkflowId;
use kernel_core::{validate, Result};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// In-memory [`SignalInbox`]; clones share state, [`fork`](Self::fork) copies it.
#[derive(Debug, Default, Clone)]
pub struct InMemoryInbox {
    records: Arc<Mutex<BTreeMap<String, SignalRecord>>>,
}

impl InMemoryInbox {
    /// An empty inbox.
    pub fn new() -> Self {
        Self::default()
    }
    /// An independent copy.
    pub fn fork(&self) -> Self {
        InMemoryInbox { records: Arc::new(Mutex::new(self.records.lock().expect("inbox lock").clone())) }
    }
    /// Every record.
    pub fn all(&self) -> Vec<SignalRecord> {
        self.records.lock().expect("inbox lock").values().cloned().collect()
    }
}

#[async_trait::async_trait]
impl SignalInbox for InMemoryInbox {
    async fn insert(&self, record: SignalRecord) -> Result<InsertOutcome> {
        // The shared K-2.0 rule, so this fake refuses exactly what a real inbox refuses.
        record.validate()?;
        let mut r = self.records.lock().expect("inbox lock");
        if let Some(existing) = r.get(&record.signal_id) {
            return Ok(InsertOutcome::Duplicate(existing.clone()));
        }
        r.insert(record.signal_id.clone(), record);
        Ok(InsertOutcome::Inserted)
    }

    async fn get(&self, signal_id: &str) -> Result<Option<SignalRecord>> {
        validate::identifier("signal_id", signal_id)?;
        Ok(self.records.lock().expect("inbox lock").get(signal_id).cloned())
    }

    async fn find_pending(
        &self,
        workflow_id: &WorkflowId,
        signal_type: &str,
        wait_key: &str,
        generation: u64,
    ) -> Result<Option<SignalRecord>> {
        validate::identifier("workflow_id", workflow_id)?;
        validate::identifier("signal_type", signal_type)?;
        validate::identifier("wait_key", wait_key)?;
        let r = self.records.lock().expect("inbox lock");
        Ok(r.values()
            .filter(|s| {
                s.status == SignalStatus::Pending
                    && s.workflow_id == *workflow_id
                    && s.signal_type == signal_type
                    && s.wait_key == wait_key
                    && s.generation == generation
            })
            .min_by_key(|s| (s.created_at, s.signal_id.clone()))
            .cloned())
    }

    async fn mark_matched(&self, signal_id: &str, now: Instant) -> Result<bool> {
        validate::identifier("signal_id", signal_id)?;
        let mut r = self.records.lock().expect("inbox lock");
        match r.get_mut(signal_id) {
            Some(s) if s.status == SignalStatus::Pending => {
                s.status = SignalStatus::Matched;
                s.match_time = Some(now);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn scan_pending(&self, after: Option<&str>, limit: usize) -> Result<Vec<SignalRecord>> {
        if let Some(a) = after {
            validate::identifier("after", a)?;
        }
        let r = self.records.lock().expect("inbox lock");
        Ok(r.values()
            .filter(|s| s.status == SignalStatus::Pending && after.is_none_or(|a| s.signal_id.as_str() > a))
            .take(limit)
            .cloned()
            .collect())
    }

    async fn scan_created_before(
        &self,
        before: Instant,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<SignalRecord>> {
        if let Some(a) = after {
            validate::identifier("after", a)?;
        }
        let r = self.records.lock().expect("inbox lock");
        Ok(r.values()
            .filter(|s| s.created_at < before && after.is_none_or(|a| s.signal_id.as_str() > a))
            .take(limit)
            .cloned()
            .collect())
    }

    async fn scan_workflow(
        &self,
        workflow_id: &WorkflowId,
        status: SignalStatus,
        limit: usize,
    ) -> Result<Vec<SignalRecord>> {
        validate::identifier("workflow_id", workflow_id)?;
        let r = self.records.lock().expect("inbox lock");
        let mut v: Vec<SignalRecord> =
            r.values().filter(|s| s.workflow_id == *workflow_id && s.status == status).cloned().collect();
        v.sort_by(|a, b| (b.created_at, &b.signal_id).cmp(&(a.created_at, &a.signal_id)));
        v.truncate(limit);
        Ok(v)
    }

    async fn delete_if(&self, signal_ids: &[String], status: SignalStatus) -> Result<u64> {
        validate_delete_ids(signal_ids)?;
        let mut r = self.records.lock().expect("inbox lock");
        let mut deleted = 0;
        for id in signal_ids {
            if r.get(id).is_some_and(|s| s.status == status) {
                r.remove(id);
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    async fn count_pending_orphans(&self, workflow_id: Option<&WorkflowId>, limit: u64) -> Result<u64> {
        if let Some(w) = workflow_id {
            validate::identifier("workflow_id", w)?;
        }
        let r = self.records.lock().expect("inbox lock");
        let n = r
            .values()
            .filter(|s| {
                s.orphan && s.status == SignalStatus::Pending && workflow_id.is_none_or(|w| s.workflow_id == *w)
            })
            .take(limit as usize)
            .count();
        Ok(n as u64)
    }

    async fn clear_orphans(&self, workflow_id: &WorkflowId) -> Result<u64> {
        validate::identifier("workflow_id", workflow_id)?;
        let mut r = self.records.lock().expect("inbox lock");
        let mut n = 0;
        for s in r.values_mut().filter(|s| s.orphan && s.workflow_id == *workflow_id) {
            s.orphan = false;
            n += 1;
        }
        Ok(n)
    }
}
