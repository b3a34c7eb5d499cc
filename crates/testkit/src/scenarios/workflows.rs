//! The workflows of the seed's story and of the crash sweep.

use super::business::{Business, FakeAsr, FakeSummarizer};
use kernel_core::model_call::{ModelRequest, OutputSchema};
use kernel_core::ports::{DynOutbox, Signal};
use kernel_core::record::VersionRef;
use kernel_core::{
    ActivityContext, ActivityError, Definition, DurationMs, OnFailed, RetryPolicy, StepDef, StepOutcome,
};
use serde_json::{json, Value};
use std::sync::Arc;

/// Type of the subscription summary workflow.
pub const LIVE_SUMMARY: &str = "live_summary";
/// Type of the fan-out workflow that wakes the subscribers of a live.
pub const LIVE_FANOUT: &str = "live_fanout";
/// Polling interval of the ASR job, in ms.
pub const ASR_POLL_MS: i64 = 15_000;
/// Poll fallback of the "live ready" wait, in ms.
pub const LIVE_POLL_FALLBACK_MS: i64 = 600_000;

fn str_of<'a>(v: &'a Value, k: &str) -> Result<&'a str, ActivityError> {
    v.get(k).and_then(Value::as_str).ok_or_else(|| ActivityError::permanent(format!("input.{k} missing")))
}

/// The business object of the round (`input.object_id`), read by the one rule of
/// [`BusinessRound::of`](kernel_core::BusinessRound::of).
fn object_of(ctx: &ActivityContext) -> Result<&str, ActivityError> {
    ctx.round().object_id.as_deref().ok_or_else(|| ActivityError::permanent("input.object_id missing"))
}

/// The versioned output schema of the compose step's model call (K-17.4).
fn summary_schema() -> OutputSchema {
    OutputSchema::new(
        VersionRef::new("live-summary", "1"),
        json!({"type": "object", "required": ["summary"], "properties": {"summary": {"type": "string"}}}),
    )
    .expect("a valid JSON Schema")
}

/// A hook the demo uses to kill the process in the middle of compose.
pub type CrashHook = Arc<dyn Fn(&ActivityContext) + Send + Sync>;

