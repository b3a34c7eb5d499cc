//! Store conformance cases of creation and bad input (K-2.0, K-5): create and read back, one
//! winner of a race, identifiers and names refused or kept as data, writes to a missing instance.

use super::*;
use crate::time::TestTime;
use kernel_core::transition::{Guard, Transition};
use kernel_core::Error;
use kernel_core::WorkflowId;
use serde_json::json;

/// `r` is [`Error::InvalidInput`] naming `field` (the shared K-2.0 rule names the same field
/// on every adapter).
pub fn assert_invalid_field<T: std::fmt::Debug>(r: kernel_core::Result<T>, field: &str) {
    match r {
        Err(Error::InvalidInput { field: f, .. }) => assert_eq!(f, field, "refused field"),
        other => panic!("expected InvalidInput on `{field}`, got {other:?}"),
    }
}

/// A JSON value one byte over the stores' shared payload limit once serialized.
pub fn oversize_payload() -> serde_json::Value {
    json!("x".repeat(kernel_core::validate::STORE_PAYLOAD_BYTES_MAX - 1))
}

/// A fresh instance `wf-bad` (biz key `biz:wf-bad`) to be refused by `create`.
fn bad_instance(edit: impl FnOnce(&mut WorkflowInstance)) -> WorkflowInstance {
    let mut i = waiting("wf-bad", Some(1), None);
    edit(&mut i);
    i
}

fn signal_wait(wait_key: &str) -> Wait {
    Wait::Signal {
        signal_type: "approved".into(),
        wait_key: wait_key.into(),
        generation: 2,
        step_index: 1,
        poll_time: None,
    }
}

// --- create (no token; unique biz_key) ---------------------------------------------------

/// Create, then read back by id and by biz key.
pub async fn create_and_read_back(store: &DynStore) {
    let inst = seed(store, instance("wf-1")).await;
    assert_eq!(store.get(&"wf-1".into()).await.unwrap(), Some(inst.clone()));
    assert_eq!(store.get_by_biz_key("biz:wf-1").await.unwrap(), Some(inst));
    assert_eq!(store.get(&"wf-2".into()).await.unwrap(), None);
    assert_eq!(store.get_by_biz_key("biz:wf-2").await.unwrap(), None);
}

/// A second create with the same biz key returns the stored instance untouched (K-5).
pub async fn create_existing_biz_key_returns_stored(store: &DynStore) {
    let inst = seed(store, instance("wf-1")).await;
    let mut other = instance("wf-2");
    other.biz_key = inst.biz_key.clone();
    match store.create(other).await.unwrap() {
        CreateOutcome::Exists(e) => assert_eq!(e, inst),
        c => panic!("expected Exists, got {c:?}"),
    }
    assert_eq!(store.get(&"wf-2".into()).await.unwrap(), None, "the loser wrote nothing");
}

/// Concurrent creates of one biz key: exactly one `Created`, the rest `Exists` (K-3.2).
pub async fn create_race_one_winner(store: &DynStore) {
    create_race(store, 8).await;
}

/// `n` concurrent creates of one biz key with distinct workflow ids; asserts one winner.
pub async fn create_race(store: &DynStore, n: usize) {
    let attempts = (0..n).map(|k| {
        let mut i = instance(&format!("wf-{k:02}"));
        i.biz_key = "biz:race".to_string();
        store.create(i)
    });
    let results = futures::future::join_all(attempts).await;
    let mut winner = None;
    for r in &results {
        if let CreateOutcome::Created(c) = r.as_ref().expect("create") {
            assert!(winner.replace(c.workflow_id.clone()).is_none(), "two winners");
        }
    }
    let winner = winner.expect("one winner");
    for r in results {
        if let CreateOutcome::Exists(e) = r.unwrap() {
            assert_eq!(e.workflow_id, winner, "every loser sees the winner");
        }
    }
    assert_eq!(store.get_by_biz_key("biz:race").await.unwrap().map(|i| i.workflow_id), Some(winner));
}

/// A workflow id taken under another biz key is a conflict, not an `Exists`.
pub async fn create_duplicate_workflow_id_is_conflict(store: &DynStore) {
    seed(store, instance("wf-1")).await;
    let mut other = instance("wf-1");
    other.biz_key = "biz:other".to_string();
    let r = store.create(other).await;
    assert!(matches!(r, Err(Error::Conflict(_))), "got {r:?}");
    assert_eq!(store.get_by_biz_key("biz:other").await.unwrap(), None);
}

