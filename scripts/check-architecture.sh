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
# tree <args>: `cargo tree --prefix none --format {p}` as package names, one a line; a cargo
# failure stops the script with cargo's message (never an empty, vacuously passing list).
tree() {
  local out
  if ! out=$(cargo tree --prefix none --format '{p}' "$@"); then
    echo "architecture: cargo tree $* failed" >&2
    exit 1
  fi
  printf '%s\n' "$out" | awk 'NF { print $1 }' | sort -u
}
# deps <package>: the package's normal dependencies, itself left out.
deps() {
  local out
  out=$(tree -p "$1" -e normal) || exit 1
  printf '%s\n' "$out" | grep -vx "$1" || true
}
# direct_deps <package>: its direct normal dependencies.
direct_deps() {
  local out
  out=$(tree -p "$1" -e normal --depth 1) || exit 1
  printf '%s\n' "$out" | grep -vx "$1" || true
}
workspace_crates=$(cargo metadata --no-deps --format-version 1 \
  | python3 -c 'import json,sys; print("\n".join(sorted(p["name"] for p in json.load(sys.stdin)["packages"])))')
is_workspace() { printf '%s\n' "$workspace_crates" | grep -qx "$1"; }

# 1. kernel-core is the pure bottom: no database, Redis, metrics or test crate, and none of
#    the workspace's other crates.
core_deps=$(deps kernel-core)
[ -n "$core_deps" ] || fail "no dependencies read for kernel-core"
bad=$(printf '%s\n' "$core_deps" | grep -Ex 'mongodb|bson|redis|tokio-postgres|deadpool-postgres|rusqlite|prometheus-client|opentelemetry.*' || true)
[ -z "$bad" ] || fail "kernel-core depends on $(echo $bad)"
for c in $core_deps; do
  if is_workspace "$c"; then fail "kernel-core depends on the workspace crate $c"; fi
done

# 2. The layers (agents, human tasks, event routes) are built on kernel-core's public API:
#    among the workspace's crates they depend on kernel-core alone.
for layer in kernel-agents kernel-tasks kernel-events; do
  layer_deps=$(direct_deps "$layer")
  printf '%s\n' "$layer_deps" | grep -qx kernel-core || fail "no kernel-core read among the dependencies of $layer"
  for c in $layer_deps; do
    if is_workspace "$c" && [ "$c" != kernel-core ]; then
      fail "the layer $layer depends on $c (a layer uses kernel-core only)"
    fi
  done
done

# 3. No production crate reaches test code: with every feature of every member on, the
#    crates that depend on testkit through normal dependencies are examples and test
#    harnesses only.
#    Every crate under crates/ but testkit is a production crate (a new one is checked
#    without being listed).
production=$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    path = p["manifest_path"].replace("\\", "/")
    if "/crates/" in path and p["name"] != "testkit":
        print(p["name"])')
[ -n "$production" ] || fail "no production crate found under crates/"
reach=$(tree --workspace --all-features -e normal -i testkit) || exit 1
printf '%s\n' "$reach" | grep -qx testkit || fail "cargo tree -i testkit listed nothing"
for c in $production; do
  if printf '%s\n' "$reach" | grep -qx "$c"; then
    fail "the production crate $c reaches testkit through normal dependencies"
  fi
done

# 4. Randomness only from the id port: the OS random source is read in
#    kernel-core/src/ports/ids.rs alone (ids, jitter and task tokens come from IdGenerator).
for dir in crates/*/src; do
  [ "$dir" = crates/testkit/src ] && continue
  for f in $(grep -rlE 'getrandom|thread_rng|OsRng|rand::random|from_entropy|new_v4' "$dir" || true); do
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
features_tree=$(cargo tree --workspace --exclude soak -e normal,features --prefix none) || exit 1
if printf '%s\n' "$features_tree" | grep -q 'feature "testing"'; then
  fail "a production dependency enables a crate's \`testing\` feature (cargo tree -e normal,features -i redis-conn -i queue-redis -i observer)"
fi

# 8. Tests read as the specification: no test file of testkit over 800 lines, and no function
#    named after an issue (`hardening_…`, `<word>_<NN>_…`) instead of the promise it checks.
while read -r file; do
  [ -n "$file" ] && fail "$file is over 800 lines (split it by behaviour)"
done < <(find crates/testkit/tests -name '*.rs' -exec awk 'END { if (NR > 800) print FILENAME }' {} \;)
if named=$(grep -rnE --include='*.rs' 'fn (hardening_[a-z0-9_]*|issue_[0-9]+_[a-z0-9_]*|[a-z]+_[0-9]{2,}_[a-z0-9_]*)[(<]' crates examples); then
  fail "tests named after an issue, not the promise they check:
$named"
fi

if [ "$failed" != 0 ]; then
  exit 1
fi
echo "architecture: ok (kernel-core pure; layers on kernel-core; no production crate reaches testkit; randomness from the id port; engine files under 500 lines; the demo without servers; testing features from dev-dependencies; test files and names)"
