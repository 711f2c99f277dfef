#!/usr/bin/env bash
# Runs every benchmark (bench/NN-*.sh) side by side with its reference and
# writes docs/benchmarks.md. Each script prints a markdown section on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/benchmarks.md
tmp=$(mktemp)
{
  echo "# Benchmarks"
  echo
  echo "Written by \`make bench\` on $(date -u +%Y-%m-%dT%H:%M:%SZ)."
  echo
  echo "Machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -srm)," \
       "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(swift --version 2>&1 | head -1)."
  echo
  echo "Every figure is a ratio against a reference measured in the same run, on loopback, but for the"
  echo "parse section (bench/05-parse.sh), which reports time per byte at three sizes."
  echo
} >"$tmp"
for script in bench/[0-9][0-9]-*.sh; do
  [ -e "$script" ] || continue
  echo "== $script" >&2
  bash "$script" | tee -a "$tmp"
  echo >>"$tmp"
done
mv "$tmp" "$out"
echo "wrote $out" >&2
