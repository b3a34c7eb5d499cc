//! The task-inbox conformance suite against the in-memory adapter, directly and through
//! `Arc<dyn …>` (the way a deployment holds it), and its `run` entry.

mod direct {
    use testkit::memory::MemoryTaskInbox;
    testkit::task_inbox_conformance!(|| async { Some(MemoryTaskInbox::new()) });
}

mod through_arc_dyn {
    use kernel_core::ports::DynTaskInbox;
    use std::sync::Arc;
    use testkit::memory::MemoryTaskInbox;
    testkit::task_inbox_conformance!(|| async { Some(Arc::new(MemoryTaskInbox::new()) as Arc<DynTaskInbox>) });
}

mod shared {
    //! Every case on one inbox, through `run`: the cases' ids, roles and purge times keep
    //! them apart. `all()` reads the store independently of the port.
    use kernel_core::ports::{TaskInbox, TaskStatus};
    use testkit::conformance::task_inbox::{run, task};
    use testkit::memory::MemoryTaskInbox;

    #[tokio::test]
    async fn every_case_on_one_shared_inbox() {
        let inbox = MemoryTaskInbox::new();
        run(|| {
            let inbox = inbox.clone();
            async move { Some(inbox) }
        })
        .await;
        let all = inbox.all();
        assert!(all.len() > 50, "the cases wrote into the one inbox: {}", all.len());
        assert!(all.windows(2).all(|w| w[0].id < w[1].id), "ordered by id");
    }

    #[tokio::test]
    async fn refused_opens_write_nothing() {
        let inbox = MemoryTaskInbox::new();
        testkit::conformance::task_inbox::k2_0_bad_task_is_refused(&inbox).await;
        let ids: Vec<String> = inbox.all().into_iter().map(|t| t.id).collect();
        let long_id = "i".repeat(kernel_core::validate::IDENTIFIER_BYTES_MAX);
        assert_eq!(ids, ["bt-assignee", "bt-x", long_id.as_str()], "only the accepted records");
        let inbox = MemoryTaskInbox::new();
        inbox.open(&task("x-1")).await.unwrap();
        testkit::conformance::task_inbox::k2_0_bad_calls_are_refused(&inbox).await;
        let all = inbox.all();
        let ids: Vec<&str> = all.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids, ["bc-closed", "bc-decided", "bc-open", "x-1"], "nothing but the case's own records");
        assert_eq!(all[3], task("x-1"), "an unrelated record is untouched");
        assert_eq!(all[3].status, TaskStatus::Open);
    }
}

/// The database adapters' two extra checks hold on the in-memory inbox too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_extra_checks_hold_in_memory() {
    use testkit::conformance::task_inbox_extra::{lifecycle, races};
    lifecycle(&testkit::memory::MemoryTaskInbox::new()).await;
    races(std::sync::Arc::new(testkit::memory::MemoryTaskInbox::new())).await;
}
