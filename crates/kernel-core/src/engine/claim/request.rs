//! An operator's request at a claim's start or end (K-6.8): the claim applies a request
//! whose holder is gone before it runs anything, and a request addressed to itself once
//! its activities have returned ([`operator_write::apply_request`](super::super::operator_write::apply_request)).

use super::*;

/// At the start of a claim of `inst` won with `token`: apply the request its holder did
/// not (its claim is gone) before anything runs — after a half-done signal match is
/// finished (K-9.4), so a resume the request clears never leaves its record pending.
/// `None` when there is none to apply here (none, or a regenerate for another version).
pub(super) async fn apply_at_start(
    inner: &Arc<Inner>,
    def: &Definition,
    inst: &WorkflowInstance,
    token: &ClaimToken,
) -> Option<ClaimEnd> {
    if !super::super::operator_decision::applies_at_claim(inst, def.plan()) {
        return None;
    }
    if let Some(crate::domain::Resume { signal_id: Some(id), .. }) = &inst.resume {
        if inner.ports.inbox.mark_matched(id, inner.ports.clock.now()).await.is_err() {
            return None;
        }
    }
    super::super::operator_write::apply_request(inner, def, inst, token).await
}

impl Claim {
    /// After a miss: read the instance once and apply the operator's request addressed to
    /// this claim, if one replaced its token (K-6.8); `None` when there is none (the claim
    /// was lost to another worker) or the read failed (the next claimer applies it).
    pub(super) async fn apply_own_request(&self) -> Option<ClaimEnd> {
        let inst = match self.inner.ports.store.get(&self.workflow_id).await {
            Ok(Some(inst)) => inst,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(error = %e, "instance not read after a miss; a pending request is left to the next claimer");
                return None;
            }
        };
        let current = inst.claim_token.as_ref()?;
        if inst.operator_request.as_ref().is_none_or(|r| r.holder != self.token) {
            return None;
        }
        super::super::operator_write::apply_request(&self.inner, &self.def, &inst, current).await
    }
}
