//! A plain write the store refused (K-6.4): counted on the instance with the hand-back, and
//! bounded per run — at [`REFUSED_WRITES_MAX`](super::terminal::REFUSED_WRITES_MAX) the
//! workflow fails instead, through the same ladder as a refused step outcome.

use super::*;

impl Claim {
    /// After the store refused a plain write under `g` that concerned `step`: hand the
    /// claim back with the run's count recorded, or, at the limit, fail the workflow.
    pub(super) async fn refused_plain(&self, g: G, step: Option<usize>, e: crate::error::Error) -> ClaimEnd {
        let refused = self.doc().inst.refused_writes.saturating_add(1);
        let failing = matches!(g, G::Failing);
        match terminal::after_refused_plain(refused, step, failing) {
            terminal::AfterRefusedPlain::HandBack => self.hand_back_refused(g, refused).await,
            terminal::AfterRefusedPlain::FailStep(idx) => {
                tracing::error!(refused, error = %e, "the store refused this run's plain writes too often; failing the step");
                self.fail_refused(idx, &e, RefusedWrite::Outcome).await
            }
            terminal::AfterRefusedPlain::FailWorkflow => {
                tracing::error!(refused, error = %e, "the store refused this run's plain writes too often; failing");
                match self.commit(G::Running, Transition::failing(self.now())).await {
                    Ok(()) => self.fail_path().await,
                    Err(Unwritten::End(end)) => end,
                    Err(Unwritten::Unavailable) => self.hand_back(G::Running).await,
                    Err(Unwritten::Refused(e)) => {
                        tracing::error!(error = %e, "even `failing` was refused; the lease is left to expire");
                        self.cancel.cancel();
                        ClaimEnd::Uncertain
                    }
                }
            }
            terminal::AfterRefusedPlain::FailedWithoutReport => {
                tracing::error!(refused, error = %e, "the store refused `failed` too often; failing without the report");
                match self.commit(G::Failing, Transition::failed(self.now())).await {
                    Ok(()) => {
                        self.on_terminal().await;
                        ClaimEnd::Terminal(WorkflowStatus::Failed)
                    }
                    Err(Unwritten::End(end)) => end,
                    Err(Unwritten::Unavailable) => self.hand_back(G::Failing).await,
                    Err(Unwritten::Refused(e)) => {
                        tracing::error!(error = %e, "even `failed` was refused; the lease is left to expire");
                        self.cancel.cancel();
                        ClaimEnd::Uncertain
                    }
                }
            }
        }
    }

    /// The hand-back of a refused plain write: released until `now + permit_retry_ms`
    /// with the run's count of refused writes; if the release cannot be written either,
    /// the lease is left to expire.
    async fn hand_back_refused(&self, g: G, refused: u32) -> ClaimEnd {
        self.cancel.cancel();
        let now = self.now();
        let delay = self.inner.config.permit_retry_ms;
        let Ok(t) = Transition::refused_release(refused, now, delay) else { return ClaimEnd::Uncertain };
        match self.inner.ports.store.apply(&self.workflow_id, &self.guard(g), &t).await {
            Ok(WriteOutcome::Applied { revision }) => {
                self.applied(&t, revision);
                self.enqueue(self.priority(), now.saturating_add(delay)).await;
                ClaimEnd::Released
            }
            Ok(WriteOutcome::Missed) => ClaimEnd::ClaimLost,
            Err(e) => {
                tracing::warn!(error = %e, "hand-back not written; the lease is left to expire");
                ClaimEnd::Uncertain
            }
        }
    }
}
