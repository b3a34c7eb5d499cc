#!/usr/bin/env python3
"""Reads cargo's JSON messages (`--message-format=json...`) on stdin and prints one line per
built executable of a workspace package: package, kind, target name, path, package directory
(tab-separated). The test script runs these executables directly, so every section uses the
one feature set `cargo test --workspace` built with (see "One feature set" in scripts/test.sh).
"""
import json
import os
import sys


def package_name(package_id: str, manifest_path: str) -> str:
    # "path+file:///…/crates/store-mongo#0.1.0" or "path+file:///…/examples#kernel-examples@0.1.0"
    fragment = package_id.rsplit("#", 1)[-1]
    if "@" in fragment:
        return fragment.split("@", 1)[0]
    return os.path.basename(os.path.dirname(manifest_path))


def main() -> int:
    seen = set()
    for line in sys.stdin:
        line = line.strip()
        if not line.startswith("{"):
            continue
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("package_id", "").startswith("path+file://"):
            continue
        target = msg["target"]
        kinds = target.get("kind", [])
        if msg.get("profile", {}).get("test"):
            kind = "test" if "test" in kinds else "unit-" + kinds[0]
        else:
            kind = kinds[0]
        row = (
            package_name(msg["package_id"], msg["manifest_path"]),
            kind,
            target["name"],
            msg["executable"],
            os.path.dirname(msg["manifest_path"]),
        )
        if row not in seen:
            seen.add(row)
            print("\t".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
