//! Event-started workflows (the K-5 amendment): duplicate deliveries start one workflow,
//! later events are doorbells to the running one, terminal workflows are closed to events.

use kernel_core::ports::*;
use kernel_core::*;
use kernel_events::{Event, EventOutcome, EventRoute};
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use testkit::harness::World;

fn route() -> EventRoute {
    EventRoute::new("order", "order_event").unwrap()
}

/// The business facts (the event log a receiver writes before each delivery): (entity
/// key, event id, kind), in arrival order, duplicates included.
#[derive(Clone, Default)]
struct Facts(Arc<Mutex<Vec<(String, String, String)>>>);

impl Facts {
    fn write(&self, e: &Event) {
        let kind = e.payload["kind"].as_str().unwrap_or_default().to_string();
        self.0.lock().unwrap().push((e.key.clone(), e.id.clone(), kind));
    }
    /// Kinds recorded for `key`, deduplicated by event id, in arrival order.
    fn kinds(&self, key: &str) -> Vec<String> {
        let mut ids = BTreeSet::new();
        let log = self.0.lock().unwrap();
        log.iter().filter(|(k, id, _)| k == key && ids.insert(id.clone())).map(|(_, _, kind)| kind.clone()).collect()
    }
}

/// The order workflow: one step that re-reads the facts of its entity on every entry,
/// completes once a `shipped` fact exists, and otherwise waits for the next event about
/// the entity (signal only, no poll fallback: every wake in these tests is a doorbell).
/// `entries` counts the step's entries.
fn order(facts: Facts, entries: Arc<AtomicU32>) -> Definition {
    Definition::builder("order")
        .step(StepDef::new("track", move |ctx: ActivityContext| {
            let (facts, entries) = (facts.clone(), entries.clone());
            async move {
                entries.fetch_add(1, Ordering::SeqCst);
                let key = Event::of_input(ctx.input()).expect("started by an event").key;
                let seen = facts.kinds(&key);
                if seen.iter().any(|k| k == "shipped") {
                    return Ok(StepOutcome::complete(json!({ "seen": seen })));
                }
                Ok(route().next_event(key).into())
            }
        }))
        .build()
        .unwrap()
}

fn event(id: &str, key: &str, kind: &str) -> Event {
    Event::new(id, key, json!({ "kind": kind }))
}

/// A publisher with no engine: store, queue, wakeup and the inbox, on the world's clock.
fn standalone(world: &World, def: &Definition) -> Publisher {
    let p = world.ports();
    Publisher::builder(p.store.clone(), p.queue.clone(), p.wakeup.clone())
        .inbox(p.inbox.clone())
        .clock(p.clock.clone())
        .ids(p.ids.clone())
        .plan(def.plan().clone())
        .build()
        .unwrap()
}

/// The receiver's order: the fact first, then the delivery.
async fn receive(publisher: &Publisher, facts: &Facts, e: Event) -> EventOutcome {
    facts.write(&e);
    route().deliver(publisher, e).await.unwrap()
}

async fn orders(world: &World) -> Vec<WorkflowInstance> {
    world.instances().await.unwrap().into_iter().filter(|i| i.workflow_type == "order").collect()
}

fn records_of(world: &World, workflow_id: &WorkflowId) -> Vec<SignalRecord> {
    world.inbox.all().into_iter().filter(|r| &r.workflow_id == workflow_id).collect()
}

struct Rig {
    world: World,
    facts: Facts,
    entries: Arc<AtomicU32>,
    engine: Engine,
    publisher: Publisher,
}

fn rig() -> Rig {
    let world = World::new(1);
    let (facts, entries) = (Facts::default(), Arc::new(AtomicU32::new(0)));
    let def = order(facts.clone(), entries.clone());
    let publisher = standalone(&world, &def);
    let engine = world.engine("w", vec![def]);
    Rig { world, facts, entries, engine, publisher }
}

