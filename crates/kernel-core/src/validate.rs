//! The one validation rule of K-2.0, shared by the engine and every adapter.
//!
//! The functions here check single values: identifiers, names that become document keys,
//! payload sizes. The records that cross a port check themselves with them, and every
//! adapter (in memory or on a server) calls those checks before it writes, so all adapters
//! refuse exactly the same inputs:
//! [`WorkflowInstance::validate`](crate::domain::WorkflowInstance::validate) (store `create`),
//! [`Transition::validate`](crate::transition::Transition::validate) and
//! [`Guard::validate`](crate::transition::Guard::validate) (store `apply`),
//! [`ClaimSpec::validate`](crate::ports::ClaimSpec::validate) (store `claim`),
//! [`SignalRecord::validate`](crate::ports::SignalRecord::validate) (inbox `insert`),
//! [`OutboxAccept::validate`](crate::ports::OutboxAccept::validate) (outbox `accept`),
//! [`DeadLetter::validate_new`](crate::ports::DeadLetter::validate_new) (dead-letter
//! `record`) and [`DeadLetterDecision::validate`](crate::ports::DeadLetterDecision::validate)
//! (dead-letter `decide`).
//! A refusal is [`Error::InvalidInput`] and nothing is written.
//!
//! ```
//! use kernel_core::validate;
//! assert!(validate::identifier("biz_key", "content:tenant-1:object-42").is_ok());
//! assert!(validate::identifier("biz_key", "").is_err());
//! assert!(validate::key_name("step", "$where").is_err());
//! assert!(validate::key_name("step", "a.b").is_err());
//! ```

use crate::error::{Error, Result};
use crate::time::DurationMs;

/// Longest identifier in bytes.
pub const IDENTIFIER_BYTES_MAX: usize = 256;

/// Largest payload (an input, one output, one checkpoint, a business object's fields) a
/// store adapter accepts, as serialized JSON bytes: 256 KiB.
///
/// Every adapter refuses a larger payload with [`Error::InvalidInput`] through the record
/// checks named in the module docs; the in-memory adapters use this value and the MongoDB
/// adapters default to it. The engine's own `payload_bytes_max` (default 64 KiB) refuses
/// earlier, before a write is attempted.
pub const STORE_PAYLOAD_BYTES_MAX: usize = 256 * 1024;

/// Workflow ids, biz keys, signal ids and types, wait keys, tokens: 1–256 bytes of UTF-8 with
/// no NUL or other control character.
pub fn identifier(field: &str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if value.len() > IDENTIFIER_BYTES_MAX {
        return Err(Error::invalid(
            field,
            format_args!("{} bytes exceeds the limit of {IDENTIFIER_BYTES_MAX}", value.len()),
        ));
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(Error::invalid(field, format_args!("contains control character {:?}", c)));
    }
    Ok(())
}

/// A page or batch bound: `limit` in `1..=max`, else [`Error::InvalidInput`] on `field`.
pub fn limit_in(field: &str, limit: usize, max: usize) -> Result<()> {
    if (1..=max).contains(&limit) {
        Ok(())
    } else {
        Err(Error::invalid(field, format_args!("{limit} is not in 1..={max}")))
    }
}

/// A page of records ordered by id: [`limit_in`] `1..=max`, and the cursor `after`, when
/// given, follows the [`identifier`] rule.
pub fn page(after: Option<&str>, limit: usize, max: usize) -> Result<()> {
    limit_in("limit", limit, max)?;
    after.map_or(Ok(()), |a| identifier("after", a))
}

/// Names that become document keys (step names, resource names, output keys): the
/// [`identifier`] rule, and never starting with `$` nor containing `.`, so that a name can
/// never be read as a query operator or a nested path.
///
/// This is the whole rule, the same on every store: anything else — quotes, backslashes,
/// text that looks like an escape (`x\u0041`), non-ASCII — is admitted, and every store keeps
/// such a name as data, apart from every other name (K-2.0 amendment).
pub fn key_name(field: &str, value: &str) -> Result<()> {
    identifier(field, value)?;
    if value.starts_with('$') {
        return Err(Error::invalid(field, "must not start with `$`"));
    }
    if value.contains('.') {
        return Err(Error::invalid(field, "must not contain `.`"));
    }
    Ok(())
}

