//! The operator calls on the SQLite coordination beyond the shared suites: bounds, and two
//! openings of one file (two worker processes) seeing each other's limits and pops.

use crate::fresh;
use coord_local::{LocalConfig, LocalCoord, LocalPermitsConfig};
use kernel_core::domain::{Instant, Priority};
use kernel_core::ports::{
    PermitDecision, PermitLimits, PermitOwner, Permits, ReadyQueue, PERMIT_HOLDERS_MAX, PERMIT_RESOURCES_MAX,
};
use kernel_core::WorkflowId;
use std::sync::Arc;
use testkit::memory::ManualClock;

const T0: Instant = Instant::from_millis(1_700_000_000_000);

fn owner(n: usize) -> PermitOwner {
    PermitOwner { workflow_id: format!("wf-{n}").into(), step: "call".into(), claim_token: format!("tok-{n}").into() }
}

fn limits(max_concurrency: u32) -> PermitLimits {
    PermitLimits { max_concurrency, max_starts_per_second: 0 }
}

#[tokio::test]
async fn usage_and_resources_are_bounded() {
    let coord = LocalCoord::in_memory(LocalConfig::default()).await.expect("in memory");
    let clock = Arc::new(ManualClock::new(T0));
    let p = coord.permits(clock.clone(), LocalPermitsConfig::new(limits(0))).expect("permits");
    for i in 0..=PERMIT_HOLDERS_MAX {
        assert!(matches!(p.acquire("wide", &owner(i)).await.unwrap(), PermitDecision::Granted { .. }));
    }
    let u = p.usage("wide").await.unwrap();
    assert_eq!((u.holders.len(), u.truncated), (PERMIT_HOLDERS_MAX, true));
    assert_eq!(u.starts_in_window, PERMIT_HOLDERS_MAX as u64 + 1, "the manual clock stood still");
    p.release("wide", &owner(0)).await.unwrap();
    let u = p.usage("wide").await.unwrap();
    assert_eq!((u.holders.len(), u.truncated), (PERMIT_HOLDERS_MAX, false), "exactly the limit is not cut");

    let names: Vec<String> = (0..=PERMIT_RESOURCES_MAX).map(|i| format!("n-{i:05}")).collect();
    for n in &names {
        Permits::set_limits(&p, n, limits(1)).await.unwrap();
    }
    let listed = p.resources().await.unwrap();
    assert_eq!(listed[..], names[..PERMIT_RESOURCES_MAX], "the first names in byte order");
}

/// What one process sets, another's next acquire reads; what each pops, the shared
/// counters add up.
#[tokio::test]
async fn two_openings_share_limits_and_pop_counters() {
    let (a, dir) = fresh(LocalConfig::default()).await;
    let b = LocalCoord::open(dir.path().join("coord.db"), LocalConfig::default()).await.expect("second opening");
    let clock = Arc::new(ManualClock::new(T0));
    let config = LocalPermitsConfig::new(limits(5));
    let (pa, pb) = (a.permits(clock.clone(), config.clone()).unwrap(), b.permits(clock.clone(), config).unwrap());
    Permits::set_limits(&pa, "gpu", limits(1)).await.unwrap();
    assert!(matches!(pb.acquire("gpu", &owner(1)).await.unwrap(), PermitDecision::Granted { .. }));
    assert!(matches!(pb.acquire("gpu", &owner(2)).await.unwrap(), PermitDecision::Denied { .. }), "b read a's limit");
    let u = pa.usage("gpu").await.unwrap();
    assert_eq!((u.limits, u.overridden, u.holders.len()), (limits(1), true, 1), "{u:?}");
    assert_eq!(u.holders[0].owner, owner(1));
    assert_eq!(pb.resources().await.unwrap(), ["gpu"]);

    let (qa, qb) = (a.queue(), b.queue());
    for i in 0..10 {
        qa.enqueue(&WorkflowId::from(format!("m-{i}")), Priority::ALL[i % 2], T0).await.unwrap();
    }
    let (got_a, got_b) = (qa.pop_due(T0, 3).await.unwrap(), qb.pop_due(T0, 4).await.unwrap());
    assert_eq!(got_a.len() + got_b.len(), 7);
    let stats = qb.stats(T0).await.unwrap();
    assert_eq!(stats.iter().map(|l| l.pops).sum::<u64>(), 7, "{stats:?}");
    assert_eq!(stats.map(|l| l.pops + l.depth)[..2], [5, 5], "{stats:?}");
    qa.clear().await.unwrap();
    assert_eq!(qb.stats(T0).await.unwrap().map(|l| l.pops), [0; 4], "clear forgets the counters");
}
