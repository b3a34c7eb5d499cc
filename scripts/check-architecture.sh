#!/usr/bin/env bash
# The architecture invariants a machine can check (ARCHITECTURE.md, "Codemap" and
# "Architecture invariants"). Each check prints what broke it and the script exits 1.
# Needs only cargo (for `cargo tree`, offline) and grep; run by scripts/test.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."

failed=0
fail() {
  printf 'architecture: %s\n' "$*" >&2
  failed=1
}
# deps <package>: the package's normal dependencies, one name a line, itself left out.
deps() {
  cargo tree -p "$1" -e normal --prefix none --format '{p}' 2>/dev/null \
    | awk '{ print $1 }' | grep -vx "$1" | sort -u
}
# direct_deps <package>: its direct normal dependencies.
direct_deps() {
  cargo tree -p "$1" -e normal --depth 1 --prefix none --format '{p}' 2>/dev/null \
    | awk '{ print $1 }' | grep -vx "$1" | sort -u
}
workspace_crates=$(cargo metadata --no-deps --format-version 1 \
  | python3 -c 'import json,sys; print("\n".join(sorted(p["name"] for p in json.load(sys.stdin)["packages"])))')
is_workspace() { printf '%s\n' "$workspace_crates" | grep -qx "$1"; }

# 1. kernel-core is the pure bottom: no database, Redis, metrics or test crate, and none of
#    the workspace's other crates.
core_deps=$(deps kernel-core)
bad=$(printf '%s\n' "$core_deps" | grep -Ex 'mongodb|bson|redis|tokio-postgres|deadpool-postgres|rusqlite|prometheus-client|opentelemetry.*' || true)
[ -z "$bad" ] || fail "kernel-core depends on $(echo $bad)"
for c in $core_deps; do
  if is_workspace "$c"; then fail "kernel-core depends on the workspace crate $c"; fi
done

# 2. The layers (agents, human tasks, event routes) are built on kernel-core's public API:
#    among the workspace's crates they depend on kernel-core alone.
for layer in kernel-agents kernel-tasks kernel-events; do
  for c in $(direct_deps "$layer"); do
    if is_workspace "$c" && [ "$c" != kernel-core ]; then
      fail "the layer $layer depends on $c (a layer uses kernel-core only)"
    fi
  done
done

# 3. No production crate reaches test code: with every feature of every member on, the
#    crates that depend on testkit through normal dependencies are examples and test
#    harnesses only.
production="kernel-core kernel-agents kernel-tasks kernel-events kernel-memory kernel-metrics sql-protocol
  store-postgres store-sqlite store-mongo redis-conn queue-redis permit-redis sse-stream coord-local observer
  compose ops ops-server wfk"
reach=$(cargo tree --workspace --all-features -e normal -i testkit --prefix none --format '{p}' 2>/dev/null \
  | awk '{ print $1 }' | sort -u)
for c in $production; do
  if printf '%s\n' "$reach" | grep -qx "$c"; then
    fail "the production crate $c reaches testkit through normal dependencies"
  fi
done

# 4. Randomness only from the id port: the OS random source is read in
#    kernel-core/src/ports/ids.rs alone (ids, jitter and task tokens come from IdGenerator).
for c in $production; do
  dir="crates/$c/src"
  [ -d "$dir" ] || continue
  for f in $(grep -rlE 'getrandom|thread_rng|OsRng|rand::random' "$dir" || true); do
    [ "$f" = crates/kernel-core/src/ports/ids.rs ] || fail "$f reads a random source outside the id port"
  done
done

# 5. The engine room stays in rooms: no file under kernel-core/src/engine over 500 lines.
while read -r lines file; do
  [ "$file" = total ] && continue
  [ "$lines" -le 500 ] || fail "$file has $lines lines (an engine file stays under 500: split it)"
done < <(find crates/kernel-core/src/engine -name '*.rs' -print0 | xargs -0 wc -l)

# 6. The first demo runs durably on SQLite (bundled) with local coordination: no server
#    crate in its package.
demo_deps=$(deps kernel-examples)
bad=$(printf '%s\n' "$demo_deps" | grep -Ex 'mongodb|bson|redis|tokio-postgres|deadpool-postgres|postgres-types' || true)
[ -z "$bad" ] || fail "the first demo's package depends on $(echo $bad)"
for c in store-sqlite coord-local; do
  printf '%s\n' "$demo_deps" | grep -qx "$c" || fail "the first demo's package must run on $c"
done

# 7. Only dev-dependencies turn on a `testing` feature (redis-conn's and queue-redis's test
#    support, observer's conformance suite and fault decorator). The soak (examples/soak)
#    is itself a test harness that starts its own redis-server, so it is left out.
if cargo tree --workspace --exclude soak -e normal,features --prefix none | grep -q 'feature "testing"'; then
  fail "a production dependency enables a crate's \`testing\` feature (cargo tree -e normal,features -i redis-conn -i queue-redis -i observer)"
fi

# 8. Tests read as the specification: no test file of testkit over 800 lines, and no function
#    named after an issue (`hardening_…`, `<word>_<NN>_…`) instead of the promise it checks.
while read -r file; do
  [ -n "$file" ] && fail "$file is over 800 lines (split it by behaviour)"
done < <(find crates/testkit/tests -name '*.rs' -exec awk 'END { if (NR > 800) print FILENAME }' {} \;)
if named=$(grep -rnE --include='*.rs' 'fn (hardening_[a-z0-9_]*|[a-z]+_[0-9]{2,}_[a-z0-9_]*)[(<]' crates examples); then
  fail "tests named after an issue, not the promise they check:
$named"
fi

if [ "$failed" != 0 ]; then
  exit 1
fi
echo "architecture: ok (kernel-core pure; layers on kernel-core; no production crate reaches testkit; randomness from the id port; engine files under 500 lines; the demo without servers; testing features from dev-dependencies; test files and names)"
