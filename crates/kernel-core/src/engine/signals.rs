//! Signal delivery, early-signal matching and the repair scan (K-9.3, K-9.4, K-9.6).

use super::effects::{self, QueueGate, Writer};
use super::Inner;
use crate::domain::*;
use crate::error::Result;
use crate::id::WorkflowId;
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

/// What a delivery and a match use: an engine's ports and bounds
/// ([`Inner::signal_ports`]), or a publisher's (a process with no engine delivers the same
/// way, [`Publisher::deliver_signal`](super::Publisher::deliver_signal)).
pub(crate) struct SignalPorts<'a> {
    pub(crate) store: &'a DynStore,
    pub(crate) inbox: &'a DynInbox,
    pub(crate) queue: &'a DynQueue,
    pub(crate) wakeup: &'a DynWakeup,
    pub(crate) clock: &'a DynClock,
    pub(crate) observer: &'a DynObservationSink,
    /// The writer of the activation's observation (none for a publisher).
    pub(crate) worker_id: Option<&'a str>,
    /// `EngineConfig::orphan_signals_per_workflow_max`.
    pub(crate) orphans_per_workflow_max: u64,
    /// `EngineConfig::orphan_signals_max`.
    pub(crate) orphans_max: u64,
}

impl Inner {
    /// The ports and bounds of this engine's deliveries.
    pub(crate) fn signal_ports(&self) -> SignalPorts<'_> {
        let p = &self.ports;
        SignalPorts {
            store: &*p.store,
            inbox: &*p.inbox,
            queue: &*p.queue,
            wakeup: &*p.wakeup,
            clock: &*p.clock,
            observer: &*p.observer,
            worker_id: Some(&self.config.worker_id),
            orphans_per_workflow_max: self.config.orphan_signals_per_workflow_max,
            orphans_max: self.config.orphan_signals_max,
        }
    }
}

/// What one delivery did, and whether the inbox already held its `signal_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Delivered {
    /// What the delivery did.
    pub outcome: DeliverOutcome,
    /// The insert found a record with this `signal_id` (a redelivery).
    pub seen_before: bool,
}

/// Inbox insert → CAS the matching wait → mark matched → enqueue + wakeup (K-9.3).
pub(crate) async fn deliver(inner: &Inner, s: Signal) -> Result<DeliverOutcome> {
    Ok(deliver_on(&inner.signal_ports(), s).await?.outcome)
}

/// [`deliver`] on the given ports.
pub(crate) async fn deliver_on(p: &SignalPorts<'_>, s: Signal) -> Result<Delivered> {
    validate::identifier("signal_id", &s.signal_id)?;
    validate::identifier("workflow_id", s.workflow_id.as_str())?;
    validate::identifier("signal_type", &s.signal_type)?;
    validate::identifier("wait_key", &s.wait_key)?;
    let now = p.clock.now();
    // A signal for a workflow id that does not exist (yet) is kept, but bounded: per id and
    // in total (K-9.3 keeps early signals; nothing keeps unbounded ones). A redelivery of a
    // stored record is not counted again.
    let orphan = match p.store.get(&s.workflow_id).await {
        Ok(found) => found.is_none(),
        // An instance that does not decode exists.
        Err(crate::Error::Corrupt { .. }) => false,
        Err(e) => return Err(e),
    };
    if orphan && p.inbox.get(&s.signal_id).await?.is_none() {
        let per = p.orphans_per_workflow_max;
        if p.inbox.count_pending_orphans(Some(&s.workflow_id), per).await? >= per {
            return Err(crate::Error::LimitExceeded { what: "orphan_signals_per_workflow_max".into(), max: per });
        }
        let total = p.orphans_max;
        if p.inbox.count_pending_orphans(None, total).await? >= total {
            return Err(crate::Error::LimitExceeded { what: "orphan_signals_max".into(), max: total });
        }
    }
    let record = SignalRecord {
        signal_id: s.signal_id.clone(),
        workflow_id: s.workflow_id.clone(),
        signal_type: s.signal_type.clone(),
        wait_key: s.wait_key.clone(),
        generation: s.generation,
        status: SignalStatus::Pending,
        created_at: now,
        match_time: None,
        orphan,
    };
    let (stored, seen_before) = match p.inbox.insert(record.clone()).await? {
        InsertOutcome::Inserted => (record, false),
        InsertOutcome::Duplicate(r) if r.status == SignalStatus::Matched => {
            return Ok(Delivered { outcome: DeliverOutcome::Duplicate, seen_before: true });
        }
        // A pending duplicate is the producer's retry after a partial delivery: finish it.
        InsertOutcome::Duplicate(r) => (r, true),
    };
    let matched = try_match_on(p, &stored, &QueueGate::default()).await?;
    let outcome = if matched { DeliverOutcome::Activated } else { DeliverOutcome::Pending };
    Ok(Delivered { outcome, seen_before })
}

