use kernel_core::domain::Instant;
use kernel_core::ports::*;
use kernel_core::{validate, Error, Result};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// In-memory [`DeadLetters`]; clones share state. Every call takes one lock, so each is
/// linearizable like the conditional single-record writes of the real adapters.
#[derive(Debug, Default, Clone)]
pub struct MemoryDeadLetters {
    records: Arc<Mutex<BTreeMap<String, DeadLetter>>>,
}

impl MemoryDeadLetters {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
    /// Every record, ordered by id.
    pub fn all(&self) -> Vec<DeadLetter> {
        self.records.lock().expect("dead-letter lock").values().cloned().collect()
    }
}

#[async_trait::async_trait]
impl DeadLetters for MemoryDeadLetters {
    async fn record(&self, dl: &DeadLetter) -> Result<bool> {
        // The shared K-2.0 rule, so this fake refuses exactly what a real store refuses.
        dl.validate_new()?;
        let mut r = self.records.lock().expect("dead-letter lock");
        if r.contains_key(&dl.id) {
            return Ok(false);
        }
        r.insert(dl.id.clone(), dl.clone());
        Ok(true)
    }

    async fn get(&self, id: &str) -> Result<Option<DeadLetter>> {
        validate::identifier("id", id)?;
        Ok(self.records.lock().expect("dead-letter lock").get(id).cloned())
    }

    async fn list(
        &self,
        status: Option<DeadLetterStatus>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>> {
        validate_dead_letter_list(after, limit)?;
        let r = self.records.lock().expect("dead-letter lock");
        Ok(r.values()
            .filter(|d| status.is_none_or(|s| d.status == s) && after.is_none_or(|a| d.id.as_str() > a))
            .take(limit)
            .cloned()
            .collect())
    }

    async fn decide(&self, id: &str, decision: &DeadLetterDecision) -> Result<DecideOutcome> {
        validate::identifier("id", id)?;
        decision.validate()?;
        let mut r = self.records.lock().expect("dead-letter lock");
        let Some(d) = r.get_mut(id) else { return Ok(DecideOutcome::NotFound) };
        match d.status {
            DeadLetterStatus::Open => {
                d.status = DeadLetterStatus::Decided;
                d.decision = Some(decision.clone());
                Ok(DecideOutcome::Decided)
            }
            DeadLetterStatus::Decided => match &d.decision {
                Some(existing) => Ok(DecideOutcome::AlreadyDecided(existing.clone())),
                None => Err(Error::corrupt(format!("dead letter `{id}` is decided without a decision"))),
            },
            DeadLetterStatus::Closed => Ok(DecideOutcome::Closed),
        }
    }

    async fn close(&self, id: &str, now: Instant) -> Result<bool> {
        validate::identifier("id", id)?;
        let mut r = self.records.lock().expect("dead-letter lock");
        match r.get_mut(id) {
            Some(d) if d.status == DeadLetterStatus::Decided => {
                d.status = DeadLetterStatus::Closed;
                d.closed_at = Some(now);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn purge_closed(&self, before: Instant, limit: usize) -> Result<u64> {
        validate_dead_letter_purge(limit)?;
        let mut r = self.records.lock().expect("dead-letter lock");
        let gone: Vec<String> = r
            .values()
            .filter(|d| d.status == DeadLetterStatus::Closed && d.closed_at.is_some_and(|t| t < before))
            .take(limit)
            .map(|d| d.id.clone())
            .collect();
        for id in &gone {
            r.remove(id);
        }
        Ok(gone.len() as u64)
    }
}
