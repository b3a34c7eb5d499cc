#!/usr/bin/env bash
# Browser check of the ops console: headless Chromium (Debian's chromium and chromium-driver,
# installed when missing), driven over WebDriver by the ops-server example `console_check`,
# logs in, opens the workflow list, opens an invoice waiting on its human task (K-17.5),
# approves it in the page and waits until the page shows it completed; the example then
# reads the status from the store itself and prints
#   browser-console: pages=<n> approved_in_browser=true store_status=completed screenshots=<n>
# Exits non-zero on any failure. Never skipped: a missing browser is a failure. Needs no
# server: the deployment is a fresh SQLite file in a temporary directory.
#
# Usage: bash scripts/console-check.sh [<detail.png>]
#   <detail.png>: also copy the screenshot of the detail page there.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/wfk-target}"
INSTALL_TIMEOUT_S="${BROWSER_INSTALL_TIMEOUT_S:-900}"
CHECK_TIMEOUT_S="${BROWSER_CHECK_TIMEOUT_S:-120}"
SAVE_DETAIL="${1:-}"

log() { echo "console-check: $*" >&2; }

find_chromium() { command -v chromium || command -v chromium-browser || true; }
find_driver() { command -v chromedriver || true; }

if [ -z "$(find_chromium)" ] || [ -z "$(find_driver)" ]; then
  log "installing Debian's chromium and chromium-driver (timeout ${INSTALL_TIMEOUT_S}s)"
  export DEBIAN_FRONTEND=noninteractive
  if ! timeout "$INSTALL_TIMEOUT_S" apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1; then
    timeout "$INSTALL_TIMEOUT_S" apt-get update -qq >/dev/null
    timeout "$INSTALL_TIMEOUT_S" apt-get install -y -qq chromium chromium-driver >/dev/null
  fi
fi
CHROMIUM="$(find_chromium)"
CHROMEDRIVER="$(find_driver)"
[ -n "$CHROMIUM" ] || { log "chromium is not available"; exit 1; }
[ -n "$CHROMEDRIVER" ] || { log "chromedriver is not available"; exit 1; }

log "building the check"
# --workspace: the features of the workspace's test build (see "One feature set" in
# scripts/test.sh).
cargo build -q --workspace --example console_check
CHECK_BIN="$CARGO_TARGET_DIR/debug/examples/console_check"

WORK="$(mktemp -d)"
cleanup() {
  for _ in 1 2 3 4 5; do
    rm -rf "$WORK" 2>/dev/null && break
    sleep 0.5
  done
  return 0
}
trap cleanup EXIT

status=0
# The example bounds every wait itself and ends the chromedriver (and its browser) it
# started; the outer timeout is the last resort.
timeout --kill-after=10 "$((CHECK_TIMEOUT_S + 30))" "$CHECK_BIN" --out "$WORK/shots" \
  --chromium "$CHROMIUM" --chromedriver "$CHROMEDRIVER" --timeout-s "$CHECK_TIMEOUT_S" \
  >"$WORK/check.out" 2>"$WORK/check.err" || status=$?
line="$(grep '^browser-console:' "$WORK/check.out" || true)"
echo "${line:-browser-console: no result}"
if [ "$status" -ne 0 ] || ! grep -q 'approved_in_browser=true store_status=completed' <<<"$line"; then
  log "FAILED (exit $status)"; tail -n 20 "$WORK/check.err" >&2 || true
  exit 1
fi
if [ -n "$SAVE_DETAIL" ]; then
  mkdir -p "$(dirname "$SAVE_DETAIL")"
  cp "$WORK/shots/console-detail.png" "$SAVE_DETAIL"
  log "detail page screenshot saved to $SAVE_DETAIL"
fi
