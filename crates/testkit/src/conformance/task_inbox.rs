//! Conformance cases for the [`TaskInbox`] port (human tasks, K-17.5).
//!
//! Same shape as the [dead-letter suite](super::dead_letter): `pub async fn case(inbox:
//! &DynTaskInbox)` on an empty inbox, and
//! [`task_inbox_conformance!`](crate::task_inbox_conformance) expanding to one
//! `#[tokio::test]` per case from a factory `|| async { Option<impl TaskInboxFixture> }`;
//! [`run`] runs every case in turn from the same factory. Every write is checked by reading
//! the record back and comparing it with the expected record in full, every refusal by
//! reading the record back unchanged.
//!
//! Each case uses ids of its own prefix, and the purge cases use times before [`T0`] that
//! no other case writes, so the cases still hold when a fixture's namespace is shared.

use super::store::assert_invalid_field;
use crate::memory::MemoryTaskInbox;
use crate::time::TestTime;
use kernel_core::domain::Instant;
use kernel_core::ports::*;
use std::future::Future;
use std::sync::Arc;

/// A task inbox under test plus whatever must be cleaned up after the case.
pub trait TaskInboxFixture: Send + Sync + 'static {
    /// The port under test.
    fn task_inbox(&self) -> &DynTaskInbox;
    /// Drop the fixture's namespace; the default does nothing.
    fn teardown(self) -> futures::future::BoxFuture<'static, ()>
    where
        Self: Sized,
    {
        Box::pin(async {})
    }
}

impl TaskInboxFixture for MemoryTaskInbox {
    fn task_inbox(&self) -> &DynTaskInbox {
        self
    }
}

impl TaskInboxFixture for Arc<DynTaskInbox> {
    fn task_inbox(&self) -> &DynTaskInbox {
        &**self
    }
}

/// The opening time of every fixture task.
pub const T0: Instant = super::store::T0;
/// The role every fixture task can be decided by.
pub const ROLE: &str = "finance";

/// The token of fixture task `id`: at least [`TASK_TOKEN_BYTES_MIN`] bytes, distinct per id.
pub fn token(id: &str) -> String {
    // FNV-1a of the id: stable, short whatever the id's length.
    let h = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!("tok-{h:016x}-7f3a9c1e")
}

/// An open task `id` of step `approve` of `wf-1`, decidable by role [`ROLE`], with two
/// pieces of evidence and a unicode title, due an hour after [`T0`].
pub fn task(id: &str) -> TaskRecord {
    TaskRecord {
        id: id.to_string(),
        workflow_id: "wf-1".into(),
        workflow_type: "invoice".to_string(),
        step: "approve".to_string(),
        level: 0,
        title: "Approve invoice 7 — 12 400 € «urgent» ✓".to_string(),
        assignee: None,
        roles: vec![ROLE.to_string()],
        evidence: vec![
            Evidence { label: "Invoice PDF".to_string(), reference: "s3://bucket/inv-7.pdf".to_string() },
            Evidence { label: "Bestellung für Müller".to_string(), reference: "output:fetch".to_string() },
        ],
        token: token(id),
        created_at: T0,
        due_at: T0.plus(3_600_000),
        status: TaskStatus::Open,
        decision: None,
        closed_at: None,
    }
}

/// [`task`] assigned to `assignee`, with `roles` instead of [`ROLE`].
pub fn task_for(id: &str, assignee: Option<&str>, roles: &[&str]) -> TaskRecord {
    TaskRecord {
        assignee: assignee.map(str::to_string),
        roles: roles.iter().map(|r| r.to_string()).collect(),
        ..task(id)
    }
}

/// An actor holding [`ROLE`].
pub fn member(id: &str) -> Actor {
    Actor::new(id, [ROLE])
}

/// A decision by `actor` with a non-sensitive reason.
pub fn decision(actor: &str, outcome: TaskOutcome, at: Instant) -> TaskDecision {
    TaskDecision {
        outcome,
        actor: actor.to_string(),
        reason: Some(TaskReason { sensitive: false, text: Some(format!("decided by {actor}")) }),
        decided_at: at,
    }
}

/// A decision by `actor` with a sensitive reason `text`.
pub fn sensitive(actor: &str, outcome: TaskOutcome, at: Instant, text: &str) -> TaskDecision {
    TaskDecision {
        reason: Some(TaskReason { sensitive: true, text: Some(text.to_string()) }),
        ..decision(actor, outcome, at)
    }
}

async fn open_new(inbox: &DynTaskInbox, t: TaskRecord) -> TaskRecord {
    assert_eq!(inbox.open(&t).await.expect("open"), None, "inserted: {}", t.id);
    t
}

/// Open `t` and decide it with `d` by an actor of [`ROLE`] named as `d` says; the record
/// as it now reads.
async fn open_decided(inbox: &DynTaskInbox, t: TaskRecord, d: &TaskDecision) -> TaskRecord {
    let t = open_new(inbox, t).await;
    assert_eq!(inbox.decide(&t.id, &t.token, &member(&d.actor), d).await.unwrap(), TaskDecideOutcome::Decided);
    TaskRecord { status: TaskStatus::Decided, decision: Some(d.clone()), ..t }
}

