//! Conformance cases for the ready queue port (K-13).
//!
//! Every case takes a **fresh, empty** queue built with the default [`LaneWeights`]
//! (8:6:4:2, burst 8) and pins the exact pop order, so two adapters that pass cannot differ
//! observably. The cases that compare a batch call with single calls take two fresh queues
//! of the same adapter (the macro calls the factory twice). Single pops are
//! `pop_due(now, 1)`. Lane membership is read from member names (`p<lane>-<n>`), never from the
//! adapter's internals.
//!
//! ```ignore
//! testkit::queue_conformance!(|| async { Some(testkit::memory::InMemoryQueue::default()) });
//! ```
//!
//! [`LaneWeights`]: crate::memory::LaneWeights

use crate::time::TestTime;
use futures::future::join_all;
use kernel_core::domain::DurationMs;
use kernel_core::domain::{Instant, Priority};
use kernel_core::ports::{DynQueue, LaneEntry, LaneStats, ENQUEUE_MANY_MAX, POP_DUE_MAX};
use kernel_core::Error;
use kernel_core::WorkflowId;
use std::sync::Arc;

/// A queue under test plus whatever must be cleaned up after the case.
pub trait QueueFixture: Send + Sync + 'static {
    /// The port under test, fresh and empty.
    fn queue(&self) -> &DynQueue;
    /// Clean up after the case (it runs also when the case panics); the default does nothing.
    fn teardown(self) -> futures::future::BoxFuture<'static, ()>
    where
        Self: Sized,
    {
        Box::pin(async {})
    }
}

impl QueueFixture for crate::memory::InMemoryQueue {
    fn queue(&self) -> &DynQueue {
        self
    }
}

impl QueueFixture for Arc<DynQueue> {
    fn queue(&self) -> &DynQueue {
        &**self
    }
}

impl<Q: kernel_core::ports::ReadyQueue> QueueFixture for Box<Q> {
    fn queue(&self) -> &DynQueue {
        &**self
    }
}

/// Base time of every case (ms).
pub const T0: Instant = Instant::from_millis(1_700_000_000_000);

fn member(lane: usize, n: usize) -> String {
    format!("p{lane}-{n:04}")
}

fn lane_of_member(m: &str) -> usize {
    m.as_bytes()
        .get(1)
        .map(|b| (b - b'0') as usize)
        .filter(|l| *l < 4)
        .unwrap_or_else(|| panic!("unexpected member {m:?}"))
}

async fn fill(q: &DynQueue, lane: usize, count: usize, score: Instant) {
    for n in 0..count {
        q.enqueue(&WorkflowId::from(&member(lane, n)), Priority::ALL[lane], score).await.expect("enqueue");
    }
}

/// Pop up to `n` members at `now`; the lane of each, in order (stops at the first `None`).
async fn pop_lanes(q: &DynQueue, now: Instant, n: usize) -> Vec<usize> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        match pop1(q, now).await {
            Some(m) => out.push(lane_of_member(&m)),
            None => break,
        }
    }
    out
}

/// One single pop: `pop_due(now, 1)`, which never returns more than one member.
async fn pop1(q: &DynQueue, now: Instant) -> Option<WorkflowId> {
    let mut got = q.pop_due(now, 1).await.expect("pop");
    assert!(got.len() <= 1, "pop_due(now, 1) returned {got:?}");
    got.pop()
}

/// What `max` single pops return, stopped by the first that finds nothing (the batch's
/// contract).
async fn single_pops(q: &DynQueue, now: Instant, max: usize) -> Vec<WorkflowId> {
    let mut out = Vec::new();
    while out.len() < max {
        match pop1(q, now).await {
            Some(m) => out.push(m),
            None => break,
        }
    }
    out
}

fn entry(id: &str, lane: usize, at: Instant) -> LaneEntry {
    LaneEntry { workflow_id: WorkflowId::from(id), priority: Priority::ALL[lane], claimable_at: at }
}

