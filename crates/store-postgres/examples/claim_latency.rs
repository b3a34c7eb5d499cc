//! By-hand benchmark: claim latency against the number of instances in the table.
//!
//! ```text
//! cargo run -p store-postgres --example claim_latency -- [sizes, default 1000,100000,1000000] [claims, default 2000]
//! ```
//!
//! For each size: a fresh schema, that many claimable instances (one in ten of them
//! running and due, half of those of type `summary`, the rest finished or waiting) written by one `INSERT … SELECT`,
//! `ANALYZE`, then `claims` sequential claims of distinct random due instances by id, each
//! followed by a `claim_any`, one connection, each timed on the client. Prints one line per
//! size: `claim-latency: store=postgres instances=… claim_p50_us=… claim_p99_us=…
//! claim_any_p50_us=… claim_any_p99_us=…`. Uses `DATABASE_URL`, else the local server; the
//! schema is dropped at the end.

use kernel_core::model::{DurationMs, Instant};
use kernel_core::ports::{ClaimSpec, WorkflowStore};
use rand::seq::SliceRandom;
use rand::Rng;
use std::time::Duration;
use store_postgres::{PostgresConfig, PostgresWorkflowStore};

const T0: i64 = 1_700_000_000_000;

fn percentile(sorted: &[Duration], p: f64) -> u128 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).map_or(0, |d| d.as_micros())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let sizes: Vec<i64> = args
        .next()
        .unwrap_or_else(|| "1000,100000,1000000".into())
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<_, _>>()?;
    let claims: usize = args.next().map_or(Ok(2000), |s| s.parse())?;
    let url = store_postgres::database_url();
    for n in sizes {
        let schema = format!("wfk_bench_{:012x}", rand::thread_rng().gen::<u64>() & 0xffff_ffff_ffff);
        let config = PostgresConfig { schema: schema.clone(), pool_size_max: 2, ..PostgresConfig::default() };
        let pool = store_postgres::connect(&url, &config)?;
        store_postgres::migrate(&pool, &schema).await?;
        let client = pool.get().await?;
        let started = std::time::Instant::now();
        client
            .batch_execute(&format!(
                "SET statement_timeout = 0; INSERT INTO \"{schema}\".workflow_instances (workflow_id, biz_key, workflow_type, status, \
                   claimable_time, business_priority, revision, retry_count, prepare_failures, \
                   definition_fingerprint, created_at, updated_at, steps, input, output, wait) \
                 SELECT 'wf-' || lpad(i::text, 8, '0'), 'biz:' || i, \
                   CASE WHEN i % 20 = 0 THEN 'summary' ELSE 'any' END, \
                   CASE WHEN i % 10 = 0 THEN 'running' WHEN i % 10 = 1 THEN 'waiting' ELSE 'completed' END, \
                   CASE WHEN i % 10 IN (0, 1) THEN {T0} - (i % 100000) END, i % 4, 1, 0, 0, 'fp', {T0}, {T0}, \
                   '[{{\"name\":\"fetch\",\"status\":\"pending\",\"attempt\":0,\"elapsed_ms\":0,\"traffic_wait_ms\":0,\"traffic_waits\":0}}]', \
                   '{{\"fencing_token\":\"f1\"}}', '{{}}', \
                   CASE WHEN i % 10 = 1 THEN '{{\"kind\":\"timer\",\"generation\":0,\"step_index\":0}}'::jsonb END \
                 FROM generate_series(1, {n}) AS i; \
                 ANALYZE \"{schema}\".workflow_instances; RESET statement_timeout;"
            ))
            .await?;
        let fill = started.elapsed();
        let durability: Vec<String> = client
            .query("SELECT current_setting('synchronous_commit'), current_setting('fsync')", &[])
            .await?
            .iter()
            .map(|r| format!("synchronous_commit={} fsync={}", r.get::<_, String>(0), r.get::<_, String>(1)))
            .collect();
        drop(client);
        let store = PostgresWorkflowStore::new(pool.clone(), config)?;
        let mut due: Vec<i64> = (1..=n).filter(|i| i % 20 == 0).collect();
        due.shuffle(&mut rand::thread_rng());
        let samples = claims.min(due.len() - 1);
        // Claims by id take type `summary`, `claim_any` type `any`: disjoint halves of the
        // due instances, so neither takes what the other is about to claim.
        let spec = |k: usize, t: &str| ClaimSpec {
            now: Instant::from_millis(T0),
            lease_ms: DurationMs::from_secs(30),
            token: format!("tok-{k}").into(),
            types: vec![t.into()],
        };
        // The two kinds alternate, so both see the same server state (checkpoints after
        // the fill, cache warmth); the first round of each prepares its statement and is
        // not counted.
        let (mut by_id, mut any) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
        for (k, i) in due.iter().take(samples + 1).enumerate() {
            let id = format!("wf-{i:08}");
            let t = std::time::Instant::now();
            let got = store.claim(&id.as_str().into(), &spec(2 * k, "summary")).await?;
            let claim = t.elapsed();
            assert!(got.is_some(), "{id} was due");
            let t = std::time::Instant::now();
            let got = store.claim_any(&spec(2 * k + 1, "any")).await?;
            let claim_any = t.elapsed();
            assert!(got.is_some(), "a due instance was left");
            if k > 0 {
                by_id.push(claim);
                any.push(claim_any);
            }
        }
        by_id.sort_unstable();
        any.sort_unstable();
        println!(
            "claim-latency: store=postgres instances={n} claims={samples} claim_p50_us={} claim_p99_us={} \
             claim_any_p50_us={} claim_any_p99_us={} fill_s={:.1} {}",
            percentile(&by_id, 0.5),
            percentile(&by_id, 0.99),
            percentile(&any, 0.5),
            percentile(&any, 0.99),
            fill.as_secs_f64(),
            durability.join(" ")
        );
        pool.get().await?.batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE")).await?;
    }
    Ok(())
}
