//! Event-started workflows on the embedded default (a SQLite file, no servers): a
//! webhook-style receiver takes JSON bodies of order events (created, paid, shipped),
//! delivered more than once and one of them out of order. For each body it first writes
//! the event to an event log (the business fact), then hands it to
//! [`EventRoute::deliver`](kernel_events::EventRoute::deliver): the first event of an order starts the order's workflow,
//! a repeat of it starts nothing, every later event is a doorbell to the running workflow
//! (deduplicated by the inbox), and an event for a finished order is closed. The receiver
//! is a publisher only — the store, the queue, the wakeup and the inbox, no engine.
//!
//! The order workflow's one step re-reads the event log on every entry and completes once
//! the order is shipped; until then it waits for the next event about its order (a signal
//! wait with a poll fallback). It never reads a signal for content: doorbells carry none.
//!
//! ```bash
//! cargo run -p kernel-examples --example webhook_events
//! ```

use kernel_core::ports::*;
use kernel_core::*;
use kernel_events::{Event, EventOutcome, EventRoute};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A stand-in for the durable event table a real receiver writes: the body of each event
/// by id (the first write of an id wins), and how many times each id was delivered.
#[derive(Clone, Default)]
struct EventLog(Arc<Mutex<Log>>);

#[derive(Default)]
struct Log {
    bodies: BTreeMap<String, Value>,
    deliveries: BTreeMap<String, u64>,
}

impl EventLog {
    fn append(&self, event: &Event) {
        let mut log = self.0.lock().expect("log lock");
        log.bodies.entry(event.id.clone()).or_insert_with(|| event.payload.clone());
        *log.deliveries.entry(event.id.clone()).or_default() += 1;
    }
    /// The events of `order`, in business order (`seq`), whatever order they arrived in.
    fn of_order(&self, order: &str) -> Vec<Value> {
        let log = self.0.lock().expect("log lock");
        let mut events: Vec<Value> = log.bodies.values().filter(|b| b["order"] == order).cloned().collect();
        events.sort_by_key(|b| b["seq"].as_u64());
        events
    }
}

fn route() -> EventRoute {
    EventRoute::new("order", "order_event").expect("valid route names")
}

/// The order workflow: re-read the log, complete when shipped, else wait for the next
/// event about this order (or the poll, should a doorbell be lost).
fn order_workflow(log: EventLog) -> Result<Definition, Error> {
    Definition::builder("order")
        .step(StepDef::new("track", move |ctx: ActivityContext| {
            let log = log.clone();
            async move {
                let Some(first) = Event::of_input(ctx.input()) else {
                    return Err(ActivityError::permanent("an order workflow is started by an event"));
                };
                let kinds: Vec<Value> = log.of_order(&first.key).iter().map(|e| e["type"].clone()).collect();
                if kinds.iter().any(|k| k == "shipped") {
                    return Ok(StepOutcome::complete(json!({ "order": first.key, "events": kinds })));
                }
                Ok(route().next_event(first.key).poll_after_ms(2_000).into())
            }
        }))
        .build()
}

/// The webhook handler: parse, write the fact, then start or signal.
struct Receiver {
    publisher: Publisher,
    log: EventLog,
}

impl Receiver {
    async fn receive(&self, body: &str) -> Result<EventOutcome, Error> {
        let v: Value = serde_json::from_str(body).map_err(|e| Error::invalid("body", e))?;
        let text = |name: &str| v[name].as_str().map(str::to_string).ok_or_else(|| Error::invalid(name, "missing"));
        let event = Event::new(text("id")?, text("order")?, v.clone());
        event.validate()?;
        // The business fact first (K-9.3): the workflow reads the log, never the signal.
        self.log.append(&event);
        route().deliver(&self.publisher, event).await
    }
}

/// One line per delivery.
fn describe(body: &str, out: &EventOutcome) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or_default();
    let what = match out {
        EventOutcome::Started { workflow_id } => format!("started {workflow_id}"),
        EventOutcome::DuplicateStart { .. } => "duplicate of the starting event: nothing".to_string(),
        EventOutcome::Signaled { signal_id, delivery, seen_before, .. } => {
            format!("signal {signal_id} ({delivery:?}{})", if *seen_before { ", seen before" } else { "" })
        }
        EventOutcome::Closed { status, .. } => format!("closed ({})", status.as_str()),
    };
    format!(
        "{} {} {:<8} -> {what}",
        v["id"].as_str().unwrap_or("?"),
        v["order"].as_str().unwrap_or("?"),
        v["type"].as_str().unwrap_or("?")
    )
}

