//! Reads one workflow from the store named by `--store` (or `WFK_STORE`) and prints
//! `store=<kind> queue=<kind> workflow=<id> status=<status> revision=<revision>`, the
//! store's own record (the truth, K-1.1). `--destroy` then deletes the deployment's data (drops the database, purges the
//! key prefix): for throw-away deployments such as a test run.
//!
//! Run: `cargo run -p worker --bin status -- --store mongodb://127.0.0.1:27017/wfk --queue redis://127.0.0.1:6379 --workflow <id> [--destroy]`

use compose::{Deployment, QueueOptions, Urls};
use kernel_core::WorkflowId;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    worker::init_tracing();
    let (urls, mut rest) = Urls::from_args(std::env::args().skip(1), |k| std::env::var(k).ok())?;
    let workflow_id = worker::take_flag(&mut rest, "workflow").ok_or("--workflow <id> is required")?;
    let destroy = match rest.iter().position(|a| a == "--destroy") {
        Some(at) => {
            rest.remove(at);
            true
        }
        None => false,
    };
    if let Some(unknown) = rest.first() {
        return Err(format!("unknown argument {unknown} (flags: --store, --queue, --workflow, --destroy)").into());
    }
    let deployment = Deployment::from_urls(&urls, &QueueOptions::default()).await?;
    let instance = deployment.store.store.get(&WorkflowId::from(&workflow_id)).await?;
    let record = match &instance {
        Some(i) => format!("workflow={} status={} revision={}", i.workflow_id, i.status.as_str(), i.revision),
        None => format!("workflow={workflow_id} status=absent revision=0"),
    };
    let line = format!("{} {record}", deployment.describe());
    if destroy {
        deployment.destroy().await?;
    }
    println!("{line}");
    Ok(())
}
