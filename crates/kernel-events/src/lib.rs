//! Event-started workflows (the K-5 amendment): an event is a [`StartRequest`] whose
//! business key comes from the entity the event concerns, so duplicate deliveries start one
//! workflow (K-5), and a later event about the same entity is delivered as a signal to the
//! running workflow (K-9.3).
//!
//! Events arrive out of order and more than once; [`EventRoute::deliver`] dedupes both
//! ways:
//!
//! - the **first** event delivered for an entity key starts the workflow, its `{id, key,
//!   payload}` kept in the input as `{"event": {...}}` ([`Event::of_input`] reads it back).
//!   "First" is the first to arrive, not the first in business order: a `paid` event that
//!   overtakes `created` starts the workflow;
//! - a repeated delivery of that starting event finds its id in the input and is
//!   [`EventOutcome::DuplicateStart`]: nothing else happens, never a signal;
//! - any other event for the key is a signal to the workflow, with a `signal_id` derived
//!   from the event id ([`EventRoute::signal_id`]), so a repeated delivery is ignored by the
//!   durable inbox ([`EventOutcome::Signaled`] says whether the inbox had it already);
//! - once the workflow is terminal (completed, failed or canceled), an event neither starts
//!   it again nor signals it: [`EventOutcome::Closed`]. A failed workflow is not replayed by
//!   an event (a plain [`Publisher::start_or_resume`] still replays it, K-5). A workflow
//!   still `failing` (running its failure finalizer) is signaled: nothing consumes that
//!   doorbell, and retention purges it once the workflow is terminal.
//!
//! # The wait convention
//! A later event is delivered as signal type [`EventRoute::signal_type`], `wait_key` = the
//! event's entity key, generation 0. A step that waits for "the next event about this
//! entity" returns [`EventRoute::next_event`] (that exact identity, usually with a poll
//! fallback). Each inbox record is consumed by one wait, so events that arrive while the
//! workflow runs queue up in the inbox as pending doorbells and each later wait of the same
//! identity is woken at once by one of them (K-9.4 early signals).
//!
//! # Doorbells, not payloads (K-9.3)
//! The signal carries no payload. The caller (a webhook receiver) writes the business fact,
//! the event's payload, durably **before** calling [`EventRoute::deliver`], and the
//! woken step re-reads the facts. A wake says only "something about this entity changed":
//! doorbells are consumed in no particular order relative to the events' business order,
//! one wake may find several new facts and a later wake none. The step decides from the
//! facts it reads (e.g. "a `shipped` fact exists"), never from the order or the number of
//! wakes. A delivery that failed (an error) is retried by the caller with the same event:
//! the start and the signal are both idempotent on it.

use kernel_core::activity::{SignalWaitSpec, StepOutcome};
use kernel_core::domain::WorkflowStatus;
use kernel_core::error::{Error, Result};
use kernel_core::id::WorkflowId;
use kernel_core::ports::{DeliverOutcome, Signal};
use kernel_core::validate;
use kernel_core::{Publisher, StartRequest};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How the events of one source map to workflows: the workflow type an event starts, and
/// the signal type later events are delivered as.
///
/// Both names follow the identifier rule (K-2.0) and contain no `:`, which separates them
/// from the event's key and id in the derived business keys and signal ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRoute {
    workflow_type: String,
    signal_type: String,
}

impl EventRoute {
    /// A route starting `workflow_type` workflows and signaling them with `signal_type`.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (field `workflow_type` or `signal_type`) for a name that
    /// breaks the identifier rule or contains `:`, or (field `signal_type`) for names longer
    /// than 189 bytes together (every derived signal id must stay an identifier).
    pub fn new(workflow_type: impl Into<String>, signal_type: impl Into<String>) -> Result<Self> {
        let (workflow_type, signal_type) = (workflow_type.into(), signal_type.into());
        for (field, name) in [("workflow_type", &workflow_type), ("signal_type", &signal_type)] {
            validate::identifier(field, name)?;
            if name.contains(':') {
                return Err(Error::invalid(field, "must not contain `:` (it separates the parts of derived keys)"));
            }
        }
        // The longest derived signal id is `<workflow_type>:<signal_type>:h<64 hex>`.
        if workflow_type.len() + signal_type.len() + 67 > validate::IDENTIFIER_BYTES_MAX {
            return Err(Error::invalid(
                "signal_type",
                format_args!(
                    "the workflow and signal type names together may be at most {} bytes",
                    validate::IDENTIFIER_BYTES_MAX - 67
                ),
            ));
        }
        Ok(EventRoute { workflow_type, signal_type })
    }

