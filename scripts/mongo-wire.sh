#!/usr/bin/env bash
# Start, check or stop the project's MongoDB-wire test server (tools/mongo-wire/front.py).
#
#   scripts/mongo-wire.sh [start] [PORT]   start in the background (free port unless given),
#                                          wait until it answers, print MONGODB_URI=...
#   scripts/mongo-wire.sh stop             stop the server this script started
#   scripts/mongo-wire.sh status           print MONGODB_URI=... if running, exit 1 if not
#   scripts/mongo-wire.sh stats            print the server's op counters
#   scripts/mongo-wire.sh selftest [URI]   run the fidelity checks against URI, or against the
#                                          server this script started
#
# Idempotent: `start` reuses a healthy server it started earlier. The Python virtualenv lives
# outside the repository (MONGO_WIRE_HOME, default ${XDG_CACHE_HOME:-$HOME/.cache}/durable-kernel)
# and is rebuilt when tools/mongo-wire/requirements.txt changes.
#
# Use from a shell:  eval "$(scripts/mongo-wire.sh start)"; export MONGODB_URI
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOL="$ROOT/tools/mongo-wire"
HOME_DIR="${MONGO_WIRE_HOME:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/durable-kernel}"
VENV="$HOME_DIR/mongo-venv"
RUN="$HOME_DIR/mongo-wire-run"
PY="${PYTHON:-python3}"
HOST=127.0.0.1

log() { echo "mongo-wire: $*" >&2; }

ensure_venv() {
  local stamp="$VENV/.requirements" want
  want="$(cat "$TOOL/requirements.txt")"
  if [[ -x "$VENV/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return
  fi
  log "creating virtualenv in $VENV"
  mkdir -p "$HOME_DIR"
  rm -rf "$VENV"
  if ! "$PY" -m venv "$VENV" >&2; then
    # Debian ships venv support separately; install it when we may.
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
      log "installing python3-venv"
      apt-get install -y -q python3-venv >&2 || { apt-get update -q >&2 && apt-get install -y -q python3-venv >&2; }
      rm -rf "$VENV"
      "$PY" -m venv "$VENV" >&2
    else
      log "python3 -m venv failed: install the python3-venv package"; exit 1
    fi
  fi
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$TOOL/requirements.txt" >&2
  printf '%s' "$want" >"$stamp"
}

# Answers a `ping` over the wire (pymongo comes with the venv).
ping() {
  "$VENV/bin/python" - "$1" <<'EOF' >/dev/null 2>&1
import sys, pymongo
c = pymongo.MongoClient(f"mongodb://127.0.0.1:{sys.argv[1]}", serverSelectionTimeoutMS=1000, directConnection=True)
c.admin.command("ping")
EOF
}

running_port() {
  [[ -f "$RUN/pid" && -f "$RUN/port" ]] || return 1
  local pid port
  pid="$(cat "$RUN/pid")"; port="$(cat "$RUN/port")"
  kill -0 "$pid" 2>/dev/null || return 1
  ping "$port" || return 1
  echo "$port"
}

start() {
  local want_port="${1:-0}" port pid
  ensure_venv
  if port="$(running_port)"; then
    if [[ "$want_port" == 0 || "$want_port" == "$port" ]]; then
      echo "MONGODB_URI=mongodb://$HOST:$port"
      return
    fi
    log "a server is already running on port $port; stop it first"
    exit 1
  fi
  mkdir -p "$RUN"
  rm -f "$RUN/port" "$RUN/pid"
  nohup "$VENV/bin/python" "$TOOL/front.py" --host "$HOST" --port "$want_port" \
    --port-file "$RUN/port" >"$RUN/log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$RUN/pid"
  for _ in $(seq 1 100); do
    if ! kill -0 "$pid" 2>/dev/null; then
      log "server exited during start-up:"; cat "$RUN/log" >&2; exit 1
    fi
    if [[ -s "$RUN/port" ]] && ping "$(cat "$RUN/port")"; then
      echo "MONGODB_URI=mongodb://$HOST:$(cat "$RUN/port")"
      return
    fi
    sleep 0.2
  done
  log "server did not answer within 20 s:"; cat "$RUN/log" >&2
  kill "$pid" 2>/dev/null || true
  exit 1
}

stop() {
  [[ -f "$RUN/pid" ]] || { log "not running"; return; }
  local pid; pid="$(cat "$RUN/pid")"
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    tail -n 1 "$RUN/log" >&2 || true
  fi
  rm -f "$RUN/pid" "$RUN/port"
}

case "${1:-start}" in
  start) start "${2:-0}" ;;
  stop) stop ;;
  status) port="$(running_port)" || { log "not running"; exit 1; }; echo "MONGODB_URI=mongodb://$HOST:$port" ;;
  stats)
    port="$(running_port)" || { log "not running"; exit 1; }
    "$VENV/bin/python" -c "import sys,pymongo; print(pymongo.MongoClient(f'mongodb://127.0.0.1:{sys.argv[1]}', directConnection=True).admin.command('serverStatus')['opcounters'])" "$port" ;;
  selftest)
    ensure_venv
    uri="${2:-}"
    if [[ -z "$uri" ]]; then
      port="$(running_port)" || { log "not running"; exit 1; }
      uri="mongodb://$HOST:$port"
    fi
    "$VENV/bin/python" "$TOOL/selftest.py" "$uri" ;;
  *) echo "usage: $0 [start [PORT]|stop|status|stats|selftest]" >&2; exit 2 ;;
esac
