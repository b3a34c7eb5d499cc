//! The engine side: `Engine` on a store (in-memory by default) with the Redis lanes and
//! doorbell, a no-op observer and the system clock, running a four-step linear workflow.

use crate::args::{BenchArgs, StoreKind};
use crate::counting::{CountingStore, Tally};
use crate::Burst;
use compose::{QueueOptions, QueueSide, StoreSide};
use kernel_core::domain::{StepStatus, WorkflowStatus};
use kernel_core::engine::{RunningEngine, WakeupState};
use kernel_core::ports::DynStore;
use kernel_core::{
    ActivityContext, Definition, Engine, EngineConfig, Ports, Publisher, StartRequest, StepDef, StepOutcome, WorkflowId,
};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Steps of the benchmark workflow.
pub const STEPS: usize = 4;
/// Its type.
pub const WORKFLOW_TYPE: &str = "e2e_linear4";
/// Scratch namespace tag (database, key prefix).
const SCRATCH_TAG: &str = "e2e_bench";

/// `s1 → s2 → s3 → s4`, each a trivial activity with a small JSON output.
pub fn definition() -> Definition {
    let mut builder = Definition::builder(WORKFLOW_TYPE);
    for i in 1..=STEPS {
        let activity =
            move |_ctx: ActivityContext| async move { Ok(StepOutcome::complete(json!({ "step": i, "ok": true }))) };
        let mut step = StepDef::new(format!("s{i}"), activity);
        if i > 1 {
            step = step.depends_on([format!("s{}", i - 1)]);
        }
        builder = builder.step(step);
    }
    builder.build().expect("the benchmark definition is valid")
}

/// Start every request with [`Publisher::start_many`]: batches of at most
/// [`Publisher::START_MANY_MAX`], each one store write per workflow, one enqueue script call
/// and one doorbell; at most `batches_in_flight` batches at once. Any refused request fails
/// the run.
pub async fn start_all(
    publisher: &Publisher,
    mut requests: Vec<StartRequest>,
    batches_in_flight: usize,
) -> Result<Vec<WorkflowId>, String> {
    use futures::stream::{self, StreamExt, TryStreamExt};
    let mut batches = Vec::new();
    while !requests.is_empty() {
        let rest = requests.split_off(requests.len().min(Publisher::START_MANY_MAX));
        batches.push(std::mem::replace(&mut requests, rest));
    }
    let per_batch: Vec<Vec<WorkflowId>> = stream::iter(batches)
        .map(|batch| async move {
            let results = publisher.start_many(batch).await.map_err(|e| format!("start: {e}"))?;
            results
                .into_iter()
                .map(|r| r.map(|o| o.instance.workflow_id).map_err(|e| format!("start: {e}")))
                .collect::<Result<Vec<_>, String>>()
        })
        .buffered(batches_in_flight.max(1))
        .try_collect()
        .await?;
    Ok(per_batch.into_iter().flatten().collect())
}

/// A running engine on fresh scratch namespaces, torn down by [`close`](Self::close).
pub struct EngineBench {
    running: RunningEngine,
    publisher: Publisher,
    tally: Arc<Tally>,
    raw_store: Arc<DynStore>,
    store: StoreSide,
    queue: QueueSide,
}

fn err(what: &str) -> impl Fn(compose::ComposeError) -> String + '_ {
    move |e| format!("{what}: {e}")
}

impl EngineBench {
    /// Connect (a fresh database or in-memory store, a fresh Redis key prefix), build the
    /// engine with `args.slots` slots and spawn it; returns once its doorbell is subscribed.
    pub async fn open(args: &BenchArgs) -> Result<EngineBench, String> {
        let store = match args.store {
            StoreKind::Memory => StoreSide::connect_scratch("memory:", SCRATCH_TAG).await,
            StoreKind::MongoWire => {
                let url = args.mongo_url.as_deref().ok_or("no Mongo URL")?;
                StoreSide::connect_scratch(url, SCRATCH_TAG).await
            }
            StoreKind::Postgres => StoreSide::connect_scratch(&args.postgres_url, SCRATCH_TAG).await,
            StoreKind::Sqlite => {
                // One fresh file in the temporary directory for the store and the local
                // coordination (`--queue local`), removed by `close`.
                let nanos =
                    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
                let file = std::env::temp_dir().join(format!("{SCRATCH_TAG}_{}_{nanos:x}.db", std::process::id()));
                let d = compose::Deployment::connect(
                    &format!("sqlite:{}", file.display()),
                    "local",
                    &QueueOptions::default(),
                )
                .await
                .map_err(err("sqlite"))?;
                return Self::start(args, d.store, d.queue).await;
            }
        }
        .map_err(err("store"))?;
        let queue = QueueSide::connect_scratch(&args.redis_url, &QueueOptions::default(), SCRATCH_TAG)
            .await
            .map_err(err("queue"))?;
        Self::start(args, store, queue).await
    }