    /// The workflow type an event starts.
    pub fn workflow_type(&self) -> &str {
        &self.workflow_type
    }

    /// The signal type later events are delivered as.
    pub fn signal_type(&self) -> &str {
        &self.signal_type
    }

    /// The business key (K-5) of the workflow about entity `key`:
    /// `<workflow_type>:<key>`. A workflow started another way under this key (an API
    /// start) receives the events as signals too.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (field `event.key`) when `key` breaks the identifier rule or
    /// makes the business key longer than an identifier may be.
    pub fn biz_key(&self, key: &str) -> Result<String> {
        validate::identifier("event.key", key)?;
        derived("event.key", format!("{}:{key}", self.workflow_type))
    }

    /// The signal id of event `event_id` about entity `key` on this route:
    /// `<workflow_type>:<signal_type>:<key length>:<key>:<event_id>` — every delivery of
    /// one event is the same inbox record; the same event id about another entity, or on
    /// another route, is another record (an id need only be unique per entity). When that
    /// would be longer than an identifier may be, `<workflow_type>:<signal_type>:h<hex>`
    /// with the SHA-256 of the length-prefixed key and id (still a function of the three).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (field `event.id` or `event.key`) when either breaks the
    /// identifier rule.
    pub fn signal_id(&self, key: &str, event_id: &str) -> Result<String> {
        validate::identifier("event.key", key)?;
        validate::identifier("event.id", event_id)?;
        let plain = format!("{}:{}:{}:{key}:{event_id}", self.workflow_type, self.signal_type, key.len());
        if plain.len() <= validate::IDENTIFIER_BYTES_MAX {
            return derived("event.id", plain);
        }
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        for part in [key, event_id] {
            h.update((part.len() as u32).to_be_bytes());
            h.update(part.as_bytes());
        }
        derived("event.id", format!("{}:{}:h{}", self.workflow_type, self.signal_type, hex::encode(h.finalize())))
    }

    /// The wait a step returns for the next event about entity `key`: this route's signal
    /// type, `wait_key = key`, generation 0 (the convention of the module docs). Add a poll
    /// fallback ([`SignalWaitSpec::poll_after_ms`]) so a lost doorbell costs latency only.
    pub fn next_event(&self, key: impl Into<String>) -> SignalWaitSpec {
        StepOutcome::wait_for_signal(self.signal_type.clone(), key)
    }
}

/// A derived identifier, refused under `field` when it breaks the identifier rule.
fn derived(field: &str, id: String) -> Result<String> {
    if id.len() > validate::IDENTIFIER_BYTES_MAX {
        return Err(Error::invalid(
            field,
            format_args!(
                "the derived identifier would be {} bytes, over the limit of {}",
                id.len(),
                validate::IDENTIFIER_BYTES_MAX
            ),
        ));
    }
    validate::identifier(field, &id)?;
    Ok(id)
}

/// One delivery of an event: its stable `id` (every redelivery repeats it), the `key` of the
/// entity it concerns (an order id, a document id) and its `payload`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Stable id of the event; redeliveries carry the same.
    pub id: String,
    /// The entity the event concerns: one workflow per key and route.
    pub key: String,
    /// The event body. Kept in the started workflow's input (within the publisher's
    /// payload limit); never sent with a signal.
    pub payload: Value,
}

impl Event {
    /// An event.
    pub fn new(id: impl Into<String>, key: impl Into<String>, payload: Value) -> Self {
        Event { id: id.into(), key: key.into(), payload }
    }

    /// The identifier rule on `id` and `key` (fields `event.id`, `event.key`).
    pub fn validate(&self) -> Result<()> {
        validate::identifier("event.id", &self.id)?;
        validate::identifier("event.key", &self.key)
    }

    /// The input of the workflow this event starts: `{"event": {"id", "key", "payload"}}`.
    pub fn to_input(&self) -> Value {
        serde_json::json!({ "event": self })
    }