fn blocks(spec: &[(usize, usize)]) -> Vec<usize> {
    spec.iter().flat_map(|(lane, n)| std::iter::repeat_n(*lane, *n)).collect()
}

async fn depths(q: &DynQueue, now: Instant) -> [u64; 4] {
    q.stats(now).await.expect("stats").map(|s| s.depth)
}

/// An empty queue pops nothing and reports empty lanes.
pub async fn pop_on_empty_queue_is_none(q: &DynQueue) {
    assert_eq!(pop1(q, T0).await, None);
    assert_eq!(q.stats(T0).await.unwrap(), [LaneStats::default(); 4]);
}

/// Only members with `score <= now` are popped; a popped member is gone.
pub async fn pop_only_when_due(q: &DynQueue) {
    q.enqueue(&"wf-a".into(), Priority::P1, T0.plus(100)).await.unwrap();
    assert_eq!(pop1(q, T0).await, None, "not due yet");
    assert_eq!(pop1(q, T0.plus(99)).await, None, "not due yet");
    assert_eq!(pop1(q, T0.plus(100)).await.as_deref(), Some("wf-a"), "due at its score");
    assert_eq!(pop1(q, T0.plus(100)).await, None, "popped = removed");
}

/// Within a lane, members leave by score, ties by member bytes.
pub async fn lane_order_is_score_then_member(q: &DynQueue) {
    q.enqueue(&"b".into(), Priority::P2, T0.plus(2)).await.unwrap();
    q.enqueue(&"c".into(), Priority::P2, T0.plus(1)).await.unwrap();
    q.enqueue(&"a".into(), Priority::P2, T0.plus(1)).await.unwrap();
    let mut got = Vec::new();
    while let Some(m) = pop1(q, T0.plus(10)).await {
        got.push(m);
    }
    assert_eq!(got, ["a", "c", "b"]);
}

/// A less urgent request leaves a member in its more urgent lane, score untouched.
pub async fn promote_only_keeps_more_urgent_lane(q: &DynQueue) {
    q.enqueue(&"x".into(), Priority::P1, T0).await.unwrap();
    q.enqueue(&"x".into(), Priority::P3, T0.minus(50)).await.unwrap();
    q.enqueue(&"x".into(), Priority::P2, T0.minus(60)).await.unwrap();
    assert_eq!(depths(q, T0).await, [0, 1, 0, 0]);
    assert_eq!(pop1(q, T0.minus(1)).await, None, "score untouched by the ignored request");
    assert_eq!(pop1(q, T0).await.as_deref(), Some("x"));
    assert_eq!(depths(q, T0).await, [0, 0, 0, 0]);
}

/// A more urgent request removes the member from the other lane and sets its new score.
pub async fn promotion_moves_member_and_score(q: &DynQueue) {
    q.enqueue(&"x".into(), Priority::P3, T0).await.unwrap();
    q.enqueue(&"x".into(), Priority::P0, T0.plus(5)).await.unwrap();
    assert_eq!(depths(q, T0).await, [1, 0, 0, 0], "never in two lanes");
    assert_eq!(pop1(q, T0).await, None);
    assert_eq!(pop1(q, T0.plus(5)).await.as_deref(), Some("x"));
    assert_eq!(pop1(q, T0.plus(5)).await, None, "no copy left in P3");
}

/// Re-enqueue in the member's own lane overwrites its score, later or earlier.
pub async fn reenqueue_in_own_lane_overwrites_score(q: &DynQueue) {
    q.enqueue(&"x".into(), Priority::P2, T0).await.unwrap();
    q.enqueue(&"x".into(), Priority::P2, T0.plus(500)).await.unwrap();
    assert_eq!(depths(q, T0).await, [0, 0, 1, 0]);
    assert_eq!(pop1(q, T0).await, None, "later score replaced the earlier one");
    q.enqueue(&"x".into(), Priority::P2, T0.plus(200)).await.unwrap();
    assert_eq!(pop1(q, T0.plus(199)).await, None);
    assert_eq!(pop1(q, T0.plus(200)).await.as_deref(), Some("x"));
}