#[tokio::test]
async fn duplicate_deliveries_of_the_starting_event_start_one_workflow() {
    let Rig { world, facts, engine, publisher, .. } = rig();
    let first = receive(&publisher, &facts, event("e1", "o-1", "created")).await;
    let EventOutcome::Started { workflow_id: wf } = first.clone() else { panic!("{first:?}") };
    for _ in 0..2 {
        let again = receive(&publisher, &facts, event("e1", "o-1", "created")).await;
        assert_eq!(again, EventOutcome::DuplicateStart { workflow_id: wf.clone() });
    }
    let all = orders(&world).await;
    assert_eq!(all.len(), 1, "one workflow for three deliveries");
    assert_eq!(all[0].biz_key, "order:o-1");
    assert_eq!(Event::of_input(&all[0].input), Some(event("e1", "o-1", "created")));
    assert!(world.inbox.all().is_empty(), "a duplicate of the starting event is never a signal");
    // Also while the workflow waits: still nothing but the duplicate.
    world.drive(&engine).await.unwrap();
    assert_eq!(world.instance(wf.as_str()).await.unwrap().status, WorkflowStatus::Waiting);
    let again = receive(&publisher, &facts, event("e1", "o-1", "created")).await;
    assert_eq!(again, EventOutcome::DuplicateStart { workflow_id: wf.clone() });
    assert!(world.inbox.all().is_empty());
    assert_eq!(world.instance(wf.as_str()).await.unwrap().status, WorkflowStatus::Waiting);
    assert_eq!(orders(&world).await.len(), 1);
}

#[tokio::test]
async fn a_later_event_from_a_publisher_alone_wakes_the_running_workflows_wait() {
    let Rig { world, facts, entries, engine, publisher } = rig();
    let wf = receive(&publisher, &facts, event("e1", "o-1", "created")).await.workflow_id().clone();
    world.drive(&engine).await.unwrap();
    let waiting = world.instance(wf.as_str()).await.unwrap();
    assert_eq!(waiting.status, WorkflowStatus::Waiting);
    // The convention: the route's signal type, the entity key, generation 0.
    let id = waiting.wait.as_ref().and_then(Wait::signal_identity).unwrap();
    assert_eq!((id.signal_type.as_str(), id.wait_key.as_str(), id.generation), ("order_event", "o-1", 0));
    assert_eq!(entries.load(Ordering::SeqCst), 1);

    let out = receive(&publisher, &facts, event("e2", "o-1", "shipped")).await;
    let signal_id = "order:order_event:3:o-1:e2".to_string();
    assert_eq!(
        out,
        EventOutcome::Signaled {
            workflow_id: wf.clone(),
            signal_id: signal_id.clone(),
            delivery: DeliverOutcome::Activated,
            seen_before: false
        }
    );
    // The publisher's delivery activated the wait and queued the workflow: no engine call.
    let woken = world.instance(wf.as_str()).await.unwrap();
    assert_eq!(woken.status, WorkflowStatus::Running);
    assert_eq!(woken.resume.as_ref().and_then(|r| r.signal_id.clone()), Some(signal_id.clone()));
    assert!(!world.queue.is_empty(), "enqueued for a worker");
    let recs = records_of(&world, &wf);
    assert_eq!(recs.len(), 1);
    assert_eq!((recs[0].signal_id.as_str(), recs[0].status), (signal_id.as_str(), SignalStatus::Matched));

    world.drive(&engine).await.unwrap();
    let done = world.instance(wf.as_str()).await.unwrap();
    assert_eq!(done.status, WorkflowStatus::Completed);
    assert_eq!(done.output["track"], json!({ "seen": ["created", "shipped"] }), "the step re-read the facts");
    assert_eq!(entries.load(Ordering::SeqCst), 2, "one entry per wake");
}