/// A dotted path into a business object (a field of an outbox's `fenced_update`, an
/// outbox's configured error field): segments separated by `.`, each a key name
/// ([`key_name`]), so `a.b` sets `b` inside `a`. Returns the segments. Every outbox adapter
/// checks a path with this function and nothing else, so every store admits the same paths;
/// an admitted segment is data (K-2.0 amendment: bound or escaped by the store, never pasted
/// into a path or query language), whatever quotes, backslashes or escape-like text it holds.
///
/// ```
/// use kernel_core::validate;
/// assert_eq!(validate::field_path("fields", "meta.x\\u0041").unwrap(), ["meta", "x\\u0041"]);
/// assert!(validate::field_path("fields", "a..b").is_err());
/// assert!(validate::field_path("fields", "meta.$set").is_err());
/// assert!(validate::field_path("fields", "tab\tx").is_err());
/// ```
pub fn field_path<'a>(field: &str, path: &'a str) -> Result<Vec<&'a str>> {
    path.split('.').map(|seg| key_name(field, seg).map(|()| seg)).collect()
}

/// Deepest nesting of objects and arrays inside a payload: 90 levels (a scalar is 0, `{}`
/// and `[]` are 1).
///
/// MongoDB documents its limit as 100 levels for a whole document; the store keeps a
/// payload at most four levels below the document root (`steps.<i>.checkpoint`,
/// `output.<name>`), so a payload within this limit fits with a margin, and serializers
/// that recurse per level stay far from their stack limits.
pub const PAYLOAD_DEPTH_MAX: usize = 90;

/// Largest stored workflow document, as serialized bytes: 16 MiB, MongoDB's limit for one
/// document (`BSONObjectTooLarge`).
///
/// The step count of a workflow is unbounded and each output is at most a payload, so a
/// document can outgrow this even when every single value is within
/// [`STORE_PAYLOAD_BYTES_MAX`]. A store refuses the write that would make it larger with
/// [`Error::InvalidInput`]: the in-memory store measures the document's serialized JSON
/// ([`document`]) against this value (or a smaller configured one), MongoDB its BSON
/// encoding, and the engine fails the step whose outcome the refused write carried.
pub const DOCUMENT_BYTES_MAX: usize = 16 * 1024 * 1024;

/// Object keys MongoDB reserves for DBRefs: a stored object carrying one must be a DBRef in
/// the server's order (`$ref`, `$id`, then `$db`), or the write is refused
/// (`InvalidDBRef`). Other `$`-prefixed keys are plain data (MongoDB ≥ 5.0).
const DBREF_KEYS: [&str; 3] = ["$ref", "$id", "$db"];

