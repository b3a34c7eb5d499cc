//! The writer and the forwarder on a real Redis (K-16). Each test uses a fresh key prefix
//! whose keys are deleted afterwards.

use futures::FutureExt;
use kernel_core::domain::{DurationMs, Instant};
use kernel_core::ports::{DynClock, Frame, StreamKey, StreamOwner, StreamSink};
use kernel_core::Error;
use redis::AsyncCommands;
use redis_conn::test_support::{require_redis, TestKeys};
use serde_json::json;
use sse_stream::codec::Record;
use sse_stream::{connect, ForwardConfig, ForwardEvent, Forwarder, RedisStreamSink, StreamConfig, StreamSecret};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use testkit::memory::ManualClock;

/// The writer of these tests (one claim).
const OWNER: StreamOwner = StreamOwner { lease_until: Instant::from_millis(1_000_000) };

fn secret() -> StreamSecret {
    StreamSecret::new([42u8; 32]).expect("32 bytes")
}

struct Fixture {
    keys: TestKeys,
    conn: sse_stream::RedisConn,
    clock: Arc<ManualClock>,
    sink: RedisStreamSink,
    key: StreamKey,
}

impl Fixture {
    fn forwarder(&self) -> Forwarder {
        Forwarder::new(
            self.conn.clone(),
            self.sink.keys(&self.key),
            ForwardConfig { read_batch: 3, poll_ms: 5, ..ForwardConfig::default() },
        )
    }
    async fn llen(&self) -> usize {
        let mut c = self.conn.clone();
        c.llen(self.sink.keys(&self.key).frames).await.unwrap()
    }
    async fn pttl(&self, key: String) -> i64 {
        let mut c = self.conn.clone();
        redis::cmd("PTTL").arg(key).query_async(&mut c).await.unwrap()
    }
}

/// A sink with `config` tweaked by `tweak`, or `None` when Redis is unavailable outside CI.
async fn fixture(test: &str, tweak: impl FnOnce(&mut StreamConfig)) -> Option<Fixture> {
    let url = require_redis(test)?;
    let keys = TestKeys::new(&url, test);
    let conn = connect(&url).await.expect("connect");
    let clock = Arc::new(ManualClock::new(1_000_000));
    let mut config = StreamConfig::new(&keys.prefix, secret());
    tweak(&mut config);
    let sink = RedisStreamSink::new(conn.clone(), clock.clone() as Arc<DynClock>, config).expect("sink");
    let key = StreamKey { object_id: "obj-1".into(), workflow_id: "wf-1".into(), fencing_token: "f-1".into() };
    Some(Fixture { keys, conn, clock, sink, key })
}

/// Every text is its own frame (no batching), so tests can count frames.
fn unbatched(c: &mut StreamConfig) {
    c.text_batch_bytes = 1;
}

async fn next(f: &mut Forwarder) -> Option<ForwardEvent> {
    tokio::time::timeout(Duration::from_secs(5), f.next()).await.expect("forwarder stalled").expect("redis")
}

fn text(e: &ForwardEvent) -> Option<(u64, u64, String)> {
    match e {
        ForwardEvent::Frame { generation, offset, record: Record::Text(t) } => Some((*generation, *offset, t.clone())),
        _ => None,
    }
}

