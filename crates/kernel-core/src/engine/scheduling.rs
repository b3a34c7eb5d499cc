//! Scheduling rounds (K-6.1, K-6.7): take free slots, pop at most that many candidates in
//! one call, claim them concurrently, fall back to the store when the queue fails, and run
//! each claim won to its end (`Engine::tick`, `Engine::tick_from_store`, the spawned run
//! loop).

use super::*;

impl Engine {
    /// One scheduling round (K-6.7): repair signals when due, take a slot, pop one
    /// candidate at a time (≤ `candidates_per_round_max` stale ones), claim, and run the
    /// claim won to its end. Falls back to the store when the queue errors, or is empty
    /// after a failed repair.
    pub async fn tick(&self) -> Result<RoundOutcome> {
        let Ok(permit) = self.inner.slots.clone().try_acquire_owned() else {
            return Ok(RoundOutcome::NoSlot);
        };
        let round = self.claim_round(1).await?;
        let out = match round.won.into_iter().next() {
            Some(Won { inst, token }) => {
                let id = inst.workflow_id.clone();
                let end = run_claim(self.inner.clone(), *inst, token).await;
                RoundOutcome::Ran { workflow_id: id, end }
            }
            None => RoundOutcome::Idle { stale: round.stale },
        };
        drop(permit);
        Ok(out)
    }

    /// One scheduling round for `slots` free slots (K-6.1, K-6.7; the caller holds them):
    /// repair signals when due, pop at most as many candidates as slots are still free in
    /// one call, claim them concurrently, and pop again for the slots left by stale
    /// candidates, meeting at most `candidates_per_round_max` stale candidates in the round
    /// (each pop asks for no more than the slots still free and the stale candidates still
    /// allowed). Falls back to claiming from the store, one free slot after the
    /// other, when the queue errors, or when it ran dry after a failed repair with no stale
    /// candidate in this round. Never returns more claims than `slots`.
    ///
    /// A claim won is never dropped: an error after the first win ends the round with the
    /// claims won so far (logged); an error before any win is returned.
    async fn claim_round(&self, slots: usize) -> Result<Round> {
        let inner = &self.inner;
        debug_assert!((1..=POP_DUE_MAX).contains(&slots), "{slots} slots");
        let now = inner.ports.clock.now();
        if now >= Instant::from_millis(inner.next_repair_at.load(Ordering::Relaxed)) {
            inner
                .next_repair_at
                .store(now.saturating_add(inner.config.signal_repair_interval_ms).as_millis(), Ordering::Relaxed);
            let failed =
                signals::repair(inner, 1, &QueueGate::default(), &mut Vec::new(), &mut Vec::new()).await.is_err();
            inner.repair_failed.store(failed, Ordering::Relaxed);
        }
        let mut round = Round { won: Vec::with_capacity(slots), stale: 0, drained: false };
        let mut fallback = false;
        let stale_max = inner.config.candidates_per_round_max;
        for _ in 0..stale_max {
            // Never more than the free slots (K-6.1), nor more than the stale candidates
            // this round may still meet: at most `candidates_per_round_max` in all.
            let want = (slots - round.won.len()).min(stale_max.saturating_sub(round.stale));
            if want == 0 {
                break;
            }
            let now = inner.ports.clock.now();
            let ids = match inner.ports.queue.pop_due(now, want).await {
                Ok(ids) => ids,
                Err(e) => {
                    tracing::debug!(error = %e, "ready queue unavailable; claiming from the store");
                    fallback = true;
                    break;
                }
            };
            debug_assert!(ids.len() <= want, "popped {} for {want} free slots", ids.len());
            // Fewer than asked: nothing else was due (the port's contract).
            let short = ids.len() < want;
            let mut valid = Vec::with_capacity(ids.len());
            for id in ids.into_iter().take(want) {
                if crate::validate::identifier("workflow_id", id.as_str()).is_ok() {
                    valid.push(id);
                } else {
                    round.stale += 1;
                }
            }
            let claims = valid.into_iter().map(|id| {
                let spec = self.claim_spec(now);
                async move {
                    let r = inner.ports.store.claim(&id, &spec).await;
                    (id, spec.token, r)
                }
            });
            let mut failed = None;
            for (id, token, r) in futures::future::join_all(claims).await {
                match r {
                    Ok(Some(inst)) => round.won.push(Won { inst: Box::new(inst), token }),
                    Ok(None) => round.stale += 1,
                    // The lease is written and the instance does not decode: skip it and
                    // go on to the next candidate.
                    Err(crate::Error::Corrupt { message, .. }) => {
                        inner.quarantine(&id, &message);
                        round.stale += 1;
                    }
                    Err(e) => {
                        tracing::warn!(worker = %inner.config.worker_id, workflow_id = %id, error = %e, "claim failed");
                        failed = Some(e);
                    }
                }
            }
            if failed.is_some() {
                return Ok(round);
            }
            if short {
                round.drained = true;
                fallback = round.stale == 0 && inner.repair_failed.load(Ordering::Relaxed);
                break;
            }
        }
        if fallback {
            while round.won.len() < slots {
                match self.claim_from_store().await {
                    Ok(Some((inst, token))) => round.won.push(Won { inst: Box::new(inst), token }),
                    Ok(None) => {
                        round.drained = true;
                        break;
                    }
                    Err(e) if round.won.is_empty() => return Err(e),
                    Err(e) => {
                        tracing::warn!(worker = %inner.config.worker_id, error = %e, "store-fallback claim failed");
                        break;
                    }
                }
            }
        }
        debug_assert!(round.won.len() <= slots);
        Ok(round)
    }