/// Open `t`, optionally decide it with `d`, close it at `at`; the record as it now reads.
async fn open_closed(inbox: &DynTaskInbox, t: TaskRecord, d: Option<&TaskDecision>, at: Instant) -> TaskRecord {
    let t = match d {
        Some(d) => open_decided(inbox, t, d).await,
        None => open_new(inbox, t).await,
    };
    assert_eq!(inbox.close(&t.id, at).await.unwrap(), TaskCloseOutcome::Closed(t.decision.clone()));
    TaskRecord { status: TaskStatus::Closed, closed_at: Some(at), ..t }
}

async fn assert_stored(inbox: &DynTaskInbox, expected: &TaskRecord, why: &str) {
    assert_eq!(inbox.get(&expected.id).await.unwrap().as_ref(), Some(expected), "{}: {why}", expected.id);
}

fn ids(v: Vec<TaskRecord>) -> Vec<String> {
    v.into_iter().map(|t| t.id).collect()
}

async fn open_ids(inbox: &DynTaskInbox, actor: &Actor, after: Option<&str>, limit: usize) -> Vec<String> {
    ids(inbox.list_open(actor, after, limit).await.expect("list_open"))
}

/// `open` inserts once and reads back whole; opening the same id again, with other fields
/// and another token, returns the stored record and changes nothing, whether the record is
/// open, decided or closed.
pub async fn open_inserts_once(inbox: &DynTaskInbox) {
    let t = TaskRecord {
        level: u32::MAX,
        assignee: Some("ålice".to_string()),
        roles: vec!["finance".to_string(), "audit:eu".to_string()],
        due_at: T0.plus(86_400_000),
        ..task("oi-1|approve|h0")
    };
    let t = open_new(inbox, t).await;
    assert_stored(inbox, &t, "round trip").await;
    let other = TaskRecord {
        workflow_id: "wf-2".into(),
        title: "another title".to_string(),
        assignee: None,
        roles: vec!["sales".to_string()],
        evidence: vec![],
        token: "another-token-0123456789".to_string(),
        created_at: T0.plus(5),
        due_at: T0.plus(10),
        ..t.clone()
    };
    assert_eq!(inbox.open(&other).await.unwrap(), Some(t.clone()), "the stored record");
    assert_stored(inbox, &t, "unchanged by the second open").await;
    let d = decision("bob", TaskOutcome::Reject, T0.plus(7));
    assert_eq!(
        inbox.decide(&t.id, &other.token, &member("bob"), &d).await.unwrap(),
        TaskDecideOutcome::WrongToken,
        "the second open's token never counts"
    );
    let decided = open_decided(inbox, task("oi-2"), &d).await;
    assert_eq!(inbox.open(&task("oi-2")).await.unwrap(), Some(decided.clone()), "decided: returned as stored");
    assert_stored(inbox, &decided, "a re-open never reopens a decided task").await;
    let closed = open_closed(inbox, task("oi-3"), None, T0.plus(9)).await;
    assert_eq!(inbox.open(&task("oi-3")).await.unwrap(), Some(closed.clone()), "closed: returned as stored");
    assert_stored(inbox, &closed, "a re-open never reopens a closed task").await;
    assert_eq!(inbox.get("oi-unknown").await.unwrap(), None);
}

/// K-2.0 on `open`: each bad record is refused with [`kernel_core::Error::InvalidInput`]
/// naming the field, and nothing is written; records at the limits are accepted.
pub async fn k2_0_bad_task_is_refused(inbox: &DynTaskInbox) {
    let x = || task("bt-x");
    let many = |n: usize| (0..n).map(|k| format!("r{k}")).collect::<Vec<_>>();
    let evidence = |n: usize| {
        (0..n).map(|k| Evidence { label: format!("e{k}"), reference: format!("ref-{k}") }).collect::<Vec<_>>()
    };
    let cases: Vec<(TaskRecord, &str)> = vec![
        (task(""), "id"),
        (task("bt\n1"), "id"),
        (task(&"b".repeat(257)), "id"),
        (TaskRecord { workflow_id: "wf\0".into(), ..x() }, "workflow_id"),
        (TaskRecord { workflow_type: String::new(), ..x() }, "workflow_type"),
        (TaskRecord { step: "$where".into(), ..x() }, "step"),
        (TaskRecord { step: "a.b".into(), ..x() }, "step"),
        (TaskRecord { title: "a\0b".into(), ..x() }, "title"),
        (TaskRecord { title: "t".repeat(TASK_TEXT_BYTES_MAX + 1), ..x() }, "title"),
        (TaskRecord { assignee: Some(String::new()), ..x() }, "assignee"),
        (TaskRecord { roles: vec![], ..x() }, "roles"),
        (TaskRecord { roles: vec!["ok".into(), "bad\u{7}".into()], ..x() }, "roles"),
        (TaskRecord { roles: many(TASK_ROLES_MAX + 1), ..x() }, "roles"),
        (TaskRecord { evidence: evidence(TASK_EVIDENCE_MAX + 1), ..x() }, "evidence"),
        (
            TaskRecord { evidence: vec![Evidence { label: "l\0".into(), reference: "r".into() }], ..x() },
            "evidence.label",
        ),
        (
            TaskRecord { evidence: vec![Evidence { label: "l".into(), reference: String::new() }], ..x() },
            "evidence.reference",
        ),
        (TaskRecord { token: "t".repeat(TASK_TOKEN_BYTES_MIN - 1), ..x() }, "token"),
        (TaskRecord { token: String::new(), ..x() }, "token"),
        (TaskRecord { token: format!("{}\n", "t".repeat(TASK_TOKEN_BYTES_MIN)), ..x() }, "token"),
        (TaskRecord { due_at: T0.minus(1), ..x() }, "due_at"),
        (TaskRecord { status: TaskStatus::Decided, ..x() }, "status"),
        (TaskRecord { status: TaskStatus::Closed, closed_at: Some(T0), ..x() }, "status"),
        (TaskRecord { decision: Some(decision("bob", TaskOutcome::Approve, T0)), ..x() }, "decision"),
        (TaskRecord { decision: Some(decision("", TaskOutcome::Approve, T0)), ..x() }, "decision.actor"),
        (TaskRecord { closed_at: Some(T0), ..x() }, "closed_at"),
    ];
    for (bad, field) in cases {
        assert_invalid_field(inbox.open(&bad).await, field);
    }
    assert_eq!(inbox.get("bt-x").await.unwrap(), None, "nothing written");
    // At the limits: accepted, and read back whole.
    let at_limit = TaskRecord {
        title: "é".repeat(TASK_TEXT_BYTES_MAX / 2),
        roles: many(TASK_ROLES_MAX),
        evidence: evidence(TASK_EVIDENCE_MAX),
        token: "t".repeat(TASK_TOKEN_BYTES_MIN),
        due_at: T0,
        ..x()
    };
    open_new(inbox, at_limit.clone()).await;
    assert_stored(inbox, &at_limit, "at the limits").await;
    let assignee_only = TaskRecord { assignee: Some("bob".into()), roles: vec![], ..task("bt-assignee") };
    open_new(inbox, assignee_only.clone()).await;
    assert_stored(inbox, &assignee_only, "an assignee and no role").await;
    let long_id = "i".repeat(kernel_core::validate::IDENTIFIER_BYTES_MAX);
    open_new(inbox, task(&long_id)).await;
    assert_stored(inbox, &task(&long_id), "the longest id").await;
}