#[tokio::test]
async fn a_duplicate_later_event_is_deduped_by_the_inbox() {
    let Rig { world, facts, entries, engine, publisher } = rig();
    let wf = receive(&publisher, &facts, event("e1", "o-1", "created")).await.workflow_id().clone();
    let signaled = |delivery, seen_before, id: &str| EventOutcome::Signaled {
        workflow_id: wf.clone(),
        signal_id: format!("order:order_event:3:o-1:{id}"),
        delivery,
        seen_before,
    };
    // Before the workflow waits: the doorbell is kept pending, its duplicate adds none.
    assert_eq!(
        receive(&publisher, &facts, event("e2", "o-1", "paid")).await,
        signaled(DeliverOutcome::Pending, false, "e2")
    );
    assert_eq!(
        receive(&publisher, &facts, event("e2", "o-1", "paid")).await,
        signaled(DeliverOutcome::Pending, true, "e2")
    );
    assert_eq!(records_of(&world, &wf).len(), 1);
    world.drive(&engine).await.unwrap();
    // Entry, wait (woken at once by the early doorbell), entry, wait: two entries, not three.
    assert_eq!(entries.load(Ordering::SeqCst), 2);
    assert_eq!(world.instance(wf.as_str()).await.unwrap().status, WorkflowStatus::Waiting);
    let recs = records_of(&world, &wf);
    assert_eq!((recs.len(), recs[0].status), (1, SignalStatus::Matched));

    // While it waits: the first delivery wakes it, the duplicate finds the consumed record.
    assert_eq!(
        receive(&publisher, &facts, event("e3", "o-1", "packed")).await,
        signaled(DeliverOutcome::Activated, false, "e3")
    );
    assert_eq!(
        receive(&publisher, &facts, event("e3", "o-1", "packed")).await,
        signaled(DeliverOutcome::Duplicate, true, "e3")
    );
    world.drive(&engine).await.unwrap();
    assert_eq!(entries.load(Ordering::SeqCst), 3, "the duplicate woke nothing");
    assert_eq!(world.instance(wf.as_str()).await.unwrap().status, WorkflowStatus::Waiting);
    let recs = records_of(&world, &wf);
    assert_eq!(recs.len(), 2);
    assert!(recs.iter().all(|r| r.status == SignalStatus::Matched), "{recs:?}");
}

#[tokio::test]
async fn an_event_for_a_terminal_workflow_is_closed() {
    let Rig { world, facts, engine, publisher, .. } = rig();
    let wf = receive(&publisher, &facts, event("e1", "o-1", "created")).await.workflow_id().clone();
    receive(&publisher, &facts, event("e2", "o-1", "shipped")).await;
    world.drive(&engine).await.unwrap();
    let done = world.instance(wf.as_str()).await.unwrap();
    assert_eq!(done.status, WorkflowStatus::Completed);
    let records = world.inbox.all().len();

    let late = receive(&publisher, &facts, event("e3", "o-1", "refunded")).await;
    assert_eq!(late, EventOutcome::Closed { workflow_id: wf.clone(), status: WorkflowStatus::Completed });
    // A redelivery of an event that was a signal, and of the starting one (which says so).
    let again = receive(&publisher, &facts, event("e2", "o-1", "shipped")).await;
    assert_eq!(again, EventOutcome::Closed { workflow_id: wf.clone(), status: WorkflowStatus::Completed });
    let first = receive(&publisher, &facts, event("e1", "o-1", "created")).await;
    assert_eq!(first, EventOutcome::DuplicateStart { workflow_id: wf.clone() });
    assert_eq!(world.inbox.all().len(), records, "no signal to a closed workflow");
    assert_eq!(orders(&world).await.len(), 1, "not started again");
    assert_eq!(world.instance(wf.as_str()).await.unwrap().revision, done.revision, "nothing written");

    // Canceled and failed workflows are closed too; a failed one is not replayed by an event.
    let wf2 = receive(&publisher, &facts, event("e10", "o-2", "created")).await.workflow_id().clone();
    assert_eq!(engine.cancel(&wf2).await.unwrap(), kernel_core::CancelOutcome::Canceled);
    let out = receive(&publisher, &facts, event("e11", "o-2", "paid")).await;
    assert_eq!(out, EventOutcome::Closed { workflow_id: wf2, status: WorkflowStatus::Canceled });

    let fragile = Definition::builder("fragile")
        .step(StepDef::new("only", |_c: ActivityContext| async { Err(ActivityError::permanent("refused")) }))
        .build()
        .unwrap();
    let frail_route = EventRoute::new("fragile", "fragile_event").unwrap();
    let publisher = standalone(&world, &fragile);
    let engine = world.engine("w2", vec![fragile]);
    let started = frail_route.deliver(&publisher, event("f1", "x-1", "created")).await.unwrap();
    let EventOutcome::Started { workflow_id: wf3 } = started else { panic!("{started:?}") };
    world.drive(&engine).await.unwrap();
    let failed = world.instance(wf3.as_str()).await.unwrap();
    assert_eq!(failed.status, WorkflowStatus::Failed);
    let out = frail_route.deliver(&publisher, event("f2", "x-1", "retry")).await.unwrap();
    assert_eq!(out, EventOutcome::Closed { workflow_id: wf3.clone(), status: WorkflowStatus::Failed });
    let after = world.instance(wf3.as_str()).await.unwrap();
    assert_eq!((after.status, after.retry_count, after.revision), (WorkflowStatus::Failed, 0, failed.revision));
}

