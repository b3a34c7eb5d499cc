//! The one way an operator action reaches an instance (K-6.8): cancel and regenerate, and
//! every bulk action built on them.
//!
//! The action is read against the instance ([`route`](super::operator_decision::route)):
//! an instance no claim holds takes the action directly, under `Guard::Operator` (the
//! revision read, no claim token); an instance with a claim token gets an
//! [`OperatorRequest`] instead, under the holder's token, which the request replaces. The
//! holder's next guarded write then misses; once its activities have returned, it applies
//! the request ([`apply_request`]). If the holder is gone, the worker that claims the
//! instance after the lease has ended applies it before it starts anything. The lease is
//! never shortened and never cleared by an operator, so no two executions of one step
//! overlap. A write that misses is read again and decided again, at most three times.

use super::operator_decision::{self, ActionEffect, RequestEnd, Route, WhilePending};
use super::{effects, ClaimEnd, Engine, Inner};
use crate::definition::Definition;
use crate::domain::*;
use crate::error::{Error, Result};
use crate::id::{ClaimToken, WorkflowId};
use crate::operator_request::{OperatorRequest, RequestedAction};
use crate::ports::*;
use crate::transition::{Guard, Transition};
use std::sync::Arc;

use super::operator::Regenerated;

/// How many times an operator action reads and writes again when the instance changed
/// between its read and its write.
const OPERATOR_ATTEMPTS: usize = 3;

/// How an operator action reached its instance (K-6.8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acted<T> {
    /// Written: the action took effect now.
    Applied(T),
    /// Recorded as a request for the holder of the instance's claim: it takes effect when
    /// that claim ends (its holder applies it), or, if the holder is gone, when the next
    /// worker claims the instance after the lease has ended. `wfk show` and the console
    /// show it as pending until then.
    Requested {
        /// The request's id.
        request_id: String,
    },
}

impl<T> Acted<T> {
    /// What the action did, when it was applied now; `None` when it was requested.
    pub fn applied(self) -> Option<T> {
        match self {
            Acted::Applied(t) => Some(t),
            Acted::Requested { .. } => None,
        }
    }
}

/// What [`Engine::cancel`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelOutcome {
    /// `→ canceled` now: no claim held the instance.
    Canceled,
    /// A claim holds the instance: the cancel is recorded as a request its holder applies
    /// when the claim ends (K-6.8).
    Requested {
        /// The request's id.
        request_id: String,
    },
    /// Nothing to cancel: no such workflow, or it has ended already.
    NotActive,
}

impl Engine {
    /// Cancel / supersede (K-8): `running|waiting|failing → canceled`, no token needed.
    /// An instance a claim holds is never taken from its holder: the cancel is recorded as
    /// a request the holder applies when its claim ends (K-6.8), and the answer says so.
    /// Idempotent: a cancel already requested is reported again.
    ///
    /// Errors, nothing written: [`Error::InvalidInput`] for a bad id; [`Error::Conflict`]
    /// when the instance kept changing under three attempts.
    pub async fn cancel(&self, workflow_id: &WorkflowId) -> Result<CancelOutcome> {
        crate::validate::identifier("workflow_id", workflow_id.as_str())?;
        match self.operator_action(workflow_id, RequestedAction::Cancel).await {
            Ok(Acted::Applied(_)) => Ok(CancelOutcome::Canceled),
            Ok(Acted::Requested { request_id }) => Ok(CancelOutcome::Requested { request_id }),
            Err(Error::NotFound(_)) => Ok(CancelOutcome::NotActive),
            Err(Error::Conflict(m)) if m.ends_with(NOTHING_TO_ACT_ON) => Ok(CancelOutcome::NotActive),
            Err(e) => Err(e),
        }
    }

    /// Regenerate `step` of `workflow_id` (K-17.3): a new logical attempt of that step —
    /// the next epoch, so a new K-17.1 key — whose previous result moves to its bounded
    /// history; every step that depends on it (transitively) and has run starts a new
    /// attempt too; nothing else does. An instance a claim holds is never taken from its
    /// holder: the regenerate is recorded as a request its holder applies, computed from
    /// the instance as the claim leaves it (K-6.8).
    ///
    /// Errors, nothing written: [`Error::NotFound`] for an unknown workflow;
    /// [`Error::UnregisteredType`] when this engine has no definition of its type;
    /// [`Error::InvalidInput`] for a step the definition does not have; [`Error::Conflict`]
    /// for a terminal or failing instance, for a step that has not completed (never ran,
    /// or still running), while another kind of request is pending, and when the instance
    /// kept changing under three attempts.
    pub async fn regenerate(&self, workflow_id: &WorkflowId, step: &str) -> Result<Acted<Regenerated>> {
        crate::validate::identifier("workflow_id", workflow_id.as_str())?;
        let acted = self.operator_action(workflow_id, RequestedAction::Regenerate { step: step.to_string() }).await?;
        Ok(match acted {
            Acted::Applied(ActionEffect::Regenerated(r)) => Acted::Applied(r),
            Acted::Applied(ActionEffect::Canceled) => {
                return Err(Error::corrupt("a regenerate was written as a cancel"));
            }
            Acted::Requested { request_id } => Acted::Requested { request_id },
        })
    }

