#!/usr/bin/env bash
# A throw-away local Redis Cluster of 3 masters (no replicas, no persistence) on free ports,
# for the Redis adapters' suites. Never touches another server: it stops exactly the
# processes it started, by their pid files.
#
#   bash scripts/redis-cluster.sh start        # prints REDIS_CLUSTER_URL=… and REDIS_CLUSTER_DIR=…
#   bash scripts/redis-cluster.sh errors DIR   # prints crossslot_errors=<n> (INFO errorstats of every node)
#   bash scripts/redis-cluster.sh stop DIR     # stops the nodes and removes DIR
set -euo pipefail
NODES=3

free_port() {
  # A port whose cluster bus port (port + 10000) is free too.
  python3 - <<'EOF'
import random, socket
for _ in range(200):
    p = random.randint(20000, 29999)
    ok = True
    for q in (p, p + 10000):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", q))
        except OSError:
            ok = False
        finally:
            s.close()
    if ok:
        print(p)
        break
EOF
}

ports_of() { cat "$1/ports"; }

stop() {
  local dir="$1"
  [ -d "$dir" ] || return 0
  for pidfile in "$dir"/*/redis.pid; do
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  rm -rf "$dir"
}

case "${1:-}" in
  start)
    command -v redis-server >/dev/null && command -v redis-cli >/dev/null || {
      echo "redis-cluster: redis-server and redis-cli are required" >&2
      exit 1
    }
    dir=$(mktemp -d "${TMPDIR:-/tmp}/redis-cluster.XXXXXX")
    trap 'stop "$dir"' ERR
    ports=()
    for _ in $(seq 1 "$NODES"); do
      p=$(free_port)
      [ -n "$p" ] || { echo "redis-cluster: no free port" >&2; exit 1; }
      mkdir -p "$dir/$p"
      redis-server --port "$p" --bind 127.0.0.1 --dir "$dir/$p" --cluster-enabled yes \
        --cluster-config-file nodes.conf --cluster-node-timeout 2000 --appendonly no --save '' \
        --daemonize yes --pidfile "$dir/$p/redis.pid" --logfile "$dir/$p/redis.log" >/dev/null
      ports+=("$p")
    done
    printf '%s\n' "${ports[@]}" >"$dir/ports"
    for p in "${ports[@]}"; do
      for _ in $(seq 1 50); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.1; done
    done
    addrs=()
    for p in "${ports[@]}"; do addrs+=("127.0.0.1:$p"); done
    redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >"$dir/create.log" 2>&1 || {
      cat "$dir/create.log" >&2
      exit 1
    }
    ok=""
    for _ in $(seq 1 100); do
      ok=1
      for p in "${ports[@]}"; do
        redis-cli -p "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || ok=""
      done
      [ -n "$ok" ] && break
      sleep 0.1
    done
    [ -n "$ok" ] || { echo "redis-cluster: the cluster did not reach cluster_state:ok" >&2; exit 1; }
    echo "REDIS_CLUSTER_URL=redis+cluster://$(IFS=,; echo "${addrs[*]}")"
    echo "REDIS_CLUSTER_DIR=$dir"
    ;;
  errors)
    total=0
    for p in $(ports_of "$2"); do
      n=$(redis-cli -p "$p" info errorstats | tr -d '\r' | sed -n 's/^errorstat_CROSSSLOT:count=\([0-9]*\).*/\1/p')
      total=$((total + ${n:-0}))
    done
    echo "crossslot_errors=$total"
    ;;
  stop)
    stop "$2"
    ;;
  *)
    echo "usage: $0 start | errors DIR | stop DIR" >&2
    exit 2
    ;;
esac
