#!/usr/bin/env python3
"""Checks the workspace's `rust-version` against what its locked dependencies declare.

Walks `cargo metadata`'s resolved graph from every workspace crate that is published
(`publish` not false), following normal and build dependencies only (dev-dependencies do
not reach a user), and fails when any package reached declares a `rust-version` above the
one the workspace crate claims. Prints the packages that set the floor.

Usage: python3 scripts/check-msrv.py [--manifest-path Cargo.toml]
Exit: 0 when every published crate's rust-version is at least its dependencies' highest,
1 when one is lower, 2 when cargo metadata fails.
"""

import json
import subprocess
import sys


def version_key(v):
    parts = []
    for p in v.split("."):
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts)


def main(argv):
    cmd = ["cargo", "metadata", "--format-version", "1", "--locked", "--all-features"]
    if len(argv) > 2 and argv[1] == "--manifest-path":
        cmd += ["--manifest-path", argv[2]]
    try:
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    except subprocess.CalledProcessError as e:
        sys.stderr.write(e.stderr)
        return 2
    meta = json.loads(out)
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    members = set(meta["workspace_members"])

    failed = False
    for member in sorted(members, key=lambda i: packages[i]["name"]):
        pkg = packages[member]
        if pkg.get("publish") == []:
            continue  # publish = false: never reaches a user
        claimed = pkg.get("rust_version")
        if not claimed:
            print(f"check-msrv: {pkg['name']} declares no rust-version")
            failed = True
            continue
        seen = set()
        stack = [member]
        highest = ("0", None)
        while stack:
            pid = stack.pop()
            if pid in seen:
                continue
            seen.add(pid)
            rv = packages[pid].get("rust_version")
            # Workspace crates share the claim; the floor comes from the others.
            if pid not in members and rv and version_key(rv) > version_key(highest[0]):
                highest = (rv, packages[pid]["name"] + " " + packages[pid]["version"])
            for dep in nodes[pid]["deps"]:
                kinds = {k.get("kind") for k in dep["dep_kinds"]}
                # None is a normal dependency; "build" runs at build time too.
                if kinds & {None, "build"}:
                    stack.append(dep["pkg"])
        if version_key(claimed) < version_key(highest[0]):
            print(
                f"check-msrv: {pkg['name']} claims rust-version {claimed}, but its locked "
                f"dependency {highest[1]} needs {highest[0]}"
            )
            failed = True
        else:
            print(
                f"check-msrv: {pkg['name']} rust-version {claimed} >= {highest[0]}"
                + (f" ({highest[1]})" if highest[1] else "")
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