    /// The one mechanism of K-6.8 (module doc).
    async fn operator_action(&self, workflow_id: &WorkflowId, action: RequestedAction) -> Result<Acted<ActionEffect>> {
        let ports = &self.inner.ports;
        for _ in 0..OPERATOR_ATTEMPTS {
            let inst = ports.store.get(workflow_id).await?.ok_or_else(|| Error::NotFound(workflow_id.to_string()))?;
            // A cancel needs no definition; a regenerate needs this engine's.
            let def = self.inner.defs.get(&inst.workflow_type);
            if def.is_none() && matches!(action, RequestedAction::Regenerate { .. }) {
                return Err(Error::UnregisteredType(inst.workflow_type.clone()));
            }
            let plan = def.map(|d| d.plan());
            let now = ports.clock.now();
            let limits = self.inner.config.history_limits;
            let written = match operator_decision::route(&inst) {
                Route::Ended => {
                    return Err(Error::Conflict(format!(
                        "{workflow_id} is {}: {NOTHING_TO_ACT_ON}",
                        inst.status.as_str()
                    )))
                }
                Route::Direct => {
                    let (t, effect) = operator_decision::action_write(&inst, &action, plan, limits, now)?;
                    let guard = Guard::Operator { revision: inst.revision };
                    match ports.store.apply(workflow_id, &guard, &t).await? {
                        WriteOutcome::Applied { revision } => {
                            self.after_operator_write(inst, &t, revision).await;
                            Some(Acted::Applied(effect))
                        }
                        WriteOutcome::Missed => None,
                    }
                }
                Route::Request { holder } => {
                    // Refused now rather than dropped later: the action must apply to the
                    // instance as read (the holder recomputes it as it leaves it).
                    operator_decision::action_write(&inst, &action, plan, limits, now)?;
                    let request = OperatorRequest {
                        id: format!("req-{}", ports.ids.new_token()),
                        action: action.clone(),
                        holder: holder.clone(),
                        requested_at: now,
                    };
                    let id = request.id.clone();
                    let replacement = ClaimToken::from(ports.ids.new_token());
                    let t = Transition::operator_request(request, replacement, now);
                    self.write_request(workflow_id, holder, inst.clone(), &t)
                        .await?
                        .map(|()| Acted::Requested { request_id: id })
                }
                Route::Pending { request, token } => match operator_decision::while_pending(&request.action, &action) {
                    WhilePending::Same => Some(Acted::Requested { request_id: request.id.clone() }),
                    WhilePending::Refuse => {
                        return Err(Error::Conflict(format!(
                            "{workflow_id}: a {} request ({}) is pending for the holder of its claim; \
                             act again once it has been applied",
                            request.action.as_str(),
                            request.id
                        )))
                    }
                    WhilePending::Replace => {
                        let replaced = OperatorRequest {
                            id: format!("req-{}", ports.ids.new_token()),
                            action: action.clone(),
                            holder: request.holder.clone(),
                            requested_at: now,
                        };
                        let id = replaced.id.clone();
                        // A fresh token again: a worker about to apply the pending request
                        // (read before this write) misses, so it never applies the
                        // replaced one; the new one waits for the next claimer.
                        let t = Transition::operator_request(replaced, ClaimToken::from(ports.ids.new_token()), now);
                        self.write_request(workflow_id, token, inst.clone(), &t)
                            .await?
                            .map(|()| Acted::Requested { request_id: id })
                    }
                },
            };
            if let Some(acted) = written {
                return Ok(acted);
            }
        }
        Err(Error::Conflict(format!("{workflow_id} kept changing; the {} was not written", action.as_str())))
    }

    /// Write a request under `token`; `None` when it missed (read again).
    async fn write_request(
        &self,
        workflow_id: &WorkflowId,
        token: &ClaimToken,
        inst: WorkflowInstance,
        t: &Transition,
    ) -> Result<Option<()>> {
        match self.inner.ports.store.apply(workflow_id, &Guard::Token { token: token.clone() }, t).await? {
            WriteOutcome::Applied { revision } => {
                tracing::info!(%workflow_id, kinds = ?t.kinds().collect::<Vec<_>>(), "operator request recorded for the claim holder");
                let (priority, lease_end) = (inst.business_priority, inst.claimable_time);
                if self.inner.ports.observer.enabled() {
                    let mut after = inst;
                    t.apply_to(&mut after);
                    effects::observe(&*self.inner.ports.observer, &after, t, revision, self.inner.writer());
                }
                // A hint for the lease end, best effort: if the holder is gone, whoever
                // claims it then applies the request (the rebuild scan finds it anyway).
                if let Some(at) = lease_end {
                    let ports = &self.inner.ports;
                    effects::enqueue_and_wake(&*ports.queue, &*ports.wakeup, workflow_id, priority, at).await;
                }
                Ok(Some(()))
            }
            WriteOutcome::Missed => Ok(None),
        }
    }