/// Whether every store can represent `value` (K-2.0): integers within the 64-bit signed
/// range (a JSON number above `i64::MAX` has no BSON type), strings and object keys without
/// NUL (BSON keys are C strings; PostgreSQL refuses `\u0000` anywhere in a `jsonb` value, so
/// one store's limit is every store's), keys other than the DBRef keys `$ref`, `$id` and
/// `$db` at any depth, and at most [`PAYLOAD_DEPTH_MAX`] levels of nesting.
/// Checked without recursion, so a pathologically deep value cannot overflow the stack.
pub fn storable(field: &str, value: &serde_json::Value) -> Result<()> {
    use serde_json::Value;
    let mut stack = vec![(value, 0usize)];
    while let Some((v, depth)) = stack.pop() {
        match v {
            Value::Number(n) if n.is_u64() && n.as_i64().is_none() => {
                return Err(Error::invalid(
                    field,
                    format_args!("integer {n} exceeds the 64-bit signed range a store can hold"),
                ));
            }
            Value::String(s) if s.contains('\0') => {
                return Err(Error::invalid(field, "a string contains NUL, which not every store can hold"));
            }
            Value::Array(items) => {
                let depth = nested(field, depth)?;
                stack.extend(items.iter().map(|x| (x, depth)));
            }
            Value::Object(map) => {
                let depth = nested(field, depth)?;
                for (k, x) in map {
                    if k.contains('\0') {
                        return Err(Error::invalid(field, format_args!("object key {k:?} contains NUL")));
                    }
                    if DBREF_KEYS.contains(&k.as_str()) {
                        return Err(Error::invalid(
                            field,
                            format_args!("object key {k:?} is reserved (a MongoDB DBRef field)"),
                        ));
                    }
                    stack.push((x, depth));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn nested(field: &str, depth: usize) -> Result<usize> {
    if depth >= PAYLOAD_DEPTH_MAX {
        return Err(Error::invalid(field, format_args!("nests deeper than the limit of {PAYLOAD_DEPTH_MAX} levels")));
    }
    Ok(depth + 1)
}

/// The size of a whole stored document (a workflow instance after a write), as serialized
/// JSON bytes, against `bytes_max` ([`DOCUMENT_BYTES_MAX`] unless a store is configured
/// smaller).
pub fn document(field: &str, doc: &impl serde::Serialize, bytes_max: usize) -> Result<()> {
    let bytes = serde_json::to_vec(doc).map_err(|e| Error::invalid(field, e))?.len();
    if bytes > bytes_max {
        return Err(Error::invalid(
            field,
            format_args!("the document would be {bytes} bytes, over the store's size limit of {bytes_max}"),
        ));
    }
    Ok(())
}

/// The check of a payload (input, output, checkpoint, business fields): [`storable`], then
/// the serialized size.
pub fn payload(field: &str, value: &serde_json::Value, bytes_max: usize) -> Result<()> {
    storable(field, value)?;
    let bytes = serde_json::to_vec(value).map_err(|e| Error::invalid(field, e))?.len();
    if bytes > bytes_max {
        return Err(Error::invalid(field, format_args!("{bytes} bytes exceeds the payload limit of {bytes_max}")));
    }
    Ok(())
}

/// Longest duration a configuration may hold: 100 years. Any clock reading plus this
/// stays far inside the range of [`Instant`](crate::time::Instant), so the engine's
/// `now + configured span` additions cannot overflow.
pub const CONFIG_MS_MAX: DurationMs = DurationMs::from_millis(100 * 365 * 24 * 3_600_000);

/// A configured duration: strictly positive and at most [`CONFIG_MS_MAX`].
pub fn config_ms(field: &str, ms: DurationMs) -> Result<()> {
    positive_ms(field, ms)?;
    if ms > CONFIG_MS_MAX {
        return Err(Error::invalid(
            field,
            format_args!("{ms} ms exceeds the longest configurable span of {CONFIG_MS_MAX} ms"),
        ));
    }
    Ok(())
}

/// A duration in milliseconds that must be strictly positive.
pub fn positive_ms(field: &str, ms: DurationMs) -> Result<()> {
    if ms <= 0 {
        return Err(Error::invalid(field, format_args!("must be > 0 ms, got {ms}")));
    }
    Ok(())
}

/// `id` when it is within [`IDENTIFIER_BYTES_MAX`], else `#` and its SHA-256 in hex: a
/// derived identifier (a task record's id, a signal id) that always passes the limit and
/// stays distinct per input.
pub fn bounded_identifier(id: String) -> String {
    if id.len() <= IDENTIFIER_BYTES_MAX {
        id
    } else {
        use sha2::Digest;
        format!("#{}", hex::encode(sha2::Sha256::digest(id.as_bytes())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifier_rule() {
        assert!(identifier("f", "a").is_ok());
        assert!(identifier("f", &"x".repeat(256)).is_ok());
        assert!(identifier("f", &"x".repeat(257)).is_err());
        assert!(identifier("f", "a\0b").is_err());
        assert!(identifier("f", "a\nb").is_err());
        assert!(identifier("f", "ünïcode-ok").is_ok());
        assert!(identifier("f", "$ne").is_ok(), "ids are data; only key names forbid `$`");
        assert!(key_name("f", "$ne").is_err());
        assert!(key_name("f", "steps.0").is_err());
        assert!(key_name("f", "compose_content").is_ok());
    }

    /// K-2.0 on a whole record: each `validate()` of a port record refuses exactly one bad
    /// field at a time and accepts the fixture it was derived from.
    mod records {
        use super::super::*;
        use crate::domain::*;
        use crate::id::{ClaimToken, ObjectId, WorkflowId};
        use crate::ports::*;
        use crate::transition::{Guard, Patch, Transition};
        use serde_json::json;

        const MAX: usize = 64;

        fn field_of(r: Result<()>) -> String {
            match r {
                Err(Error::InvalidInput { field, .. }) => field,
                other => panic!("expected InvalidInput, got {other:?}"),
            }
        }

        fn instance() -> WorkflowInstance {
            WorkflowInstance {
                workflow_id: "wf-1".into(),
                workflow_type: "summary".into(),
                biz_key: "biz:1".into(),
                status: WorkflowStatus::Waiting,
                steps: vec![Step::pending("fetch"), Step::pending("compose")],
                input: json!({"a": 1}),
                output: [("fetch".to_string(), json!(1))].into_iter().collect(),
                claimable_time: None,
                claim_token: Some("tok".into()),
                wait: Some(signal_wait("approved", "doc:42")),
                resume: Some(Resume { kind: ResumeKind::Signal, step_index: 1, signal_id: Some("sig-1".into()) }),
                definition_fingerprint: "fp".into(),
                fingerprint_mismatch: None,
                business_priority: Priority::P2,
                retry_count: 0,
                prepare_failures: 0,
                refused_writes: 0,
                revision: 0,
                created_at: Instant::ZERO,
                updated_at: Instant::ZERO,
                finished_at: None,
                compensation: None,
                trace_parent: None,
                operator_request: None,
            }
        }

        fn signal_wait(signal_type: &str, wait_key: &str) -> Wait {
            Wait::Signal {
                signal_type: signal_type.into(),
                wait_key: wait_key.into(),
                generation: 1,
                step_index: 1,
                poll_time: None,
            }
        }

        fn big() -> serde_json::Value {
            json!("x".repeat(MAX))
        }

        #[test]
        fn k2_0_workflow_instance_validate() {
            assert!(instance().validate(MAX).is_ok());
            type Edit = fn(&mut WorkflowInstance);
            let cases: [(Edit, &str); 12] = [
                (|i| i.workflow_id = WorkflowId::default(), "workflow_id"),
                (|i| i.biz_key = "b\0".into(), "biz_key"),
                (|i| i.workflow_type = "t\n".into(), "workflow_type"),
                (|i| i.definition_fingerprint = String::new(), "definition_fingerprint"),
                (|i| i.steps[1].name = "$where".into(), "steps[1].name"),
                (|i| i.steps[1].name = "fetch".into(), "steps[1].name"),
                (|i| i.steps[0].checkpoint = Some(big()), "steps[0].checkpoint"),
                (|i| i.input = big(), "input"),
                (|i| _ = i.output.insert("a.b".into(), json!(1)), "output"),
                (|i| i.claim_token = Some("t\0".into()), "claim_token"),
                (|i| i.wait = Some(signal_wait("approved", "doc\0")), "wait.wait_key"),
                (|i| i.resume.as_mut().unwrap().signal_id = Some(String::new()), "resume.signal_id"),
            ];
            for (edit, field) in cases {
                let mut i = instance();
                edit(&mut i);
                assert_eq!(field_of(i.validate(MAX)), field);
            }
        }

        #[test]
        fn k2_0_transition_validate() {
            let ok = Transition::complete_step(1, "compose", json!(1), DurationMs::ZERO, Instant::ZERO, false);
            assert!(ok.validate(MAX).is_ok());
            assert!(Transition::replay(json!({}), Instant::ZERO).validate(MAX).is_ok());
            let cases: Vec<(Transition, &str)> = vec![
                (Transition::complete_step(1, "$set", json!(1), DurationMs::ZERO, Instant::ZERO, false), "output"),
                (Transition::complete_step(1, "a.b", json!(1), DurationMs::ZERO, Instant::ZERO, false), "output"),
                (
                    Transition::complete_step(1, "compose", big(), DurationMs::ZERO, Instant::ZERO, false),
                    "output.compose",
                ),
                (Transition::yield_step(1, Some(big()), DurationMs::ZERO, Instant::ZERO), "steps.1.checkpoint"),
                (Transition::replay(big(), Instant::ZERO), "input"),
                (
                    Transition::suspend(1, signal_wait("approved", "k\0"), None, DurationMs::ZERO, Instant::ZERO),
                    "wait.wait_key",
                ),
                (
                    Transition::suspend(1, signal_wait("", "k"), None, DurationMs::ZERO, Instant::ZERO),
                    "wait.signal_type",
                ),
                (Transition::claim(&"tok\0".into(), Instant::ZERO, DurationMs::from_millis(1)).unwrap(), "claim_token"),
                (Transition::signal_activation(1, "", Instant::ZERO), "resume.signal_id"),
                (
                    {
                        let mut t = Transition::mark_running(1, Instant::ZERO);
                        t.steps.push(crate::transition::StepPatch::at(1));
                        t
                    },
                    "transition.steps",
                ),
                (
                    {
                        let mut t = Transition::replay(json!({}), Instant::ZERO);
                        t.step_mut(0).checkpoint = Some(Patch::Unset);
                        t
                    },
                    "transition",
                ),
            ];
            for (t, field) in cases {
                assert_eq!(field_of(t.validate(MAX)), field, "{:?}", t.kinds().collect::<Vec<_>>());
            }
            // A cleared checkpoint or token is not a payload or an identifier.
            let mut t = Transition::release(Instant::ZERO);
            t.claim_token = Some(Patch::Unset);
            t.step_mut(0).checkpoint = Some(Patch::Unset);
            assert!(t.validate(0).is_ok());
        }

        #[test]
        fn k2_0_guard_and_claim_spec_validate() {
            assert!(Guard::Active.validate().is_ok());
            assert!(Guard::SignalWait(signal_wait("a", "k").signal_identity().unwrap()).validate().is_ok());
            assert_eq!(field_of(Guard::Token { token: ClaimToken::default() }.validate()), "claim_token");
            assert_eq!(field_of(Guard::Failing { token: "a\u{7}".into() }.validate()), "claim_token");
            assert_eq!(
                field_of(Guard::Claimable { now: Instant::ZERO, types: vec!["t\0".into()] }.validate()),
                "types"
            );
            let id = signal_wait("a", "k\0").signal_identity().unwrap();
            assert_eq!(field_of(Guard::SignalWait(id).validate()), "wait_key");

            let spec = ClaimSpec {
                now: Instant::from_millis(5),
                lease_ms: DurationMs::from_millis(10),
                token: "tok".into(),
                types: vec!["t".into()],
            };
            assert!(spec.validate().is_ok());
            assert_eq!(
                spec.transition(),
                Transition::claim(&"tok".into(), 5.into(), 10.into()),
                "the claim's own transition"
            );
            assert_eq!(field_of(ClaimSpec { token: "t\0".into(), ..spec.clone() }.validate()), "claim_token");
            assert_eq!(field_of(ClaimSpec { lease_ms: DurationMs::ZERO, ..spec.clone() }.validate()), "lease_ms");
            assert_eq!(field_of(ClaimSpec { types: vec![String::new()], ..spec.clone() }.validate()), "types");
            // A lease end past the range of time is refused before any write.
            let overflowing = ClaimSpec { lease_ms: DurationMs::MAX, ..spec };
            assert_eq!(field_of(overflowing.validate()), "lease_ms");
            assert_eq!(field_of(overflowing.transition().map(|_| ())), "lease_ms");
        }

        #[test]
        fn definition_and_dispatch_config_refuse_spans_that_could_overflow() {
            use crate::definition::{Definition, RetryPolicy, StepDef};
            use crate::dispatch::DispatchConfig;
            let noop = |_| async { Ok(crate::StepOutcome::complete(json!(null))) };
            let build = |s: StepDef| Definition::builder("t").step(s).build().map(|_| ());
            assert!(build(StepDef::new("a", noop).timeout_ms(CONFIG_MS_MAX)).is_ok());
            assert_eq!(field_of(build(StepDef::new("a", noop).timeout_ms(DurationMs::MAX))), "steps[0].timeout_ms");
            let policy = RetryPolicy::Exponential { base_ms: DurationMs::from_millis(1), cap_ms: DurationMs::MAX };
            assert_eq!(field_of(build(StepDef::new("a", noop).retry(policy))), "steps[0].retry.cap_ms");
            assert!(DispatchConfig::default().validate().is_ok());
            let huge = DispatchConfig { lease_ms: DurationMs::MAX, ..DispatchConfig::default() };
            assert_eq!(field_of(huge.validate()), "lease_ms");
            let huge = DispatchConfig { realtime_grace_ms: DurationMs::MAX, ..DispatchConfig::default() };
            assert_eq!(field_of(huge.validate()), "realtime_grace_ms");
        }

        #[test]
        fn k2_0_signal_record_validate() {
            let r = SignalRecord {
                signal_id: "sig-1".into(),
                workflow_id: "wf-1".into(),
                signal_type: "approved".into(),
                wait_key: "doc:42".into(),
                generation: 1,
                status: SignalStatus::Pending,
                created_at: Instant::ZERO,
                match_time: None,
                orphan: false,
            };
            assert!(r.validate().is_ok());
            assert_eq!(field_of(SignalRecord { signal_id: String::new(), ..r.clone() }.validate()), "signal_id");
            assert_eq!(field_of(SignalRecord { workflow_id: "w\0".into(), ..r.clone() }.validate()), "workflow_id");
            assert_eq!(field_of(SignalRecord { signal_type: "x".repeat(257), ..r.clone() }.validate()), "signal_type");
            assert_eq!(field_of(SignalRecord { wait_key: "doc\0".into(), ..r }.validate()), "wait_key");
        }

        #[test]
        fn k2_0_dead_letter_validate() {
            let dl = DeadLetter {
                id: "wf-1:charge:0".into(),
                workflow_id: "wf-1".into(),
                workflow_type: "order".into(),
                step: "charge".into(),
                step_index: 1,
                run: 0,
                epoch: 0,
                error: StepError { class: ErrorClass::Permanent, message: "m".repeat(DEAD_LETTER_MESSAGE_BYTES_MAX) },
                inputs: json!({"a": 1}),
                created_at: Instant::ZERO,
                status: DeadLetterStatus::Open,
                decision: None,
                closed_at: None,
            };
            assert!(dl.validate_new().is_ok());
            let retry = DeadLetterDecision {
                action: DeadLetterAction::Retry,
                actor: "ops".into(),
                reason: Some("r".repeat(DEAD_LETTER_REASON_BYTES_MAX)),
                decided_at: Instant::ZERO,
            };
            assert!(retry.validate().is_ok());
            let message = |m: &str| StepError { class: ErrorClass::Transient, message: m.to_string() };
            let huge = "x".repeat(STORE_PAYLOAD_BYTES_MAX);
            let cases: Vec<(DeadLetter, &str)> = vec![
                (DeadLetter { id: String::new(), ..dl.clone() }, "id"),
                (DeadLetter { workflow_id: "w\0".into(), ..dl.clone() }, "workflow_id"),
                (DeadLetter { workflow_type: "t\n".into(), ..dl.clone() }, "workflow_type"),
                (DeadLetter { step: "a.b".into(), ..dl.clone() }, "step"),
                (
                    DeadLetter { error: message(&"m".repeat(DEAD_LETTER_MESSAGE_BYTES_MAX + 1)), ..dl.clone() },
                    "error.message",
                ),
                (DeadLetter { error: message("a\0"), ..dl.clone() }, "error.message"),
                (DeadLetter { inputs: json!(huge), ..dl.clone() }, "inputs"),
                (
                    DeadLetter { status: DeadLetterStatus::Decided, decision: Some(retry.clone()), ..dl.clone() },
                    "status",
                ),
                (DeadLetter { decision: Some(retry.clone()), ..dl.clone() }, "decision"),
                (DeadLetter { closed_at: Some(Instant::ZERO), ..dl.clone() }, "closed_at"),
                (
                    DeadLetter {
                        decision: Some(DeadLetterDecision { actor: String::new(), ..retry.clone() }),
                        ..dl.clone()
                    },
                    "decision.actor",
                ),
            ];
            for (d, field) in cases {
                assert_eq!(field_of(d.validate_new()), field, "{}", d.id);
            }
            let bad =
                DeadLetterDecision { reason: Some("r".repeat(DEAD_LETTER_REASON_BYTES_MAX + 1)), ..retry.clone() };
            assert_eq!(field_of(bad.validate()), "decision.reason");
            let bad = DeadLetterDecision { action: DeadLetterAction::Complete { output: json!(u64::MAX) }, ..retry };
            assert_eq!(field_of(bad.validate()), "decision.output");
            assert_eq!(field_of(validate_dead_letter_list(None, 0)), "limit");
            assert_eq!(field_of(validate_dead_letter_list(None, DEAD_LETTER_LIST_MAX + 1)), "limit");
            assert_eq!(field_of(validate_dead_letter_list(Some(""), 1)), "after");
            assert!(validate_dead_letter_list(Some("a"), DEAD_LETTER_LIST_MAX).is_ok());
            assert_eq!(field_of(validate_dead_letter_purge(0)), "limit");
            assert_eq!(field_of(validate_dead_letter_purge(DEAD_LETTER_PURGE_MAX + 1)), "limit");
            assert!(validate_dead_letter_purge(DEAD_LETTER_PURGE_MAX).is_ok());
        }

        #[test]
        fn dead_letter_serde_is_snake_case() {
            let d = DeadLetterDecision {
                action: DeadLetterAction::Complete { output: json!({"x": 1}) },
                actor: "ops".into(),
                reason: None,
                decided_at: Instant::from_millis(5),
            };
            let v = serde_json::to_value(&d).unwrap();
            assert_eq!(v, json!({"action": {"kind": "complete", "output": {"x": 1}}, "actor": "ops", "decided_at": 5}));
            assert_eq!(serde_json::from_value::<DeadLetterDecision>(v).unwrap(), d);
            assert_eq!(serde_json::to_value(DeadLetterStatus::Decided).unwrap(), json!("decided"));
        }

        #[test]
        fn k2_0_accept_request_validate() {
            let intent =
                DispatchIntent::pending("summary", "biz:1", &"f1".into(), json!({}), Priority::P2, Instant::ZERO);
            let fields = json!({"title": "x"});
            let (doc, empty) = (ObjectId::from("doc-1"), ObjectId::default());
            let req = OutboxAccept { object_id: &doc, fields: &fields, initial_status: "new", intent: &intent };
            assert!(req.validate(MAX).is_ok());
            let dollar = json!({"$set": 1});
            let dotted = json!({"a.b": 1});
            let oversize = json!({"blob": "x".repeat(MAX)});
            let array = json!([1]);
            let bad_token = DispatchIntent { fencing_token: "f\0".into(), ..intent.clone() };
            let bad_biz = DispatchIntent { biz_key: String::new(), ..intent.clone() };
            let bad_input = DispatchIntent { input: Some(big()), ..intent.clone() };
            let cases: Vec<(OutboxAccept<'_>, &str)> = vec![
                (OutboxAccept { object_id: &empty, ..req }, "object_id"),
                (OutboxAccept { initial_status: "n\0", ..req }, "initial_status"),
                (OutboxAccept { fields: &dollar, ..req }, "fields"),
                (OutboxAccept { fields: &dotted, ..req }, "fields"),
                (OutboxAccept { fields: &oversize, ..req }, "fields"),
                (OutboxAccept { fields: &array, ..req }, "fields"),
                (OutboxAccept { intent: &bad_token, ..req }, "fencing_token"),
                (OutboxAccept { intent: &bad_biz, ..req }, "biz_key"),
                (OutboxAccept { intent: &bad_input, ..req }, "workflow_dispatch.input"),
            ];
            for (r, field) in cases {
                assert_eq!(field_of(r.validate(MAX)), field, "{r:?}");
            }
        }

        #[test]
        fn k2_0_dispatch_accept_request_validate() {
            use crate::dispatch::AcceptRequest;
            let req = AcceptRequest {
                object_id: "doc-1".into(),
                fields: json!({}),
                workflow_type: "summary".into(),
                biz_key: "biz:1".into(),
                fencing_token: "f1".into(),
                input: json!({"fencing_token": "f1"}),
                priority: Priority::P2,
            };
            assert!(req.validate().is_ok());
            let cases: Vec<(AcceptRequest, &str)> = vec![
                (AcceptRequest { object_id: "d\0".into(), ..req.clone() }, "object_id"),
                (AcceptRequest { workflow_type: String::new(), ..req.clone() }, "workflow_type"),
                (AcceptRequest { biz_key: "b\n".into(), ..req.clone() }, "biz_key"),
                (AcceptRequest { fencing_token: "f\0".into(), ..req.clone() }, "fencing_token"),
                (AcceptRequest { input: json!({"fencing_token": "f0"}), ..req.clone() }, "input.fencing_token"),
            ];
            for (r, field) in cases {
                assert_eq!(field_of(r.validate()), field, "{r:?}");
            }
        }
    }

    #[test]
    fn storable_values() {
        use serde_json::json;
        assert!(storable("output", &json!({"a": [i64::MAX, i64::MIN, 1.5, "x y"]})).is_ok());
        let e = storable("output", &json!({"a": [1, {"b": "x\u{0}y"}]})).unwrap_err();
        assert!(e.to_string().contains("NUL"), "{e}");
        assert!(storable("output", &json!(u64::MAX)).is_err());
        assert!(storable("output", &json!({"a": [{"b": (i64::MAX as u64) + 1}]})).is_err());
        assert!(storable("output", &json!({"a": {"b\u{0}": 1}})).is_err());
        for key in ["$ref", "$id", "$db"] {
            assert!(storable("output", &json!({"a": [{ key: 1 }]})).is_err(), "{key}");
        }
        assert!(storable("output", &json!({"q": {"$gt": 1, "$ne": null}})).is_ok(), "other operators are data");
        let deep = |n: usize| (0..n).fold(json!(1), |v, _| json!([v]));
        assert!(storable("output", &deep(PAYLOAD_DEPTH_MAX)).is_ok());
        let e = storable("output", &deep(PAYLOAD_DEPTH_MAX + 1)).unwrap_err();
        assert!(e.to_string().contains("nests deeper"), "{e}");
        // Refused before the size check serializes it.
        assert!(payload("output", &deep(500), usize::MAX).is_err());
    }

    #[test]
    fn document_limit() {
        let v = serde_json::json!({"a": "x".repeat(100)});
        assert!(document("document", &v, 1000).is_ok());
        let e = document("document", &v, 50).unwrap_err();
        assert!(e.to_string().contains("size limit"), "{e}");
    }

    #[test]
    fn payload_limit() {
        let v = serde_json::json!({"a": "x".repeat(100)});
        assert!(payload("input", &v, 1000).is_ok());
        assert!(payload("input", &v, 50).is_err());
    }
}
