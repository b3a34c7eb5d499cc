//! The worker process: the parcel definition on the store and queue named by
//! `--store`/`--queue` (or `WFK_STORE`/`WFK_QUEUE`), the observer on the store's database,
//! the wall clock, and a graceful shutdown on SIGTERM or Ctrl-C (K-6.6).
//!
//! Run: `cargo run -p worker --bin worker -- --store mongodb://127.0.0.1:27017/wfk --queue redis://127.0.0.1:6379 [--worker-id w1]`

use compose::{Deployment, QueueOptions, Urls};
use kernel_core::engine::{Engine, ShutdownHook};
use kernel_core::ports::SystemClock;
use observer::{Observer, ObserverConfig};
use std::process::ExitCode;
use std::sync::Arc;

#[tokio::main]
async fn main() -> ExitCode {
    worker::init_tracing();
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            tracing::error!("shutdown timed out: running claims were cancelled and their leases left to expire");
            ExitCode::FAILURE
        }
        Err(e) => {
            tracing::error!(error = %e, "worker failed");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let (urls, mut rest) = Urls::from_args(std::env::args().skip(1), |k| std::env::var(k).ok())?;
    let default_id = format!("worker-{}", std::process::id());
    let worker_id = worker::take_flag(&mut rest, "worker-id").unwrap_or(default_id);
    if let Some(unknown) = rest.first() {
        return Err(format!("unknown argument {unknown} (flags: --store, --queue, --worker-id)").into());
    }
    let deployment = Deployment::from_urls(&urls, &QueueOptions::default()).await?;

    // The observer writes next to the instances and is drained after the last claim.
    let repo = deployment.store.observation_repository().await?;
    let (sink, writer) = Observer::start(repo, Arc::new(SystemClock), ObserverConfig::default())?;
    let writer = Arc::new(writer);
    let drain: ShutdownHook = Arc::new(move || {
        let writer = writer.clone();
        Box::pin(async move {
            if let Err(e) = writer.flush().await {
                tracing::warn!(error = %e, "observer drain failed");
            }
        })
    });
    let ports = deployment.ports().observer(Arc::new(sink.clone())).build()?;
    let engine = Engine::builder(ports)
        .config(worker::config(&worker_id))
        .register(worker::definition())
        .on_shutdown(drain)
        .build()?;
    let running = engine.spawn();
    tracing::info!(worker = %worker_id, deployment = %deployment.describe(), "worker running; SIGTERM or Ctrl-C stops it");

    shutdown_signal().await?;
    tracing::info!("stopping: no new claims; running claims finish");
    let clean = running.shutdown().await;
    let stats = sink.stats();
    tracing::info!(clean, dropped = stats.dropped, "worker stopped");
    Ok(clean)
}

/// Resolve on SIGTERM (how a supervisor stops a process) or Ctrl-C.
async fn shutdown_signal() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r,
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await
    }
}
