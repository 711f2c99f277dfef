#!/usr/bin/env bash
# `swift build` that fails on any warning (`make build`, `make test`). Arguments go to `swift build`.
# The compiler warns about a file only when it compiles it: a clean build checks every file, an incremental one the
# files it compiles again. A file that warned is touched, so that the next build compiles it and fails again
# instead of passing on a warm cache. Not `-warnings-as-errors` in Package.swift: `unsafeFlags` make the package
# unusable as a dependency, and `.treatAllWarnings(as: .error)` (tools 6.2) clashes with the `-suppress-warnings`
# a dependency is built with.
set -uo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
swift build "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
[ "$status" -eq 0 ] || exit "$status"
if grep -q 'warning:' "$log"; then
  grep -oE '^/[^:]+\.swift(:[0-9]+){2}: warning:' "$log" | cut -d: -f1 | sort -u | xargs -r touch
  echo "build-without-warnings: $(grep -c 'warning:' "$log") warning line(s) above; the build must have none" >&2
  exit 1
fi
