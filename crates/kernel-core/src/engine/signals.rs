//! Signal delivery, early-signal matching and the repair scan (K-9.3, K-9.4, K-9.6).

use super::effects::{self, QueueGate, Writer};
use super::Inner;
use crate::error::Result;
use crate::model::*;
use crate::ports::*;
use crate::transition::{Guard, Transition};
use crate::validate;
use std::sync::Arc;

struct Delivery {
    inner: Arc<Inner>,
}

/// A signal sender delivering through this engine (K-10 fan-out from activities).
pub(crate) fn sender(inner: &Arc<Inner>) -> SignalSender {
    SignalSender::new(Arc::new(Delivery { inner: inner.clone() }))
}

#[async_trait::async_trait]
impl SignalDelivery for Delivery {
    async fn deliver(&self, signal: Signal) -> Result<DeliverOutcome> {
        deliver(&self.inner, signal).await
    }
}

/// Inbox insert → CAS the matching wait → mark matched → enqueue + wakeup (K-9.3).
pub(crate) async fn deliver(inner: &Inner, s: Signal) -> Result<DeliverOutcome> {
    validate::identifier("signal_id", &s.signal_id)?;
    validate::identifier("workflow_id", s.workflow_id.as_str())?;
    validate::identifier("signal_type", &s.signal_type)?;
    validate::identifier("wait_key", &s.wait_key)?;
    let now = inner.ports.clock.now();
    let record = SignalRecord {
        signal_id: s.signal_id.clone(),
        workflow_id: s.workflow_id.clone(),
        signal_type: s.signal_type.clone(),
        wait_key: s.wait_key.clone(),
        generation: s.generation,
        status: SignalStatus::Pending,
        created_at: now,
        match_time: None,
    };
    let stored = match inner.ports.inbox.insert(record.clone()).await? {
        InsertOutcome::Inserted => record,
        InsertOutcome::Duplicate(r) if r.status == SignalStatus::Matched => return Ok(DeliverOutcome::Duplicate),
        // A pending duplicate is the producer's retry after a partial delivery: finish it.
        InsertOutcome::Duplicate(r) => r,
    };
    Ok(if try_match(inner, &stored).await? { DeliverOutcome::Activated } else { DeliverOutcome::Pending })
}

/// Try to consume one pending record: activate its wait, or finish a half-done match.
/// Returns whether the record is now matched.
pub(crate) async fn try_match(inner: &Inner, rec: &SignalRecord) -> Result<bool> {
    try_match_gated(inner, rec, &QueueGate::default()).await
}

/// [`try_match`] with its enqueues going through `gate`, shared by a maintenance pass.
async fn try_match_gated(inner: &Inner, rec: &SignalRecord, gate: &QueueGate) -> Result<bool> {
    let Some(inst) = inner.ports.store.get(&rec.workflow_id).await? else { return Ok(false) };
    // Half-done match: the activation committed but the inbox was not marked (K-9.4).
    if inst.resume.as_ref().and_then(|r| r.signal_id.as_deref()) == Some(rec.signal_id.as_str()) {
        let now = inner.ports.clock.now();
        // The delivery that activated it may have died before its enqueue: enqueue again
        // (promote-only, so a queued entry is not disturbed), or the instance waits for the
        // rebuild scan.
        if inst.status == WorkflowStatus::Running {
            let at = inst.claimable_time.unwrap_or(now);
            gate.enqueue_and_wake(
                &*inner.ports.queue,
                &*inner.ports.wakeup,
                &rec.workflow_id,
                inst.business_priority,
                at,
            )
            .await;
        }
        inner.ports.inbox.mark_matched(&rec.signal_id, now).await?;
        return Ok(true);
    }
    if inst.status != WorkflowStatus::Waiting {
        return Ok(false);
    }
    let Some(identity) = inst.wait.as_ref().and_then(Wait::signal_identity) else { return Ok(false) };
    // K-9.6: the generation is part of the identity; a stale one never matches.
    if identity.signal_type != rec.signal_type
        || identity.wait_key != rec.wait_key
        || identity.generation != rec.generation
    {
        return Ok(false);
    }
    let now = inner.ports.clock.now();
    let t = Transition::signal_activation(identity.step_index as usize, &rec.signal_id, now);
    match inner.ports.store.apply(&rec.workflow_id, &Guard::SignalWait(identity), &t).await? {
        WriteOutcome::Applied { revision } => {
            let mut after = inst.clone();
            t.apply_to(&mut after);
            let writer = Writer { worker_id: Some(&inner.config.worker_id), claim_token: None };
            effects::observe(&*inner.ports.observer, &after, &t, revision, writer);
            // Enqueue before marking: the activation is committed, so the instance is
            // claimable whatever happens to the inbox write (a failed mark is finished by the
            // producer's retry or the repair scan, K-9.4).
            let (queue, wakeup) = (&*inner.ports.queue, &*inner.ports.wakeup);
            gate.enqueue_and_wake(queue, wakeup, &rec.workflow_id, inst.business_priority, now).await;
            inner.ports.inbox.mark_matched(&rec.signal_id, now).await?;
            Ok(true)
        }
        // The poll fallback, a timer scan or a duplicate won the CAS (K-9.5).
        WriteOutcome::Missed => Ok(false),
    }
}

/// Scan up to `pages` pages of pending records from the shared cursor and match what can
/// be matched. Returns how many were consumed.
/// A record whose instance does not decode is skipped, its instance added to `quarantined`.
pub(crate) async fn repair(
    inner: &Inner,
    pages: usize,
    gate: &QueueGate,
    quarantined: &mut Vec<Quarantined>,
) -> Result<usize> {
    let mut consumed = 0;
    for _ in 0..pages {
        let after = inner.repair_cursor.lock().expect("cursor lock").clone();
        let page = inner.ports.inbox.scan_pending(after.as_deref(), inner.config.scan_page_size).await?;
        let full = page.len() == inner.config.scan_page_size;
        for rec in &page {
            match try_match_gated(inner, rec, gate).await {
                Ok(true) => consumed += 1,
                Ok(false) => {}
                // One undecodable instance must not stop the repair of every other.
                Err(crate::Error::Corrupt { message, .. }) => {
                    quarantined.push(Quarantined { workflow_id: rec.workflow_id.clone(), reason: message })
                }
                Err(e) => return Err(e),
            }
        }
        *inner.repair_cursor.lock().expect("cursor lock") =
            if full { page.last().map(|r| r.signal_id.clone()) } else { None };
        if !full {
            break;
        }
    }
    Ok(consumed)
}
