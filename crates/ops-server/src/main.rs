//! `ops-server`: the web console of a deployment.
//!
//! ```text
//! ops-server --store <url> --queue <url> --config <file.json> [--listen 127.0.0.1:8080] [--metrics-listen <addr>]
//! ```
//! The store and queue URLs are the workers' (also from `WFK_STORE`/`WFK_QUEUE`);
//! the configuration lists the bearer tokens and, when a fronting proxy authenticates, its
//! header names (see `ops_server::ServerConfig`). Prints `listening on http://<addr>` once
//! it serves; stops on Ctrl-C, flushing the audit and observation writes. With
//! `--metrics-listen <addr>`, `GET /metrics` on that address serves the lane gauges in the
//! Prometheus text format (a port of its own: guard it by the network, not a session).
//!
//! It knows no workflow definitions, so `regenerate` (which needs the step plan) answers 400;
//! an application that wants it embeds `ops_server::router` over its own `Ops::from_parts`.

use std::sync::Arc;

/// Where the console listens by default: this machine only.
const LISTEN_DEFAULT: &str = "127.0.0.1:8080";

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run().await {
        eprintln!("ops-server: {e}");
        std::process::exit(2);
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let (urls, rest) = compose::Urls::from_args(std::env::args().skip(1), |k| std::env::var(k).ok())?;
    let mut listen = LISTEN_DEFAULT.to_string();
    let mut config_path = std::env::var("OPS_SERVER_CONFIG").ok();
    let mut metrics_listen: Option<String> = None;
    let mut it = rest.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--listen" => listen = it.next().ok_or("--listen needs an address")?,
            "--config" => config_path = Some(it.next().ok_or("--config needs a file")?),
            "--metrics-listen" => metrics_listen = Some(it.next().ok_or("--metrics-listen needs an address")?),
            "-h" | "--help" => {
                println!(
                    "ops-server --store <url> --queue <url> --config <file.json> [--listen {LISTEN_DEFAULT}] \
                     [--metrics-listen <addr>]"
                );
                return Ok(());
            }
            other => return Err(format!("unknown argument `{other}`").into()),
        }
    }
    let config_path = config_path.ok_or("--config <file.json> (or OPS_SERVER_CONFIG) is required")?;
    let text = std::fs::read_to_string(&config_path).map_err(|e| format!("{config_path}: {e}"))?;
    let config = ops_server::ServerConfig::from_json(&text)?;
    let ops = Arc::new(ops::Ops::connect(&urls.store, &urls.queue, vec![]).await?);
    let app = ops_server::router(ops.clone(), &config)?;
    // `/metrics` on a listener of its own, when asked: the scrape port is guarded by the
    // network, not by the console's sessions. This process's figures are the lane gauges;
    // workers serve theirs through `ops_server::metrics_router` over their metered ports.
    if let Some(addr) = metrics_listen {
        let metrics = Arc::new(kernel_metrics::Metrics::new());
        let scrape = ops_server::metrics_router(metrics, ops.ports().queue.clone(), ops.ports().clock.clone(), None);
        let listener = tokio::net::TcpListener::bind(&addr).await?;
        println!("metrics on http://{}/metrics", listener.local_addr()?);
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, scrape).await {
                tracing::error!(error = %e, "the metrics listener stopped");
            }
        });
    }
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    ops.close().await;
    Ok(())
}
