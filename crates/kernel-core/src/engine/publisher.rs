use super::effects::{self, Writer};
use super::{EngineConfig, Ports};
use crate::definition::PlanRegistry;
use crate::domain::*;
use crate::error::{Error, Result};
use crate::id::WorkflowId;
use crate::ports::*;
use crate::transition::{Guard, Transition, TransitionKind};
use crate::validate;
use futures::StreamExt;
use serde_json::Value;
use std::sync::Arc;

mod builder;
mod request;
pub use builder::PublisherBuilder;
pub use request::{StartOutcome, StartRequest};

/// Registers instances from plans (API or cron processes need no activities, K-4.1).
///
/// A process that only starts workflows builds one from the store, the queue and the
/// wakeup ([`Publisher::builder`]); an engine hands out one on its own ports
/// ([`Engine::publisher`](super::Engine::publisher)).
#[derive(Clone)]
pub struct Publisher {
    store: Arc<DynStore>,
    queue: Arc<DynQueue>,
    wakeup: Arc<DynWakeup>,
    clock: Arc<DynClock>,
    ids: Arc<DynIds>,
    observer: Arc<DynObservationSink>,
    stream: Arc<DynStreamSink>,
    plans: PlanRegistry,
    payload_bytes_max: usize,
    /// Where [`deliver_signal`](Publisher::deliver_signal) writes; none on a builder's
    /// publisher without [`PublisherBuilder::inbox`].
    inbox: Option<Arc<DynInbox>>,
    orphan_signals_per_workflow_max: u64,
    orphan_signals_max: u64,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher").field("plans", &self.plans).finish()
    }
}

impl Publisher {
    /// A publisher on an engine's `ports` knowing `plans`; the permits are not used, the
    /// inbox only by [`deliver_signal`](Self::deliver_signal) and
    /// the `kernel-events` crate's `EventRoute::deliver` (with the default orphan-signal bounds of
    /// [`EngineConfig`]; an engine's own [`publisher`](super::Engine::publisher) has the
    /// engine's).
    pub fn new(ports: Ports, plans: PlanRegistry, payload_bytes_max: usize) -> Self {
        let defaults = EngineConfig::default();
        Publisher {
            store: ports.store,
            queue: ports.queue,
            wakeup: ports.wakeup,
            clock: ports.clock,
            ids: ports.ids,
            observer: ports.observer,
            stream: ports.stream,
            plans,
            payload_bytes_max,
            inbox: Some(ports.inbox),
            orphan_signals_per_workflow_max: defaults.orphan_signals_per_workflow_max,
            orphan_signals_max: defaults.orphan_signals_max,
        }
    }

    /// The engine's orphan-signal bounds, for the publisher an engine hands out.
    pub(crate) fn with_orphan_bounds(mut self, per_workflow_max: u64, total_max: u64) -> Self {
        self.orphan_signals_per_workflow_max = per_workflow_max;
        self.orphan_signals_max = total_max;
        self
    }

    /// A standalone publisher (an API or cron process that only starts workflows) on the
    /// store, the queue and the wakeup; see [`PublisherBuilder`] for the defaults.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kernel_core::ports::*;
    /// # fn wire(store: Arc<DynStore>, queue: Arc<DynQueue>, wakeup: Arc<DynWakeup>, plan: kernel_core::Plan)
    /// # -> kernel_core::Result<()> {
    /// let publisher = kernel_core::Publisher::builder(store, queue, wakeup).plan(plan).build()?;
    /// # let _ = publisher;
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder(store: Arc<DynStore>, queue: Arc<DynQueue>, wakeup: Arc<DynWakeup>) -> PublisherBuilder {
        let defaults = EngineConfig::default();
        PublisherBuilder {
            publisher: Publisher {
                store,
                queue,
                wakeup,
                clock: Arc::new(SystemClock),
                ids: Arc::new(RandomIds::default()),
                observer: Arc::new(NoopObservationSink),
                stream: Arc::new(NoopStreamSink),
                plans: PlanRegistry::default(),
                payload_bytes_max: defaults.payload_bytes_max,
                inbox: None,
                orphan_signals_per_workflow_max: defaults.orphan_signals_per_workflow_max,
                orphan_signals_max: defaults.orphan_signals_max,
            },
            store_call_deadline_ms: defaults.store_call_deadline_ms,
        }
    }