fn body(id: &str, order: &str, kind: &str, seq: u64) -> String {
    json!({ "id": id, "order": order, "type": kind, "seq": seq }).to_string()
}

async fn until_completed(store: &DynStore, wf: &WorkflowId) -> Result<WorkflowInstance, Box<dyn std::error::Error>> {
    for _ in 0..400 {
        if let Some(i) = store.get(wf).await?.filter(|i| i.status == WorkflowStatus::Completed) {
            return Ok(i);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("timed out waiting for {wf} to complete").into())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("wfk-webhook-events-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("workflows.db");
    let deployment =
        compose::Deployment::connect(&format!("sqlite:{}", file.display()), "local", &Default::default()).await?;
    let log = EventLog::default();
    let def = order_workflow(log.clone())?;

    // The receiver: a publisher with the inbox, no engine.
    let side = deployment.publisher_side();
    let publisher = Publisher::builder(side.store, side.queue, side.wakeup)
        .inbox(deployment.store.inbox.clone())
        .plan(def.plan().clone())
        .build()?;
    let receiver = Receiver { publisher, log: log.clone() };
    // The worker, in this process for the demo.
    let engine = Engine::builder(deployment.ports().build()?).register(def).build()?;
    let running = engine.spawn();

    let bodies = [
        body("evt-101", "order-1", "created", 1),
        body("evt-101", "order-1", "created", 1), // a duplicate of the starting event
        body("evt-202", "order-2", "paid", 2),    // overtakes order-2's `created`: starts it
        body("evt-102", "order-1", "paid", 2),
        body("evt-201", "order-2", "created", 1),
        body("evt-102", "order-1", "paid", 2), // a duplicate of a later event
        body("evt-103", "order-1", "shipped", 3),
        body("evt-203", "order-2", "shipped", 3),
    ];
    let mut workflows = BTreeSet::new();
    for b in &bodies {
        let out = receiver.receive(b).await?;
        println!("{}", describe(b, &out));
        workflows.insert(out.workflow_id().clone());
    }
    let store = engine.ports().store.clone();
    for wf in &workflows {
        let done = until_completed(&*store, wf).await?;
        println!("{} {}: {}", done.biz_key, done.status.as_str(), done.output["track"]);
    }
    // An event for a finished order: neither a new workflow nor a signal.
    let late = body("evt-104", "order-1", "delivered", 4);
    println!("{}", describe(&late, &receiver.receive(&late).await?));
    running.shutdown().await;

    // Counts from the database file, read by a read-only handle of its own, and from the
    // inbox; the deliveries and distinct events from the log.
    let reader =
        store_sqlite::SqliteDb::open(&file, store_sqlite::SqliteConfig { read_only: true, ..Default::default() })
            .await?;
    let instances: Vec<WorkflowInstance> = store_sqlite::SqliteWorkflowStore::new(reader)
        .list(1_000)
        .await?
        .into_iter()
        .filter(|i| i.workflow_type == "order")
        .collect();
    let orders: BTreeSet<String> = instances.iter().filter_map(|i| Event::of_input(&i.input)).map(|e| e.key).collect();
    let completed = instances.iter().filter(|i| i.status == WorkflowStatus::Completed).count();
    let mut signal_ids = BTreeSet::new();
    let mut after: Option<String> = None;
    loop {
        let page = deployment.store.inbox.scan_created_before(Instant::MAX, after.as_deref(), 500).await?;
        signal_ids.extend(page.records.iter().map(|r| r.signal_id.clone()));
        match page.last {
            Some(last) if page.is_full(500) => after = Some(last),
            _ => break,
        }
    }
    let (deliveries, events, duplicate_signals) = {
        let log = log.0.lock().expect("log lock");
        let route = route();
        // The entity of each event is in its body (`order`), as the receiver derived its key.
        let signaled = |id: &str| {
            let key = log.bodies.get(id).and_then(|b| b["order"].as_str()).unwrap_or_default();
            route.signal_id(key, id).is_ok_and(|s| signal_ids.contains(&s))
        };
        let repeats = log.deliveries.iter().filter(|(id, _)| signaled(id)).map(|(_, n)| n - 1).sum::<u64>();
        (log.deliveries.values().sum::<u64>(), log.bodies.len(), repeats)
    };
    println!("the database file: {}", file.display());
    println!(
        "webhook-events: deliveries={deliveries} events={events} workflows={} completed={completed} \
         duplicate_starts={} signals={} duplicate_signals={duplicate_signals}",
        instances.len(),
        instances.len() - orders.len(),
        signal_ids.len(),
    );
    Ok(())
}
