//! Two checks of a task inbox beyond its conformance cases, for the database adapters:
//! one lifecycle read back in full ([`lifecycle`]) and decisions racing a close on
//! separate tasks ([`races`]). Ids `t-a`, `t-b`, `t-c` and `race-<n>`: run them on a fresh
//! inbox.

use kernel_core::domain::Instant;
use kernel_core::ports::*;
use kernel_core::Error;
use std::sync::Arc;

/// The time every record of these checks is written at.
pub const T0: Instant = Instant::from_millis(1_700_000_000_000);

/// An open task `id` decided by `assignee` or `roles`, due an hour after [`T0`].
pub fn task(id: &str, assignee: Option<&str>, roles: &[&str]) -> TaskRecord {
    TaskRecord {
        id: id.to_string(),
        workflow_id: "inv-7".into(),
        workflow_type: "invoice".to_string(),
        step: "approve".to_string(),
        level: 1,
        title: "Approve invoice 7 (12 400 €) «urgent»".to_string(),
        assignee: assignee.map(str::to_string),
        roles: roles.iter().map(|r| r.to_string()).collect(),
        evidence: vec![Evidence { label: "the invoice".to_string(), reference: "s3://docs/inv-7.pdf".to_string() }],
        token: format!("{id}-token-0123456789"),
        created_at: T0,
        due_at: Instant::from_millis(T0.as_millis() + 3_600_000),
        status: TaskStatus::Open,
        decision: None,
        closed_at: None,
    }
}

/// A decision by `actor` at `at` (ms), with a reason when `sensitive` is given.
pub fn decision(actor: &str, outcome: TaskOutcome, sensitive: Option<bool>, at: i64) -> TaskDecision {
    TaskDecision {
        outcome,
        actor: actor.to_string(),
        reason: sensitive.map(|s| TaskReason { sensitive: s, text: Some(format!("because {actor} said so")) }),
        decided_at: Instant::from_millis(at),
    }
}

fn ids(v: &[TaskRecord]) -> Vec<&str> {
    v.iter().map(|t| t.id.as_str()).collect()
}