#[tokio::test]
async fn reconnect_mid_generation_replays_every_frame_then_follows_to_terminal() {
    let Some(fx) = fixture("reconnect_mid_generation", unbatched).await else { return };
    let gen = fx.sink.reset(&fx.key, OWNER).await.unwrap();
    for i in 0..5 {
        assert_eq!(fx.sink.append(&fx.key, OWNER, Frame::Text(format!("t{i}"))).await.unwrap(), i);
    }
    // First client reads a part, then disconnects mid-generation.
    let mut a = fx.forwarder();
    assert_eq!(next(&mut a).await, Some(ForwardEvent::Replay { generation: gen }));
    for i in 0..3 {
        assert_eq!(text(&next(&mut a).await.unwrap()), Some((gen, i, format!("t{i}"))));
    }
    drop(a);
    for i in 5..8 {
        fx.sink.append(&fx.key, OWNER, Frame::Text(format!("t{i}"))).await.unwrap();
    }
    fx.sink.append(&fx.key, OWNER, Frame::Control(json!({"phase": "polish"}))).await.unwrap();
    // The reconnecting client replays every retained frame of the generation, in order.
    let mut b = fx.forwarder();
    assert_eq!(next(&mut b).await, Some(ForwardEvent::Replay { generation: gen }));
    for i in 0..8 {
        assert_eq!(text(&next(&mut b).await.unwrap()), Some((gen, i, format!("t{i}"))));
    }
    assert!(matches!(next(&mut b).await, Some(ForwardEvent::Frame { offset: 8, record: Record::Control(_), .. })));
    // Then live frames, then the terminal.
    let writer = {
        let (sink, key) = (fx.sink.clone(), fx.key.clone());
        tokio::spawn(async move {
            for i in 9..12 {
                tokio::time::sleep(Duration::from_millis(20)).await;
                sink.append(&key, OWNER, Frame::Text(format!("t{i}"))).await.unwrap();
            }
            sink.terminal(&key, OWNER, json!({"status": "completed", "revision": 7})).await.unwrap();
        })
    };
    for i in 9..12 {
        assert_eq!(text(&next(&mut b).await.unwrap()), Some((gen, i, format!("t{i}"))));
    }
    assert_eq!(next(&mut b).await, Some(ForwardEvent::Terminal(json!({"status": "completed", "revision": 7}))));
    assert_eq!(next(&mut b).await, None);
    writer.await.unwrap();
}

