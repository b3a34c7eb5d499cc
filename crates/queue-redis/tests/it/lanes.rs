//! Weighted pop and promote-only enqueue under concurrency, from several connections that
//! share the rotation state in Redis (K-13).

use crate::queue_fixture;
use futures::future::join_all;
use kernel_core::domain::{Instant, Priority};
use kernel_core::ports::{LaneEntry, ReadyQueue};
use kernel_core::Error;
use kernel_core::WorkflowId;
use queue_redis::test_support::{redis_url, DedicatedRedis};
use queue_redis::{connect, LaneWeights, RedisReadyQueue};
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use testkit::time::TestTime;

const T0: Instant = Instant::from_millis(1_700_000_000_000);
const WORKERS: usize = 4;

fn lane_of_member(m: &str) -> usize {
    (m.as_bytes()[1] - b'0') as usize
}

/// Fill lanes with `counts[i]` due members each, from 8 concurrent enqueuers.
async fn prefill(q: &RedisReadyQueue, counts: [usize; 4]) {
    let mut items: Vec<(usize, usize)> = Vec::new();
    for (lane, n) in counts.iter().enumerate() {
        items.extend((0..*n).map(|i| (lane, i)));
    }
    let items = Arc::new(items);
    join_all((0..8).map(|t| {
        let (q, items) = (q.clone(), items.clone());
        async move {
            for (lane, i) in items.iter().skip(t).step_by(8) {
                q.enqueue(&WorkflowId::from(format!("p{lane}-{i:05}")), Priority::ALL[*lane], T0)
                    .await
                    .expect("enqueue");
            }
        }
    }))
    .await;
    let depths = q.stats(T0).await.unwrap().map(|s| s.depth as usize);
    assert_eq!(depths, counts);
}

/// One round: `WORKERS` connections pop `per_worker` each, concurrently; lane counts.
async fn concurrent_round(workers: &[RedisReadyQueue], per_worker: usize) -> [usize; 4] {
    let popped = join_all(workers.iter().map(|w| {
        let w = w.clone();
        tokio::spawn(async move {
            let mut got = Vec::with_capacity(per_worker);
            for _ in 0..per_worker {
                got.extend(w.pop_due(T0, 1).await.expect("pop"));
            }
            got
        })
    }))
    .await;
    let mut counts = [0; 4];
    for m in popped.into_iter().flat_map(|r| r.expect("worker")) {
        counts[lane_of_member(&m)] += 1;
    }
    counts
}

async fn workers(f: &crate::QueueFixture) -> Vec<RedisReadyQueue> {
    let mut v = Vec::new();
    for _ in 0..WORKERS {
        v.push(f.worker().await);
    }
    v
}

/// K-13 acceptance: with all four lanes full, every 20-pop round taken by 4 connections is
/// 8:6:4:2, and 20 000 pops split 40/30/20/10 % within ±2 percentage points.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn weighted_pop_from_four_connections_is_8_6_4_2() {
    let Some(f) = queue_fixture("weighted_pop_from_four_connections_is_8_6_4_2").await else { return };
    const POPS: usize = 20_000;
    const ROUNDS_WITH_BARRIER: usize = 100;
    // Enough in every lane that none runs dry during the run.
    prefill(&f, [8_100, 6_100, 4_100, 2_100]).await;
    let ws = workers(&f).await;
    let mut total = [0usize; 4];
    // Rounds separated by a barrier: the make-up of each is exact.
    for r in 0..ROUNDS_WITH_BARRIER {
        let c = concurrent_round(&ws, 20 / WORKERS).await;
        assert_eq!(c, [8, 6, 4, 2], "round {r}");
        (0..4).for_each(|i| total[i] += c[i]);
    }
    // The rest without barriers: the workers race freely.
    let rest = (POPS - ROUNDS_WITH_BARRIER * 20) / WORKERS;
    let c = concurrent_round(&ws, rest).await;
    (0..4).for_each(|i| total[i] += c[i]);
    assert_eq!(total.iter().sum::<usize>(), POPS);
    let want = [40.0, 30.0, 20.0, 10.0];
    for i in 0..4 {
        let pct = total[i] as f64 * 100.0 / POPS as f64;
        assert!(
            (pct - want[i]).abs() <= 2.0,
            "lane P{i}: {pct:.2} % of {POPS} pops, want {}±2 (split {total:?})",
            want[i]
        );
    }
    // Atomic scripts over shared rotation state: not merely close, exact.
    assert_eq!(total, [8_000, 6_000, 4_000, 2_000]);
    println!("20000 pops from {WORKERS} connections split {total:?}");
}