/// With all lanes full, each round is P0×8 → P1×6 → P2×4 → P3×2.
pub async fn weighted_rounds_are_8_6_4_2(q: &DynQueue) {
    for lane in 0..4 {
        fill(q, lane, 30, T0).await;
    }
    let round = blocks(&[(0, 8), (1, 6), (2, 4), (3, 2)]);
    for r in 0..3 {
        assert_eq!(pop_lanes(q, T0, 20).await, round, "round {r}");
    }
}

/// A lane with nothing due is skipped at once: with P0 empty the others keep 6:4:2.
pub async fn empty_lane_is_skipped(q: &DynQueue) {
    for lane in 1..4 {
        fill(q, lane, 30, T0).await;
    }
    // P0 holds only a delayed member: present but not due.
    q.enqueue(&"p0-late".into(), Priority::P0, T0.plus(1_000)).await.unwrap();
    let round = blocks(&[(1, 6), (2, 4), (3, 2)]);
    for r in 0..3 {
        assert_eq!(pop_lanes(q, T0, 12).await, round, "round {r}");
    }
}

/// A lane that runs dry mid-block forfeits the rest of it; the next round gives it a
/// full block again.
pub async fn partial_block_is_forfeited(q: &DynQueue) {
    fill(q, 0, 3, T0).await;
    for lane in 1..4 {
        fill(q, lane, 30, T0).await;
    }
    assert_eq!(pop_lanes(q, T0, 15).await, blocks(&[(0, 3), (1, 6), (2, 4), (3, 2)]));
    for n in 100..120 {
        q.enqueue(&WorkflowId::from(&member(0, n)), Priority::P0, T0).await.unwrap();
    }
    assert_eq!(pop_lanes(q, T0, 20).await, blocks(&[(0, 8), (1, 6), (2, 4), (3, 2)]));
}

/// A pop that finds nothing due arms the burst window: the next 8 pops serve P0 first,
/// then the rotation resumes on the lane after the one the empty pop started on (P1).
pub async fn burst_window_after_idle_pop(q: &DynQueue) {
    fill(q, 0, 12, T0.plus(1_000)).await;
    fill(q, 1, 12, T0.plus(1_000)).await;
    assert_eq!(pop1(q, T0).await, None, "only delayed members: arms the burst window");
    let t1 = T0.plus(1_000);
    assert_eq!(pop_lanes(q, t1, 30).await, blocks(&[(0, 8), (1, 6), (0, 4), (1, 6)]));
}

/// The burst window ends the first time P0 has nothing due, even with pops left in it;
/// P0 members arriving later wait for P0's turn in the rotation.
pub async fn burst_window_ends_early_when_p0_runs_dry(q: &DynQueue) {
    fill(q, 0, 2, T0.plus(10)).await;
    fill(q, 1, 20, T0.plus(10)).await;
    assert_eq!(pop1(q, T0).await, None, "arms the burst window");
    let t1 = T0.plus(10);
    assert_eq!(pop_lanes(q, t1, 3).await, [0, 0, 1], "two burst pops from P0, then P0 ran dry");
    for n in 100..105 {
        q.enqueue(&WorkflowId::from(&member(0, n)), Priority::P0, t1).await.unwrap();
    }
    assert_eq!(pop_lanes(q, t1, 10).await, blocks(&[(1, 5), (0, 5)]), "window over: P1 finishes its block first");
}

/// A pop that takes the last due member is not an empty pop and arms nothing.
pub async fn emptying_pop_does_not_arm_burst(q: &DynQueue) {
    q.enqueue(&WorkflowId::from(&member(1, 0)), Priority::P1, T0).await.unwrap();
    assert_eq!(pop_lanes(q, T0, 1).await, [1]);
    fill(q, 0, 10, T0).await;
    for n in 1..10 {
        q.enqueue(&WorkflowId::from(&member(1, n)), Priority::P1, T0).await.unwrap();
    }
    assert_eq!(pop_lanes(q, T0, 13).await, blocks(&[(1, 5), (0, 8)]), "P1's block continues; no burst");
}

