//! Table tests of the step logic: the K-7.4 classification order and wave resolution (K-4.5).

use super::*;
use crate::activity::SignalWaitSpec;
use crate::domain::StepStatus;
use crate::transition::{AttemptChange, Patch, TransitionKind};
use serde_json::json;
use std::cell::Cell;

const NOW: Instant = Instant::from_millis(1_000_000);

/// `NOW + ms`.
fn at(ms: i64) -> Instant {
    NOW.checked_add(DurationMs::from_millis(ms)).unwrap()
}

fn ms(n: i64) -> DurationMs {
    DurationMs::from_millis(n)
}
const LIMIT: usize = 64;

fn entry(attempt: u32, max_retry: u32, on_failed: OnFailed) -> Entry {
    Entry {
        index: 2,
        attempt,
        elapsed_ms: ms(7),
        now: NOW,
        policy: StepPolicy {
            max_retry,
            retry: RetryPolicy::Exponential { base_ms: ms(1_000), cap_ms: ms(60_000) },
            on_failed,
            max_retry_duration: None,
        },
        payload_bytes_max: LIMIT,
        error_message_bytes_max: 16,
        retrying_since: None,
        park_ms: ms(3_600_000),
        dead_letter: None,
    }
}

fn err(class: ErrorClass, message: &str) -> StepError {
    StepError { class, message: message.into() }
}

/// Classify with a jitter source that counts its draws.
fn run(result: Result<StepOutcome, ActivityError>, e: &Entry) -> (StepResult, u32) {
    let draws = Cell::new(0);
    let r = classify(result, e, || {
        draws.set(draws.get() + 1);
        u64::MAX
    });
    (r, draws.get())
}

fn big() -> Value {
    json!("x".repeat(LIMIT + 1))
}

fn timer(poll_time: Instant) -> Wait {
    Wait::Timer { step_index: 2, due: Some(poll_time) }
}

fn signal(spec: SignalWaitSpec) -> Result<StepOutcome, ActivityError> {
    Ok(StepOutcome::WaitForSignal(spec))
}

