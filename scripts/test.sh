#!/usr/bin/env bash
# The whole test suite. Starts the servers it needs:
#   - Redis at $REDIS_URL (default redis://127.0.0.1:6379), started locally if `ping` fails;
#   - a Mongo-wire test server (scripts/mongo-wire.sh) unless $MONGODB_URI names one;
#   - headless Chromium and ChromeDriver (Debian's packages, installed when missing) for the
#     two browser checks.
# Under CI (CI=true or CI=1, the rule of testkit::ci) a missing server fails the run;
# elsewhere server tests skip with a reason.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/wfk-target}"
# Incremental caches would keep a second copy of every workspace crate's compilation on disk;
# a test run rebuilds from scratch what changed, which is as fast at this size.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}"

log() { printf '== %s\n' "$*"; }
# The CI rule of testkit::ci: CI=true or CI=1, any case, blanks ignored.
is_ci() {
  case "$(printf '%s' "${CI:-}" | tr -d '[:space:]' | tr '[:upper:]' '[:lower:]')" in
    true|1) return 0 ;;
    *) return 1 ;;
  esac
}

# Sections print their elapsed wall seconds when the next one starts and at exit, so a slow
# section shows in CI's output.
SECONDS=0
section_name=""
section_start=0
end_section() {
  if [ -n "$section_name" ]; then
    printf '== elapsed: %s s (%s), %s s in all\n' "$((SECONDS - section_start))" "$section_name" "$SECONDS"
  fi
  section_name=""
}
section() {
  end_section
  section_name="$*"
  section_start=$SECONDS
  log "$*"
}

# The architecture invariants a machine can check (dependency arrows, no production crate
# reaching test code, randomness from the id port, file sizes, test names): one script.
bash scripts/check-architecture.sh

if command -v redis-cli >/dev/null 2>&1 && ! redis-cli -u "$REDIS_URL" ping >/dev/null 2>&1; then
  case "$REDIS_URL" in
    redis://127.0.0.1:6379*|redis://localhost:6379*)
      log "starting redis-server on 127.0.0.1:6379"
      mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
      redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
        --dir "${TMPDIR:-/tmp}" >/dev/null || true
      for _ in $(seq 1 50); do redis-cli -u "$REDIS_URL" ping >/dev/null 2>&1 && break; sleep 0.1; done
      ;;
  esac
fi

started_mongo=""
if [ -z "${MONGODB_URI:-}" ] && [ -f scripts/mongo-wire.sh ]; then
  log "starting the Mongo-wire test server"
  if out=$(bash scripts/mongo-wire.sh start); then
    eval "$(printf '%s\n' "$out" | grep '^MONGODB_URI=')"
    export MONGODB_URI
    started_mongo=1
  elif is_ci; then
    echo "could not start the Mongo-wire test server" >&2
    exit 1
  fi