/// Delayed members do not count as due: an empty pop arms the window although every lane
/// holds members, and the burst serves P0's due members only.
pub async fn delayed_members_do_not_block_burst(q: &DynQueue) {
    fill(q, 0, 3, T0.plus(50)).await;
    for n in 100..103 {
        q.enqueue(&WorkflowId::from(&member(0, n)), Priority::P0, T0.plus(5_000)).await.unwrap();
    }
    for lane in 1..4 {
        fill(q, lane, 10, T0.plus(50)).await;
    }
    assert_eq!(pop1(q, T0).await, None);
    assert_eq!(pop_lanes(q, T0.plus(50), 10).await, blocks(&[(0, 3), (1, 6), (2, 1)]));
}

/// Depth, ready, delayed and oldest wait per lane.
pub async fn stats_report_depth_ready_delayed_oldest_wait(q: &DynQueue) {
    q.enqueue(&"a".into(), Priority::P0, T0.minus(300)).await.unwrap();
    q.enqueue(&"b".into(), Priority::P0, T0.minus(100)).await.unwrap();
    q.enqueue(&"c".into(), Priority::P0, T0.plus(100)).await.unwrap();
    q.enqueue(&"d".into(), Priority::P2, T0.plus(1)).await.unwrap();
    q.enqueue(&"e".into(), Priority::P3, T0).await.unwrap();
    let s = q.stats(T0).await.unwrap();
    let ms = DurationMs::from_millis;
    assert_eq!(s[0], LaneStats { depth: 3, ready: 2, delayed: 1, oldest_wait_ms: ms(300), pops: 0 });
    assert_eq!(s[1], LaneStats::default());
    assert_eq!(s[2], LaneStats { depth: 1, ready: 0, delayed: 1, oldest_wait_ms: ms(0), pops: 0 });
    assert_eq!(s[3], LaneStats { depth: 1, ready: 1, delayed: 0, oldest_wait_ms: ms(0), pops: 0 });
    let later = q.stats(T0.plus(1_000)).await.unwrap();
    assert_eq!(later[0], LaneStats { depth: 3, ready: 3, delayed: 0, oldest_wait_ms: ms(1_300), pops: 0 });
    assert_eq!(pop1(q, T0).await.as_deref(), Some("a"));
    let after = q.stats(T0).await.unwrap();
    assert_eq!(after[0], LaneStats { depth: 2, ready: 1, delayed: 1, oldest_wait_ms: ms(100), pops: 1 });
}