    async fn start(args: &BenchArgs, store: StoreSide, queue: QueueSide) -> Result<EngineBench, String> {
        let counting = CountingStore::new(store.store.clone());
        let tally = counting.tally();
        let ports = Ports::builder()
            .store(Arc::new(counting))
            .inbox(store.inbox.clone())
            .queue(queue.queue.clone())
            .wakeup(queue.wakeup.clone())
            .permits(queue.permits.clone())
            .build()
            .map_err(|e| e.to_string())?;
        let config =
            EngineConfig { worker_id: "e2e-bench".into(), worker_slots: args.slots, ..EngineConfig::default() };
        let engine = Engine::builder(ports).config(config).register(definition()).build().map_err(|e| e.to_string())?;
        let publisher = engine.publisher();
        let running = engine.spawn();
        let since = Instant::now();
        while running.health().wakeup != WakeupState::Subscribed {
            if since.elapsed() > Duration::from_secs(10) {
                return Err(format!("the engine's doorbell is {:?} after 10 s", running.health().wakeup));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let raw_store = store.store.clone();
        Ok(EngineBench { running, publisher, tally, raw_store, store, queue })
    }

    /// Start `n` workflows at once and wait for the last terminal write. Returns the ids, for
    /// [`check_completed`](Self::check_completed) once the caller has read what it counts
    /// over the burst (the check's reads are not the burst's statements).
    pub async fn burst(
        &self,
        tag: &str,
        n: usize,
        concurrency: usize,
        redis: &mut redis::aio::MultiplexedConnection,
    ) -> Result<(Burst, Vec<WorkflowId>), String> {
        let requests: Vec<StartRequest> =
            (0..n).map(|i| StartRequest::new(WORKFLOW_TYPE, format!("{tag}-b{i}"), json!({ "i": i }))).collect();
        let (terminal0, writes0, calls0) = (
            self.tally.terminal(),
            self.tally.writes.load(std::sync::atomic::Ordering::Relaxed),
            self.tally.calls.load(std::sync::atomic::Ordering::Relaxed),
        );
        let cpu0 = crate::cpu::CpuSnapshot::take(redis).await?;
        let t0 = Instant::now();
        let ids = start_all(&self.publisher, requests, concurrency).await?;
        self.tally.wait_terminal(terminal0 + n as u64, crate::burst_timeout(n)).await?;
        let cpu = crate::cpu::CpuSnapshot::take(redis).await?.since(cpu0);
        let last = self.tally.last_terminal().ok_or("no terminal write seen")?;
        let writes = self.tally.writes.load(std::sync::atomic::Ordering::Relaxed) - writes0;
        let calls = self.tally.calls.load(std::sync::atomic::Ordering::Relaxed) - calls0;
        // Store calls are statements on PostgreSQL; elsewhere they are not printed.
        let statements = (self.store.scheme == compose::Scheme::Postgres).then_some(calls);
        Ok((Burst { elapsed: last - t0, cpu, writes, statements, commits: None }, ids))
    }

    /// Store calls so far on PostgreSQL (one statement each), `None` on other stores.
    pub fn statements(&self) -> Option<u64> {
        (self.store.scheme == compose::Scheme::Postgres)
            .then(|| self.tally.calls.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The store as the oracle: every id is completed with every step completed and its
    /// output recorded.
    pub async fn check_completed(&self, ids: &[WorkflowId]) -> Result<(), String> {
        let mut bad = Vec::new();
        for id in ids {
            let inst = self.raw_store.get(id).await.map_err(|e| format!("read {id}: {e}"))?;
            let ok = inst.is_some_and(|i| {
                i.status == WorkflowStatus::Completed
                    && i.steps.len() == STEPS
                    && i.steps.iter().all(|s| s.status == StepStatus::Completed && s.attempt == 1)
                    && (1..=STEPS).all(|k| i.output.contains_key(&format!("s{k}")))
            });
            if !ok {
                bad.push(id.to_string());
            }
        }
        match bad.len() {
            0 => Ok(()),
            k => Err(format!("engine: {k} of {} workflows not completed in the store (first: {})", ids.len(), bad[0])),
        }
    }

    /// `k` workflows one at a time: milliseconds from the start call to the terminal write.
    pub async fn singles(&self, tag: &str, k: usize) -> Result<Vec<f64>, String> {
        let mut out = Vec::with_capacity(k);
        for i in 0..k {
            let req = StartRequest::new(WORKFLOW_TYPE, format!("{tag}-s{i}"), json!({ "i": i }));
            let before = self.tally.terminal();
            let t0 = Instant::now();
            let ids = start_all(&self.publisher, vec![req], 1).await?;
            self.tally.wait_terminal(before + 1, crate::burst_timeout(1)).await?;
            let last = self.tally.last_terminal().ok_or("no terminal write seen")?;
            out.push((last - t0).as_secs_f64() * 1e3);
            self.check_completed(&ids).await?;
        }
        Ok(out)
    }

    /// Stop the engine and delete the scratch namespaces.
    pub async fn close(self) -> Result<(), String> {
        let EngineBench { running, publisher, tally: _, raw_store, store, queue } = self;
        drop((publisher, raw_store));
        if !running.shutdown().await {
            return Err("the engine did not shut down cleanly".into());
        }
        queue.destroy().await.map_err(err("purge the key prefix"))?;
        store.destroy().await.map_err(err("drop the database"))
    }
}
