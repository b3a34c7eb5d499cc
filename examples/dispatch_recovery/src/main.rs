//! From request to workflow under fire (K-11, K-12, K-3.1).
//!
//! An API process accepts requests (business object + pending dispatch intent in one
//! write) and is killed at random points between accept, StartOrResume and confirm. Two
//! recovery dispatchers race to finish what it left; the candidate index is flushed once
//! mid-run. One request in ten fails in its first round; the user then starts a new round
//! (K-11.4) and the old round's activity is allowed to write late — a fenced write that
//! must change nothing. Prints one line:
//!
//! `dispatch: seed=<s> accepted=<n> registered=<n> duplicate_instances=0 stuck_pending=0 input_mismatch=0 late_writes_rejected=<n>`
//!
//! Run: `cargo run -p dispatch-recovery -- [--seed S] [--requests N]`

use kernel_core::dispatch::{AcceptRequest, Dispatch, DispatchConfig};
use kernel_core::ports::{DispatchOutbox, DispatchStatus};
use kernel_core::{Engine, Priority, StartRequest};
use kernel_examples::workflows::{order, ORDER};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use serde_json::json;
use std::sync::Arc;
use testkit::harness::World;
use testkit::memory::{InMemoryCandidates, InMemoryOutbox};

struct Args {
    seed: u64,
    requests: usize,
}

fn args() -> Result<Args, String> {
    let mut a = Args { seed: 7, requests: 1_000 };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--seed" => a.seed = value.parse().map_err(|e| format!("--seed: {e}"))?,
            "--requests" => a.requests = value.parse().map_err(|e| format!("--requests: {e}"))?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.requests == 0 || a.requests > 100_000 {
        return Err("--requests must be 1..=100000".into());
    }
    Ok(a)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args()?;
    let mut rng = SmallRng::seed_from_u64(args.seed);
    let world = World::new(args.seed);
    let outbox = InMemoryOutbox::new();
    let candidates = InMemoryCandidates::new();
    let defs = || vec![order(Arc::new(outbox.clone()))];
    let dispatch = |id: &str, engine: &Engine| {
        let config = DispatchConfig { dispatcher_id: id.into(), ..DispatchConfig::default() };
        Dispatch::new(
            Arc::new(outbox.clone()),
            Arc::new(candidates.clone()),
            engine.publisher(),
            world.clock.clone(),
            world.ids.clone(),
            config,
        )
    };
    let api_engine = world.engine("api", defs());
    let api = dispatch("api", &api_engine)?;
    let worker = world.engine("worker", defs());
    let (r1e, r2e) = (world.engine("R1", defs()), world.engine("R2", defs()));
    let (r1, r2) = (dispatch("R1", &r1e)?, dispatch("R2", &r2e)?);

    let mut accepted = 0usize;
    let mut failing = Vec::new();
    for i in 0..args.requests {
        let object_id = format!("note-{i}");
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
            }
            3 | 4 => {
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
        accepted += 1;
        if i == args.requests / 2 {
            candidates.flush(); // the candidate index is lost once
        }
        if i % 50 == 49 {
            world.clock.advance(1_000);
        }
    }

    // Two recovery dispatchers race while workers run; simulated time moves on.
    let mut late_writes_rejected = 0u64;
    let mut retried = false;
    for _ in 0..500 {
        let (a, b) = tokio::join!(async { (r1.scan().await, r1.recover_round().await) }, async {
            (r2.scan().await, r2.recover_round().await)
        });
        for r in [a.0.map(|_| ()), a.1.map(|_| ()), b.0.map(|_| ()), b.1.map(|_| ())] {
            r?;
        }
        world.drive(&worker).await?;
        let all = outbox.all();
        let pending = all.iter().any(|r| r.dispatch.as_ref().is_some_and(|d| d.status != DispatchStatus::Dispatched));
        let unfinished = world.store.all().iter().any(|i| !i.status.is_terminal());
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
                api.retry_failed(id, "f1", "f2", input).await?;
                if !outbox.fenced_update(id, "f1", json!({ "result": "late result of round f1" }), Some("done")).await?
                {
                    late_writes_rejected += 1;
                }
            }
            retried = true;
            continue;
        }
        world.clock.advance(5_000);
    }

    let instances = world.store.all();
    let (mut registered, mut duplicates, mut stuck, mut mismatch) = (0, 0, 0, 0);
    for rec in outbox.all() {
        let d = rec.dispatch.expect("accepted objects carry an intent");
        if d.status != DispatchStatus::Dispatched {
            stuck += 1;
        }
        let mine: Vec<_> = instances.iter().filter(|i| i.biz_key == d.biz_key).collect();
        if !mine.is_empty() {
            registered += 1;
            duplicates += mine.len() - 1;
            let snapshot = serde_json::to_vec(d.input.as_ref().expect("snapshot"))?;
            if serde_json::to_vec(&mine[0].input)? != snapshot {
                mismatch += 1;
            }
        }
    }
    println!(
        "dispatch: seed={} accepted={accepted} registered={registered} duplicate_instances={duplicates} stuck_pending={stuck} input_mismatch={mismatch} late_writes_rejected={late_writes_rejected}",
        args.seed
    );
    if registered != accepted || duplicates + stuck + mismatch > 0 || late_writes_rejected == 0 {
        return Err("dispatch invariants violated".into());
    }
    Ok(())
}