/// Each lane counts the members popped from it: singles, batches and burst pops alike,
/// empty pops and enqueues count nothing, `stats` changes nothing, and the counts stay
/// once the lanes are empty.
pub async fn stats_count_pops_per_lane(q: &DynQueue) {
    let pops = |s: [LaneStats; 4]| s.map(|l| l.pops);
    assert_eq!(pops(q.stats(T0).await.unwrap()), [0; 4], "a fresh queue has popped nothing");
    fill(q, 0, 3, T0).await;
    fill(q, 1, 10, T0).await;
    fill(q, 2, 2, T0).await;
    q.enqueue(&WorkflowId::from(member(3, 0)), Priority::P3, T0.plus(1_000)).await.unwrap();
    // Re-enqueues and promotions move members; they pop nothing.
    q.enqueue(&WorkflowId::from(member(2, 0)), Priority::P2, T0).await.unwrap();
    q.enqueue(&WorkflowId::from(member(2, 1)), Priority::P1, T0).await.unwrap();
    assert_eq!(pops(q.stats(T0).await.unwrap()), [0; 4], "enqueues pop nothing");

    let mut want = [0u64; 4];
    let mut count = |ids: &[WorkflowId]| {
        for m in ids {
            // `p2-0001` was promoted into P1: count it where it was popped from.
            let lane = if m.as_str() == member(2, 1) { 1 } else { lane_of_member(m) };
            want[lane] += 1;
        }
        want
    };
    let first = q.pop_due(T0, 5).await.unwrap();
    assert_eq!(first.len(), 5);
    let after_first = count(&first);
    assert_eq!(after_first, [3, 2, 0, 0], "P0 runs dry after 3, then P1: {first:?}");
    assert_eq!(pops(q.stats(T0).await.unwrap()), after_first);
    assert_eq!(pops(q.stats(T0.plus(5_000)).await.unwrap()), after_first, "stats pop nothing, at any now");
    let single = pop1(q, T0).await.expect("one more");
    let after_single = count(std::slice::from_ref(&single));
    assert_eq!(pops(q.stats(T0).await.unwrap()), after_single, "a single pop counts");
    // Drain what is due (the batch ends on an empty pop, which counts nothing), then
    // pop empty twice more: that arms the burst window.
    let rest = q.pop_due(T0, POP_DUE_MAX).await.unwrap();
    let drained = count(&rest);
    assert_eq!(drained, [3, 11, 1, 0], "P3's delayed member stays: {rest:?}");
    assert!(q.pop_due(T0, 8).await.unwrap().is_empty());
    assert_eq!(pop1(q, T0).await, None);
    let s = q.stats(T0).await.unwrap();
    assert_eq!(pops(s), drained, "empty pops count nothing");
    assert_eq!(s.map(|l| l.depth), [0, 0, 0, 1], "counts stay when the lanes are empty");
    // Burst pops take P0 and count for P0.
    fill(q, 0, 2, T0.plus(1_000)).await;
    let burst = q.pop_due(T0.plus(1_000), 3).await.unwrap();
    assert_eq!(burst.len(), 3, "{burst:?}");
    let after_burst = count(&burst);
    assert_eq!(after_burst, [5, 11, 1, 1], "{burst:?}");
    assert_eq!(pops(q.stats(T0.plus(1_000)).await.unwrap()), after_burst);
}

/// Concurrent batch pops are counted exactly: the counters add up to what the callers
/// received, lane by lane.
pub async fn concurrent_pops_are_counted_exactly(q: &DynQueue) {
    for lane in 0..4 {
        fill(q, lane, 25 + 5 * lane, T0).await;
    }
    let tasks = (0..5).map(|t| async move {
        let mut got = Vec::new();
        for _ in 0..4 {
            got.extend(q.pop_due(T0, 2 + t).await.expect("pop"));
        }
        got
    });
    let mut want = [0u64; 4];
    for m in join_all(tasks).await.into_iter().flatten() {
        want[lane_of_member(&m)] += 1;
    }
    assert!(want.iter().sum::<u64>() > 0);
    let s = q.stats(T0).await.unwrap();
    assert_eq!(s.map(|l| l.pops), want, "{s:?}");
    for (lane, l) in s.iter().enumerate() {
        assert_eq!(l.pops + l.depth, 25 + 5 * lane as u64, "lane {lane}: popped + left = filled");
    }
}

/// Ids break the identifier rule ⇒ `InvalidInput`, nothing stored.
pub async fn rejects_invalid_ids(q: &DynQueue) {
    let long = "x".repeat(257);
    for bad in ["", "a\0b", "line\nbreak", long.as_str()] {
        let e = q.enqueue(&WorkflowId::from(bad), Priority::P1, T0).await.expect_err("invalid id accepted");
        assert!(matches!(e, Error::InvalidInput { .. }), "{bad:?}: {e:?}");
    }
    assert_eq!(depths(q, T0).await, [0; 4]);
    q.enqueue(&"$ne".into(), Priority::P1, T0).await.expect("ids are data: `$` is fine");
    q.enqueue(&"ünï:cödé/with spaces".into(), Priority::P1, T0).await.expect("unicode id");
    assert_eq!(depths(q, T0).await, [0, 2, 0, 0]);
}