/// The subscription summary of seed 000: preprocess waits for "live ready", transcribe
/// submits one ASR job and polls it with durable sleeps, compose writes a fenced result
/// while streaming, finalize closes the business object.
pub fn live_summary(biz: Arc<Business>, asr: Arc<FakeAsr>, crash_in_compose: Option<CrashHook>) -> Definition {
    let b1 = biz.clone();
    let preprocess = move |ctx: ActivityContext| {
        let biz = b1.clone();
        async move {
            let object_id = object_of(&ctx)?;
            let live_id = str_of(ctx.input(), "live_id")?;
            let token = ctx.fencing_token().unwrap_or_default();
            // The business fact is the truth; the signal is only a doorbell (K-9.3).
            if !biz.fact(&format!("live-ready:{live_id}")) {
                return Ok(StepOutcome::wait_for_signal("live_ready", live_id)
                    .poll_after_ms(LIVE_POLL_FALLBACK_MS)
                    .into());
            }
            // Idempotent precondition, re-established on every entry (K-2.3).
            if !biz.fenced(object_id, token, |o| {
                if o.status == "initial" {
                    o.status = "processing".into();
                    o.quota_held = true;
                }
            }) {
                return Err(ActivityError::canceled("the business round moved on"));
            }
            Ok(StepOutcome::complete(json!({ "live_id": live_id })))
        }
    };
    let a = asr.clone();
    let transcribe = move |ctx: ActivityContext| {
        let asr = a.clone();
        async move {
            if let Some(task_id) = ctx.checkpoint().and_then(|c| c.get("task_id")).and_then(Value::as_str) {
                // Reuse the committed task id; never submit again (seed 000 §10).
                let polls = ctx.checkpoint().and_then(|c| c.get("polls")).and_then(Value::as_u64).unwrap_or(0);
                return Ok(match asr.poll(task_id) {
                    Some(t) => StepOutcome::complete(json!({ "task_id": task_id, "transcript": t })),
                    None => StepOutcome::sleep(ASR_POLL_MS, json!({ "task_id": task_id, "polls": polls + 1 })),
                });
            }
            let task_id = asr.submit(&ctx.idempotency_key(), ctx.workflow_id(), ctx.workflow_run()).await;
            Ok(StepOutcome::sleep(ASR_POLL_MS, json!({ "task_id": task_id, "polls": 0 })))
        }
    };
    let b2 = biz.clone();
    let summarizer = Arc::new(FakeSummarizer::default());
    let compose = move |ctx: ActivityContext| {
        let biz = b2.clone();
        let crash = crash_in_compose.clone();
        let summarizer = summarizer.clone();
        async move {
            let object_id = object_of(&ctx)?;
            let token = ctx.fencing_token().unwrap_or_default().to_string();
            // Short-circuit when this round's result already exists (K-12).
            if let Some(obj) = biz.get(object_id) {
                if obj.fencing_token == token && obj.result.is_some() {
                    return Ok(StepOutcome::complete(json!({ "reused": true })));
                }
            }
            let transcript = ctx
                .output("transcribe")
                .and_then(|o| o.get("transcript"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            // A recorded model call (K-17.3): streamed while it generates, recorded with the
            // step before anything below runs, read back (never re-sampled) on a re-run.
            let request =
                ModelRequest::new("summary", VersionRef::new("live-summary", "1"), json!({ "transcript": transcript }));
            let answer = ctx.model(&*summarizer, request).await?;
            let summary = answer.get("summary").and_then(Value::as_str).unwrap_or_default().to_string();
            if !biz.fenced(object_id, &token, |o| o.result = Some(summary.clone())) {
                return Err(ActivityError::canceled("the business round moved on"));
            }
            if let Some(hook) = &crash {
                hook(&ctx);
            }
            Ok(StepOutcome::complete(json!({ "chars": summary.len() })))
        }
    };
    let b3 = biz.clone();
    let finalize = move |ctx: ActivityContext| {
        let biz = b3.clone();
        async move {
            let object_id = object_of(&ctx)?;
            let token = ctx.fencing_token().unwrap_or_default();
            let ok = biz.fenced(object_id, token, |o| {
                if o.result.is_some() {
                    o.status = "done".into();
                    o.quota_held = false;
                }
            });
            match biz.get(object_id) {
                Some(o) if ok && o.status == "done" => Ok(StepOutcome::complete(json!({ "status": "done" }))),
                _ if !ok => Err(ActivityError::canceled("the business round moved on")),
                _ => Err(ActivityError::transient("result not visible yet")),
            }
        }
    };
    let b4 = biz.clone();
    let notify = move |_ctx: ActivityContext| {
        let biz = b4.clone();
        async move {
            // Best effort: a failed notification never fails the finalizer (K-8).
            biz.notify();
            Ok(StepOutcome::complete(Value::Null))
        }
    };
    let b5 = biz;
    let on_failure = move |ctx: ActivityContext| {
        let biz = b5.clone();
        async move {
            let object_id = object_of(&ctx)?;
            let token = ctx.fencing_token().unwrap_or_default();
            biz.fenced(object_id, token, |o| {
                o.status = "failed".into();
                o.quota_held = false;
            });
            Ok(StepOutcome::complete(Value::Null))
        }
    };
    Definition::builder(LIVE_SUMMARY)
        .step(StepDef::new("preprocess", preprocess).timeout_ms(30_000).max_retry(2))
        .step(StepDef::new("transcribe", transcribe).timeout_ms(1_800_000).resource("speech_recognition"))
        .step(
            StepDef::new("compose", compose)
                .output_schema(summary_schema())
                .timeout_ms(900_000)
                .max_retry(1)
                .resource("content_generation")
                .streaming(),
        )
        .step(StepDef::new("finalize", finalize).timeout_ms(30_000).max_retry(2).retry(RetryPolicy::Immediate))
        .success_finalizer(notify)
        .failure_finalizer(on_failure)
        .build()
        .expect("valid definition")
}

/// The fan-out of K-10: set the business fact, then page through the subscribers, one
/// signal each with a stable id, yielding with the cursor.
pub fn live_fanout(biz: Arc<Business>, page_size: usize) -> Definition {
    Definition::builder(LIVE_FANOUT).step(announce(biz, page_size)).build().expect("valid definition")
}

/// Type of the fan-out that settles first ([`late_fanout`]).
pub const LATE_FANOUT: &str = "late_fanout";

/// [`live_fanout`] after a durable sleep of `delay_ms`, so its subscribers are already
/// waiting when their signals arrive (the signal activates a stored wait and the inbox
/// record is marked matched, K-9.3).
pub fn late_fanout(biz: Arc<Business>, page_size: usize, delay_ms: i64) -> Definition {
    let settle = move |ctx: ActivityContext| async move {
        if ctx.checkpoint().is_none() {
            return Ok(StepOutcome::sleep(delay_ms, json!({ "settled": true })));
        }
        Ok(StepOutcome::complete(json!({ "settled": true })))
    };
    Definition::builder(LATE_FANOUT)
        .step(StepDef::new("settle", settle))
        .step(announce(biz, page_size))
        .build()
        .expect("valid definition")
}

/// The fan-out step: set the fact `live-ready:<live_id>`, then deliver one page of
/// `live_ready` signals, yielding with the cursor until every subscriber has one.
fn announce(biz: Arc<Business>, page_size: usize) -> StepDef {
    let announce = move |ctx: ActivityContext| {
        let biz = biz.clone();
        async move {
            let live_id = str_of(ctx.input(), "live_id")?.to_string();
            biz.set_fact(&format!("live-ready:{live_id}"));
            let subs = biz.subscribers(&live_id);
            let cursor = ctx.checkpoint().and_then(|c| c.get("cursor")).and_then(Value::as_u64).unwrap_or(0) as usize;
            let end = (cursor + page_size).min(subs.len());
            for wf in &subs[cursor.min(end)..end] {
                let s = Signal::builder(wf.clone(), "live_ready")
                    .wait_key(live_id.clone())
                    .generation(0)
                    .signal_id(format!("live-ready:{live_id}:{wf}"))
                    .build()
                    .map_err(|e| ActivityError::transient(e.to_string()))?;
                ctx.signals().deliver(s).await.map_err(|e| ActivityError::transient(e.to_string()))?;
            }
            if end >= subs.len() {
                Ok(StepOutcome::complete(json!({ "delivered": subs.len() })))
            } else {
                Ok(StepOutcome::yield_with(json!({ "cursor": end })))
            }
        }
    };
    StepDef::new("announce", announce).max_retry(5).retry(RetryPolicy::Immediate)
}

/// A workflow whose second step fails for good; its failure finalizer writes the business
/// `failed` state (mandatory) and releases quota.
pub fn failing_charge(biz: Arc<Business>) -> Definition {
    let b1 = biz.clone();
    let reserve = move |ctx: ActivityContext| {
        let biz = b1.clone();
        async move {
            let object_id = object_of(&ctx)?;
            biz.fenced(object_id, ctx.fencing_token().unwrap_or_default(), |o| o.quota_held = true);
            Ok(StepOutcome::complete(json!({ "reserved": true })))
        }
    };
    let charge = move |ctx: ActivityContext| async move {
        if ctx.attempt() == 1 {
            Err(ActivityError::transient("payment API unavailable"))
        } else {
            Err(ActivityError::permanent("card declined"))
        }
    };
    let on_failure = move |ctx: ActivityContext| {
        let biz = biz.clone();
        async move {
            let object_id = object_of(&ctx)?;
            biz.fenced(object_id, ctx.fencing_token().unwrap_or_default(), |o| {
                o.status = "failed".into();
                o.quota_held = false;
            });
            Ok(StepOutcome::complete(Value::Null))
        }
    };
    Definition::builder("failing_charge")
        .step(StepDef::new("reserve", reserve))
        .step(
            StepDef::new("charge", charge).max_retry(1).retry(RetryPolicy::Exponential {
                base_ms: DurationMs::from_secs(1),
                cap_ms: DurationMs::from_secs(10),
            }),
        )
        .step(StepDef::new("receipt", |_ctx: ActivityContext| async { Ok(StepOutcome::complete(Value::Null)) }))
        .failure_finalizer(on_failure)
        .build()
        .expect("valid definition")
}

/// A diamond DAG: `fetch → {left, right} → join`; `right` sleeps once; `extra` may fail and is
/// skipped (`on_failed = skip`).
pub fn diamond(biz: Arc<Business>) -> Definition {
    let right = |ctx: ActivityContext| async move {
        if ctx.checkpoint().is_none() {
            return Ok(StepOutcome::sleep(5_000, json!({ "slept": true })));
        }
        Ok(StepOutcome::complete(json!("right")))
    };
    let join = move |ctx: ActivityContext| {
        let biz = biz.clone();
        async move {
            let object_id = object_of(&ctx)?;
            let l = ctx.output("left").cloned().unwrap_or(Value::Null);
            let r = ctx.output("right").cloned().unwrap_or(Value::Null);
            biz.fenced(object_id, ctx.fencing_token().unwrap_or_default(), |o| {
                o.result = Some(format!("{l}+{r}"));
                o.status = "done".into();
            });
            Ok(StepOutcome::complete(json!({ "joined": true })))
        }
    };
    Definition::builder("diamond")
        .step(StepDef::new("fetch", |_ctx: ActivityContext| async { Ok(StepOutcome::complete(json!("page"))) }))
        .step(
            StepDef::new("left", |_ctx: ActivityContext| async { Ok(StepOutcome::complete(json!("left"))) })
                .depends_on(["fetch"]),
        )
        .step(StepDef::new("right", right).depends_on(["fetch"]))
        .step(
            StepDef::new("extra", |_ctx: ActivityContext| async {
                Err::<StepOutcome, _>(ActivityError::permanent("optional enrichment failed"))
            })
            .depends_on(["fetch"])
            .on_failed(OnFailed::Skip),
        )
        .step(StepDef::new("join", join).depends_on(["left", "right", "extra"]))
        .build()
        .expect("valid definition")
}

/// The document-review loop with a branch (K-4 amendment): `collect` counts the documents
/// handed in — the applicant hands in one more per iteration key, so a re-run of one
/// iteration hands in nothing new — `check` sends the file back until three are in (at most
/// four times), `legal` runs only for files of more than ten documents (never here), and
/// `close` writes the business result under the round's fencing token.
pub fn review_loop(
    biz: Arc<Business>,
    handed_in: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
) -> Definition {
    let collect = move |ctx: ActivityContext| {
        let handed_in = handed_in.clone();
        async move {
            let documents = {
                let mut h = handed_in.lock().map_err(|_| ActivityError::transient("portal lock"))?;
                h.insert(ctx.idempotency_key());
                h.len()
            };
            Ok(StepOutcome::complete(json!({ "documents": documents })))
        }
    };
    let check = |ctx: ActivityContext| async move {
        let documents = ctx.output("collect").and_then(|o| o["documents"].as_u64()).unwrap_or(0);
        Ok(StepOutcome::complete(json!({ "complete": documents >= 3, "documents": documents })))
    };
    let close = move |ctx: ActivityContext| {
        let biz = biz.clone();
        async move {
            let object_id = object_of(&ctx)?;
            let documents = ctx.output("check").map(|o| o["documents"].clone()).unwrap_or(Value::Null);
            biz.fenced(object_id, ctx.fencing_token().unwrap_or_default(), |o| {
                o.result = Some(format!("documents={documents}"));
                o.status = "done".into();
            });
            Ok(StepOutcome::complete(json!({ "closed": true })))
        }
    };
    Definition::builder("review_loop")
        .step(StepDef::new("collect", collect))
        .step(StepDef::new("check", check).loop_to("collect", |out| out["complete"] != json!(true)).max_iterations(4))
        .step(
            StepDef::new("legal", |_ctx: ActivityContext| async { Ok(StepOutcome::complete(json!("reviewed"))) })
                .when(["check"], |o| o.output("check").is_some_and(|c| c["documents"].as_u64().unwrap_or(0) > 10)),
        )
        .step(StepDef::new("close", close))
        .build()
        .expect("valid definition")
}

/// A subscriber that only waits for its live, then records the result.
pub fn waiter(biz: Arc<Business>) -> Definition {
    let wait = move |ctx: ActivityContext| {
        let biz = biz.clone();
        async move {
            let object_id = object_of(&ctx)?;
            let live_id = str_of(ctx.input(), "live_id")?;
            if !biz.fact(&format!("live-ready:{live_id}")) {
                return Ok(StepOutcome::wait_for_signal("live_ready", live_id)
                    .poll_after_ms(LIVE_POLL_FALLBACK_MS)
                    .into());
            }
            biz.fenced(object_id, ctx.fencing_token().unwrap_or_default(), |o| {
                o.result = Some(format!("woken by {:?}", ctx.resume().map(|r| r.kind)));
                o.status = "done".into();
            });
            Ok(StepOutcome::complete(json!({ "woken": true })))
        }
    };
    Definition::builder("waiter").step(StepDef::new("await_live", wait)).build().expect("valid definition")
}

/// Type of the dispatch demo's workflow.
pub const ORDER: &str = "order";

/// A two-step workflow whose last step writes the business result fenced by the round, and
/// whose failure finalizer writes the business `failed` status.
pub fn order(outbox: Arc<DynOutbox>) -> Definition {
    let o1 = outbox.clone();
    let write = move |c: ActivityContext| {
        let outbox = o1.clone();
        async move {
            if c.input()["fail"] == json!(true) {
                return Err(ActivityError::permanent("payment declined"));
            }
            let round = c.round();
            let (id, f) =
                (round.object_id.clone().unwrap_or_default(), round.fencing_token.clone().unwrap_or_default());
            let ok = outbox
                .fenced_update(&id, &f, json!({ "result": format!("done in {f}") }), Some("done"))
                .await
                .map_err(|e| ActivityError::transient(e.to_string()))?;
            if !ok {
                return Err(ActivityError::canceled("the round moved on"));
            }
            Ok(StepOutcome::complete(json!({ "written": true })))
        }
    };
    let o2 = outbox;
    let on_failure = move |c: ActivityContext| {
        let outbox = o2.clone();
        async move {
            let round = c.round();
            let (id, f) =
                (round.object_id.clone().unwrap_or_default(), round.fencing_token.clone().unwrap_or_default());
            outbox
                .fenced_update(&id, &f, json!({ "error": "payment declined" }), Some("failed"))
                .await
                .map_err(|e| ActivityError::transient(e.to_string()))?;
            Ok(StepOutcome::complete(Value::Null))
        }
    };
    Definition::builder(ORDER)
        .step(StepDef::new("prepare", |_c: ActivityContext| async { Ok(StepOutcome::complete(json!(1))) }))
        .step(StepDef::new("write", write))
        .failure_finalizer(on_failure)
        .build()
        .unwrap()
}

/// A refund that reaches the side ports of a claim: `lookup` is a read-only model call
/// served through the result cache (K-17.7); `charge` holds quota and declares an inverse
/// that keeps failing, so the failure path escalates it to a person through the task inbox
/// (K-17.6); `verify` fails for good into a dead letter (K-17.2), which the operator fails;
/// the failure finalizer writes the business `failed` state.
pub fn refund(biz: Arc<Business>) -> Definition {
    let model = Arc::new(FakeSummarizer::default());
    let lookup = move |ctx: ActivityContext| {
        let model = model.clone();
        async move {
            let req =
                ModelRequest::new("vendor", VersionRef::new("vendor-check", "1"), json!({ "transcript": "acme" }))
                    .cached("tools-1", "vendors-1", DurationMs::from_secs(3_600));
            Ok(StepOutcome::complete(ctx.model(&*model, req).await?))
        }
    };
    let b1 = biz.clone();
    let charge = move |ctx: ActivityContext| {
        let biz = b1.clone();
        async move {
            let object_id = object_of(&ctx)?;
            biz.fenced(object_id, ctx.fencing_token().unwrap_or_default(), |o| o.quota_held = true);
            Ok(StepOutcome::complete(json!({ "charged": true })))
        }
    };
    let uncharge =
        |_ctx: ActivityContext| async { Err::<StepOutcome, _>(ActivityError::transient("ledger unavailable")) };
    let verify = |_ctx: ActivityContext| async { Err::<StepOutcome, _>(ActivityError::permanent("vendor unknown")) };
    let on_failure = move |ctx: ActivityContext| {
        let biz = biz.clone();
        async move {
            let object_id = object_of(&ctx)?;
            biz.fenced(object_id, ctx.fencing_token().unwrap_or_default(), |o| o.status = "failed".into());
            Ok(StepOutcome::complete(Value::Null))
        }
    };
    Definition::builder("refund")
        .step(StepDef::new("lookup", lookup).read_only())
        .step(StepDef::new("charge", charge).depends_on(["lookup"]).compensate_with(uncharge))
        .step(StepDef::new("verify", verify).depends_on(["charge"]).on_failed(OnFailed::DeadLetter))
        .failure_finalizer(on_failure)
        .build()
        .expect("valid definition")
}