/// Try to consume one pending record: activate its wait, or finish a half-done match.
/// Returns whether the record is now matched.
pub(crate) async fn try_match(inner: &Inner, rec: &SignalRecord) -> Result<bool> {
    try_match_on(&inner.signal_ports(), rec, &QueueGate::default()).await
}

/// [`try_match`] on the given ports, its enqueues going through `gate` (shared by a
/// maintenance pass).
async fn try_match_on(p: &SignalPorts<'_>, rec: &SignalRecord, gate: &QueueGate) -> Result<bool> {
    let Some(inst) = p.store.get(&rec.workflow_id).await? else { return Ok(false) };
    if rec.orphan {
        // The workflow exists now: its early signals leave the orphan bounds (kept as any
        // pending record of a live workflow is).
        p.inbox.clear_orphans(&rec.workflow_id).await?;
    }
    // Half-done match: the activation committed but the inbox was not marked (K-9.4).
    if inst.resume.as_ref().and_then(|r| r.signal_id.as_deref()) == Some(rec.signal_id.as_str()) {
        let now = p.clock.now();
        // The delivery that activated it may have died before its enqueue: enqueue again
        // (promote-only, so a queued entry is not disturbed), or the instance waits for the
        // rebuild scan.
        if inst.status == WorkflowStatus::Running {
            let at = inst.claimable_time.unwrap_or(now);
            gate.enqueue_and_wake(p.queue, p.wakeup, &rec.workflow_id, inst.business_priority, at).await;
        }
        p.inbox.mark_matched(&rec.signal_id, now).await?;
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
    let now = p.clock.now();
    let t = Transition::signal_activation(identity.step_index as usize, &rec.signal_id, now);
    match p.store.apply(&rec.workflow_id, &Guard::SignalWait(identity), &t).await? {
        WriteOutcome::Applied { revision } => {
            let mut after = inst.clone();
            t.apply_to(&mut after);
            let writer = Writer { worker_id: p.worker_id, claim_token: None };
            effects::observe(p.observer, &after, &t, revision, writer);
            // Enqueue before marking: the activation is committed, so the instance is
            // claimable whatever happens to the inbox write (a failed mark is finished by the
            // producer's retry or the repair scan, K-9.4).
            gate.enqueue_and_wake(p.queue, p.wakeup, &rec.workflow_id, inst.business_priority, now).await;
            p.inbox.mark_matched(&rec.signal_id, now).await?;
            Ok(true)
        }
        // The poll fallback, a timer scan or a duplicate won the CAS (K-9.5).
        WriteOutcome::Missed => Ok(false),
    }
}

/// Scan up to `pages` pages of pending records from the shared cursor and match what can
/// be matched. Returns how many were consumed.
/// A record whose instance does not decode is skipped, its instance added to `quarantined`;
/// a record that does not decode itself is paged past, noted once
/// ([`Inner::undecodable_signal`]) and added to `undecodable`; a record whose match fails
/// otherwise is skipped and counted (the second number), so one record never stops the
/// repair of every other.
pub(crate) async fn repair(
    inner: &Inner,
    pages: usize,
    gate: &QueueGate,
    quarantined: &mut Vec<Quarantined>,
    undecodable: &mut Vec<UndecodableSignal>,
) -> Result<(usize, usize)> {
    let (mut consumed, mut failures) = (0, 0);
    let ports = inner.signal_ports();
    for _ in 0..pages {
        let after = inner.repair_cursor.lock().expect("cursor lock").clone();
        let page = inner.ports.inbox.scan_pending(after.as_deref(), inner.config.scan_page_size).await?;
        let full = page.is_full(inner.config.scan_page_size);
        skip_undecodable(inner, &page, undecodable);
        for rec in &page.records {
            match try_match_on(&ports, rec, gate).await {
                Ok(true) => consumed += 1,
                Ok(false) => {}
                // One undecodable instance must not stop the repair of every other.
                Err(crate::Error::Corrupt { message, .. }) => {
                    quarantined.push(Quarantined { workflow_id: rec.workflow_id.clone(), reason: message })
                }
                Err(e) => {
                    failures += 1;
                    tracing::warn!(signal_id = %rec.signal_id, error = %e, "signal repair failed; the next pass tries again");
                }
            }
        }
        *inner.repair_cursor.lock().expect("cursor lock") = if full { page.last } else { None };
        if !full {
            break;
        }
    }
    Ok((consumed, failures))
}

/// Retention (K-9.4), one page of records older than `before` from the shared cursor. A
/// record may go only when its workflow is terminal or absent, when it is pending for an
/// older generation than the workflow's current wait of the same type and key, when it is
/// pending beyond the newest `pending_signals_per_workflow_max` of its live workflow (and
/// not for the current wait's generation or a newer one), or when it is matched beyond the
/// newest `matched_signals_per_workflow_max` of its live workflow.
/// Returns how many were deleted; records of an undecodable instance are kept and the
/// instance added to `quarantined`; records that do not decode are kept, paged past and
/// added to `undecodable`.
pub(crate) async fn retain(
    inner: &Inner,
    before: Instant,
    quarantined: &mut Vec<Quarantined>,
    undecodable: &mut Vec<UndecodableSignal>,
) -> Result<u64> {
    let page_size = inner.config.scan_page_size.min(INBOX_DELETE_IDS_MAX);
    let after = inner.retention_cursor.lock().expect("cursor lock").clone();
    let page = inner.ports.inbox.scan_created_before(before, after.as_deref(), page_size).await?;
    let full = page.is_full(page_size);
    skip_undecodable(inner, &page, undecodable);
    let mut by_workflow: std::collections::BTreeMap<&WorkflowId, Vec<&SignalRecord>> = Default::default();
    for r in &page.records {
        by_workflow.entry(&r.workflow_id).or_default().push(r);
    }
    let (mut pending, mut matched) = (Vec::new(), Vec::new());
    let cap = inner.config.matched_signals_per_workflow_max;
    let pending_cap = inner.config.pending_signals_per_workflow_max;
    for (workflow_id, records) in by_workflow {
        let inst = match inner.ports.store.get(workflow_id).await {
            Ok(i) => i,
            Err(crate::Error::Corrupt { message, .. }) => {
                quarantined.push(Quarantined { workflow_id: workflow_id.clone(), reason: message });
                continue;
            }
            Err(e) => return Err(e),
        };
        let live = inst.as_ref().filter(|i| !i.status.is_terminal());
        let Some(inst) = live else {
            for r in records {
                match r.status {
                    SignalStatus::Pending => pending.push(r.signal_id.clone()),
                    SignalStatus::Matched => matched.push(r.signal_id.clone()),
                }
            }
            continue;
        };
        let current = inst.wait.as_ref().and_then(Wait::signal_identity);
        let same_wait = |r: &SignalRecord| {
            current.as_ref().is_some_and(|w| w.signal_type == r.signal_type && w.wait_key == r.wait_key)
        };
        let mut others = false;
        for r in records.iter().filter(|r| r.status == SignalStatus::Pending) {
            let stale = same_wait(r) && current.as_ref().is_some_and(|w| r.generation < w.generation);
            if stale {
                pending.push(r.signal_id.clone());
            } else {
                others = true;
            }
        }
        if others {
            // Newest first: pending records past the cap that are also old enough may go,
            // never one of the current wait's generation or a newer one.
            let newest = inner
                .ports
                .inbox
                .scan_workflow(workflow_id, SignalStatus::Pending, pending_cap.saturating_add(page_size))
                .await?;
            let may_go = |r: &SignalRecord| {
                r.created_at < before
                    && !(same_wait(r) && current.as_ref().is_some_and(|w| r.generation >= w.generation))
            };
            pending.extend(newest.into_iter().skip(pending_cap).filter(|r| may_go(r)).map(|r| r.signal_id));
        }
        if records.iter().any(|r| r.status == SignalStatus::Matched) {
            // Newest first: everything past the cap that is also old enough may go.
            let newest = inner
                .ports
                .inbox
                .scan_workflow(workflow_id, SignalStatus::Matched, cap.saturating_add(page_size))
                .await?;
            matched.extend(newest.into_iter().skip(cap).filter(|r| r.created_at < before).map(|r| r.signal_id));
        }
    }
    pending.sort();
    pending.dedup();
    pending.truncate(INBOX_DELETE_IDS_MAX);
    matched.truncate(INBOX_DELETE_IDS_MAX);
    let mut deleted = 0;
    if !pending.is_empty() {
        deleted += inner.ports.inbox.delete_if(&pending, SignalStatus::Pending).await?;
    }
    if !matched.is_empty() {
        deleted += inner.ports.inbox.delete_if(&matched, SignalStatus::Matched).await?;
    }
    *inner.retention_cursor.lock().expect("cursor lock") = if full { page.last.clone() } else { None };
    Ok(deleted)
}

/// The records of `page` that do not decode: noted once per engine and added to `found`;
/// the scan pages past them (K-9.4: one bad record never stops the others).
fn skip_undecodable(inner: &Inner, page: &SignalPage, found: &mut Vec<UndecodableSignal>) {
    for u in &page.undecodable {
        inner.undecodable_signal(u);
        found.push(u.clone());
    }
}