    /// Observe a direct write and, when it made the instance claimable, enqueue it.
    async fn after_operator_write(&self, mut inst: WorkflowInstance, t: &Transition, revision: u64) {
        let ports = &self.inner.ports;
        t.apply_to(&mut inst);
        effects::observe(&*ports.observer, &inst, t, revision, self.inner.writer());
        if inst.status == WorkflowStatus::Running && inst.claimable_time.is_some() {
            let at = inst.claimable_time.unwrap_or(t.now);
            effects::enqueue_and_wake(&*ports.queue, &*ports.wakeup, &inst.workflow_id, inst.business_priority, at)
                .await;
        }
    }
}

/// The end of the refusal message of an action on an ended instance.
const NOTHING_TO_ACT_ON: &str = "nothing to act on";

/// Apply `inst`'s recorded request (K-6.8) under `token`, the instance's current claim
/// token: by the holder once its claim has ended and its activities have returned, or by
/// the worker that just claimed it, before anything runs. One write; a miss is claim loss.
pub(crate) async fn apply_request(
    inner: &Arc<Inner>,
    def: &Definition,
    inst: &WorkflowInstance,
    token: &ClaimToken,
) -> Option<ClaimEnd> {
    let ports = &inner.ports;
    let now = ports.clock.now();
    let (t, end) = operator_decision::request_write(inst, def.plan(), inner.config.history_limits, now)?;
    let writer = effects::Writer { worker_id: Some(&inner.config.worker_id), claim_token: Some(token) };
    match ports.store.apply(&inst.workflow_id, &Guard::Token { token: token.clone() }, &t).await {
        Ok(WriteOutcome::Applied { revision }) => {
            let mut after = inst.clone();
            t.apply_to(&mut after);
            effects::observe(&*ports.observer, &after, &t, revision, writer);
            match &end {
                RequestEnd::Applied(_) => tracing::info!(workflow_id = %inst.workflow_id, "operator request applied"),
                RequestEnd::Dropped(why) => {
                    tracing::warn!(workflow_id = %inst.workflow_id, why, "operator request no longer applies; dropped")
                }
            }
            if after.status.is_terminal() {
                return Some(ClaimEnd::Terminal(after.status));
            }
            if let Some(at) = after.claimable_time {
                effects::enqueue_and_wake(
                    &*ports.queue,
                    &*ports.wakeup,
                    &after.workflow_id,
                    after.business_priority,
                    at,
                )
                .await;
            }
            Some(ClaimEnd::Released)
        }
        Ok(WriteOutcome::Missed) => Some(ClaimEnd::ClaimLost),
        Err(e @ Error::InvalidInput { .. }) if matches!(end, RequestEnd::Applied(_)) => {
            // The store refuses the action's write (a document at its limit): the request
            // is dropped instead, so the instance does not stall on it.
            tracing::error!(workflow_id = %inst.workflow_id, error = %e, "the store refused an operator request's write; dropping the request");
            drop_request(inner, inst, token, &e.to_string()).await
        }
        Err(e) => {
            tracing::warn!(workflow_id = %inst.workflow_id, error = %e, "operator request not applied; the lease is left to expire");
            Some(ClaimEnd::Uncertain)
        }
    }
}

/// Clear `inst`'s request without applying it (its write was refused) and release the
/// claim at once, under `token`.
async fn drop_request(inner: &Arc<Inner>, inst: &WorkflowInstance, token: &ClaimToken, why: &str) -> Option<ClaimEnd> {
    let ports = &inner.ports;
    let t = Transition::request_applied(None, ports.clock.now());
    match ports.store.apply(&inst.workflow_id, &Guard::Token { token: token.clone() }, &t).await {
        Ok(WriteOutcome::Applied { revision }) => {
            tracing::warn!(workflow_id = %inst.workflow_id, why, "operator request dropped");
            let writer = effects::Writer { worker_id: Some(&inner.config.worker_id), claim_token: Some(token) };
            let mut after = inst.clone();
            t.apply_to(&mut after);
            effects::observe(&*ports.observer, &after, &t, revision, writer);
            effects::enqueue_and_wake(
                &*ports.queue,
                &*ports.wakeup,
                &after.workflow_id,
                after.business_priority,
                t.now,
            )
            .await;
            Some(ClaimEnd::Released)
        }
        Ok(WriteOutcome::Missed) => Some(ClaimEnd::ClaimLost),
        Err(_) => Some(ClaimEnd::Uncertain),
    }
}
