#!/usr/bin/env bash
# Runs the benchmarks (bench/NN-*.sh), each side by side with its reference, and writes docs/benchmarks.md.
# Each script prints a markdown section on stdout.
#   bench/run.sh            every benchmark; docs/benchmarks.md is written anew
#   bench/run.sh 50 55      only bench/50-*.sh and bench/55-*.sh: their sections in docs/benchmarks.md are
#                           replaced (or added), the others kept as they are
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/benchmarks.md
# Its own output does not count as a change: a run of several sections writes the file between them.
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet -- . ":(exclude)$out" 2>/dev/null || echo '+changes')"
machine="$(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -srm), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(swift --version 2>&1 | head -1)"

scripts=()
if [ $# -eq 0 ]; then
  scripts=(bench/[0-9][0-9]-*.sh)
else
  for n in "$@"; do
    found=(bench/"$n"-*.sh)
    [ -e "${found[0]}" ] || { echo "bench/run.sh: no bench/$n-*.sh" >&2; exit 2; }
    scripts+=("${found[@]}")
  done
fi

# One section per script, between markers that a partial run finds again.
run_one() {
  local script="$1" name; name="$(basename "$script")"
  echo "== $script" >&2
  echo "<!-- bench: $name -->"
  # One script that fails does not stop the others; its section says so.
  if ! bash "$script"; then
    echo
    echo "**\`$script\` failed in this run** (its output on stderr says why); the figures above it, if any, are partial."
    status=1
  fi
  echo
  echo "Measured at commit \`$commit\` on $(date -u +%Y-%m-%dT%H:%M:%SZ) by \`bench/run.sh\`."
  echo "<!-- /bench: $name -->"
}

status=0
tmp=$(mktemp)
if [ $# -eq 0 ] || [ ! -e "$out" ]; then
  {
    echo "# Benchmarks"
    echo
    echo "Written by \`make bench\` (\`bench/run.sh\`); \`bench/run.sh NN …\` measures one section again."
    echo
    echo "Machine: $machine."
    echo
    echo "Every figure is a ratio against a reference measured in the same run, on loopback, but for the"
    echo "parse section (bench/05-parse.sh), which reports time per byte at three sizes. Each section names"
    echo "the commit it measured."
    echo
  } >"$tmp"
  for script in "${scripts[@]}"; do run_one "$script" >>"$tmp"; echo >>"$tmp"; done
else
  for script in "${scripts[@]}"; do
    # Each section is written as soon as it is measured, so that a later failure keeps the earlier ones.
    cp "$out" "$tmp"
    name="$(basename "$script")"
    section=$(mktemp)
    run_one "$script" >"$section"
    python3 - "$tmp" "$section" "$name" <<'PY'
import sys
path, section_path, name = sys.argv[1:]
text = open(path).read()
section = open(section_path).read().rstrip("\n") + "\n"
begin, end = f"<!-- bench: {name} -->", f"<!-- /bench: {name} -->"
if begin in text and end in text:
    i = text.index(begin)
    j = text.index(end) + len(end) + 1
    text = text[:i] + section + text[j:]
else:
    text = text.rstrip("\n") + "\n\n" + section
open(path, "w").write(text)
PY
    rm -f "$section"
    mv "$tmp" "$out"
  done
  echo "wrote $out" >&2
  exit "$status"
fi
mv "$tmp" "$out"
echo "wrote $out" >&2
exit "$status"
