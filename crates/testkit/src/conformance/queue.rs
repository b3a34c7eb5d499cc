//! Conformance cases for the ready queue port (K-13).
//!
//! Every case takes a **fresh, empty** queue built with the default [`LaneWeights`]
//! (8:6:4:2, burst 8) and pins the exact pop order, so two adapters that pass cannot differ
//! observably. Lane membership is read from member names (`p<lane>-<n>`), never from the
//! adapter's internals.
//!
//! ```ignore
//! testkit::queue_conformance!(|_case: &'static str| async {
//!     Some(Box::new(testkit::memory::InMemoryQueue::default()))
//! });
//! ```
//!
//! [`LaneWeights`]: crate::memory::LaneWeights

use futures::future::join_all;
use kernel_core::model::{Millis, Priority};
use kernel_core::ports::{DynQueue, LaneStats};
use kernel_core::Error;
use kernel_core::WorkflowId;

/// Base time of every case (ms).
pub const T0: Millis = 1_700_000_000_000;

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

async fn fill(q: &DynQueue, lane: usize, count: usize, score: Millis) {
    for n in 0..count {
        q.enqueue(&WorkflowId::from(&member(lane, n)), Priority::ALL[lane], score).await.expect("enqueue");
    }
}

/// Pop up to `n` members at `now`; the lane of each, in order (stops at the first `None`).
async fn pop_lanes(q: &DynQueue, now: Millis, n: usize) -> Vec<usize> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        match q.pop_due(now).await.expect("pop") {
            Some(m) => out.push(lane_of_member(&m)),
            None => break,
        }
    }
    out
}

fn blocks(spec: &[(usize, usize)]) -> Vec<usize> {
    spec.iter().flat_map(|(lane, n)| std::iter::repeat_n(*lane, *n)).collect()
}

async fn depths(q: &DynQueue, now: Millis) -> [u64; 4] {
    q.stats(now).await.expect("stats").map(|s| s.depth)
}

/// An empty queue pops nothing and reports empty lanes.
pub async fn pop_on_empty_queue_is_none(q: &DynQueue) {
    assert_eq!(q.pop_due(T0).await.unwrap(), None);
    assert_eq!(q.stats(T0).await.unwrap(), [LaneStats::default(); 4]);
}

/// Only members with `score <= now` are popped; a popped member is gone.
pub async fn pop_only_when_due(q: &DynQueue) {
    q.enqueue(&"wf-a".into(), Priority::P1, T0 + 100).await.unwrap();
    assert_eq!(q.pop_due(T0).await.unwrap(), None, "not due yet");
    assert_eq!(q.pop_due(T0 + 99).await.unwrap(), None, "not due yet");
    assert_eq!(q.pop_due(T0 + 100).await.unwrap().as_deref(), Some("wf-a"), "due at its score");
    assert_eq!(q.pop_due(T0 + 100).await.unwrap(), None, "popped = removed");
}

/// Within a lane, members leave by score, ties by member bytes.
pub async fn lane_order_is_score_then_member(q: &DynQueue) {
    q.enqueue(&"b".into(), Priority::P2, T0 + 2).await.unwrap();
    q.enqueue(&"c".into(), Priority::P2, T0 + 1).await.unwrap();
    q.enqueue(&"a".into(), Priority::P2, T0 + 1).await.unwrap();
    let mut got = Vec::new();
    while let Some(m) = q.pop_due(T0 + 10).await.unwrap() {
        got.push(m);
    }
    assert_eq!(got, ["a", "c", "b"]);
}

/// A less urgent request leaves a member in its more urgent lane, score untouched.
pub async fn promote_only_keeps_more_urgent_lane(q: &DynQueue) {
    q.enqueue(&"x".into(), Priority::P1, T0).await.unwrap();
    q.enqueue(&"x".into(), Priority::P3, T0 - 50).await.unwrap();
    q.enqueue(&"x".into(), Priority::P2, T0 - 60).await.unwrap();
    assert_eq!(depths(q, T0).await, [0, 1, 0, 0]);
    assert_eq!(q.pop_due(T0 - 1).await.unwrap(), None, "score untouched by the ignored request");
    assert_eq!(q.pop_due(T0).await.unwrap().as_deref(), Some("x"));
    assert_eq!(depths(q, T0).await, [0, 0, 0, 0]);
}

/// A more urgent request removes the member from the other lane and sets its new score.
pub async fn promotion_moves_member_and_score(q: &DynQueue) {
    q.enqueue(&"x".into(), Priority::P3, T0).await.unwrap();
    q.enqueue(&"x".into(), Priority::P0, T0 + 5).await.unwrap();
    assert_eq!(depths(q, T0).await, [1, 0, 0, 0], "never in two lanes");
    assert_eq!(q.pop_due(T0).await.unwrap(), None);
    assert_eq!(q.pop_due(T0 + 5).await.unwrap().as_deref(), Some("x"));
    assert_eq!(q.pop_due(T0 + 5).await.unwrap(), None, "no copy left in P3");
}