/// K-13 with batch pops: 4 connections pop batches of different sizes (3, 5, 7, 5 = one
/// 20-pop round) concurrently; every round is still exactly 8:6:4:2, because each batch is
/// that many single pops inside one atomic script over the shared rotation.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn weighted_batch_pops_from_four_connections_are_8_6_4_2() {
    let Some(f) = queue_fixture("weighted_batch_pops_from_four_connections_are_8_6_4_2").await else { return };
    const ROUNDS: usize = 100;
    prefill(&f, [8 * ROUNDS + 8, 6 * ROUNDS + 6, 4 * ROUNDS + 4, 2 * ROUNDS + 2]).await;
    let ws = workers(&f).await;
    let mut total = [0usize; 4];
    for r in 0..ROUNDS {
        let popped = join_all(ws.iter().zip([3, 5, 7, 5]).map(|(w, max)| {
            let w = w.clone();
            tokio::spawn(async move { w.pop_due(T0, max).await.expect("pop") })
        }))
        .await;
        let mut counts = [0; 4];
        for (m, max) in popped.into_iter().map(|r| r.expect("worker")).zip([3, 5, 7, 5]) {
            assert_eq!(m.len(), max, "every lane still has members");
            m.iter().for_each(|m| counts[lane_of_member(m)] += 1);
        }
        assert_eq!(counts, [8, 6, 4, 2], "round {r}");
        (0..4).for_each(|i| total[i] += counts[i]);
    }
    assert_eq!(total, [8 * ROUNDS, 6 * ROUNDS, 4 * ROUNDS, 2 * ROUNDS]);
}

/// K-13 acceptance: with P0 empty the other lanes keep 6:4:2, round after round.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn p0_empty_keeps_6_4_2_across_connections() {
    let Some(f) = queue_fixture("p0_empty_keeps_6_4_2_across_connections").await else { return };
    prefill(&f, [0, 600, 400, 200]).await;
    // P0 is present but holds nothing due.
    f.enqueue(&"p0-late".into(), Priority::P0, T0.plus(60_000)).await.unwrap();
    let ws = workers(&f).await;
    for r in 0..80 {
        // 12 pops = one round without P0, by 4 connections × 3.
        assert_eq!(concurrent_round(&ws, 3).await, [0, 6, 4, 2], "round {r}");
    }
}

/// K-13 acceptance: the burst window is shared state: one worker's empty pop arms it, the
/// next 8 pops of any workers serve P0, then the rotation resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn burst_window_is_shared_by_all_workers() {
    let Some(f) = queue_fixture("burst_window_is_shared_by_all_workers").await else { return };
    let ws = workers(&f).await;
    // Only delayed members: an empty pop from worker 0 arms the window.
    for i in 0..20 {
        f.enqueue(&WorkflowId::from(format!("p0-{i:05}")), Priority::P0, T0.plus(1_000)).await.unwrap();
        f.enqueue(&WorkflowId::from(format!("p1-{i:05}")), Priority::P1, T0.plus(1_000)).await.unwrap();
        f.enqueue(&WorkflowId::from(format!("p2-{i:05}")), Priority::P2, T0.plus(1_000)).await.unwrap();
    }
    assert!(ws[0].pop_due(T0, 1).await.unwrap().is_empty());
    let t1 = T0.plus(1_000);
    let mut lanes = Vec::new();
    for i in 0..24 {
        let m = ws[(i + 1) % WORKERS].pop_due(t1, 1).await.unwrap().pop().expect("due");
        lanes.push(lane_of_member(&m));
    }
    let want: Vec<usize> = [(0, 8), (1, 6), (2, 4), (0, 6)].iter().flat_map(|(l, n)| vec![*l; *n]).collect();
    assert_eq!(lanes, want, "burst of 8 from P0, then the rotation from P1");
    // Only an empty pop arms it: a pop that empties P0's due set does not.
    let rotation: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg(f.rotation_key())
        .query_async(&mut connect(&f.keys.url).await.unwrap())
        .await
        .unwrap();
    assert_eq!(rotation.get("burst_left").map(String::as_str), Some("0"), "{rotation:?}");
}

