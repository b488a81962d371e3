#!/usr/bin/env bash
# Counts the test servers of a test run's output by source: the "lease test server: ..."
# lines that every server start prints (container, local process, environment), and the
# container images that did not start (tried once per test binary).
set -euo pipefail
log=${1:?usage: count-test-servers.sh LOG}
count() { grep -c -- "$1" || true; }
echo "test servers by source:"
echo "  container:      $(grep 'lease test server:' "$log" | count '(container ')"
echo "  local process:  $(grep 'lease test server:' "$log" | count '(local process')"
echo "  environment:    $(grep 'lease test server:' "$log" | count '(from LEASE_TEST_')"
grep -o 'lease test server: [a-z]* at [^ ]* (container [^ ]*' "$log" \
  | awk '{print "    " $NF}' | sort | uniq -c || true
echo "  container images that did not start (once per test binary): $(count 'container did not start' <"$log")"