/// K-2.0 on the other calls: bad ids, tokens, actors, decisions, list and purge limits
/// are refused naming the field, and no record changes.
pub async fn k2_0_bad_calls_are_refused(inbox: &DynTaskInbox) {
    let open = open_new(inbox, task_for("bc-open", None, &[ROLE, "bc-role"])).await;
    let d = sensitive("bob", TaskOutcome::Reject, T0, "private");
    let decided = open_decided(inbox, task("bc-decided"), &d).await;
    let closed = open_closed(inbox, task("bc-closed"), None, T0).await;

    let ok = decision("bob", TaskOutcome::Approve, T0);
    let bob = member("bob");
    let tok = token("bc-open");
    assert_invalid_field(inbox.decide("", &tok, &bob, &ok).await, "id");
    assert_invalid_field(inbox.decide("bc\u{7}", &tok, &bob, &ok).await, "id");
    assert_invalid_field(inbox.decide("bc-open", "", &bob, &ok).await, "token");
    assert_invalid_field(inbox.decide("bc-open", "tok\0", &bob, &ok).await, "token");
    let bad_actors: Vec<(Actor, &str)> = vec![
        (Actor::new("", [ROLE]), "actor.id"),
        (Actor::new("bob\n", [ROLE]), "actor.id"),
        (Actor::new("bob", [ROLE, ""]), "actor.roles"),
        (Actor::new("bob", (0..=TASK_ROLES_MAX).map(|k| format!("r{k}"))), "actor.roles"),
    ];
    for (actor, field) in &bad_actors {
        assert_invalid_field(inbox.decide("bc-open", &tok, actor, &ok).await, field);
        assert_invalid_field(inbox.list_open(actor, None, 10).await, field);
    }
    let with_reason =
        |text: String| TaskDecision { reason: Some(TaskReason { sensitive: true, text: Some(text) }), ..ok.clone() };
    let bad_decisions: Vec<(TaskDecision, &str)> = vec![
        (decision("", TaskOutcome::Approve, T0), "decision.actor"),
        (decision("bob\u{1b}", TaskOutcome::Approve, T0), "decision.actor"),
        (with_reason("r".repeat(TASK_TEXT_BYTES_MAX + 1)), "decision.reason"),
        (with_reason("r\0".to_string()), "decision.reason"),
    ];
    for (bad, field) in &bad_decisions {
        assert_invalid_field(inbox.decide("bc-open", &tok, &bob, bad).await, field);
    }
    assert_invalid_field(inbox.list_open(&bob, None, 0).await, "limit");
    assert_invalid_field(inbox.list_open(&bob, None, TASK_LIST_MAX + 1).await, "limit");
    assert_invalid_field(inbox.list_open(&bob, Some(""), 10).await, "after");
    assert_invalid_field(inbox.list_open(&bob, Some("a\0"), 10).await, "after");
    assert_invalid_field(inbox.get("").await, "id");
    assert_invalid_field(inbox.get("a\nb").await, "id");
    assert_invalid_field(inbox.close("", T0).await, "id");
    assert_invalid_field(inbox.close("bc\n", T0).await, "id");
    for limit in [0, TASK_PURGE_MAX + 1] {
        assert_invalid_field(inbox.purge_sensitive_reasons(Instant::MAX, limit).await, "limit");
        assert_invalid_field(inbox.purge_closed(Instant::MAX, limit).await, "limit");
    }
    assert_stored(inbox, &open, "still open, no decision").await;
    assert_stored(inbox, &decided, "reason not purged").await;
    assert_stored(inbox, &closed, "not purged").await;
    // At the limits: accepted.
    let lister = Actor::new("bc-bob", ["bc-role"]);
    assert_eq!(inbox.list_open(&lister, None, TASK_LIST_MAX).await.unwrap(), vec![open.clone()], "the largest page");
    let at_limit = with_reason("é".repeat(TASK_TEXT_BYTES_MAX / 2));
    let many_roles = Actor::new("bob", (0..TASK_ROLES_MAX - 1).map(|k| format!("r{k}")).chain([ROLE.to_string()]));
    assert_eq!(inbox.decide("bc-open", &tok, &many_roles, &at_limit).await.unwrap(), TaskDecideOutcome::Decided);
    assert_stored(inbox, &TaskRecord { status: TaskStatus::Decided, decision: Some(at_limit), ..open }, "decided")
        .await;
}

