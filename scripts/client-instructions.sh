#!/usr/bin/env bash
# The client's instructions per acquire + release cycle, counted by callgrind (repeatable
# on a loaded machine, unlike a rate), for each case of `lease-bench count-cycles` on a
# throwaway local redis-server and etcd: each case runs twice, with N and 2N cycles, and
# the difference divided by N is one cycle's instructions without start-up and connection
# set-up. The benchmark report counts the same cases against its own servers
# (lease-bench's `instructions` module); this script counts them alone.
#
#   bash scripts/client-instructions.sh [N] [STORE ...]     (N default 1000; redis etcd;
#                                                            postgres, zookeeper on
#                                                            request)
#   TASKS=32 bash scripts/client-instructions.sh 3200 redis  (N cycles over 32 concurrent
#                                                            tasks on the one connection)
#   LEASE_BENCH_BIN=/tmp/lease-bench-before bash scripts/client-instructions.sh 1000 redis
#                                                           (another build's binary, to
#                                                            count two builds in turn)
#
# Needs valgrind, redis-server, etcd and python3 (Debian: valgrind redis-server
# etcd-server python3), for postgres Debian's postgresql, for zookeeper Debian's
# zookeeper (and its JRE).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-1000}
tasks=${TASKS:-1}
shift || true
stores=("$@")
[ ${#stores[@]} -gt 0 ] || stores=(redis etcd)

for tool in valgrind redis-server etcd python3; do
  command -v "$tool" >/dev/null || { echo "client-instructions: $tool is not installed" >&2; exit 1; }
done
CARGO_INCREMENTAL=0 cargo build --release -q -p lease-bench
bin=${LEASE_BENCH_BIN:-target/release/lease-bench}
work=$(mktemp -d)
pids=()
cleanup() {
  for p in ${pids[@]+"${pids[@]}"}; do kill "$p" 2>/dev/null || true; done
  for p in ${pids[@]+"${pids[@]}"}; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

# Free loopback ports, all different, from one socket set held open together.
free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}
wait_port() {
  for _ in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "client-instructions: nothing listens on $1" >&2; exit 1
}

# Instructions of one run, from callgrind's "Collected" line; the run's output is shown
# if it failed or printed no count.
count() {
  local log="$work/run.log" got
  if ! valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" "$bin" count-cycles "$@" >"$log" 2>&1; then
    echo "client-instructions: count-cycles $* failed:" >&2; cat "$log" >&2; exit 1
  fi
  got=$(sed -n 's/^==[0-9]*== Collected : \([0-9]*\).*/\1/p' "$log")
  if [ -z "$got" ]; then
    echo "client-instructions: no count from count-cycles $*:" >&2; cat "$log" >&2; exit 1
  fi
  echo "$got"
}

for store in "${stores[@]}"; do
  case "$store" in
    redis)
      read -r port < <(free_ports 1)
      redis-server --port "$port" --save '' --appendonly no --daemonize no >"$work/redis.log" 2>&1 &
      pids+=($!)
      wait_port "$port"
      url="redis://127.0.0.1:$port/"
      cases=(bare raw backend client peer)
      ;;
    etcd)
      read -r port peer < <(free_ports 2)
      etcd --data-dir "$work/etcd" --listen-client-urls "http://127.0.0.1:$port" \
        --advertise-client-urls "http://127.0.0.1:$port" \
        --listen-peer-urls "http://127.0.0.1:$peer" \
        --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
        --initial-cluster "default=http://127.0.0.1:$peer" >"$work/etcd.log" 2>&1 &
      pids+=($!)
      wait_port "$port"
      url="etcd://127.0.0.1:$port"
      cases=(bare backend client peer)
      ;;
    postgres)
      # A throwaway cluster (fsync off: only the client is counted), owned by the
      # postgres user where this runs as root (initdb refuses root).
      pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
      [ -x "$pgbin/initdb" ] || { echo "client-instructions: no PostgreSQL server (Debian: postgresql)" >&2; exit 1; }
      read -r port < <(free_ports 1)
      as_pg=()
      if [ "$(id -u)" = 0 ]; then chown postgres "$work"; as_pg=(runuser -u postgres --); fi
      "${as_pg[@]}" "$pgbin/initdb" -D "$work/pg" -A trust -U postgres >"$work/initdb.log" 2>&1
      "${as_pg[@]}" "$pgbin/postgres" -D "$work/pg" -p "$port" -k "$work" -c fsync=off \
        -c listen_addresses=127.0.0.1 >"$work/pg.log" 2>&1 &
      pids+=($!)
      wait_port "$port"
      url="postgres://postgres@127.0.0.1:$port/postgres"
      cases=(bare backend client shedlock advisory peer)
      ;;
    zookeeper)
      # A throwaway standalone server (Debian's zookeeper package), data in the work
      # directory; the JVM is not counted, only the client.
      [ -f /usr/share/java/zookeeper.jar ] || { echo "client-instructions: no ZooKeeper (Debian: zookeeper)" >&2; exit 1; }
      read -r port < <(free_ports 1)
      mkdir -p "$work/zk"
      printf 'tickTime=200\nmaxSessionTimeout=600000\ndataDir=%s\nclientPort=%s\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\nextendedTypesEnabled=true\n' \
        "$work/zk" "$port" >"$work/zoo.cfg"
      java -cp /etc/zookeeper/conf:/usr/share/java/zookeeper.jar:/usr/share/java/netty-codec.jar \
        -Xmx256m -Dzookeeper.forceSync=no -Dzookeeper.log.dir="$work" org.apache.zookeeper.server.ZooKeeperServerMain \
        "$work/zoo.cfg" >"$work/zk.log" 2>&1 &
      pids+=($!)
      wait_port "$port"
      url="zk://127.0.0.1:$port/bench"
      cases=(bare raw backend client backend-rt client-rt peer)
      ;;
    *) echo "client-instructions: unknown store $store" >&2; exit 64 ;;
  esac
  for c in "${cases[@]}"; do
    one=$(count "$store" "$url" "$c" "$n" "$tasks")
    two=$(count "$store" "$url" "$c" $((2 * n)) "$tasks")
    echo "$store $c, $tasks task(s): $(( (two - one) / n )) instructions per cycle ($one for $n cycles, $two for $((2 * n)))"
  done
done