/// Identifier rule (K-2.0): bad ids and step names are `InvalidInput` and write nothing.
pub async fn create_rejects_invalid_identifiers(store: &DynStore) {
    let long = "x".repeat(257);
    let cases: Vec<(&str, WorkflowInstance)> = vec![
        ("step name with $", {
            let mut i = instance("wf-1");
            i.steps[1].name = "$where".into();
            i
        }),
        ("step name with .", {
            let mut i = instance("wf-1");
            i.steps[1].name = "a.b".into();
            i
        }),
        ("id over 256 bytes", instance(&long)),
        ("biz key with NUL", {
            let mut i = instance("wf-1");
            i.biz_key = "biz\0x".into();
            i
        }),
        ("empty id", instance("")),
    ];
    for (what, inst) in cases {
        let biz = inst.biz_key.clone();
        assert_invalid(store.create(inst).await, what);
        if kernel_core::validate::identifier("biz_key", &biz).is_ok() {
            assert_eq!(store.get_by_biz_key(&biz).await.unwrap(), None, "{what}: nothing written");
        }
    }
    assert_eq!(store.get(&"wf-1".into()).await.unwrap(), None, "nothing written");
    assert_eq!(store.scan_claimable(None, 10).await.unwrap(), ScanPage::default());
}

/// Values shaped like operators are data: an id `{"$ne": null}` matches only itself, and
/// operator-shaped keys inside input and output are stored verbatim (K-2.0).
pub async fn operator_shaped_values_are_data(store: &DynStore) {
    let evil = r#"{"$ne": null}"#;
    let mut i = instance(evil);
    i.input = json!({"$ne": null, "$where": "sleep(1000)", "a.b": {"$gt": ""}, "$numberLong": "5"});
    seed(store, i.clone()).await;
    seed(store, instance("wf-plain")).await;
    assert_eq!(store.get(&WorkflowId::from(evil)).await.unwrap(), Some(i.clone()));
    assert_eq!(store.get(&WorkflowId::from(r#"{"$ne": 1}"#)).await.unwrap(), None);
    let mut t = Transition::claim(&"tok".into(), T0, LEASE_MS).unwrap();
    t.outputs.push(("fetch".into(), json!({"$set": {"status": "completed"}, "x.y": 1})));
    t.input = Some(json!({"$in": []}));
    t.bump_revision = true;
    check_write(store, evil, &Guard::Active, &t, true).await;
    assert_eq!(store.get(&"wf-plain".into()).await.unwrap(), Some(instance("wf-plain")), "other instances untouched");
}

// --- misses and bad input on apply -------------------------------------------------------

/// Any guard on a missing instance misses.
pub async fn apply_to_missing_instance_is_missed(store: &DynStore) {
    let r = store.apply(&"wf-none".into(), &Guard::Active, &Transition::supersede(T0)).await.unwrap();
    assert_eq!(r, WriteOutcome::Missed);
    assert_eq!(store.get(&"wf-none".into()).await.unwrap(), None, "no upsert");
}

/// Output names with `$` or `.` and a step index past the end are `InvalidInput`; nothing
/// is written.
pub async fn apply_rejects_bad_names_and_indices(store: &DynStore) {
    let inst = seed(store, claimed("wf-1", "a")).await;
    for name in ["$where", "a.b", ""] {
        let t = Transition::complete_step(1, name, json!(1), DurationMs::from_millis(0), T0, false);
        assert_invalid(store.apply(&"wf-1".into(), &running("a"), &t).await, name);
    }
    assert_invalid(store.apply(&"wf-1".into(), &running("a"), &Transition::mark_running(7, T0)).await, "step index 7");
    assert_eq!(store.get(&"wf-1".into()).await.unwrap(), Some(inst), "nothing written");
}

// --- the shared K-2.0 rule: one case per refused input ----------------------------------

/// K-2.0: a wait key with NUL is refused by `apply` (suspend), by a signal-wait guard and by
/// `create`, as [`Error::InvalidInput`] naming the field; nothing is written.
pub async fn k2_0_bad_wait_key_is_refused(store: &DynStore) {
    refused_writes_nothing(store, |store| {
        Box::pin(async move {
            let t = Transition::suspend(1, signal_wait("doc\0"), None, DurationMs::from_millis(0), T0);
            assert_invalid_field(store.apply(&"wf-1".into(), &running("a"), &t).await, "wait.wait_key");
            let id =
                WaitIdentity { signal_type: "approved".into(), wait_key: "doc\0".into(), generation: 1, step_index: 1 };
            let t = Transition::signal_activation(1, "sig-1", T0);
            assert_invalid_field(store.apply(&"wf-1".into(), &Guard::SignalWait(id), &t).await, "wait_key");
            let i = bad_instance(|i| i.wait = Some(signal_wait("doc\0")));
            assert_invalid_field(store.create(i).await, "wait.wait_key");
        })
    })
    .await;
}

/// K-2.0: an output, checkpoint or input over the shared payload limit
/// ([`STORE_PAYLOAD_BYTES_MAX`](kernel_core::validate::STORE_PAYLOAD_BYTES_MAX)) is refused
/// by `apply` and `create`; nothing is written.
pub async fn k2_0_oversize_payload_is_refused(store: &DynStore) {
    refused_writes_nothing(store, |store| {
        Box::pin(async move {
            let big = oversize_payload();
            let t = Transition::complete_step(1, "compose", big.clone(), DurationMs::from_millis(0), T0, false);
            assert_invalid_field(store.apply(&"wf-1".into(), &running("a"), &t).await, "output.compose");
            let t = Transition::yield_step(1, Some(big.clone()), DurationMs::from_millis(0), T0);
            assert_invalid_field(store.apply(&"wf-1".into(), &running("a"), &t).await, "steps.1.checkpoint");
            let mut t = Transition::failing(T0);
            t.input = Some(big.clone());
            assert_invalid_field(store.apply(&"wf-1".into(), &running("a"), &t).await, "input");
            assert_invalid_field(store.create(bad_instance(|i| i.input = big.clone())).await, "input");
            let i = bad_instance(|i| i.steps[1].checkpoint = Some(big));
            assert_invalid_field(store.create(i).await, "steps[1].checkpoint");
        })
    })
    .await;
}

/// K-2.0: a claim token with a control character is refused as a guard, as a written token,
/// in a claim and in `create`; nothing is written.
pub async fn k2_0_bad_token_is_refused(store: &DynStore) {
    refused_writes_nothing(store, |store| {
        Box::pin(async move {
            let t = Transition::failing(T0);
            assert_invalid_field(store.apply(&"wf-1".into(), &running("a\0"), &t).await, "claim_token");
            let mut t = Transition::heartbeat(T0, LEASE_MS).unwrap();
            t.claim_token = Some(kernel_core::transition::Patch::Set("b\n".into()));
            assert_invalid_field(
                store.apply(&"wf-1".into(), &Guard::Token { token: "a".into() }, &t).await,
                "claim_token",
            );
            assert_invalid_field(store.claim(&"wf-2".into(), &spec("t\0", T0)).await, "claim_token");
            assert_invalid_field(store.claim_any(&spec("", T0)).await, "claim_token");
            let i = bad_instance(|i| i.claim_token = Some("t\u{7}".into()));
            assert_invalid_field(store.create(i).await, "claim_token");
        })
    })
    .await;
}

/// K-2.0: output names are document keys: a `$` prefix or a `.` is refused by `apply` and
/// `create`; nothing is written.
pub async fn k2_0_bad_output_key_is_refused(store: &DynStore) {
    refused_writes_nothing(store, |store| {
        Box::pin(async move {
            for name in ["$set", "a.b"] {
                let t = Transition::complete_step(1, name, json!(1), DurationMs::from_millis(0), T0, false);
                assert_invalid_field(store.apply(&"wf-1".into(), &running("a"), &t).await, "output");
            }
            let i = bad_instance(|i| _ = i.output.insert("$where".into(), json!(1)));
            assert_invalid_field(store.create(i).await, "output");
        })
    })
    .await;
}

/// K-2.0: values no store can represent ([`validate::storable`](kernel_core::validate::storable):
/// an integer above `i64::MAX`, NUL in a nested object key or in a string, nesting deeper than
/// [`PAYLOAD_DEPTH_MAX`](kernel_core::validate::PAYLOAD_DEPTH_MAX)) are refused by `apply`
/// and `create` before the write, whatever the backend; nothing is written.
pub async fn k2_0_unrepresentable_values_are_refused(store: &DynStore) {
    refused_writes_nothing(store, |store| {
        Box::pin(async move {
            let deep = (0..=kernel_core::validate::PAYLOAD_DEPTH_MAX).fold(json!(1), |v, _| json!({ "n": v }));
            let values = [
                json!({ "amount": u64::MAX }),
                json!({ "a": [{ "b\u{0}c": 1 }] }),
                json!({ "a": [{ "b": "x\u{0}y" }] }),
                deep,
                json!({ "link": { "$ref": "x" } }),
            ];
            for v in values {
                let t = Transition::complete_step(1, "compose", v.clone(), DurationMs::from_millis(0), T0, false);
                assert_invalid_field(store.apply(&"wf-1".into(), &running("a"), &t).await, "output.compose");
                let t = Transition::yield_step(1, Some(v.clone()), DurationMs::from_millis(0), T0);
                assert_invalid_field(store.apply(&"wf-1".into(), &running("a"), &t).await, "steps.1.checkpoint");
                assert_invalid_field(store.create(bad_instance(|i| i.input = v.clone())).await, "input");
            }
        })
    })
    .await;
}

// --- names are data (K-2.0 amendment) -----------------------------------------------------

/// Pairs of names K-2.0 admits (1–256 bytes of UTF-8, no control character, no `$` prefix,
/// no `.`) where the second reads as the first once a JSON or path escape is decoded (or,
/// the last pair, once Unicode is normalized): a store that pastes a name into a path instead
/// of binding or escaping it addresses the first when asked for the second. Every store keeps
/// them apart (K-2.0 amendment).
pub const ESCAPE_LOOKALIKE_NAMES: [(&str, &str); 4] =
    [("xA", "x\\u0041"), ("é", "\\u00e9"), ("名前", "\\u540d\\u524d"), ("café", "cafe\u{301}")];

/// Pairs of names K-2.0 admits holding backslashes: a trailing one (it escapes the closing
/// quote of a quoted path label), one beside two, one inside. Each is data on every store.
pub const BACKSLASH_NAMES: [(&str, &str); 3] = [("tail", "tail\\"), ("\\", "\\\\"), ("a\\b", "a\\\\b")];

/// Pairs of names K-2.0 admits holding what a path or query language reads as syntax:
/// double quotes and their escapes, single quotes and SQL's escape of them, brackets. Each
/// is data on every store.
pub const QUOTE_NAMES: [(&str, &str); 5] =
    [("q", "q\""), ("a\"b", "a\\\"b"), ("\"", "\\u0022"), ("it's", "it''s"), ("a[0]", "a[0]*")];

/// Names with a control character (K-2.0 refuses them in every identifier and key): tab,
/// line feed, NUL, escape, DEL and a C1 control.
pub const CONTROL_CHARACTER_NAMES: [&str; 6] =
    ["tab\there", "line\nfeed", "nul\0byte", "esc\u{1b}[0m", "del\u{7f}", "c1\u{85}"];

/// Seed `wf-names` with one pending step per name of `pairs` and the outputs of the first
/// name of each pair; complete the steps of the second names in one write; then remove their
/// outputs (a loop's back-edge). After each write the stored instance equals the reference
/// semantics and every first name keeps its own output: writing or removing a name never
/// touches another. Six store operations.
async fn distinct_names_stay_distinct(store: &DynStore, pairs: &[(&str, &str)]) {
    let id = "wf-names";
    let mut inst = claimed(id, "a");
    inst.steps = pairs.iter().flat_map(|(a, b)| [*a, *b]).map(Step::pending).collect();
    inst.output = pairs.iter().map(|(a, _)| (a.to_string(), json!({ "of": a }))).collect();
    let inst = seed(store, inst).await;
    assert_eq!(store.get(&id.into()).await.unwrap().as_ref(), Some(&inst), "names read back as created");
    let second = |k: usize| 2 * k + 1;
    let mut t = Transition::complete_step(
        second(0),
        pairs[0].1,
        json!({ "of": pairs[0].1 }),
        DurationMs::from_millis(0),
        T0,
        false,
    );
    for (k, (_, b)) in pairs.iter().enumerate().skip(1) {
        t.outputs.push((b.to_string(), json!({ "of": b })));
        t.step_mut(second(k)).status = Some(StepStatus::Completed);
    }
    let outcome = store.apply(&id.into(), &running("a"), &t).await;
    assert!(matches!(outcome, Ok(WriteOutcome::Applied { .. })), "writing the second names: {outcome:?}");
    let after = store.get(&id.into()).await.unwrap().expect("instance");
    for (a, b) in pairs {
        assert_eq!(after.output.get(*a), Some(&json!({ "of": a })), "writing output `{b}` changed output `{a}`");
        assert_eq!(after.output.get(*b), Some(&json!({ "of": b })), "output `{b}` stored under its own name");
    }
    let mut expected = inst.clone();
    t.apply_to(&mut expected);
    assert_eq!(after, expected, "the stored instance equals Transition::apply_to");
    let resets = (0..pairs.len()).map(|k| (second(k), 1, Vec::new(), None)).collect();
    let unset = pairs.iter().map(|(_, b)| b.to_string()).collect();
    let t = Transition::loop_back(second(0), resets, unset, false, T0.plus(1));
    let outcome = store.apply(&id.into(), &running("a"), &t).await;
    assert!(matches!(outcome, Ok(WriteOutcome::Applied { .. })), "removing the second names: {outcome:?}");
    let removed = store.get(&id.into()).await.unwrap().expect("instance");
    for (a, b) in pairs {
        assert_eq!(removed.output.get(*a), Some(&json!({ "of": a })), "removing output `{b}` changed output `{a}`");
        assert_eq!(removed.output.get(*b), None, "output `{b}` removed");
    }
    t.apply_to(&mut expected);
    assert_eq!(removed, expected, "the stored instance equals Transition::apply_to");
}

/// K-2.0 (amendment): a name that reads as another once an escape is decoded (`x\u0041`
/// beside `xA`, `\u00e9` beside `é`, a decomposed `é` beside the composed one: no store
/// normalizes) is its own name on every store: created, written and removed without
/// touching the other.
pub async fn k2_0_escape_lookalike_names_stay_distinct(store: &DynStore) {
    distinct_names_stay_distinct(store, &ESCAPE_LOOKALIKE_NAMES).await;
}

/// K-2.0 (amendment): names with backslashes (a trailing one among them) are data on every
/// store: written and removed like any name, neither refused nor an outage, without touching
/// the names they resemble.
pub async fn k2_0_names_with_backslashes_are_data(store: &DynStore) {
    distinct_names_stay_distinct(store, &BACKSLASH_NAMES).await;
}

/// K-2.0 (amendment): names with double or single quotes or brackets are data on every
/// store: created, written and removed like any name, without touching the names they
/// resemble.
pub async fn k2_0_names_with_quotes_are_data(store: &DynStore) {
    distinct_names_stay_distinct(store, &QUOTE_NAMES).await;
}

/// K-2.0: a step or output name with a control character is refused identically on every
/// store, by the one validation of kernel-core, before anything is sent: as an output
/// written or removed by `apply`, as a step name or an output key in `create`; nothing is
/// written.
pub async fn k2_0_control_characters_in_names_are_refused(store: &DynStore) {
    refused_writes_nothing(store, |store| {
        Box::pin(async move {
            for name in CONTROL_CHARACTER_NAMES {
                let t = Transition::complete_step(1, name, json!(1), DurationMs::from_millis(0), T0, false);
                assert_invalid_field(store.apply(&"wf-1".into(), &running("a"), &t).await, "output");
                let t = Transition::loop_back(1, vec![(1, 1, Vec::new(), None)], vec![name.into()], false, T0);
                assert_invalid_field(store.apply(&"wf-1".into(), &running("a"), &t).await, "output");
                let i = bad_instance(|i| i.steps[1].name = name.into());
                assert_invalid_field(store.create(i).await, "steps[1].name");
                let i = bad_instance(|i| _ = i.output.insert(name.into(), json!(1)));
                assert_invalid_field(store.create(i).await, "output");
            }
        })
    })
    .await;
}