/// `list_open` lists the open tasks an actor may decide, by assignee or by any of its
/// roles, never a decided or closed one, and never by confusing an actor's id with a role.
pub async fn list_open_by_eligibility(inbox: &DynTaskInbox) {
    // Names of this case only, so tasks of other cases in a shared namespace never match.
    let mut expected = Vec::new();
    for (id, assignee, roles) in [
        ("le-a", Some("le-alice"), &[][..]),
        ("le-b", None, &["le-finance"][..]),
        ("le-c", None, &["le-audit", "le-legal"][..]),
        ("le-d", Some("le-bob"), &["le-finance"][..]),
    ] {
        expected.push(open_new(inbox, task_for(id, assignee, roles)).await);
    }
    let everyone = &[ROLE, "le-finance", "le-legal"][..];
    let d = decision("carol", TaskOutcome::Approve, T0.plus(1));
    open_decided(inbox, task_for("le-e", Some("le-alice"), everyone), &d).await;
    open_closed(inbox, task_for("le-f", Some("le-alice"), everyone), None, T0.plus(2)).await;
    open_closed(inbox, task_for("le-g", Some("le-alice"), everyone), Some(&d), T0.plus(3)).await;

    let none = Vec::<String>::new();
    let cases: Vec<(Actor, &[&str])> = vec![
        (Actor::new("le-alice", none.clone()), &["le-a"]),
        (Actor::new("le-alice", ["le-finance"]), &["le-a", "le-b", "le-d"]),
        (Actor::new("le-bob", none.clone()), &["le-d"]),
        (Actor::new("le-carol", ["le-legal"]), &["le-c"]),
        (Actor::new("le-carol", ["le-sales", "le-audit", "le-finance"]), &["le-b", "le-c", "le-d"]),
        (Actor::new("le-finance", none.clone()), &[]),
        (Actor::new("le-zed", ["le-alice", "le-bob"]), &[]),
        (Actor::new("LE-alice", ["LE-finance"]), &[]),
    ];
    for (actor, want) in cases {
        assert_eq!(open_ids(inbox, &actor, None, TASK_LIST_MAX).await, want, "{actor:?}");
    }
    let page = inbox.list_open(&Actor::new("le-bob", ["le-legal"]), None, 10).await.unwrap();
    assert_eq!(page, vec![expected[2].clone(), expected[3].clone()], "whole records");
    let page = inbox.list_open(&Actor::new("le-bob", ["le-legal"]), None, 1).await.unwrap();
    assert_eq!(page, vec![expected[2].clone()], "at most `limit`");
}

/// `list_open` pages by id in byte order, strictly after the cursor (which need not be a
/// stored id), at most `limit` records.
pub async fn list_open_pages_by_id(inbox: &DynTaskInbox) {
    // Byte order: "lp-1" < "lp-2" < "lp-Z" < "lp-z" < "lp-é" (a locale collation would differ).
    for id in ["lp-é", "lp-2", "lp-Z", "lp-z", "lp-1"] {
        open_new(inbox, task_for(id, None, &["lp-role"])).await;
    }
    open_decided(inbox, task_for("lp-3", None, &[ROLE, "lp-role"]), &decision("bob", TaskOutcome::Reject, T0)).await;
    let bob = Actor::new("lp-bob", ["lp-role"]);
    assert_eq!(open_ids(inbox, &bob, None, 2).await, ["lp-1", "lp-2"]);
    assert_eq!(open_ids(inbox, &bob, Some("lp-2"), 2).await, ["lp-Z", "lp-z"], "skips the decided lp-3");
    assert_eq!(open_ids(inbox, &bob, Some("lp-z"), 2).await, ["lp-é"]);
    assert_eq!(open_ids(inbox, &bob, Some("lp-é"), 2).await, Vec::<String>::new());
    assert_eq!(open_ids(inbox, &bob, Some("lp-10"), 1).await, ["lp-2"], "a cursor need not be a stored id");
    assert_eq!(open_ids(inbox, &bob, None, 1).await, ["lp-1"]);
    assert_eq!(open_ids(inbox, &bob, None, TASK_LIST_MAX).await, ["lp-1", "lp-2", "lp-Z", "lp-z", "lp-é"]);
}

