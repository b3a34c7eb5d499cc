//! The publisher process: starts one parcel workflow on the store and queue named by
//! `--store`/`--queue` (or `WFK_STORE`/`WFK_QUEUE`) and prints its workflow id. It runs no
//! activity: a worker process picks the workflow up (K-4.1, K-5).
//!
//! Run: `cargo run -p worker --bin publish -- --store mongodb://127.0.0.1:27017/wfk --queue redis://127.0.0.1:6379 [--biz-key parcel:42]`

use compose::{Deployment, QueueOptions, Urls};
use kernel_core::engine::Publisher;
use kernel_core::ports::{IdGenerator, RandomIds};
use kernel_core::StartRequest;
use serde_json::json;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    worker::init_tracing();
    let (urls, mut rest) = Urls::from_args(std::env::args().skip(1), |k| std::env::var(k).ok())?;
    let biz_key = worker::take_flag(&mut rest, "biz-key")
        .unwrap_or_else(|| format!("parcel:{}", RandomIds::default().new_token()));
    if let Some(unknown) = rest.first() {
        return Err(format!("unknown argument {unknown} (flags: --store, --queue, --biz-key)").into());
    }
    let deployment = Deployment::from_urls(&urls, &QueueOptions::default()).await?;
    // A publisher needs only the store, the queue and the wakeup; it runs no activity.
    let side = deployment.publisher_side();
    let publisher = Publisher::builder(side.store, side.queue, side.wakeup).plans(worker::plans()).build()?;
    let input = json!({ "parcel": biz_key });
    let out = publisher.start_or_resume(StartRequest::new(worker::WORKFLOW_TYPE, &biz_key, input)).await?;
    tracing::info!(workflow = %out.instance.workflow_id, biz_key, created = out.created, "published");
    println!("{}", out.instance.workflow_id);
    Ok(())
}