/// K-13 acceptance: promote-only holds under concurrent enqueues from 8 tasks on 8
/// connections: every member ends in exactly one lane, the most urgent any task asked for,
/// with that lane's score.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn promote_only_under_eight_concurrent_enqueuers() {
    let Some(f) = queue_fixture("promote_only_under_eight_concurrent_enqueuers").await else { return };
    const TASKS: usize = 8;
    const IDS: usize = 400;
    const REQUESTS_PER_TASK: usize = 1_000;
    // Seeded plan: task t asks for (id, lane) pairs; the score encodes the lane so the final
    // score is checkable too.
    let plans: Vec<Vec<(usize, usize)>> = (0..TASKS)
        .map(|t| {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(0x5eed + t as u64);
            (0..REQUESTS_PER_TASK).map(|_| (rng.gen_range(0..IDS), rng.gen_range(0..4))).collect()
        })
        .collect();
    let mut want: Vec<Option<usize>> = vec![None; IDS];
    for (id, lane) in plans.iter().flatten() {
        want[*id] = Some(want[*id].map_or(*lane, |l| l.min(*lane)));
    }
    let mut qs = Vec::new();
    for _ in 0..TASKS {
        qs.push(f.worker().await);
    }
    let handles: Vec<_> = qs
        .into_iter()
        .zip(plans)
        .map(|(q, plan)| {
            tokio::spawn(async move {
                for (id, lane) in plan {
                    q.enqueue(
                        &WorkflowId::from(format!("m-{id:04}")),
                        Priority::ALL[lane],
                        T0.plus(lane as i64 * 1_000),
                    )
                    .await
                    .expect("enqueue");
                }
            })
        })
        .collect();
    for h in join_all(handles).await {
        h.expect("task");
    }
    let mut depth_want = [0u64; 4];
    for (id, lane) in want.iter().enumerate() {
        let member = format!("m-{id:04}");
        let got = f.lane_of(&member).await.unwrap();
        assert_eq!(got.map(|p| p.index()), *lane, "{member}");
        if let Some(l) = lane {
            depth_want[*l] += 1;
            assert_eq!(
                f.score_of(&member).await.unwrap(),
                Some(T0.plus(*l as i64 * 1_000)),
                "{member}: score of its lane"
            );
        }
    }
    let depths = f.stats(T0.plus(10_000)).await.unwrap().map(|s| s.depth);
    assert_eq!(depths, depth_want, "never in two lanes");
}

/// Every key the adapter writes lives under its prefix.
#[tokio::test]
async fn keys_stay_under_the_prefix() {
    let Some(f) = queue_fixture("keys_stay_under_the_prefix").await else { return };
    for p in Priority::ALL {
        for i in 0..2 {
            f.enqueue(&WorkflowId::from(format!("k-{}-{i}", p.index())), p, T0).await.unwrap();
        }
    }
    let _ = f.pop_due(T0, 1).await.unwrap();
    let _ = f.pop_due(T0.minus(10), 1).await.unwrap();
    let mut keys = f.keys.keys();
    keys.sort();
    let p = &f.keys.prefix;
    assert_eq!(
        keys,
        [
            format!("{p}:{{{p}:lane}}:p0"),
            format!("{p}:{{{p}:lane}}:p1"),
            format!("{p}:{{{p}:lane}}:p2"),
            format!("{p}:{{{p}:lane}}:p3"),
            format!("{p}:{{{p}:lane}}:rotation")
        ]
    );
    f.clear().await.unwrap();
    assert!(f.keys.keys().is_empty());
}

/// Bad configuration is refused before any Redis call.
#[tokio::test]
async fn rejects_bad_weights_and_prefix() {
    let Some(f) = queue_fixture("rejects_bad_weights_and_prefix").await else { return };
    let conn = connect(&f.keys.url).await.unwrap();
    let zero = LaneWeights { weights: [8, 0, 4, 2], burst: 8 };
    assert!(matches!(RedisReadyQueue::new(conn.clone(), "p", zero), Err(Error::InvalidInput { .. })));
    let long_burst = LaneWeights { weights: [8, 6, 4, 2], burst: 1_001 };
    assert!(matches!(RedisReadyQueue::new(conn.clone(), "p", long_burst), Err(Error::InvalidInput { .. })));
    assert!(matches!(RedisReadyQueue::new(conn, "", LaneWeights::default()), Err(Error::InvalidInput { .. })));
}