/// Eight concurrent enqueuers: each member ends up exactly once, in the most urgent lane
/// any task asked for.
pub async fn concurrent_enqueues_are_promote_only(q: &DynQueue) {
    const TASKS: usize = 8;
    const IDS: usize = 64;
    // Task t asks for lane t % 4 for every id whose i % 8 <= t; so the most urgent request
    // for id i is P0 when i % 8 <= 4, else lane (i % 8) % 4.
    let expected_lane = |i: usize| if i % 8 <= 4 { 0 } else { (i % 8) % 4 };
    let tasks = (0..TASKS).map(|t| async move {
        for round in 0..2 {
            for i in 0..IDS {
                let i = (i + t * 7 + round * 13) % IDS;
                if i % 8 <= t {
                    q.enqueue(&WorkflowId::from(format!("c-{i:03}")), Priority::ALL[t % 4], T0).await.expect("enqueue");
                }
            }
        }
    });
    join_all(tasks).await;
    let mut want = [0u64; 4];
    for i in 0..IDS {
        want[expected_lane(i)] += 1;
    }
    assert_eq!(depths(q, T0).await, want, "each id once, in its most urgent lane");
    let mut seen = std::collections::BTreeSet::new();
    while let Some(m) = pop1(q, T0).await {
        assert!(seen.insert(m.clone()), "{m} popped twice");
    }
    assert_eq!(seen.len(), IDS);
}

/// `max` outside `1..=POP_DUE_MAX` is `InvalidInput` and pops nothing.
pub async fn pop_batch_refuses_bad_max(q: &DynQueue) {
    fill(q, 1, 3, T0).await;
    for bad in [0, POP_DUE_MAX + 1] {
        let e = q.pop_due(T0, bad).await.expect_err("bad max accepted");
        assert!(matches!(e, Error::InvalidInput { .. }), "max {bad}: {e:?}");
    }
    assert_eq!(depths(q, T0).await, [0, 3, 0, 0], "a refused pop removes nothing");
    assert_eq!(q.pop_due(T0, POP_DUE_MAX).await.unwrap().len(), 3, "the limit itself is fine");
}

/// A batch holds at most `max` members; fewer only when nothing else is due.
pub async fn pop_batch_returns_at_most_max(q: &DynQueue) {
    fill(q, 2, 10, T0).await;
    let mut seen = Vec::new();
    for want in [4, 4, 2] {
        let got = q.pop_due(T0, 4).await.unwrap();
        assert_eq!(got.len(), want, "{got:?}");
        seen.extend(got);
    }
    assert!(q.pop_due(T0, 4).await.unwrap().is_empty(), "drained");
    let want: Vec<WorkflowId> = (0..10).map(|n| WorkflowId::from(member(2, n))).collect();
    assert_eq!(seen, want, "score, then member order within the lane");
}

/// A batch takes only due members, from every lane; the delayed ones stay.
pub async fn pop_batch_returns_only_due(q: &DynQueue) {
    for lane in 0..4 {
        fill(q, lane, 3, T0.minus(lane as i64)).await;
        q.enqueue(&WorkflowId::from(&member(lane, 100)), Priority::ALL[lane], T0.plus(1)).await.unwrap();
    }
    let got = q.pop_due(T0, 100).await.unwrap();
    assert_eq!(got.len(), 12, "{got:?}");
    assert!(got.iter().all(|m| !m.as_str().ends_with("0100")), "a delayed member was popped: {got:?}");
    assert_eq!(depths(q, T0).await, [1; 4], "the delayed members stay");
    let later = q.pop_due(T0.plus(1), 100).await.unwrap();
    assert_eq!(later.len(), 4, "due at their score: {later:?}");
}

/// Nothing due: an empty vector, from an empty queue or one holding only delayed members.
pub async fn pop_batch_with_nothing_due_is_empty(q: &DynQueue) {
    assert_eq!(q.pop_due(T0, 8).await.unwrap(), Vec::<WorkflowId>::new());
    fill(q, 0, 2, T0.plus(10)).await;
    assert_eq!(q.pop_due(T0, 8).await.unwrap(), Vec::<WorkflowId>::new());
    assert_eq!(depths(q, T0).await, [2, 0, 0, 0]);
}