    /// The event that started a workflow, read from its input (`None` for an input that
    /// [`to_input`](Self::to_input) did not make, e.g. a workflow started by an API call).
    pub fn of_input(input: &Value) -> Option<Event> {
        serde_json::from_value(input.get("event")?.clone()).ok()
    }
}

/// What [`EventRoute::deliver`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventOutcome {
    /// This delivery created the workflow.
    Started {
        /// The workflow started.
        workflow_id: WorkflowId,
    },
    /// A repeated delivery of the event that started the workflow: nothing else happened.
    DuplicateStart {
        /// The workflow the event started.
        workflow_id: WorkflowId,
    },
    /// A later event, delivered to the workflow as a signal (a doorbell, K-9.3).
    Signaled {
        /// The workflow signaled.
        workflow_id: WorkflowId,
        /// The signal's id, derived from the event id ([`EventRoute::signal_id`]).
        signal_id: String,
        /// What the delivery did: woke the wait, stays pending for a later wait, or was a
        /// redelivery of a consumed signal.
        delivery: DeliverOutcome,
        /// The inbox already held this signal id: a repeated delivery of the event.
        seen_before: bool,
    },
    /// The workflow is terminal: not started again, not signaled.
    Closed {
        /// The terminal workflow.
        workflow_id: WorkflowId,
        /// Its status (completed, failed or canceled).
        status: WorkflowStatus,
    },
}

impl EventOutcome {
    /// The workflow the event went to.
    pub fn workflow_id(&self) -> &WorkflowId {
        match self {
            EventOutcome::Started { workflow_id }
            | EventOutcome::DuplicateStart { workflow_id }
            | EventOutcome::Signaled { workflow_id, .. }
            | EventOutcome::Closed { workflow_id, .. } => workflow_id,
        }
    }
}