/// Custom weights are honoured (and shared through ARGV, not hard-coded in the script).
#[tokio::test]
async fn custom_weights_and_burst() {
    let Some(f) = queue_fixture("custom_weights_and_burst").await else { return };
    let conn = connect(&f.keys.url).await.unwrap();
    let q = RedisReadyQueue::new(conn, &f.keys.prefix, LaneWeights { weights: [3, 1, 1, 1], burst: 2 }).unwrap();
    for lane in 0..4 {
        for i in 0..10 {
            q.enqueue(&WorkflowId::from(format!("p{lane}-{i:05}")), Priority::ALL[lane], T0.plus(100)).await.unwrap();
        }
    }
    assert!(q.pop_due(T0, 1).await.unwrap().is_empty(), "arms a burst of 2");
    let mut lanes = Vec::new();
    for _ in 0..8 {
        lanes.push(lane_of_member(&q.pop_due(T0.plus(100), 1).await.unwrap()[0]));
    }
    // Burst 2 from P0, then the rotation resumes on P1: 1, 1, 1, then P0×3.
    assert_eq!(lanes, [0, 0, 1, 2, 3, 0, 0, 0]);
}

/// A Redis that went away yields `Unavailable` (the engine then claims from the store).
#[tokio::test]
async fn redis_loss_maps_to_unavailable() {
    let Some(server) = DedicatedRedis::start("redis_loss_maps_to_unavailable") else { return };
    let conn = connect(&server.url).await.unwrap();
    let q = RedisReadyQueue::new(conn, "loss", LaneWeights::default()).unwrap();
    q.enqueue(&"a".into(), Priority::P1, T0).await.unwrap();
    drop(server);
    let e = q.enqueue(&"b".into(), Priority::P1, T0).await.expect_err("server is gone");
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    assert!(e.is_retryable());
    let e = q.pop_due(T0, 8).await.expect_err("server is gone");
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    let e = q
        .enqueue_many(&[LaneEntry { workflow_id: "c".into(), priority: Priority::P1, claimable_at: T0 }])
        .await
        .expect_err("server is gone");
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
}

/// Each adapter call is one round trip, counted by the server itself (a private server, so
/// its command statistics are ours alone): a batch of 100 enqueues is one `EVALSHA`, and so
/// is each batch pop, whatever its size. (The commands a script runs are counted too; they
/// are not round trips.)
#[tokio::test]
async fn each_batch_call_is_one_script_call_on_the_server() {
    let Some(server) = DedicatedRedis::start("each_batch_call_is_one_script_call_on_the_server") else { return };
    let mut conn = connect(&server.url).await.unwrap();
    let q = RedisReadyQueue::new(conn.clone(), "rt", LaneWeights::default()).unwrap();
    q.load_scripts().await.unwrap();
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut conn).await.unwrap();
    let entries: Vec<LaneEntry> = (0..100)
        .map(|i| LaneEntry {
            workflow_id: WorkflowId::from(format!("p{}-{i:05}", i % 4)),
            priority: Priority::ALL[i % 4],
            claimable_at: T0,
        })
        .collect();
    q.enqueue_many(&entries).await.unwrap();
    assert_eq!(q.pop_due(T0, 60).await.unwrap().len(), 60);
    assert_eq!(q.pop_due(T0, 60).await.unwrap().len(), 40, "the rest");
    assert!(q.pop_due(T0, 60).await.unwrap().is_empty());
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut conn).await.unwrap();
    let calls = |cmd: &str| -> Option<u64> {
        let line = info.lines().find(|l| l.starts_with(&format!("cmdstat_{cmd}:")))?;
        line.split(['=', ',']).nth(1)?.parse().ok()
    };
    assert_eq!(calls("evalsha"), Some(4), "one script call per adapter call: {info}");
    // Inside the pop script: the rotation state is read and written once per batch, not
    // once per member.
    assert_eq!((calls("hmget"), calls("hset")), (Some(3), Some(3)), "{info}");
    assert_eq!(calls("zadd"), Some(100), "{info}");
    // The pop counters: one increment per lane a batch took members from (all four in
    // each of the two batches), none for the empty one.
    assert_eq!(calls("hincrby"), Some(8), "{info}");
    for cmd in ["eval", "script|load"] {
        assert_eq!(calls(cmd), None, "{cmd}: {info}");
    }
    // Reading the counters is the one stats script call.
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut conn).await.unwrap();
    let stats = q.stats(T0).await.unwrap();
    assert_eq!(stats.map(|l| l.pops), [25; 4], "every member was popped once: {stats:?}");
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut conn).await.unwrap();
    let evalsha = info.lines().find(|l| l.starts_with("cmdstat_evalsha:")).unwrap_or_default();
    assert!(evalsha.starts_with("cmdstat_evalsha:calls=1,"), "{info}");
}