/// `decide` on an open task by an eligible actor with its token: `Decided`, and the record
/// reads back decided with the decision, nothing else changed; by the assignee or by a
/// role, with a sensitive reason or none.
pub async fn decide_open_task(inbox: &DynTaskInbox) {
    let t = open_new(inbox, task_for("do-1", Some("ålice"), &["finance"])).await;
    let d = sensitive("ålice", TaskOutcome::Escalate, T0.plus(9), "conflit d'intérêts — «privé» 🔒");
    let alice = Actor::new("ålice", Vec::<String>::new());
    assert_eq!(inbox.decide("do-1", &t.token, &alice, &d).await.unwrap(), TaskDecideOutcome::Decided);
    assert_stored(inbox, &TaskRecord { status: TaskStatus::Decided, decision: Some(d), ..t }, "by the assignee").await;

    let t = open_new(inbox, task_for("do-2", None, &["audit", "finance"])).await;
    let d = TaskDecision { reason: None, ..decision("carol", TaskOutcome::Cancel, T0.plus(3)) };
    let carol = Actor::new("carol", ["sales", "finance"]);
    assert_eq!(inbox.decide("do-2", &t.token, &carol, &d).await.unwrap(), TaskDecideOutcome::Decided);
    assert_stored(inbox, &TaskRecord { status: TaskStatus::Decided, decision: Some(d), ..t }, "by a role").await;

    for (k, outcome) in [TaskOutcome::Approve, TaskOutcome::Reject].into_iter().enumerate() {
        let id = format!("do-o{k}");
        let t = open_new(inbox, task(&id)).await;
        let d = TaskDecision {
            reason: Some(TaskReason { sensitive: true, text: None }),
            ..decision("bob", outcome, T0.plus(k as i64))
        };
        assert_eq!(inbox.decide(&id, &t.token, &member("bob"), &d).await.unwrap(), TaskDecideOutcome::Decided);
        assert_stored(inbox, &TaskRecord { status: TaskStatus::Decided, decision: Some(d), ..t }, "outcome").await;
    }
}

/// Every refusal of `decide` is returned and writes nothing: an absent task, a wrong
/// token, a decision naming another actor, an ineligible actor, a reused token on a
/// decided task, a closed task. The token is checked before the actor and eligibility.
pub async fn decide_refusals_change_nothing(inbox: &DynTaskInbox) {
    let bob = member("bob");
    let ok = decision("bob", TaskOutcome::Approve, T0.plus(1));
    assert_eq!(inbox.decide("dr-none", &token("dr-none"), &bob, &ok).await.unwrap(), TaskDecideOutcome::NotFound);
    assert_eq!(inbox.get("dr-none").await.unwrap(), None, "no upsert");

    let t = open_new(inbox, task_for("dr-1", Some("alice"), &["finance"])).await;
    let mut near = t.token.clone().into_bytes();
    *near.last_mut().unwrap() ^= 1;
    let near = String::from_utf8(near).unwrap();
    let longer = format!("{}0", t.token);
    let mallory = Actor::new("mallory", ["sales"]);
    let role_named = Actor::new("finance", ["alice"]);
    let refusals: Vec<(&str, &Actor, TaskDecision, TaskDecideOutcome)> = vec![
        (&near, &bob, ok.clone(), TaskDecideOutcome::WrongToken),
        (&longer, &bob, ok.clone(), TaskDecideOutcome::WrongToken),
        (&t.token[..t.token.len() - 1], &bob, ok.clone(), TaskDecideOutcome::WrongToken),
        (&near, &mallory, decision("bob", TaskOutcome::Approve, T0), TaskDecideOutcome::WrongToken),
        (&t.token, &bob, decision("alice", TaskOutcome::Approve, T0), TaskDecideOutcome::ActorMismatch),
        (&t.token, &mallory, decision("alice", TaskOutcome::Approve, T0), TaskDecideOutcome::ActorMismatch),
        (&t.token, &mallory, decision("mallory", TaskOutcome::Approve, T0), TaskDecideOutcome::NotEligible),
        (&t.token, &role_named, decision("finance", TaskOutcome::Approve, T0), TaskDecideOutcome::NotEligible),
    ];
    for (tok, actor, d, want) in refusals {
        assert_eq!(inbox.decide("dr-1", tok, actor, &d).await.unwrap(), want, "{actor:?} {d:?}");
        assert_stored(inbox, &t, "a refusal writes nothing").await;
    }

    // A reused token: the first decision stays and is reported.
    assert_eq!(inbox.decide("dr-1", &t.token, &bob, &ok).await.unwrap(), TaskDecideOutcome::Decided);
    let decided = TaskRecord { status: TaskStatus::Decided, decision: Some(ok.clone()), ..t.clone() };
    let again = decision("alice", TaskOutcome::Reject, T0.plus(2));
    let alice = Actor::new("alice", Vec::<String>::new());
    for (actor, d) in [(&bob, &ok), (&alice, &again)] {
        assert_eq!(
            inbox.decide("dr-1", &t.token, actor, d).await.unwrap(),
            TaskDecideOutcome::AlreadyDecided(ok.clone()),
            "{actor:?}"
        );
        assert_stored(inbox, &decided, "the first decision stays").await;
    }

    // Closed: no decision lands on it, whatever it carried.
    let closed = open_closed(inbox, task("dr-2"), None, T0.plus(3)).await;
    assert_eq!(inbox.decide("dr-2", &closed.token, &bob, &ok).await.unwrap(), TaskDecideOutcome::Closed);
    assert_stored(inbox, &closed, "closed open: unchanged").await;
    assert_eq!(inbox.close("dr-1", T0.plus(4)).await.unwrap(), TaskCloseOutcome::Closed(Some(ok.clone())));
    let closed = TaskRecord { status: TaskStatus::Closed, closed_at: Some(T0.plus(4)), ..decided };
    assert_eq!(inbox.decide("dr-1", &t.token, &alice, &again).await.unwrap(), TaskDecideOutcome::Closed);
    assert_stored(inbox, &closed, "closed decided: unchanged").await;
}

