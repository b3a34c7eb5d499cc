use kernel_core::domain::Instant;
use kernel_core::ports::*;
use kernel_core::WorkflowId;
use kernel_core::{validate, Error, Result};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// In-memory [`SignalInbox`]; clones share state, [`fork`](Self::fork) copies it.
#[derive(Debug, Default, Clone)]
pub struct InMemoryInbox {
    records: Arc<Mutex<BTreeMap<String, SignalRecord>>>,
    /// Pending records that do not decode, by `signal_id`: their `created_at`
    /// ([`plant_undecodable`](Self::plant_undecodable)).
    undecodable: Arc<Mutex<BTreeMap<String, Instant>>>,
}

/// Why a planted record does not decode.
const PLANTED_REASON: &str = "planted: the record does not decode";

impl InMemoryInbox {
    /// An empty inbox.
    pub fn new() -> Self {
        Self::default()
    }
    /// An independent copy.
    pub fn fork(&self) -> Self {
        InMemoryInbox {
            records: Arc::new(Mutex::new(self.records.lock().expect("inbox lock").clone())),
            undecodable: Arc::new(Mutex::new(self.undecodable.lock().expect("inbox lock").clone())),
        }
    }
    /// Every record (planted undecodable ones aside).
    pub fn all(&self) -> Vec<SignalRecord> {
        self.records.lock().expect("inbox lock").values().cloned().collect()
    }
    /// Store a pending record `signal_id`, created at `created_at`, that does not decode, as
    /// a record written by an incompatible version or changed outside the kernel reads in
    /// a real inbox (it replaces a record of that id): the scans report it in
    /// [`SignalPage::undecodable`] and page past it; `get` and a duplicate `insert` of it
    /// are [`Error::Corrupt`]; `delete_if` of pending records deletes it; the other calls
    /// do not see it.
    pub fn plant_undecodable(&self, signal_id: &str, created_at: Instant) {
        self.records.lock().expect("inbox lock").remove(signal_id);
        self.undecodable.lock().expect("inbox lock").insert(signal_id.to_string(), created_at);
    }

    /// A scan page: the records `keep` selects (by status and `created_at`; a planted
    /// record is pending) strictly after `after`, by `signal_id`, at most `limit`.
    fn page(
        &self,
        after: Option<&str>,
        limit: usize,
        keep: impl Fn(SignalStatus, Instant) -> bool,
    ) -> Result<SignalPage> {
        if let Some(a) = after {
            validate::identifier("after", a)?;
        }
        let r = self.records.lock().expect("inbox lock");
        let u = self.undecodable.lock().expect("inbox lock");
        let decoded = r.iter().filter(|(_, s)| keep(s.status, s.created_at)).map(|(id, s)| (id, Some(s)));
        let planted = u.iter().filter(|(_, at)| keep(SignalStatus::Pending, **at)).map(|(id, _)| (id, None));
        let mut rows: Vec<_> = decoded.chain(planted).filter(|(id, _)| after.is_none_or(|a| id.as_str() > a)).collect();
        rows.sort_by(|a, b| a.0.cmp(b.0));
        let mut page = SignalPage::default();
        for (id, record) in rows.into_iter().take(limit) {
            match record {
                Some(rec) => page.push(rec.clone()),
                None => page.push_undecodable(id.clone(), PLANTED_REASON.to_string(), true),
            }
        }
        Ok(page)
    }

    fn check_planted(&self, signal_id: &str) -> Result<()> {
        if self.undecodable.lock().expect("inbox lock").contains_key(signal_id) {
            return Err(Error::corrupt(format!("signal {signal_id}: {PLANTED_REASON}")));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl SignalInbox for InMemoryInbox {
    async fn insert(&self, record: SignalRecord) -> Result<InsertOutcome> {
        // The shared K-2.0 rule, so this fake refuses exactly what a real inbox refuses.
        record.validate()?;
        self.check_planted(&record.signal_id)?;
        let mut r = self.records.lock().expect("inbox lock");
        if let Some(existing) = r.get(&record.signal_id) {
            return Ok(InsertOutcome::Duplicate(existing.clone()));
        }
        r.insert(record.signal_id.clone(), record);
        Ok(InsertOutcome::Inserted)
    }

    async fn get(&self, signal_id: &str) -> Result<Option<SignalRecord>> {
        validate::identifier("signal_id", signal_id)?;
        self.check_planted(signal_id)?;
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

    async fn scan_pending(&self, after: Option<&str>, limit: usize) -> Result<SignalPage> {
        self.page(after, limit, |status, _| status == SignalStatus::Pending)
    }

    async fn scan_created_before(&self, before: Instant, after: Option<&str>, limit: usize) -> Result<SignalPage> {
        self.page(after, limit, |_, created_at| created_at < before)
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
        let mut u = self.undecodable.lock().expect("inbox lock");
        let mut deleted = 0;
        for id in signal_ids {
            if r.get(id).is_some_and(|s| s.status == status) {
                r.remove(id);
                deleted += 1;
            } else if status == SignalStatus::Pending && u.remove(id).is_some() {
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
