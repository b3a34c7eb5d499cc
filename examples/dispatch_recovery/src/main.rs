//! From request to workflow under fire (K-11, K-12, K-3.1).
//!
//! An API process accepts requests (business object + pending dispatch intent in one
//! write) and is killed at random points between accept, StartOrResume and confirm. Two
//! recovery dispatchers race to finish what it left; the candidate index is flushed once
//! mid-run. One request in ten fails in its first round; the user then starts a new round
//! (K-11.4) and the old round's activity is allowed to write late — a fenced write that
//! must change nothing, and so must the late confirm of round f1 by an API process that
//! died on that object. Every late write attempted must be rejected. Prints one line:
//!
//! `dispatch: seed=<s> accepted=<n> registered=<n> duplicate_instances=0 stuck_pending=0 input_mismatch=0 late_writes_attempted=<n> late_writes_rejected=<n>`
//!
//! Backends: `memory` (default: every port in memory; the candidate index is flushed) or
//! `mongo`: instances, inbox and the business collection on MongoDB in a fresh database of
//! the server named by `--store <url>`, else `WFK_STORE`, else `MONGODB_URI`; candidates on
//! the Redis named by `--queue <url>`, else `WFK_QUEUE`, else `REDIS_URL`, else
//! `redis://127.0.0.1:6379`, under a fresh key prefix whose keys are deleted once — the
//! candidate index is lost — and at the end; nothing else on that Redis is touched. Both
//! come from `compose`, like every binary's adapters.
//!
//! `postgres`: the same with instances, inbox and the business table on PostgreSQL, in a
//! fresh schema (dropped at the end) of the database named by `--store <url>`, else
//! `WFK_STORE`, else `DATABASE_URL`, else `postgres://postgres@127.0.0.1:5432/test`.
//!
//! Run: `cargo run -p dispatch-recovery -- [--seed S] [--requests N] [--backend memory|mongo|postgres] [--store URL] [--queue URL]`

use compose::{url_from_args, QueueOptions, QueueSide, Role, Scheme, StoreSide};
use kernel_core::dispatch::{AcceptRequest, Dispatch, DispatchConfig};
use kernel_core::ports::{DispatchStatus, DynCandidates, DynOutbox};
use kernel_core::ObjectId;
use kernel_core::{Engine, Priority, StartRequest};
use kernel_examples::workflows::{order, ORDER};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use testkit::harness::{Lister, World};
use testkit::memory::{InMemoryCandidates, InMemoryOutbox};

/// The local server of the test machines (trust authentication on the address).
const POSTGRES_DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

struct Args {
    seed: u64,
    requests: usize,
    backend: String,
    /// `--store`, `WFK_STORE`, else `MONGODB_URI` (`mongo`) or `DATABASE_URL` (`postgres`).
    store_url: Option<String>,
    /// `--queue`, `WFK_QUEUE` or `REDIS_URL` (the `mongo` backend's candidate index).
    queue_url: Option<String>,
}

fn args() -> Result<Args, Box<dyn std::error::Error>> {
    let env = |k: &str| std::env::var(k).ok();
    let (store_url, rest) = url_from_args(Role::Store, std::env::args().skip(1), env, &[])?;
    let (queue_url, rest) = url_from_args(Role::Queue, rest, env, &["REDIS_URL"])?;
    let mut a = Args { seed: 7, requests: 1_000, backend: "memory".into(), store_url, queue_url };
    let mut it = rest.into_iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--seed" => a.seed = value.parse().map_err(|e| format!("--seed: {e}"))?,
            "--requests" => a.requests = value.parse().map_err(|e| format!("--requests: {e}"))?,
            "--backend" if matches!(value.as_str(), "memory" | "mongo" | "postgres") => a.backend = value,
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    // Each backend's own server variable, when neither the flag nor WFK_STORE names one.
    let set = |k: &str| env(k).filter(|v| !v.is_empty());
    a.store_url = a.store_url.take().or_else(|| match a.backend.as_str() {
        "mongo" => set("MONGODB_URI"),
        "postgres" => set("DATABASE_URL").or_else(|| Some(POSTGRES_DEFAULT_URL.to_string())),
        _ => None,
    });
    if a.requests == 0 || a.requests > 100_000 {
        return Err("--requests must be 1..=100000".into());
    }
    Ok(a)
}