/// K-17.5 (amended): the decision's conditional write refuses `decided_at >= due_at`, read
/// from the deciding process's clock, whether or not anyone has closed the task since:
/// one millisecond before the deadline is accepted, at the deadline exactly and after it
/// refused as `PastDeadline`, and a refusal writes nothing.
pub async fn decide_at_or_after_the_deadline_is_refused(inbox: &DynTaskInbox) {
    let bob = member("bob");
    let t = open_new(inbox, task("dl-at")).await;
    for at in [t.due_at, t.due_at.plus(60_000)] {
        let late = decision("bob", TaskOutcome::Approve, at);
        let out = inbox.decide("dl-at", &t.token, &bob, &late).await.unwrap();
        assert_ne!(out, TaskDecideOutcome::Decided, "decided at {at:?}, due at {:?}", t.due_at);
        assert_eq!(out, TaskDecideOutcome::PastDeadline { due_at: t.due_at }, "decided at {at:?}");
        assert_stored(inbox, &t, "a refusal writes nothing").await;
    }
    let on_time = decision("bob", TaskOutcome::Approve, t.due_at.minus(1));
    let t = open_new(inbox, task("dl-before")).await;
    assert_eq!(inbox.decide("dl-before", &t.token, &bob, &on_time).await.unwrap(), TaskDecideOutcome::Decided);
    assert_stored(inbox, &TaskRecord { status: TaskStatus::Decided, decision: Some(on_time), ..t }, "in time").await;
}

/// Eight eligible actors decide one open task concurrently: exactly one `Decided`; every
/// other call reports the winner's decision, which is the one stored.
pub async fn concurrent_decides_one_winner(inbox: &DynTaskInbox) {
    let t = open_new(inbox, task_for("cd-1", Some("ops-0"), &["finance"])).await;
    let actors: Vec<Actor> = (0..8).map(|k| member(&format!("ops-{k}"))).collect();
    let decisions: Vec<TaskDecision> = (0..8)
        .map(|k| {
            let outcome = if k % 2 == 0 { TaskOutcome::Approve } else { TaskOutcome::Reject };
            decision(&format!("ops-{k}"), outcome, T0.plus(k))
        })
        .collect();
    let results =
        futures::future::join_all(actors.iter().zip(&decisions).map(|(a, d)| inbox.decide("cd-1", &t.token, a, d)))
            .await;
    let results: Vec<TaskDecideOutcome> = results.into_iter().map(|r| r.expect("decide")).collect();
    let winners: Vec<usize> = (0..8).filter(|&k| results[k] == TaskDecideOutcome::Decided).collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    let winner = decisions[winners[0]].clone();
    for (k, r) in results.iter().enumerate() {
        if k != winners[0] {
            assert_eq!(r, &TaskDecideOutcome::AlreadyDecided(winner.clone()), "loser {k}");
        }
    }
    assert_stored(inbox, &TaskRecord { status: TaskStatus::Decided, decision: Some(winner), ..t }, "the winner").await;
}

/// `close`: an open task closes with `Closed(None)`, a decided one with the decision it
/// carried; a second close is `AlreadyClosed` and keeps the first `closed_at`; an absent
/// task is `NotFound` and nothing is created; a decision after the close is `Closed`.
pub async fn close_moves_forward_once(inbox: &DynTaskInbox) {
    let t = open_new(inbox, task_for("cl-1", None, &[ROLE, "cl-role"])).await;
    assert_eq!(inbox.close("cl-1", T0.plus(5)).await.unwrap(), TaskCloseOutcome::Closed(None));
    let closed = TaskRecord { status: TaskStatus::Closed, closed_at: Some(T0.plus(5)), ..t.clone() };
    assert_stored(inbox, &closed, "closed without a decision").await;
    assert_eq!(inbox.close("cl-1", T0.plus(6)).await.unwrap(), TaskCloseOutcome::AlreadyClosed);
    assert_stored(inbox, &closed, "closed_at kept").await;
    let d = decision("bob", TaskOutcome::Approve, T0.plus(7));
    assert_eq!(inbox.decide("cl-1", &t.token, &member("bob"), &d).await.unwrap(), TaskDecideOutcome::Closed);
    assert_stored(inbox, &closed, "no decision after the close").await;

    let decided = open_decided(inbox, task_for("cl-2", None, &[ROLE, "cl-role"]), &d).await;
    assert_eq!(inbox.close("cl-2", T0.plus(8)).await.unwrap(), TaskCloseOutcome::Closed(Some(d.clone())));
    let closed = TaskRecord { status: TaskStatus::Closed, closed_at: Some(T0.plus(8)), ..decided };
    assert_stored(inbox, &closed, "closed with its decision").await;
    assert_eq!(inbox.close("cl-2", T0.plus(9)).await.unwrap(), TaskCloseOutcome::AlreadyClosed);
    assert_stored(inbox, &closed, "closed_at and decision kept").await;
    let lister = Actor::new("cl-bob", ["cl-role"]);
    assert_eq!(inbox.list_open(&lister, None, 10).await.unwrap(), vec![], "closed tasks are not listed");

    assert_eq!(inbox.close("cl-none", T0).await.unwrap(), TaskCloseOutcome::NotFound);
    assert_eq!(inbox.get("cl-none").await.unwrap(), None, "no upsert");
}