    /// `claim_any` with a fresh token, past instances that do not decode: each is
    /// quarantined (its lease is written, so the next call claims another), up to
    /// `candidates_per_round_max` calls.
    async fn claim_from_store(&self) -> Result<Option<(WorkflowInstance, ClaimToken)>> {
        let inner = &self.inner;
        for _ in 0..inner.config.candidates_per_round_max.max(1) {
            let spec = self.claim_spec(inner.ports.clock.now());
            match inner.ports.store.claim_any(&spec).await {
                Ok(found) => return Ok(found.map(|inst| (inst, spec.token))),
                Err(e @ crate::Error::Corrupt { .. }) => match e.corrupt_workflow_id() {
                    Some(id) => inner.quarantine(id, &e.to_string()),
                    None => {
                        tracing::error!(worker = %inner.config.worker_id, error = %e, "claimed instance does not decode; skipped")
                    }
                },
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// A claim with a freshly minted token: the token the claim then runs with, never one
    /// read back from the document (K-6.2).
    fn claim_spec(&self, now: Instant) -> ClaimSpec {
        ClaimSpec {
            now,
            lease_ms: self.inner.config.lease_ms,
            token: ClaimToken::from(self.inner.ports.ids.new_token()),
            types: self.inner.types.clone(),
        }
    }

    /// Claim any due instance straight from the store, bypassing the queue (the fallback of
    /// K-6.7), and run it.
    pub async fn tick_from_store(&self) -> Result<RoundOutcome> {
        let Ok(permit) = self.inner.slots.clone().try_acquire_owned() else {
            return Ok(RoundOutcome::NoSlot);
        };
        let out = match self.claim_from_store().await? {
            Some((inst, token)) => {
                let id = inst.workflow_id.clone();
                RoundOutcome::Ran { workflow_id: id, end: run_claim(self.inner.clone(), inst, token).await }
            }
            None => RoundOutcome::Idle { stale: 0 },
        };
        drop(permit);
        Ok(out)
    }

    pub(super) async fn run_loop(&self) {
        let inner = self.inner.clone();
        let mut wake = match inner.ports.wakeup.subscribe().await {
            Ok(rx) => {
                inner.health.set_wakeup(WakeupState::Subscribed);
                Some(rx)
            }
            Err(e) => {
                tracing::warn!(error = %e, "wakeup subscription failed; polling only");
                inner.health.set_wakeup(WakeupState::Polling);
                None
            }
        };
        let mut claims = tokio::task::JoinSet::new();
        loop {
            // Fill the free slots: take them first (K-6.1), pop at most that many in one
            // call, claim them concurrently, and give back the slots nobody won.
            loop {
                if inner.stopping.is_cancelled() {
                    break;
                }
                let mut free: Vec<tokio::sync::OwnedSemaphorePermit> =
                    std::iter::from_fn(|| inner.slots.clone().try_acquire_owned().ok()).take(POP_DUE_MAX).collect();
                if free.is_empty() {
                    break;
                }
                let round = match self.claim_round(free.len()).await {
                    Ok(round) => round,
                    Err(e) => {
                        tracing::warn!(error = %e, "scheduling round failed");
                        break;
                    }
                };
                let won_any = !round.won.is_empty();
                for Won { inst, token } in round.won {
                    let slot = free.pop().expect("never more claims than free slots");
                    let inner2 = inner.clone();
                    claims.spawn(async move {
                        let _slot = slot;
                        run_claim(inner2, *inst, token).await
                    });
                }
                drop(free);
                // Nothing won, or nothing else due: wait for a wakeup, a poll or a claim's end.
                if !won_any || round.drained {
                    break;
                }
            }
            let next_poll = inner.ports.clock.now().saturating_add(inner.config.poll_interval_ms);
            tokio::select! {
                _ = inner.stopping.cancelled() => break,
                _ = inner.ports.clock.sleep_until(next_poll) => {}
                rung = async { match wake.as_mut() { Some(rx) => rx.recv().await, None => std::future::pending().await } } => {
                    if rung.is_none() {
                        tracing::warn!("wakeup subscription closed; polling only");
                        inner.health.set_wakeup(WakeupState::Polling);
                        wake = None;
                    }
                }
                Some(_) = claims.join_next(), if !claims.is_empty() => {
                    // Claims that ended together free their slots for one round, not one each.
                    while claims.try_join_next().is_some() {}
                }
            }
        }
        // Graceful: running claims finish on the root context (K-6.6).
        while claims.join_next().await.is_some() {}
    }
}

/// A claim won in a scheduling round.
struct Won {
    inst: Box<WorkflowInstance>,
    /// The token minted for the claim.
    token: ClaimToken,
}

/// What [`Engine::claim_round`] did.
struct Round {
    /// Claims won, at most one per free slot.
    won: Vec<Won>,
    /// Candidates popped whose claim missed (or that were not valid ids).
    stale: usize,
    /// Whether the round saw nothing else due (a pop came short, or the store fallback
    /// found nothing).
    drained: bool,
}