#[tokio::test]
async fn reset_between_generation_check_and_read_never_mixes_generations() {
    let Some(fx) = fixture("reset_in_read_window", unbatched).await else { return };
    // Inject the reset at the 1st, 2nd and 3rd read of a forwarder.
    for inject_at in 1..=3usize {
        let g1 = fx.sink.reset(&fx.key, OWNER).await.unwrap();
        for i in 0..7 {
            fx.sink.append(&fx.key, OWNER, Frame::Text(format!("g{g1}-{i}"))).await.unwrap();
        }
        let reads = Arc::new(AtomicUsize::new(0));
        let hook = {
            let (sink, key, reads) = (fx.sink.clone(), fx.key.clone(), reads.clone());
            Arc::new(move || {
                let (sink, key, reads) = (sink.clone(), key.clone(), reads.clone());
                async move {
                    if reads.fetch_add(1, Ordering::SeqCst) + 1 == inject_at {
                        let g2 = sink.reset(&key, OWNER).await.unwrap();
                        for i in 0..2 {
                            sink.append(&key, OWNER, Frame::Text(format!("g{g2}-{i}"))).await.unwrap();
                        }
                        sink.terminal(&key, OWNER, json!({"generation": g2})).await.unwrap();
                    }
                }
                .boxed()
            })
        };
        let mut f = fx.forwarder().with_read_hook(hook);
        let mut current = None;
        let mut seen = Vec::new();
        let mut replays = 0;
        while let Some(e) = next(&mut f).await {
            match e {
                ForwardEvent::Replay { generation } => {
                    replays += 1;
                    current = Some(generation);
                    seen.clear();
                }
                ForwardEvent::Frame { generation, offset, record: Record::Text(t) } => {
                    assert_eq!(Some(generation), current);
                    assert!(t.starts_with(&format!("g{generation}-")), "frame {t} in generation {generation}");
                    assert_eq!(offset as usize, seen.len());
                    seen.push(t);
                }
                ForwardEvent::Terminal(v) => {
                    assert_eq!(v["generation"].as_u64(), current);
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        let g2 = current.unwrap();
        assert_eq!(g2, g1 + 1, "inject_at={inject_at}");
        assert_eq!(seen, vec![format!("g{g2}-0"), format!("g{g2}-1")]);
        assert_eq!(replays, 2, "initial replay plus one restart");
    }
}

#[tokio::test]
async fn after_terminal_reconnect_returns_final_result_without_replay() {
    let Some(fx) = fixture("final_after_terminal", unbatched).await else { return };
    fx.sink.reset(&fx.key, OWNER).await.unwrap();
    for i in 0..4 {
        fx.sink.append(&fx.key, OWNER, Frame::Text(format!("t{i}"))).await.unwrap();
    }
    let summary = json!({"status": "completed", "revision": 12});
    fx.sink.terminal(&fx.key, OWNER, summary.clone()).await.unwrap();
    let mut f = fx.forwarder();
    assert_eq!(next(&mut f).await, Some(ForwardEvent::Final(summary.clone())));
    assert_eq!(next(&mut f).await, None);
    // Also once the frames' read-out window has passed: the reference outlives them.
    let mut c = fx.conn.clone();
    let _: () = c.del(fx.sink.keys(&fx.key).frames).await.unwrap();
    let mut g = fx.forwarder();
    assert_eq!(next(&mut g).await, Some(ForwardEvent::Final(summary)));
}

#[tokio::test]
async fn no_frame_after_terminal() {
    let Some(fx) = fixture("no_frame_after_terminal", unbatched).await else { return };
    fx.sink.reset(&fx.key, OWNER).await.unwrap();
    fx.sink.append(&fx.key, OWNER, Frame::Text("a".into())).await.unwrap();
    fx.sink.terminal(&fx.key, OWNER, json!({"status": "completed"})).await.unwrap();
    let len = fx.llen().await;
    assert_eq!(len, 2);
    for frame in [Frame::Text("late".into()), Frame::Control(json!({})), Frame::Error(json!({"code": 1}))] {
        assert!(matches!(fx.sink.append(&fx.key, OWNER, frame).await, Err(Error::Conflict(_))));
    }
    // A second writer (another process) is refused by the script itself.
    let other = RedisStreamSink::new(
        fx.conn.clone(),
        fx.clock.clone() as Arc<DynClock>,
        StreamConfig { text_batch_bytes: 1, ..StreamConfig::new(&fx.keys.prefix, secret()) },
    )
    .unwrap();
    assert!(matches!(other.append(&fx.key, OWNER, Frame::Text("late".into())).await, Err(Error::Conflict(_))));
    // A second terminal is a no-op.
    fx.sink.terminal(&fx.key, OWNER, json!({"status": "other"})).await.unwrap();
    assert_eq!(fx.llen().await, len);
    let mut f = fx.forwarder();
    assert_eq!(next(&mut f).await, Some(ForwardEvent::Final(json!({"status": "completed"}))));
    // A reset (a replayed round) opens the stream again.
    fx.sink.reset(&fx.key, OWNER).await.unwrap();
    assert_eq!(fx.sink.append(&fx.key, OWNER, Frame::Text("again".into())).await.unwrap(), 0);
}

#[tokio::test]
async fn terminal_shortens_only_the_frames_ttl() {
    let Some(fx) = fixture("terminal_ttl", |c| {
        c.text_batch_bytes = 1;
        c.frames_ttl_ms = 3_600_000;
        c.readout_ttl_ms = 30_000;
        c.reconnect_ttl_ms = 7_200_000;
    })
    .await
    else {
        return;
    };
    let keys = fx.sink.keys(&fx.key);
    fx.sink.reset(&fx.key, OWNER).await.unwrap();
    fx.sink.append(&fx.key, OWNER, Frame::Text("a".into())).await.unwrap();
    let generating = fx.pttl(keys.frames.clone()).await;
    assert!(generating > 3_000_000, "long TTL while generating, got {generating}");
    fx.sink.terminal(&fx.key, OWNER, json!({"status": "completed"})).await.unwrap();
    let frames = fx.pttl(keys.frames.clone()).await;
    assert!(frames > 0 && frames <= 30_000, "frames TTL after terminal {frames}");
    for k in [keys.terminal, keys.generation] {
        let ttl = fx.pttl(k.clone()).await;
        assert!(ttl > 7_000_000, "{k} keeps the reconnect TTL, got {ttl}");
    }
}

#[tokio::test]
async fn text_is_batched_by_size_and_linger_and_flushed_before_control_and_terminal() {
    let Some(fx) = fixture("text_batching", |c| {
        c.text_batch_bytes = 1_024;
        c.text_linger_ms = DurationMs::from_millis(100);
    })
    .await
    else {
        return;
    };
    fx.sink.reset(&fx.key, OWNER).await.unwrap();
    // Small texts stay pending until the linger passes on the clock port.
    for i in 0..10 {
        assert_eq!(fx.sink.append(&fx.key, OWNER, Frame::Text(format!("w{i} "))).await.unwrap(), 0);
    }
    assert_eq!(fx.llen().await, 0);
    fx.clock.advance(100);
    for _ in 0..200 {
        if fx.llen().await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(fx.llen().await, 1, "linger flush");
    // ~1 KB pending appends at once.
    let chunk = "x".repeat(300);
    for _ in 0..3 {
        fx.sink.append(&fx.key, OWNER, Frame::Text(chunk.clone())).await.unwrap();
    }
    assert_eq!(fx.llen().await, 1);
    // The next one would pass ~1 KB: the pending 900 bytes become frame 1, it waits in frame 2.
    assert_eq!(fx.sink.append(&fx.key, OWNER, Frame::Text(chunk.clone())).await.unwrap(), 2);
    assert_eq!(fx.llen().await, 2, "size flush");
    // Control flushes pending text first, in order.
    fx.sink.append(&fx.key, OWNER, Frame::Text("before-control".into())).await.unwrap();
    assert_eq!(fx.sink.append(&fx.key, OWNER, Frame::Control(json!({"phase": "x"}))).await.unwrap(), 3);
    fx.sink.append(&fx.key, OWNER, Frame::Text("before-terminal".into())).await.unwrap();
    fx.sink.terminal(&fx.key, OWNER, json!({"status": "completed"})).await.unwrap();
    let mut f = fx.forwarder();
    let mut c = fx.conn.clone();
    let raw: Vec<Vec<u8>> = c.lrange(fx.sink.keys(&fx.key).frames, 0, -1).await.unwrap();
    let records: Vec<Record> = raw.iter().map(|b| sse_stream::codec::decode(b).unwrap()).collect();
    assert_eq!(records.len(), 6);
    assert_eq!(records[0], Record::Text((0..10).map(|i| format!("w{i} ")).collect()));
    assert_eq!(records[1], Record::Text(chunk.repeat(3)));
    assert_eq!(records[2], Record::Text(chunk.clone() + "before-control"));
    assert_eq!(records[3], Record::Control(json!({"phase": "x"})));
    assert_eq!(records[4], Record::Text("before-terminal".into()));
    assert_eq!(records[5], Record::Terminal(json!({"status": "completed"})));
    assert!(matches!(next(&mut f).await, Some(ForwardEvent::Final(_))));
}

/// Defect 11 (K-16): reset, append and terminal are fenced inside the scripts by the
/// stream's owner, so a zombie (an older lease) can neither wipe its successor's frames
/// nor delete the terminal reference, and its frames never land.
#[tokio::test]
async fn an_older_owner_cannot_reset_append_or_end_the_stream() {
    let Some(fx) = fixture("hardening_11", unbatched).await else { return };
    let zombie = StreamOwner { lease_until: Instant::from_millis(999_999) };
    let newer = OWNER;
    fx.sink.reset(&fx.key, zombie).await.unwrap();
    fx.sink.append(&fx.key, zombie, Frame::Text("old".into())).await.unwrap();
    let g = fx.sink.reset(&fx.key, newer).await.unwrap();
    fx.sink.append(&fx.key, newer, Frame::Text("new".into())).await.unwrap();
    assert!(matches!(fx.sink.reset(&fx.key, zombie).await, Err(Error::Conflict(_))));
    assert!(matches!(fx.sink.append(&fx.key, zombie, Frame::Text("late".into())).await, Err(Error::Conflict(_))));
    assert_eq!(fx.llen().await, 1, "the successor's frame alone");
    // A second writer process of the zombie, with no local state, is refused the same way.
    let other =
        RedisStreamSink::new(fx.conn.clone(), fx.clock.clone() as Arc<DynClock>, fx.sink.config().clone()).unwrap();
    assert!(matches!(other.reset(&fx.key, zombie).await, Err(Error::Conflict(_))));
    assert!(matches!(other.append(&fx.key, zombie, Frame::Text("late".into())).await, Err(Error::Conflict(_))));
    assert!(matches!(other.terminal(&fx.key, zombie, json!({"status": "failed"})).await, Err(Error::Conflict(_))));
    fx.sink.terminal(&fx.key, newer, json!({"status": "completed"})).await.unwrap();
    assert!(matches!(other.reset(&fx.key, zombie).await, Err(Error::Conflict(_))), "the terminal reference stays");
    let mut f = fx.forwarder();
    assert_eq!(next(&mut f).await, Some(ForwardEvent::Final(json!({"status": "completed"}))));
    let mut c = fx.conn.clone();
    let gen: u64 = c.get(fx.sink.keys(&fx.key).generation).await.unwrap();
    assert_eq!(gen, g, "no reset since the successor's");
}

/// Defect 12: the frames of one generation are capped (`StreamConfig::frames_max`, 10 000 by
/// default). An append beyond it is refused with a typed error and appends nothing; the
/// workflow, which ignores stream errors, goes on (K-16).
#[tokio::test]
async fn frames_of_a_generation_are_capped() {
    assert_eq!(StreamConfig::new("p", secret()).frames_max, 10_000);
    let cap = 100;
    let Some(fx) = fixture("hardening_12_frames", |c| {
        unbatched(c);
        c.frames_max = cap as u64;
    })
    .await
    else {
        return;
    };
    fx.sink.reset(&fx.key, OWNER).await.unwrap();
    for i in 0..cap {
        fx.sink.append(&fx.key, OWNER, Frame::Text("x".into())).await.unwrap_or_else(|e| panic!("frame {i}: {e}"));
    }
    let over = fx.sink.append(&fx.key, OWNER, Frame::Text("one too many".into())).await;
    assert!(matches!(over, Err(Error::InvalidInput { .. })), "{over:?}");
    assert_eq!(fx.llen().await, cap, "nothing appended beyond the cap");
    // The terminal frame is not a progress frame: it always fits, so readers learn the end.
    fx.sink.terminal(&fx.key, OWNER, json!({"status": "completed"})).await.unwrap();
    assert_eq!(fx.llen().await, cap + 1);
    // A new generation starts empty.
    fx.sink.reset(&fx.key, OWNER).await.unwrap();
    assert_eq!(fx.sink.append(&fx.key, OWNER, Frame::Text("again".into())).await.unwrap(), 0);
}

/// Defect 12: a forwarder on a stream nobody writes (abandoned, or never started) does not
/// poll forever: after `ForwardConfig::idle_ms_max` without a new frame it ends with a
/// typed, retryable error (the client may reconnect).
#[tokio::test]
async fn a_forwarder_gives_up_on_an_abandoned_stream() {
    let Some(fx) = fixture("hardening_12_idle", unbatched).await else { return };
    fx.sink.reset(&fx.key, OWNER).await.unwrap();
    fx.sink.append(&fx.key, OWNER, Frame::Text("only".into())).await.unwrap();
    let config = ForwardConfig { read_batch: 3, poll_ms: 5, idle_ms_max: 50 };
    let mut f = Forwarder::new(fx.conn.clone(), fx.sink.keys(&fx.key), config);
    assert!(matches!(next(&mut f).await, Some(ForwardEvent::Replay { .. })));
    assert!(text(&next(&mut f).await.unwrap()).is_some());
    let end =
        tokio::time::timeout(Duration::from_secs(5), f.next()).await.expect("forwarder polled an abandoned stream");
    assert!(matches!(&end, Err(e) if e.is_retryable()), "{end:?}");
    assert_eq!(f.next().await.unwrap(), None, "nothing after giving up");
}