/// A decision racing a close, over several tasks at once and both orders of polling:
/// either the decision is stored and the close returns it, or the decision finds the task
/// closed and the close returns none. A decision is never lost.
pub async fn decide_racing_close_never_loses_a_decision(inbox: &DynTaskInbox) {
    const ROUNDS: usize = 16;
    let mut tasks = Vec::new();
    for k in 0..ROUNDS {
        tasks.push(open_new(inbox, task(&format!("rc-{k:02}"))).await);
    }
    let bob = member("bob");
    let decisions: Vec<TaskDecision> =
        (0..ROUNDS).map(|k| decision("bob", TaskOutcome::Approve, T0.plus(k as i64))).collect();
    let rounds = tasks.iter().zip(&decisions).enumerate().map(|(k, (t, d))| {
        let bob = &bob;
        async move {
            let decide = inbox.decide(&t.id, &t.token, bob, d);
            let close = inbox.close(&t.id, T0.plus(100));
            if k % 2 == 0 {
                futures::future::join(decide, close).await
            } else {
                let (c, d) = futures::future::join(close, decide).await;
                (d, c)
            }
        }
    });
    let results = futures::future::join_all(rounds).await;
    for ((t, d), (decided, closed)) in tasks.into_iter().zip(&decisions).zip(results) {
        let (decided, closed) = (decided.expect("decide"), closed.expect("close"));
        let carried = match (&decided, &closed) {
            (TaskDecideOutcome::Decided, TaskCloseOutcome::Closed(Some(got))) => {
                assert_eq!(got, d, "{}: the close returns the decision", t.id);
                Some(d.clone())
            }
            (TaskDecideOutcome::Closed, TaskCloseOutcome::Closed(None)) => None,
            other => panic!("{}: a lost or inconsistent decision: {other:?}", t.id),
        };
        let expected = TaskRecord { status: TaskStatus::Closed, decision: carried, closed_at: Some(T0.plus(100)), ..t };
        assert_stored(inbox, &expected, "after the race").await;
    }
}

/// `purge_sensitive_reasons` removes only the text of sensitive reasons decided strictly
/// before the cutoff, at most `limit` per call; the decision stays (outcome, actor, time,
/// the sensitive flag), and non-sensitive or newer reasons are untouched. Idempotent.
pub async fn purge_sensitive_reasons_keeps_the_decision(inbox: &DynTaskInbox) {
    // Times before T0, which no other case uses for a decision.
    let at = |ms: i64| T0.minus(1_000_000 - ms);
    let cutoff = at(500);
    let old = |id: &str| TaskRecord { created_at: at(0), ..task(id) }; // due after every decision here
    let purged = |r: &TaskRecord| {
        let mut r = r.clone();
        r.decision.as_mut().unwrap().reason.as_mut().unwrap().text = None;
        r
    };
    let s1 = open_decided(inbox, old("ps-s1"), &sensitive("bob", TaskOutcome::Reject, at(100), "health «x»")).await;
    let s2 =
        open_closed(inbox, old("ps-s2"), Some(&sensitive("carol", TaskOutcome::Approve, at(200), "salary")), at(250))
            .await;
    let s3 = open_decided(inbox, old("ps-s3"), &sensitive("dan", TaskOutcome::Escalate, at(499), "x")).await;
    let edge =
        open_decided(inbox, old("ps-edge"), &sensitive("bob", TaskOutcome::Reject, cutoff, "at the cutoff")).await;
    let newer = open_decided(inbox, old("ps-new"), &sensitive("bob", TaskOutcome::Cancel, at(900), "newer")).await;
    let plain = open_decided(inbox, old("ps-plain"), &decision("bob", TaskOutcome::Reject, at(100))).await;
    let no_reason = TaskDecision { reason: None, ..decision("bob", TaskOutcome::Approve, at(100)) };
    let no_reason = open_decided(inbox, old("ps-none"), &no_reason).await;
    let no_text = TaskDecision {
        reason: Some(TaskReason { sensitive: true, text: None }),
        ..decision("bob", TaskOutcome::Approve, at(100))
    };
    let no_text = open_decided(inbox, old("ps-notext"), &no_text).await;
    let open = open_new(inbox, old("ps-open")).await;

    assert_eq!(inbox.purge_sensitive_reasons(cutoff, 2).await.unwrap(), 2, "bounded by the limit");
    assert_eq!(inbox.purge_sensitive_reasons(cutoff, 10).await.unwrap(), 1, "the third one");
    assert_eq!(inbox.purge_sensitive_reasons(cutoff, 10).await.unwrap(), 0, "idempotent");
    for r in [&s1, &s2, &s3] {
        assert_stored(inbox, &purged(r), "the text goes, the decision stays").await;
    }
    for r in [&edge, &newer, &plain, &no_reason, &no_text, &open] {
        assert_stored(inbox, r, "untouched").await;
    }
    assert_eq!(inbox.purge_sensitive_reasons(at(901), TASK_PURGE_MAX).await.unwrap(), 2, "the cutoff and newer ones");
    for r in [&edge, &newer] {
        assert_stored(inbox, &purged(r), "purged with a later cutoff").await;
    }
    assert_stored(inbox, &plain, "a non-sensitive reason is never purged").await;
    assert_eq!(inbox.purge_sensitive_reasons(at(901), TASK_PURGE_MAX).await.unwrap(), 0, "idempotent");
}

