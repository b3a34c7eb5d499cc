//! A plain write the store refused (K-6.4): counted on the instance with the hand-back, and
//! bounded per run — at [`REFUSED_WRITES_MAX`](super::terminal::REFUSED_WRITES_MAX) the
//! workflow fails instead ([`terminal::after_refused_plain`] decides how), never running
//! business code without its context or on another version's instance.

use super::*;
use crate::transition::TransitionKind;
use terminal::{AfterRefusedPlain, RefusedPlain};

/// What the claim keeps of a plain write before it is sent, for the case it is refused.
pub(super) struct Refused {
    kind: RefusedPlain,
    /// The first step the write concerned.
    step: Option<usize>,
    /// PrepareContext's failures the refused release carried.
    prepare_failures: Option<u32>,
    /// A refused `failed`: the same write without its report (the undone steps' marks).
    without_report: Option<Transition>,
}

impl Refused {
    pub(super) fn of(g: G, t: &Transition) -> Self {
        let kind = match t.kind() {
            TransitionKind::FingerprintPushBack => RefusedPlain::PushBack,
            TransitionKind::PrepareRelease => RefusedPlain::Prepare,
            TransitionKind::Failed => RefusedPlain::Failed,
            _ if matches!(g, G::Failing) => RefusedPlain::InFailing,
            _ => RefusedPlain::Running,
        };
        let without_report = (kind == RefusedPlain::Failed).then(|| {
            let mut f = t.clone();
            f.compensation = None;
            f
        });
        Refused {
            kind,
            step: t.kinds_at().iter().find_map(|k| k.step).map(|s| s as usize),
            prepare_failures: t.prepare_failures,
            without_report,
        }
    }

    /// A refused mark-running of step `idx`.
    pub(super) fn mark_running(idx: usize) -> Self {
        Refused { kind: RefusedPlain::Running, step: Some(idx), prepare_failures: None, without_report: None }
    }
}

impl Claim {
    /// After the store refused a plain write under `g`: hand the claim back with the run's
    /// count recorded, or, at the limit, fail the workflow as
    /// [`terminal::after_refused_plain`] says.
    pub(super) async fn refused_plain(&self, g: G, w: Refused, e: crate::error::Error) -> ClaimEnd {
        let (refused, failures) = {
            let d = self.doc();
            (d.inst.refused_writes.saturating_add(1), d.inst.prepare_failures)
        };
        let after = terminal::after_refused_plain(refused, w.step, w.kind);
        if after != AfterRefusedPlain::HandBack {
            tracing::error!(refused, error = %e, next = ?after, "the store refused this run's plain writes too often");
        }
        match after {
            AfterRefusedPlain::HandBack => self.hand_back_counting(g, Some(refused)).await,
            AfterRefusedPlain::FailStep(idx) => self.fail_refused(idx, &e, RefusedWrite::Outcome).await,
            AfterRefusedPlain::FailWorkflow => match self.commit(G::Running, Transition::failing(self.now())).await {
                Ok(()) => self.fail_path().await,
                Err(u) => self.unwritten(u, G::Running).await,
            },
            AfterRefusedPlain::FailWithoutContext => {
                let failures = w.prepare_failures.unwrap_or(failures);
                match self.commit(g, Transition::failing(self.now())).await {
                    Ok(()) => self.fail_path_without_context(failures).await,
                    Err(u) => self.unwritten(u, g).await,
                }
            }
            AfterRefusedPlain::EscalateAndFail => {
                let error = format!("not run: the store refused this workflow's writes {refused} times ({e})");
                let report = match self.escalate_remaining(compensation_plan::inverse_error(&error)).await {
                    Ok(r) => r,
                    Err(end) => return end,
                };
                let t = terminal::failed_write(report, self.now());
                let fallback = {
                    let mut f = t.clone();
                    f.compensation = None;
                    f
                };
                self.write_failed_once(t, Some(fallback)).await
            }
            AfterRefusedPlain::FailedWithoutReport => match w.without_report {
                Some(t) => self.write_failed_once(t, None).await,
                None => self.write_failed_once(Transition::failed(self.now()), None).await,
            },
        }
    }

    /// `→ failed` by `t`, then by `fallback` if the store refuses `t`; no hand-back.
    async fn write_failed_once(&self, t: Transition, fallback: Option<Transition>) -> ClaimEnd {
        match self.commit(G::Failing, t).await {
            Ok(()) => {
                self.on_terminal().await;
                ClaimEnd::Terminal(WorkflowStatus::Failed)
            }
            Err(Unwritten::Refused(e)) => match fallback {
                Some(f) => {
                    tracing::error!(error = %e, "`failed` with its report was refused; writing it without");
                    Box::pin(self.write_failed_once(f, None)).await
                }
                None => self.unwritten(Unwritten::Refused(e), G::Failing).await,
            },
            Err(u) => self.unwritten(u, G::Failing).await,
        }
    }

    /// A write past the limit that did not commit: a miss or an uncertain outcome ends the
    /// claim; an unavailable store hands it back; a refusal leaves the lease to expire.
    async fn unwritten(&self, u: Unwritten, g: G) -> ClaimEnd {
        match u {
            Unwritten::End(end) => end,
            Unwritten::Unavailable => self.hand_back(g).await,
            Unwritten::Refused(e) => {
                tracing::error!(error = %e, "the store refused the workflow's last way out; the lease is left to expire");
                self.cancel.cancel();
                ClaimEnd::Uncertain
            }
        }
    }
}