#[tokio::test]
async fn concurrent_duplicate_deliveries_still_create_one() {
    let Rig { world, facts, publisher, .. } = rig();
    let deliveries = (0..8).map(|_| receive(&publisher, &facts, event("e1", "o-1", "created")));
    let outs = futures::future::join_all(deliveries).await;
    let started: Vec<_> = outs.iter().filter(|o| matches!(o, EventOutcome::Started { .. })).collect();
    assert_eq!(started.len(), 1, "{outs:?}");
    let wf = started[0].workflow_id().clone();
    assert!(outs.iter().all(|o| o.workflow_id() == &wf));
    assert_eq!(outs.iter().filter(|o| matches!(o, EventOutcome::DuplicateStart { .. })).count(), 7);
    assert_eq!(orders(&world).await.len(), 1);
    assert!(world.inbox.all().is_empty());

    // Distinct events for a new key at once: one starts it, each other is its own doorbell.
    let deliveries = (0..6).map(|i| receive(&publisher, &facts, event(&format!("e2-{i}"), "o-2", "paid")));
    let outs = futures::future::join_all(deliveries).await;
    let started: Vec<_> = outs.iter().filter(|o| matches!(o, EventOutcome::Started { .. })).collect();
    assert_eq!(started.len(), 1, "{outs:?}");
    let wf2 = started[0].workflow_id().clone();
    let signaled: BTreeSet<_> = outs
        .iter()
        .filter_map(|o| match o {
            EventOutcome::Signaled { signal_id, seen_before: false, .. } => Some(signal_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(signaled.len(), 5, "{outs:?}");
    assert_eq!(records_of(&world, &wf2).iter().map(|r| r.signal_id.clone()).collect::<BTreeSet<_>>(), signaled);
    assert_eq!(orders(&world).await.len(), 2);
}

#[tokio::test]
async fn bad_input_is_a_typed_error_and_writes_nothing() {
    let world = World::new(1);
    let def = order(Facts::default(), Arc::new(AtomicU32::new(0)));
    let p = world.ports();
    let small = Publisher::builder(p.store.clone(), p.queue.clone(), p.wakeup.clone())
        .inbox(p.inbox.clone())
        .plan(def.plan().clone())
        .payload_bytes_max(256)
        .build()
        .unwrap();
    let field_of = |r: Result<EventOutcome>| match r {
        Err(Error::InvalidInput { field, .. }) => field,
        other => panic!("expected InvalidInput, got {other:?}"),
    };
    let r = route();
    let long = "x".repeat(251); // an identifier, but not once prefixed with `order:`
    let cases = [
        (event("", "o-1", "created"), "event.id"),
        (event("e1", "", "created"), "event.key"),
        (event("e1\n", "o-1", "created"), "event.id"),
        (event("e1", "o\u{0}1", "created"), "event.key"),
        // Any identifier is a valid id (a long one is hashed into the signal id); one past
        // the identifier limit is not.
        (event(&"x".repeat(257), "o-1", "created"), "event.id"),
        (event("e1", &long, "created"), "event.key"),
        (Event::new("e1", "o-1", json!({ "text": "x".repeat(1_000) })), "event.payload"),
        (Event::new("e1", "o-1", json!({ "text": "a\u{0}b" })), "event.payload"),
    ];
    for (e, field) in cases {
        assert_eq!(field_of(r.deliver(&small, e.clone()).await), field, "{e:?}");
    }
    let unknown = EventRoute::new("unknown", "s").unwrap();
    let out = unknown.deliver(&small, event("e1", "o-1", "created")).await;
    assert!(matches!(out, Err(Error::UnregisteredType(ref t)) if t == "unknown"), "{out:?}");
    let no_inbox = Publisher::builder(p.store.clone(), p.queue.clone(), p.wakeup.clone())
        .plan(def.plan().clone())
        .build()
        .unwrap();
    assert_eq!(field_of(r.deliver(&no_inbox, event("e1", "o-1", "created")).await), "inbox");
    let signal = Signal::builder("wf-1", "s").wait_key("k").signal_id("s-1").build().unwrap();
    let out = no_inbox.deliver_signal(signal).await;
    assert!(matches!(out, Err(Error::InvalidInput { ref field, .. }) if field == "inbox"), "{out:?}");
    assert!(
        matches!(EventRoute::new("or:der", "s"), Err(Error::InvalidInput { ref field, .. }) if field == "workflow_type")
    );
    let bounds =
        Publisher::builder(p.store.clone(), p.queue.clone(), p.wakeup.clone()).orphan_signal_bounds(0, 1).build();
    assert!(matches!(bounds, Err(Error::InvalidInput { ref field, .. }) if field == "orphan_signals_per_workflow_max"));
    assert!(world.instances().await.unwrap().is_empty(), "nothing started");
    assert!(world.inbox.all().is_empty(), "nothing signaled");

    // A business key taken by a workflow of another type is a conflict, not a signal.
    let other = crate::linear("other", 1, false);
    let engine = world.engine("w", vec![other, def]);
    engine.publisher().start_or_resume(StartRequest::new("other", "order:o-9", json!({}))).await.unwrap();
    let out = r.deliver(&engine.publisher(), event("e9", "o-9", "created")).await;
    assert!(matches!(out, Err(Error::Conflict(_))), "{out:?}");
    assert!(world.inbox.all().is_empty());
}

/// Deliver a burst of events over several keys through an engine's publisher, each event
/// more than once and out of order (each key sees its kinds rotated, so `paid` or `shipped`
/// may come first), driving the workflows between chunks; then count from the store:
/// (workflows an event started, workflows beyond one per entity key). The key is read
/// from each instance's input, not from its business key.
pub(crate) async fn event_counts() -> (u64, u64) {
    let world = World::new(7);
    let facts = Facts::default();
    let engine = world.engine("w", vec![order(facts.clone(), Arc::new(AtomicU32::new(0)))]);
    let publisher = engine.publisher();
    let kinds = ["created", "paid", "shipped"];
    let mut burst = Vec::new();
    for n in 0..kinds.len() {
        for key in 0..5 {
            let kind = kinds[(n + key) % kinds.len()];
            let e = event(&format!("o-{key}-{kind}"), &format!("o-{key}"), kind);
            if key % 2 == 0 {
                burst.push(e.clone());
            }
            burst.push(e);
        }
    }
    burst.extend(burst.clone());
    for chunk in burst.chunks(4) {
        futures::future::join_all(chunk.iter().cloned().map(|e| receive(&publisher, &facts, e))).await;
        world.drive(&engine).await.unwrap();
    }
    let started: Vec<Event> = orders(&world).await.iter().filter_map(|i| Event::of_input(&i.input)).collect();
    let keys: BTreeSet<&str> = started.iter().map(|e| e.key.as_str()).collect();
    (started.len() as u64, (started.len() - keys.len()) as u64)
}

#[tokio::test]
async fn a_burst_with_duplicates_starts_one_workflow_per_key() {
    assert_eq!(event_counts().await, (5, 0));
}

/// An event id need only be unique per entity: the same id about two orders is two
/// signals, each to its own workflow — before, the second was taken for a repeat of the
/// first (one inbox record) and its order's workflow never heard of it.
#[tokio::test]
async fn the_same_event_id_about_two_entities_is_two_signals() {
    let Rig { world, facts, engine, publisher, .. } = rig();
    for key in ["o-1", "o-2"] {
        let started = receive(&publisher, &facts, event(&format!("start-{key}"), key, "created")).await;
        assert!(matches!(started, EventOutcome::Started { .. }), "{started:?}");
    }
    world.drive(&engine).await.unwrap();
    let mut woken = vec![];
    for key in ["o-1", "o-2"] {
        match receive(&publisher, &facts, event("evt-1", key, "shipped")).await {
            EventOutcome::Signaled { seen_before, workflow_id, delivery, .. } => {
                assert!(!seen_before, "{key}");
                assert_eq!(delivery, DeliverOutcome::Activated, "{key}");
                woken.push(workflow_id);
            }
            other => panic!("{key}: {other:?}"),
        }
    }
    assert_ne!(woken[0], woken[1]);
    world.drive(&engine).await.unwrap();
    for i in orders(&world).await {
        assert_eq!(i.status, WorkflowStatus::Completed, "{}: woken by its own signal", i.biz_key);
    }
}