fi
REDIS_CLUSTER_DIR=""
exes=""
cleanup() {
  end_section
  [ -z "$exes" ] || rm -f "$exes"
  if [ -n "$REDIS_CLUSTER_DIR" ]; then
    bash scripts/redis-cluster.sh stop "$REDIS_CLUSTER_DIR" || true
  fi
  if [ -n "$started_mongo" ]; then
    echo "mongo-wire op counters of this run: $(bash scripts/mongo-wire.sh stats 2>/dev/null || echo unavailable)"
    bash scripts/mongo-wire.sh stop >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

# --- PostgreSQL (store-postgres) ---------------------------------------------------------
# The store-postgres tests use $DATABASE_URL, else the local server
# postgres://postgres@127.0.0.1:5432/test (trust authentication on 127.0.0.1). A local
# server that does not answer is started with `pg_ctlcluster 15 main start`; under CI a
# server that still does not answer fails the run (the tests fail too, by testkit::ci).
PG_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
pg_ready() { psql "$PG_URL" -Atqc 'SELECT 1' >/dev/null 2>&1; }
if command -v psql >/dev/null 2>&1 && ! pg_ready && [ -z "${DATABASE_URL:-}" ]; then
  log "starting the local PostgreSQL cluster"
  pg_ctlcluster 15 main start >/dev/null 2>&1 || true
  for _ in $(seq 1 50); do pg_ready && break; sleep 0.1; done
fi
if cargo tree -p kernel-core -p kernel-examples -e normal --prefix none | grep -Eq '^(tokio-postgres|deadpool-postgres|postgres-types) '; then
  echo "kernel-core and the first demo's package must not depend on a PostgreSQL crate" >&2
  exit 1
fi
if ! (command -v psql >/dev/null 2>&1 && pg_ready) && is_ci; then
  echo "no PostgreSQL server answers at $PG_URL" >&2
  exit 1
fi
# --- end PostgreSQL -----------------------------------------------------------------------

# Reports whose one-line summaries belong in the output run separately, uncaptured.
REPORTS=(crash_at_every_boundary crash_sweep_on_mongo refused_writes_report
  redis_outage_engines_complete_through_the_store_and_lanes_are_rebuilt)
# --- PostgreSQL (store-postgres): its reports run below, uncaptured ----------------------
REPORTS+=(crash_sweep_on_postgres races_over_concurrent_connections both_paths_survive_crashes_on_postgres
  store_queries_use_an_index live_summary_story_on_postgres)
# --- end PostgreSQL -----------------------------------------------------------------------
REPORTS+=(crash_sweep_on_sqlite both_paths_survive_crashes_on_sqlite model_steps_report control_report)
skip_args=()
for r in "${REPORTS[@]}"; do skip_args+=(--skip "$r"); done

if [ -n "${MONGODB_URI:-}" ] && [ -f scripts/mongo-wire.sh ]; then
  section "mongo-wire fidelity selftest"
  # One line when every check passes; every check's line when one fails.
  if selftest_out=$(bash scripts/mongo-wire.sh selftest "$MONGODB_URI"); then
    printf 'mongo-wire selftest: %s\n' "$(printf '%s\n' "$selftest_out" | tail -n 1)"
  else
    printf '%s\n' "$selftest_out"
    exit 1
  fi
fi

# --- One feature set for every section -------------------------------------------------
# `cargo test -p X` and `cargo run -p X` resolve features for X's dependency graph alone and
# rebuild every dependency whose features differ from the workspace build's: minutes and a
# second copy of those dependencies on disk per package. So every section below runs the
# executables built here, with the features `cargo test --workspace` uses (examples in the
# selection keep the dev-dependencies' features on, as in a test build). The one exception
# is the README's first command, run exactly as a newcomer types it.
section "build: every test, binary and example of the workspace, one feature set"
exes=$(mktemp)
cargo test --workspace --no-run --message-format=json-render-diagnostics | python3 scripts/workspace-exes.py >"$exes"
cargo build --workspace --bins --examples --message-format=json-render-diagnostics \
  | python3 scripts/workspace-exes.py >>"$exes"
echo "built: $(wc -l <"$exes") executables"
# ws_exe <package> <test|bin|example> <target>: the path of a built executable.
ws_exe() {
  local path
  path=$(awk -F'\t' -v p="$1" -v k="$2" -v t="$3" '$1 == p && $2 == k && $3 == t { print $4; exit }' "$exes")
  if [ -z "$path" ]; then
    echo "no $2 target $3 of package $1 was built" >&2
    return 1
  fi
  printf '%s\n' "$path"
}
# ws_test <package> <test target> [libtest arguments]: `cargo test -p <package> --test
# <target> -- <arguments>`, from the package's directory as cargo runs it.
ws_test() {
  local exe dir
  exe=$(ws_exe "$1" test "$2") || return 1
  dir=$(awk -F'\t' -v e="$exe" '$4 == e { print $5; exit }' "$exes")
  shift 2
  (cd "$dir" && "$exe" "$@")
}
# ws_run <package> <bin|example> <target> [arguments]: `cargo run -p <package> --bin|--example
# <target> -- <arguments>`.
ws_run() {
  local exe
  exe=$(ws_exe "$1" "$2" "$3") || return 1
  shift 3
  "$exe" "$@"
}

section "cargo test --workspace"
cargo test --workspace -- "${skip_args[@]}"

section "rustdoc (warnings and broken intra-doc links denied)"
RUSTDOCFLAGS='-D warnings' cargo doc --workspace --no-deps -q
echo "rustdoc: ok"

section "reports"
ws_test kernel-examples it crash_at_every_boundary --nocapture
ws_test store-mongo it crash_sweep_on_mongo --nocapture
ws_test store-mongo it refused_writes_report --nocapture
# --- PostgreSQL (store-postgres) ---------------------------------------------------------
ws_test store-postgres it --nocapture --exact sweep::crash_sweep_on_postgres \
  races::races_over_concurrent_connections outbox::crash_windows::both_paths_survive_crashes_on_postgres \
  explain::store_queries_use_an_index
# --- end PostgreSQL -----------------------------------------------------------------------
ws_test store-sqlite it --nocapture --exact sweep::crash_sweep_on_sqlite \
  outbox::crash_windows::both_paths_survive_crashes_on_sqlite
# Model steps (K-17): the invoice story under a crash at every boundary; counts from the
# scripted models, the query hook, the dead-letter store and the stored instances.
ws_test testkit engine model_steps::report::model_steps_report --nocapture --exact \
  | grep -E '^(model-steps:|test result)'
# Control beyond a DAG (loops, branches, event starts, bounded agents) under a crash at
# every boundary; counts from the fakes and the stored instances.
ws_test testkit engine control::sweep::control_report --nocapture --exact \
  | grep -E '^(control:|control sweep:|test result)'
# K-6.8: every side port hung in turn, through the engine's port envelope.
ws_test testkit engine port_deadlines::side_ports::a_hung_side_port_holds_no_claim_and_no_maintenance_pass --nocapture --exact \
  | grep -E '^(side-ports:|test result)'
# K-6.8: operator actions raced against claims, lease expiries and skewed clocks; counts
# from the activities, the store read before each write, the task inbox and the audit.
ws_test testkit engine operator_actions::races::operator_actions_raced_against_claims_keep_every_promise --nocapture --exact \
  | grep -E '^(operator-races:|test result)'
# The test world produces the faults (K-6.8): every write's reply lost once, and a lease
# lost mid-activity under skewed clocks; counts from the fakes and the store's audit.
ws_test testkit engine retries_and_errors::lost_replies:: claims_and_leases::lease_loss:: --nocapture \
  | grep -E '^(lost-replies:|lease-loss:|test result)'
# A dedicated redis-server on a free port is killed and restarted (never the shared one).
ws_test queue-redis it redis_outage_engines_complete_through_the_store_and_lanes_are_rebuilt --nocapture

section "Redis Cluster (3 local masters: the Redis adapters' suites, K-13/K-14/K-16)"
# A throw-away cluster on free ports (scripts/redis-cluster.sh stops exactly what it
# started). The same tests run on it as on the one server of "cargo test" above: every
# integration test of redis-conn (the connection), queue-redis (queue, wakeup,
# dispatch-candidates and result-cache conformance suites among them), permit-redis (its
# conformance suite) and sse-stream, and a worker on a cluster queue URL through compose.
# Left out: the permit benchmark smoke test (single connections to one node) and the
# migration of untagged keys (one server only).
cluster_out=$(bash scripts/redis-cluster.sh start)
eval "$(printf '%s\n' "$cluster_out" | grep '^REDIS_CLUSTER_')"
cluster_skips=(--skip bench_smoke --skip untagged_limits_of_an_earlier_version_migrate)
cluster_count() { grep -c ': test$' || true; }
single_node=0
for pkg in redis-conn queue-redis permit-redis sse-stream; do
  single_node=$((single_node + $(ws_test "$pkg" it "${cluster_skips[@]}" --list | cluster_count)))
done
single_node=$((single_node + $(ws_test compose it redis_queue --list | cluster_count)))
cluster_log=$(mktemp)
: >"$cluster_log"
cluster_ok=1
for pkg in redis-conn queue-redis permit-redis sse-stream; do
  REDIS_URL="$REDIS_CLUSTER_URL" ws_test "$pkg" it "${cluster_skips[@]}" >>"$cluster_log" 2>&1 || cluster_ok=""
done
REDIS_URL="$REDIS_CLUSTER_URL" ws_test compose it redis_queue >>"$cluster_log" 2>&1 || cluster_ok=""
suites=$(grep -c '^test result:' "$cluster_log" || true)
passed=$(sed -n 's/^test result: .* \([0-9][0-9]*\) passed;.*/\1/p' "$cluster_log" | awk '{ s += $1 } END { print s + 0 }')
crossslot=$(bash scripts/redis-cluster.sh errors "$REDIS_CLUSTER_DIR" | sed 's/^crossslot_errors=//')
echo "redis-cluster: nodes=3 suites=$suites passed=$passed crossslot_errors=$crossslot single_node_tests=$single_node"
if [ -z "$cluster_ok" ] || [ "$passed" != "$single_node" ] || [ "$crossslot" != 0 ]; then
  grep -E '^(test .*FAILED|---- |thread .*panicked|failures:)' -A3 "$cluster_log" | head -n 80 >&2 || true
  echo "the Redis Cluster run differs from the single server's" >&2
  exit 1
fi
rm -f "$cluster_log"
bash scripts/redis-cluster.sh stop "$REDIS_CLUSTER_DIR"
REDIS_CLUSTER_DIR=""

section "dispatch under fire (in-memory adapters)"
ws_run dispatch-recovery bin dispatch_recovery --seed 7 --requests 1000
if [ -n "${MONGODB_URI:-}" ]; then
  ws_run dispatch-recovery bin dispatch_recovery --seed 7 --requests 50 --backend mongo
fi
# --- PostgreSQL (store-postgres): the same run in a fresh schema, dropped at the end ------
if pg_ready || is_ci; then
  ws_run dispatch-recovery bin dispatch_recovery --seed 7 --requests 50 --backend postgres --store "$PG_URL"
fi

section "invoice evaluation (K-17.8: seven fault classes, kernel and all-agent baseline)"
# Seeded invoices under each fault class and all together, in memory and on SQLite; the
# duplicate side effects are counted by the fake ledger and mailer. The command exits
# non-zero when a kernel count is wrong. Report and chart go to a scratch directory.
invoice_tmp=$(mktemp -d)
ws_run invoice-pipeline bin invoice story | grep '^invoice-story:'
for store in memory sqlite; do
  ws_run invoice-pipeline bin invoice evaluate --invoices 200 --seed 7 --store "$store" \
    --out "$invoice_tmp/$store" | grep '^invoice-eval:' | sed "s/\$/ store=$store/"
done
rm -rf "$invoice_tmp"

section "browser check (headless chromium on the SSE example page)"
bash scripts/browser-check.sh

section "console in the browser (headless chromium over WebDriver: approve a human task in the page)"
# The ops console on a fresh SQLite file: log in, list, open the workflow waiting on its
# human task, approve it in the page, see it complete; then the status is read from the
# store itself and each screenshot checked as a PNG.
bash scripts/console-check.sh

section "real processes on SQLite: the README's first command, and SIGKILL/SIGSTOP under load"
# The demo's last line is its verdict (it exits non-zero when a count is wrong). Both keep
# their run directory (the database file) in $TMPDIR: a scratch one, removed afterwards.
real_tmp=$(mktemp -d)
TMPDIR="$real_tmp" cargo run -q -p kernel-examples --example live_summary | tail -n 1
TMPDIR="$real_tmp" ws_run kernel-examples example real_crash --processes 3 --workflows 200 \
  | grep '^real-crash:'
# The README's model-steps example: re-sample, cache hit, dead letter, operator retry, regenerate.
TMPDIR="$real_tmp" ws_run kernel-examples example model_steps | grep '^post:' | sed 's/^/model-steps example: /'
# The README's control examples: the review loop with an agent triage, and the webhook
# receiver starting and signaling order workflows.
TMPDIR="$real_tmp" ws_run kernel-examples example document_review | grep '^document-review:'
TMPDIR="$real_tmp" ws_run kernel-examples example webhook_events | grep '^webhook-events:'
rm -rf "$real_tmp"

section "demo smoke run (the simulated story)"
ws_run kernel-examples example live_summary --simulated >/dev/null
echo "demo: live_summary --simulated ok"
# The tracing example exits non-zero unless the activity's span joined the caller's trace.
ws_run kernel-metrics example otel_stdout >/dev/null
echo "demo: otel_stdout ok (the start request's trace context reached the activity)"
if [ -n "${MONGODB_URI:-}" ]; then
  ws_run store-mongo example live_summary_mongo >/dev/null
  echo "demo: live_summary on MongoDB ok"
fi
# --- PostgreSQL (store-postgres): the story with its durable state in a fresh schema -------
ws_test store-postgres it --nocapture --exact story::live_summary_story_on_postgres \
  | grep -E '^(demo:|SKIPPED|test result)'
# --- end PostgreSQL -----------------------------------------------------------------------

section "many worker processes on PostgreSQL + Redis: the soak (SIGKILL, SIGSTOP, a Redis restart)"
# Four worker processes, 2 000 workflows of four shapes, a permit ceiling shared by all; a
# chaos loop kills and restarts processes, stops one past its leases and restarts the soak's
# own redis-server (never the shared one). Judged from the store and the activities' oracle
# file after every process stopped; exits non-zero when a count is wrong or the cap is hit.
ws_run soak bin soak --store "$PG_URL" --processes 4 --workflows 2000 --redis-restart --cap-secs 120 | grep '^soak'

section "worker process (MongoDB + Redis + observer, separate publisher, SIGTERM)"
bash scripts/worker-check.sh