    /// StartOrResume (K-5): idempotent on `biz_key`.
    ///
    /// - not found → create (duplicate-key loser re-reads and reuses). The create is the
    ///   first store call, with no read before it: a taken `biz_key` returns the stored
    ///   instance (`CreateOutcome::Exists`), which the cases below then read;
    /// - running / waiting → existing (priority raised, never lowered);
    /// - completed / canceled → existing, not activated;
    /// - failed in the request's own business round (`input.fencing_token`, non-empty) →
    ///   existing, not activated: a failed round is never replayed under its own round;
    /// - failed otherwise → replay by one CAS on `status = failed` and that condition (loser
    ///   re-reads);
    /// - failing → existing, `execution_activated = false`.
    ///
    /// Afterwards best-effort enqueue + wakeup, and a stream reset only when activated.
    /// Every bad input is a typed error and writes nothing. Many starts at once:
    /// [`start_many`](Self::start_many).
    pub async fn start_or_resume(&self, req: StartRequest) -> Result<StartOutcome> {
        self.start_with(req, FailedStart::Replay).await
    }

    /// [`start_or_resume`](Self::start_or_resume), except that an existing **failed**
    /// instance is returned as it is, never replayed (an event about a closed workflow, the
    /// `kernel-events` crate, must not start it again). Every other case, write and error is
    /// `start_or_resume`'s.
    pub async fn start_or_get(&self, req: StartRequest) -> Result<StartOutcome> {
        self.start_with(req, FailedStart::Keep).await
    }

    /// [`start_or_resume`](Self::start_or_resume), with what a failed instance gets.
    async fn start_with(&self, req: StartRequest, failed: FailedStart) -> Result<StartOutcome> {
        let Stored { outcome, candidate, now } = self.store_start(req, failed).await?;
        if let Some(LaneEntry { workflow_id, priority, claimable_at }) = &candidate {
            effects::enqueue_and_wake(&*self.queue, &*self.wakeup, workflow_id, *priority, *claimable_at).await;
        }
        if outcome.execution_activated {
            self.reset_stream(&outcome.instance, now).await;
        }
        Ok(outcome)
    }

    /// Most requests one [`start_many`](Self::start_many) takes (the queue's
    /// [`ENQUEUE_MANY_MAX`], so one batch is one enqueue call).
    pub const START_MANY_MAX: usize = ENQUEUE_MANY_MAX;

    /// Most starts of one [`start_many`](Self::start_many) whose store calls (and, after
    /// the enqueue, stream resets) are in flight at once.
    pub const START_MANY_IN_FLIGHT_MAX: usize = 32;