/// Re-enqueue in the member's own lane overwrites its score, later or earlier.
pub async fn reenqueue_in_own_lane_overwrites_score(q: &DynQueue) {
    q.enqueue(&"x".into(), Priority::P2, T0).await.unwrap();
    q.enqueue(&"x".into(), Priority::P2, T0 + 500).await.unwrap();
    assert_eq!(depths(q, T0).await, [0, 0, 1, 0]);
    assert_eq!(q.pop_due(T0).await.unwrap(), None, "later score replaced the earlier one");
    q.enqueue(&"x".into(), Priority::P2, T0 + 200).await.unwrap();
    assert_eq!(q.pop_due(T0 + 199).await.unwrap(), None);
    assert_eq!(q.pop_due(T0 + 200).await.unwrap().as_deref(), Some("x"));
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
    q.enqueue(&"p0-late".into(), Priority::P0, T0 + 1_000).await.unwrap();
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
    fill(q, 0, 12, T0 + 1_000).await;
    fill(q, 1, 12, T0 + 1_000).await;
    assert_eq!(q.pop_due(T0).await.unwrap(), None, "only delayed members: arms the burst window");
    let t1 = T0 + 1_000;
    assert_eq!(pop_lanes(q, t1, 30).await, blocks(&[(0, 8), (1, 6), (0, 4), (1, 6)]));
}

/// The burst window ends the first time P0 has nothing due, even with pops left in it;
/// P0 members arriving later wait for P0's turn in the rotation.
pub async fn burst_window_ends_early_when_p0_runs_dry(q: &DynQueue) {
    fill(q, 0, 2, T0 + 10).await;
    fill(q, 1, 20, T0 + 10).await;
    assert_eq!(q.pop_due(T0).await.unwrap(), None, "arms the burst window");
    let t1 = T0 + 10;
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
    fill(q, 0, 3, T0 + 50).await;
    for n in 100..103 {
        q.enqueue(&WorkflowId::from(&member(0, n)), Priority::P0, T0 + 5_000).await.unwrap();
    }
    for lane in 1..4 {
        fill(q, lane, 10, T0 + 50).await;
    }
    assert_eq!(q.pop_due(T0).await.unwrap(), None);
    assert_eq!(pop_lanes(q, T0 + 50, 10).await, blocks(&[(0, 3), (1, 6), (2, 1)]));
}

/// Depth, ready, delayed and oldest wait per lane.
pub async fn stats_report_depth_ready_delayed_oldest_wait(q: &DynQueue) {
    q.enqueue(&"a".into(), Priority::P0, T0 - 300).await.unwrap();
    q.enqueue(&"b".into(), Priority::P0, T0 - 100).await.unwrap();
    q.enqueue(&"c".into(), Priority::P0, T0 + 100).await.unwrap();
    q.enqueue(&"d".into(), Priority::P2, T0 + 1).await.unwrap();
    q.enqueue(&"e".into(), Priority::P3, T0).await.unwrap();
    let s = q.stats(T0).await.unwrap();
    assert_eq!(s[0], LaneStats { depth: 3, ready: 2, delayed: 1, oldest_wait_ms: 300 });
    assert_eq!(s[1], LaneStats::default());
    assert_eq!(s[2], LaneStats { depth: 1, ready: 0, delayed: 1, oldest_wait_ms: 0 });
    assert_eq!(s[3], LaneStats { depth: 1, ready: 1, delayed: 0, oldest_wait_ms: 0 });
    let later = q.stats(T0 + 1_000).await.unwrap();
    assert_eq!(later[0], LaneStats { depth: 3, ready: 3, delayed: 0, oldest_wait_ms: 1_300 });
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
    while let Some(m) = q.pop_due(T0).await.unwrap() {
        assert!(seen.insert(m.clone()), "{m} popped twice");
    }
    assert_eq!(seen.len(), IDS);
}

/// Expand to one `#[tokio::test]` per queue conformance case.
///
/// `$factory` is called with the case name and returns a future of `Option<Q>`, where `Q`
/// dereferences to something usable as `&DynQueue` (a `Box<InMemoryQueue>`, an
/// `Arc<DynQueue>`, an adapter fixture that also cleans up). `None` skips the case (the
/// factory prints why).
#[macro_export]
macro_rules! queue_conformance {
    ($factory:expr) => {
        $crate::queue_conformance!(@cases $factory;
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
            rejects_invalid_ids,
            concurrent_enqueues_are_promote_only
        );
    };
    (@cases $factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[::tokio::test]
            async fn $case() {
                let factory = $factory;
                let Some(fixture) = factory(stringify!($case)).await else { return };
                let queue: &::kernel_core::ports::DynQueue = &*fixture;
                $crate::conformance::queue::$case(queue).await;
            }
        )*
    };
}
