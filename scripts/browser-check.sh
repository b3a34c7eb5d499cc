#!/usr/bin/env bash
# Browser check of the progress stream (K-16): headless Chromium (Debian's package, installed
# when missing) opens the sse-stream example page, follows the live-summary compose stream
# with EventSource through a forced reconnect, and reports to the example server, which
# compares the final result with the stored instance and prints
#   browser-sse: frames_before_reconnect=<n> reconnects=<m> final_matches=true
# Exits non-zero on any failure. Never skipped: a missing browser or Redis is a failure.
#
# Needs Redis at $REDIS_URL (default redis://127.0.0.1:6379; started locally if it does not
# answer). Usage: bash scripts/browser-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/wfk-target}"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}"
INSTALL_TIMEOUT_S="${BROWSER_INSTALL_TIMEOUT_S:-900}"
CHECK_TIMEOUT_S="${BROWSER_CHECK_TIMEOUT_S:-120}"

log() { echo "browser-check: $*" >&2; }

find_chromium() { command -v chromium || command -v chromium-browser || true; }

if [ -z "$(find_chromium)" ]; then
  log "installing Debian's chromium (timeout ${INSTALL_TIMEOUT_S}s)"
  export DEBIAN_FRONTEND=noninteractive
  if ! timeout "$INSTALL_TIMEOUT_S" apt-get install -y -qq chromium >/dev/null 2>&1; then
    timeout "$INSTALL_TIMEOUT_S" apt-get update -qq >/dev/null
    timeout "$INSTALL_TIMEOUT_S" apt-get install -y -qq chromium >/dev/null
  fi
fi
CHROMIUM="$(find_chromium)"
[ -n "$CHROMIUM" ] || { log "chromium is not available"; exit 1; }

if command -v redis-cli >/dev/null 2>&1 && ! redis-cli -u "$REDIS_URL" ping >/dev/null 2>&1; then
  case "$REDIS_URL" in
    redis://127.0.0.1:6379*|redis://localhost:6379*)
      log "starting redis-server on 127.0.0.1:6379"
      redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
        --dir "${TMPDIR:-/tmp}" >/dev/null
      for _ in $(seq 1 50); do redis-cli -u "$REDIS_URL" ping >/dev/null 2>&1 && break; sleep 0.1; done
      ;;
  esac
fi

log "building the example server"
# --workspace: the features of the workspace's test build, so nothing is rebuilt for this
# package's narrower feature set (see "One feature set" in scripts/test.sh).
cargo build -q --workspace --example sse_server
SERVER_BIN="$CARGO_TARGET_DIR/debug/examples/sse_server"

WORK="$(mktemp -d)"
server_pid=""; browser_pid=""
cleanup() {
  # Chromium forks helpers that keep writing to the profile: end the whole process group.
  if [ -n "$browser_pid" ]; then
    kill -TERM -- "-$browser_pid" 2>/dev/null || kill "$browser_pid" 2>/dev/null || true
  fi
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  for _ in 1 2 3 4 5; do
    rm -rf "$WORK" 2>/dev/null && break
    sleep 0.5
  done
  return 0
}
trap cleanup EXIT

"$SERVER_BIN" --port 0 --check >"$WORK/server.out" 2>"$WORK/server.err" &
server_pid=$!
url=""
for _ in $(seq 1 100); do
  url="$(sed -n 's/^listening on //p' "$WORK/server.out" | head -n1)"
  [ -n "$url" ] && break
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$url" ]; then
  log "the example server did not start"; cat "$WORK/server.err" >&2; exit 1
fi
log "server at $url; driving headless chromium"

setsid "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --disable-dev-shm-usage --user-data-dir="$WORK/profile" "$url" >"$WORK/browser.log" 2>&1 &
browser_pid=$!

status=0
if ! timeout "$CHECK_TIMEOUT_S" tail --pid="$server_pid" -f /dev/null; then
  log "timed out after ${CHECK_TIMEOUT_S}s"; status=1
fi
wait "$server_pid" || status=$?
server_pid=""
cat "$WORK/server.err" >&2
line="$(grep '^browser-sse:' "$WORK/server.out" || true)"
echo "${line:-browser-sse: no result}"
if [ "$status" -ne 0 ] || ! grep -q 'final_matches=true' <<<"$line"; then
  log "FAILED"; tail -n 20 "$WORK/browser.log" >&2 || true
  exit 1
fi
