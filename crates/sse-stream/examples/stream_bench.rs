//! Benchmark (run by hand, not in CI): frames per second and bytes per frame of the compact
//! record vs. the full SSE JSON event, encode + decode in memory and appended to Redis.
//!
//! Run: `cargo run --release -p sse-stream --example stream_bench` (needs Redis at
//! `--queue <url>`, else `WFK_QUEUE`, else `REDIS_URL`, else `redis://127.0.0.1:6379`,
//! connected through `compose`; its keys live under a fresh prefix deleted afterwards).

use compose::{url_from_args, QueueOptions, QueueSide, Role};
use kernel_core::ports::{Clock, DynClock, Frame, StreamKey, StreamOwner, StreamSink, SystemClock};
use serde_json::json;
use sse_stream::codec::{decode, encode, Record};
use sse_stream::event::SseEvent;
use sse_stream::{RedisStreamSink, StreamConfig, StreamSecret};
use std::sync::Arc;
use std::time::Instant;

const FRAMES: usize = 200_000;
const REDIS_FRAMES: usize = 20_000;

fn workload(n: usize) -> Vec<Record> {
    (0..n)
        .map(|i| match i % 20 {
            0 => Record::Control(json!({ "phase": "compose", "step": i })),
            1 => Record::Error(json!({ "code": 429, "message": "rate limited, retrying" })),
            _ => Record::Text(format!("token{i} of the summary ")),
        })
        .collect()
}

fn report(name: &str, frames: usize, bytes: usize, secs: f64) {
    println!("{name:<28} frames/s={:>12.0}  bytes/frame={:>6.1}", frames as f64 / secs, bytes as f64 / frames as f64);
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let records = workload(FRAMES);
    // Compact: header byte + raw text / compact JSON.
    let t = Instant::now();
    let mut bytes = 0;
    for r in &records {
        let b = encode(r)?;
        bytes += b.len();
        std::hint::black_box(decode(&b)?);
    }
    report("compact encode+decode", FRAMES, bytes, t.elapsed().as_secs_f64());
    // Full JSON: the restored SSE event, serialized and parsed.
    let t = Instant::now();
    let mut bytes = 0;
    for r in &records {
        let s = SseEvent::from_record(r.clone()).to_json();
        bytes += s.len();
        std::hint::black_box(serde_json::from_str::<SseEvent>(&s)?);
    }
    report("full JSON encode+decode", FRAMES, bytes, t.elapsed().as_secs_f64());

    // The server comes from the flags or the environment (started by the scripts), never from here.
    let (url, _) = url_from_args(Role::Queue, std::env::args().skip(1), |k| std::env::var(k).ok(), &["REDIS_URL"])?;
    let url = url.unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let side = QueueSide::connect_scratch(&url, &QueueOptions::default(), "stream-bench").await?;
    let prefix = side.key_prefix().unwrap_or_default().to_string();
    let conn = side.redis_connection()?.connection().clone();
    let key = StreamKey { object_id: "o".into(), workflow_id: "w".into(), fencing_token: "f".into() };
    // Unbatched compact appends through the writer (one Lua call each).
    let config = StreamConfig { text_batch_bytes: 1, ..StreamConfig::new(&prefix, StreamSecret::new([9u8; 32])?) };
    let sink = RedisStreamSink::new(conn.clone(), Arc::new(SystemClock) as Arc<DynClock>, config)?;
    let owner = StreamOwner { lease_until: SystemClock.now() };
    sink.reset(&key, owner).await?;
    let t = Instant::now();
    let mut bytes = 0;
    for r in records.iter().take(REDIS_FRAMES) {
        bytes += encode(r)?.len();
        let f = match r.clone() {
            Record::Text(s) => Frame::Text(s),
            Record::Control(v) => Frame::Control(v),
            Record::Error(v) => Frame::Error(v),
            Record::Terminal(v) => Frame::Control(v),
        };
        sink.append(&key, owner, f).await?;
    }
    report("redis append compact", REDIS_FRAMES, bytes, t.elapsed().as_secs_f64());
    // The same frames stored as full JSON (plain RPUSH, one call each) for comparison.
    let list = format!("{prefix}:full-json");
    let mut c = conn.clone();
    let t = Instant::now();
    let mut bytes = 0;
    for r in records.iter().take(REDIS_FRAMES) {
        let s = SseEvent::from_record(r.clone()).to_json();
        bytes += s.len();
        let _: i64 = redis::cmd("RPUSH").arg(&list).arg(s).query_async(&mut c).await?;
    }
    report("redis rpush full JSON", REDIS_FRAMES, bytes, t.elapsed().as_secs_f64());
    let used: i64 = redis::cmd("MEMORY").arg("USAGE").arg(sink.keys(&key).frames).query_async(&mut c).await?;
    let used_full: i64 = redis::cmd("MEMORY").arg("USAGE").arg(&list).query_async(&mut c).await?;
    println!(
        "redis memory per frame       compact={:.1} B  full JSON={:.1} B",
        used as f64 / REDIS_FRAMES as f64,
        used_full as f64 / REDIS_FRAMES as f64
    );
    side.destroy().await?;
    Ok(())
}
