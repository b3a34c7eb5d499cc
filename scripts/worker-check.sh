#!/usr/bin/env bash
# The production front door end to end: a worker process (examples/worker) on MongoDB +
# Redis + the observer, configured by WFK_STORE/WFK_QUEUE; a separate publisher process
# starts one workflow; the workflow's completion is read from the store itself (bounded
# wall time); SIGTERM must stop the worker with exit status 0. Prints
#   worker: store=mongo queue=redis workflow=<id> status=completed revision=<n> exit=0
# and exits non-zero otherwise. A random database and key prefix keep the shared servers
# clean; both are deleted at the end.
#
# Needs MONGODB_URI and Redis at $REDIS_URL (default redis://127.0.0.1:6379). Without
# MONGODB_URI it is skipped, except under CI=true, where that fails.
# Usage: bash scripts/worker-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/wfk-target}"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}"
WAIT_S="${WORKER_CHECK_TIMEOUT_S:-30}"

if [ -z "${MONGODB_URI:-}" ]; then
  # The CI rule of testkit::ci: CI=true or CI=1 (any case) makes a missing server a failure.
  case "$(printf '%s' "${CI:-}" | tr -d '[:space:]' | tr '[:upper:]' '[:lower:]')" in
    true|1) ci=1 ;;
    *) ci="" ;;
  esac
  if [ -n "$ci" ]; then
    echo "worker check: MONGODB_URI is required under CI (CI=true or CI=1)" >&2
    exit 1
  fi
  echo "SKIPPED worker check: MONGODB_URI unset"
  exit 0
fi
if command -v redis-cli >/dev/null 2>&1 && ! redis-cli -u "$REDIS_URL" ping >/dev/null 2>&1; then
  echo "worker check: Redis at $REDIS_URL does not answer" >&2
  exit 1
fi

# Every binary and example of the workspace, with the features of its test build (the
# examples keep dev-dependency features on; binaries alone would rebuild dependencies for a
# narrower set, see "One feature set" in scripts/test.sh). Fresh when run from the test script.
cargo build -q --workspace --bins --examples
BIN="$CARGO_TARGET_DIR/debug"

ns="wfk_worker_$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
mongo_base="${MONGODB_URI%%\?*}"
mongo_query="${MONGODB_URI#"$mongo_base"}"
export WFK_STORE="${mongo_base%/}/$ns$mongo_query"
case "$REDIS_URL" in
  *\?*) export WFK_QUEUE="$REDIS_URL&prefix=$ns" ;;
  *) export WFK_QUEUE="$REDIS_URL?prefix=$ns" ;;
esac

LOG="$(mktemp)"
worker_pid=""
destroyed=""
cleanup() {
  if [ -n "$worker_pid" ] && kill -0 "$worker_pid" 2>/dev/null; then
    kill -KILL "$worker_pid" 2>/dev/null || true
  fi
  if [ -z "$destroyed" ] && [ -n "${id:-}" ]; then
    "$BIN/status" --workflow "$id" --destroy >/dev/null 2>&1 || true
  fi
  rm -f "$LOG"
}
trap cleanup EXIT
fail() {
  echo "worker check: $*" >&2
  echo "--- worker log" >&2
  cat "$LOG" >&2
  exit 1
}

"$BIN/worker" --worker-id check-worker 2>"$LOG" &
worker_pid=$!

# A separate process, with the URLs as flags this time.
id="$("$BIN/publish" --store "$WFK_STORE" --queue "$WFK_QUEUE" 2>>"$LOG")" || fail "publish failed"
[ -n "$id" ] || fail "publish printed no workflow id"

deadline=$((SECONDS + WAIT_S))
line=""
while :; do
  line="$("$BIN/status" --workflow "$id" 2>>"$LOG")" || fail "status failed"
  case "$line" in *" status=completed "*) break ;; esac
  kill -0 "$worker_pid" 2>/dev/null || fail "the worker died before completion ($line)"
  [ "$SECONDS" -lt "$deadline" ] || fail "not completed within ${WAIT_S}s ($line)"
  sleep 0.5
done

kill -TERM "$worker_pid"
rc=0
wait "$worker_pid" || rc=$?
worker_pid=""

# The final record, read from the store after the worker is gone; then the namespace goes.
line="$("$BIN/status" --workflow "$id" --destroy 2>>"$LOG")" || fail "final status failed"
destroyed=1
echo "worker: $line exit=$rc"
case "$line" in *" status=completed "*) ;; *) fail "the store does not say completed: $line" ;; esac
[ "$rc" -eq 0 ] || fail "the worker exited with $rc after SIGTERM"
