#!/usr/bin/env bash
# Sets up a new Debian machine for the test suite, checks formatting, lints, docs, the
# MSRV and the packaging, and runs every test.
# Installs the store servers the tests start themselves (redis-server, PostgreSQL,
# etcd) and protoc (needed to build the etcd client), then runs the workspace tests.
set -euo pipefail
cd "$(dirname "$0")/.."

# Disk: a full run writes about 6 GB to target/ (the test binaries; under target/checks,
# the clippy and doc output and the packaged crates' verification build). Incremental
# compilation state would add gigabytes that a one-shot run never reuses. The free space is printed at the start
# and before the tests so that a full disk is visible as such.
export CARGO_INCREMENTAL=0
# Each step prints the time it took, so that a run's time can be split by step.
start=$SECONDS
since() { local s=$(( SECONDS - $1 )); echo "$(( s / 60 ))m$(( s % 60 ))s"; }
step() {
  local t=$SECONDS
  "$@"
  echo "setup-and-test: step took $(since "$t") (run so far $(since "$start")): $*"
}
df -h . | sed 's/^/setup-and-test: disk: /'

# libprotobuf-dev carries the well-known .proto files (google/protobuf/descriptor.proto)
# that etcd-client's build imports; protobuf-compiler only recommends it. faketime runs
# the `lease` binary with its wall clock an hour off (lease-cli's clock-skew tests).
# redis-sentinel and pgbouncer: the Sentinel failover and transaction-pooling tests. gcc
# compiles the stepped-clock shim of the harness (tests of a step of the store's clock).
# openssl makes the certificates of the TLS tests at test time. mariadb-server: the
# MySQL backend's tests (a throwaway mariadbd per test binary). zookeeper (3.8, with a
# JRE): the ZooKeeper harness (lease-test-servers::zookeeper).
packages=(redis-server redis-tools redis-sentinel postgresql pgbouncer etcd-server etcd-client mariadb-server protobuf-compiler libprotobuf-dev faketime gcc libc6-dev openssl zookeeper)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# No store may be started by the package manager for the tests: they start their own
# servers on free loopback ports. Stop any that an install started.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  ${sudo:-} systemctl stop redis-server redis-sentinel etcd postgresql pgbouncer mariadb zookeeper >/dev/null 2>&1 || true
fi

# Where a Docker engine answers, build the servers' images from the packages above (no
# registry is needed; existing tags are kept): tests that take a server from any source
# then run against containers (an official image is tried first where a registry
# answers). LEASE_TEST_SOURCE=containers makes a container that does not start fail
# the test; LEASE_TEST_CONTAINERS=0 uses local processes only.
step bash scripts/build-test-images.sh

# With an engine, tests that take a server from any source get a container and fail if
# none starts (no silent fallback to a local process); LEASE_TEST_SOURCE=any restores the
# fallback. Tests of what only a local process allows (stepped clocks, TLS files, SIGSTOP
# of the server) still start local processes.
if docker info >/dev/null 2>&1 && [ -z "${LEASE_TEST_SOURCE:-}" ]; then
  export LEASE_TEST_SOURCE=containers
fi

# What a release needs: formatting, lints, docs without warnings, a rust-version no lower
# than the locked dependencies need, and every published crate packaging. Each fails the
# run. Formatting and the MSRV take seconds and run first.
if cargo fmt --version >/dev/null 2>&1; then
  step cargo fmt --all -- --check
else
  echo "setup-and-test: rustfmt is not installed; skipping the format check" >&2
fi
step python3 scripts/check-msrv.py

