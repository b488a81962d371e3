#!/usr/bin/env bash
# The Redis server's instructions per acquire + release cycle, counted by callgrind
# (repeatable on a loaded machine, unlike CPU time), for each case of `lease-bench
# count-cycles`: a throwaway redis-server runs under callgrind; for each case its counters
# are zeroed, the case runs N cycles, they are dumped, and again with 2N; the difference
# divided by N is one cycle's work on the server, without the client's start-up,
# connection set-up and warm-up.
#
#   bash scripts/server-instructions.sh [N] [TASKS ...]     (N default 2000; TASKS 1 32)
#
# With many tasks the server reads and answers several requests per system call, as in
# the benchmark's 32-task rows. Needs valgrind (with callgrind_control), redis-server and
# python3 (Debian: valgrind redis-server python3).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-2000}
shift || true
tasks=("$@")
[ ${#tasks[@]} -gt 0 ] || tasks=(1 32)

for tool in valgrind callgrind_control redis-server python3; do
  command -v "$tool" >/dev/null || { echo "server-instructions: $tool is not installed" >&2; exit 1; }
done
CARGO_INCREMENTAL=0 cargo build --release -q -p lease-bench
bin=target/release/lease-bench
work=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
valgrind --tool=callgrind --callgrind-out-file="$work/srv.out" \
  redis-server --port "$port" --save '' --appendonly no >"$work/redis.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.1
done
(exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "server-instructions: redis-server did not start" >&2; cat "$work/redis.log" >&2; exit 1; }
url="redis://127.0.0.1:$port/"

# The server's instructions while one run of count-cycles ran.
count() {
  callgrind_control -z "$pid" >/dev/null 2>&1
  "$bin" count-cycles redis "$url" "$@" 2>"$work/run.log" || { cat "$work/run.log" >&2; exit 1; }
  callgrind_control -d "$pid" >/dev/null 2>&1
  local dump
  dump=$(ls -t "$work"/srv.out.* | head -1)
  sed -n 's/^totals: *\([0-9]*\).*/\1/p' "$dump"
  rm -f "$work"/srv.out.*
}

cases=(bare raw backend client peer)
# Once, uncounted: the scripts are loaded and compiled by the first run of each case.
for c in "${cases[@]}"; do count "$c" 100 >/dev/null; done
for t in "${tasks[@]}"; do
  for c in "${cases[@]}"; do
    one=$(count "$c" "$n" "$t")
    two=$(count "$c" $((2 * n)) "$t")
    echo "redis $c, $t task(s): $(( (two - one) / n )) server instructions per cycle"
  done
done
