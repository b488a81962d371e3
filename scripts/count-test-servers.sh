#!/usr/bin/env bash
# Counts a test run's servers and tests by source, from its output:
# - every server start prints one "lease test server: ..." line naming its source
#   (container, local process, environment) and the test that asked for it ("[test NAME]");
# - cargo's "Running ..." lines say which test binary the lines that follow belong to.
# A test counts once per source it used (a test that used a container and a local
# process counts in both); the conformance suites are also counted per store.
set -euo pipefail
log=${1:?usage: count-test-servers.sh LOG}
count() { grep -c -- "$1" || true; }
echo "test servers by source:"
echo "  container:      $(grep 'lease test server:' "$log" | count '(container ')"
echo "  local process:  $(grep 'lease test server:' "$log" | count '(local process')"
echo "  environment:    $(grep 'lease test server:' "$log" | count '(from LEASE_TEST_')"
grep 'lease test server:' "$log" | grep -o '(container [^ ,)]*' \
  | awk '{print "    " $NF}' | sort | uniq -c || true
echo "  container images that did not start (once per test binary): $(count 'container did not start' <"$log")"
awk '
  /^ *Running / {
    bin = $0; sub(/.*\(/, "", bin); sub(/\).*/, "", bin); sub(/.*\//, "", bin); sub(/-[0-9a-f]+$/, "", bin)
    src_file = $2
  }
  /lease test server:/ && /\[test / {
    test = $0; sub(/.*\[test /, "", test); sub(/\]$/, "", test)
    src = ""
    if ($0 ~ /\(container |from a container/) src = "container"
    else if ($0 ~ /\(local process|from a local process/) src = "local process"
    else if ($0 ~ /\(from LEASE_TEST_/) src = "environment"
    if (src == "") next
    kind = $0; sub(/.*lease test server: /, "", kind)
    if (kind ~ /^etcd cluster/) kind = "etcd-cluster"; else sub(/ .*/, "", kind)
    key = src_file "|" bin "::" test
    if (!((src, key) in seen)) { seen[src, key] = 1; tests[src]++ }
    if (bin == "conformance" || bin == "conformance_secure") {
      ck = bin " on " kind
      if (!((src, ck, key) in cseen)) { cseen[src, ck, key] = 1; conf[ck "|" src]++ }
    }
  }
  END {
    print "tests by the source of their servers:"
    n = split("container|local process|environment", order, "|")
    for (i = 1; i <= n; i++) printf "  %-15s %d\n", order[i] ":", tests[order[i]] + 0
    print "conformance suites (checks per store and source):"
    for (k in conf) { split(k, p, "|"); printf "  %-32s %-14s %d\n", p[1], p[2], conf[k] | "sort" }
    close("sort")
  }
' "$log"