/// A batch is the same number of single pops: on two identically filled queues, batches of
/// several sizes (one cut short by an empty pop, which arms the burst window) return what
/// single pops return, in order, and leave the rotation and burst state the same (later
/// pops keep agreeing).
pub async fn pop_batch_equals_single_pops(batched: &DynQueue, single: &DynQueue) {
    for q in [batched, single] {
        fill(q, 0, 5, T0).await;
        fill(q, 1, 20, T0).await;
        fill(q, 2, 12, T0).await;
        fill(q, 3, 9, T0).await;
        for n in 100..110 {
            q.enqueue(&WorkflowId::from(&member(0, n)), Priority::P0, T0.plus(100)).await.unwrap();
        }
        for n in 100..105 {
            q.enqueue(&WorkflowId::from(&member(2, n)), Priority::P2, T0.plus(100)).await.unwrap();
        }
    }
    let t1 = T0.plus(100);
    // 46 due at T0: the last batch runs dry and arms the burst window; at t1 the burst
    // serves P0, then the rotation goes on.
    let plan: [(Instant, usize); 11] =
        [(T0, 1), (T0, 3), (T0, 7), (T0, 20), (T0, 5), (T0, 40), (t1, 4), (t1, 9), (t1, 2), (t1, 30), (t1, 8)];
    let mut seen = std::collections::BTreeSet::new();
    for (i, (now, max)) in plan.into_iter().enumerate() {
        let b = batched.pop_due(now, max).await.expect("batch pop");
        let s = single_pops(single, now, max).await;
        assert_eq!(b, s, "batch {i} (max {max})");
        for m in b {
            assert!(seen.insert(m.clone()), "{m} popped twice");
        }
    }
    assert_eq!(seen.len(), 61, "every member popped once");
    // Rotation and burst state agree: refill both and keep comparing.
    for q in [batched, single] {
        for lane in 0..4 {
            for n in 200..215 {
                q.enqueue(&WorkflowId::from(&member(lane, n)), Priority::ALL[lane], t1).await.unwrap();
            }
        }
    }
    for (i, max) in [6, 11, 1, 17, 30].into_iter().enumerate() {
        assert_eq!(batched.pop_due(t1, max).await.unwrap(), single_pops(single, t1, max).await, "refill batch {i}");
    }
}

/// Concurrent batch pops never hand out the same member twice, and together take all.
pub async fn concurrent_batch_pops_never_repeat_a_member(q: &DynQueue) {
    for lane in 0..4 {
        fill(q, lane, 50, T0).await;
    }
    let tasks = (0..6).map(|t| async move {
        let mut got = Vec::new();
        loop {
            let b = q.pop_due(T0, 3 + t).await.expect("pop");
            if b.is_empty() {
                return got;
            }
            got.extend(b);
        }
    });
    let mut seen = std::collections::BTreeSet::new();
    for m in join_all(tasks).await.into_iter().flatten() {
        assert!(seen.insert(m.clone()), "{m} popped twice");
    }
    assert_eq!(seen.len(), 200);
}

/// `enqueue_many` is the same as its entries' single enqueues in order: promote-only per
/// entry, a member named twice, scores overwritten in the own lane. Compared on two
/// identically empty queues by the lane depths and by draining both at each score.
pub async fn enqueue_many_equals_single_enqueues(batched: &DynQueue, single: &DynQueue) {
    let entries = vec![
        entry("a", 2, T0),
        entry("b", 1, T0.plus(5)),
        entry("a", 3, T0.minus(50)), // less urgent: ignored, score untouched
        entry("c", 3, T0.plus(2)),
        entry("c", 0, T0.plus(7)), // promoted: leaves P3, new score
        entry("d", 1, T0.plus(9)),
        entry("d", 1, T0.plus(3)), // own lane: score overwritten (earlier)
        entry("e", 0, T0),
        entry("f", 2, T0.plus(1)),
        entry("b", 1, T0.plus(8)), // own lane: score overwritten (later)
        entry("g", 3, T0.plus(7)),
    ];
    batched.enqueue_many(&entries).await.expect("enqueue_many");
    for LaneEntry { workflow_id, priority, claimable_at } in &entries {
        single.enqueue(workflow_id, *priority, *claimable_at).await.expect("enqueue");
    }
    assert_eq!(depths(batched, T0).await, [2, 2, 2, 1]);
    for t in [T0.minus(100), T0, T0.plus(1), T0.plus(3), T0.plus(5), T0.plus(7), T0.plus(8), T0.plus(9)] {
        assert_eq!(batched.stats(t).await.unwrap(), single.stats(t).await.unwrap(), "stats at {t:?}");
    }
    for t in 0..10 {
        let now = T0.plus(t);
        assert_eq!(
            batched.pop_due(now, POP_DUE_MAX).await.unwrap(),
            single.pop_due(now, POP_DUE_MAX).await.unwrap(),
            "due at {now:?}"
        );
    }
    assert_eq!(depths(batched, T0.plus(100)).await, [0; 4]);
}