/// `purge_closed` deletes closed records with `closed_at` strictly before the cutoff, at
/// most `limit` per call; never an open or decided record, however old.
pub async fn purge_closed_respects_before_and_limit(inbox: &DynTaskInbox) {
    // Times before T0, which no other case uses for a close.
    let at = |ms: i64| T0.minus(2_000_000 - ms);
    let old = |id: &str| TaskRecord { created_at: at(0), ..task(id) }; // due after every decision here
    let d = decision("bob", TaskOutcome::Reject, at(1));
    open_closed(inbox, old("pc-1"), None, at(10)).await;
    open_closed(inbox, old("pc-2"), Some(&d), at(20)).await;
    open_closed(inbox, old("pc-3"), None, at(30)).await;
    let late = open_closed(inbox, old("pc-4"), Some(&d), at(100)).await;
    let open = open_new(inbox, old("pc-open")).await;
    let decided = open_decided(inbox, old("pc-decided"), &d).await;

    assert_eq!(inbox.purge_closed(at(50), 2).await.unwrap(), 2, "bounded by the limit");
    assert_eq!(inbox.purge_closed(at(50), 10).await.unwrap(), 1, "the third one");
    assert_eq!(inbox.purge_closed(at(50), 10).await.unwrap(), 0, "none left before the cutoff");
    for id in ["pc-1", "pc-2", "pc-3"] {
        assert_eq!(inbox.get(id).await.unwrap(), None, "{id} purged");
    }
    assert_stored(inbox, &late, "closed after the cutoff").await;
    assert_eq!(inbox.purge_closed(at(100), 10).await.unwrap(), 0, "strictly before");
    assert_stored(inbox, &late, "closed at the cutoff").await;
    assert_eq!(inbox.purge_closed(at(101), TASK_PURGE_MAX).await.unwrap(), 1);
    assert_eq!(inbox.get("pc-4").await.unwrap(), None);
    assert_stored(inbox, &open, "open records are never purged").await;
    assert_stored(inbox, &decided, "decided records are never purged").await;
}

/// Run every case, each on a fresh fixture from `factory` (torn down after the case, also
/// when it fails); returns at once when the factory gives `None` (no server).
pub async fn run<F, Fut, X>(factory: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Option<X>>,
    X: TaskInboxFixture,
{
    use futures::FutureExt as _;
    type Case = for<'a> fn(&'a DynTaskInbox) -> futures::future::BoxFuture<'a, ()>;
    // The same list as `task_inbox_conformance!`.
    let cases: [(&str, Case); 13] = [
        ("open_inserts_once", |i| Box::pin(open_inserts_once(i))),
        ("k2_0_bad_task_is_refused", |i| Box::pin(k2_0_bad_task_is_refused(i))),
        ("k2_0_bad_calls_are_refused", |i| Box::pin(k2_0_bad_calls_are_refused(i))),
        ("list_open_by_eligibility", |i| Box::pin(list_open_by_eligibility(i))),
        ("list_open_pages_by_id", |i| Box::pin(list_open_pages_by_id(i))),
        ("decide_open_task", |i| Box::pin(decide_open_task(i))),
        ("decide_refusals_change_nothing", |i| Box::pin(decide_refusals_change_nothing(i))),
        ("decide_at_or_after_the_deadline_is_refused", |i| Box::pin(decide_at_or_after_the_deadline_is_refused(i))),
        ("concurrent_decides_one_winner", |i| Box::pin(concurrent_decides_one_winner(i))),
        ("close_moves_forward_once", |i| Box::pin(close_moves_forward_once(i))),
        ("decide_racing_close_never_loses_a_decision", |i| Box::pin(decide_racing_close_never_loses_a_decision(i))),
        ("purge_sensitive_reasons_keeps_the_decision", |i| Box::pin(purge_sensitive_reasons_keeps_the_decision(i))),
        ("purge_closed_respects_before_and_limit", |i| Box::pin(purge_closed_respects_before_and_limit(i))),
    ];
    for (name, case) in cases {
        let Some(fixture) = factory().await else { return };
        let outcome = std::panic::AssertUnwindSafe(case(fixture.task_inbox())).catch_unwind().await;
        fixture.teardown().await;
        if let Err(panic) = outcome {
            eprintln!("task-inbox conformance case `{name}` failed");
            std::panic::resume_unwind(panic);
        }
    }
}

/// Expands to one `#[tokio::test]` per task-inbox conformance case (see
/// [`store_conformance!`](crate::store_conformance)).
#[macro_export]
macro_rules! task_inbox_conformance {
    ($factory:expr) => {
        $crate::__conformance_cases!(task_inbox, TaskInboxFixture, task_inbox, $factory;
            open_inserts_once,
            k2_0_bad_task_is_refused,
            k2_0_bad_calls_are_refused,
            list_open_by_eligibility,
            list_open_pages_by_id,
            decide_open_task,
            decide_refusals_change_nothing,
            decide_at_or_after_the_deadline_is_refused,
            concurrent_decides_one_winner,
            close_moves_forward_once,
            decide_racing_close_never_loses_a_decision,
            purge_sensitive_reasons_keeps_the_decision,
            purge_closed_respects_before_and_limit,
        );
    };
}
