//! The maintenance pass (K-9.2, K-9.4, K-13): timer activation, signal repair, inbox
//! retention, bounded purges of the side records and the rebuild scan, and the loop that
//! runs it on the clock.

use super::*;

/// Note a part of the pass that failed as a whole: logged, reported, skipped.
fn phase_failed(report: &mut MaintenanceReport, phase: &'static str, e: &Error) {
    tracing::warn!(phase, error = %e, "a maintenance phase failed; the rest of the pass goes on");
    report.phases_failed.push(phase);
}

impl Engine {
    /// Timer activation (K-9.2), pending-signal repair (K-9.4), one page of inbox retention
    /// and the rebuild scan (K-13), each bounded by `scan_page_size × scan_pages_max`. An
    /// instance or inbox record that does not decode is skipped and reported
    /// ([`MaintenanceReport::quarantined`], [`MaintenanceReport::undecodable_signals`]),
    /// never the end of the pass; after the first Redis error the pass makes no more Redis
    /// calls ([`MaintenanceReport::queue_unavailable`]). The pass is recorded for
    /// [`RunningEngine::health`].
    pub async fn maintain(&self) -> Result<MaintenanceReport> {
        let result = self.maintenance_pass().await;
        let outcome = match &result {
            Ok(report) => Ok(report.clone()),
            Err(e) => Err(e.to_string()),
        };
        let finished_at = self.inner.ports.clock.now();
        self.inner.health.maintenance_finished(MaintenancePass { finished_at, outcome });
        result
    }