/// `enqueue_many`: more than `ENQUEUE_MANY_MAX` entries, or one bad id, refuses the whole
/// batch and stores nothing; the limit itself and an empty batch are fine.
pub async fn enqueue_many_refuses_bounds(q: &DynQueue) {
    q.enqueue_many(&[]).await.expect("an empty batch");
    assert_eq!(depths(q, T0).await, [0; 4]);
    let over: Vec<LaneEntry> = (0..=ENQUEUE_MANY_MAX).map(|n| entry(&member(1, n), 1, T0)).collect();
    let e = q.enqueue_many(&over).await.expect_err("over the limit");
    assert!(matches!(e, Error::InvalidInput { .. }), "{e:?}");
    assert_eq!(depths(q, T0).await, [0; 4], "nothing stored");
    let bad = vec![entry("ok-1", 1, T0), entry("bad\nid", 1, T0), entry("ok-2", 1, T0)];
    let e = q.enqueue_many(&bad).await.expect_err("a bad id");
    assert!(matches!(e, Error::InvalidInput { .. }), "{e:?}");
    assert_eq!(depths(q, T0).await, [0; 4], "nothing stored, not even the good entries");
    q.enqueue_many(&over[..ENQUEUE_MANY_MAX]).await.expect("exactly the limit");
    assert_eq!(depths(q, T0).await, [0, ENQUEUE_MANY_MAX as u64, 0, 0]);
}

/// Expand to one `#[tokio::test]` per queue conformance case (see
/// [`conformance`](crate::conformance) for the factory and the fixture). The cases that
/// compare a batch call with single calls take two fixtures of the same adapter.
#[macro_export]
macro_rules! queue_conformance {
    ($factory:expr) => {
        $crate::__conformance_cases!(queue, QueueFixture, queue, $factory;
            pop_on_empty_queue_is_none,
            pop_only_when_due,
            lane_order_is_score_then_member,
            promote_only_keeps_more_urgent_lane,
            promotion_moves_member_and_score,
            reenqueue_in_own_lane_overwrites_score,
            weighted_rounds_are_8_6_4_2,
            empty_lane_is_skipped,
            partial_block_is_forfeited,
            burst_window_after_idle_pop,
            burst_window_ends_early_when_p0_runs_dry,
            emptying_pop_does_not_arm_burst,
            delayed_members_do_not_block_burst,
            stats_report_depth_ready_delayed_oldest_wait,
            stats_count_pops_per_lane,
            concurrent_pops_are_counted_exactly,
            rejects_invalid_ids,
            concurrent_enqueues_are_promote_only,
            pop_batch_refuses_bad_max,
            pop_batch_returns_at_most_max,
            pop_batch_returns_only_due,
            pop_batch_with_nothing_due_is_empty,
            concurrent_batch_pops_never_repeat_a_member,
            enqueue_many_refuses_bounds,
        );
        $crate::__conformance_cases!(@pairs queue, QueueFixture, queue, $factory;
            pop_batch_equals_single_pops,
            enqueue_many_equals_single_enqueues,
        );
    };
}