impl EventRoute {
    /// Deliver one event on this route through `publisher` (the module docs give the rules): start the workflow of
    /// the event's key, or signal it, or report it closed. Write the event's business fact
    /// durably before calling this; on an error, retry with the same event.
    ///
    /// Needs the inbox: a standalone publisher is built with [`PublisherBuilder::inbox`]
    /// (an engine's publisher has the engine's).
    ///
    /// # Errors
    /// Each before any write: [`Error::InvalidInput`] for an `id` or `key` that breaks the
    /// identifier rule or makes a derived identifier too long (fields `event.id`,
    /// `event.key`), for an input (the event with its payload) over the publisher's payload
    /// limit or not storable (field `event.payload`), and for a publisher without an inbox
    /// (field `inbox`); [`Error::UnregisteredType`] when the route's workflow type has no
    /// plan here. [`Error::Conflict`] when the business key belongs to a workflow of another
    /// type. Store and inbox failures as [`start_or_resume`](Publisher::start_or_resume) and
    /// [`deliver_signal`](Publisher::deliver_signal) report them.
    ///
    /// [`PublisherBuilder::inbox`]: kernel_core::PublisherBuilder::inbox
    pub async fn deliver(&self, publisher: &Publisher, event: Event) -> Result<EventOutcome> {
        let route = self;
        event.validate()?;
        let biz_key = route.biz_key(&event.key)?;
        let signal_id = route.signal_id(&event.key, &event.id)?;
        let input = event.to_input();
        validate::payload("event.payload", &input, publisher.payload_bytes_max())?;
        publisher.plans().get(route.workflow_type())?;
        publisher.require_inbox()?;

        let started = publisher.start_or_get(StartRequest::new(route.workflow_type(), biz_key, input)).await?;
        let inst = started.instance;
        if started.created {
            return Ok(EventOutcome::Started { workflow_id: inst.workflow_id });
        }
        if Event::of_input(&inst.input).is_some_and(|first| first.id == event.id) {
            return Ok(EventOutcome::DuplicateStart { workflow_id: inst.workflow_id });
        }
        if inst.status.is_terminal() {
            return Ok(EventOutcome::Closed { workflow_id: inst.workflow_id, status: inst.status });
        }
        let signal = Signal::builder(inst.workflow_id.clone(), route.signal_type())
            .wait_key(event.key)
            .generation(0)
            .signal_id(signal_id.clone())
            .build()?;
        let delivered = publisher.deliver_signal_seen(signal).await?;
        Ok(EventOutcome::Signaled {
            workflow_id: inst.workflow_id,
            signal_id,
            delivery: delivered.outcome,
            seen_before: delivered.seen_before,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field_of<T: std::fmt::Debug>(r: Result<T>) -> String {
        match r {
            Err(Error::InvalidInput { field, .. }) => field,
            other => panic!("expected InvalidInput, got {other:?}"),
        }
    }

    #[test]
    fn route_names_follow_the_identifier_rule_without_colons() {
        let r = EventRoute::new("order", "order_event").unwrap();
        assert_eq!((r.workflow_type(), r.signal_type()), ("order", "order_event"));
        assert_eq!(field_of(EventRoute::new("", "s")), "workflow_type");
        assert_eq!(field_of(EventRoute::new("a:b", "s")), "workflow_type");
        assert_eq!(field_of(EventRoute::new("t", "s\n")), "signal_type");
        assert_eq!(field_of(EventRoute::new("t", "x:y")), "signal_type");
        assert_eq!(field_of(EventRoute::new("t".repeat(100), "s".repeat(90))), "signal_type");
        let longest = EventRoute::new("t".repeat(100), "s".repeat(89)).unwrap();
        let id = longest.signal_id(&"k".repeat(256), "e").unwrap();
        assert!(id.len() <= validate::IDENTIFIER_BYTES_MAX, "{}", id.len());
    }

    #[test]
    fn derived_keys_and_ids() {
        let r = EventRoute::new("order", "order_event").unwrap();
        assert_eq!(r.biz_key("o-1").unwrap(), "order:o-1");
        assert_eq!(r.signal_id("o-1", "evt-9").unwrap(), "order:order_event:3:o-1:evt-9");
        // Another route's signal for the same event id is another record, and so is the
        // same event id about another entity; the key's length keeps `a:b`+`c` apart from
        // `a`+`b:c`.
        let other = EventRoute::new("order", "shipping_event").unwrap();
        assert_ne!(other.signal_id("o-1", "evt-9").unwrap(), r.signal_id("o-1", "evt-9").unwrap());
        assert_ne!(r.signal_id("o-2", "evt-9").unwrap(), r.signal_id("o-1", "evt-9").unwrap());
        assert_ne!(r.signal_id("a:b", "c").unwrap(), r.signal_id("a", "b:c").unwrap());
        // A key or id too long once prefixed: the biz key is refused by name, the signal id
        // falls back to a hash of both (distinct per key and id, within the limit).
        let long = "k".repeat(validate::IDENTIFIER_BYTES_MAX);
        assert_eq!(field_of(r.biz_key(&long)), "event.key");
        let hashed = r.signal_id("o-1", &long).unwrap();
        assert!(hashed.starts_with("order:order_event:h") && hashed.len() <= validate::IDENTIFIER_BYTES_MAX);
        assert_ne!(hashed, r.signal_id("o-2", &long).unwrap());
        assert_eq!(field_of(r.biz_key("")), "event.key");
        assert_eq!(field_of(r.signal_id("o-1", "a\0")), "event.id");
        assert_eq!(field_of(r.signal_id("", "e")), "event.key");
        let longest_key = "k".repeat(validate::IDENTIFIER_BYTES_MAX - "order:".len());
        assert!(r.biz_key(&longest_key).is_ok());
    }

    #[test]
    fn the_wait_convention() {
        let r = EventRoute::new("order", "order_event").unwrap();
        let w = r.next_event("o-1").poll_after_ms(500);
        assert_eq!((w.signal_type.as_str(), w.wait_key.as_str(), w.generation), ("order_event", "o-1", 0));
    }

    #[test]
    fn the_starting_event_round_trips_through_the_input() {
        let e = Event::new("evt-1", "o-1", json!({"type": "created", "n": [1, 2]}));
        let input = e.to_input();
        assert_eq!(input["event"]["id"], "evt-1");
        assert_eq!(Event::of_input(&input), Some(e.clone()));
        assert_eq!(Event::of_input(&json!({"order": "o-1"})), None);
        assert_eq!(Event::of_input(&json!({"event": {"id": 1}})), None);
        assert!(e.validate().is_ok());
        assert_eq!(field_of(Event::new("", "k", json!(null)).validate()), "event.id");
        assert_eq!(field_of(Event::new("i", "k\u{7}", json!(null)).validate()), "event.key");
    }
}