    async fn maintenance_pass(&self) -> Result<MaintenanceReport> {
        let inner = &self.inner;
        let mut report = MaintenanceReport::default();
        let now = inner.ports.clock.now();
        // One gate for the pass: after the first Redis error no more Redis calls (K-13).
        let gate = QueueGate::default();
        let (queue, wakeup) = (&*inner.ports.queue, &*inner.ports.wakeup);
        // Timers first: they never need Redis to wake (K-9.2). The scan goes on from where
        // the last pass stopped, so documents that stay due (quarantined ones) are paged past
        // instead of read again; at the end of the due set it starts over.
        for _ in 0..inner.config.scan_pages_max {
            let after = inner.timer_cursor.lock().expect("cursor lock").clone();
            let page = inner.ports.store.scan_due_waits(now, after.as_ref(), inner.config.scan_page_size).await?;
            let full = page.is_full(inner.config.scan_page_size);
            self.quarantined(&page.quarantined, &mut report);
            let next = if full { page.due_cursor() } else { None };
            for d in page.rows {
                let t = Transition::timer_activation(d.step_index as usize, d.resume, now);
                let guard = Guard::DueWait { now, step_index: d.step_index };
                // One failing activation must not stop the others: skip it, count it; the
                // next pass finds the wait due again.
                let written = match inner.ports.store.apply(&d.workflow_id, &guard, &t).await {
                    Ok(w) => w,
                    Err(e) => {
                        report.item_failures += 1;
                        tracing::warn!(workflow_id = %d.workflow_id, error = %e, "timer activation failed; the next pass tries again");
                        continue;
                    }
                };
                if let WriteOutcome::Applied { revision } = written {
                    report.activated += 1;
                    // The read only serves the observation: skipped for a disabled sink.
                    if inner.ports.observer.enabled() {
                        if let Ok(Some(inst)) = inner.ports.store.get(&d.workflow_id).await {
                            effects::observe(&*inner.ports.observer, &inst, &t, revision, inner.writer());
                        }
                    }
                    gate.enqueue_and_wake(queue, wakeup, &d.workflow_id, d.priority, now).await;
                }
            }
            let done = next.is_none();
            *inner.timer_cursor.lock().expect("cursor lock") = next;
            if done {
                break;
            }
        }
        // A part of the pass that fails as a whole (an inbox page that cannot be read) is
        // skipped and reported; the rest of the pass still runs.
        let (mut repair_quarantined, mut undecodable) = (Vec::new(), Vec::new());
        let pages = inner.config.scan_pages_max;
        let repair = signals::repair(inner, pages, &gate, &mut repair_quarantined, &mut undecodable).await;
        match repair {
            Ok((repaired, failures)) => {
                report.signals_repaired = repaired;
                report.item_failures += failures;
            }
            Err(e) => phase_failed(&mut report, "signal_repair", &e),
        }
        self.quarantined(&repair_quarantined, &mut report);
        // Retention keeps the inbox bounded, one page per pass, and deletes only what no wait
        // and no redelivery can need (K-9.4).
        let cutoff = now.saturating_sub(inner.config.signal_retention_ms);
        let mut retention_quarantined = Vec::new();
        match signals::retain(inner, cutoff, &mut retention_quarantined, &mut undecodable).await {
            Ok(n) => report.signals_purged = n,
            Err(e) => phase_failed(&mut report, "signal_retention", &e),
        }
        self.quarantined(&retention_quarantined, &mut report);
        // Inbox records that do not decode were paged past (and logged once): reported,
        // each once per pass.
        for u in undecodable {
            if !report.undecodable_signals.contains(&u.signal_id) {
                report.undecodable_signals.push(u.signal_id);
            }
        }
        // The side records stay bounded too (K-17.2, K-17.7): expired cache entries and dead
        // letters closed longer than their retention, one page per pass. Best effort: they
        // decide nothing, so a failure is logged and the pass goes on.
        let page = inner.config.scan_page_size.clamp(1, CACHE_PURGE_LIMIT_MAX.min(DEAD_LETTER_PURGE_MAX));
        if let Some(cache) = &inner.ports.result_cache {
            match cache.purge_expired(now, page).await {
                Ok(n) => report.cache_purged = n,
                Err(e) => tracing::warn!(error = %e, "result cache purge failed; the next pass tries again"),
            }
        }
        if let Some(dls) = &inner.ports.dead_letters {
            let before = now.saturating_sub(inner.config.dead_letter_retention_ms);
            match dls.purge_closed(before, page).await {
                Ok(n) => report.dead_letters_purged = n,
                Err(e) => tracing::warn!(error = %e, "dead-letter purge failed; the next pass tries again"),
            }
        }
        // Rebuild: re-enqueue claimable instances even while the queue has a backlog. With
        // Redis down there is nothing to rebuild into: the scan waits for the next pass.
        for _ in 0..inner.config.scan_pages_max {
            if gate.is_down() {
                break;
            }
            let after = inner.rebuild_cursor.lock().expect("cursor lock").clone();
            let page = inner.ports.store.scan_claimable(after.as_ref(), inner.config.scan_page_size).await?;
            let full = page.is_full(inner.config.scan_page_size);
            let last = page.last.clone();
            self.quarantined(&page.quarantined, &mut report);
            for c in &page.rows {
                if gate.enqueue(queue, &c.workflow_id, c.priority, c.claimable_time).await {
                    report.enqueued += 1;
                }
            }
            if gate.is_down() {
                // Keep the cursor: the next pass starts this page over.
                break;
            }
            *inner.rebuild_cursor.lock().expect("cursor lock") = if full { last } else { None };
            if !full {
                break;
            }
        }
        if report.enqueued > 0 {
            gate.notify(wakeup).await;
        }
        report.queue_unavailable = gate.is_down();
        report.enqueue_skipped = gate.skipped();
        Ok(report)
    }

    fn quarantined(&self, found: &[Quarantined], report: &mut MaintenanceReport) {
        for q in found {
            self.inner.quarantine(&q.workflow_id, &q.reason);
            if !report.quarantined.contains(&q.workflow_id) {
                report.quarantined.push(q.workflow_id.clone());
            }
        }
    }

    pub(super) async fn maintenance_loop(&self) {
        let inner = &self.inner;
        loop {
            let next = inner.ports.clock.now().saturating_add(inner.config.rebuild_interval_ms);
            tokio::select! {
                _ = inner.stopping.cancelled() => return,
                _ = inner.ports.clock.sleep_until(next) => {}
            }
            if let Err(e) = self.maintain().await {
                tracing::warn!(worker = %inner.config.worker_id, error = %e, "maintenance pass failed");
            }
        }
    }
}
