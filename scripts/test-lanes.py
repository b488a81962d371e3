#!/usr/bin/env python3
"""Splits the workspace's test binaries into the two lanes that scripts/setup-and-test.sh
runs at the same time, and prints one lane's cargo test target arguments.

    python3 scripts/test-lanes.py idle   # --test container_faults --test cron_firings ...
    python3 scripts/test-lanes.py rest   # --lib --bins --test <every other test target>

Why two lanes: the test binaries run one after another, and most of them leave the two
cores nearly idle (sampled over a whole CI run: 1% to 39% of the machine per binary).
The longest of them (IDLE below, about 10 of some 31 minutes of tests) wait on wall-clock
time: firings every 2 s, containers started, paused and stopped, replies lost behind a
proxy. They run in a lane of their own beside the rest, each lane two tests at a time as
before, each binary with its own servers.

Both lanes select the whole workspace (`--workspace --exclude lease-bench`) and differ only
in their targets, so features resolve as in one `cargo test --workspace` and both reuse the
build of `cargo test --workspace --exclude lease-bench --no-run`. The doc tests run after
the `rest` lane (`cargo test ... --doc`); examples are built by the `--no-run` step and not
run, as a plain `cargo test` does.

Fails, naming the target, if an IDLE name is missing or not unique across the workspace
(`--test NAME` selects every package's target of that name).
"""

import json
import subprocess
import sys

EXCLUDED_PACKAGES = {"lease-bench"}

# The long, mostly idle binaries (seconds in 2026-11-27's runs, on two machines): lease-lab's
# container_faults (184 to 279), cron_firings (130), lost_reply (101), fault_matrix (40)
# and lease-cli's cli (98).
#
# lease-lab's scenarios (77 to 96 s) is long but not idle: 1,000 contenders at once on
# each store, and its watchdog checks hold only while a renewal's round trip fits in about
# half a 100 to 1,000 ms lease. In this lane it ran beside the conformance suites, and
# each slowed the other past their bounds: the clean-clone runs of 2026-11-29 failed the
# scenarios' watchdog check on PostgreSQL (twice) and ZooKeeper (once, in the project's
# CI), and the second PostgreSQL failure's run also timed out a 200 ms release and a
# 200 ms acquire in two conformance suites. It runs in the rest lane, one binary at a
# time, beside the idle ones only (about 90 s more on the rest lane, 90 s less here).
#
# Also here (2026-12-03), to even the lanes out: two binaries that leave the machine idle
# and start no server, by a sample of a clean-clone run (each test process's own CPU time
# and its children's, from /proc, against its wall time): lease-conformance's `memory`
# (the in-memory store: 61 s, 2% of one core) and lease-cli's `secrets` (URLs of closed
# ports: 21 s, 2%). In that run the rest lane took 31 minutes and this one 12. (The
# sample cannot see a container's CPU time, so no binary that starts one was moved.)
IDLE = [
    "container_faults",
    "cron_firings",
    "lost_reply",
    "fault_matrix",
    "cli",
    "memory",
    "secrets",
]

# Tried and dropped (2026-11-29): the conformance suites' binaries (every backend's
# `conformance` and `conformance_secure`, `memory`, Redis's `cluster`: 949 of the rest
# lane's 1,502 s, etcd's 194 + 97 s of it) first in the rest lane with four checks at a
# time instead of two. On this machine the test phase took 1,106 s instead of 1,502 and
# passed once, with the machine 47 to 71% busy while the suites ran; the next clean-clone
# run failed two PostgreSQL checks on timing: `advisory::heartbeat_runtime_dropped` (a
# heartbeat's renewal missed its deadline) and `election_observer_sees_every_leadership_
# in_order` (the observer missed one of six short leaderships). Per-package thread
# counts would need the binaries run without `cargo test` (`--test conformance` selects
# every package's target of that name).


def test_targets():
    out = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    names = []
    for package in json.loads(out)["packages"]:
        if package["name"] in EXCLUDED_PACKAGES:
            continue
        for target in package["targets"]:
            if "test" in target["kind"] and target.get("test", True):
                names.append(target["name"])
    return names


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in ("idle", "rest"):
        sys.exit("usage: test-lanes.py idle|rest")
    names = test_targets()
    for name in IDLE:
        if names.count(name) != 1:
            sys.exit(f"test-lanes.py: {names.count(name)} test targets named {name!r} (need exactly 1)")
    if sys.argv[1] == "idle":
        args = [a for name in IDLE for a in ("--test", name)]
    else:
        rest = sorted(set(names) - set(IDLE))
        args = ["--lib", "--bins"] + [a for name in rest for a in ("--test", name)]
    print(" ".join(args))


if __name__ == "__main__":
    main()