# The lints, the docs and the packaging build nothing the tests run, and took about 8 of a
# run's minutes on two cores before the tests (2026-12-03: clippy 2m49s, doc 0m49s,
# package 4m25s), while the tests leave the cores mostly idle (they wait on TTLs, firings
# and containers). So they run beside the tests, in a target directory of their own (a
# build holds its directory's lock throughout, and the tests' `cargo test` calls would
# wait on it), at the scheduler's idle priority (SCHED_IDLE, and the idle I/O class where
# the disk's scheduler has one): they get a core only when no test, server or container
# wants it, and a waking test preempts them at once. Their output is printed after the
# tests'; a failure fails the run. The test build, which no longer finds the packaging's
# builds of shared dependencies, takes longer (6m06s and 7m59s against 4m26s):
# the whole run took 39m10s, then 35m32s with the lanes evened, against 44m05s on one machine. A CPU-bound test beside them
# is slower still (lease-conformance's external_backend, a cargo build: 150 s against 77);
# tests that wait on time were not.
checks_dir=target/checks
checks() {
  set -e
  export CARGO_TARGET_DIR=$checks_dir
  if cargo clippy --version >/dev/null 2>&1; then
    step cargo clippy --workspace --all-targets --all-features -- -D warnings
  else
    echo "setup-and-test: clippy is not installed; skipping the lint check" >&2
  fi
  RUSTDOCFLAGS=-Dwarnings step cargo doc --workspace --no-deps --all-features
  # Every published crate packages, and its packaged sources build on their own (the test
  # and comparison crates are publish = false). Cargo verifies each package against the
  # others through a local overlay of the registry, whose sources it unpacks under
  # $CARGO_HOME/registry/src once per name and version and then reuses: a second run with
  # changed sources but the same version would build the first run's copies. Remove this
  # workspace's unpacked copies first (none of these names is a crates.io crate this
  # workspace depends on).
  local cargo_home=${CARGO_HOME:-$HOME/.cargo} crate
  for crate in lease-core lease-conformance lease-redis lease-postgres lease-etcd lease-mysql lease-zookeeper leasehold lease-cli; do
    rm -rf "$cargo_home"/registry/src/*/"$crate"-[0-9]* "$cargo_home"/registry/cache/*/"$crate"-[0-9]*.crate
  done
  step cargo package --workspace --exclude lease-test-servers --exclude lease-lab --exclude lease-bench
}
# Puts the calling (sub)shell, and so every process it starts, at idle priority.
idle_priority() {
  chrt --idle -p 0 "$BASHPID" >/dev/null 2>&1 || renice -n 19 -p "$BASHPID" >/dev/null 2>&1 || true
  ionice -c 3 -p "$BASHPID" >/dev/null 2>&1 || true
}

# Every test server prints one "lease test server: ..." line naming its source; the run
# ends with how many servers and tests came from each (scripts/count-test-servers.sh).
# --no-fail-fast: a failure in one test binary does not hide the results of the others.
df -h . | sed 's/^/setup-and-test: disk before the tests: /'
# The test binaries are built first as a step of their own, so that the run shows the
# build's time apart from the tests'.
step cargo test --workspace --exclude lease-bench --no-run

checks_log=$(mktemp)
( idle_priority; checks ) > "$checks_log" 2>&1 &
checks_pid=$!

# The tests, in two lanes at once (scripts/test-lanes.py says why and which): the long,
# mostly idle binaries beside the rest, each lane two tests at a time; then the doc tests.
# Together they run exactly what `cargo test --workspace --exclude lease-bench` runs, from
# the build above. The idle lane's output follows the rest's.
ws=(--workspace --exclude lease-bench --no-fail-fast)
# (Assigned first, so that a failure of the helper stops the run under `set -e`: an empty
# target list would make a lane run every test.)
idle_targets=$(python3 scripts/test-lanes.py idle)
rest_targets=$(python3 scripts/test-lanes.py rest)
read -r -a idle <<< "$idle_targets"
read -r -a rest <<< "$rest_targets"
log=$(mktemp)
idle_log=$(mktemp)
trap 'rm -f "$log" "$idle_log" "$checks_log"' EXIT
set +e
tests=$SECONDS
(
  cargo test "${ws[@]}" "${idle[@]}" > "$idle_log" 2>&1
  s=$?
  echo "setup-and-test: the idle lane took $(since "$tests")" >> "$idle_log"
  exit "$s"
) &
idle_pid=$!
cargo test "${ws[@]}" "${rest[@]}" 2>&1 | tee "$log"
rest_status=${PIPESTATUS[0]}
echo "setup-and-test: the rest lane took $(since "$tests")"
cargo test "${ws[@]}" --doc 2>&1 | tee -a "$log"
doc_status=${PIPESTATUS[0]}
wait "$idle_pid"
idle_status=$?
echo "setup-and-test: the idle lane's output:"
tee -a "$log" < "$idle_log"
wait "$checks_pid"
checks_status=$?
echo "setup-and-test: the lints', docs' and packaging's output (run beside the tests, at idle priority):"
cat "$checks_log"
set -e
status=0
for s in "$rest_status" "$doc_status" "$idle_status" "$checks_status"; do
  if [ "$s" -ne 0 ]; then status=$s; fi
done
echo "setup-and-test: the tests took $(since "$tests") (exit: rest $rest_status, doc $doc_status, idle $idle_status, checks $checks_status); the whole run $(since "$start")"
bash scripts/count-test-servers.sh "$log"
exit "$status"
