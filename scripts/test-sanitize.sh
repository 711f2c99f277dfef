#!/usr/bin/env bash
# `make test-sanitize`: the XCTest suite under ThreadSanitizer, then under AddressSanitizer, each built in its own
# folder (.build/tsan, .build/asan). Fails on a failing test and on any sanitizer report, whether from the
# test process or from a process a test starts (the `jobserver` executable): every report is written to a file in
# .build/tsan/reports/ or .build/asan/reports/ and printed at the end. The only suppressions are in
# scripts/sanitize/, each with the toolchain bug it works around. Extra arguments go to `swift test`
# (e.g. --filter StoreTests); SANITIZERS=address runs one of the two.
set -uo pipefail
cd "$(dirname "$0")/.."

status=0
for sanitizer in ${SANITIZERS:-thread address}; do
  scratch=.build/${sanitizer:0:1}san
  reports=$PWD/$scratch/reports
  rm -rf "$reports"
  mkdir -p "$reports"
  echo "== $sanitizer sanitizer: building in $scratch"
  if ! swift build --build-tests --sanitize="$sanitizer" --scratch-path "$scratch"; then
    status=1
    continue
  fi
  echo "== $sanitizer sanitizer: running the suite"
  # AddressSanitizer's stack frames are several times larger than plain ones: the tests that nest 3,000 levels
  # deep on the main thread fit its 8 MiB without it, not with it. The limit is raised in proportion.
  # The suppressions match symbolized frames; a child started with a bare environment (no PATH) must still find
  # the symbolizer.
  symbolizer=$(command -v llvm-symbolizer || true)
  stack_kib=$(ulimit -s)
  if [ "$sanitizer" = address ]; then stack_kib=65536; fi
  if ! JOBSERVER_SANITIZER="$sanitizer" \
       TSAN_OPTIONS="log_path=$reports/report external_symbolizer_path=$symbolizer ${TSAN_OPTIONS:-}" \
       ASAN_OPTIONS="log_path=$reports/report external_symbolizer_path=$symbolizer suppressions=$PWD/scripts/sanitize/asan.supp ${ASAN_OPTIONS:-}" \
       LSAN_OPTIONS="suppressions=$PWD/scripts/sanitize/lsan.supp print_suppressions=0 ${LSAN_OPTIONS:-}" \
       bash -c 'ulimit -s "$0" && exec "$@"' "$stack_kib" swift test --skip-build --disable-swift-testing --sanitize="$sanitizer" --scratch-path "$scratch" "$@"; then
    echo "== $sanitizer sanitizer: the suite failed"
    status=1
  fi
  if compgen -G "$reports/report.*" > /dev/null; then
    for report in "$reports"/report.*; do
      echo "== $sanitizer sanitizer report: $report"
      cat "$report"
    done
    echo "== $sanitizer sanitizer: $(ls "$reports" | wc -l) process(es) reported"
    status=1
  else
    echo "== $sanitizer sanitizer: no reports"
  fi
done
exit "$status"