/// A damaged pop counter (not an integer) neither fails a pop nor loses its members: the
/// counter restarts from that pop, and `stats` reads a damaged counter as 0.
#[tokio::test]
async fn a_damaged_pop_counter_restarts() {
    let Some(f) = queue_fixture("a_damaged_pop_counter_restarts").await else { return };
    let mut conn = connect(&redis_url()).await.expect("connect");
    for i in 0..3 {
        f.queue.enqueue(&WorkflowId::from(format!("m-{i}")), Priority::P1, T0).await.unwrap();
    }
    let _: i64 = redis::cmd("HSET")
        .arg(f.queue.rotation_key())
        .arg("pops1")
        .arg("many")
        .arg("pops2")
        .arg("x1")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(f.queue.stats(T0).await.unwrap().map(|l| l.pops), [0; 4], "damaged counters read as 0");
    assert_eq!(f.queue.pop_due(T0, 2).await.unwrap().len(), 2);
    assert_eq!(f.queue.stats(T0).await.unwrap().map(|l| l.pops), [0, 2, 0, 0]);
    assert_eq!(f.queue.pop_due(T0, 2).await.unwrap().len(), 1);
    assert_eq!(f.queue.stats(T0).await.unwrap().map(|l| l.pops), [0, 3, 0, 0]);
}

/// The port refuses a bad batch as a whole, and Redis does not undo a script's earlier
/// writes when it fails midway: the bulk enqueue script checks every triple before its
/// first write. Raw script calls, as a caller bypassing the adapter's checks would make.
#[tokio::test]
async fn enqueue_many_script_refuses_a_bad_triple_before_any_write() {
    let Some(f) = queue_fixture("enqueue_many_script_refuses_a_bad_triple_before_any_write").await else { return };
    let script = redis::Script::new(include_str!("../../src/lua/enqueue_many.lua"));
    let lanes: Vec<String> = Priority::ALL.iter().map(|p| f.queue.lane_key(*p).to_string()).collect();
    let mut conn = connect(&redis_url()).await.expect("connect");
    let bad_batches: [&[&str]; 4] = [
        &["good-1", "2", "100", "good-2", "7", "100"],
        &["good-1", "2", "100", "good-2", "1", "soon"],
        &["good-1", "2", "100", "good-2", "1.5", "100"],
        &["good-1", "2", "100", "good-2", "1"],
    ];
    for batch in bad_batches {
        let mut inv = script.prepare_invoke();
        inv.key(&lanes);
        for a in batch {
            inv.arg(*a);
        }
        let out = inv.invoke_async::<i64>(&mut conn).await;
        assert!(out.is_err(), "{batch:?} was taken: {out:?}");
        for m in ["good-1", "good-2"] {
            assert_eq!(f.queue.lane_of(m).await.unwrap(), None, "{m} was written by the refused batch {batch:?}");
        }
    }
    let mut inv = script.prepare_invoke();
    inv.key(&lanes).arg("good-1").arg("2").arg("100");
    assert_eq!(inv.invoke_async::<i64>(&mut conn).await.unwrap(), 1, "a good batch is still taken");
    assert_eq!(f.queue.lane_of("good-1").await.unwrap(), Some(Priority::ALL[2]));
}
