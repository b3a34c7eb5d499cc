//! Lists page through the projection (K-15) past its query cap: every row once, and a
//! next page whenever one follows.

use kernel_core::{Instant, WorkflowStatus};
use observer::{InMemoryObservationRepository, ObservationRepository, Snapshot};
use ops::{ListFilter, Ops, OpsParts, LIST_LIMIT_MAX};
use std::collections::BTreeMap;
use std::sync::Arc;
use testkit::harness::World;

fn snapshot(i: usize) -> Snapshot {
    Snapshot {
        biz_key: format!("gate-{i:05}"),
        workflow_id: format!("wf-gate-{i:05}").into(),
        workflow_type: "gate".into(),
        workflow_run: 0,
        revision: 3,
        status: WorkflowStatus::Waiting,
        last_kind: kernel_core::transition::TransitionKind::SuspendClaim,
        step_name: Some("hold".into()),
        attempt: 0,
        error_class: None,
        // Ties on purpose: ten rows share each millisecond.
        updated_at: Instant::from_millis(1_700_000_000_000 + (i / 10) as i64),
        finished_at: None,
        worker_id: None,
        steps: BTreeMap::new(),
        wait_signal: Some("go".into()),
    }
}

#[tokio::test]
async fn a_list_past_the_projection_cap_pages_every_row_exactly_once() {
    let world = World::new(1);
    let repo = Arc::new(InMemoryObservationRepository::new());
    for i in 0..1_005 {
        assert!(repo.put_snapshot(&snapshot(i)).await.unwrap());
    }
    let ops = Ops::from_parts(OpsParts {
        ports: world.ports(),
        repo: repo.clone(),
        definitions: vec![],
        dispatch: None,
        schema: "memory".into(),
    })
    .unwrap();
    for limit in [LIST_LIMIT_MAX, 7, 1] {
        let mut filter = ListFilter { workflow_type: Some("gate".into()), limit, ..Default::default() };
        let mut seen = vec![];
        let mut pages = 0;
        loop {
            let page = ops.list(&filter).await.unwrap();
            assert!(page.items.len() <= limit);
            pages += 1;
            seen.extend(page.items.iter().map(|s| s.biz_key.clone()));
            match page.next {
                Some(c) => {
                    assert_eq!(page.items.len(), limit, "a next page only after a full one");
                    filter.cursor = Some(c);
                }
                None => break,
            }
            assert!(pages <= 1_006, "paging must end");
        }
        let mut unique = seen.clone();
        unique.sort();
        unique.dedup();
        assert_eq!((seen.len(), unique.len()), (1_005, 1_005), "limit {limit}");
    }
    // The cap itself: a page above it is bad input, not a silent cut.
    let r = ops.list(&ListFilter { limit: LIST_LIMIT_MAX + 1, ..Default::default() }).await;
    assert!(matches!(r, Err(ops::OpsError::BadInput(_))), "{r:?}");
    ops.close().await;
}