/// The ports of one backend, and how to lose the candidate index.
struct Backend {
    world: World,
    outbox: Arc<DynOutbox>,
    candidates: Arc<DynCandidates>,
    flush: Box<dyn Fn() -> Pin<Box<dyn Future<Output = ()>>>>,
    cleanup: Option<(StoreSide, QueueSide)>,
}

async fn backend(args: &Args) -> Result<Backend, Box<dyn std::error::Error>> {
    if args.backend == "memory" {
        let (outbox, candidates) = (InMemoryOutbox::new(), InMemoryCandidates::new());
        let c = candidates.clone();
        return Ok(Backend {
            world: World::new(args.seed),
            outbox: Arc::new(outbox),
            candidates: Arc::new(candidates),
            flush: Box::new(move || {
                c.flush();
                Box::pin(async {})
            }),
            cleanup: None,
        });
    }
    let url = args.store_url.as_deref().ok_or("--backend mongo needs --store <url>, WFK_STORE or MONGODB_URI")?;
    let scheme = compose::Target::parse(Role::Store, url)?.scheme;
    let wanted = if args.backend == "postgres" { Scheme::Postgres } else { Scheme::Mongo };
    if scheme != wanted {
        return Err(
            format!("--backend {} needs a {} store url, got {}", args.backend, wanted.kind(), scheme.kind()).into()
        );
    }
    let store = StoreSide::connect_scratch(url, "dispatch_recovery").await?;
    let outbox = store.dispatch_outbox().await?;
    // The server comes from the flags or the environment (started by the scripts), never from here.
    let redis_url = args.queue_url.as_deref().unwrap_or("redis://127.0.0.1:6379");
    let queue = QueueSide::connect_scratch(redis_url, &QueueOptions::default(), "dispatch-demo").await?;
    let candidates = queue.dispatch_candidates()?;
    let lister: Lister = if scheme == Scheme::Postgres {
        let listed = store.postgres_store()?.clone();
        Arc::new(move || {
            let s = listed.clone();
            Box::pin(async move { s.list(100_000).await })
        })
    } else {
        let listed = store.mongo_store()?.clone();
        Arc::new(move || {
            let s = listed.clone();
            Box::pin(async move { s.list(100_000).await })
        })
    };
    let lost = queue.clone();
    let flush: Box<dyn Fn() -> Pin<Box<dyn Future<Output = ()>>>> = Box::new(move || {
        // Our own prefix only.
        let lost = lost.clone();
        Box::pin(async move {
            let _ = lost.destroy().await;
        })
    });
    Ok(Backend {
        world: World::with_durable(args.seed, HashMap::new(), store.store.clone(), store.inbox.clone(), lister),
        outbox,
        candidates,
        flush,
        cleanup: Some((store, queue)),
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args()?;
    let mut rng = SmallRng::seed_from_u64(args.seed);
    let b = backend(&args).await?;
    let (world, outbox, candidates) = (b.world.clone(), b.outbox.clone(), b.candidates.clone());
    let defs = || vec![order(outbox.clone())];
    let dispatch = |id: &str, engine: &Engine| {
        let config = DispatchConfig { dispatcher_id: id.into(), ..DispatchConfig::default() };
        Dispatch::builder()
            .outbox(outbox.clone())
            .candidates(candidates.clone())
            .publisher(engine.publisher())
            .clock(world.clock.clone())
            .ids(world.ids.clone())
            .config(config)
            .build()
    };
    let mut objects = Vec::with_capacity(args.requests);
    let api_engine = world.engine("api", defs());
    let api = dispatch("api", &api_engine)?;
    let worker = world.engine("worker", defs());
    let (r1e, r2e) = (world.engine("R1", defs()), world.engine("R2", defs()));
    let (r1, r2) = (dispatch("R1", &r1e)?, dispatch("R2", &r2e)?);

    let mut accepted_calls = 0usize;
    let mut failing = Vec::new();
    // Objects whose API process died before confirming: it comes back late.
    let mut died = HashSet::new();
    for i in 0..args.requests {
        let object_id = ObjectId::from(format!("note-{i}"));
        objects.push(object_id.clone());
        let fail = rng.gen_ratio(1, 10);
        if fail {
            failing.push(object_id.clone());
        }
        let req = AcceptRequest {
            fields: json!({ "title": format!("note {i}") }),
            workflow_type: ORDER.into(),
            biz_key: format!("{ORDER}:{object_id}"),
            fencing_token: "f1".into(),
            input: json!({ "object_id": object_id, "fencing_token": "f1", "fail": fail, "stream": rng.gen_bool(0.5) }),
            priority: if rng.gen_bool(0.3) { Priority::P0 } else { Priority::P2 },
            object_id: object_id.clone(),
        };
        // The API process dies at a random point between its three writes.
        match rng.gen_range(0..10) {
            0..=2 => {
                api.accept(req).await?; // dies right after accept
                died.insert(object_id.clone());
            }
            3 | 4 => {
                died.insert(object_id.clone());
                // dies after StartOrResume, before confirm
                let input = req.input.clone();
                api.accept(req).await?;
                api_engine
                    .publisher()
                    .start_or_resume(StartRequest::new(ORDER, format!("{ORDER}:{object_id}"), input))
                    .await?;
            }
            _ => {
                api.accept(req).await?;
                api.dispatch_now(&object_id).await?;
            }
        }
        accepted_calls += 1;
        if i == args.requests / 2 {
            (b.flush)().await; // the candidate index is lost once
        }
        if i % 50 == 49 {
            world.clock.advance(1_000);
        }
    }

    // Two recovery dispatchers race while workers run; simulated time moves on.
    let (mut late_writes_attempted, mut late_writes_rejected) = (0u64, 0u64);
    let mut retried = false;
    for _ in 0..500 {
        let (a, b) = tokio::join!(async { (r1.scan().await, r1.recover_round().await) }, async {
            (r2.scan().await, r2.recover_round().await)
        });
        for r in [a.0.map(|_| ()), a.1.map(|_| ()), b.0.map(|_| ()), b.1.map(|_| ())] {
            r?;
        }
        world.drive(&worker).await?;
        let mut pending = false;
        for id in &objects {
            pending |=
                outbox.get(id).await?.and_then(|r| r.dispatch).is_some_and(|d| d.status != DispatchStatus::Dispatched);
        }
        let unfinished = world.instances().await?.iter().any(|i| !i.status.is_terminal());
        if !pending && !unfinished {
            if retried {
                break;
            }
            // Users start a new round for every failed object; the old round writes late.
            for id in &failing {
                let Some(rec) = outbox.get(id).await? else { continue };
                if rec.business_status.as_deref() != Some("failed") {
                    continue;
                }
                let input = json!({ "object_id": id, "fencing_token": "f2", "fail": false, "stream": false });
                api.retry_failed(id, &"f1".into(), &"f2".into(), input).await?;
                late_writes_attempted += 1;
                if !outbox
                    .fenced_update(id, &"f1".into(), json!({ "result": "late result of round f1" }), Some("done"))
                    .await?
                {
                    late_writes_rejected += 1;
                }
                if died.contains(id) {
                    // The API process that died on this object comes back and confirms f1.
                    late_writes_attempted += 1;
                    if !outbox.confirm_dispatched(id, &"f1".into()).await? {
                        late_writes_rejected += 1;
                    }
                }
            }
            retried = true;
            continue;
        }
        world.clock.advance(5_000);
    }

    let env = testkit::dispatch::DispatchEnv {
        world: world.clone(),
        outbox: outbox.clone(),
        candidates: candidates.clone(),
        defs: Arc::new(|o| vec![order(o)]),
    };
    let v = env.verdict(&objects).await?;
    let (accepted, registered, duplicates, stuck, mismatch) =
        (v.accepted, v.registered, v.duplicate_instances, v.stuck_pending, v.input_mismatch);
    if let Some((store, queue)) = b.cleanup {
        store.destroy().await?;
        queue.destroy().await?;
    }
    println!(
        "dispatch: seed={} accepted={accepted} registered={registered} duplicate_instances={duplicates} stuck_pending={stuck} input_mismatch={mismatch} late_writes_attempted={late_writes_attempted} late_writes_rejected={late_writes_rejected} backend={}",
        args.seed, args.backend
    );
    if accepted != accepted_calls
        || registered != accepted
        || duplicates + stuck + mismatch > 0
        || late_writes_attempted == 0
        || late_writes_rejected != late_writes_attempted
    {
        return Err("dispatch invariants violated".into());
    }
    Ok(())
}