/// Open, list by eligibility and page, decide with every refusal, close, both purges:
/// each write read back in full.
pub async fn lifecycle(inbox: &DynTaskInbox) {
    let alice = Actor::new("alice", ["finance"]);
    let bob = Actor::new("bob", ["legal", "ops"]);
    let (a, b, c, d) = (
        task("t-a", Some("alice"), &[]),
        task("t-b", None, &["finance", "audit"]),
        task("t-c", None, &["ops"]),
        task("t-d", Some("carol"), &["legal"]),
    );
    for t in [&d, &c, &b, &a] {
        assert_eq!(inbox.open(t).await.unwrap(), None, "{}", t.id);
    }
    let mut other = a.clone();
    other.token = "another-token-0123456789".to_string();
    other.title = "changed".to_string();
    assert_eq!(inbox.open(&other).await.unwrap(), Some(a.clone()), "the stored record, unchanged");
    assert_eq!(inbox.get("t-a").await.unwrap(), Some(a.clone()));
    assert_eq!(inbox.get("t-none").await.unwrap(), None);

    // Eligibility: the assignee, or one shared role; byte order, `after`, `limit`.
    assert_eq!(ids(&inbox.list_open(&alice, None, 10).await.unwrap()), ["t-a", "t-b"]);
    assert_eq!(ids(&inbox.list_open(&bob, None, 10).await.unwrap()), ["t-c", "t-d"]);
    assert_eq!(ids(&inbox.list_open(&bob, Some("t-c"), 10).await.unwrap()), ["t-d"]);
    assert_eq!(ids(&inbox.list_open(&bob, None, 1).await.unwrap()), ["t-c"]);
    assert!(inbox.list_open(&Actor::new("dave", ["sales"]), None, 10).await.unwrap().is_empty());
    assert!(inbox.list_open(&Actor::new("dave", Vec::<String>::new()), None, 10).await.unwrap().is_empty());
    assert_eq!(inbox.list_open(&alice, None, 10).await.unwrap()[1], b, "listed in full");

    // Refusals change nothing.
    let by_alice = decision("alice", TaskOutcome::Approve, Some(true), T0.as_millis() + 10);
    let r = inbox.decide("t-none", &a.token, &alice, &by_alice).await.unwrap();
    assert_eq!(r, TaskDecideOutcome::NotFound);
    assert_eq!(inbox.decide("t-a", &b.token, &alice, &by_alice).await.unwrap(), TaskDecideOutcome::WrongToken);
    assert_eq!(inbox.decide("t-a", &a.token, &bob, &by_alice).await.unwrap(), TaskDecideOutcome::ActorMismatch);
    let by_bob = decision("bob", TaskOutcome::Reject, None, T0.as_millis() + 10);
    assert_eq!(inbox.decide("t-a", &a.token, &bob, &by_bob).await.unwrap(), TaskDecideOutcome::NotEligible);
    assert_eq!(inbox.get("t-a").await.unwrap(), Some(a.clone()), "nothing written");

    // Decided: stored with its status; a second decision gets the first.
    assert_eq!(inbox.decide("t-a", &a.token, &alice, &by_alice).await.unwrap(), TaskDecideOutcome::Decided);
    let decided_a = TaskRecord { status: TaskStatus::Decided, decision: Some(by_alice.clone()), ..a.clone() };
    assert_eq!(inbox.get("t-a").await.unwrap(), Some(decided_a.clone()));
    let again = decision("alice", TaskOutcome::Reject, None, T0.as_millis() + 20);
    let r = inbox.decide("t-a", &a.token, &alice, &again).await.unwrap();
    assert_eq!(r, TaskDecideOutcome::AlreadyDecided(by_alice.redacted()));
    assert_eq!(ids(&inbox.list_open(&alice, None, 10).await.unwrap()), ["t-b"], "no longer open");
    let by_bob_c = decision("bob", TaskOutcome::Escalate, Some(false), T0.as_millis() + 30);
    assert_eq!(inbox.decide("t-c", &c.token, &bob, &by_bob_c).await.unwrap(), TaskDecideOutcome::Decided);

    // Close: returns the decision carried; once.
    let t1 = Instant::from_millis(T0.as_millis() + 100);
    assert_eq!(inbox.close("t-a", t1).await.unwrap(), TaskCloseOutcome::Closed(Some(by_alice.clone())));
    assert_eq!(inbox.close("t-a", t1).await.unwrap(), TaskCloseOutcome::AlreadyClosed);
    assert_eq!(inbox.close("t-b", t1).await.unwrap(), TaskCloseOutcome::Closed(None));
    assert_eq!(inbox.close("t-none", t1).await.unwrap(), TaskCloseOutcome::NotFound);
    let closed_a = TaskRecord { status: TaskStatus::Closed, closed_at: Some(t1), ..decided_a };
    assert_eq!(inbox.get("t-a").await.unwrap(), Some(closed_a.clone()));
    let r = inbox.decide("t-b", &b.token, &alice, &by_alice).await.unwrap();
    assert_eq!(r, TaskDecideOutcome::Closed);

    // Sensitive reasons: only the text of sensitive ones decided before `before`.
    assert_eq!(inbox.purge_sensitive_reasons(Instant::from_millis(T0.as_millis() + 10), 10).await.unwrap(), 0);
    assert_eq!(inbox.purge_sensitive_reasons(t1, 10).await.unwrap(), 1);
    assert_eq!(inbox.purge_sensitive_reasons(t1, 10).await.unwrap(), 0, "idempotent");
    let purged = TaskDecision { reason: Some(TaskReason { sensitive: true, text: None }), ..by_alice };
    let closed_a = TaskRecord { decision: Some(purged), ..closed_a };
    assert_eq!(inbox.get("t-a").await.unwrap(), Some(closed_a));
    let kept = inbox.get("t-c").await.unwrap().unwrap();
    assert_eq!(kept.decision, Some(by_bob_c), "a reason not sensitive stays");

    // Closed rows only, before `before`, at most `limit`.
    assert_eq!(inbox.purge_closed(t1, 10).await.unwrap(), 0, "closed_at is not before t1");
    let t2 = Instant::from_millis(t1.as_millis() + 1);
    assert_eq!(inbox.purge_closed(t2, 1).await.unwrap(), 1);
    assert_eq!(inbox.purge_closed(t2, 10).await.unwrap(), 1);
    assert_eq!(inbox.purge_closed(t2, 10).await.unwrap(), 0);
    assert_eq!(inbox.get("t-a").await.unwrap(), None);
    assert_eq!(inbox.get("t-b").await.unwrap(), None);
    assert!(inbox.get("t-c").await.unwrap().is_some(), "decided, not closed: kept");
    assert!(inbox.get("t-d").await.unwrap().is_some(), "open: kept");

    // Checked before I/O.
    assert!(matches!(inbox.purge_closed(t2, 0).await, Err(Error::InvalidInput { .. })));
    assert!(matches!(inbox.list_open(&alice, None, 0).await, Err(Error::InvalidInput { .. })));
    let mut bad = task("t-e", None, &[]);
    assert!(matches!(inbox.open(&bad).await, Err(Error::InvalidInput { .. })), "nobody could decide");
    bad.roles = vec!["x".to_string()];
    bad.status = TaskStatus::Decided;
    assert!(matches!(inbox.open(&bad).await, Err(Error::InvalidInput { .. })));
    assert_eq!(inbox.get("t-e").await.unwrap(), None);
}

/// Concurrent decisions of eligible actors on each of several open tasks, and a close
/// racing them: exactly one decision per task is stored, and the close returns it if it
/// was stored first.
pub async fn races(inbox: Arc<DynTaskInbox>) {
    for n in 0..8 {
        let t = task(&format!("race-{n}"), None, &["finance"]);
        inbox.open(&t).await.unwrap();
        let calls: Vec<_> = (0..4)
            .map(|i| {
                let (inbox, t) = (inbox.clone(), t.clone());
                tokio::spawn(async move {
                    let actor = Actor::new(format!("p{i}"), ["finance"]);
                    let d = decision(&actor.id, TaskOutcome::Approve, Some(true), T0.as_millis() + i);
                    (d.clone(), inbox.decide(&t.id, &t.token, &actor, &d).await.unwrap())
                })
            })
            .collect();
        let closer = {
            let (inbox, id) = (inbox.clone(), t.id.clone());
            tokio::spawn(async move { inbox.close(&id, T0).await.unwrap() })
        };
        let mut won = Vec::new();
        for c in calls {
            let (d, r) = c.await.unwrap();
            match r {
                TaskDecideOutcome::Decided => won.push(d),
                TaskDecideOutcome::AlreadyDecided(_) | TaskDecideOutcome::Closed => {}
                other => panic!("{other:?}"),
            }
        }
        assert!(won.len() <= 1, "{won:?}");
        let closed = closer.await.unwrap();
        let stored = inbox.get(&t.id).await.unwrap().unwrap();
        assert_eq!(stored.status, TaskStatus::Closed);
        assert_eq!(stored.decision, won.first().cloned());
        assert_eq!(closed, TaskCloseOutcome::Closed(stored.decision), "the close got what was stored");
    }
}