    /// Bulk StartOrResume (K-5): for each request exactly what
    /// [`start_or_resume`](Self::start_or_resume) guarantees — validation, the create or
    /// the replay and priority raise with their store writes per workflow, the same
    /// outcome — with the store work of up to [`START_MANY_IN_FLIGHT_MAX`](Self::START_MANY_IN_FLIGHT_MAX)
    /// requests in flight at once. Then, for the whole batch, ONE
    /// [`ReadyQueue::enqueue_many`] of every workflow that needs a candidate (the running
    /// ones, as `start_or_resume` enqueues them) and ONE wakeup ring; then the stream resets
    /// of the activated ones. Enqueue and ring are best effort as in `start_or_resume`: a
    /// queue failure never undoes a stored instance (the rebuild scan restores the lane).
    ///
    /// Returns one result per request, in request order: a bad request (a typed error,
    /// nothing written for it) does not hide the others' outcomes. Requests for the same
    /// `biz_key` in one batch behave as concurrent `start_or_resume` calls do (one creates,
    /// the others reuse it).
    ///
    /// # Errors
    /// A batch of more than [`START_MANY_MAX`](Self::START_MANY_MAX) requests is refused as
    /// a whole with [`Error::InvalidInput`] (field `requests`) before any store call: it is
    /// never split into several enqueue calls behind the caller's back; split it yourself.
    /// An empty batch returns an empty vector and makes no call.
    ///
    /// ```
    /// # use kernel_core::{Publisher, StartRequest};
    /// # async fn demo(publisher: Publisher) -> kernel_core::Result<()> {
    /// let requests = (0..3)
    ///     .map(|i| StartRequest::new("order", format!("order-{i}"), serde_json::json!({ "n": i })))
    ///     .chain([StartRequest::new("order", "bad\nkey", serde_json::json!({}))])
    ///     .collect();
    /// let results = publisher.start_many(requests).await?;
    /// assert_eq!(results.len(), 4);
    /// for r in &results[..3] {
    ///     assert!(r.as_ref().is_ok_and(|started| started.created));
    /// }
    /// assert!(matches!(results[3], Err(kernel_core::Error::InvalidInput { .. })));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn start_many(&self, requests: Vec<StartRequest>) -> Result<Vec<Result<StartOutcome>>> {
        if requests.len() > Self::START_MANY_MAX {
            return Err(Error::invalid(
                "requests",
                format_args!("{} requests exceed the limit of {}", requests.len(), Self::START_MANY_MAX),
            ));
        }
        let stored: Vec<Result<Stored>> =
            futures::stream::iter(requests.into_iter().map(|req| self.store_start(req, FailedStart::Replay)))
                .buffered(Self::START_MANY_IN_FLIGHT_MAX)
                .collect()
                .await;
        let entries: Vec<LaneEntry> =
            stored.iter().filter_map(|r| r.as_ref().ok().and_then(|s| s.candidate.clone())).collect();
        if !entries.is_empty() {
            effects::enqueue_many_and_wake(&*self.queue, &*self.wakeup, &entries).await;
        }
        let resets = stored.iter().filter_map(|r| r.as_ref().ok()).filter(|s| s.outcome.execution_activated);
        futures::stream::iter(resets)
            .for_each_concurrent(Self::START_MANY_IN_FLIGHT_MAX, |s| self.reset_stream(&s.outcome.instance, s.now))
            .await;
        Ok(stored.into_iter().map(|r| r.map(|s| s.outcome)).collect())
    }

    /// Deliver a signal (K-9.3) exactly as [`Engine::deliver_signal`](super::Engine::deliver_signal)
    /// does — the same code: inbox insert first, then the CAS of the matching wait, the
    /// enqueue + wakeup and the mark — from a process that has no engine (a webhook
    /// receiver, an API). The signal is a doorbell: write the business fact before.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (field `inbox`) on a publisher built without
    /// [`PublisherBuilder::inbox`], before any call; otherwise as the engine's delivery
    /// (identifier rule, [`Error::LimitExceeded`] for too many signals to a workflow id
    /// that does not exist).
    pub async fn deliver_signal(&self, signal: Signal) -> Result<DeliverOutcome> {
        Ok(self.deliver_signal_seen(signal).await?.outcome)
    }

    /// Replay the failed instance `workflow_id` with its stored input: a new run (K-5), by
    /// one CAS on `status = failed` — the same write [`start_or_resume`](Self::start_or_resume)
    /// makes for a failed instance, for an operator who has the id and no definitions.
    /// Afterwards best-effort enqueue + wakeup and a stream reset, as a start does.
    ///
    /// # Errors
    /// Nothing is written on any of them. [`Error::NotFound`] for an unknown id;
    /// [`Error::Conflict`] for an instance that is not failed, for one that belongs to a
    /// dispatch round (its input carries a `fencing_token`: a failed round is never
    /// replayed under its own round — dispatch a new round with `Dispatch::retry_failed`,
    /// K-11.4), and when the instance changed between the read and the write.
    ///
    /// ```
    /// # async fn demo(publisher: kernel_core::Publisher, id: kernel_core::WorkflowId) -> kernel_core::Result<()> {
    /// let run = publisher.replay(&id).await?;
    /// assert_eq!(run.status, kernel_core::WorkflowStatus::Running);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn replay(&self, workflow_id: &WorkflowId) -> Result<WorkflowInstance> {
        validate::identifier("workflow_id", workflow_id.as_str())?;
        let inst = self.store.get(workflow_id).await?.ok_or_else(|| Error::NotFound(workflow_id.to_string()))?;
        if inst.status != WorkflowStatus::Failed {
            return Err(Error::Conflict(format!(
                "{workflow_id} is {}, not failed: nothing to replay",
                inst.status.as_str()
            )));
        }
        let round = crate::id::BusinessRound::of(&inst.input);
        if let Some(token) = round.fencing_token.filter(|t| !t.as_str().is_empty()) {
            let object = round.object_id.map_or_else(|| "?".to_string(), |o| o.to_string());
            return Err(Error::Conflict(format!(
                "{workflow_id} belongs to dispatch round {token} of object {object}: a failed round is never replayed \
                 under its own round; dispatch a new round (retry-failed)"
            )));
        }
        let now = self.clock.now();
        // The stored input stays as it is (no input in the write): had a dispatcher replayed
        // the instance under a round since the read, its round token is not overwritten.
        let mut t = Transition::replay(Value::Null, now);
        t.input = None;
        let revision = match self.store.apply(workflow_id, &Guard::replay(&inst.input), &t).await? {
            WriteOutcome::Applied { revision } => revision,
            WriteOutcome::Missed => {
                return Err(Error::Conflict(format!(
                    "{workflow_id} changed before the replay was written; read it again"
                )))
            }
        };
        let after = self.store.get(workflow_id).await?.ok_or_else(|| Error::NotFound(workflow_id.to_string()))?;
        let mut observed = after.clone();
        observed.revision = revision;
        effects::observe(&*self.observer, &observed, &t, revision, Writer::default());
        effects::enqueue_and_wake(&*self.queue, &*self.wakeup, workflow_id, after.business_priority, now).await;
        self.reset_stream(&after, now).await;
        Ok(after)
    }

    /// A [`SignalSender`] delivering as [`deliver_signal`](Self::deliver_signal) does (a
    /// `TaskDesk` (the `kernel-tasks` crate) in a process without an engine).
    pub fn signal_sender(&self) -> SignalSender {
        SignalSender::new(std::sync::Arc::new(self.clone()))
    }

    /// [`deliver_signal`](Self::deliver_signal), saying also whether the inbox held the
    /// signal's id already (a redelivery). Errors as `deliver_signal`'s.
    pub async fn deliver_signal_seen(&self, signal: Signal) -> Result<super::signals::Delivered> {
        let ports = super::signals::SignalPorts {
            store: &*self.store,
            inbox: self.signal_inbox()?,
            queue: &*self.queue,
            wakeup: &*self.wakeup,
            clock: &*self.clock,
            observer: &*self.observer,
            worker_id: None,
            orphans_per_workflow_max: self.orphan_signals_per_workflow_max,
            orphans_max: self.orphan_signals_max,
        };
        super::signals::deliver_on(&ports, signal).await
    }

    /// `Ok` when this publisher can deliver signals, else the typed refusal of a publisher
    /// built without an inbox ([`Error::InvalidInput`], field `inbox`), before any call.
    pub fn require_inbox(&self) -> Result<()> {
        self.signal_inbox().map(|_| ())
    }

    /// The inbox signals go to, or the typed refusal of a publisher that has none.
    fn signal_inbox(&self) -> Result<&DynInbox> {
        self.inbox.as_deref().ok_or_else(|| {
            Error::invalid("inbox", "this publisher has no signal inbox (build it with `PublisherBuilder::inbox`)")
        })
    }

    /// Largest serialized input a start accepts.
    pub fn payload_bytes_max(&self) -> usize {
        self.payload_bytes_max
    }

    /// The plans this publisher can start.
    pub fn plans(&self) -> &PlanRegistry {
        &self.plans
    }

    /// Best-effort reset of the client stream of an instance whose execution a start
    /// activated at `now`.
    async fn reset_stream(&self, inst: &WorkflowInstance, now: Instant) {
        // The owner is the `claimable_time` this start wrote: any claim after it has a
        // greater lease end, so a late reset cannot wipe a worker's frames (K-16).
        if let Err(e) = self.stream.reset(&effects::stream_key(inst), StreamOwner { lease_until: now }).await {
            tracing::debug!(workflow_id = %inst.workflow_id, error = %e, "stream reset failed");
        }
    }

    /// The store side of one StartOrResume: validation and every store write, without the
    /// queue, the wakeup and the stream.
    async fn store_start(&self, req: StartRequest, failed: FailedStart) -> Result<Stored> {
        validate::identifier("workflow_type", &req.workflow_type)?;
        validate::identifier("biz_key", &req.biz_key)?;
        if let Some(id) = &req.workflow_id {
            validate::identifier("workflow_id", id.as_str())?;
        }
        validate::payload("input", &req.input, self.payload_bytes_max)?;
        let plan = self.plans.get(&req.workflow_type)?;
        let store = &self.store;
        let now = self.clock.now();

        // The create comes first, with no read before it: the unique `biz_key` decides, and
        // `Exists` carries the stored instance, so a new workflow costs one store call and an
        // existing one two (the create that found its key taken reads the winner back).
        let doc = WorkflowInstance {
            workflow_id: req.workflow_id.clone().unwrap_or_else(|| format!("wf-{}", self.ids.new_token()).into()),
            workflow_type: req.workflow_type.clone(),
            biz_key: req.biz_key.clone(),
            status: WorkflowStatus::Running,
            steps: plan.initial_steps(),
            input: req.input.clone(),
            output: Default::default(),
            claimable_time: Some(now),
            claim_token: None,
            wait: None,
            resume: None,
            definition_fingerprint: plan.fingerprint().to_string(),
            fingerprint_mismatch: None,
            business_priority: req.priority,
            retry_count: 0,
            prepare_failures: 0,
            refused_writes: 0,
            revision: 0,
            created_at: now,
            updated_at: now,
            finished_at: None,
            compensation: None,
            trace_parent: req.trace_parent.as_ref().map(|t| t.as_str().to_string()),
            operator_request: None,
        };
        let (mut inst, mut activated, created) = match store.create(doc).await? {
            CreateOutcome::Created(i) => {
                let t = Transition::new(TransitionKind::Create, now);
                effects::observe(&*self.observer, &i, &t, i.revision, Writer::default());
                (i, true, true)
            }
            CreateOutcome::Exists(i) => (i, false, false),
        };
        if inst.workflow_type != req.workflow_type {
            return Err(Error::Conflict(format!(
                "biz_key `{}` belongs to a `{}` workflow, not `{}`",
                req.biz_key, inst.workflow_type, req.workflow_type
            )));
        }
        if !created {
            let replay = Guard::replay(&req.input);
            match inst.status {
                // K-5: the failed instance of the request's own round is returned, not
                // replayed; the dispatcher settles that round's intent against it.
                WorkflowStatus::Failed if failed == FailedStart::Keep || !replay.matches(&inst) => {}
                WorkflowStatus::Failed => {
                    let t = Transition::replay(req.input.clone(), now);
                    let replayed = match store.apply(&inst.workflow_id, &replay, &t).await? {
                        WriteOutcome::Applied { revision } => Some(revision),
                        WriteOutcome::Missed => None,
                    };
                    inst = store
                        .get(&inst.workflow_id)
                        .await?
                        .ok_or_else(|| Error::NotFound(inst.workflow_id.to_string()))?;
                    if let Some(revision) = replayed {
                        activated = true;
                        // K-15: the replay is a committed transition like any other; without
                        // it the ops projection shows `failed` until the next claim.
                        let mut after = inst.clone();
                        after.revision = revision;
                        effects::observe(&*self.observer, &after, &t, revision, Writer::default());
                    }
                }
                WorkflowStatus::Running | WorkflowStatus::Waiting | WorkflowStatus::Failing => {}
                WorkflowStatus::Completed | WorkflowStatus::Canceled => {}
            }
            if !inst.status.is_terminal() && req.priority.is_higher_than(inst.business_priority) {
                let t = Transition::priority_raise(req.priority, now);
                if let WriteOutcome::Applied { revision } =
                    store.apply(&inst.workflow_id, &Guard::PriorityBelow(req.priority), &t).await?
                {
                    inst.business_priority = req.priority;
                    inst.revision = revision;
                    inst.updated_at = now;
                    effects::observe(&*self.observer, &inst, &t, revision, Writer::default());
                }
            }
        }
        let candidate = matches!(inst.status, WorkflowStatus::Running).then(|| LaneEntry {
            workflow_id: inst.workflow_id.clone(),
            priority: inst.business_priority,
            claimable_at: inst.claimable_time.unwrap_or(now),
        });
        Ok(Stored { outcome: StartOutcome { instance: inst, execution_activated: activated, created }, candidate, now })
    }
}

/// What a start does to an existing failed instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FailedStart {
    /// K-5: replay it (unless it failed in the request's own round).
    Replay,
    /// Return it as it is (an event never replays a closed workflow).
    Keep,
}

/// What the store side of one start produced.
struct Stored {
    outcome: StartOutcome,
    /// The lane entry to add, for a running instance.
    candidate: Option<LaneEntry>,
    /// The start's clock reading (the stream owner of an activated start).
    now: Instant,
}

#[async_trait::async_trait]
impl SignalDelivery for Publisher {
    async fn deliver(&self, signal: Signal) -> Result<DeliverOutcome> {
        self.deliver_signal(signal).await
    }
}
