#!/usr/bin/env bash
# Runs every Tests/Integration/*.test.sh against a freshly started server.
set -euo pipefail
cd "$(dirname "$0")/../.."
pass=0; fail=0
for t in Tests/Integration/*.test.sh; do
  [ -e "$t" ] || continue
  if bash "$t"; then pass=$((pass+1)); echo "PASS $t"; else fail=$((fail+1)); echo "FAIL $t"; fi
done
echo "integration: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