/// Name, invocation result, entry facts, expected result, jitter draws.
type Row = (&'static str, Result<StepOutcome, ActivityError>, Entry, StepResult, u32);

#[test]
fn k7_4_classification_order_row_by_row() {
    use ErrorClass::*;
    let stop = OnFailed::Stop;
    let skip = OnFailed::Skip;
    let halt = StepResult::Halt;
    let failed = |class, m: &str| halt(Halt::Failed { error: err(class, m), elapsed_ms: ms(7) });
    let skipped = |class, m: &str| StepResult::Skipped { error: err(class, m), elapsed_ms: ms(7) };
    // The exponential policy at attempt n with jitter u64::MAX: MAX % (ceiling + 1).
    let retry = |class, m: &str, attempt: u32| {
        let delay_ms = RetryPolicy::Exponential { base_ms: ms(1_000), cap_ms: ms(60_000) }.delay_ms(attempt, u64::MAX);
        halt(Halt::Retry { error: err(class, m), delay_ms, elapsed_ms: ms(7) })
    };
    let too_big = |field: &str| format!("invalid {field}: 67 bytes exceeds the payload limit of {LIMIT}");
    #[rustfmt::skip]
    let table: Vec<Row> = vec![
        // Completion and requests taken as they are.
        ("complete", Ok(StepOutcome::complete(json!({"n": 1}))), entry(1, 0, stop),
            StepResult::Complete { output: json!({"n": 1}), elapsed_ms: ms(7) }, 0),
        ("sleep", Ok(StepOutcome::sleep(500, json!(1))), entry(1, 0, stop),
            halt(Halt::Suspend { wait: timer(at(500)), checkpoint: Some(json!(1)), elapsed_ms: ms(7) }), 0),
        ("yield", Ok(StepOutcome::yield_with(json!(2))), entry(1, 0, stop),
            halt(Halt::Yield { checkpoint: Some(json!(2)), elapsed_ms: ms(7) }), 0),
        // Row 1: canceled, even with retries left and a skip policy.
        ("canceled", Err(ActivityError::canceled("gone")), entry(1, 5, skip),
            halt(Halt::Canceled { error: err(Canceled, "gone"), elapsed_ms: ms(7) }), 0),
        // Row 2: retryable within max_retry (attempt <= max_retry).
        ("transient within", Err(ActivityError::transient("busy")), entry(1, 2, stop), retry(Transient, "busy", 1), 1),
        ("transient at the edge", Err(ActivityError::transient("busy")), entry(2, 2, skip), retry(Transient, "busy", 2), 1),
        ("unknown within", Err(ActivityError::unknown_outcome("lost")), entry(1, 1, stop), retry(UnknownOutcome, "lost", 1), 1),
        // ... and beyond it: row 3 or 4.
        ("transient beyond", Err(ActivityError::transient("busy")), entry(3, 2, stop), failed(Transient, "busy"), 0),
        ("unknown beyond, skip", Err(ActivityError::unknown_outcome("lost")), entry(2, 1, skip), skipped(UnknownOutcome, "lost"), 0),
        // A permanent error is never retried.
        ("permanent", Err(ActivityError::permanent("no")), entry(1, 5, stop), failed(Permanent, "no"), 0),
        // Row 3: on_failed = skip.
        ("permanent, skip", Err(ActivityError::permanent("no")), entry(1, 5, skip), skipped(Permanent, "no"), 0),
        // Messages are cut at error_message_bytes_max (16), on a character boundary.
        ("long message", Err(ActivityError::permanent("0123456789abcdefXYZ")), entry(1, 0, stop),
            failed(Permanent, "0123456789abcdef"), 0),
        ("multibyte cut", Err(ActivityError::permanent("0123456789abcdeé")), entry(1, 0, stop),
            failed(Permanent, "0123456789abcde"), 0),
        // K-2.0 amendment: control characters become spaces before any store sees them, so a
        // transient error is retried the same way on every store.
        ("NUL in a transient error", Err(ActivityError::transient("busy\0now")), entry(1, 1, stop),
            retry(Transient, "busy now", 1), 1),
        ("line breaks and C1", Err(ActivityError::permanent("a\nb\r\tc\u{85}d\u{7f}")), entry(1, 0, stop),
            failed(Permanent, "a b  c d "), 0),
        // Invalid results become permanent errors, then go through the same order.
        ("output too large", Ok(StepOutcome::complete(big())), entry(1, 5, stop), failed(Permanent, &too_big("output")[..16]), 0),
        ("output too large, skip", Ok(StepOutcome::complete(big())), entry(1, 5, skip), skipped(Permanent, &too_big("output")[..16]), 0),
        ("checkpoint too large (sleep)", Ok(StepOutcome::sleep(500, big())), entry(1, 5, stop),
            failed(Permanent, &too_big("checkpoint")[..16]), 0),
        ("checkpoint too large (yield)", Ok(StepOutcome::yield_with(big())), entry(1, 0, stop),
            failed(Permanent, &too_big("checkpoint")[..16]), 0),
        ("checkpoint too large (signal)", signal(StepOutcome::wait_for_signal("t", "k").checkpoint(big())), entry(1, 0, stop),
            failed(Permanent, &too_big("checkpoint")[..16]), 0),
        ("sleep of 0 ms", Ok(StepOutcome::Sleep { delay_ms: ms(0), checkpoint: None }), entry(1, 5, stop),
            failed(Permanent, "invalid sleep.de"), 0),
        ("bad signal type", signal(StepOutcome::wait_for_signal("", "k")), entry(1, 0, stop),
            failed(Permanent, "invalid signal_t"), 0),
        ("bad wait key", signal(StepOutcome::wait_for_signal("t", "a\0b")), entry(1, 0, skip),
            skipped(Permanent, "invalid wait_key"), 0),
        ("bad poll delay", signal(StepOutcome::wait_for_signal("t", "k").poll_after_ms(-1)), entry(1, 0, stop),
            failed(Permanent, "invalid poll_aft"), 0),
    ];
    for (name, result, e, expect, draws) in table {
        assert_eq!(run(result, &e), (expect, draws), "{name}");
    }
}

#[test]
fn a_signal_wait_carries_its_identity_and_poll_fallback() {
    // K-9.1, K-9.5, K-9.6
    let spec =
        StepOutcome::wait_for_signal("approved", "order-1").generation(3).poll_after_ms(250).checkpoint(json!(9));
    let (r, _) = run(signal(spec), &entry(1, 0, OnFailed::Stop));
    let wait = Wait::Signal {
        signal_type: "approved".into(),
        wait_key: "order-1".into(),
        generation: 3,
        step_index: 2,
        poll_time: Some(at(250)),
    };
    assert_eq!(r, StepResult::Halt(Halt::Suspend { wait, checkpoint: Some(json!(9)), elapsed_ms: ms(7) }));
    let (r, _) = run(signal(StepOutcome::wait_for_signal("approved", "order-1")), &entry(1, 0, OnFailed::Stop));
    let StepResult::Halt(Halt::Suspend { wait, checkpoint, .. }) = r else { panic!("{r:?}") };
    assert_eq!((wait.poll_time(), checkpoint), (None, None), "no poll fallback, no checkpoint");
}

#[test]
fn k7_a_due_time_past_the_range_of_time_is_a_permanent_error() {
    // `now + delay` is checked: an overflowing sleep or poll fallback is a bad request,
    // classified like any other invalid result (K-7.4), never a wrapped time.
    let huge = ms(i64::MAX);
    let sleep = Ok(StepOutcome::sleep(huge, json!(1)));
    let expect =
        StepResult::Halt(Halt::Failed { error: err(ErrorClass::Permanent, "invalid sleep.de"), elapsed_ms: ms(7) });
    assert_eq!(run(sleep, &entry(1, 5, OnFailed::Stop)), (expect, 0));
    let poll = signal(StepOutcome::wait_for_signal("t", "k").poll_after_ms(i64::MAX));
    let expect = StepResult::Skipped { error: err(ErrorClass::Permanent, "invalid poll_aft"), elapsed_ms: ms(7) };
    assert_eq!(run(poll, &entry(1, 5, OnFailed::Skip)), (expect, 0));
    // The longest sleep that still fits is taken as it is.
    let longest = ms(i64::MAX - NOW.as_millis());
    let (r, _) = run(Ok(StepOutcome::sleep(longest, json!(1))), &entry(1, 0, OnFailed::Stop));
    let StepResult::Halt(Halt::Suspend { wait, .. }) = r else { panic!("{r:?}") };
    assert_eq!(wait.poll_time(), Some(Instant::MAX));
    // The whole message names the field and the overflow.
    let e = NOW.try_add(huge, "sleep.delay_ms").unwrap_err();
    assert_eq!(e.to_string(), format!("invalid sleep.delay_ms: {NOW} + {huge} ms overflows"));
}

// ---- K-4.5 wave resolution ----

fn e(class: ErrorClass) -> StepError {
    err(class, "x")
}
fn canceled() -> Halt {
    Halt::Canceled { error: e(ErrorClass::Canceled), elapsed_ms: ms(1) }
}
fn failed() -> Halt {
    Halt::Failed { error: e(ErrorClass::Permanent), elapsed_ms: ms(2) }
}
fn retry(delay_ms: i64) -> Halt {
    Halt::Retry { error: e(ErrorClass::Transient), delay_ms: ms(delay_ms), elapsed_ms: ms(3) }
}
fn deferred(delay_ms: i64) -> Halt {
    Halt::Deferred { delay_ms: ms(delay_ms) }
}
fn suspend(poll_time: Instant) -> Halt {
    Halt::Suspend { wait: timer(poll_time), checkpoint: Some(json!("s")), elapsed_ms: ms(4) }
}
fn yielded() -> Halt {
    Halt::Yield { checkpoint: Some(json!("y")), elapsed_ms: ms(5) }
}

/// The kind of the winning write (its first kind) and the step it concerns (its first
/// step patch).
fn winner(r: &Resolution) -> (TransitionKind, u32) {
    (r.transition.kind(), r.transition.steps[0].index)
}

#[test]
fn k4_5_rank_is_canceled_failed_retry_deferral_suspend_yield() {
    // The pinned order, deferral between retry and suspend.
    let order = [canceled(), failed(), retry(10), deferred(10), suspend(at(10)), yielded()];
    let ranks: Vec<u8> = order.iter().map(Halt::rank).collect();
    assert!(ranks.windows(2).all(|w| w[0] > w[1]), "{ranks:?}");
    // Every pair, in both positions: the more severe wins wherever it stands.
    let kinds = [
        TransitionKind::Canceled,
        TransitionKind::StepFailed,
        TransitionKind::RetryRelease,
        TransitionKind::PermitDeferral,
        TransitionKind::SuspendClaim,
        TransitionKind::Yield,
    ];
    for (a, ha) in order.iter().enumerate() {
        for (b, hb) in order.iter().enumerate() {
            if a == b {
                continue;
            }
            let r = resolve_wave(vec![(0, Some(ha.clone())), (1, Some(hb.clone()))], NOW).unwrap();
            let (w, step) = if a < b { (a, 0) } else { (b, 1) };
            assert_eq!(winner(&r), (kinds[w], step), "{a} vs {b}");
        }
    }
}

#[test]
fn k4_5_each_winner_writes_its_transition_and_says_what_follows() {
    #[rustfmt::skip]
    let table: Vec<(Halt, Transition, AfterWave)> = vec![
        (canceled(), Transition::activity_canceled(1, e(ErrorClass::Canceled), ms(1), NOW), AfterWave::Canceled),
        (failed(), Transition::step_failed(1, e(ErrorClass::Permanent), ms(2), NOW), AfterWave::Failing),
        (retry(40), Transition::step_retry(1, e(ErrorClass::Transient), ms(3), NOW).release_until(at(40)),
            AfterWave::Released { at: at(40) }),
        (deferred(30), Transition::permit_deferral(1, ms(30), NOW).release_until(at(30)),
            AfterWave::Released { at: at(30) }),
        (suspend(at(9)), Transition::suspend(1, timer(at(9)), Some(json!("s")), ms(4), NOW),
            AfterWave::Suspended { wait: timer(at(9)) }),
        (yielded(), Transition::yield_step(1, Some(json!("y")), ms(5), NOW), AfterWave::Yielded { at: NOW }),
    ];
    for (halt, transition, then) in table {
        // Alone, and next to a committed completion: the completion adds nothing.
        let alone = resolve_wave(vec![(1, Some(halt.clone()))], NOW).unwrap();
        assert_eq!(alone, Resolution { transition: transition.clone(), then: then.clone() });
        let with_done = resolve_wave(vec![(0, None), (1, Some(halt)), (2, None)], NOW).unwrap();
        assert_eq!(with_done, Resolution { transition, then });
    }
}

#[test]
fn k4_5_a_wave_of_completions_and_skips_continues() {
    assert_eq!(resolve_wave(vec![(0, None), (1, None)], NOW), None);
    assert_eq!(resolve_wave(vec![], NOW), None);
}

#[test]
fn k4_5_ties_go_to_the_earliest_step() {
    let r = resolve_wave(vec![(3, None), (4, Some(failed())), (5, Some(failed()))], NOW).unwrap();
    assert_eq!(winner(&r), (TransitionKind::StepFailed, 4));
    let r = resolve_wave(vec![(3, Some(yielded())), (4, Some(yielded()))], NOW).unwrap();
    assert_eq!(winner(&r), (TransitionKind::Yield, 3));
}

#[test]
fn k4_5_parked_siblings_roll_the_attempt_back_and_keep_their_checkpoint() {
    let r = resolve_wave(vec![(0, Some(suspend(at(5)))), (1, Some(retry(20))), (2, Some(yielded()))], NOW).unwrap();
    assert_eq!(winner(&r), (TransitionKind::RetryRelease, 1));
    let t = &r.transition;
    for (index, cp, elapsed) in [(0, "s", 4), (2, "y", 5)] {
        let p = t.steps.iter().find(|p| p.index == index).expect("a sibling patch");
        assert_eq!(p.status, Some(StepStatus::Pending), "step {index}");
        assert_eq!(p.attempt, Some(AttemptChange::Inc(-1)), "step {index}");
        assert_eq!(p.checkpoint, Some(Patch::Set(json!(cp))), "step {index}");
        assert_eq!(p.elapsed_ms_inc, elapsed, "step {index}");
    }
    // Only the winner touches the claim, and no wait is stored.
    assert_eq!(t.wait, None);
    assert_eq!(t.status, None);
    assert_eq!(t.claimable_time, Some(Patch::Set(at(20))));
    assert_eq!(t.claim_token, Some(Patch::Unset));
    assert_eq!(r.then, AfterWave::Released { at: at(20) });
}

#[test]
fn k4_5_a_retry_waits_for_the_longest_sibling_retry_delay() {
    let r = resolve_wave(vec![(0, Some(retry(10))), (1, Some(retry(70))), (2, Some(deferred(500)))], NOW).unwrap();
    assert_eq!(winner(&r), (TransitionKind::RetryRelease, 0));
    assert_eq!(r.transition.claimable_time, Some(Patch::Set(at(70))), "the deferral's delay does not count");
    assert_eq!(r.then, AfterWave::Released { at: at(70) });
    // The retrying sibling records its own error; the deferred one its traffic wait.
    let p1 = r.transition.steps.iter().find(|p| p.index == 1).unwrap();
    assert_eq!((p1.status, p1.error.clone()), (Some(StepStatus::Pending), Some(Patch::Set(e(ErrorClass::Transient)))));
    let p2 = r.transition.steps.iter().find(|p| p.index == 2).unwrap();
    assert_eq!((p2.traffic_waits_inc, p2.traffic_wait_ms_inc, p2.attempt), (1, ms(500), None));
}

#[test]
fn k4_5_failed_siblings_fail_too_and_every_sibling_write_is_fused() {
    // Siblings follow the wave order with the last step taking the winner's place.
    let wave = vec![(0, Some(failed())), (1, Some(suspend(at(1)))), (2, None), (3, Some(failed()))];
    let r = resolve_wave(wave, NOW).unwrap();
    let expect = Transition::step_failed(0, e(ErrorClass::Permanent), ms(2), NOW)
        .fuse(Transition::step_failed(3, e(ErrorClass::Permanent), ms(2), NOW))
        .fuse(Transition::park_sibling(1, Some(json!("s")), ms(4), NOW));
    assert_eq!(r, Resolution { transition: expect, then: AfterWave::Failing });
}

#[test]
fn k4_5_a_canceled_winner_drops_its_siblings() {
    let wave = vec![(0, Some(yielded())), (1, Some(failed())), (2, Some(canceled())), (3, Some(canceled()))];
    let r = resolve_wave(wave, NOW).unwrap();
    assert_eq!(
        r,
        Resolution {
            transition: Transition::activity_canceled(2, e(ErrorClass::Canceled), ms(1), NOW),
            then: AfterWave::Canceled
        }
    );
}

#[test]
fn k4_5_a_deferral_wins_over_suspend_and_yield_and_parks_them() {
    let r = resolve_wave(vec![(0, Some(yielded())), (1, Some(suspend(at(3)))), (2, Some(deferred(15)))], NOW).unwrap();
    let expect = Transition::permit_deferral(2, ms(15), NOW)
        .release_until(at(15))
        .fuse(Transition::park_sibling(0, Some(json!("y")), ms(5), NOW))
        .fuse(Transition::park_sibling(1, Some(json!("s")), ms(4), NOW));
    assert_eq!(r, Resolution { transition: expect, then: AfterWave::Released { at: at(15) } });
}

/// K-17.2 amendment: what an entry into a step sees as its previous error, row by row — a
/// lost attempt is an unknown outcome (so a declared outcome query runs first), an unknown
/// outcome stays as it was, and a step that was not lost keeps its error.
#[test]
fn k17_2_a_lost_attempt_is_an_unknown_outcome_row_by_row() {
    use ErrorClass::*;
    let lost = "the previous attempt was lost (crash or lease loss)";
    type Row = (&'static str, bool, Option<StepError>, Option<(ErrorClass, String)>);
    let rows: Vec<Row> = vec![
        ("not lost, no error", false, None, None),
        ("not lost, transient", false, Some(e(Transient)), Some((Transient, "x".into()))),
        ("lost, first attempt", true, None, Some((UnknownOutcome, lost.into()))),
        (
            "lost after a transient error",
            true,
            Some(e(Transient)),
            Some((UnknownOutcome, format!("{lost}; before it: x"))),
        ),
        ("lost after an unknown outcome", true, Some(e(UnknownOutcome)), Some((UnknownOutcome, "x".into()))),
    ];
    for (name, was_lost, previous, want) in rows {
        let got = after_lost_attempt(was_lost, previous).map(|e| (e.class, e.message));
        assert_eq!(got, want, "{name}");
    }
}
